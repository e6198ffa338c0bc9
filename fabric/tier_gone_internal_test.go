package fabric

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// consistent fails the test where k's record and the tiers' stores
// disagree: a record naming a tier without the copy, or a copy in d that
// no record names (a slot lost until a restart).
func consistent(t *testing.T, tr *tiers, d *diskTier, k disk.Key) {
	t.Helper()
	tr.mu.Lock()
	e, ok := tr.pos[k]
	var te tierEntry
	if ok {
		te = *e.Value.(*tierEntry)
	}
	tr.mu.Unlock()
	if ok && !te.gone && !has(tr.list[te.tier], k) {
		t.Fatalf("the block is recorded in tier %d, which does not hold it", te.tier)
	}
	if has(d, k) && (!ok || te.tier != d.n) {
		t.Fatalf("tier %d holds a copy of the block that no record names (record: %v %+v)", d.n, ok, te)
	}
}

// recordIn is k's record if it names d, else nil.
func (t *tiers) recordIn(d *diskTier, k disk.Key) *list.Element {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.pos[k]; ok && e.Value.(*tierEntry).tier == d.n {
		return e
	}
	return nil
}

// forgetKey forgets k's record in d, whichever it is now, as the dropper
// of its copy does (forgetIf, the record it claimed).
func forgetKey(tr *tiers, d *diskTier, k disk.Key) {
	tr.forgetIf(d, k, tr.recordIn(d, k))
}

// lostKey marks k's record in d gone, whichever it is now, as a restore
// whose read of it found its copy missing or corrupt does (lostCopy): the
// copy goes from d's store first, as the store drops a copy found corrupt.
func lostKey(t *testing.T, tr *tiers, d *diskTier, k disk.Key) {
	t.Helper()
	if err := d.store.Load().Delete(k); err != nil && !errors.Is(err, disk.ErrNotFound) {
		t.Error(err)
	}
	tr.lostCopy(d, k)
}

// has says whether d's store holds a copy of k.
func has(d *diskTier, k disk.Key) bool {
	return d.store.Load().(interface{ Has(disk.Key) bool }).Has(k)
}

// A copy committed to a tier while the block's record there is gone (an
// eviction deleted the copy it names and has yet to forget it: two
// copiers of one hash, the second of which found the block unheld before
// the first recorded it) is deleted as a second copy, not taken as the
// record's copy and left in the store, recorded nowhere, once the record
// is forgotten.
func TestTierCopyPlacedOverAGoneRecordNotLeft(t *testing.T) {
	tr, _, d := hostOverDisk(t, 4)
	ctx := context.Background()
	k := disk.Key{Hash: 21, Tag: 1}
	data := bytes.Repeat([]byte{0x21}, 3000)
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, d, k, disk.Align) // the first copier's
	// The first copy found gone (a restore that found it corrupt): the
	// record waits, gone, to be forgotten.
	lostKey(t, tr, d, k)
	// The second copier commits its copy, and places it before the record
	// is forgotten.
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if announce, second := place(tr, d, k, disk.Align); announce || !second {
		t.Errorf("a copy placed over a gone record: announce %v, second %v; want false, true", announce, second)
	}
	tr.dropSecond(d, []disk.Key{k})
	forgetKey(tr, d, k)
	consistent(t, tr, d, k)

	// Placed while an eviction deletes the first copy: it waits for the
	// delete, and the copy ends recorded or deleted, whichever the
	// eviction's forget comes before.
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, d, k, disk.Align)
	ran := false
	done := make(chan struct{})
	f := func(dd *diskTier, kk disk.Key) {
		if dd != d || kk != k || ran {
			return
		}
		ran = true
		if err := d.store.Load().Put(ctx, k, data); err != nil {
			t.Error(err)
		}
		go func() {
			defer close(done)
			placeCopy(tr, d, k, disk.Align)
		}()
	}
	tr.afterDrop.Store(&f)
	if !tr.evict(tr.lru(d.n).Front()) {
		t.Fatal("the block's copy was not evicted")
	}
	if !ran {
		t.Fatal("the tier dropped no copy of the block")
	}
	waitClosed(t, done, "the second copy placed")
	consistent(t, tr, d, k)
}

// waitClosed waits for done to close, failing the test after a wide
// deadline.
func waitClosed(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not done after 30s", what)
	}
}

// A copy committed to a tier while a delete of its block there is under
// way (a second copy deleted: dropSecond) waits for the delete to end and
// is recorded if the store holds it then: the block's other copy may have
// gone meanwhile, and the committed one is then the node's only copy.
// Where the delete took it, it is recorded nowhere.
func TestTierCommitDuringADeleteRecordedIfKept(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		after bool // committed after the delete, else before it (taken)
	}{
		{"committed after the delete", true},
		{"committed before the delete", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, h, d := hostOverDisk(t, 4)
			ctx := context.Background()
			k := disk.Key{Hash: 24, Tag: 1}
			data := bytes.Repeat([]byte{0x24}, 3000)
			for _, x := range []*diskTier{h, d} {
				if err := x.store.Load().Put(ctx, k, data); err != nil {
					t.Fatal(err)
				}
			}
			placeCopy(tr, h, k, disk.Align)
			ran := false
			done := make(chan struct{})
			var announce, second bool
			f := func(dd *diskTier, kk disk.Key) {
				if dd != d || kk != k || ran {
					return
				}
				ran = true
				// Meanwhile the host tier's copy went, and a copy down
				// of the block to d ends.
				tr.evict(tr.lru(h.n).Front())
				if tc.after {
					if err := d.store.Load().Put(ctx, k, data); err != nil {
						t.Error(err)
					}
				}
				go func() {
					defer close(done)
					announce, second = place(tr, d, k, disk.Align)
				}()
			}
			tr.afterDrop.Store(&f)
			tr.dropSecond(d, []disk.Key{k})
			if !ran {
				t.Fatal("the second copy was not deleted")
			}
			waitClosed(t, done, "the copy placed")
			if second {
				t.Fatal("the copy committed was taken as a second copy")
			}
			if got := tr.where(k); (got == d) != tc.after || announce != tc.after {
				t.Fatalf("the block recorded in tier %d, announced %v; want recorded in tier %d and announced: %v", tierNum(got), announce, d.n, tc.after)
			}
			consistent(t, tr, d, k)
		})
	}
}

// A move down from the host tier that commits its copy below while the
// block's record below is gone (its copy there being dropped) deletes the
// copy it committed: the dropper forgets the record, and the copy would
// be left below recorded nowhere.
func TestHostMoveOverAGoneRecordBelowNotLeft(t *testing.T) {
	tr, h, d := hostOverDisk(t, 4)
	ctx := context.Background()
	k := disk.Key{Hash: 22, Tag: 1}
	data := bytes.Repeat([]byte{0x22}, 3000)
	mem := h.store.Load().(*disk.MemStore)
	if err := mem.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	buf := alignedBuffer(disk.Align)
	_, gen, err := mem.GetGen(ctx, k, buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, d, k, disk.Align)
	lostKey(t, tr, d, k) // its copy below found gone: the record marked, to be forgotten
	// The move's write below lands, and its record is made before the
	// record below is forgotten.
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	tr.movedDown(mem, h, d, k, disk.Align, gen, 0)
	forgetKey(tr, d, k)
	consistent(t, tr, d, k)
	consistent(t, tr, h, k)
}

// A move down from the host tier that ends while a delete of the block's
// copy below is under way (a second copy there, dropSecond) waits for it,
// then neither moves the block's record below nor records it there: the
// delete took the copy the move committed. The host copy and its record
// stay where the record named the host tier.
func TestHostMoveEndingUnderADeleteBelow(t *testing.T) {
	for _, tc := range []struct {
		desc     string
		recorded bool // the host copy recorded, else recorded nowhere (dropped meanwhile)
	}{
		{"recorded in host memory", true},
		{"recorded nowhere", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, h, d := hostOverDisk(t, 4)
			ctx := context.Background()
			k := disk.Key{Hash: 23, Tag: 1}
			data := bytes.Repeat([]byte{0x23}, 3000)
			mem := h.store.Load().(*disk.MemStore)
			if err := mem.Put(ctx, k, data); err != nil {
				t.Fatal(err)
			}
			if tc.recorded {
				placeCopy(tr, h, k, disk.Align)
			}
			buf := alignedBuffer(disk.Align)
			_, gen, err := mem.GetGen(ctx, k, buf)
			if err != nil {
				t.Fatal(err)
			}
			// The move's commit below, which a delete of a second copy of
			// the block there then takes.
			if err := d.store.Load().Put(ctx, k, data); err != nil {
				t.Fatal(err)
			}
			ran := false
			var done <-chan struct{}
			f := func(dd *diskTier, kk disk.Key) {
				if dd != d || kk != k || ran {
					return
				}
				ran = true
				done = startMove(t, tr, d, k, func() { tr.movedDown(mem, h, d, k, disk.Align, gen, 0) })
			}
			tr.afterDrop.Store(&f)
			tr.dropSecond(d, []disk.Key{k})
			if !ran {
				t.Fatal("no copy deleted below")
			}
			waitClosed(t, done, "the move down")
			consistent(t, tr, d, k)
			consistent(t, tr, h, k)
			if got := tr.where(k); tc.recorded && got != h {
				t.Fatalf("the block's record names %v, want the host tier", got)
			}
		})
	}
}

// startMove runs move (a move down of k to d) in a goroutine, from within
// a delete of k in d under way, and waits until it waits for that delete
// (beforeDeleteWait) or has returned; the channel it returns is closed
// once move returned.
func startMove(t *testing.T, tr *tiers, d *diskTier, k disk.Key, move func()) <-chan struct{} {
	t.Helper()
	waiting := make(chan struct{})
	var once sync.Once
	w := func(dd *diskTier, kk disk.Key) {
		if dd == d && kk == k {
			once.Do(func() { close(waiting) })
		}
	}
	tr.beforeDeleteWait.Store(&w)
	defer tr.beforeDeleteWait.Store(nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		move()
	}()
	select {
	case <-waiting:
	case <-done:
	case <-time.After(30 * time.Second):
		t.Error("the move down neither waited for the delete below nor returned after 30s")
	}
	return done
}

// A restore whose block's record went gone before its registration (the
// tier is dropping the copy: dropCopy marked the record, then clears the
// marks, then deletes it) registers the block as not copied below, so that
// spare-slot recycling keeps it; while the record holds, it is registered
// as copied below.
func TestTierRestoreAfterGoneNotBelow(t *testing.T) {
	for _, gone := range []bool{false, true} {
		tr, d, other, k := restoreSet(t, true)
		// A whole block of the shape, with no checksum in its trailer.
		if err := d.store.Load().Put(context.Background(), k, make([]byte, tierBlockBytes(other.Layout()))); err != nil {
			t.Fatal(err)
		}
		if gone {
			tr.mu.Lock()
			tr.pos[k].Value.(*tierEntry).gone = true
			tr.mu.Unlock()
		}
		find := func(context.Context, disk.Key) *diskTier { return d } // found before the record went
		alloc := func(_ context.Context, s *pool.BlockSet, n int) ([]pool.Block, error) { return s.Allocate(n) }
		forget := func(tierFound) { t.Error("a block forgotten: the copy was read whole") }
		blks, _, err := tr.restoreRun(context.Background(), &engineSet{set: other}, []uint64{k.Hash}, 0, find, alloc, forget, false)
		if err != nil || len(blks) != 1 {
			t.Fatalf("record gone %v: restore: %d blocks, %v; want 1", gone, len(blks), err)
		}
		if got := other.Below(blks[0]); got == gone {
			t.Fatalf("record gone %v: the restored block marked copied below %v, want %v", gone, got, !gone)
		}
	}
}

// A block whose copy a tier is dropping already (an eviction under way:
// its record gone) is not evicted again by a second eviction racing it
// (roomFor's callers at once), nor moved down from host memory: it is
// counted once, and no room is reported that was not made.
func TestTierGoneRecordNotEvictedTwice(t *testing.T) {
	for _, host := range []bool{false, true} {
		name := "disk"
		if host {
			name = "host"
		}
		t.Run(name, func(t *testing.T) {
			tr, _, k := belowSet(t, host, false)
			d := tr.list[0]
			tr.mu.Lock()
			e := tr.pos[k]
			tr.mu.Unlock()
			ran := false
			f := func(dd *diskTier, kk disk.Key) {
				if dd != d || kk != k || ran {
					return
				}
				ran = true
				if tr.evict(e) {
					t.Error("a record gone was evicted again")
				}
				if n := tr.evictOldest(d, 4); n != 0 {
					t.Errorf("evictOldest dropped %d blocks while the only one was being dropped, want 0", n)
				}
				if host {
					if n := tr.moveDown(d, 4); n != 0 {
						t.Errorf("moveDown took %d blocks from host memory while the only one was being dropped, want 0", n)
					}
				}
			}
			tr.afterDrop.Store(&f)
			if !tr.evict(e) {
				t.Fatal("the block's copy was not evicted")
			}
			if !ran {
				t.Fatal("the tier dropped no copy of the block")
			}
			if n := d.evicted.Load(); n != 1 {
				t.Fatalf("%d evictions counted of one block, want 1", n)
			}
		})
	}
}

// tierNum is d's number, -1 for none.
func tierNum(d *diskTier) int {
	if d == nil {
		return -1
	}
	return d.n
}

// A record gone (its copy dropped or found gone, the record not yet
// forgotten) holds nothing for look-ups: where and find say no tier holds
// the block, so that a copy down writes it again rather than take it as
// held (and end its offload as not copied, offered again and again), and
// no restore, Lookup or peer's lease looks for it there.
func TestTierGoneRecordHoldsNothing(t *testing.T) {
	tr, _, d := hostOverDisk(t, 4)
	tr.layouts = map[uint64]*layout.Layout{1: belowLayout(1)}
	ctx := context.Background()
	k := disk.Key{Hash: 25, Tag: 1}
	if err := d.store.Load().Put(ctx, k, bytes.Repeat([]byte{0x25}, 3000)); err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, d, k, disk.Align)
	if got := tr.where(k); got != d {
		t.Fatalf("where: tier %d, want %d", tierNum(got), d.n)
	}
	if got, ok := tr.find(k.Hash); !ok || got != k {
		t.Fatalf("find: %v %v, want %v", got, ok, k)
	}
	lostKey(t, tr, d, k)
	if got := tr.where(k); got != nil {
		t.Fatalf("where: tier %d holds a block whose record is gone", got.n)
	}
	if got, ok := tr.find(k.Hash); ok {
		t.Fatalf("find: %v held, its record gone", got)
	}
}

// An eviction that claimed a record (marked it gone) and let go of the
// tiers' lock drops that record's copy only: where a restore that found
// the copy corrupt dropped it and forgot the record meanwhile, and a
// copier committed the block again and placed a record of its own, the
// eviction leaves that record and its copy alone, and forgets only the
// record it claimed. Dropping by key took the new record's copy and left
// the record gone for good: never evicted, never found, every later copy
// of the block deleted as a second one.
func TestTierEvictionLeavesARecordPlacedSinceItsClaim(t *testing.T) {
	tr, _, d := hostOverDisk(t, 4)
	ctx := context.Background()
	k := disk.Key{Hash: 41, Tag: 1}
	data := bytes.Repeat([]byte{0x41}, 3000)
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, d, k, disk.Align)
	claimed := tr.lru(d.n).Front()
	ran := false
	f := func(dd *diskTier, kk disk.Key) {
		if dd != d || kk != k || ran {
			return
		}
		ran = true
		// A restore found the claimed copy corrupt: dropped, the
		// record forgotten.
		if err := tr.dropCopy(d, k, true); err != nil {
			t.Error(err)
		}
		forgetKey(tr, d, k)
		// A copier commits the block again and records it.
		if err := d.store.Load().Put(ctx, k, data); err != nil {
			t.Error(err)
		}
		if !placeCopy(tr, d, k, disk.Align) {
			t.Error("the copy committed again was not recorded")
		}
	}
	tr.beforeEvictDrop.Store(&f)
	tr.evict(claimed)
	if !ran {
		t.Fatal("the eviction dropped no copy of the block")
	}
	consistent(t, tr, d, k)
	if got := tr.where(k); got != d {
		t.Fatalf("the block copied again is held by tier %v, want tier %d", got, d.n)
	}
	if !has(d, k) {
		t.Fatal("the copy committed again was deleted")
	}
	tr.mu.Lock()
	held := tr.heldBytes[d.n]
	tr.mu.Unlock()
	if held != disk.Align {
		t.Errorf("tier %d counts %d bytes, want %d (one block)", d.n, held, disk.Align)
	}
	// The new record is evicted as any other.
	if got := tr.evictOldest(d, 1); got != 1 {
		t.Fatalf("evictOldest dropped %d blocks, want 1", got)
	}
	if tr.where(k) != nil || has(d, k) {
		t.Fatal("the block copied again was not evicted")
	}
}

// A copy committed to a tier while a delete of its block there is under
// way, placed before the store's Delete runs (the store still holds a
// copy then), waits for the delete to end and finds the copy taken: it is
// recorded nowhere, not recorded on the strength of a copy the delete
// then takes, which left a record naming a tier without the block.
func TestTierCopyPlacedBeforeADeleteRunsWaitsForIt(t *testing.T) {
	tr, _, d := hostOverDisk(t, 4)
	ctx := context.Background()
	k := disk.Key{Hash: 43, Tag: 1}
	data := bytes.Repeat([]byte{0x43}, 3000)
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	type result struct{ announce, second bool }
	waiting := make(chan struct{})
	w := func(dd *diskTier, kk disk.Key) {
		if dd == d && kk == k {
			select {
			case <-waiting:
			default:
				close(waiting)
			}
		}
	}
	tr.beforeDeleteWait.Store(&w)
	placedc := make(chan result, 1)
	ran := false
	f := func(dd *diskTier, kk disk.Key) {
		if dd != d || kk != k || ran {
			return
		}
		ran = true
		go func() {
			announce, second := place(tr, d, k, disk.Align)
			placedc <- result{announce, second}
		}()
		// Placed either waits for this delete (the store's Delete has
		// yet to run) or returns at once.
		select {
		case <-waiting:
		case r := <-placedc:
			placedc <- r
		case <-time.After(30 * time.Second):
			t.Error("placed neither waited for the delete nor returned after 30s")
		}
	}
	tr.beforeDelete.Store(&f)
	// A copy of k in d recorded nowhere: deleted as a second copy.
	tr.dropSecond(d, []disk.Key{k})
	if !ran {
		t.Fatal("the tier dropped no copy of the block")
	}
	var r result
	select {
	case r = <-placedc:
	case <-time.After(30 * time.Second):
		t.Fatal("placed did not return after the delete ended")
	}
	if r.announce || r.second {
		t.Errorf("a copy taken by the delete under way: placed says announce %v, second %v; want false, false", r.announce, r.second)
	}
	consistent(t, tr, d, k)
	if tr.where(k) != nil {
		t.Fatal("the block taken by the delete is recorded")
	}
}

// A copy down of a block that ends between an eviction's drop of its copy
// and the forget of its record (the record gone: no tier holds the block)
// writes the block again and deletes it as a second copy, and ends as not
// copied below: the block stays in memory unmarked, no record names a
// tier without its copy and no copy is left recorded nowhere. Work wasted,
// nothing lost: offered again once the record is forgotten, the block is
// written once more and recorded, and marked as copied below.
func TestTierCopyDownBetweenAnEvictionsDropAndForget(t *testing.T) {
	tr, set, k := belowSet(t, false, true) // block 1 offered, its copy down not begun
	d := tr.list[0]
	tr.layouts = map[uint64]*layout.Layout{k.Tag: set.Layout()} // no tier.json to write
	tr.room.Store(int64(tr.blockBytes))
	tr.progress = make(chan struct{}) // closed by each slot read (signal)
	blk := mustLookup(t, set, k.Hash)
	copyDown := func() {
		j := &offloadJob{set: set, blk: blk, hash: k.Hash}
		out := tr.copyDownBatch([]*offloadJob{j})
		if err := tr.offloaded(j, out[0]); err != nil {
			t.Error(err)
		}
	}
	st := d.store.Load()
	before := st.Stats()
	ran := false
	o := func() { // the first to take announceMu: the eviction's forget
		if ran {
			return
		}
		ran = true
		if tr.where(k) != nil || has(d, k) || tr.recordIn(d, k) == nil {
			t.Error("between the drop and the forget: want the record kept, gone, and no copy in the tier")
		}
		copyDown()
		if s := st.Stats(); s.Puts-before.Puts != 1 || s.Deletes-before.Deletes != 2 {
			t.Errorf("a copy down between the drop and the forget: %d puts, %d deletes; want 1 and 2 (the drop's, the second copy's)",
				s.Puts-before.Puts, s.Deletes-before.Deletes)
		}
		if has(d, k) {
			t.Error("the copy written between the drop and the forget is left in the tier")
		}
		if set.Below(blk) {
			t.Error("the block is marked as copied below while no tier holds its copy")
		}
	}
	tr.beforeOrder.Store(&o)
	if !tr.evict(tr.recordIn(d, k)) {
		t.Fatal("the block's copy was not evicted")
	}
	tr.beforeOrder.Store(nil)
	if !ran {
		t.Fatal("the eviction forgot no record")
	}
	consistent(t, tr, d, k)
	if tr.where(k) != nil {
		t.Fatal("the block is recorded after its eviction")
	}
	if b, ok := set.Lookup(k.Hash); !ok || set.Below(b) {
		t.Fatalf("the block after a copy down ended between the drop and the forget: in memory %v; want it there, not marked as copied below", ok)
	}
	if n := set.CopyDown(); n != 1 {
		t.Fatalf("%d copies down under way, want the block offered again", n)
	}
	copyDown()
	consistent(t, tr, d, k)
	if tr.where(k) != d || !set.Below(mustLookup(t, set, k.Hash)) {
		t.Fatalf("the block copied down after the forget: held by tier %d, marked below %v; want tier %d, marked",
			tierNum(tr.where(k)), set.Below(mustLookup(t, set, k.Hash)), d.n)
	}
	if s := st.Stats(); s.Puts-before.Puts != 2 {
		t.Fatalf("%d puts, want 2 (one a second copy, one recorded)", s.Puts-before.Puts)
	}
}
