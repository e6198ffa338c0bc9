package fabric

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

// A block's failed slot reads in a row keep it (not another set's copy of
// its hash) from being offered for a
// delay that doubles from tierReadBackoffMin up to tierReadBackoffMax; a
// read that succeeds clears it; the warnings are spaced by
// tierSkipLogEvery, each counting the failures not logged before it.
func TestReadBackoff(t *testing.T) {
	var b readBackoff
	now := time.Unix(1000, 0)
	at := func() time.Time { return now }
	if b.refuse(1, 1, at) {
		t.Fatal("a block with no failure refused")
	}
	want := tierReadBackoffMin
	var lastLog time.Time
	notLogged, logs := 0, 0
	for i := range 12 {
		d := b.failed(1, 1, now)
		log, suppressed := b.log.due(now, tierSkipLogEvery)
		if d != want {
			t.Fatalf("failure %d: delay %v, want %v", i+1, d, want)
		}
		if due := i == 0 || now.Sub(lastLog) >= tierSkipLogEvery; log != due || log && suppressed != notLogged {
			t.Fatalf("failure %d, %v after the last logged: logged %v counting %d, want %v counting %d",
				i+1, now.Sub(lastLog), log, suppressed, due, notLogged)
		}
		if log {
			lastLog, notLogged = now, 0
			logs++
		} else {
			notLogged++
		}
		if !b.refuse(1, 1, at) {
			t.Fatalf("failure %d: offered at once", i+1)
		}
		if b.refuse(2, 1, at) {
			t.Fatalf("failure %d in set 1: set 2's copy of the hash refused", i+1)
		}
		now = now.Add(d - time.Nanosecond)
		if !b.refuse(1, 1, at) {
			t.Fatalf("failure %d: offered before its delay of %v", i+1, d)
		}
		now = now.Add(time.Nanosecond)
		if b.refuse(1, 1, at) {
			t.Fatalf("failure %d: refused after its delay of %v", i+1, d)
		}
		want = min(2*want, tierReadBackoffMax)
	}
	if want != tierReadBackoffMax {
		t.Fatalf("delays reached %v, want them capped at %v", want, tierReadBackoffMax)
	}
	if logs == 1 || logs == 12 {
		t.Fatal("failures spaced by less and by more than the log's spacing: all logged, or only the first")
	}
	// Failures of other blocks at once: one logged, the rest counted in
	// the next line.
	now = lastLog.Add(tierSkipLogEvery)
	for i := range 5 {
		b.failed(1, 3, now)
		if log, _ := b.log.due(now, tierSkipLogEvery); log != (i == 0) {
			t.Fatalf("failure %d at once: logged %v", i+1, log)
		}
	}
	now = now.Add(tierSkipLogEvery)
	b.failed(1, 2, now)
	if log, suppressed := b.log.due(now, tierSkipLogEvery); !log || suppressed != 4 {
		t.Fatalf("%v after the last logged: logged %v counting %d, want it logged counting 4", tierSkipLogEvery, log, suppressed)
	}
	b.succeeded(1, 3)
	b.succeeded(1, 1)
	if d := b.failed(1, 1, now); d != tierReadBackoffMin {
		t.Fatalf("after a read that succeeded, a failure's delay %v, want %v", d, tierReadBackoffMin)
	}
	b.succeeded(1, 1)
	b.succeeded(1, 2)
	if b.n.Load() != 0 || b.refuse(1, 1, at) || b.refuse(1, 2, at) {
		t.Fatal("failures kept after the reads succeeded")
	}
}

// readBackoff keeps at most tierReadBackoffBlocks blocks: at the limit a
// new failure sweeps those whose delay passed; with none passed, it is
// not kept (offered again at once, as with no back-off).
func TestReadBackoffAtItsLimit(t *testing.T) {
	var b readBackoff
	now := time.Unix(1000, 0)
	at := func() time.Time { return now }
	for h := range uint64(tierReadBackoffBlocks) {
		if d := b.failed(1, h, now); d != tierReadBackoffMin {
			t.Fatalf("block %d of %d: delay %v", h, tierReadBackoffBlocks, d)
		}
	}
	past := uint64(tierReadBackoffBlocks)
	if d := b.failed(1, past, now); d != 0 || b.refuse(1, past, at) {
		t.Fatalf("a block past the limit kept: delay %v", d)
	}
	if got := b.n.Load(); got != tierReadBackoffBlocks {
		t.Fatalf("%d blocks kept, want %d", got, tierReadBackoffBlocks)
	}
	if d := b.failed(1, 0, now); d != 2*tierReadBackoffMin {
		t.Fatalf("a block kept at the limit failing again: delay %v, want %v", d, 2*tierReadBackoffMin)
	}
	now = now.Add(tierReadBackoffMin) // every delay but block 0's passed
	if d := b.failed(1, past, now); d != tierReadBackoffMin || !b.refuse(1, past, at) {
		t.Fatalf("past the limit, the passed swept: delay %v", d)
	}
	if got := b.n.Load(); got != 2 {
		t.Fatalf("%d blocks kept after the sweep, want 2 (block 0 and the new one)", got)
	}
}

// A block's back-off comes down once its failures stop: a read that
// succeeds clears it, and quiet time past its delay takes one doubling off
// for each tierReadBackoffDecay, until the block is forgotten (no lock
// taken by offers again). A block failing again after a quiet spell
// starts lower, not where its failures in a row had brought it.
func TestReadBackoffComesDown(t *testing.T) {
	// Failures in a row short of the cap, so that each step down shows.
	const failures = 8
	delayAfter := func(n int) time.Duration { // the delay of failure n+1 in a row
		d := tierReadBackoffMin
		for range n {
			d = min(2*d, tierReadBackoffMax)
		}
		return d
	}
	for _, tc := range []struct {
		name string
		// quiet is spent after the last failure's delay passed, then
		// settle is called.
		quiet  time.Duration
		settle func(b *readBackoff)
		// next is the next failure's delay; forgotten: no block kept
		// after settle.
		next      time.Duration
		forgotten bool
	}{
		{"a read that succeeds", 0, func(b *readBackoff) { b.succeeded(1, 1) }, tierReadBackoffMin, true},
		{"no quiet", 0, nil, delayAfter(failures), false},
		{"quiet just short of one decay", tierReadBackoffDecay - time.Millisecond, nil, delayAfter(failures), false},
		{"one decay", tierReadBackoffDecay, nil, delayAfter(failures - 1), false},
		{"three decays", 3 * tierReadBackoffDecay, nil, delayAfter(failures - 3), false},
		{"every failure but one decayed", (failures - 1) * tierReadBackoffDecay, nil, delayAfter(1), false},
		{"every failure decayed", failures * tierReadBackoffDecay, nil, tierReadBackoffMin, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var b readBackoff
				// failures in a row, each as its delay passed.
				for i := range failures {
					d := b.failed(1, 1, time.Now())
					if d != delayAfter(i) {
						t.Fatalf("failure %d in a row: delay %v, want %v", i+1, d, delayAfter(i))
					}
					time.Sleep(d)
				}
				time.Sleep(tc.quiet)
				if tc.settle != nil {
					tc.settle(&b)
				}
				if b.refuse(1, 1, time.Now) {
					t.Fatalf("refused %v past its delay", tc.quiet)
				}
				if kept := b.n.Load(); (kept == 0) != tc.forgotten {
					t.Fatalf("%d blocks kept after %v of quiet; want it forgotten: %v", kept, tc.quiet, tc.forgotten)
				}
				if d := b.failed(1, 1, time.Now()); d != tc.next {
					t.Fatalf("a failure after %v of quiet: delay %v, want %v", tc.quiet, d, tc.next)
				}
			})
		})
	}
	// Failures at the cap count no further: however many, the quiet of
	// as many decays as it took to reach the cap forgets the block.
	synctest.Test(t, func(t *testing.T) {
		var b readBackoff
		toCap := 0
		for delayAfter(toCap) < tierReadBackoffMax {
			toCap++
		}
		for range 10 * toCap {
			d := b.failed(1, 1, time.Now())
			time.Sleep(d)
		}
		time.Sleep(time.Duration(toCap)*tierReadBackoffDecay - time.Millisecond)
		if b.refuse(1, 1, time.Now); b.n.Load() != 1 {
			t.Fatalf("forgotten before %d decays", toCap)
		}
		time.Sleep(time.Millisecond)
		if b.refuse(1, 1, time.Now) || b.n.Load() != 0 {
			t.Fatalf("%d failures at the cap kept after %d decays of quiet", 10*toCap, toCap)
		}
	})
}

// A block whose failures all decayed is forgotten even if it is never
// offered again (recycled as it was): a failure recorded, or an offer of
// any block, sweeps such blocks, at most once each tierReadBackoffDecay,
// so that the blocks kept come down to none and offers take no lock.
func TestReadBackoffSweepsDecayedBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var b readBackoff
		kept := func(when string, want int64) {
			t.Helper()
			if got := b.n.Load(); got != want {
				t.Fatalf("%s: %d blocks kept, want %d", when, got, want)
			}
		}
		// Block 1 fails once (a sweep then, of nothing), and is not
		// offered again.
		b.failed(1, 1, time.Now())
		time.Sleep(tierReadBackoffMin + tierReadBackoffDecay)
		// Its failure decayed: block 2's failure sweeps it.
		b.failed(1, 2, time.Now())
		kept("block 1 decayed, block 2 failing", 1)
		swept := time.Now()
		// A decay period on, block 2's failure has not decayed yet: an
		// offer of block 3 sweeps and keeps it.
		time.Sleep(tierReadBackoffDecay + tierReadBackoffMin/2)
		if b.refuse(1, 3, time.Now) {
			t.Fatal("a block that never failed refused")
		}
		kept("block 2 short of its decay", 1)
		swept = swept.Add(tierReadBackoffDecay + tierReadBackoffMin/2)
		// Decayed now, but the last sweep was less than a decay period
		// ago: not swept yet.
		time.Sleep(tierReadBackoffMin)
		b.refuse(1, 3, time.Now)
		kept(fmt.Sprintf("block 2 decayed, %v after the last sweep", time.Since(swept)), 1)
		time.Sleep(tierReadBackoffDecay - tierReadBackoffMin)
		b.refuse(1, 3, time.Now)
		kept(fmt.Sprintf("block 2 decayed, %v after the last sweep", time.Since(swept)), 0)
	})
}
