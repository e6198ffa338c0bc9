package transfer

// The libfabric binding: one RDM endpoint per node, memory registered with
// it, the holder's endpoint name in lease answers, reads as fi_read through
// ofi.Endpoint.Read. RDM endpoints are connectionless: nothing is served
// per peer, and a reader's only setup is the holder's address in its
// address vector.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// ofiTransport reads and serves over RDMAConfig.OFI.
type ofiTransport struct {
	n  *Node
	ep *ofi.Endpoint
}

// ofiRegion is memory registered with the endpoint, with where it lies in
// this process.
type ofiRegion struct {
	*ofi.Region
	addr uint64
}

func (r ofiRegion) Addr() uint64 { return r.addr }

func (t *ofiTransport) kind() string { return "ofi:" + t.ep.Info().Provider }

func (t *ofiTransport) region(reg registration, addr uint64, g *transferpb.RdmaRegion) {
	r, ok := reg.memRegion.(ofiRegion)
	if !ok {
		return
	}
	rem := r.Remote()
	// Without FI_MR_VIRT_ADDR the provider addresses a region by offset
	// (Remote().Addr is 0), with it by virtual address: either way the
	// span's start is the region's plus the span's offset in it.
	g.Addr, g.Key = rem.Addr+(addr-r.addr), rem.Key
}

func (t *ofiTransport) answer(resp *transferpb.LeaseResponse) { resp.OfiName = t.ep.Name() }

func (t *ofiTransport) servedConns() int  { return 0 }
func (t *ofiTransport) dropServed(string) {}
func (t *ofiTransport) close()            {}

func (t *ofiTransport) newPeer(p *Peer) rmaPeer { return &ofiPeer{t: t, p: p} }

// registerOFI registers [addr, addr+length) with the endpoint.
func (t *ofiTransport) register(addr, length uint64) (memRegion, rdma.RegistrationStats, error) {
	start := time.Now()
	r, err := t.ep.Register(uintptr(addr), length)
	if err != nil {
		return nil, rdma.RegistrationStats{}, err
	}
	return ofiRegion{r, addr}, rdma.RegistrationStats{Bytes: length, Duration: time.Since(start)}, nil
}

// ofiPeer is a reader's libfabric state for one holder: its endpoint name
// as the last lease answer gave it, and its address once inserted.
type ofiPeer struct {
	t *ofiTransport
	p *Peer

	mu     sync.Mutex
	name   []byte   // the holder's endpoint name
	addr   ofi.Peer // name's address, when inserted
	added  bool
	closed bool
	// reading counts the reads posting to an address of the peer; an
	// address they may use leaves the address vector only once none does
	// (stale), since a provider frees the peer's connection with it.
	reading int
	stale   []ofi.Peer
}

func (v *ofiPeer) regionKey(g *transferpb.RdmaRegion) uint64 { return g.Key }

// errNoEndpointName: a lease answer carried regions but no endpoint name,
// as a holder does that predates LeaseRequest.rma and answers every reader
// with its verbs regions.
var errNoEndpointName = errors.New("regions without a libfabric endpoint name")

func (v *ofiPeer) answered(resp *transferpb.LeaseResponse) error {
	if len(resp.OfiName) == 0 {
		return errNoEndpointName
	}
	if len(resp.OfiName) > ofi.MaxNameLen {
		return fmt.Errorf("libfabric endpoint name of %d bytes, at most %d", len(resp.OfiName), ofi.MaxNameLen)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if bytes.Equal(v.name, resp.OfiName) {
		return nil
	}
	// A holder that restarted has a new endpoint: reads under its earlier
	// leases fail and fall back.
	v.forgetLocked()
	v.name = bytes.Clone(resp.OfiName)
	return nil
}

// forgetLocked takes the peer's address out of the address vector, at
// once or when the last read using it ends.
func (v *ofiPeer) forgetLocked() {
	if !v.added {
		return
	}
	v.added = false
	if v.reading > 0 {
		v.stale = append(v.stale, v.addr)
		return
	}
	v.t.ep.RemovePeer(v.addr)
}

// done ends a read that peerAddr began.
func (v *ofiPeer) done() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.reading--
	if v.reading == 0 {
		for _, a := range v.stale {
			v.t.ep.RemovePeer(a)
		}
		v.stale = nil
	}
}

// peerAddr inserts the holder's endpoint name into the address vector,
// once, and begins a read to it: the caller calls done when the read has
// ended.
func (v *ofiPeer) peerAddr() (ofi.Peer, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.closed:
		return ofi.Peer{}, fmt.Errorf("transfer: peer %s: %w", v.p.name, ErrClosed)
	case v.added:
		v.reading++
		return v.addr, nil
	case len(v.name) == 0:
		return ofi.Peer{}, fmt.Errorf("transfer: peer %s gave no libfabric endpoint name", v.p.name)
	}
	a, err := v.t.ep.AddPeer(v.name)
	if err != nil {
		return ofi.Peer{}, err
	}
	v.addr, v.added = a, true
	v.reading++
	return a, nil
}

func (v *ofiPeer) read(ctx context.Context, leaseID uint64, k nicPair, segs []layout.Segment, n uint64, regions []remoteRegion, dst []Span, locals []registration) groupRead {
	p, st := v.p, v.p.n.rdma
	addr, err := v.peerAddr()
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return groupRead{err: err}
		}
		st.connectFails.Add(1)
		p.n.log.Warn("libfabric peer address failed", "peer", p.name, "err", err)
		return groupRead{fallback: FallbackConnectFailed}
	}
	defer v.done()
	// ofi reads land in one registered region each: the pieces by the
	// destination registration they write into.
	var order []ofiRegion
	byReg := map[*ofi.Region][]ofi.Segment{}
	for _, s := range segs {
		loc, ok := locals[s.DstRank].memRegion.(ofiRegion)
		if !ok || s.Length == 0 {
			continue
		}
		reg := regions[s.SrcRank]
		base := dst[s.DstRank].Addr - loc.addr
		if _, seen := byReg[loc.Region]; !seen {
			order = append(order, loc)
		}
		for i := uint64(0); i < s.Count; i++ {
			src, d := s.Piece(i)
			byReg[loc.Region] = append(byReg[loc.Region], ofi.Segment{LocalOff: base + d, RemoteOff: src, Len: s.Length,
				Remote: ofi.Remote{Addr: reg.addr, Len: reg.length, Key: reg.key}})
		}
	}
	g := groupRead{bytes: n}
	rctx, cancel := context.WithTimeout(ctx, st.cfg.OFIReadTimeout)
	defer cancel()
	for _, loc := range order {
		ss := byReg[loc.Region]
		if err := v.t.ep.Read(rctx, addr, loc.Region, ss); err != nil {
			g.err = err
			return g
		}
		g.ops++
		g.sges += uint64(len(ss))
	}
	return g
}

func (v *ofiPeer) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.closed = true
	v.forgetLocked()
}
