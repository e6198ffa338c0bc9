package fabric

import "context"

// ReadAheadCounts are a's read-aheads started and ended, and the restores
// that waited for one.
func ReadAheadCounts(a *Agent) (started, ended, waits uint64) {
	r := &a.tiers.ahead
	return r.started.Load(), r.ended.Load(), r.waits.Load()
}

// HoldReadAheads makes each read-ahead of a, once it holds its slots, call
// f (with its ctx) before it reads; nil: no call.
func HoldReadAheads(a *Agent, f func(ctx context.Context)) {
	if f == nil {
		a.tiers.ahead.allocated.Store(nil)
		return
	}
	a.tiers.ahead.allocated.Store(&f)
}

// TierLinks is how many child links a's tiers keep.
func TierLinks(a *Agent) int { return a.tiers.links() }
