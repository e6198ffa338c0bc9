package rdma

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// sendWR is one READ work request about to be posted.
type sendWR struct {
	id       uint64
	op       *ReadOp
	signaled bool
}

// workCompletion is one polled completion.
type workCompletion struct {
	id        uint64
	status    int
	vendorErr uint32
}

// sendQueue is what the read engine needs of a connected queue pair; the cgo
// queue pair implements it over libibverbs, the engine's tests over a model.
// Only the goroutine running read calls it.
type sendQueue interface {
	// post posts wrs as one chain (one post_send) and says how many went
	// in (all of them unless it fails; on failure, those before bad_wr).
	post(wrs []sendWR) (int, error)
	// poll fills wcs with up to len(wcs) completions.
	poll(wcs []workCompletion) (int, error)
	// statusText names a completion status (ibv_wc_status_str).
	statusText(status int) string
	// fail moves the queue pair to the error state, which flushes what is
	// outstanding.
	fail() error
}

// readParams are the queue pair's shape as the engine uses it.
type readParams struct {
	depth       int // send queue depth: never more than this many outstanding
	signalEvery int
	// drain bounds the wait for flushed requests after an abort.
	drain time.Duration
	// cpu, if not nil, is added the CPU time the posting and polling
	// thread used in the read (a software NIC's copies done in its poll
	// included; a real NIC's are not on any CPU).
	cpu *time.Duration
}

// maxMessage is the largest RDMA message verbs can describe (sge lengths are
// 32-bit and a READ is at most 2^31 bytes on every device we know).
const maxMessage = 1 << 31

// validateOps checks every op against the queue pair's scatter limit before
// anything is posted.
func validateOps(ops []ReadOp, maxSGE int) error {
	for i := range ops {
		op := &ops[i]
		if len(op.Local) == 0 {
			return fmt.Errorf("rdma: read op %d has an empty scatter list: %w", i, ErrInvalidArgument)
		}
		if len(op.Local) > maxSGE {
			return fmt.Errorf("rdma: read op %d has %d scatter entries, more than the queue pair's %d: %w", i, len(op.Local), maxSGE, ErrInvalidArgument)
		}
		var total uint64
		for j, s := range op.Local {
			if s.Length == 0 {
				return fmt.Errorf("rdma: read op %d scatter entry %d has length 0: %w", i, j, ErrInvalidArgument)
			}
			total += uint64(s.Length)
		}
		if total > maxMessage {
			return fmt.Errorf("rdma: read op %d reads %d bytes, more than the %d one request may: %w", i, total, uint64(maxMessage), ErrInvalidArgument)
		}
		if op.RemoteAddr+total < op.RemoteAddr {
			return fmt.Errorf("rdma: read op %d: remote range %#x+%d wraps: %w", i, op.RemoteAddr, total, ErrInvalidArgument)
		}
	}
	return nil
}

// readAll posts ops as READs, keeping up to p.depth in flight, and waits for
// all of them. RC completes a send queue in order, so one signalled
// completion accounts for every request before it: requests are signalled
// every p.signalEvery and the last of each post, so the newest posted request
// always has a completion coming. *seq numbers requests across calls so that a
// completion left from an earlier call is never taken for one of this call's.
//
// On an error completion, a failed post or ctx ending, the queue pair is moved
// to the error state and the flushed requests are drained (the device must
// not write into the caller's buffers after read returns), then the error is
// returned. The caller marks the queue pair as needing Reset.
func readAll(ctx context.Context, q sendQueue, ops []ReadOp, p readParams, seq *uint64) (aborted bool, err error) {
	if len(ops) == 0 {
		return false, nil
	}
	// Polling makes a C call per try; keeping them on one thread keeps the
	// CQ's cache lines and the driver's per-thread state on one core.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if p.cpu != nil {
		// Measured on the locked thread, so it is this read's alone.
		defer func(t0 time.Duration) { *p.cpu += threadCPU() - t0 }(threadCPU())
	}

	base := *seq + 1
	*seq += uint64(len(ops))
	batch := make([]sendWR, 0, min(p.depth, len(ops)))
	wcs := make([]workCompletion, 32)
	posted, done := 0, 0
	var seen uint64 // the newest request a completion (of any status) was polled for
	var idle backoff
	var failure error
	for done < len(ops) {
		if err := ctx.Err(); err != nil {
			failure = fmt.Errorf("rdma: read of %d ops (%d completed): %w", len(ops), done, err)
			break
		}
		if free := p.depth - (posted - done); free > 0 && posted < len(ops) {
			n := min(free, len(ops)-posted)
			batch = batch[:0]
			for k := range n {
				i := posted + k
				batch = append(batch, sendWR{
					id:       base + uint64(i),
					op:       &ops[i],
					signaled: (i+1)%p.signalEvery == 0 || k == n-1,
				})
			}
			in, err := q.post(batch)
			posted += in
			if err != nil {
				failure = fmt.Errorf("rdma: post %d reads (%d went in): %w", n, in, err)
				break
			}
		}
		n, err := q.poll(wcs)
		if err != nil {
			failure = fmt.Errorf("rdma: poll completions: %w", err)
			break
		}
		if n == 0 {
			idle.wait()
			continue
		}
		idle = backoff{}
		for _, wc := range wcs[:n] {
			if wc.id < base || wc.id >= base+uint64(posted) {
				continue // from an earlier call
			}
			seen = max(seen, wc.id)
			i := int(wc.id - base)
			if wc.status != 0 {
				if failure == nil {
					failure = &CompletionError{Op: i, Status: wc.status, StatusText: q.statusText(wc.status), VendorErr: wc.vendorErr}
				}
				continue
			}
			done = max(done, i+1)
		}
		if failure != nil {
			break
		}
	}
	if failure == nil {
		return false, nil
	}
	if posted == done && ctx.Err() != nil && errors.Is(failure, ctx.Err()) {
		// Nothing in flight: the queue pair is as healthy as before.
		return false, failure
	}
	return true, abort(q, wcs, base, posted, seen, p.drain, failure)
}

// abort moves the queue pair to error and waits until the newest posted
// request has completed (flushed or not); seen is the newest one a
// completion was already polled for.
func abort(q sendQueue, wcs []workCompletion, base uint64, posted int, seen uint64, drain time.Duration, failure error) error {
	if err := q.fail(); err != nil {
		return fmt.Errorf("%w (and moving the queue pair to error failed: %v)", failure, err)
	}
	last := base + uint64(posted) - 1
	if posted == 0 || seen >= last {
		return failure
	}
	deadline := time.Now().Add(drain)
	var idle backoff
	for time.Now().Before(deadline) {
		n, err := q.poll(wcs)
		if err != nil {
			return fmt.Errorf("%w (and draining the queue pair failed: %v)", failure, err)
		}
		for _, wc := range wcs[:n] {
			if wc.id == last {
				return failure
			}
			if wc.id >= base && wc.id < last {
				seen = max(seen, wc.id)
			}
		}
		if n == 0 {
			idle.wait()
		}
	}
	return fmt.Errorf("%w (and %d requests were still outstanding after %v in the error state: the device may still write into their buffers)", failure, last-max(seen, base-1), drain)
}

// backoff paces the polls of a completion queue that stays empty: it
// yields (runtime.Gosched) for spinFor after the queue was first found
// empty, then sleeps, 10 µs longer each time, up to 1 ms, so that a read
// waiting on a dead peer (about 0.5 s before retry-exceeded) does not
// hold a core.
//
// Sleeps are coarse: a 10 µs time.Sleep took 1.1 ms here (Linux, median
// of 200, on a locked thread or not; the runtime waits for timers in epoll
// with millisecond timeouts), and at 400 Gb/s a send queue of 256 READs of
// 128 KiB drains in 0.67 ms: sleeping after a fixed number of yields could
// leave a NIC idle. A completion comes every signalEvery requests, so when
// none came for spinFor the NIC takes longer than that for signalEvery
// requests, and a full send queue holds more than depth/signalEvery (16 by
// default) times spinFor of work: over 3.2 ms, well past a sleep.
type backoff struct {
	n     int       // sleeps so far
	since time.Time // when the queue was first found empty

	// Tests replace these; nil means time.Now, runtime.Gosched, time.Sleep.
	now   func() time.Time
	yield func()
	sleep func(time.Duration)
}

// spinFor is how long backoff yields before it sleeps.
const spinFor = 200 * time.Microsecond

func (b *backoff) wait() {
	now := time.Now
	if b.now != nil {
		now = b.now
	}
	t := now()
	if b.since.IsZero() {
		b.since = t
	}
	if t.Sub(b.since) < spinFor {
		if b.yield != nil {
			b.yield()
		} else {
			runtime.Gosched()
		}
		return
	}
	b.n++
	d := min(time.Duration(b.n)*10*time.Microsecond, time.Millisecond)
	if b.sleep != nil {
		b.sleep(d)
	} else {
		time.Sleep(d)
	}
}
