package transfer

import (
	"fmt"
	"slices"
	"sync"
	"time"
)

// requestBudget caps the request bytes one peer may have in flight, across
// all its connections and streams. A stream charges the length its frame
// header announces, in one step, before it reads any of the payload
// (readFrameCharged), and gives it back once the request is decoded or the
// stream fails. A stream whose frame would pass the cap waits, before
// reading its payload, for the peer's others to finish, up to its deadline.
// Every stream that holds a charge holds all it needs, so the others
// finish (or reach their own deadline) without waiting on the budget, and
// waiters are let in in arrival order: any frame that fits the cap alone
// is let in once those ahead of it are done. The charge is
// bookkeeping: the frame's buffer still grows only as bytes arrive, so a
// peer that announces a frame and goes silent costs the holder memory only
// for what it sent, and stalls only its own budget until its deadline.
// Without the cap, a member could open MaxStreamsPerConn streams on as
// many connections as it likes and have the holder buffer a full frame on
// each.
type requestBudget struct {
	peer  string
	max   int64
	stats *counters

	mu      sync.Mutex
	used    int64
	waiters []*budgetWaiter // in arrival order
	refs    int             // streams using it, under Node.mu
}

// budgetWaiter is a stream waiting for n bytes; ready is closed, under
// requestBudget.mu, once they are its.
type budgetWaiter struct {
	n     int64
	ready chan struct{}
}

func newRequestBudget(peer string, max int64, stats *counters) *requestBudget {
	return &requestBudget{peer: peer, max: max, stats: stats}
}

// acquire takes n bytes of the budget, waiting for them until deadline.
// Waiters are let in in arrival order: a later request does not pass one
// that waits, even if it would fit, so a full-size request is let in once
// those ahead of it finish. n over the whole cap can never fit and is
// refused at once.
func (b *requestBudget) acquire(n int64, deadline time.Time) error {
	if n > b.max {
		return fmt.Errorf("%w: a request of %d bytes from peer %s is over the cap of %d (MaxPeerRequestBytes)",
			ErrTooLarge, n, b.peer, b.max)
	}
	b.mu.Lock()
	if len(b.waiters) == 0 && b.used+n <= b.max {
		b.take(n)
		b.mu.Unlock()
		return nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	b.stats.budgetWaits.Add(1)
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-w.ready:
		return nil
	case <-timer.C:
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready: // let in as the deadline passed
		return nil
	default:
	}
	b.waiters = slices.DeleteFunc(b.waiters, func(x *budgetWaiter) bool { return x == w })
	b.grant() // it may have held back smaller ones behind it
	return fmt.Errorf("%w: peer %s has %d request bytes in flight; %d more would pass the cap of %d (MaxPeerRequestBytes)",
		ErrUnavailable, b.peer, b.used, n, b.max)
}

// release gives back n bytes and lets in the waiters they make room for.
func (b *requestBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.stats.requestBytes.Add(-n)
	b.grant()
}

// take charges n bytes; under mu.
func (b *requestBudget) take(n int64) {
	b.used += n
	b.stats.requestBytes.Add(n)
}

// grant lets waiters in, in arrival order, while the first of them fits;
// under mu.
func (b *requestBudget) grant() {
	for len(b.waiters) > 0 && b.used+b.waiters[0].n <= b.max {
		w := b.waiters[0]
		b.waiters[0] = nil
		b.waiters = b.waiters[1:]
		b.take(w.n)
		close(w.ready)
	}
}

// budget returns the peer's request budget; done must be called when the
// stream no longer uses it.
func (n *Node) budget(peer string) (b *requestBudget, done func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	b = n.budgets[peer]
	if b == nil {
		b = newRequestBudget(peer, int64(n.cfg.MaxPeerRequestBytes), &n.stats)
		n.budgets[peer] = b
	}
	b.refs++
	return b, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		if b.refs--; b.refs == 0 {
			delete(n.budgets, peer)
		}
	}
}
