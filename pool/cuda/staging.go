package cuda

import (
	"context"
	"errors"
	"fmt"
)

// Stager moves bytes between a host producer or consumer (a network
// stream, for the QUIC path) and device memory through two pinned buffers,
// so that filling one buffer overlaps the copy engine's work on the other.
// A Stager is used by one goroutine at a time.
type Stager struct {
	d     *Driver
	dev   int
	chunk uint64
	s     *Stream
	buf   [2]*PinnedMemory
	ev    [2]*Event
}

// NewStager makes a stager for dev with two pinned buffers of chunk bytes.
func (d *Driver) NewStager(dev int, chunk uint64) (st *Stager, err error) {
	if chunk == 0 {
		return nil, fmt.Errorf("cuda: stager chunk of 0 bytes: %w", ErrInvalidValue)
	}
	st = &Stager{d: d, dev: dev, chunk: chunk}
	defer func() {
		if err != nil {
			st.Close()
		}
	}()
	if st.s, err = d.NewStream(dev); err != nil {
		return nil, err
	}
	for i := range st.buf {
		if st.buf[i], err = d.AllocPinned(chunk, -1); err != nil {
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

// ToDevice writes n bytes to dst: fill is called once per chunk, in order,
// with a buffer to fill completely (len is the chunk size, or less for the
// last chunk), while the previous chunk is on its way to the device. It
// returns when every byte has arrived, or with the first error (fill's,
// the driver's, or ctx's; bytes already queued still land).
func (st *Stager) ToDevice(ctx context.Context, dst, n uint64, fill func(p []byte) error) error {
	var i int
	for off := uint64(0); off < n; off, i = off+st.chunk, i^1 {
		if err := ctx.Err(); err != nil {
			return st.drain(fmt.Errorf("cuda: stage to device: %w", err))
		}
		m := min(st.chunk, n-off)
		// The buffer is free once its previous copy has finished.
		if err := st.ev[i].Wait(ctx); err != nil {
			return st.drain(err)
		}
		p := st.buf[i].Bytes()[:m]
		if err := fill(p); err != nil {
			return st.drain(fmt.Errorf("cuda: stage to device at %d: %w", off, err))
		}
		if err := st.s.CopyAsync(HostToDevice, dst+off, st.buf[i].Addr(), m); err != nil {
			return st.drain(err)
		}
		if err := st.ev[i].Record(st.s); err != nil {
			return st.drain(err)
		}
	}
	return st.s.Synchronize()
}

// FromDevice reads n bytes from src: drain is called once per chunk, in
// order, with the bytes of that chunk, while the next chunk is being
// copied. The slice is valid only during the call.
func (st *Stager) FromDevice(ctx context.Context, src, n uint64, drain func(p []byte) error) error {
	if n == 0 {
		return nil
	}
	issue := func(i int, off uint64) error {
		if err := st.s.CopyAsync(DeviceToHost, st.buf[i].Addr(), src+off, min(st.chunk, n-off)); err != nil {
			return err
		}
		return st.ev[i].Record(st.s)
	}
	if err := issue(0, 0); err != nil {
		return st.drain(err)
	}
	var i int
	for off := uint64(0); off < n; off, i = off+st.chunk, i^1 {
		if next := off + st.chunk; next < n {
			if err := issue(i^1, next); err != nil {
				return st.drain(err)
			}
		}
		if err := st.ev[i].Wait(ctx); err != nil {
			return st.drain(err)
		}
		if err := drain(st.buf[i].Bytes()[:min(st.chunk, n-off)]); err != nil {
			return st.drain(fmt.Errorf("cuda: stage from device at %d: %w", off, err))
		}
	}
	return nil
}

// drain waits for queued copies so that the buffers are free again, and
// returns err.
func (st *Stager) drain(err error) error {
	return errors.Join(err, st.s.Synchronize())
}

// Close frees the buffers, events and stream. It is safe to call twice.
func (st *Stager) Close() error {
	var errs []error
	if st.s != nil {
		errs = append(errs, st.s.Synchronize(), st.s.Close())
	}
	for i := range st.buf {
		if st.ev[i] != nil {
			errs = append(errs, st.ev[i].Close())
		}
		if st.buf[i] != nil {
			errs = append(errs, st.buf[i].Close())
		}
	}
	return errors.Join(errs...)
}
