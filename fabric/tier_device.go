package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// Slot I/O: the disk tiers' copier (tier_offload.go) and restore
// (tier_restore.go) move a block's canonical bytes (tier.go) between a
// block set's slot and host memory through a slotIO, whatever memory the
// set is in:
//
//   - a set in host or pinned memory: copies over its regions' bytes
//     (gatherBlock, scatterBlock);
//   - a set in the device pools: through pinned staging with the CUDA
//     driver's copy engines (cuda.Stager, with the pinned buffers a.staging
//     keeps, the path that serves device blocks to peers over QUIC): a copy
//     down downloads the slot's chunks, device to host, packed in canonical
//     order, a part of at most a staging buffer at a time, into the copier's
//     buffer, which is then written to disk with its checksum as any other
//     block; a restore reads the block from disk (checked), then uploads it,
//     host to device, into the slot the restore allocated.
//
// So a block a device block set recycles falls to disk instead of leaving
// the node, and Acquire, Lookup, Import, Prefetch and peers' leases bring
// it back up as they do a host pool's.

// deviceOffloadWatermark is Config.TierWatermark's default over device
// pools: GPU memory starts copying down past 0.85 of a set's use (host
// memory past pool.DefaultOffloadWatermark), so that an engine's bursts
// find free slots in the scarcer memory.
const deviceOffloadWatermark = 0.85

// slotIO moves one block set's blocks, in canonical order, between their
// slots and host buffers.
type slotIO interface {
	// read copies slot's block into dst (the block's canonical bytes,
	// tierBlockBytes less the trailer, at the start of dst).
	read(ctx context.Context, slot int, dst []byte) error
	// write copies a block's canonical bytes from src into slot.
	write(ctx context.Context, slot int, src []byte) error
}

// errSlotUnsynced is a slot write's failure after which its copies may
// still land in the slot (the stream could not be synchronised): the slot
// must stay out of use, as the stager's buffers are (cuda.ErrUnsynced).
var errSlotUnsynced = errors.New("fabric: copy into the slot not synchronised; it may still land")

// errNoSlotIO is the tiers' refusal of a block set they cannot read: in
// device memory on an agent without a CUDA driver's staging.
var errNoSlotIO = errors.New("fabric: the block set's memory is out of the tiers' reach")

// deviceRestoreReaders is how many blocks a restore into a device set
// reads and uploads at once: each upload takes a stager (a stream and two
// pinned buffers of the agent's staging). The tiers keep tierStagersKept
// of them per GPU once used, so that a copy does not allocate pinned
// memory, slow on a real driver: 2*tierStagersKept staging buffers per
// GPU held for the agent's life, beside the staging pool's own
// (maxStagingKept); copies beyond those (several copiers, restores at
// once) make stagers of their own and close them after. Eight readers instead
// of two measured within the noise on the CUDA stand-in, stagers made
// per block then (BenchmarkTierRestoreDevice: 0.82-0.85x of a host set's
// restore, against 0.64-0.95x).
const deviceRestoreReaders = 2

// reachable says whether the tiers can copy blocks of l: host memory, or
// device memory with the driver's staging open.
func (t *tiers) reachable(l *layout.Layout) bool {
	if len(l.Regions) == 0 {
		return false
	}
	return l.Regions[0].Kind != layout.Device || (t.a.cuda != nil && t.a.staging != nil)
}

// slotIO returns the slot I/O of set.
func (t *tiers) slotIO(set *pool.BlockSet) (slotIO, error) {
	l := set.Layout()
	if !t.reachable(l) {
		return nil, fmt.Errorf("block set %d: %w", set.ID(), errNoSlotIO)
	}
	if l.Regions[0].Kind == layout.Device {
		return &deviceSlots{t: t, l: l}, nil
	}
	regions, err := set.RegionBytes()
	if err != nil {
		return nil, err
	}
	return hostSlots{l: l, regions: regions}, nil
}

// restoreReaders is how many blocks a restore into a set of l reads at
// once.
func (t *tiers) restoreReaders(l *layout.Layout) int {
	if l.Regions[0].Kind == layout.Device {
		return deviceRestoreReaders
	}
	return restoreReaders
}

// hostSlots is the slot I/O of a set in host memory.
type hostSlots struct {
	l       *layout.Layout
	regions [][]byte
}

func (h hostSlots) read(_ context.Context, slot int, dst []byte) error {
	gatherBlock(h.l, h.regions, slot, dst)
	return nil
}

func (h hostSlots) write(_ context.Context, slot int, src []byte) error {
	scatterBlock(h.l, h.regions, slot, src)
	return nil
}

// deviceSlots is the slot I/O of a set in the device pools.
type deviceSlots struct {
	t *tiers
	l *layout.Layout
	// underLock: the copy runs under the set's lock (take, in an
	// allocation): only a kept stager is used, and one closed is closed
	// in the background.
	underLock bool
}

// tierStagersKept is how many stagers per GPU the tiers keep between
// copies (a stream, two events and two pinned buffers each), so that a
// block's copy does not make and free them: the copier's, and a restore's
// deviceRestoreReaders.
const tierStagersKept = 1 + deviceRestoreReaders

// stagerCache keeps the tiers' stagers for reuse, by GPU.
type stagerCache struct {
	mu     sync.Mutex
	free   map[int][]*cuda.Stager
	closed bool
}

// errNoStagerKept is stager's answer to a copy under a block set's lock
// when no stager is kept for its GPU: making one (a stream, events,
// pinned memory) is not done there.
var errNoStagerKept = errors.New("fabric: no stager kept for the GPU")

// stager returns a kept stager for gpu, or, if mayMake, a new one.
func (t *tiers) stager(gpu int, mayMake bool) (*cuda.Stager, error) {
	c := &t.stagers
	c.mu.Lock()
	if l := c.free[gpu]; len(l) > 0 && !c.closed {
		st := l[len(l)-1]
		c.free[gpu] = l[:len(l)-1]
		c.mu.Unlock()
		return st, nil
	}
	c.mu.Unlock()
	if !mayMake {
		return nil, errNoStagerKept
	}
	return t.a.staging.NewStager(gpu)
}

// putStager keeps st for reuse when its last transfer ended well and
// there is room, else closes it (a failed transfer's stream may be
// broken): in the background if async (under a block set's lock, where
// the stream's sync and the frees are not waited for).
func (t *tiers) putStager(gpu int, st *cuda.Stager, ok, async bool) error {
	c := &t.stagers
	c.mu.Lock()
	if ok && !c.closed && len(c.free[gpu]) < tierStagersKept {
		if c.free == nil {
			c.free = map[int][]*cuda.Stager{}
		}
		c.free[gpu] = append(c.free[gpu], st)
		c.mu.Unlock()
		return nil
	}
	c.mu.Unlock()
	if async {
		go st.Close()
		return nil
	}
	return st.Close()
}

// close closes the kept stagers, before the agent's staging buffers go;
// stagers given back later are closed too. Safe twice.
func (c *stagerCache) close() {
	c.mu.Lock()
	free := c.free
	c.free, c.closed = nil, true
	c.mu.Unlock()
	for _, l := range free {
		for _, st := range l {
			st.Close()
		}
	}
}

// gpuRun is the chunks of a block on one GPU: consecutive ranks, in
// canonical order, each segment's canonical offset its SrcOffset (read)
// or DstOffset (write) relative to the run's start.
type gpuRun struct {
	gpu  int
	segs []layout.Segment
	n    uint64 // the run's bytes
}

// runs cuts slot's block into its runs by GPU: for a read, segments from
// the device regions (SrcRank, SrcOffset) to the canonical bytes
// (DstOffset); for a write, the reverse. Chunks adjacent on both sides
// are one segment, so that a block whose chunks lie together in its
// region moves in one copy per rank.
func (d *deviceSlots) runs(slot int, toDevice bool) []gpuRun {
	var out []gpuRun
	var cur *gpuRun
	forEachChunk(d.l, slot, func(rank int, off uint64, n int, at int) {
		gpu := int(d.l.Regions[rank].Device)
		if cur == nil || cur.gpu != gpu {
			out = append(out, gpuRun{gpu: gpu})
			cur = &out[len(out)-1]
		}
		rel := cur.n
		cur.n += uint64(n)
		if k := len(cur.segs); k > 0 {
			p := &cur.segs[k-1]
			dev, host := p.SrcOffset, p.DstOffset
			devRank := p.SrcRank
			if toDevice {
				dev, host, devRank = p.DstOffset, p.SrcOffset, p.DstRank
			}
			if devRank == rank && dev+p.Length == off && host+p.Length == rel {
				p.Length += uint64(n)
				p.SrcStride, p.DstStride = p.Length, p.Length
				return
			}
		}
		s := layout.Segment{SrcRank: rank, SrcOffset: off, DstOffset: rel, Length: uint64(n), Count: 1,
			SrcStride: uint64(n), DstStride: uint64(n)}
		if toDevice {
			s = layout.Segment{DstRank: rank, SrcOffset: rel, DstOffset: off, Length: uint64(n), Count: 1,
				SrcStride: uint64(n), DstStride: uint64(n)}
		}
		cur.segs = append(cur.segs, s)
	})
	return out
}

func (d *deviceSlots) read(ctx context.Context, slot int, dst []byte) error {
	src := deviceRegions(d.l)
	at := 0
	for _, run := range d.runs(slot, false) {
		downs := downParts(splitParts(run.segs, d.t.a.staging.Size()))
		if at+int(run.n) > len(dst) {
			return fmt.Errorf("fabric: a block of %d bytes or more, a buffer of %d", at+int(run.n), len(dst))
		}
		st, err := d.t.stager(run.gpu, !d.underLock)
		if err != nil {
			return fmt.Errorf("fabric: staging from GPU %d: %w", run.gpu, err)
		}
		err = st.Download(ctx, downs, src, func(p []byte) error {
			at += copy(dst[at:], p)
			return nil
		})
		if cerr := d.t.putStager(run.gpu, st, err == nil, d.underLock); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("fabric: copy of slot %d from GPU %d: %w", slot, run.gpu, err)
		}
	}
	return nil
}

func (d *deviceSlots) write(ctx context.Context, slot int, src []byte) error {
	dst := deviceRegions(d.l)
	at := 0
	for _, run := range d.runs(slot, true) {
		if at+int(run.n) > len(src) {
			return fmt.Errorf("fabric: a block of %d bytes or more, %d given", at+int(run.n), len(src))
		}
		ups := upParts(splitParts(run.segs, d.t.a.staging.Size()), len(d.l.Regions))
		st, err := d.t.stager(run.gpu, true)
		if err != nil {
			return fmt.Errorf("fabric: staging to GPU %d: %w", run.gpu, err)
		}
		err = st.Upload(ctx, ups, dst, func(_ int, p []byte) error {
			at += copy(p, src[at:])
			return nil
		})
		if errors.Is(err, cuda.ErrUnsynced) {
			err = errors.Join(errSlotUnsynced, err)
		}
		if cerr := d.t.putStager(run.gpu, st, err == nil, false); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("fabric: copy into slot %d on GPU %d: %w", slot, run.gpu, err)
		}
	}
	return nil
}
