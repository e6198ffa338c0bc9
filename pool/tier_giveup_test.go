package pool

import (
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

// giveUpPool is tierPool with Config.OffloadGiveUp and take as
// OffloadTake.
func giveUpPool(t *testing.T, slots int, take func(*BlockSet, Block, uint64, bool) bool) (*BlockSet, *offloads) {
	t.Helper()
	o := &offloads{room: slots}
	cfg := testConfig(nil, nil)
	cfg.Offload, cfg.OffloadGiveUp, cfg.OffloadTake = o.hook, true, take
	cfg.EventBuffer = 4 * slots
	_, b := newTestPool(t, cfg, testLayout(slots, 1, layout.FullyContiguous, 64))
	return b, o
}

// Under OffloadGiveUp an allocation that finds every candidate's copy
// below under way takes one anyway instead of failing (for its caller to
// wait): a copy not begun is dropped, and its copier's BeginCopy and
// Offloaded refuse the stale handle; a slot being read is never taken,
// and once read (EndCopy) it is taken without losing the block.
func TestOffloadGiveUp(t *testing.T) {
	const n = 8
	b, o := giveUpPool(t, n, nil)
	hs := fill(t, b, 1, n) // one chain: only its tail is a leaf
	got, err := b.Allocate(1)
	if err != nil {
		t.Fatalf("allocate from a full set whose one leaf is queued for a copy: %v", err)
	}
	if len(o.taken) == 0 || o.hash[0] != hs[n-1] {
		t.Fatalf("offered %v, want the tail %d first", o.hash, hs[n-1])
	}
	given := o.taken[0]
	if got[0].Slot != given.Slot {
		t.Fatalf("allocated slot %d, want %d, the tail's", got[0].Slot, given.Slot)
	}
	if _, ok := b.Lookup(hs[n-1]); ok {
		t.Fatal("the block given up is still registered")
	}
	if m := b.Metrics(); m.OffloadsGivenUp != 1 || m.Evictions != 1 {
		t.Fatalf("metrics %+v, want 1 given up and evicted", m)
	}
	if err := b.BeginCopy(given); !errors.Is(err, ErrStaleBlock) {
		t.Fatalf("BeginCopy of a block given up: %v, want ErrStaleBlock", err)
	}
	if err := b.Offloaded(given, true); !errors.Is(err, ErrStaleBlock) {
		t.Fatalf("Offloaded of a block given up: %v, want ErrStaleBlock", err)
	}
}

// A slot being read for its copy (BeginCopy to EndCopy) is never taken:
// the allocation fails counting it (its caller may wait: a copy in
// memory); once read, it is taken and its block not counted as lost.
func TestOffloadGiveUpSparesSlotsBeingRead(t *testing.T) {
	const n = 4
	b, o := giveUpPool(t, n, nil)
	fill(t, b, 1, n)
	if got := b.Evict(1); got != 0 || len(o.taken) != 1 {
		t.Fatalf("evict: %d recycled, %d offered; want the tail offered", got, len(o.taken))
	}
	reading := o.taken[0]
	if err := b.BeginCopy(reading); err != nil {
		t.Fatal(err)
	}
	if err := b.BeginCopy(reading); err == nil {
		t.Fatal("BeginCopy twice succeeded")
	}
	_, err := b.Allocate(1)
	var ae *AllocError
	if !errors.As(err, &ae) || ae.Copying != 1 {
		t.Fatalf("allocate with the one leaf being read: %v, want an AllocError counting it", err)
	}
	if !b.stillOffloading(reading) {
		t.Fatal("the slot being read was taken")
	}
	if err := b.EndCopy(reading); err != nil {
		t.Fatal(err)
	}
	if err := b.EndCopy(reading); err == nil {
		t.Fatal("EndCopy twice succeeded")
	}
	got, err := b.Allocate(1)
	if err != nil {
		t.Fatalf("allocate with the leaf read: %v", err)
	}
	if got[0].Slot != reading.Slot {
		t.Fatalf("allocated slot %d, want %d, the one read", got[0].Slot, reading.Slot)
	}
	if m := b.Metrics(); m.OffloadsGivenUp != 0 {
		t.Fatalf("a block read before its slot was taken counted as given up (%d)", m.OffloadsGivenUp)
	}
	if err := b.Offloaded(reading, true); !errors.Is(err, ErrStaleBlock) {
		t.Fatalf("Offloaded after the slot was taken: %v, want ErrStaleBlock", err)
	}
}

// stillOffloading says whether blk's copy below is under way and its slot
// not taken.
func (b *BlockSet) stillOffloading(blk Block) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	return err == nil && s.offloading
}

// OffloadTake is called, under the set's lock, for a block whose copy had
// not begun when an allocation took its slot, while the slot still holds
// the block's bytes; a block it took is not counted as given up.
func TestOffloadTakeCopiesOut(t *testing.T) {
	const n = 4
	type took struct {
		blk  Block
		sum  uint64
		has  bool
		data byte
	}
	var calls []took
	var b *BlockSet
	b, o := giveUpPool(t, n, func(set *BlockSet, blk Block, sum uint64, has bool) bool {
		if set != b {
			t.Error("OffloadTake called with another set")
		}
		mem, err := set.RankBytes(0)
		if err != nil {
			t.Error(err)
			return false
		}
		calls = append(calls, took{blk, sum, has, mem[set.lay.ChunkOffset(blk.Slot, 0, 0)]})
		return true
	})
	hs := fill(t, b, 1, n)
	tail, _ := b.Lookup(hs[n-1])
	if err := b.SetSum(tail, 0xabc); err != nil {
		t.Fatal(err)
	}
	mem, err := b.RankBytes(0)
	if err != nil {
		t.Fatal(err)
	}
	mem[b.lay.ChunkOffset(tail.Slot, 0, 0)] = 0x5a
	got, err := b.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 || calls[0].blk != o.taken[0] || calls[0].blk != tail || calls[0].sum != 0xabc || !calls[0].has || calls[0].data != 0x5a {
		t.Fatalf("OffloadTake calls %+v, want one for %+v with its sum and bytes", calls, tail)
	}
	if got[0].Slot != tail.Slot {
		t.Fatalf("allocated slot %d, want the tail's %d", got[0].Slot, tail.Slot)
	}
	if m := b.Metrics(); m.OffloadsGivenUp != 0 || m.Evictions != 1 {
		t.Fatalf("metrics %+v, want 1 evicted, nothing given up", m)
	}
}

// Without OffloadGiveUp, slots under a copy are kept until Offloaded, and
// BeginCopy and EndCopy are not needed.
func TestOffloadWithoutGiveUpKeepsSlots(t *testing.T) {
	b, o, _ := tierPool(t, 4, 4)
	fill(t, b, 1, 4)
	_, err := b.Allocate(1)
	var ae *AllocError
	if !errors.As(err, &ae) || ae.Offloading != 1 || ae.Copying != 0 {
		t.Fatalf("allocate with the one leaf being copied: %v, want an AllocError counting it", err)
	}
	o.finish(t, b, true)
	if _, err := b.Allocate(1); err != nil {
		t.Fatal(err)
	}
}

// The blocks offered for a copy below are remembered for giveUp; those
// whose copy ended are forgotten as offers go on, so a set whose copies
// end without pressure (giveUp never runs) keeps a short list.
func TestOffloadGiveUpForgetsEndedCopies(t *testing.T) {
	b, o := giveUpPool(t, 4, nil)
	fill(t, b, 100, 1)
	const rounds = 500
	for round := range rounds {
		if got := b.Evict(1); got != 0 || len(o.taken) != 1 {
			t.Fatalf("round %d: evict recycled %d, offered %d; want the block offered", round, got, len(o.taken))
		}
		o.finish(t, b, false) // the copy fails: the block stays, offerable again
	}
	b.mu.Lock()
	left := len(b.offered)
	b.mu.Unlock()
	if left > 2+64+1 {
		t.Fatalf("%d blocks remembered as offered after %d ended copies of one block", left, rounds)
	}
}

// The pool's count of blocks given up keeps the count of a set freed
// since: it only grows, as a counter exported from it must.
func TestOffloadGiveUpCountOutlivesTheSet(t *testing.T) {
	const n = 8
	b, o := giveUpPool(t, n, nil)
	fill(t, b, 1, n)
	got, err := b.Allocate(1)
	if err != nil {
		t.Fatalf("allocate from a full set whose one leaf is queued for a copy: %v", err)
	}
	if m := b.p.Metrics(); m.OffloadsGivenUp != 1 {
		t.Fatalf("pool metrics %+v, want 1 given up", m)
	}
	if err := b.Abort(got[0]); err != nil {
		t.Fatal(err)
	}
	// Freeing offers every block without a copy below first: end those
	// copies, then free.
	for try := 0; ; try++ {
		o.mu.Lock()
		taken := o.taken
		o.taken, o.hash = nil, nil
		o.mu.Unlock()
		for _, blk := range taken {
			if blk.Slot == got[0].Slot && try == 0 {
				continue // given up: its handle is stale
			}
			if err := b.Offloaded(blk, true); err != nil {
				t.Fatal(err)
			}
		}
		err := b.p.FreeBlockSet(b.ID())
		if err == nil {
			break
		}
		if !errors.Is(err, ErrBlockSetBusy) || try == 1 {
			t.Fatal(err)
		}
	}
	if m := b.p.Metrics(); m.OffloadsGivenUp != 1 {
		t.Fatalf("pool metrics after the set was freed %+v, want 1 given up still", m)
	}
}

// A slot being written straight to the tier below (StartCopy direct) is
// never waited for: an allocation that finds no other slot takes it, after
// the slots of copies not begun, OffloadTake copying its bytes out first
// (else the block is dropped and counted given up), and EndCopy then tells
// the copier that the slot was taken under its write. StartCopy returns
// the block's recorded checksum.
func TestOffloadGiveUpTakesSlotsBeingWritten(t *testing.T) {
	for _, takes := range []bool{true, false} {
		var took []Block
		var take func(*BlockSet, Block, uint64, bool) bool
		if takes {
			take = func(_ *BlockSet, blk Block, _ uint64, _ bool) bool {
				took = append(took, blk)
				return true
			}
		}
		o := &offloads{room: 2}
		cfg := testConfig(nil, nil)
		cfg.Offload, cfg.OffloadGiveUp, cfg.OffloadTake, cfg.OffloadInFlight = o.hook, true, take, 1
		_, b := newTestPool(t, cfg, testLayout(2, 1, layout.FullyContiguous, 64))
		fill(t, b, 1, 1)
		fill(t, b, 100, 1)
		if got := b.Evict(2); got != 0 || len(o.taken) != 2 {
			t.Fatalf("takes %v: evict recycled %d, offered %d; want both offered", takes, got, len(o.taken))
		}
		writing, notBegun := o.taken[0], o.taken[1]
		if err := b.SetSum(writing, 0xfeed); err != nil {
			t.Fatal(err)
		}
		sum, has, err := b.StartCopy(writing, true)
		if err != nil || sum != 0xfeed || !has {
			t.Fatalf("takes %v: StartCopy = %x %v %v, want the recorded sum", takes, sum, has, err)
		}
		if _, _, err := b.StartCopy(writing, true); err == nil {
			t.Fatal("StartCopy twice succeeded")
		}
		got, err := b.Allocate(1)
		if err != nil || got[0].Slot != notBegun.Slot {
			t.Fatalf("takes %v: first allocation %v %v, want the slot of the copy not begun (%d)", takes, got, err, notBegun.Slot)
		}
		got, err = b.Allocate(1)
		if err != nil || got[0].Slot != writing.Slot {
			t.Fatalf("takes %v: second allocation %v %v, want the slot being written (%d)", takes, got, err, writing.Slot)
		}
		if err := b.EndCopy(writing); !errors.Is(err, ErrStaleBlock) {
			t.Fatalf("takes %v: EndCopy of a slot taken under its write: %v, want ErrStaleBlock", takes, err)
		}
		wantGivenUp := uint64(2)
		if takes {
			wantGivenUp = 0
			if len(took) != 2 || took[0] != notBegun || took[1] != writing {
				t.Fatalf("OffloadTake called for %v, want %v then %v", took, notBegun, writing)
			}
		}
		if m := b.Metrics(); m.OffloadsGivenUp != wantGivenUp {
			t.Fatalf("takes %v: %d given up, want %d", takes, m.OffloadsGivenUp, wantGivenUp)
		}
	}
}

// A slot written straight to the tier below and not taken under the write
// ends its copy as one read does: EndCopy succeeds, and an allocation may
// take the slot afterwards without losing the block.
func TestOffloadDirectWriteEnds(t *testing.T) {
	b, o := giveUpPool(t, 1, nil)
	fill(t, b, 1, 1)
	if b.Evict(1); len(o.taken) != 1 {
		t.Fatal("the block was not offered")
	}
	blk := o.taken[0]
	if _, _, err := b.StartCopy(blk, true); err != nil {
		t.Fatal(err)
	}
	if err := b.EndCopy(blk); err != nil {
		t.Fatalf("EndCopy of a slot written and not taken: %v", err)
	}
	if err := b.EndCopy(blk); err == nil {
		t.Fatal("EndCopy twice succeeded")
	}
	if _, err := b.Allocate(1); err != nil {
		t.Fatal(err)
	}
	if m := b.Metrics(); m.OffloadsGivenUp != 0 {
		t.Fatalf("a block written before its slot was taken counted as given up (%d)", m.OffloadsGivenUp)
	}
}

// A block whose copy below failed and which is offered again is listed
// among the offered slots once, not once per offer: an allocation that
// gives up slots takes its slot once, and no two allocations get the same
// slot.
func TestOffloadGiveUpTakesAReofferedBlockOnce(t *testing.T) {
	const n = 4
	b, o := giveUpPool(t, n, nil)
	fill(t, b, 1, n)
	if got := b.Evict(1); got != 0 || len(o.taken) != 1 {
		t.Fatalf("evict: %d recycled, %d offered; want the tail offered", got, len(o.taken))
	}
	o.finish(t, b, false) // the copy failed: the block is as before its offer
	if got := b.Evict(1); got != 0 || len(o.taken) != 1 {
		t.Fatalf("evict again: %d recycled, %d offered; want the tail offered again", got, len(o.taken))
	}
	if len(b.offered) != 1 {
		t.Errorf("%d offered entries after two offers of one block, want 1", len(b.offered))
	}
	got, err := b.Allocate(2)
	if err != nil {
		t.Fatalf("allocate 2 from a full set whose tail is offered: %v", err)
	}
	if got[0].Slot == got[1].Slot {
		t.Fatalf("allocate 2 gave slot %d twice", got[0].Slot)
	}
	seen := map[int32]bool{}
	for _, i := range b.free {
		if seen[i] {
			t.Fatalf("slot %d is on the free stack twice: %v", i, b.free)
		}
		seen[i] = true
	}
}
