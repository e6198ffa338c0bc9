package pool

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// AllocateSpare takes free slots beyond the low watermark, then the slots
// of unused blocks copied below, and nothing else: not a referenced
// block, not a block whose only copy is here, not the low watermark's
// free slots; and offers nothing below.
func TestAllocateSpareLosesNothing(t *testing.T) {
	const slots = 20
	b, o, _ := tierPool(t, slots, 0) // the tier below takes nothing
	low := slots - b.Retains()
	blks, err := b.Allocate(slots - low)
	if err != nil {
		t.Fatal(err)
	}
	// Blocks 1..4 copied below (restored), 5..8 here only, 9..12 below
	// and referenced; the rest stays allocated.
	var regs []Registration
	for i := range 12 {
		h := uint64(i + 1)
		regs = append(regs, Registration{Block: blks[i], Hash: h, Below: h <= 4 || h > 8})
	}
	// Each its own sequence, so that every one is a leaf.
	var got []Block
	for _, r := range regs {
		out, err := b.RegisterBatch([]Registration{r}, 0)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, out...)
	}
	for i, blk := range got {
		if i < 8 {
			b.Release(blk)
		}
	}
	// The first four leaves are below: taken. The fifth is here only:
	// recycling stops there.
	spare, err := b.AllocateSpare(slots, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(spare) != 4 {
		t.Fatalf("AllocateSpare took %d slots, want the 4 of the blocks below", len(spare))
	}
	for h := uint64(1); h <= 12; h++ {
		_, ok := b.Lookup(h)
		if want := h > 4; ok != want {
			t.Errorf("block %d held %v after AllocateSpare, want %v", h, ok, want)
		}
	}
	if len(o.taken) != 0 {
		t.Fatalf("AllocateSpare offered %d blocks below", len(o.taken))
	}
	if m := b.Metrics(); m.Free != low {
		t.Fatalf("%d slots free after AllocateSpare, want the low watermark's %d", m.Free, low)
	}
	// At the limit of what it may take: none left, no error.
	more, err := b.AllocateSpare(1, 0)
	if err != nil || len(more) != 0 {
		t.Fatalf("AllocateSpare with nothing to spare: %d slots, %v", len(more), err)
	}
	if _, err := b.AllocateSpare(0, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("AllocateSpare(0): %v, want ErrInvalidArgument", err)
	}
}

// AllocateSpare does not recycle the block it is told to keep, nor the
// blocks that block extends.
func TestAllocateSpareKeepsASequence(t *testing.T) {
	const slots = 20
	b, _, _ := tierPool(t, slots, 0)
	low := slots - b.Retains()
	blks, err := b.Allocate(slots - low)
	if err != nil {
		t.Fatal(err)
	}
	// A sequence of 4 below, its last block the one kept; the other
	// slots stay allocated.
	regs := make([]Registration, 4)
	for i := range regs {
		regs[i] = Registration{Block: blks[i], Hash: uint64(10 + i), Below: true}
	}
	got, err := b.RegisterBatch(regs, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, blk := range got {
		b.Release(blk)
	}
	spare, err := b.AllocateSpare(4, 13)
	if err != nil || len(spare) != 0 {
		t.Fatalf("AllocateSpare keeping the sequence's last block: %d slots, %v; want none", len(spare), err)
	}
	for h := uint64(10); h < 14; h++ {
		if _, ok := b.Lookup(h); !ok {
			t.Fatalf("block %d of the sequence kept was recycled", h)
		}
	}
	// Kept nothing: the sequence goes, its last block first.
	if spare, err = b.AllocateSpare(4, 0); err != nil || len(spare) != 4 {
		t.Fatalf("AllocateSpare keeping nothing: %d slots, %v; want 4", len(spare), err)
	}
}

// A block registered Detached names its parent in its store event but
// does not keep it: the parent is a leaf, recycled before it.
func TestRegisterDetached(t *testing.T) {
	b, _, _ := tierPool(t, 8, 0)
	blks, err := b.Allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.RegisterBatch([]Registration{{Block: blks[0], Hash: 1, Below: true}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Release(got[0])
	got, err = b.RegisterBatch([]Registration{{Block: blks[1], Hash: 2, Below: true, Detached: true}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	b.Release(got[0])
	if si, _ := b.Slot(blks[0].Slot); si.Children != 0 {
		t.Fatalf("the parent of a detached block has %d children", si.Children)
	}
	if si, _ := b.Slot(blks[1].Slot); si.Parent != 1 {
		t.Fatalf("a detached block's parent is %d, want 1", si.Parent)
	}
	// The parent, used first, is recycled first.
	if n := b.Evict(1); n != 1 {
		t.Fatalf("evicted %d", n)
	}
	if _, ok := b.Lookup(1); ok {
		t.Fatal("the parent of a detached block was kept for it")
	}
	if _, ok := b.Lookup(2); !ok {
		t.Fatal("the detached block went first")
	}
}

// An allocation that falls short while AllocateSpare's slots are out
// counts them in AllocError.Spare, until each is registered, given back
// or retired; with them given back it succeeds where it did before.
func TestAllocateSpareCountedInAllocError(t *testing.T) {
	const slots = 20
	b, _, _ := tierPool(t, slots, 0)
	low := slots - b.Retains()
	// 10 referenced, 6 copied below and released, 4 free.
	blks, err := b.Allocate(16)
	if err != nil {
		t.Fatal(err)
	}
	for i, blk := range blks {
		got, err := b.RegisterBatch([]Registration{{Block: blk, Hash: uint64(i + 1), Below: true}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if i >= 10 {
			b.Release(got[0])
		}
	}
	spare, err := b.AllocateSpare(8, 0)
	if err != nil || len(spare) != 10-low {
		t.Fatalf("AllocateSpare(8): %d slots, %v; want %d", len(spare), err, 10-low)
	}
	_, err = b.Allocate(10)
	var ae *AllocError
	if !errors.As(err, &ae) || ae.Spare != len(spare) {
		t.Fatalf("allocate with %d spare slots out: %v, want an AllocError counting them", len(spare), err)
	}
	// One registered, one retired, the rest given back: none counted.
	if _, err := b.RegisterBatch([]Registration{{Block: spare[0], Hash: 100, Below: true}}, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Retire(spare[1]); err != nil {
		t.Fatal(err)
	}
	_, err = b.Allocate(slots)
	if !errors.As(err, &ae) || ae.Spare != len(spare)-2 {
		t.Fatalf("allocate with %d spare slots out: %v, want Spare %d", len(spare)-2, err, len(spare)-2)
	}
	for _, blk := range spare[2:] {
		if err := b.Abort(blk); err != nil {
			t.Fatal(err)
		}
	}
	_, err = b.Allocate(slots)
	if !errors.As(err, &ae) || ae.Spare != 0 {
		t.Fatalf("allocate with every spare slot back: %v, want Spare 0", err)
	}
	// 10 referenced, 1 retired, the block registered on a spare slot
	// referenced; the other 8 free or recyclable.
	if got, err := b.Allocate(8); err != nil || len(got) != 8 {
		t.Fatalf("allocate 8 with the spare slots back: %d, %v", len(got), err)
	}
}

// AllocateSpare never takes a block being copied down (offered, or being
// read for its copy), a leased block, nor a retired slot, wherever it
// stands among the leaves: only the free slots above the low watermark
// and the unused blocks below are taken.
func TestAllocateSpareSparesBusySlots(t *testing.T) {
	const slots = 20
	for _, tc := range []struct {
		name string
		// busy makes the slots AllocateSpare must not take, the set's
		// oldest leaves if blocks, and returns them and their hashes.
		busy func(t *testing.T, b *BlockSet, o *offloads) ([]Block, []uint64)
	}{
		{"being copied down", func(t *testing.T, b *BlockSet, o *offloads) ([]Block, []uint64) {
			hs := []uint64{1, 2, 3, 4}
			for _, h := range hs {
				fill(t, b, h, 1) // each its own sequence, here only
			}
			if got := b.Evict(4); got != 0 || len(o.taken) != 4 {
				t.Fatalf("evict: %d recycled, %d offered; want 4 offered", got, len(o.taken))
			}
			if err := b.BeginCopy(o.taken[0]); err != nil { // one being read now
				t.Fatal(err)
			}
			return o.taken, o.hash
		}},
		{"leased", func(t *testing.T, b *BlockSet, _ *offloads) ([]Block, []uint64) {
			hs := []uint64{1, 2, 3, 4}
			for _, h := range hs {
				registerBelow(t, b, h)
			}
			_, leased, err := b.Lease(hs, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			var blks []Block
			for _, l := range leased {
				if !l.Found {
					t.Fatalf("block %d not leased", l.Hash)
				}
				blks = append(blks, Block{Slot: l.Slot, Generation: l.Generation})
			}
			return blks, hs
		}},
		{"retired", func(t *testing.T, b *BlockSet, _ *offloads) ([]Block, []uint64) {
			blks, err := b.Allocate(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Retire(blks[0]); err != nil {
				t.Fatal(err)
			}
			return blks, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, o, _ := tierPool(t, slots, slots)
			low := slots - b.Retains()
			busy, hs := tc.busy(t, b, o)
			// Four unused blocks below, newer leaves: AllocateSpare may
			// take them.
			for h := uint64(100); h < 104; h++ {
				registerBelow(t, b, h)
			}
			free := b.Metrics().Free
			spare, err := b.AllocateSpare(slots, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(spare) != free-low+4 {
				t.Fatalf("AllocateSpare took %d slots; want the %d free above the low watermark and the 4 below", len(spare), free-low+4)
			}
			for _, s := range spare {
				for _, bb := range busy {
					if s.Slot == bb.Slot {
						t.Fatalf("AllocateSpare took slot %d, %s", s.Slot, tc.name)
					}
				}
			}
			for _, h := range hs {
				if _, ok := b.Lookup(h); !ok {
					t.Fatalf("block %d, %s, was recycled", h, tc.name)
				}
			}
			for _, bb := range busy {
				si, err := b.Slot(bb.Slot)
				if err != nil || si.Generation != bb.Generation {
					t.Fatalf("slot %d, %s: %+v %v; want it untouched", bb.Slot, tc.name, si, err)
				}
			}
		})
	}
}

// registerBelow registers h in b as a sequence of its own, copied below,
// and releases it: an unused leaf recycling loses nothing by.
func registerBelow(t *testing.T, b *BlockSet, h uint64) {
	t.Helper()
	blks, err := b.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.RegisterBatch([]Registration{{Block: blks[0], Hash: h, Below: true}}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(got[0]); err != nil {
		t.Fatal(err)
	}
}

// AllocateSpare recycles a block only where the slots free after it
// exceed the low watermark, so that it hands out a slot for it: where the
// leaves it may take fall short of that it recycles none (a block a
// look-up had just restored was recycled for nothing), at the boundary it
// takes exactly enough for one slot, counting a parent its children's
// recycling leaves a leaf, and otherwise as many as it hands out.
func TestAllocateSpareRecyclesOnlyForSlotsItHandsOut(t *testing.T) {
	const slots = 20
	type seq struct {
		hashes []uint64 // a sequence, each block after the one before
		below  []bool   // copied below, by block
	}
	for _, tc := range []struct {
		name string
		free int   // free slots beyond the low watermark (negative: short of it)
		seqs []seq // registered and released in order, blocks in order: the oldest leaves first
		n    int   // slots asked for
		want int   // slots handed out
		gone []uint64
	}{
		{"reserve out of reach", -1, []seq{{[]uint64{1}, []bool{true}}, {[]uint64{2}, []bool{false}}}, 4, 0, nil},
		{"reserve out of reach past a parent", -1, []seq{{[]uint64{1, 2}, []bool{false, true}}, {[]uint64{3}, []bool{true}}}, 4, 0, nil},
		{"one slot at the boundary", -1, []seq{{[]uint64{1}, []bool{true}}, {[]uint64{2}, []bool{true}}, {[]uint64{3}, []bool{false}}}, 4, 1, []uint64{1, 2}},
		{"one slot through a parent", -1, []seq{{[]uint64{1, 2}, []bool{true, true}}, {[]uint64{3}, []bool{false}}}, 4, 1, []uint64{1, 2}},
		{"free and recycled", 2, []seq{{[]uint64{1}, []bool{true}}, {[]uint64{2}, []bool{true}}, {[]uint64{3}, []bool{true}}}, 4, 4, []uint64{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _, rec := tierPool(t, slots, 0)
			low := slots - b.Retains()
			if low < 2 {
				t.Fatalf("low watermark %d: the test needs 2 or more", low)
			}
			blks, err := b.Allocate(slots - low - tc.free)
			if err != nil {
				t.Fatal(err)
			}
			for _, sq := range tc.seqs {
				regs := make([]Registration, len(sq.hashes))
				for i, h := range sq.hashes {
					regs[i] = Registration{Block: blks[0], Hash: h, Below: sq.below[i]}
					blks = blks[1:]
				}
				got, err := b.RegisterBatch(regs, 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, blk := range got {
					if err := b.Release(blk); err != nil {
						t.Fatal(err)
					}
				}
			}
			spare, err := b.AllocateSpare(tc.n, 0)
			if err != nil || len(spare) != tc.want {
				t.Fatalf("AllocateSpare(%d) with %d free and a low watermark of %d: %d slots, %v; want %d",
					tc.n, low+tc.free, low, len(spare), err, tc.want)
			}
			for _, sq := range tc.seqs {
				for _, h := range sq.hashes {
					_, ok := b.Lookup(h)
					if want := !slices.Contains(tc.gone, h); ok != want {
						t.Errorf("block %d held %v after AllocateSpare, want %v", h, ok, want)
					}
				}
			}
			b.p.Close() // flushes the events
			evs, _ := rec.events()
			var removed []uint64
			for _, e := range evs {
				if e.Kind == EventRemove {
					removed = append(removed, e.Hash)
				}
			}
			slices.Sort(removed)
			if !slices.Equal(removed, tc.gone) {
				t.Errorf("remove events for %v, want %v", removed, tc.gone)
			}
			if m := b.Metrics(); m.Evictions != uint64(len(tc.gone)) {
				t.Errorf("%d evictions, want %d", m.Evictions, len(tc.gone))
			}
		})
	}
}
