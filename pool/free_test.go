package pool

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// A freed block set's memory goes to the next set that fits in it; its
// registered blocks leave with remove events; its id is not reused.
func TestFreeBlockSetReusesMemory(t *testing.T) {
	var mu sync.Mutex
	var removed []uint64
	sink := func(evs EventBatch) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs.Events {
			if e.Kind == EventRemove {
				removed = append(removed, e.Hash)
			}
		}
	}
	l := testLayout(64, 2, layout.FullyContiguous, 4096)
	st := newSliceStorage(3*2*64*4096 + 4096) // strides round to the alignment
	p, err := New(st, testConfig(newManualClock(), sink))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var sets []*BlockSet
	for {
		b, err := p.NewBlockSet(l)
		if errors.Is(err, ErrOutOfMemory) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, b)
	}
	if len(sets) < 2 {
		t.Fatalf("%d sets fit; the test needs 2", len(sets))
	}
	first := sets[0]
	blks, err := first.Allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range blks {
		if err := first.Commit(b); err != nil {
			t.Fatal(err)
		}
		reg, err := first.Register(b, uint64(100+i), 0)
		if err != nil {
			t.Fatal(err)
		}
		blks[i] = reg
	}
	// Referenced: refused, nothing changed.
	if err := p.FreeBlockSet(first.ID()); !errors.Is(err, ErrBlockSetBusy) {
		t.Fatalf("free with references: %v, want ErrBlockSetBusy", err)
	}
	if m := first.Metrics(); m.Registered != 2 {
		t.Fatalf("after a refused free: %d registered, want 2", m.Registered)
	}
	for _, b := range blks {
		if err := first.Release(b); err != nil {
			t.Fatal(err)
		}
	}
	// Allocated and unregistered: refused too.
	part, err := first.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.FreeBlockSet(first.ID()); !errors.Is(err, ErrBlockSetBusy) {
		t.Fatalf("free with an allocated slot: %v, want ErrBlockSetBusy", err)
	}
	if err := first.Abort(part[0]); err != nil {
		t.Fatal(err)
	}
	if err := p.FreeBlockSet(first.ID()); err != nil {
		t.Fatal(err)
	}
	if err := p.FreeBlockSet(first.ID()); !errors.Is(err, ErrUnknownBlockSet) {
		t.Fatalf("second free: %v, want ErrUnknownBlockSet", err)
	}
	if _, err := p.BlockSet(first.ID()); !errors.Is(err, ErrUnknownBlockSet) {
		t.Fatalf("BlockSet of a freed id: %v", err)
	}
	if _, err := first.Allocate(1); !errors.Is(err, ErrUnknownBlockSet) {
		t.Fatalf("allocate in a freed set: %v", err)
	}
	if _, err := first.RankBytes(0); !errors.Is(err, ErrUnknownBlockSet) {
		t.Fatalf("bytes of a freed set: %v", err)
	}
	for _, b := range p.BlockSets() {
		if b == first {
			t.Fatal("BlockSets lists the freed set")
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(removed)
		mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d remove events, want 2", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	again, err := p.NewBlockSet(l)
	if err != nil {
		t.Fatalf("a set the size of the freed one: %v", err)
	}
	if again.ID() <= sets[len(sets)-1].ID() {
		t.Fatalf("new set id %d reuses an id (last %d)", again.ID(), sets[len(sets)-1].ID())
	}
	off, _ := again.RegionOffset(0)
	if want, _ := first.RegionOffset(0); off != want {
		t.Fatalf("new set at offset %d, want the freed set's %d", off, want)
	}
	if _, err := p.NewBlockSet(l); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("past the storage: %v, want ErrOutOfMemory", err)
	}
}

// Freeing every set in any order gives the whole storage back: holes merge
// and the last one returns to the uncarved end.
func TestFreeBlockSetMergesHoles(t *testing.T) {
	l := testLayout(16, 1, layout.FullyContiguous, 4096)
	st := newSliceStorage(1 << 20)
	p, err := New(st, testConfig(newManualClock(), nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	var ids []SetID
	for {
		b, err := p.NewBlockSet(l)
		if errors.Is(err, ErrOutOfMemory) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, b.ID())
	}
	for _, i := range []int{1, 3, 0, 2} {
		if i < len(ids) {
			if err := p.FreeBlockSet(ids[i]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, id := range ids[min(4, len(ids)):] {
		if err := p.FreeBlockSet(id); err != nil {
			t.Fatal(err)
		}
	}
	p.mu.RLock()
	next, holes := p.arenas[0].next, len(p.arenas[0].holes)
	p.mu.RUnlock()
	if next != 0 || holes != 0 {
		t.Fatalf("after freeing all: next %d, %d holes; want 0, 0", next, holes)
	}
	big := testLayout(len(ids)*16, 1, layout.FullyContiguous, 4096)
	if _, err := p.NewBlockSet(big); err != nil {
		t.Fatalf("one set as large as all freed ones: %v", err)
	}
}

// A leased block keeps its set from being freed until the lease ends:
// a peer may be reading it.
func TestFreeBlockSetWaitsForLeases(t *testing.T) {
	p, b := newTestPool(t, testConfig(newManualClock(), nil), testLayout(8, 1, layout.FullyContiguous, 64))
	blks, err := b.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(blks[0]); err != nil {
		t.Fatal(err)
	}
	reg, err := b.Register(blks[0], 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(reg); err != nil {
		t.Fatal(err)
	}
	id, _, err := b.Lease([]uint64{5}, time.Second)
	if err != nil || id == 0 {
		t.Fatalf("lease: %v %v", id, err)
	}
	if err := p.FreeBlockSet(b.ID()); !errors.Is(err, ErrBlockSetBusy) {
		t.Fatalf("free under a lease: %v, want ErrBlockSetBusy", err)
	}
	if valid, err := p.ReleaseLease(id); !valid || err != nil {
		t.Fatalf("release lease: %v %v", valid, err)
	}
	if err := p.FreeBlockSet(b.ID()); err != nil {
		t.Fatalf("free after the lease ended: %v", err)
	}
	if id, found, err := b.Lease([]uint64{5}, time.Second); id != 0 || found[0].Found || err != nil {
		t.Fatalf("lease in a freed set: %v %v %v", id, found, err)
	}
}
