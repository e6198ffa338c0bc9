package fabric

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// endAhead says a read-ahead ended only when it did: not when the tiers
// closed or ctx ended first (else allocateNow, which tries again after
// each true, would spin), and true once it has.
func TestEndAheadTrueOnlyWhenItEnded(t *testing.T) {
	closed := make(chan struct{})
	close(closed)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name  string
		done  chan struct{} // the tiers'
		ctx   context.Context
		ended bool // the read-ahead's done closed
		want  bool
	}{
		{"tiers closed", closed, context.Background(), false, false},
		{"ctx ended", make(chan struct{}), cancelled, false, false},
		{"ended", make(chan struct{}), context.Background(), true, true},
		{"ended, tiers closed", closed, context.Background(), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &tiers{done: tc.done}
			r := &aheadRun{done: make(chan struct{}), cancel: func() {}}
			if tc.ended {
				close(r.done)
			}
			es := &engineSet{}
			es.ahead.run = r
			ctx, cancel := context.WithTimeout(tc.ctx, 30*time.Second)
			defer cancel()
			if got := tr.endAhead(ctx, es); got != tc.want {
				t.Fatalf("endAhead = %v; want %v", got, tc.want)
			}
		})
	}
	if (&tiers{done: closed}).endAhead(context.Background(), &engineSet{}) {
		t.Fatal("endAhead = true with no read-ahead under way")
	}
}

// aheadHoldingAll is an agent with tiers, and a set of 4 slots all held,
// not as spare slots, by a read-ahead under way (as one that registered
// its blocks holds them until it releases them): it gives them back once
// cancelled.
func aheadHoldingAll(t *testing.T) (*Agent, *engineSet) {
	t.Helper()
	return aheadHolding(t, false)
}

// aheadHolding is aheadHoldingAll, where spare with as many of the 4 slots
// held as spare ones (pool.BlockSet.AllocateSpare) as the set gives.
func aheadHolding(t *testing.T, spare bool) (*Agent, *engineSet) {
	t.Helper()
	_, p := hostPool(t, 8<<20, "readahead-test", pool.Config{ExpiryInterval: -1})
	set, err := p.NewBlockSet(&layout.Layout{Model: layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 16, DType: layout.DTypeBF16},
		PageSize: 16, TPSize: 2, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 256, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	var held []pool.Block
	if spare {
		// As many spare ones as the set gives (free beyond its low
		// watermark), the rest not.
		if held, err = set.AllocateSpare(4, 0); err != nil || len(held) == 0 {
			t.Fatalf("%d spare slots: %v", len(held), err)
		}
	}
	rest, err := set.Allocate(4 - len(held))
	if held = append(held, rest...); err != nil || len(held) != 4 {
		t.Fatalf("held %d of 4 slots: %v", len(held), err)
	}
	a := &Agent{cfg: Config{ImportTimeout: 30 * time.Second}}
	a.tiers = &tiers{a: a, done: make(chan struct{}), progress: make(chan struct{})}
	es := &engineSet{set: set}
	ctx, cancel := context.WithCancel(context.Background())
	r := &aheadRun{done: make(chan struct{}), cancel: cancel}
	es.ahead.run = r
	go func() {
		<-ctx.Done()
		for _, b := range held {
			set.Abort(b)
		}
		es.ahead.mu.Lock()
		es.ahead.run = nil
		es.ahead.ends++
		es.ahead.mu.Unlock()
		close(r.done)
	}()
	t.Cleanup(cancel)
	return a, es
}

// slotAllocators are the two allocations that end a read-ahead holding
// the slots they need, each asking for 2: the tiers' (restores) and the
// engine's and imports' (allocateNow).
var slotAllocators = []struct {
	name  string
	alloc func(context.Context, *Agent, *engineSet) ([]pool.Block, error)
}{
	{"allocate", func(ctx context.Context, a *Agent, es *engineSet) ([]pool.Block, error) {
		return a.tiers.allocate(ctx, es, 2)
	}},
	{"allocateNow", func(ctx context.Context, a *Agent, es *engineSet) ([]pool.Block, error) {
		return a.allocateNow(ctx, es, 2)
	}},
}

// An allocation that fails while a read-ahead under way holds the slots,
// though not as spare ones (pool.AllocError.Spare 0), ends it and takes
// them: in the tiers' allocate and in allocateNow.
func TestAllocateEndsAReadAheadHoldingSlotsNotSpare(t *testing.T) {
	for _, tc := range slotAllocators {
		t.Run(tc.name, func(t *testing.T) {
			a, es := aheadHoldingAll(t)
			if _, err := es.set.Allocate(2); err == nil {
				t.Fatal("allocated with every slot held")
			} else if ae := (*pool.AllocError)(nil); !errors.As(err, &ae) || ae.Spare != 0 {
				t.Fatalf("allocation with every slot held: %v; want an AllocError with no spare slots", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			blks, err := tc.alloc(ctx, a, es)
			if err != nil || len(blks) != 2 {
				t.Fatalf("allocated %d of 2 slots: %v", len(blks), err)
			}
		})
	}
}

// An allocation that fails while a read-ahead holds the slots it needs,
// the read-ahead ending just before the allocation looks at it (after the
// failed try, before yieldAhead: found none under way), tries again and
// takes them, whether the read-ahead held them as spare slots or as its
// registered blocks (pool.AllocError.Spare 0, where only the count of
// read-aheads ended tells that one just ended): in the tiers' allocate and
// in allocateNow. Once the set is full, one fails after a single look.
func TestAllocateAfterAReadAheadEndedJustBefore(t *testing.T) {
	for _, tc := range slotAllocators {
		for _, spare := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/spare=%v", tc.name, spare), func(t *testing.T) {
				a, es := aheadHolding(t, spare)
				r := es.ahead.run
				looks := 0
				end := func() {
					looks++
					if looks == 1 {
						// Ends now, between the failed try and the look.
						r.cancel()
						<-r.done
						if a.tiers.aheadUnderWay(es) {
							t.Error("the read-ahead is still under way once ended")
						}
					}
				}
				a.tiers.ahead.beforeYield.Store(&end)
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				blks, err := tc.alloc(ctx, a, es)
				if err != nil || len(blks) != 2 {
					t.Fatalf("allocated %d of 2 slots: %v", len(blks), err)
				}
				if looks != 1 {
					t.Fatalf("yieldAhead looked %d times; want 1", looks)
				}
				// Once the set has no slot left, an allocation fails
				// after one look: no read-ahead ended since it looked.
				var last int
				for range 3 {
					last = looks
					if _, err = tc.alloc(ctx, a, es); err != nil {
						break
					}
				}
				if err == nil {
					t.Fatal("a set of 4 slots gave 2 slots four times")
				}
				if looks != last+1 {
					t.Fatalf("the allocation that failed looked %d times at the read-ahead; want 1", looks-last)
				}
			})
		}
	}
}

// A read-ahead whose block to follow left its set before it began (a
// look-up's restore releases the blocks it brings up at once, and
// allocations since recycled them) ends at once, counted as ended,
// claiming no slot: the spare slots it would have taken recycled cached
// blocks, those a more recent restore had brought up among them, for
// blocks the engine is no longer reading.
func TestTierReadAheadAfterABlockGoneClaimsNothing(t *testing.T) {
	tr, _, _ := belowSet(t, false, false)
	d := tr.list[0]
	l := belowLayout(4)
	tag := shapeTag(l)
	tr.layouts = map[uint64]*layout.Layout{tag: l} // no tier.json to write
	ctx := context.Background()
	next := disk.Key{Hash: 20, Tag: tag} // in the tiers, the block to read ahead
	if err := d.store.Load().Put(ctx, next, make([]byte, tierBlockBytes(l))); err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, d, next, disk.Align)
	// The set into which it reads: full of unused blocks copied below,
	// each of which a spare slot may recycle; the block it follows, 19,
	// not among them.
	into, err := tr.a.pool.NewBlockSet(l)
	if err != nil {
		t.Fatal(err)
	}
	blks, err := into.Allocate(4)
	if err != nil {
		t.Fatal(err)
	}
	cached := []uint64{10, 11, 12, 13}
	for i, b := range blks {
		got, err := into.RegisterBatch([]pool.Registration{{Block: b, Hash: cached[i], Below: true}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := into.Release(got[0]); err != nil {
			t.Fatal(err)
		}
	}
	claimed := 0
	hold := func(context.Context) { claimed++ }
	tr.ahead.allocated.Store(&hold)
	es := &engineSet{set: into}
	run := []uint64{next.Hash}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := newAheadRun(run, 19, cancel)
	es.ahead.run = r
	tr.readAhead(actx, es, r, run, 19, 8)
	waitClosed(t, r.done, "the read-ahead")
	if claimed != 0 {
		t.Fatal("a read-ahead after a block gone from its set claimed spare slots")
	}
	for _, h := range cached {
		if _, ok := into.Lookup(h); !ok {
			t.Errorf("block %d was recycled for a read-ahead after a block gone from its set", h)
		}
	}
	if _, ok := into.Lookup(next.Hash); ok {
		t.Error("a read-ahead after a block gone from its set read its next block")
	}
	if es.ahead.run != nil || len(r.hashes) != 0 || tr.ahead.ended.Load() != 1 {
		t.Fatalf("the read-ahead not over: under way %v, reading %d blocks, %d ended", es.ahead.run != nil, len(r.hashes), tr.ahead.ended.Load())
	}
}

// A read-ahead whose ctx ran out (its deadline, ImportTimeout) is followed
// where the engine took its blocks meanwhile (readAheadAfter while it is
// under way), but not once it was stopped (stopAhead, endAhead), though
// its ctx's error then still tells the deadline, not the cancel: a set
// being freed gets no new read-ahead.
func TestTierReadAheadFollowedUnlessStopped(t *testing.T) {
	for _, stop := range []bool{false, true} {
		t.Run(fmt.Sprintf("stopped=%v", stop), func(t *testing.T) {
			tr, _, _ := belowSet(t, false, false)
			d := tr.list[0]
			l := belowLayout(4)
			tag := shapeTag(l)
			tr.layouts = map[uint64]*layout.Layout{tag: l} // no tier.json to write
			tr.a.cfg.TierReadAhead, tr.a.cfg.ImportTimeout = 8, 30*time.Second
			ctx := context.Background()
			next := disk.Key{Hash: 20, Tag: tag} // in the tiers, after 19
			if err := d.store.Load().Put(ctx, next, make([]byte, tierBlockBytes(l))); err != nil {
				t.Fatal(err)
			}
			placeCopy(tr, d, next, disk.Align)
			tr.link(next, 19)
			into, err := tr.a.pool.NewBlockSet(l)
			if err != nil {
				t.Fatal(err)
			}
			es := &engineSet{set: into}
			actx, cancel := context.WithTimeout(ctx, -time.Second) // its deadline passed
			defer cancel()
			r := newAheadRun(nil, 19, cancel)
			r.ctx = actx
			es.ahead.run = r
			tr.readAheadAfter(es, 19) // a take while it is under way
			if r.follow != 19 {
				t.Fatalf("a take while a read-ahead out of time is under way left it %d to follow; want 19", r.follow)
			}
			if stop {
				tr.stopAhead(es)
			}
			tr.readAhead(actx, es, r, nil, 19, 8)
			waitClosed(t, r.done, "the read-ahead")
			tr.ahead.wg.Wait()
			want := uint64(1)
			if stop {
				want = 0
			}
			if got := tr.ahead.started.Load(); got != want {
				t.Fatalf("%d read-aheads started after it ended (stopped: %v); want %d", got, stop, want)
			}
		})
	}
}
