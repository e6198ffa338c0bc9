package disk

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
)

// request is one pread or pwrite of a whole aligned buffer, done by a worker.
type request struct {
	write bool
	f     interface{ Fd() uintptr }
	off   int64
	buf   []byte
	done  chan error
}

// do queues r for a worker and waits for it. Waiting for room in the queue
// honours ctx; a request taken by a worker runs to its end (its buffer is
// the caller's until then).
func (s *Store) do(ctx context.Context, r request) error {
	r.done = make(chan error, 1)
	if err := s.send(ctx, r); err != nil {
		return err
	}
	return <-r.done
}

// send queues r (its done channel made by the caller, with room for the
// answer) for a worker without waiting for it to run; waiting for room in
// the queue honours ctx. An error says r was not queued.
func (s *Store) send(ctx context.Context, r request) error {
	s.queue.RLock()
	defer s.queue.RUnlock()
	if s.queueClosed {
		return ErrClosed
	}
	select {
	case s.requests <- r:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("disk: waiting for one of %d queued requests to end: %w", cap(s.requests), ctx.Err())
	}
}

func (s *Store) worker() {
	defer s.workersWG.Done()
	for r := range s.requests {
		s.running <- struct{}{}
		err := r.run()
		<-s.running
		r.done <- err
	}
}

// readInline runs r on the caller's goroutine once fewer than Workers
// requests run: a read that hands its request to a worker and waits for
// the answer pays two goroutine wake-ups, which on a loaded machine cost
// as much as the read. Waiting for its turn honours ctx; Close waits for
// reads under way.
func (s *Store) readInline(ctx context.Context, r request) error {
	s.queue.RLock()
	defer s.queue.RUnlock()
	if s.queueClosed {
		return ErrClosed
	}
	select {
	case s.running <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("disk: waiting for one of %d reads and writes under way to end: %w", cap(s.running), ctx.Err())
	}
	defer func() { <-s.running }()
	return r.run()
}

func (r request) run() error {
	fd := int(r.f.Fd())
	for done := 0; done < len(r.buf); {
		var n int
		var err error
		if r.write {
			n, err = unix.Pwrite(fd, r.buf[done:], r.off+int64(done))
		} else {
			n, err = unix.Pread(fd, r.buf[done:], r.off+int64(done))
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("disk: %s %d bytes at %d: %w", map[bool]string{true: "pwrite", false: "pread"}[r.write], len(r.buf), r.off, err)
		}
		if n == 0 {
			return fmt.Errorf("disk: pread at %d: end of file after %d of %d bytes", r.off, done, len(r.buf))
		}
		done += n
	}
	return nil
}

// aligned is a buffer O_DIRECT accepts: page aligned, outside the Go heap,
// one slot long. A store keeps up to Workers+QueueDepth of them for reuse.
type aligned struct{ b []byte }

func (s *Store) buffer() (*aligned, error) {
	select {
	case a := <-s.bufs:
		return a, nil
	default:
	}
	b, err := unix.Mmap(-1, 0, s.cfg.SlotBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("disk: map an I/O buffer of %d bytes: %w", s.cfg.SlotBytes, err)
	}
	return &aligned{b: b}, nil
}

// bufferWith is data in a buffer, zero to the next Align boundary.
func (s *Store) bufferWith(data []byte) (*aligned, error) {
	a, err := s.buffer()
	if err != nil {
		return nil, err
	}
	n := copy(a.b, data)
	clear(a.b[n:roundUp(n)])
	return a, nil
}

func (s *Store) release(a *aligned) {
	select {
	case s.bufs <- a:
	default:
		unix.Munmap(a.b)
	}
}
