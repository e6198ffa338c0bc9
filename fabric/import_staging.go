package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/transfer"
)

// QUIC cannot reach GPU memory, so its bytes pass through pinned host
// memory with cuda.Stager, double-buffered so that the network and the copy
// engine overlap: an import into the device pool reads a chunk in parts of
// stageServeBytes, each packed into a pinned buffer and placed with one 2-D
// copy per segment while the next part arrives, stagedReadsInFlight parts
// on the network at once; a read served out of the
// device pool copies a run of segments' pieces out a part at a time, the
// next part while the previous one is sent.

// stageServeBytes is the size of each of the two pinned buffers a stager
// uses, whatever the reader asked for.
const stageServeBytes = 4 << 20

// maxStagingKept bounds the pinned buffers kept for reuse
// (cuMemHostAlloc is slow on a real driver): enough for an import's
// stagedReadsInFlight stagers and as many serving reads, two buffers each.
const maxStagingKept = 4 * stagedReadsInFlight

// readStaged reads segs over QUIC into pinned memory and copies them to
// their places in l's device regions: in parts of at most stageBytes,
// double-buffered, so that part i+1 arrives while part i is on its way to
// the GPU. Each part is read packed in order (ReadVia) and placed with one
// 2-D copy per segment.
func (a *Agent) readStaged(ctx context.Context, peer *transfer.Peer, id, set uint64, segs []layout.Segment, l *layout.Layout) (transfer.Transport, error) {
	for i, s := range segs {
		if s.DstRank < 0 || s.DstRank >= len(l.Regions) {
			return transfer.TransportQUIC, fmt.Errorf("fabric: staged read: segment %d writes rank %d of %d", i, s.DstRank, len(l.Regions))
		}
	}
	// The ranks on one GPU are read and placed together, on that GPU's
	// stream, one GPU after another.
	var gpus []int32
	byGPU := map[int32][]layout.Segment{}
	for _, s := range segs {
		g := l.Regions[s.DstRank].Device
		if _, ok := byGPU[g]; !ok {
			gpus = append(gpus, g)
		}
		byGPU[g] = append(byGPU[g], s)
	}
	via := transfer.TransportQUIC
	for _, g := range gpus {
		var err error
		if via, err = a.readStagedOn(ctx, int(g), peer, id, set, byGPU[g], l); err != nil {
			return via, err
		}
	}
	return via, nil
}

// stagedReadsInFlight is how many parts of one staged read are on the
// network at once, each through a stager of its own (two pinned buffers):
// with one, every part's request waited for the previous part's answer,
// and a staged import into an H200 ran at 0.6 of a host pool's import.
const stagedReadsInFlight = 2

// readStagedOn is readStaged for segments whose ranks are all on gpu. Its
// parts are dealt in turn to stagedReadsInFlight stagers, which read and
// place them concurrently; the first failure stops the others.
func (a *Agent) readStagedOn(ctx context.Context, gpu int, peer *transfer.Peer, id, set uint64, segs []layout.Segment, l *layout.Layout) (transfer.Transport, error) {
	parts := splitParts(segs, a.staging.Size())
	if len(parts) == 0 {
		return transfer.TransportQUIC, nil
	}
	// Each part is read packed in order and placed with one 2-D copy per
	// segment.
	packed := make([][]layout.Segment, len(parts))
	for k, part := range parts {
		var at uint64
		for _, s := range part {
			p := s
			p.DstRank, p.DstOffset, p.DstStride = 0, at, s.Length
			packed[k] = append(packed[k], p)
			at += s.Bytes()
		}
	}
	ups := upParts(parts, len(l.Regions))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		via   = transfer.TransportQUIC
		first error // the first failure; those it caused by cancelling are not reported
	)
	var unsynced atomic.Bool // a stager's stream could not be synchronised
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
		}
		mu.Unlock()
		cancel()
	}
	var wg sync.WaitGroup
	for w := range min(stagedReadsInFlight, len(parts)) {
		var mine []int
		for k := w; k < len(parts); k += stagedReadsInFlight {
			mine = append(mine, k)
		}
		wg.Go(func() {
			st, err := a.staging.NewStager(gpu)
			if err != nil {
				fail(localError{fmt.Errorf("fabric: staging to GPU %d: %w", gpu, err)})
				return
			}
			defer st.Close()
			myUps := make([]cuda.Part, len(mine))
			for i, k := range mine {
				myUps[i] = ups[k]
			}
			var readErr error
			err = st.Upload(ctx, myUps, deviceRegions(l), func(i int, p []byte) error {
				var v transfer.Transport
				v, readErr = peer.ReadVia(ctx, id, set, packed[mine[i]], [][]byte{p})
				mu.Lock()
				via = v
				mu.Unlock()
				return readErr
			})
			if errors.Is(err, cuda.ErrUnsynced) {
				unsynced.Store(true)
			}
			switch {
			case readErr != nil:
				fail(readErr)
			case err != nil:
				fail(localError{fmt.Errorf("fabric: staged copy to GPU %d: %w", gpu, err)})
			}
		})
	}
	wg.Wait()
	if unsynced.Load() {
		// Copies into the destination may still land after this returns:
		// its slots must not be given to other blocks (readChunk).
		first = errors.Join(errSlotUnsynced, first)
	}
	return via, first
}

// splitParts cuts segs into parts of at most limit bytes, in order: a
// segment's pieces are grouped while they fit, and a piece longer than
// limit is cut by bytes.
func splitParts(segs []layout.Segment, limit uint64) [][]layout.Segment {
	var parts [][]layout.Segment
	var cur []layout.Segment
	var room = limit
	flush := func() {
		if len(cur) > 0 {
			parts = append(parts, cur)
		}
		cur, room = nil, limit
	}
	for _, s := range segs {
		if s.Length == 0 {
			continue
		}
		for i := uint64(0); i < s.Count; {
			src, dst := s.Piece(i)
			if s.Length > limit {
				for off := uint64(0); off < s.Length; {
					if room == 0 {
						flush()
					}
					n := min(room, s.Length-off)
					cur = append(cur, layout.Segment{SrcRank: s.SrcRank, DstRank: s.DstRank, SrcOffset: src + off, DstOffset: dst + off,
						Length: n, Count: 1, SrcStride: n, DstStride: n})
					room -= n
					off += n
				}
				i++
				continue
			}
			k := min(s.Count-i, room/s.Length)
			if k == 0 {
				flush()
				continue
			}
			cur = append(cur, layout.Segment{SrcRank: s.SrcRank, DstRank: s.DstRank, SrcOffset: src, DstOffset: dst,
				Length: s.Length, Count: k, SrcStride: s.SrcStride, DstStride: s.DstStride})
			room -= k * s.Length
			i += k
		}
	}
	flush()
	return parts
}

// deviceRegions is l's regions as the copy engine addresses them.
func deviceRegions(l *layout.Layout) []cuda.Region {
	out := make([]cuda.Region, len(l.Regions))
	for r, reg := range l.Regions {
		out[r] = cuda.Region{Addr: reg.Base, Size: reg.Size, Device: int(reg.Device)}
	}
	return out
}

// StageRead copies segs' pieces out of a block set in the device pool into
// pinned memory, a part of at most the staging buffer's size at a time, and
// hands each part, packed in order, to fn (transfer.ReadStager): the next
// part is copied out while fn sends the last, across segments. Consecutive
// segments on one GPU share a stager. segs were checked against the region
// and the lease.
func (h *peerService) StageRead(blockSet uint64, segs []layout.Segment, fn func([]byte) error) error {
	a := h.a
	set, err := a.pool.BlockSet(pool.SetID(blockSet))
	if err != nil {
		return fmt.Errorf("%w: block set %d", transfer.ErrNotFound, blockSet)
	}
	l := set.Layout()
	for _, seg := range segs {
		if a.cuda == nil || seg.SrcRank < 0 || seg.SrcRank >= len(l.Regions) || l.Regions[seg.SrcRank].Kind != layout.Device {
			return fmt.Errorf("%w: block set %d rank %d is not in GPU memory", transfer.ErrInvalidRequest, blockSet, seg.SrcRank)
		}
	}
	src := deviceRegions(l)
	for len(segs) > 0 {
		gpu := l.Regions[segs[0].SrcRank].Device
		n := 1
		for n < len(segs) && l.Regions[segs[n].SrcRank].Device == gpu {
			n++
		}
		if err := a.stageOut(int(gpu), segs[:n], src, fn); err != nil {
			return err
		}
		segs = segs[n:]
	}
	return nil
}

// stageOut is StageRead for segments whose ranks are all on gpu.
func (a *Agent) stageOut(gpu int, segs []layout.Segment, src []cuda.Region, fn func([]byte) error) error {
	parts := splitParts(segs, a.staging.Size())
	if len(parts) == 0 {
		return nil
	}
	downs := downParts(parts)
	st, err := a.staging.NewStager(gpu)
	if err != nil {
		return fmt.Errorf("%w: staging from GPU %d: %v", transfer.ErrUnavailable, gpu, err)
	}
	defer st.Close()
	var sendErr error
	err = st.Download(a.ctx, downs, src, func(p []byte) error {
		sendErr = fn(p)
		return sendErr
	})
	if sendErr != nil {
		return sendErr
	}
	if err != nil {
		return fmt.Errorf("%w: stage from GPU %d: %v", transfer.ErrInternal, gpu, err)
	}
	return nil
}
