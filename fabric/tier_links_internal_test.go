package fabric

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// relinked is the child of parent a restarted agent finds, relinking the
// blocks of the disk store in dir (reopened with cfg) in the order its
// journal last named them, as openStoresLocked does.
func relinked(t *testing.T, cfg disk.Config, parent disk.Key) (uint64, bool) {
	t.Helper()
	st, err := disk.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tr := &tiers{}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, k := range st.Keys() {
		tr.relinkLocked(st, k)
	}
	c, ok := tr.child[parent]
	return c, ok
}

// reopenable gives tier d a disk store of 64 slots in a directory of the
// test's, to reopen with cfg.
func reopenable(t *testing.T, tr *tiers, d *diskTier) (*disk.Store, disk.Config) {
	t.Helper()
	cfg := disk.Config{Dir: t.TempDir(), Bytes: 64 * disk.Align, SlotBytes: disk.Align, Buffered: true, Logger: tr.log}
	st, err := disk.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d.store.Store(st)
	return st, cfg
}

// linksStore gives tr's disk tier a store to reopen (reopenable) holding
// parent's block, which belowSet recorded in it.
func linksStore(t *testing.T, tr *tiers, parent disk.Key) (*disk.Store, disk.Config) {
	t.Helper()
	st, cfg := reopenable(t, tr, tr.list[0])
	if err := st.Put(context.Background(), parent, bytes.Repeat([]byte{7}, 1000)); err != nil {
		t.Fatal(err)
	}
	return st, cfg
}

// Two copiers' blocks that follow one parent, committed in one order and
// linked in the other (a copier links its blocks after its commit and
// place), leave the parent's child the one linked last, running and after
// a restart alike: its link, displacing the other's, is journalled after
// the other's put, where the puts' order alone made the other the last
// named. The second copier's copy down runs whole as the first takes
// announceMu to place its block, committed by then.
func TestTierCopiersLinkedOutOfCommitOrder(t *testing.T) {
	tr, set, parent := belowSet(t, false, false)
	tr.layouts = map[uint64]*layout.Layout{parent.Tag: set.Layout()}
	tr.room.Store(int64(tr.blockBytes))
	st, cfg := linksStore(t, tr, parent)
	copyDown := func(hash uint64) {
		j := &offloadJob{set: set, blk: mustLookup(t, set, hash), hash: hash, parent: parent.Hash, held: true}
		if out := tr.copyDownBatch([]*offloadJob{j}); !out[0].ok {
			t.Errorf("block %d not copied down", hash)
		}
	}
	second := false
	o := func() {
		if !second {
			second = true
			copyDown(3)
		}
	}
	tr.beforeOrder.Store(&o)
	copyDown(2)
	tr.beforeOrder.Store(nil)
	if !second {
		t.Fatal("the second copier never ran")
	}
	if c, ok := tr.childOf(parent); !ok || c != 2 {
		t.Fatalf("running, the parent's child: %d (%v), want 2, linked last", c, ok)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if c, ok := relinked(t, cfg, parent); !ok || c != 2 {
		t.Fatalf("after a restart, the parent's child: %d (%v), want 2, linked last", c, ok)
	}
}

// A block a tier holds, linked again to its parent (an offer that finds
// it held) while the parent has no child linked, its last child gone, is
// the parent's child running and after a restart alike: its link is
// journalled, though its copy keeps that parent already and displaces no
// child, since a child linked after it, still on disk, was named after
// its put. Blocks 2, 3 and 4 follow block 1, put and linked in that
// order; 4 is dropped; 2 is linked again.
func TestTierHeldRelinkAfterTheLastChildLeft(t *testing.T) {
	tr, _, parent := belowSet(t, false, false)
	d := tr.list[0]
	st, cfg := linksStore(t, tr, parent)
	key := func(h uint64) disk.Key { return disk.Key{Hash: h, Tag: parent.Tag} }
	for h := uint64(2); h <= 4; h++ {
		if err := st.PutBatch(context.Background(), []disk.PutItem{parentItem(key(h), bytes.Repeat([]byte{byte(h)}, 1000), parent.Hash)})[0]; err != nil {
			t.Fatal(err)
		}
		placeCopy(tr, d, key(h), disk.Align)
		tr.link(key(h), parent.Hash)
	}
	if err := st.Delete(key(4)); err != nil {
		t.Fatal(err)
	}
	forgetKey(tr, d, key(4))
	if _, ok := tr.childOf(parent); ok {
		t.Fatal("the parent keeps a child after its last child left")
	}
	tr.linkHeld(key(2), parent.Hash)
	if c, ok := tr.childOf(parent); !ok || c != 2 {
		t.Fatalf("running, the parent's child: %d (%v), want 2, linked again", c, ok)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if c, ok := relinked(t, cfg, parent); !ok || c != 2 {
		t.Fatalf("after a restart, the parent's child: %d (%v), want 2, linked last", c, ok)
	}
}

// putLinked puts k's block, following parent, into tier d (its store's
// Put, or PutBatch with the parent for a disk tier), records it there and
// links it as a copier does.
func putLinked(t *testing.T, tr *tiers, d *diskTier, k disk.Key, parent uint64) {
	t.Helper()
	data := bytes.Repeat([]byte{byte(k.Hash)}, 1000)
	if err := d.store.Load().PutBatch(context.Background(), []disk.PutItem{parentItem(k, data, parent)})[0]; err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, d, k, disk.Align)
	tr.link(k, parent)
}

// A move down from host memory keeps below the link the tiers keep: a
// block whose parent's link went to another block before the move goes
// with no parent, as it is left unlinked; one linked to its parent again
// during the move (after the move took its parent, before it recorded it
// below) has the link journalled; and where the parent's link goes to
// another block during the move, before its write below, that block's
// link is journalled again after the move's put, the moved block's record
// in the host tier kept or dropped meanwhile (recorded below afresh,
// unlinked). A block moved as the parent's child, whose link another
// block put below after the move's put takes and which takes it back
// before its record below (an offer that finds it held in the host tier,
// or a copier that places it there again), has its link journalled again,
// though its copy below keeps the parent already: the other block's put
// was named after the move's. Each time the parent's child is the same
// after a restart as while running. Block 2 is moved; block 3, in the
// disk tier, is the parent's other child.
func TestHostMoveDownKeepsTheLinkBelow(t *testing.T) {
	for _, tc := range []struct {
		desc string
		// before: block 3 linked to the parent after block 2, before the
		// move; after: block 2 linked again before its record below;
		// during: block 3 put and linked after block 2's read; dropped:
		// block 2's host record dropped first (during); taken: block 3
		// put and linked after the move's put, before block 2's link
		// again (after); placed: block 2 linked again as a copier's copy
		// placed in the host tier, not as an offer's.
		before, after, during, dropped, taken, placed bool
		want                                          uint64
		keeps                                         bool // block 2's copy below keeps the parent
	}{
		{desc: "the parent's link went to another block before", before: true, want: 3},
		{desc: "linked again during the move", before: true, after: true, want: 2, keeps: true},
		{desc: "the parent's link went to another block during the move", during: true, want: 3, keeps: true},
		{desc: "the parent's link went to another block as the record in the host tier was dropped", during: true, dropped: true, want: 3, keeps: true},
		{desc: "linked again after another block took the link during the move", after: true, taken: true, want: 2, keeps: true},
		{desc: "placed again after another block took the link during the move", after: true, taken: true, placed: true, want: 2, keeps: true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, h, d := hostOverDisk(t, 4)
			st, cfg := reopenable(t, tr, d)
			parent := disk.Key{Hash: 1, Tag: 1}
			k2, k3 := disk.Key{Hash: 2, Tag: 1}, disk.Key{Hash: 3, Tag: 1}
			putLinked(t, tr, h, k2, parent.Hash)
			if tc.before {
				putLinked(t, tr, d, k3, parent.Hash)
			}
			if tc.after {
				f := func() {
					if tc.taken {
						putLinked(t, tr, d, k3, parent.Hash)
					}
					if tc.placed {
						putLinked(t, tr, h, k2, parent.Hash)
					} else {
						tr.linkHeld(k2, parent.Hash)
					}
				}
				tr.beforeMoved.Store(&f)
			}
			if tc.during {
				f := func(dd *diskTier, k disk.Key, _ error) {
					if dd == h && k == k2 {
						if tc.dropped {
							tr.mu.Lock()
							e := tr.pos[k2]
							tr.mu.Unlock()
							if !tr.evict(e) {
								t.Error("block 2's record in the host tier not dropped")
							}
						}
						putLinked(t, tr, d, k3, parent.Hash)
					}
				}
				tr.afterRead.Store(&f)
			}
			if got := tr.moveDown(h, 1); got != 1 || tr.where(k2) != d {
				t.Fatalf("%d blocks left the host tier, block 2 in tier %d; want 1, block 2 in tier 1", got, tierNum(tr.where(k2)))
			}
			if c, ok := tr.childOf(parent); !ok || c != tc.want {
				t.Fatalf("running, the parent's child: %d (%v), want %d", c, ok, tc.want)
			}
			if p, ok := st.Parent(k2); ok != tc.keeps || ok && p != parent.Hash {
				t.Fatalf("block 2's copy below keeps parent %d (%v), want the parent: %v", p, ok, tc.keeps)
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			if c, ok := relinked(t, cfg, parent); !ok || c != tc.want {
				t.Fatalf("after a restart, the parent's child: %d (%v), want %d, as while running", c, ok, tc.want)
			}
		})
	}
}
