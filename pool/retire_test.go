package pool

import (
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

// Retire takes a Partial or Complete slot out of use for good, and only
// those: a Reset or Registered slot, or a stale handle, is refused.
func TestRetireTransitions(t *testing.T) {
	l := testLayout(8, 1, layout.FullyContiguous, 4096)
	_, b := newTestPool(t, testConfig(newManualClock(), nil), l)
	blks, err := b.Allocate(3)
	if err != nil {
		t.Fatal(err)
	}
	partial, complete, registered := blks[0], blks[1], blks[2]
	if err := b.Commit(complete); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(registered); err != nil {
		t.Fatal(err)
	}
	if registered, err = b.Register(registered, 7, 0); err != nil {
		t.Fatal(err)
	}
	for _, blk := range []Block{partial, complete} {
		if err := b.Retire(blk); err != nil {
			t.Fatalf("retire slot %d: %v", blk.Slot, err)
		}
		info, err := b.Slot(blk.Slot)
		if err != nil || info.State != Retired {
			t.Fatalf("slot %d after Retire: %+v, %v", blk.Slot, info, err)
		}
	}
	var te *TransitionError
	if err := b.Retire(registered); !errors.As(err, &te) || te.State != Registered {
		t.Fatalf("retire a registered block: %v, want a TransitionError from registered", err)
	}
	if err := b.Retire(Block{Slot: 5}); !errors.As(err, &te) || te.State != Reset {
		t.Fatalf("retire a free slot: %v, want a TransitionError from reset", err)
	}
	if err := b.Retire(Block{Slot: partial.Slot, Generation: partial.Generation + 1}); !errors.Is(err, ErrStaleBlock) {
		t.Fatalf("retire through a stale handle: %v, want ErrStaleBlock", err)
	}
	if err := b.Retire(Block{Slot: 8}); !errors.Is(err, ErrBadSlot) {
		t.Fatalf("retire slot 8 of 8: %v, want ErrBadSlot", err)
	}
	// Nothing leaves Retired.
	for _, op := range []struct {
		name string
		do   func(Block) error
	}{
		{"retire", b.Retire},
		{"abort", b.Abort},
		{"commit", b.Commit},
		{"release", b.Release},
		{"register", func(blk Block) error { _, err := b.Register(blk, 9, 0); return err }},
	} {
		if err := op.do(partial); !errors.As(err, &te) || te.State != Retired {
			t.Errorf("%s a retired slot: %v, want a TransitionError from retired", op.name, err)
		}
	}
	if m := b.Metrics(); m.Retired != 2 || m.Active != 3 || m.Free != 5 {
		t.Fatalf("metrics: retired %d, active %d, free %d; want 2, 3 (the retired and the registered), 5", m.Retired, m.Active, m.Free)
	}
}

// A retired slot is never allocated again: the set allocates every other
// slot, recycling included, and then refuses.
func TestRetiredSlotIsNeverAllocated(t *testing.T) {
	const n = 8
	l := testLayout(n, 1, layout.FullyContiguous, 4096)
	_, b := newTestPool(t, testConfig(newManualClock(), nil), l)
	blks, err := b.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	retired := blks[0].Slot
	before := b.Retains()
	if err := b.Retire(blks[0]); err != nil {
		t.Fatal(err)
	}
	if got := b.Retains(); got != before-1 {
		t.Fatalf("the set retains %d blocks with a slot retired, want %d", got, before-1)
	}
	for round := range 3 {
		got, err := b.Allocate(n - 1) // every slot left
		if err != nil {
			t.Fatalf("round %d: allocate the %d slots left: %v", round, n-1, err)
		}
		for i, blk := range got {
			if blk.Slot == retired {
				t.Fatalf("round %d: the retired slot %d was allocated", round, retired)
			}
			if err := b.Commit(blk); err != nil {
				t.Fatal(err)
			}
			reg, err := b.Register(blk, uint64(round*100+i+1), 0)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Release(reg); err != nil {
				t.Fatal(err)
			}
		}
		var ae *AllocError
		if _, err := b.Allocate(n); !errors.As(err, &ae) {
			t.Fatalf("round %d: allocate all %d slots with one retired: %v, want an AllocError", round, n, err)
		}
	}
}

// A set with a retired slot can be freed, but its memory goes to no other
// set: a new set carves past it or does not fit, and the pool counts the
// withheld bytes and the freed set's retired slot.
func TestFreeBlockSetWithheldWithRetiredSlot(t *testing.T) {
	l := testLayout(64, 2, layout.FullyContiguous, 4096)
	st := newSliceStorage(2*2*64*4096 + 4096) // room for two sets
	p, err := New(st, testConfig(newManualClock(), nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	withheld, err := p.NewBlockSet(l)
	if err != nil {
		t.Fatal(err)
	}
	clean, err := p.NewBlockSet(l)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.NewBlockSet(l); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("a third set: %v, want ErrOutOfMemory", err)
	}
	blks, err := withheld.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := withheld.Retire(blks[0]); err != nil {
		t.Fatal(err)
	}
	// The retired slot does not keep the set from being freed.
	if err := p.FreeBlockSet(withheld.ID()); err != nil {
		t.Fatalf("free a set whose only slot in use is retired: %v", err)
	}
	if _, err := p.NewBlockSet(l); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("a set after freeing the one with a retired slot: %v, want ErrOutOfMemory (its memory withheld)", err)
	}
	m := p.Metrics()
	want := uint64(0) // the set's regions, one per rank
	for r := range 2 {
		b, err := clean.RankBytes(r)
		if err != nil {
			t.Fatal(err)
		}
		want += uint64(len(b))
	}
	if m.Retired != 1 || m.WithheldBytes != want {
		t.Fatalf("pool metrics: retired %d, withheld %d bytes; want 1 and %d", m.Retired, m.WithheldBytes, want)
	}
	// A set freed without retired slots gives its memory back as before.
	if err := p.FreeBlockSet(clean.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.NewBlockSet(l); err != nil {
		t.Fatalf("a set in the memory of one freed with no retired slot: %v", err)
	}
	if after := p.Metrics(); after.Retired != 1 || after.WithheldBytes != m.WithheldBytes {
		t.Fatalf("after the clean free: retired %d, withheld %d bytes; want 1 and %d", after.Retired, after.WithheldBytes, m.WithheldBytes)
	}
}

// ReclaimBlockSet frees a set only where its memory comes back: one with a
// retired slot is refused, changing nothing (its blocks still served, its
// memory still its own), and one without is freed, its memory taken by the
// next set.
func TestReclaimBlockSetRefusesRetiredSlots(t *testing.T) {
	l := testLayout(64, 2, layout.FullyContiguous, 4096)
	st := newSliceStorage(2*2*64*4096 + 4096) // room for two sets
	p, err := New(st, testConfig(newManualClock(), nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	retired, err := p.NewBlockSet(l)
	if err != nil {
		t.Fatal(err)
	}
	clean, err := p.NewBlockSet(l)
	if err != nil {
		t.Fatal(err)
	}
	blks, err := retired.Allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	if err := retired.Commit(blks[1]); err != nil {
		t.Fatal(err)
	}
	cached, err := retired.Register(blks[1], 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := retired.Release(cached); err != nil {
		t.Fatal(err)
	}
	if err := retired.Retire(blks[0]); err != nil {
		t.Fatal(err)
	}
	if err := p.ReclaimBlockSet(retired.ID()); !errors.Is(err, ErrBlockSetRetired) {
		t.Fatalf("reclaim a set with a retired slot: %v, want ErrBlockSetRetired", err)
	}
	if _, err := p.BlockSet(retired.ID()); err != nil {
		t.Fatalf("the set refused is gone: %v", err)
	}
	if b, ok := retired.Lookup(7); !ok || b != cached {
		t.Fatalf("the refused set's cached block: %v %v, want %v", b, ok, cached)
	}
	if m, own := p.Metrics(), retired.Metrics(); m.WithheldBytes != own.WithheldBytes {
		t.Fatalf("pool withholds %d bytes after the refusal, want %d (the retired slot's share)", m.WithheldBytes, own.WithheldBytes)
	}
	if err := p.ReclaimBlockSet(clean.ID()); err != nil {
		t.Fatalf("reclaim a set with no retired slot: %v", err)
	}
	if _, err := p.NewBlockSet(l); err != nil {
		t.Fatalf("a set in the memory of one reclaimed: %v", err)
	}
	if err := p.ReclaimBlockSet(clean.ID()); !errors.Is(err, ErrUnknownBlockSet) {
		t.Fatalf("reclaim a set freed: %v, want ErrUnknownBlockSet", err)
	}
}

// WithheldBytes counts the memory retired slots keep out of use in sets
// still held (each retired slot's share of its set's regions, every rank),
// as well as the whole memory of freed sets that had them: the agent keeps
// sets with retired slots rather than free them, so a count of freed sets
// alone would stay 0.
func TestWithheldBytesCountsHeldSets(t *testing.T) {
	l := testLayout(64, 2, layout.FullyContiguous, 4096)
	p, b := newTestPool(t, testConfig(newManualClock(), nil), l)
	region := uint64(0) // the set's regions, one per rank
	for r := range 2 {
		rb, err := b.RankBytes(r)
		if err != nil {
			t.Fatal(err)
		}
		region += uint64(len(rb))
	}
	perSlot := region / 64
	if got := p.Metrics().WithheldBytes; got != 0 {
		t.Fatalf("no slot retired: %d bytes withheld, want 0", got)
	}
	blks, err := b.Allocate(3)
	if err != nil {
		t.Fatal(err)
	}
	for i, blk := range blks[:2] {
		if err := b.Retire(blk); err != nil {
			t.Fatal(err)
		}
		want := uint64(i+1) * perSlot
		if got := b.Metrics().WithheldBytes; got != want {
			t.Fatalf("set metrics with %d slots retired: %d bytes withheld, want %d", i+1, got, want)
		}
		if got := p.Metrics().WithheldBytes; got != want {
			t.Fatalf("pool metrics with %d slots retired: %d bytes withheld, want %d", i+1, got, want)
		}
	}
	// A slot given back is not withheld.
	if err := b.Abort(blks[2]); err != nil {
		t.Fatal(err)
	}
	if got := p.Metrics().WithheldBytes; got != 2*perSlot {
		t.Fatalf("after an abort: %d bytes withheld, want %d", got, 2*perSlot)
	}
	// Freed, the whole set's memory is withheld, counted once.
	if err := p.FreeBlockSet(b.ID()); err != nil {
		t.Fatal(err)
	}
	if m := p.Metrics(); m.WithheldBytes != region || m.Retired != 2 {
		t.Fatalf("after the free: %d bytes withheld, %d slots retired; want %d and 2", m.WithheldBytes, m.Retired, region)
	}
}
