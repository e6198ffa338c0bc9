package pool

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// offloads records what the Offload hook is offered, taking up to room
// blocks at a time.
type offloads struct {
	mu    sync.Mutex
	room  int
	taken []Block
	hash  []uint64
}

func (o *offloads) hook(set *BlockSet, blk Block, hash, parent uint64) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.taken) >= o.room {
		return false
	}
	o.taken = append(o.taken, blk)
	o.hash = append(o.hash, hash)
	return true
}

// finish ends every copy under way with ok and returns their hashes.
func (o *offloads) finish(t *testing.T, b *BlockSet, ok bool) []uint64 {
	t.Helper()
	o.mu.Lock()
	taken, hs := o.taken, o.hash
	o.taken, o.hash = nil, nil
	o.mu.Unlock()
	for _, blk := range taken {
		if err := b.Offloaded(blk, ok); err != nil {
			t.Fatal(err)
		}
	}
	return hs
}

func tierPool(t *testing.T, slots, room int) (*BlockSet, *offloads, *recorder) {
	t.Helper()
	o := &offloads{room: room}
	var rec recorder
	cfg := testConfig(nil, rec.sink)
	cfg.Offload = o.hook
	cfg.EventBuffer = 4 * slots
	_, b := newTestPool(t, cfg, testLayout(slots, 1, layout.FullyContiguous, 64))
	return b, o, &rec
}

func fill(t *testing.T, b *BlockSet, base uint64, n int) []uint64 {
	t.Helper()
	hs := seqHashes(base, n)
	for _, blk := range registerChain(t, b, 0, hs...) {
		if err := b.Release(blk); err != nil {
			t.Fatal(err)
		}
	}
	return hs
}

// A block recycling wants goes below first: it stays registered (and
// acquirable) while its copy is made, its slot is reused only once the
// copy is complete, and then it goes before blocks used since.
func TestOffloadKeepsTheSlotUntilTheCopyIsDone(t *testing.T) {
	const n = 20
	b, o, _ := tierPool(t, n, n)
	hs := fill(t, b, 100, n)
	_, err := b.Allocate(1)
	var ae *AllocError
	if !errors.As(err, &ae) || ae.Offloading == 0 || !strings.Contains(err.Error(), "being copied to the tier below") {
		t.Fatalf("allocation of a full set with its victims being copied: %v, want an AllocError counting them", err)
	}
	if m := b.Metrics(); m.Offloading != len(o.taken) || m.Free != 0 || m.Registered != n {
		t.Fatalf("metrics %+v, %d offered", m, len(o.taken))
	}
	// The tail goes first: the last block is the one leaf.
	if got := o.hash[0]; got != hs[n-1] {
		t.Fatalf("first offered %d, want the leaf %d", got, hs[n-1])
	}
	if _, ok := b.Acquire(hs[n-1]); !ok {
		t.Fatal("a block being copied below is not acquirable")
	}
	o.finish(t, b, true)
	// Still referenced: its slot stays.
	if _, err := b.Allocate(1); err == nil {
		t.Fatal("allocated the slot of a referenced block")
	}
	blk, _ := b.Lookup(hs[n-1])
	if !b.Below(blk) {
		t.Fatal("a block copied below is not marked so")
	}
	if err := b.Release(blk); err != nil {
		t.Fatal(err)
	}
	got, err := b.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Slot != blk.Slot {
		t.Fatalf("allocated slot %d, want %d, the block copied below", got[0].Slot, blk.Slot)
	}
	if _, ok := b.Lookup(hs[n-1]); ok {
		t.Fatal("the recycled block is still registered")
	}
	o.mu.Lock()
	pending := len(o.taken)
	o.mu.Unlock()
	if m := b.Metrics(); m.Offloading != pending {
		t.Fatalf("offloading %d, the hook holds %d", m.Offloading, pending)
	}
}

// A copy abandoned leaves the block as it was: inactive, not below.
func TestOffloadAbandoned(t *testing.T) {
	b, o, _ := tierPool(t, 8, 1)
	hs := fill(t, b, 1, 8)
	if _, err := b.Allocate(1); err == nil {
		t.Fatal("allocated from a full set whose victim is being copied, with a queue of 1")
	}
	_ = hs
	o.finish(t, b, false)
	blk, ok := b.Lookup(hs[7])
	if !ok || b.Below(blk) {
		t.Fatalf("after an abandoned copy: registered %v, below %v", ok, b.Below(blk))
	}
	if m := b.Metrics(); m.Inactive != 8 || m.Offloading != 0 {
		t.Fatalf("metrics %+v, want 8 inactive", m)
	}
	if err := b.Offloaded(blk, true); err == nil {
		t.Fatal("Offloaded of a block no copy is under way for succeeded")
	}
}

// With the queue below full, an allocation that needs slots now recycles
// as it always did; recycling ahead of need stops instead.
func TestOffloadRefusedDropsOnlyWhenNeeded(t *testing.T) {
	const n = 40
	b, o, rec := tierPool(t, n, 0)
	fill(t, b, 1, n)
	got, err := b.Allocate(2)
	if err != nil || len(got) != 2 {
		t.Fatalf("allocate with the queue below full: %v", err)
	}
	// 2 recycled for the allocation; none ahead of need, which would have
	// dropped blocks that nothing needed yet.
	if m := b.Metrics(); m.Evictions != 2 || len(o.taken) != 0 {
		t.Fatalf("%d blocks recycled (%d offered), want 2", m.Evictions, len(o.taken))
	}
	_ = rec
}

// Past OffloadWatermark of use, blocks are offered ahead of need, at most
// the high watermark's margin, and without dropping any.
func TestOffloadAheadPastTheWatermark(t *testing.T) {
	const n = 100
	b, o, rec := tierPool(t, n, n)
	fill(t, b, 1, 89)
	if len(o.taken) != 0 {
		t.Fatalf("%d offered below the watermark", len(o.taken))
	}
	fill(t, b, 1000, 2) // 91 in use: past 0.90
	o.mu.Lock()
	offered := len(o.taken)
	o.mu.Unlock()
	if offered == 0 || offered > 15 {
		t.Fatalf("%d offered past the watermark, want 1..15", offered)
	}
	if m := b.Metrics(); m.Evictions != 0 {
		t.Fatalf("%d blocks recycled ahead of need", m.Evictions)
	}
	_ = rec
	o.finish(t, b, true)
	if m := b.Metrics(); m.Inactive != 91 {
		t.Fatalf("inactive %d after the copies, want 91", m.Inactive)
	}
}

// A block restored from below (Registration.Below) is recycled without
// being offered again.
func TestOffloadSkipsBlocksAlreadyBelow(t *testing.T) {
	b, o, _ := tierPool(t, 4, 4)
	blks, err := b.Allocate(4)
	if err != nil {
		t.Fatal(err)
	}
	regs := make([]Registration, 4)
	for i := range regs {
		regs[i] = Registration{Block: blks[i], Hash: uint64(i + 1), Below: true}
	}
	got, err := b.RegisterBatch(regs, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, blk := range got {
		b.Release(blk)
	}
	if _, err := b.Allocate(4); err != nil {
		t.Fatal(err)
	}
	if len(o.taken) != 0 {
		t.Fatalf("%d blocks already below were offered again", len(o.taken))
	}
}

// A set is not freed while its blocks are being copied below, and every
// unused block without a copy is offered first, so that a set freed loses
// nothing the tier below could keep.
func TestFreeBlockSetOffloadsFirst(t *testing.T) {
	o := &offloads{room: 100}
	cfg := testConfig(nil, nil)
	cfg.Offload = o.hook
	p, b := newTestPool(t, cfg, testLayout(16, 1, layout.FullyContiguous, 64))
	fill(t, b, 1, 10)
	err := p.FreeBlockSet(b.ID())
	if !errors.Is(err, ErrBlockSetBusy) || !strings.Contains(err.Error(), "10 blocks being copied") {
		t.Fatalf("free with 10 blocks to copy: %v", err)
	}
	if err := p.FreeBlockSet(b.ID()); !errors.Is(err, ErrBlockSetBusy) {
		t.Fatalf("free again while copies are under way: %v", err)
	}
	if len(o.taken) != 10 {
		t.Fatalf("%d offered, want 10 (each once)", len(o.taken))
	}
	o.finish(t, b, true)
	if err := p.FreeBlockSet(b.ID()); err != nil {
		t.Fatalf("free once every block is below: %v", err)
	}
}

func TestOffloadWatermarkLimits(t *testing.T) {
	for _, tc := range []struct {
		mark float64
		ok   bool
	}{{1, true}, {0.5, true}, {0, true}, {1.01, false}, {-0.1, false}} {
		cfg := DefaultConfig()
		cfg.OffloadWatermark = tc.mark
		_, err := New(newSliceStorage(1<<16), cfg)
		if (err == nil) != tc.ok {
			t.Errorf("OffloadWatermark %g: %v, want ok=%v", tc.mark, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "OffloadWatermark") {
			t.Errorf("error does not name the field: %v", err)
		}
	}
}

// A block whose copy below was lost is offered again, not dropped.
func TestOffloadAgainAfterLostBelow(t *testing.T) {
	b, o, _ := tierPool(t, 4, 4)
	hs := fill(t, b, 1, 4)
	if _, err := b.Allocate(1); err == nil {
		t.Fatal("allocated from a full set whose victims are being copied")
	}
	o.finish(t, b, true)
	blk, _ := b.Lookup(hs[3])
	if !b.Below(blk) {
		t.Fatal("the copied leaf is not below")
	}
	if err := b.LostBelow(blk); err != nil {
		t.Fatal(err)
	}
	if b.Below(blk) {
		t.Fatal("still below after LostBelow")
	}
	// The other blocks offered are below and go first; then the leaf is
	// offered again rather than recycled.
	o.mu.Lock()
	o.taken, o.hash = nil, nil
	o.mu.Unlock()
	for range 3 {
		if _, err := b.Allocate(1); err != nil {
			break
		}
	}
	found := false
	for _, h := range o.hash {
		found = found || h == hs[3]
	}
	if _, ok := b.Lookup(hs[3]); !ok && !found {
		t.Fatal("the block whose copy was lost was recycled without being offered again")
	}
	if err := b.LostBelow(Block{Slot: blk.Slot, Generation: blk.Generation + 100}); err == nil {
		t.Fatal("LostBelow of a stale handle succeeded")
	}
}

// At most OffloadInFlight of a set's slots wait for copies below: past
// it, recycling for an allocation drops blocks as it would without a
// tier, so the allocation does not wait for the copies. At 1 every block
// is offered and the allocation waits.
func TestOffloadInFlightBound(t *testing.T) {
	const n = 16
	for _, tc := range []struct {
		inFlight float64
		offered  int // 0: every block that recycling reached, none dropped
	}{
		{0.25, 4},    // the default: 4 of 16 copied, 8 dropped
		{1.0 / n, 1}, // one slot, the least
		{0.01, 1},    // below one slot: still one
		{1, 0},       // every block offered: the allocation waits
	} {
		o := &offloads{room: n}
		cfg := testConfig(nil, nil)
		cfg.Offload = o.hook
		cfg.OffloadInFlight = tc.inFlight
		_, b := newTestPool(t, cfg, testLayout(n, 1, layout.FullyContiguous, 64))
		for i := range n { // n chains of one block: n leaves
			fill(t, b, uint64(1000*(i+1)), 1)
		}
		_, err := b.Allocate(n / 2)
		m := b.Metrics()
		if tc.offered == 0 {
			var ae *AllocError
			if !errors.As(err, &ae) || ae.Offloading == 0 || m.Registered != n || len(o.taken) <= n/4 {
				t.Fatalf("in flight %g: allocate %d of a full set: %v, %d registered, %d offered; want it to wait for copies, dropping nothing",
					tc.inFlight, n/2, err, m.Registered, len(o.taken))
			}
			continue
		}
		if err != nil {
			t.Fatalf("in flight %g: allocate %d of a full set: %v", tc.inFlight, n/2, err)
		}
		if len(o.taken) != tc.offered || m.Offloading != tc.offered || m.Registered != n-n/2 {
			t.Fatalf("in flight %g: %d offered, %d offloading, %d registered; want %d, %d, %d",
				tc.inFlight, len(o.taken), m.Offloading, m.Registered, tc.offered, tc.offered, n-n/2)
		}
	}
	for _, bad := range []float64{-0.1, 1.01} {
		cfg := testConfig(nil, nil)
		cfg.OffloadInFlight = bad
		if _, err := New(newSliceStorage(1<<20), cfg); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "OffloadInFlight") {
			t.Fatalf("OffloadInFlight %g: %v, want ErrInvalidConfig naming it", bad, err)
		}
	}
}

// Recycling ahead of need with a tier below queues the remove events of
// the blocks one allocation drops as one batch, as recycling without a
// tier does, not a batch (and a wake-up of the event loop) per block:
// at, below and past the events recycling keeps on the stack. With the
// sink held and room for one event in the queue, one batch is taken
// whole, where a batch per block would lose all but the first: every
// block's remove event reaches the sink, none dropped.
func TestRecycleAheadQueuesOneBatch(t *testing.T) {
	const slots, held = 64, 32
	for _, n := range []int{1, recycleEvents, recycleEvents + 1, 2*recycleEvents + 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			o := &offloads{room: slots}
			g := newGatedSink()
			g.close() // the sink holds the first batch until opened
			rec := &g.rec
			cfg := testConfig(nil, g.sink)
			cfg.Offload = o.hook
			cfg.EventBuffer = 1
			// Recycling starts below half the slots free and stops with
			// n more free than the allocation left (n-1 past half).
			cfg.LowWatermark, cfg.OffloadWatermark = 0.5, 0.5
			cfg.HighWatermark = 0.5 + float64(n-1)/slots
			p, b := newTestPool(t, cfg, testLayout(slots, 1, layout.FullyContiguous, 64))
			blks, err := b.Allocate(slots)
			if err != nil {
				t.Fatal(err)
			}
			regs := make([]Registration, held)
			for i := range regs {
				regs[i] = Registration{Block: blks[i], Hash: uint64(i + 1), Below: true}
			}
			got, err := b.RegisterBatch(regs, 0)
			if err != nil || len(got) != held {
				t.Fatalf("registered %d of %d: %v", len(got), held, err)
			}
			// The store events, one batch, are taken from the queue and
			// held at the sink: the queue is empty, with room for one.
			select {
			case <-g.entered:
			case <-time.After(30 * time.Second):
				t.Fatal("the sink was not called")
			}
			for _, blk := range got {
				if err := b.Release(blk); err != nil {
					t.Fatal(err)
				}
			}
			for _, blk := range blks[held:] {
				if err := b.Abort(blk); err != nil {
					t.Fatal(err)
				}
			}
			// Half the slots free, the other half blocks already below:
			// the allocation leaves one fewer than half free, and n of
			// the blocks are recycled ahead (none offered, none kept).
			if _, err := b.Allocate(1); err != nil {
				t.Fatal(err)
			}
			if len(o.taken) != 0 {
				t.Fatalf("%d blocks already below were offered", len(o.taken))
			}
			if m := b.Metrics(); m.Registered != held-n {
				t.Fatalf("%d blocks still registered, want %d: %d recycled", m.Registered, held-n, n)
			}
			g.open()
			p.Close()
			evs, dropped := rec.events()
			if dropped != 0 {
				t.Fatalf("%d of the %d remove events of one allocation dropped: queued as more than one batch", dropped, n)
			}
			// One remove event for each of the sequence's last n
			// blocks (leaves first: hashes held-n+1..held), each once,
			// after every store event.
			var removes []uint64
			for i, e := range evs {
				switch e.Kind {
				case EventRemove:
					removes = append(removes, e.Hash)
				case EventStore:
					if len(removes) > 0 {
						t.Fatalf("store event %d (hash %d) after a remove event", i, e.Hash)
					}
				}
			}
			slices.Sort(removes)
			want := make([]uint64, n)
			for i := range want {
				want[i] = uint64(held - n + i + 1)
			}
			if !slices.Equal(removes, want) {
				t.Fatalf("remove events for hashes %v, want %v", removes, want)
			}
		})
	}
}

// A set whose layout the Offload hook takes nothing of (OffloadSkips) is
// never offered a block and recycles a block only when an allocation
// needs its slot: Retains is every slot, not its slots less the room kept
// for copies below, and the set holds that many registered blocks. A set
// of a layout not skipped, in the same pool, keeps the tier's watermarks.
func TestOffloadSkipsRecyclesOnNeedOnly(t *testing.T) {
	const n = 20
	var offered int
	cfg := testConfig(nil, nil)
	cfg.Offload = func(set *BlockSet, blk Block, hash, parent uint64) bool {
		offered++ // under the set's lock
		return false
	}
	cfg.OffloadWatermark = 0.5
	skipped := testLayout(n, 1, layout.FullyContiguous, 64)
	cfg.OffloadSkips = func(l *layout.Layout) bool { return l.TPSize == skipped.TPSize }
	p, b := newTestPool(t, cfg, skipped)
	taken, err := p.NewBlockSet(testLayout(n, 2, layout.FullyContiguous, 64))
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Retains(); got != n {
		t.Fatalf("a skipped set of %d slots retains %d, want every slot", n, got)
	}
	if got, want := taken.Retains(), n-int(math.Ceil((1-cfg.OffloadWatermark)*n)); got != want {
		t.Fatalf("a set the tier takes retains %d, want %d", got, want)
	}
	const blocks = 3 * n
	for i := range blocks {
		blks, err := b.Allocate(1)
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if err := b.Commit(blks[0]); err != nil {
			t.Fatal(err)
		}
		reg, err := b.Register(blks[0], uint64(i+1), 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Release(reg); err != nil {
			t.Fatal(err)
		}
		if m, want := b.Metrics(), min(i+1, b.Retains()); m.Registered != want {
			t.Fatalf("after %d blocks the skipped set holds %d, want %d (it retains %d)", i+1, m.Registered, want, b.Retains())
		}
	}
	if m := b.Metrics(); offered != 0 || m.Evictions != blocks-n {
		t.Fatalf("the skipped set: %d blocks offered, %d recycled; want none offered and %d recycled", offered, m.Evictions, blocks-n)
	}
}
