package transfer

import (
	"fmt"
	"sync"
	"time"
)

// requestBudget caps the request bytes one peer may have in flight, across
// all its connections and streams. A stream charges the length its frame
// header announces, in one step, before it reads any of the payload
// (readFrameCharged), and gives it back once the request is decoded or the
// stream fails. A stream whose frame would pass the cap waits, before
// reading its payload, for the peer's others to finish, up to its deadline;
// since every stream that holds a charge holds all it needs, the others
// finish (or reach their own deadline) without waiting on the budget, and
// any frame that fits the cap alone is eventually let in. The charge is
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

	mu   sync.Mutex
	used int64
	refs int // streams using it, under Node.mu
	wake chan struct{}
}

func newRequestBudget(peer string, max int64, stats *counters) *requestBudget {
	return &requestBudget{peer: peer, max: max, stats: stats, wake: make(chan struct{})}
}

// acquire takes n bytes of the budget, waiting for them until deadline.
// n over the whole cap can never fit and is refused at once.
func (b *requestBudget) acquire(n int64, deadline time.Time) error {
	if n > b.max {
		return fmt.Errorf("%w: a request of %d bytes from peer %s is over the cap of %d (MaxPeerRequestBytes)",
			ErrTooLarge, n, b.peer, b.max)
	}
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	counted := false
	for {
		b.mu.Lock()
		if b.used+n <= b.max {
			b.used += n
			b.mu.Unlock()
			b.stats.requestBytes.Add(n)
			return nil
		}
		wake, used := b.wake, b.used
		b.mu.Unlock()
		if !counted {
			counted = true
			b.stats.budgetWaits.Add(1)
		}
		if timer == nil {
			timer = time.NewTimer(time.Until(deadline))
		}
		select {
		case <-wake:
		case <-timer.C:
			return fmt.Errorf("%w: peer %s has %d request bytes in flight; %d more would pass the cap of %d (MaxPeerRequestBytes)",
				ErrUnavailable, b.peer, used, n, b.max)
		}
	}
}

// release gives back n bytes and wakes the streams waiting for them.
func (b *requestBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	close(b.wake)
	b.wake = make(chan struct{})
	b.mu.Unlock()
	b.stats.requestBytes.Add(-n)
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
