package cuda

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/kvfabric/kvfabric/layout"
)

// Part is one buffer's load in a staged transfer: Bytes packed at the start
// of a staging buffer, and Plan, which moves them between that buffer and
// device memory. For Upload the plan's source rank 0 is the buffer and its
// destination ranks are the device regions; for Download its source ranks
// are the device regions and its one destination rank is the buffer. Its
// segments are copied as ExecutePlan copies them: one 2-D copy each, or
// piece by piece past MaxPitch.
type Part struct {
	Bytes uint64
	Plan  *layout.Plan
}

// Stager moves bytes between a host producer or consumer (a network
// stream, for the QUIC path) and device memory through two pinned buffers,
// so that filling or draining one buffer overlaps the copy engine's work on
// the other, across all the parts of a transfer. A Stager is used by one
// goroutine at a time.
type Stager struct {
	d     *Driver
	dev   int
	chunk uint64
	s     *Stream
	buf   [2]*PinnedMemory
	ev    [2]*Event
	from  *StagingBuffers // nil: the buffers are the stager's own
	// failed is set when the stream could not be synchronised: its copies
	// may still touch the buffers, which are then freed, never reused.
	failed bool

	closeOnce sync.Once
	closeErr  error
}

// NewStager makes a stager for dev with two pinned buffers of chunk bytes
// of its own.
func (d *Driver) NewStager(dev int, chunk uint64) (*Stager, error) {
	if chunk == 0 {
		return nil, fmt.Errorf("cuda: stager chunk of 0 bytes: %w", ErrInvalidValue)
	}
	return d.newStager(dev, chunk, nil)
}

func (d *Driver) newStager(dev int, chunk uint64, from *StagingBuffers) (st *Stager, err error) {
	st = &Stager{d: d, dev: dev, chunk: chunk, from: from}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	if st.s, err = d.NewStream(dev); err != nil {
		return nil, err
	}
	for i := range st.buf {
		if from != nil {
			st.buf[i], err = from.take()
		} else {
			st.buf[i], err = d.AllocPinned(chunk, -1)
		}
		if err != nil {
			return nil, err
		}
		if st.ev[i], err = d.NewEvent(dev); err != nil {
			return nil, err
		}
	}
	return st, nil
}

// Chunk returns the size of each buffer.
func (st *Stager) Chunk() uint64 { return st.chunk }

// Upload moves parts to the device regions dst in order: fill is called
// once per part with the buffer to fill with part k's Bytes, while the
// previous part is on its way to the device. It returns when every byte
// has arrived, or with the first error (fill's, wrapped; the driver's; or
// ctx's; bytes already queued still land). An error that matches
// ErrUnsynced says the stream could not be synchronised: copies into dst
// may land after it returns. A part larger than Chunk is an error before
// anything moves.
func (st *Stager) Upload(ctx context.Context, parts []Part, dst []Region, fill func(k int, p []byte) error) error {
	if err := st.checkParts(parts); err != nil {
		return err
	}
	for k, part := range parts {
		i := k % 2
		if err := ctx.Err(); err != nil {
			return st.drain(fmt.Errorf("cuda: stage to device: %w", err))
		}
		// The buffer is free once its previous copy has finished.
		if err := st.ev[i].Wait(ctx); err != nil {
			return st.drain(err)
		}
		if err := fill(k, st.buf[i].Bytes()[:part.Bytes]); err != nil {
			return st.drain(fmt.Errorf("cuda: stage to device, part %d: %w", k, err))
		}
		if err := st.s.ExecutePlan(HostToDevice, part.Plan, []Region{{Addr: st.buf[i].Addr(), Size: part.Bytes}}, dst); err != nil {
			return st.drain(err)
		}
		if err := st.ev[i].Record(st.s); err != nil {
			return st.drain(err)
		}
	}
	return st.sync()
}

// Download moves parts out of the device regions src in order: drain is
// called once per part with its Bytes, packed, while the next part is
// being copied. The slice is valid only during the call.
func (st *Stager) Download(ctx context.Context, parts []Part, src []Region, drain func(p []byte) error) error {
	if err := st.checkParts(parts); err != nil {
		return err
	}
	issue := func(k int) error {
		i := k % 2
		if err := st.s.ExecutePlan(DeviceToHost, parts[k].Plan, src, []Region{{Addr: st.buf[i].Addr(), Size: parts[k].Bytes}}); err != nil {
			return err
		}
		return st.ev[i].Record(st.s)
	}
	if len(parts) == 0 {
		return nil
	}
	if err := issue(0); err != nil {
		return st.drain(err)
	}
	for k, part := range parts {
		i := k % 2
		if k+1 < len(parts) {
			// Its buffer held part k-1, which drain has finished with.
			if err := issue(k + 1); err != nil {
				return st.drain(err)
			}
		}
		if err := st.ev[i].Wait(ctx); err != nil {
			return st.drain(err)
		}
		if err := drain(st.buf[i].Bytes()[:part.Bytes]); err != nil {
			return st.drain(fmt.Errorf("cuda: stage from device, part %d: %w", k, err))
		}
	}
	return nil
}

func (st *Stager) checkParts(parts []Part) error {
	for k, p := range parts {
		if p.Bytes > st.chunk {
			return fmt.Errorf("cuda: stage: part %d of %d bytes, buffers of %d: %w", k, p.Bytes, st.chunk, ErrInvalidValue)
		}
		if p.Plan == nil {
			return fmt.Errorf("cuda: stage: part %d has no plan: %w", k, ErrInvalidValue)
		}
	}
	return nil
}

// ToDevice writes n bytes to dst, contiguous: fill is called once per
// chunk, in order, with a buffer to fill completely (len is the chunk
// size, or less for the last chunk). It is Upload of one contiguous run.
func (st *Stager) ToDevice(ctx context.Context, dst, n uint64, fill func(p []byte) error) error {
	parts := contiguousParts(n, st.chunk, false)
	return st.Upload(ctx, parts, []Region{{Addr: dst, Size: n}}, func(_ int, p []byte) error { return fill(p) })
}

// FromDevice reads n bytes from src, contiguous: drain is called once per
// chunk, in order. It is Download of one contiguous run.
func (st *Stager) FromDevice(ctx context.Context, src, n uint64, drain func(p []byte) error) error {
	return st.Download(ctx, contiguousParts(n, st.chunk, true), []Region{{Addr: src, Size: n}}, drain)
}

// contiguousParts cuts n bytes of one region into parts of chunk bytes.
func contiguousParts(n, chunk uint64, fromDevice bool) []Part {
	var parts []Part
	for off := uint64(0); off < n; off += chunk {
		m := min(chunk, n-off)
		sg := layout.Segment{Length: m, Count: 1, SrcStride: m, DstStride: m}
		if fromDevice {
			sg.SrcOffset = off
		} else {
			sg.DstOffset = off
		}
		parts = append(parts, Part{Bytes: m, Plan: &layout.Plan{Ranks: [][]layout.Segment{{sg}}}})
	}
	return parts
}

// drain waits for queued copies so that the buffers are free again, and
// returns err.
func (st *Stager) drain(err error) error {
	return errors.Join(err, st.sync())
}

// sync waits for the stream's copies; its error wraps ErrUnsynced.
func (st *Stager) sync() error {
	if err := st.s.Synchronize(); err != nil {
		st.failed = true
		return fmt.Errorf("%w: %w", ErrUnsynced, err)
	}
	return nil
}

// Close waits for the queued copies and frees the stream and events; the
// buffers go back to the StagingBuffers they came from, or are freed when
// they are the stager's own or when the copies could not be waited for
// (the error then matches ErrUnsynced). It is safe to call twice.
func (st *Stager) Close() error {
	st.closeOnce.Do(func() {
		var errs []error
		if st.s != nil {
			if err := st.sync(); err != nil {
				errs = append(errs, err)
			}
			errs = append(errs, st.s.Close())
		} else {
			st.failed = true // nothing was queued, but nothing can be waited for either
		}
		for i := range st.buf {
			if st.ev[i] != nil {
				errs = append(errs, st.ev[i].Close())
			}
			if st.buf[i] == nil {
				continue
			}
			if st.from != nil {
				st.from.give(st.buf[i], !st.failed)
			} else {
				errs = append(errs, st.buf[i].Close())
			}
		}
		st.closeErr = errors.Join(errs...)
	})
	return st.closeErr
}

// StagingBuffers keeps pinned buffers of one size for the stagers made
// from it to reuse (cuMemHostAlloc is slow on a real driver). It is safe
// for concurrent use.
type StagingBuffers struct {
	d    *Driver
	size uint64
	keep int

	mu     sync.Mutex
	free   []*PinnedMemory
	closed bool
}

// NewStagingBuffers keeps up to keep pinned buffers of size bytes.
func (d *Driver) NewStagingBuffers(size uint64, keep int) (*StagingBuffers, error) {
	if size == 0 {
		return nil, fmt.Errorf("cuda: staging buffers of 0 bytes: %w", ErrInvalidValue)
	}
	return &StagingBuffers{d: d, size: size, keep: keep}, nil
}

// Size returns the size of each buffer.
func (b *StagingBuffers) Size() uint64 { return b.size }

// NewStager makes a stager for dev whose two buffers come from b and go
// back to it on Close.
func (b *StagingBuffers) NewStager(dev int) (*Stager, error) {
	return b.d.newStager(dev, b.size, b)
}

// Kept returns how many buffers wait for reuse.
func (b *StagingBuffers) Kept() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.free)
}

func (b *StagingBuffers) take() (*PinnedMemory, error) {
	b.mu.Lock()
	if n := len(b.free); n > 0 {
		m := b.free[n-1]
		b.free = b.free[:n-1]
		b.mu.Unlock()
		return m, nil
	}
	b.mu.Unlock()
	m, err := b.d.AllocPinned(b.size, -1)
	if err != nil {
		return nil, fmt.Errorf("cuda: pinned staging buffer of %d bytes: %w", b.size, err)
	}
	return m, nil
}

// give keeps m for reuse when reusable and there is room, else frees it.
func (b *StagingBuffers) give(m *PinnedMemory, reusable bool) {
	b.mu.Lock()
	if reusable && !b.closed && len(b.free) < b.keep {
		b.free = append(b.free, m)
		m = nil
	}
	b.mu.Unlock()
	if m != nil {
		m.Close()
	}
}

// Close frees the kept buffers; buffers given back later are freed too.
// Close it before the driver. It is safe to call twice.
func (b *StagingBuffers) Close() error {
	b.mu.Lock()
	free := b.free
	b.free, b.closed = nil, true
	b.mu.Unlock()
	var errs []error
	for _, m := range free {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}
