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
// memory: an import into the device pool reads a chunk's bytes packed into
// a staging buffer and copies them to their places with the GPU's copy
// engine (one 2-D copy per segment); a read served out of the device pool
// copies each segment's pieces out, stageServeBytes at a time, and sends
// them. Each side finishes one step before the next (no overlap of network
// and copy engine yet).

// stageServeBytes bounds the pinned memory one served read stages at a
// time, whatever the reader asked for.
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

// readStaged reads segs over QUIC (ReadVia) into a pinned buffer, packed
// in order, then copies them to their places in dst's device regions.
func (a *Agent) readStaged(ctx context.Context, peer *transfer.Peer, id, set uint64, segs []layout.Segment, l *layout.Layout) (transfer.Transport, error) {
	var total uint64
	for _, s := range segs {
		total += s.Bytes()
	}
	if total == 0 {
		return transfer.TransportQUIC, nil
	}
	buf, err := a.takeStaging(total)
	if err != nil {
		return transfer.TransportQUIC, localError{err}
	}
	defer a.giveStaging(buf)
	packed := make([]layout.Segment, len(segs))
	up := &layout.Plan{Ranks: make([][]layout.Segment, len(l.Regions))}
	var at uint64
	for i, s := range segs {
		if s.DstRank < 0 || s.DstRank >= len(l.Regions) {
			return transfer.TransportQUIC, fmt.Errorf("fabric: staged read: segment %d writes rank %d of %d", i, s.DstRank, len(l.Regions))
		}
		packed[i] = s
		packed[i].DstRank, packed[i].DstOffset, packed[i].DstStride = 0, at, s.Length
		up.Ranks[s.DstRank] = append(up.Ranks[s.DstRank], layout.Segment{DstRank: s.DstRank, SrcOffset: at, DstOffset: s.DstOffset,
			Length: s.Length, Count: s.Count, SrcStride: s.Length, DstStride: s.DstStride})
		at += s.Bytes()
	}
	via, err := peer.ReadVia(ctx, id, set, packed, [][]byte{buf.Bytes()[:total:total]})
	if err != nil {
		return via, err
	}
	st, err := a.cuda.NewStream(a.gpu)
	if err != nil {
		return via, localError{err}
	}
	defer st.Close()
	if err := st.ExecutePlan(cuda.HostToDevice, up, []cuda.Region{{Addr: buf.Addr(), Size: total}}, deviceRegions(l)); err != nil {
		return via, localError{fmt.Errorf("fabric: staged copy to GPU %d: %w", a.gpu, err)}
	}
	if err := st.Synchronize(); err != nil {
		return via, localError{fmt.Errorf("fabric: staged copy to GPU %d: %w", a.gpu, err)}
	}
	return via, nil
}

// deviceRegions is l's regions as the copy engine addresses them.
func deviceRegions(l *layout.Layout) []cuda.Region {
	out := make([]cuda.Region, len(l.Regions))
	for r, reg := range l.Regions {
		out[r] = cuda.Region{Addr: reg.Base, Size: reg.Size}
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
	limit := uint64(stageServeBytes)
	if n := a.cfg.hooks.stageBytes; n > 0 {
		limit = n
	}
	buf, err := a.takeStaging(limit)
	if err != nil {
		return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
	}
	defer a.giveStaging(buf)
	st, err := a.cuda.NewStream(a.gpu)
	if err != nil {
		return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
	}
	defer st.Close()
	out := buf.Bytes()[:limit]
	stage := func(c cuda.Copy2D, n uint64) error {
		c.Dir, c.Dst, c.DstPitch = cuda.DeviceToHost, buf.Addr(), c.Width
		if err := st.Copy2DAsync(c); err != nil {
			return fmt.Errorf("%w: stage from GPU %d: %v", transfer.ErrInternal, a.gpu, err)
		}
		if err := st.Synchronize(); err != nil {
			return fmt.Errorf("%w: stage from GPU %d: %v", transfer.ErrInternal, a.gpu, err)
		}
		return fn(out[:n])
	}
	pitch := max(seg.SrcStride, seg.Length)
	if seg.Length <= limit {
		per := limit / seg.Length
		for i := uint64(0); i < seg.Count; i += per {
			rows := min(per, seg.Count-i)
			if err := stage(cuda.Copy2D{Src: base + i*seg.SrcStride, SrcPitch: pitch, Width: seg.Length, Height: rows}, rows*seg.Length); err != nil {
				return err
			}
		}
		return nil
	}
	for i := uint64(0); i < seg.Count; i++ {
		for off := uint64(0); off < seg.Length; off += limit {
			n := min(limit, seg.Length-off)
			if err := stage(cuda.Copy2D{Src: base + i*seg.SrcStride + off, SrcPitch: n, Width: n, Height: 1}, n); err != nil {
				return err
			}
		}
	}
	return nil
}
