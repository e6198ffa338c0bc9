package pool

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// registerChain registers blocks with hashes, each extending the one
// before it (the first extends parent), and returns them referenced.
func registerChain(t testing.TB, b *BlockSet, parent uint64, hashes ...uint64) []Block {
	t.Helper()
	out := make([]Block, 0, len(hashes))
	blks, err := b.Allocate(len(hashes))
	if err != nil {
		t.Fatal(err)
	}
	for i, blk := range blks {
		if err := b.Commit(blk); err != nil {
			t.Fatal(err)
		}
		reg, err := b.Register(blk, hashes[i], parent)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, reg)
		parent = hashes[i]
	}
	return out
}

func seqHashes(base uint64, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = base + uint64(i)
	}
	return hs
}

// The failure the prefix rule fixes: a sequence filling the set, released
// head first, used to lose its head to the next allocation, so that a
// look-up from its first block found nothing although most of it was held.
// Each allocation's remove events are all queued, in order, however many
// (recycle keeps up to recycleEvents of them on the stack).
func TestEvictionTakesTheTailFirst(t *testing.T) {
	const n = 1024
	for _, want := range []int{1, recycleEvents, recycleEvents + 1, 103} {
		t.Run(fmt.Sprint(want), func(t *testing.T) { evictTail(t, n, want) })
	}
}

func evictTail(t *testing.T, n, want int) {
	var rec recorder
	cfg := testConfig(nil, rec.sink)
	cfg.LowWatermark = -1
	cfg.EventBuffer = 4 * n
	p, b := newTestPool(t, cfg, testLayout(n, 1, layout.FullyContiguous, 64))
	hs := seqHashes(1, n)
	for _, blk := range registerChain(t, b, 0, hs...) {
		if err := b.Release(blk); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Allocate(want); err != nil {
		t.Fatal(err)
	}
	prefix := 0
	for _, h := range hs {
		if _, ok := b.Lookup(h); !ok {
			break
		}
		prefix++
	}
	if prefix != n-want {
		t.Fatalf("a look-up from the first block finds %d blocks, want %d", prefix, n-want)
	}
	for _, h := range hs[prefix:] {
		if _, ok := b.Lookup(h); ok {
			t.Fatalf("hash %d past the held prefix is still registered", h)
		}
	}
	p.Close()
	evs, dropped := rec.events()
	if dropped != 0 {
		t.Fatalf("%d events dropped", dropped)
	}
	var removed []uint64
	for _, e := range evs {
		if e.Kind == EventRemove {
			removed = append(removed, e.Hash)
		}
	}
	if len(removed) != want {
		t.Fatalf("%d remove events, want %d", len(removed), want)
	}
	for i, h := range removed {
		if h != hs[n-1-i] {
			t.Fatalf("remove %d is hash %d, want %d: leaves go first, deepest first", i, h, hs[n-1-i])
		}
	}
}

// Among leaves the least recently used goes first, and a parent whose last
// child goes competes with its own last use.
func TestEvictionLeavesInLRUOrder(t *testing.T) {
	cfg := testConfig(nil, nil)
	cfg.LowWatermark = -1
	_, b := newTestPool(t, cfg, testLayout(8, 1, layout.FullyContiguous, 64))
	// A tree: 10 <- 11 <- 12 and 10 <- 21; then 30 alone.
	a := registerChain(t, b, 0, 10, 11, 12)
	c := registerChain(t, b, 10, 21)
	d := registerChain(t, b, 0, 30)
	// Release order (oldest first): 12, 10, 30, 11, 21.
	for _, blk := range []Block{a[2], a[0], d[0], a[1], c[0]} {
		if err := b.Release(blk); err != nil {
			t.Fatal(err)
		}
	}
	if info, _ := b.Slot(a[0].Slot); info.Children != 2 || !info.Inactive {
		t.Fatalf("root %+v, want inactive with 2 children", info)
	}
	// Leaves are 12, 30, 21 in that order; taking 12 makes 11 a leaf,
	// younger than 30 but older than 21. 10 is the oldest of all, but
	// a leaf only once 21 and 11 are gone.
	for i, want := range []uint64{12, 30, 11, 21, 10} {
		if got := b.Evict(1); got != 1 {
			t.Fatalf("eviction %d took %d blocks", i, got)
		}
		if _, ok := b.Lookup(want); ok {
			t.Fatalf("eviction %d: hash %d is still there", i, want)
		}
		if m := b.Metrics(); m.Registered != 4-i {
			t.Fatalf("eviction %d: %d registered, want %d", i, m.Registered, 4-i)
		}
	}
	if got := b.Evict(1); got != 0 {
		t.Fatalf("Evict on an empty set took %d", got)
	}
}

// The limit of an allocation is free slots plus what recycling can take: a
// block in use pins the inactive blocks it extends.
func TestAllocationAtAndPastThePinnedLimit(t *testing.T) {
	cfg := testConfig(nil, nil)
	cfg.LowWatermark = -1
	_, b := newTestPool(t, cfg, testLayout(6, 1, layout.FullyContiguous, 64))
	chain := registerChain(t, b, 0, 1, 2, 3) // 3 stays in use
	other := registerChain(t, b, 0, 9)
	for _, blk := range []Block{chain[0], chain[1], other[0]} {
		if err := b.Release(blk); err != nil {
			t.Fatal(err)
		}
	}
	// 2 free, one recyclable (9), two pinned by 3 (1 and 2).
	if _, err := b.Allocate(3); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	if _, ok := b.Lookup(9); ok {
		t.Fatal("the leaf was not recycled")
	}
	_, err := b.Allocate(1)
	var ae *AllocError
	if !errors.As(err, &ae) || !errors.Is(err, ErrExhausted) ||
		*ae != (AllocError{Asked: 1, Free: 0, Inactive: 2, Pinned: 2}) {
		t.Fatalf("past the limit: err = %#v, want 1 asked, 0 free, 2 inactive and pinned", err)
	}
	if !strings.Contains(err.Error(), "2 inactive blocks are prefixes of blocks in use") {
		t.Errorf("error %q does not say why the inactive blocks stay", err)
	}
	for _, h := range []uint64{1, 2, 3} {
		if _, ok := b.Lookup(h); !ok {
			t.Fatalf("hash %d of the sequence in use was recycled", h)
		}
	}
	// Once 3 is released the whole chain goes, tail first.
	if err := b.Release(chain[2]); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Allocate(3); err != nil {
		t.Fatal(err)
	}
	if m := b.Metrics(); m.Registered != 0 || m.Inactive != 0 || m.Evictions != 4 {
		t.Fatalf("after: %+v", m)
	}
}

// A parent not here, registered later, or in another block set is not
// held; one registered first is, and a lease on a child pins it as a
// reference does.
func TestEvictionParentLinks(t *testing.T) {
	cfg := testConfig(nil, nil)
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(8, 1, layout.FullyContiguous, 64))
	b2, err := p.NewBlockSet(testLayout(4, 1, layout.FullyContiguous, 64))
	if err != nil {
		t.Fatal(err)
	}
	late := registerChain(t, b, 100, 101) // 100 is not here yet
	early := registerChain(t, b, 0, 100)
	cross := registerChain(t, b2, 100, 200) // extends 100 of another set
	if info, _ := b.Slot(early[0].Slot); info.Children != 0 {
		t.Fatalf("a block registered before its parent holds it: %+v", info)
	}
	for _, blk := range append(early, late...) {
		b.Release(blk)
	}
	if got := b.Evict(1); got != 1 {
		t.Fatal("nothing evicted")
	}
	if _, ok := b.Lookup(100); ok {
		t.Fatal("100 is least recently used and nothing here holds it: it should have gone")
	}
	if _, ok := b.Lookup(101); !ok {
		t.Fatal("101 went, although it was used after 100")
	}
	if info, _ := b2.Slot(cross[0].Slot); info.State != Registered || info.Children != 0 {
		t.Fatalf("the other set's block %+v", info)
	}

	// A leased leaf pins its parent as a reference would.
	chain := registerChain(t, b, 0, 300, 301)
	for _, blk := range chain {
		b.Release(blk)
	}
	id, _, err := b.Lease([]uint64{301}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Evict(8); got != 1 { // only 101
		t.Fatalf("evicted %d, want 1: 300 is pinned by its leased child", got)
	}
	if _, err := p.ReleaseLease(id); err != nil {
		t.Fatal(err)
	}
	if got := b.Evict(8); got != 2 {
		t.Fatalf("evicted %d after the lease, want 2", got)
	}
}

// recycleStep returns one step of BenchmarkEvict's loop on set: allocate
// a block (recycling one once the set is full), register it extending the
// previous block of its sequence of 16, release it, then call after (if
// not nil) with the block's hash.
func recycleStep(b *testing.B, set *BlockSet, after func(h uint64)) func() {
	h := uint64(1)
	return func() {
		blks, err := set.Allocate(1)
		if err != nil {
			b.Fatal(err)
		}
		if err := set.Commit(blks[0]); err != nil {
			b.Fatal(err)
		}
		parent := h - 1
		if h%16 == 1 {
			parent = 0
		}
		reg, err := set.Register(blks[0], h, parent)
		if err != nil {
			b.Fatal(err)
		}
		if err := set.Release(reg); err != nil {
			b.Fatal(err)
		}
		if after != nil {
			after(h)
		}
		h++
	}
}

// BenchmarkEvict recycles sequences of 16 chained blocks through a full
// set: each op allocates a block (recycling one), registers it extending
// the previous block of its sequence, and releases it. ns/block must not
// grow with the set beyond its logarithm.
func BenchmarkEvict(b *testing.B) {
	for _, slots := range []int{1024, 65536} {
		b.Run(fmt.Sprintf("slots=%d", slots), func(b *testing.B) {
			_, set := benchPool(b, slots)
			step := recycleStep(b, set, nil)
			for range slots {
				step()
			}
			b.ReportAllocs()
			for b.Loop() {
				step()
			}
			if m := set.Metrics(); m.Evictions == 0 {
				b.Fatal("nothing was recycled")
			}
		})
	}
}

// BenchmarkEvictMixed is BenchmarkEvict with every other block hit again
// (Acquire and Release) after its first release and every fourth marked
// as held elsewhere (Demote), so that recycling takes blocks hit and not
// hit, demoted and not, as a node of a cluster does.
func BenchmarkEvictMixed(b *testing.B) {
	for _, slots := range []int{1024, 65536} {
		b.Run(fmt.Sprintf("slots=%d", slots), func(b *testing.B) {
			_, set := benchPool(b, slots)
			step := recycleStep(b, set, func(h uint64) {
				if h%2 == 0 {
					if blk, ok := set.Acquire(h - 1); ok {
						if err := set.Release(blk); err != nil {
							b.Fatal(err)
						}
					}
				}
				if h%4 == 0 {
					set.Demote(h - 2)
				}
			})
			for range slots {
				step()
			}
			b.ReportAllocs()
			for b.Loop() {
				step()
			}
			if m := set.Metrics(); m.Evictions == 0 || m.Demoted == 0 {
				b.Fatalf("%d recycled, %d demoted", m.Evictions, m.Demoted)
			}
		})
	}
}

// BenchmarkEvictOnNeed is BenchmarkEvict's loop over 65,536 slots with
// each way of recycling, for the ratio of their costs per block: on need
// (no low watermark, one block recycled by each allocation of one, as
// BenchmarkEvict and a fabric agent without tiers) and ahead (the default
// watermarks: an allocation that leaves fewer than 5 % of the slots free
// recycles until 10 % are, one batch of remove events each time).
func BenchmarkEvictOnNeed(b *testing.B) {
	const slots = 65536
	ns := map[string]float64{}
	for _, tc := range []struct {
		name string
		low  float64
	}{{"on-need", -1}, {"ahead", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.ExpiryInterval = -1
			cfg.LowWatermark = tc.low
			_, set := newTestPool(b, cfg, testLayout(slots, 1, layout.FullyContiguous, 64))
			step := recycleStep(b, set, nil)
			for range slots {
				step()
			}
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				step()
			}
			ns[tc.name] = float64(time.Since(start).Nanoseconds()) / float64(b.N)
			if m := set.Metrics(); m.Evictions == 0 {
				b.Fatal("nothing was recycled")
			}
			if tc.name == "ahead" && ns["on-need"] > 0 {
				b.ReportMetric(ns["on-need"]/ns["ahead"], "on-need/ahead")
			}
		})
	}
}
