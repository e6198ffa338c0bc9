package cuda

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
)

// Direction says which sides of a copy are device memory.
type Direction uint8

const (
	// HostToDevice copies from host memory to device memory.
	HostToDevice Direction = iota + 1
	// DeviceToHost copies from device memory to host memory.
	DeviceToHost
	// DeviceToDevice copies between device pointers (IPC-opened memory
	// included).
	DeviceToDevice
)

func (d Direction) String() string {
	switch d {
	case HostToDevice:
		return "HtoD"
	case DeviceToHost:
		return "DtoH"
	case DeviceToDevice:
		return "DtoD"
	}
	return fmt.Sprintf("Direction(%d)", uint8(d))
}

// Copy2D is a pitched copy (cuMemcpy2DAsync): Height rows of Width bytes,
// row i read at Src+i*SrcPitch and written at Dst+i*DstPitch. One call
// moves a strided NHD head slice instead of one copy per token.
type Copy2D struct {
	Dir      Direction
	Dst      uint64
	DstPitch uint64
	Src      uint64
	SrcPitch uint64
	Width    uint64
	Height   uint64
}

// Stream is an in-order queue of device work on one GPU (a non-blocking
// stream: it does not synchronise with the legacy default stream). Methods
// may be called from any goroutine; work runs in the order it was queued.
//
// Host memory given to the async copies must stay valid, and must not be
// memory the Go garbage collector manages, until the stream has passed the
// copy: use pinned memory or pool storage, or the synchronous Copy.
type Stream struct {
	d   *Driver
	dev int
	h   streamHandle

	once sync.Once
	err  error
}

// NewStream makes a stream on dev.
func (d *Driver) NewStream(dev int) (*Stream, error) {
	if err := d.context(dev); err != nil {
		return nil, err
	}
	h, err := d.lib.streamCreate(dev)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: new stream: %w", dev, err)
	}
	return &Stream{d: d, dev: dev, h: h}, nil
}

// Device returns the GPU the stream runs on.
func (s *Stream) Device() int { return s.dev }

// CopyAsync queues a copy of n bytes from src to dst. Addresses are device
// pointers or host addresses as dir says.
func (s *Stream) CopyAsync(dir Direction, dst, src, n uint64) error {
	if dir < HostToDevice || dir > DeviceToDevice {
		return fmt.Errorf("cuda: copy: %v: %w", dir, ErrInvalidValue)
	}
	if n == 0 {
		return nil
	}
	if err := s.d.lib.copyAsync(s.dev, dir, dst, src, n, s.h); err != nil {
		return fmt.Errorf("cuda: device %d: %v copy of %d bytes %#x -> %#x: %w", s.dev, dir, n, src, dst, err)
	}
	return nil
}

// CopyPeerAsync queues a copy of n bytes from src, device memory of GPU
// srcDev, to dst, device memory of GPU dstDev (cuMemcpyPeerAsync between
// the two GPUs' primary contexts, retained here if they were not). The
// stream may be on either GPU or a third. The binding does not call
// cuCtxEnablePeerAccess: whether the driver then moves the bytes directly
// between the GPUs or through host memory is the driver's choice.
func (s *Stream) CopyPeerAsync(dst uint64, dstDev int, src uint64, srcDev int, n uint64) error {
	for _, dev := range [...]int{dstDev, srcDev} {
		if err := s.checkDevice(dev); err != nil {
			return fmt.Errorf("cuda: peer copy: %w", err)
		}
	}
	if n == 0 {
		return nil
	}
	if err := s.d.lib.copyPeerAsync(s.dev, dst, dstDev, src, srcDev, n, s.h); err != nil {
		return fmt.Errorf("cuda: device %d: peer copy of %d bytes %#x (GPU %d) -> %#x (GPU %d): %w", s.dev, n, src, srcDev, dst, dstDev, err)
	}
	return nil
}

// checkDevice refuses a GPU index the driver does not have and retains
// the primary context of one it has.
func (s *Stream) checkDevice(dev int) error {
	if n := len(s.d.devices); dev < 0 || dev >= n {
		return fmt.Errorf("GPU %d: the driver has %d (0 to %d): %w", dev, n, n-1, ErrInvalidValue)
	}
	return s.d.context(dev)
}

// Copy2DAsync queues a pitched copy.
func (s *Stream) Copy2DAsync(c Copy2D) error {
	if c.Dir < HostToDevice || c.Dir > DeviceToDevice {
		return fmt.Errorf("cuda: 2-D copy: %v: %w", c.Dir, ErrInvalidValue)
	}
	if c.Width == 0 || c.Height == 0 {
		return nil
	}
	// Also for one row: what a driver accepts for a pitch it does not use
	// is not documented, so no pitch narrower than a row is passed.
	if c.SrcPitch < c.Width || c.DstPitch < c.Width {
		return fmt.Errorf("cuda: 2-D copy: pitches %d (src) and %d (dst) must be at least the width %d: %w",
			c.SrcPitch, c.DstPitch, c.Width, ErrInvalidValue)
	}
	if err := s.d.lib.copy2DAsync(s.dev, c, s.h); err != nil {
		return fmt.Errorf("cuda: device %d: %v 2-D copy %dx%d: %w", s.dev, c.Dir, c.Width, c.Height, err)
	}
	return nil
}

// CopyHtoD copies host bytes (any memory, Go's included) to dst and
// returns when they have arrived. Work queued before it on the stream runs
// first.
func (s *Stream) CopyHtoD(dst uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := s.d.lib.copySync(s.dev, HostToDevice, src, dst, s.h); err != nil {
		return fmt.Errorf("cuda: device %d: HtoD copy of %d bytes to %#x: %w", s.dev, len(src), dst, err)
	}
	return nil
}

// CopyDtoH copies len(dst) bytes from src into dst (any memory, Go's
// included) and returns when they have arrived.
func (s *Stream) CopyDtoH(dst []byte, src uint64) error {
	if len(dst) == 0 {
		return nil
	}
	if err := s.d.lib.copySync(s.dev, DeviceToHost, dst, src, s.h); err != nil {
		return fmt.Errorf("cuda: device %d: DtoH copy of %d bytes from %#x: %w", s.dev, len(dst), src, err)
	}
	return nil
}

// Wait makes the stream's later work wait until the work before e's last
// Record has finished.
func (s *Stream) Wait(e *Event) error {
	if err := s.d.lib.streamWait(s.dev, s.h, e.h); err != nil {
		return fmt.Errorf("cuda: device %d: stream wait: %w", s.dev, err)
	}
	return nil
}

// Synchronize blocks until all work queued so far has finished.
func (s *Stream) Synchronize() error {
	if err := s.d.lib.streamSync(s.dev, s.h); err != nil {
		return fmt.Errorf("cuda: device %d: stream synchronize: %w", s.dev, err)
	}
	return nil
}

// Close destroys the stream; work already queued still completes. It is
// safe to call twice.
func (s *Stream) Close() error {
	s.once.Do(func() {
		if err := s.d.lib.streamDestroy(s.dev, s.h); err != nil {
			s.err = fmt.Errorf("cuda: device %d: destroy stream: %w", s.dev, err)
		}
	})
	return s.err
}

// Event marks a point in a stream (timing disabled).
type Event struct {
	d   *Driver
	dev int
	h   eventHandle

	once sync.Once
	err  error
}

// NewEvent makes an event on dev.
func (d *Driver) NewEvent(dev int) (*Event, error) {
	if err := d.context(dev); err != nil {
		return nil, err
	}
	h, err := d.lib.eventCreate(dev)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: new event: %w", dev, err)
	}
	return &Event{d: d, dev: dev, h: h}, nil
}

// Record captures the work queued on s so far.
func (e *Event) Record(s *Stream) error {
	if err := e.d.lib.eventRecord(e.dev, e.h, s.h); err != nil {
		return fmt.Errorf("cuda: device %d: record event: %w", e.dev, err)
	}
	return nil
}

// Done reports whether the work captured by the last Record has finished
// (true for an event never recorded).
func (e *Event) Done() (bool, error) {
	ok, err := e.d.lib.eventQuery(e.dev, e.h)
	if err != nil {
		return false, fmt.Errorf("cuda: device %d: query event: %w", e.dev, err)
	}
	return ok, nil
}

// Synchronize blocks until the work captured by the last Record finished.
func (e *Event) Synchronize() error {
	if err := e.d.lib.eventSync(e.dev, e.h); err != nil {
		return fmt.Errorf("cuda: device %d: synchronize event: %w", e.dev, err)
	}
	return nil
}

// eventSpin is how long Wait queries an event back to back, yielding the
// processor between queries, before it sleeps between them. The copy
// engine moves a staging buffer of a few MiB in tens to hundreds of
// microseconds, and a Go timer shorter than a millisecond sleeps about a
// millisecond when the process is otherwise idle (the runtime's poller
// waits in whole milliseconds): sleeping at once made staged copies run at
// a seventh of the copy engine's speed on an H200.
const eventSpin = 2 * time.Millisecond

// Wait polls until the event is done or ctx ends; unlike Synchronize it
// can be abandoned. It spins for eventSpin, then polls every millisecond.
func (e *Event) Wait(ctx context.Context) error {
	var deadline time.Time
	for i := 0; ; i++ {
		ok, err := e.Done()
		if err != nil || ok {
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("cuda: device %d: wait for event: %w", e.dev, err)
		}
		if i == 0 {
			deadline = time.Now().Add(eventSpin)
		}
		if time.Now().Before(deadline) {
			runtime.Gosched()
			continue
		}
		t := time.NewTimer(time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("cuda: device %d: wait for event: %w", e.dev, ctx.Err())
		case <-t.C:
		}
	}
}

// Close destroys the event. It is safe to call twice.
func (e *Event) Close() error {
	e.once.Do(func() {
		if err := e.d.lib.eventDestroy(e.dev, e.h); err != nil {
			e.err = fmt.Errorf("cuda: device %d: destroy event: %w", e.dev, err)
		}
	})
	return e.err
}
