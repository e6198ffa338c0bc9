package fabric

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/pool"
)

// A block whose slot a copy down cannot read (a device set's download that
// the driver fails) stays in memory as before its offer, and would be
// offered again at the next allocation, failing again at the copy engine's
// cost and logging each time. readBackoff keeps such blocks from being
// offered, by set and hash (another set's copy of the hash, in memory that
// reads, is offered as before), for a time that doubles with each failure in a row
// (tierReadBackoffMin up to tierReadBackoffMax); an offer refused leaves
// the block to recycling as the bottom tier's. The back-off comes down
// once the failures stop: a read that succeeds clears its hash, and each
// tierReadBackoffDecay without a failure past a block's delay takes one
// doubling off (a block not offered meanwhile, in use or not recycled,
// fails no read), down to none, when the block is forgotten: by its next
// offer, or by a sweep of every such block at most once each
// tierReadBackoffDecay as failures are recorded or blocks offered, so that
// a block never offered again (recycled as it was) is forgotten too and
// offers take no lock again once the failures stop. The warnings
// of failed reads are spaced by tierSkipLogEvery, each counting the
// failures since the last.

// tierReadBackoffMin and tierReadBackoffMax bound how long a block whose
// slot read failed is not offered again: the first failure's delay, and
// the most any later failure in a row doubles it to.
const (
	tierReadBackoffMin = 100 * time.Millisecond
	tierReadBackoffMax = 30 * time.Second
)

// tierReadBackoffDecay is the time without a failure, past a block's
// delay, that takes one of its failures in a row off: a block at
// tierReadBackoffMax (its failures counted up to the first at the cap) is
// back to tierReadBackoffMin and forgotten after 9 of them (4.5 minutes).
const tierReadBackoffDecay = tierReadBackoffMax

// tierReadBackoffBlocks is the most blocks readBackoff keeps: past it, the
// failures whose delay has passed are swept, and if none has, the failure
// is not kept (its block may be offered again at once, as without it).
const tierReadBackoffBlocks = 4096

// readBackoff is the blocks not offered after a failed slot read. Safe
// for concurrent use; the zero value is ready.
type readBackoff struct {
	n atomic.Int64 // entries in m: none is the common case, and costs no lock

	mu sync.Mutex
	m  map[backoffKey]readFailure
	// log spaces the failures' log lines, counting those not logged.
	log logSpacing
	// swept is when the blocks whose failures all decayed were last
	// swept (sweepLocked).
	swept time.Time
}

// backoffKey is a block in a set: the set's copy of a hash.
type backoffKey struct {
	set  pool.SetID
	hash uint64
}

// readFailure is a hash's failed slot reads in a row and until when its
// block is not offered.
type readFailure struct {
	n     int
	until time.Time
}

// at is f's failures in a row at now: one fewer for each
// tierReadBackoffDecay since its delay passed, and none at the least.
func (f readFailure) at(now time.Time) int {
	if now.Before(f.until) {
		return f.n
	}
	return max(f.n-int(now.Sub(f.until)/tierReadBackoffDecay), 0)
}

// failed records a failed slot read of hash in set at now and returns how long
// its block is not offered. Whether to log the failure is the caller's to
// ask of b.log, outside b.mu.
func (b *readBackoff) failed(set pool.SetID, hash uint64, now time.Time) (delay time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[backoffKey]readFailure{}
	}
	b.sweepLocked(now)
	k := backoffKey{set, hash}
	f, ok := b.m[k]
	f.n = f.at(now)
	delay = tierReadBackoffMin
	for range min(f.n, 16) {
		delay = min(2*delay, tierReadBackoffMax)
	}
	if !ok && len(b.m) >= tierReadBackoffBlocks {
		for h, e := range b.m {
			if !now.Before(e.until) {
				delete(b.m, h)
			}
		}
	}
	if ok || len(b.m) < tierReadBackoffBlocks {
		n := f.n + 1
		if delay == tierReadBackoffMax {
			// Failures past the cap are not counted: they would only
			// slow the decay.
			n = max(f.n, 1)
		}
		b.m[k] = readFailure{n: n, until: now.Add(delay)}
	} else {
		delay = 0
	}
	b.n.Store(int64(len(b.m)))
	return delay
}

// refuse says whether set's block of hash is not to be offered at now; a
// block whose failures have all decayed (readFailure.at) is forgotten, and
// so are the others whose have, at most once each tierReadBackoffDecay
// (sweepLocked). Called under a block set's lock: with no failure kept it
// takes no lock.
func (b *readBackoff) refuse(set pool.SetID, hash uint64, now func() time.Time) bool {
	if b.n.Load() == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := now()
	b.sweepLocked(t)
	k := backoffKey{set, hash}
	f, ok := b.m[k]
	if !ok {
		return false
	}
	if t.Before(f.until) {
		return true
	}
	if f.at(t) == 0 {
		delete(b.m, k)
		b.n.Store(int64(len(b.m)))
	}
	return false
}

// sweepLocked forgets the blocks whose failures have all decayed at now,
// unless it did less than tierReadBackoffDecay before: a block not
// offered again is forgotten by no refuse of its own, and kept, it would
// have every offer take b.mu. At most tierReadBackoffBlocks blocks, once
// a decay period: the cost of one sweep spread over its offers is small.
// b.mu is held.
func (b *readBackoff) sweepLocked(now time.Time) {
	if !b.swept.IsZero() && now.Sub(b.swept) < tierReadBackoffDecay {
		return
	}
	b.swept = now
	for k, f := range b.m {
		if f.at(now) == 0 {
			delete(b.m, k)
		}
	}
	b.n.Store(int64(len(b.m)))
}

// succeeded forgets the failures of set's block of hash: its slot was read.
func (b *readBackoff) succeeded(set pool.SetID, hash uint64) {
	if b.n.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, backoffKey{set, hash})
	b.n.Store(int64(len(b.m)))
}
