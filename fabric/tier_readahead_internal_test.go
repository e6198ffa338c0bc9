package fabric

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
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
	storage, err := pool.NewHostStorage(pool.HostConfig{Size: 8 << 20, Name: "readahead-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { storage.Close() })
	p, err := pool.New(storage, pool.Config{ExpiryInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	set, err := p.NewBlockSet(&layout.Layout{Model: layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 16, DType: layout.DTypeBF16},
		PageSize: 16, TPSize: 2, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 256, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	held, err := set.Allocate(4)
	if err != nil {
		t.Fatal(err)
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
		es.ahead.mu.Unlock()
		close(r.done)
	}()
	t.Cleanup(cancel)
	return a, es
}

// An allocation that fails while a read-ahead under way holds the slots,
// though not as spare ones (pool.AllocError.Spare 0), ends it and takes
// them: in the tiers' allocate and in allocateNow.
func TestAllocateEndsAReadAheadHoldingSlotsNotSpare(t *testing.T) {
	for _, tc := range []struct {
		name  string
		alloc func(context.Context, *Agent, *engineSet) ([]pool.Block, error)
	}{
		{"allocate", func(ctx context.Context, a *Agent, es *engineSet) ([]pool.Block, error) {
			return a.tiers.allocate(ctx, es, 2)
		}},
		{"allocateNow", func(ctx context.Context, a *Agent, es *engineSet) ([]pool.Block, error) {
			return a.allocateNow(ctx, es, 2)
		}},
	} {
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
