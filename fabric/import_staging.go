package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/transfer"
)

// QUIC cannot reach GPU memory, so its bytes pass through pinned host
// memory, double-buffered so that the network and the copy engine overlap:
// an import into the device pool reads a chunk in parts of stageServeBytes,
// each packed into a pinned buffer and placed with one 2-D copy per
// segment while the next part arrives; a read served out of the device
// pool copies each segment's pieces out a batch at a time, the next batch
// while the previous one is sent.

// stageServeBytes is the size of each of the two pinned buffers one staged
// read uses, whatever the reader asked for.
const stageServeBytes = 4 << 20

// maxStagingKept bounds the pinned buffers kept for reuse
// (cuMemHostAlloc is slow on a real driver).
const maxStagingKept = 4

// stagingBuffers keeps pinned host buffers for reuse.
type stagingBuffers struct {
	mu   sync.Mutex
	free []*cuda.PinnedMemory
}

// take returns a pinned buffer of at least n bytes.
func (a *Agent) takeStaging(n uint64) (*cuda.PinnedMemory, error) {
	s := &a.staging
	s.mu.Lock()
	for i, m := range s.free {
		if m.Size() >= n {
			s.free = append(s.free[:i], s.free[i+1:]...)
			s.mu.Unlock()
			return m, nil
		}
	}
	s.mu.Unlock()
	m, err := a.cuda.AllocPinned(n, -1)
	if err != nil {
		return nil, fmt.Errorf("fabric: pinned staging of %d bytes: %w", n, err)
	}
	return m, nil
}

// giveStaging keeps m for reuse, or frees it when enough are kept.
func (a *Agent) giveStaging(m *cuda.PinnedMemory) {
	s := &a.staging
	s.mu.Lock()
	if len(s.free) < maxStagingKept {
		s.free = append(s.free, m)
		m = nil
	}
	s.mu.Unlock()
	if m != nil {
		m.Close()
	}
}

// closeStaging frees the kept buffers (before the driver closes).
func (a *Agent) closeStaging() error {
	s := &a.staging
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, m := range s.free {
		errs = append(errs, m.Close())
	}
	s.free = nil
	return errors.Join(errs...)
}

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

// readStagedOn is readStaged for segments whose ranks are all on gpu.
func (a *Agent) readStagedOn(ctx context.Context, gpu int, peer *transfer.Peer, id, set uint64, segs []layout.Segment, l *layout.Layout) (transfer.Transport, error) {
	parts := splitParts(segs, a.stageBytes())
	if len(parts) == 0 {
		return transfer.TransportQUIC, nil
	}
	var bufs [2]*cuda.PinnedMemory
	var evs [2]*cuda.Event
	defer func() {
		for i := range bufs {
			if evs[i] != nil {
				evs[i].Synchronize() // nothing still copies out of a buffer given back
				evs[i].Close()
			}
			if bufs[i] != nil {
				a.giveStaging(bufs[i])
			}
		}
	}()
	st, err := a.cuda.NewStream(gpu)
	if err != nil {
		return transfer.TransportQUIC, localError{err}
	}
	defer st.Close()
	for i := 0; i < min(2, len(parts)); i++ {
		if bufs[i], err = a.takeStaging(a.stageBytes()); err != nil {
			return transfer.TransportQUIC, localError{err}
		}
		if evs[i], err = a.cuda.NewEvent(gpu); err != nil {
			return transfer.TransportQUIC, localError{err}
		}
	}
	dev := deviceRegions(l)
	via := transfer.TransportQUIC
	for k, part := range parts {
		buf, ev := bufs[k%2], evs[k%2]
		if k >= 2 {
			// Part k-2's copy out of this buffer must be done.
			if err := ev.Synchronize(); err != nil {
				return via, localError{fmt.Errorf("fabric: staged copy to GPU %d: %w", gpu, err)}
			}
		}
		packed := make([]layout.Segment, len(part))
		up := &layout.Plan{Ranks: make([][]layout.Segment, len(l.Regions))}
		var at uint64
		for i, s := range part {
			packed[i] = s
			packed[i].DstRank, packed[i].DstOffset, packed[i].DstStride = 0, at, s.Length
			up.Ranks[s.DstRank] = append(up.Ranks[s.DstRank], layout.Segment{DstRank: s.DstRank, SrcOffset: at, DstOffset: s.DstOffset,
				Length: s.Length, Count: s.Count, SrcStride: s.Length, DstStride: s.DstStride})
			at += s.Bytes()
		}
		if via, err = peer.ReadVia(ctx, id, set, packed, [][]byte{buf.Bytes()[:at:at]}); err != nil {
			return via, err
		}
		if err := st.ExecutePlan(cuda.HostToDevice, up, []cuda.Region{{Addr: buf.Addr(), Size: at}}, dev); err != nil {
			return via, localError{fmt.Errorf("fabric: staged copy to GPU %d: %w", gpu, err)}
		}
		if err := ev.Record(st); err != nil {
			return via, localError{fmt.Errorf("fabric: staged copy to GPU %d: %w", gpu, err)}
		}
	}
	if err := st.Synchronize(); err != nil {
		return via, localError{fmt.Errorf("fabric: staged copy to GPU %d: %w", gpu, err)}
	}
	return via, nil
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

// stageBytes is the size of one staging buffer.
func (a *Agent) stageBytes() uint64 {
	if n := a.cfg.hooks.stageBytes; n > 0 {
		return n
	}
	return stageServeBytes
}

// deviceRegions is l's regions as the copy engine addresses them.
func deviceRegions(l *layout.Layout) []cuda.Region {
	out := make([]cuda.Region, len(l.Regions))
	for r, reg := range l.Regions {
		out[r] = cuda.Region{Addr: reg.Base, Size: reg.Size, Device: int(reg.Device)}
	}
	return out
}

// StageRead copies seg's pieces out of a block set in the device pool into
// pinned memory, at most stageServeBytes at a time, and hands each batch,
// packed in order, to fn (transfer.ReadStager). seg was checked against the
// region and the lease.
func (h *peerService) StageRead(blockSet uint64, seg layout.Segment, fn func([]byte) error) error {
	a := h.a
	if seg.Length == 0 || seg.Count == 0 {
		return nil
	}
	set, err := a.pool.BlockSet(pool.SetID(blockSet))
	if err != nil {
		return fmt.Errorf("%w: block set %d", transfer.ErrNotFound, blockSet)
	}
	l := set.Layout()
	if a.cuda == nil || seg.SrcRank < 0 || seg.SrcRank >= len(l.Regions) || l.Regions[seg.SrcRank].Kind != layout.Device {
		return fmt.Errorf("%w: block set %d rank %d is not in GPU memory", transfer.ErrInvalidRequest, blockSet, seg.SrcRank)
	}
	base := l.Regions[seg.SrcRank].Base + seg.SrcOffset
	gpu := int(l.Regions[seg.SrcRank].Device)
	limit := a.stageBytes()
	// The batches: rows of pieces while they fit, or a long piece in
	// parts.
	type batch struct {
		c cuda.Copy2D
		n uint64
	}
	var batches []batch
	pitch := max(seg.SrcStride, seg.Length)
	if seg.Length <= limit {
		per := limit / seg.Length
		for i := uint64(0); i < seg.Count; i += per {
			rows := min(per, seg.Count-i)
			batches = append(batches, batch{cuda.Copy2D{Src: base + i*seg.SrcStride, SrcPitch: pitch, Width: seg.Length, Height: rows}, rows * seg.Length})
		}
	} else {
		for i := uint64(0); i < seg.Count; i++ {
			for off := uint64(0); off < seg.Length; off += limit {
				n := min(limit, seg.Length-off)
				batches = append(batches, batch{cuda.Copy2D{Src: base + i*seg.SrcStride + off, SrcPitch: n, Width: n, Height: 1}, n})
			}
		}
	}
	// Double-buffered: batch k+1 is copied out while batch k is sent.
	st, err := a.cuda.NewStream(gpu)
	if err != nil {
		return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
	}
	defer st.Close()
	var bufs [2]*cuda.PinnedMemory
	var evs [2]*cuda.Event
	defer func() {
		for i := range bufs {
			if evs[i] != nil {
				evs[i].Synchronize()
				evs[i].Close()
			}
			if bufs[i] != nil {
				a.giveStaging(bufs[i])
			}
		}
	}()
	for i := 0; i < min(2, len(batches)); i++ {
		if bufs[i], err = a.takeStaging(limit); err != nil {
			return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
		}
		if evs[i], err = a.cuda.NewEvent(gpu); err != nil {
			return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
		}
	}
	queue := func(k int) error {
		c := batches[k].c
		c.Dir, c.Dst, c.DstPitch = cuda.DeviceToHost, bufs[k%2].Addr(), c.Width
		if err := st.Copy2DAsync(c); err != nil {
			return fmt.Errorf("%w: stage from GPU %d: %v", transfer.ErrInternal, gpu, err)
		}
		if err := evs[k%2].Record(st); err != nil {
			return fmt.Errorf("%w: stage from GPU %d: %v", transfer.ErrInternal, gpu, err)
		}
		return nil
	}
	if len(batches) > 0 {
		if err := queue(0); err != nil {
			return err
		}
	}
	for k, b := range batches {
		if k+1 < len(batches) {
			// Its buffer held batch k-1, which fn has finished with.
			if err := queue(k + 1); err != nil {
				return err
			}
		}
		if err := evs[k%2].Synchronize(); err != nil {
			return fmt.Errorf("%w: stage from GPU %d: %v", transfer.ErrInternal, gpu, err)
		}
		if err := fn(bufs[k%2].Bytes()[:b.n]); err != nil {
			return err
		}
	}
	return nil
}
