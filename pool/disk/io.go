package disk

import (
	"context"
	"fmt"

	"golang.org/x/sys/unix"
)

// request is one pread or pwrite of a whole aligned buffer, or one
// pwritev of aligned pieces (vec, then buf is nil), done by a worker.
type request struct {
	write bool
	f     interface{ Fd() uintptr }
	off   int64
	buf   []byte
	vec   [][]byte
	done  chan error
	// straight: buf or vec is the caller's memory, not a buffer of the
	// store's; fail is Config.FailIO.
	straight bool
	fail     func(write, straight bool) error
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
	if r.fail != nil {
		if err := r.fail(r.write, r.straight); err != nil {
			return fmt.Errorf("disk: %s at %d failed: %w", map[bool]string{true: "write", false: "read"}[r.write], r.off, err)
		}
	}
	fd := int(r.f.Fd())
	if r.vec != nil {
		return r.runVec(fd)
	}
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

// runVec writes r.vec's pieces in order from r.off with pwritev (reads
// them with preadv), going on after a short transfer from where it
// stopped.
func (r request) runVec(fd int) error {
	vec := r.vec
	total := 0
	for _, p := range vec {
		total += len(p)
	}
	off := r.off
	for done := 0; done < total; {
		var n int
		var err error
		op := "pwritev"
		if r.write {
			n, err = unix.Pwritev(fd, vec, off)
		} else {
			op = "preadv"
			n, err = unix.Preadv(fd, vec, off)
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("disk: %s %d bytes in %d pieces at %d: %w", op, total, len(r.vec), r.off, err)
		}
		if n == 0 {
			return fmt.Errorf("disk: %s at %d: end of file after %d of %d bytes", op, r.off, done, total)
		}
		done += n
		off += int64(n)
		for n > 0 && len(vec) > 0 {
			if n < len(vec[0]) {
				// Copied, not changed: the caller's list stays whole.
				vec = append([][]byte{vec[0][n:]}, vec[1:]...)
				n = 0
				break
			}
			n -= len(vec[0])
			vec = vec[1:]
		}
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

// bufferWith is pieces' bytes in order in a buffer, zero to the next
// Align boundary.
func (s *Store) bufferWith(pieces ...[]byte) (*aligned, error) {
	a, err := s.buffer()
	if err != nil {
		return nil, err
	}
	n := 0
	for _, p := range pieces {
		n += copy(a.b[n:], p)
	}
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
