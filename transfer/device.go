package transfer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma"
)

// ErrNeedsRDMA is matched by a read into, or a read served out of, memory
// this process cannot address (GPU memory) when RDMA cannot move it and no
// staged path through host memory is offered (ReadStager on the serving
// side; the caller's own staging on the reading side): host bytes are
// never written to, or read from, a device pointer.
var ErrNeedsRDMA = errors.New("transfer: device memory moves over RDMA or through a staged path only")

// Span is memory this node names by address and length rather than as a
// slice: GPU memory, which the NIC reaches (after RegisterDmabuf or
// RegisterAddr) but the CPU does not.
type Span struct {
	Addr, Len uint64
}

// spansOf gives host slices' addresses; the slices must stay reachable for
// as long as the spans are used.
func spansOf(b [][]byte) []Span {
	out := make([]Span, len(b))
	for i, d := range b {
		if len(d) > 0 {
			out[i] = Span{Addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(d)))), Len: uint64(len(d))}
		}
	}
	return out
}

// RegionSpanner is implemented by a Handler whose regions may be memory
// this process cannot address (GPU memory). RegionSpan returns the address
// and length of rank's region of blockSet, host memory or not; the range
// stays valid while leases on it are live. When a Handler implements it,
// the remote keys a lease hands out come from it rather than from Region;
// Region is still what QUIC reads serve from, and it returns an error
// wrapping ErrNeedsRDMA for memory it cannot hand out as a slice. It must
// not block.
type RegionSpanner interface {
	RegionSpan(blockSet uint64, rank int) (Span, error)
}

// regionSpan is where rank's region of set lies, by RegionSpan where the
// handler has it, else by Region.
func (n *Node) regionSpan(set uint64, rank int) (addr, length uint64, err error) {
	if rs, ok := n.cfg.Handler.(RegionSpanner); ok {
		s, err := rs.RegionSpan(set, rank)
		return s.Addr, s.Len, err
	}
	reg, err := n.cfg.Handler.Region(set, rank)
	if err != nil {
		return 0, 0, err
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(reg)))), uint64(len(reg)), nil
}

// RegisterDmabuf registers length bytes of a dma-buf (offset 0 of f) that
// this process addresses at addr, GPU memory exported with
// cuMemGetHandleForAddressRange, with the node's RDMA device nic (an index
// into RDMAConfig.Devices: the NIC nearest the GPU) for remote read: peers
// then read leased blocks in it and this node's reads land in it, with no
// host copy, through that device. The device keeps its own reference to
// the buffer; the caller may close f. Without RDMA, or where the library
// or NIC has no dma-buf registration, the error wraps rdma.ErrUnavailable
// or rdma.ErrNotSupported.
func (n *Node) RegisterDmabuf(nic int, f *os.File, addr, length uint64) (rdma.RegistrationStats, error) {
	return n.register(nic, addr, length, "dma-buf", func(d *rdma.Device) (*rdma.MemoryRegion, error) {
		return d.RegisterDmabuf(int(f.Fd()), 0, length, addr)
	})
}

// RegisterAddr registers length bytes at addr, a GPU device pointer, with
// the node's RDMA device nic by address: the peer-memory path
// (nvidia-peermem) that NCCL falls back to where dma-buf is missing.
// Whether the NIC can really reach the memory shows only when it moves
// bytes.
func (n *Node) RegisterAddr(nic int, addr, length uint64) (rdma.RegistrationStats, error) {
	return n.register(nic, addr, length, "device pointer", func(d *rdma.Device) (*rdma.MemoryRegion, error) {
		return d.RegisterAddr(addr, length)
	})
}

// register registers [addr, addr+length) with device nic by reg, once it
// is known not to overlap a registration, and keeps it; what names the
// kind of memory in errors.
func (n *Node) register(nic int, addr, length uint64, what string, reg func(*rdma.Device) (*rdma.MemoryRegion, error)) (rdma.RegistrationStats, error) {
	if err := n.checkNewSpan(nic, addr, length); err != nil {
		return rdma.RegistrationStats{}, err
	}
	if t, ok := n.rdma.tp.(*ofiTransport); ok {
		if what != "host memory" {
			return rdma.RegistrationStats{}, fmt.Errorf("transfer: register %s of %d bytes at %#x: %w: over libfabric device memory is registered by CUDA device (RegisterCUDA)",
				what, length, addr, rdma.ErrNotSupported)
		}
		mr, stats, err := t.register(addr, length, -1)
		if err != nil {
			return rdma.RegistrationStats{}, fmt.Errorf("transfer: register %s of %d bytes at %#x: %w", what, length, addr, err)
		}
		return stats, n.rdma.mem.add(mr, nic)
	}
	mr, err := reg(n.rdma.cfg.Devices[nic])
	if err != nil {
		return rdma.RegistrationStats{}, fmt.Errorf("transfer: register %s of %d bytes at %#x: %w", what, length, addr, err)
	}
	if err := n.rdma.mem.add(mr, nic); err != nil {
		return rdma.RegistrationStats{}, err
	}
	return mr.Stats(), nil
}

func (n *Node) checkNewSpan(nic int, addr, length uint64) error {
	if n.rdma == nil {
		return fmt.Errorf("transfer: register memory: %w: RDMA is not configured", rdma.ErrUnavailable)
	}
	if nic < 0 || nic >= n.rdma.nics() {
		return fmt.Errorf("transfer: register memory: %w: device %d of %d", ErrInvalidRequest, nic, n.rdma.nics())
	}
	if length == 0 || addr+length < addr {
		return fmt.Errorf("transfer: register memory: %w: %d bytes at %#x", ErrInvalidRequest, length, addr)
	}
	if n.rdma.mem.overlaps(addr, length) {
		return fmt.Errorf("transfer: register memory: %w: %d bytes at %#x overlap a registration", ErrInvalidRequest, length, addr)
	}
	return nil
}

// ReadSpans is ReadVia into memory named by address (dst[r] is local rank
// r's region), GPU memory registered with RegisterDmabuf or RegisterAddr.
// Only RDMA can write such memory here: when the holder offers no keys for
// the block set, RDMA to it is off or backing off, or the destination is
// not registered, the read fails with an error wrapping ErrNeedsRDMA before
// any byte moves, and the caller stages it (ReadVia into pinned host
// memory, then its own copies); an RDMA read that fails is not retried
// over QUIC here either.
func (p *Peer) ReadSpans(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst []Span) (Transport, error) {
	lens := make([]uint64, len(dst))
	for i, d := range dst {
		lens[i] = d.Len
	}
	total, err := validateReadLens(segs, lens)
	if err != nil {
		return TransportRDMA, err
	}
	if total == 0 {
		return TransportRDMA, nil
	}
	if p.rdma == nil {
		return TransportRDMA, fmt.Errorf("%w: reading %d bytes from %s: this node has no RDMA", ErrNeedsRDMA, total, p.name)
	}
	done, err := p.readRDMA(ctx, leaseID, blockSet, segs, dst, total)
	switch {
	case !done:
		return TransportRDMA, fmt.Errorf("%w: reading %d bytes from %s: RDMA is not usable for this read (see the fallback counters)", ErrNeedsRDMA, total, p.name)
	case err != nil:
		p.n.stats.readsFailed.Add(1)
		return TransportRDMA, err
	}
	p.n.stats.reads.Add(1)
	p.n.stats.bytesRead.Add(total)
	return TransportRDMA, nil
}

// ReadStager is implemented by a Handler that serves QUIC reads out of
// memory this process cannot address (GPU memory), through host staging.
// When Region returns an error wrapping ErrNeedsRDMA and the Handler is a
// ReadStager with a RegionSpan for the rank, the read is checked against
// RegionSpan's length and the lease as usual, and the bytes of each run of
// consecutive staged segments come from one StageRead: it copies segs'
// pieces (in order, packed) out in batches of its choosing and hands each to
// fn, stopping at fn's first error. The slice given to fn is valid only
// during the call; segs is the server's and only read. It may block for the
// copies; it is called concurrently from many streams.
type ReadStager interface {
	StageRead(blockSet uint64, segs []layout.Segment, fn func([]byte) error) error
}

// stagedLength says whether rank's region of set, which Region could not
// hand out as a slice (regionErr), is served through the handler's
// ReadStager, and its length; otherwise it returns regionErr.
func (n *Node) stagedLength(set uint64, rank int, regionErr error) (uint64, bool, error) {
	if _, ok := n.cfg.Handler.(ReadStager); !ok {
		return 0, false, regionErr
	}
	if _, ok := n.cfg.Handler.(RegionSpanner); !ok {
		return 0, false, regionErr
	}
	_, length, err := n.regionSpan(set, rank)
	if err != nil {
		return 0, false, err
	}
	return length, true, nil
}
