package fabric

import (
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
)

// Events under a disk tier's block set count as disk copies, others not:
// a holder is disk-only for a hash once its memory copies are gone.
func TestTierEventsCountDiskOnlyCopies(t *testing.T) {
	ix, err := index.New(index.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	id, err := ix.ID("peer")
	if err != nil {
		t.Fatal(err)
	}
	var h index.DiskCopies
	apply := func(kind membership.EventKind, set uint32, hash uint64) {
		t.Helper()
		e := membership.Event{Origin: "peer", Kind: kind, Hash: hash, BlockSet: set}
		if kind == membership.EventStore {
			err = ix.Store(id, hash)
		} else {
			err = ix.Remove(id, hash)
		}
		if err != nil {
			t.Fatal(err)
		}
		noteTierEvent(&h, ix, id, e)
	}
	hashes := []uint64{1, 2, 3}
	for _, x := range hashes {
		apply(membership.EventStore, 7, x) // in a pool set
	}
	if d := h.CountDiskOnly(ix, id, hashes); d != 0 {
		t.Fatalf("%d on disk, none copied down", d)
	}
	apply(membership.EventStore, tierSetBase, 1)
	apply(membership.EventStore, tierSetBase+1, 2)
	if d := h.CountDiskOnly(ix, id, hashes); d != 0 {
		t.Fatalf("%d on disk only while every block is in memory too", d)
	}
	apply(membership.EventRemove, 7, 1)
	apply(membership.EventRemove, 7, 2)
	if d := h.CountDiskOnly(ix, id, hashes); d != 2 {
		t.Fatalf("%d on disk only, want 2 (recycled from memory, kept on disk)", d)
	}
	apply(membership.EventStore, 9, 2) // restored into a set
	if d := h.CountDiskOnly(ix, id, hashes); d != 1 {
		t.Fatalf("%d on disk only after a restore, want 1", d)
	}
	// The host tier's set is memory, as a pool set.
	apply(membership.EventStore, tierHostSet, 3)
	apply(membership.EventRemove, 7, 3)
	if d := h.CountDiskOnly(ix, id, hashes); d != 1 {
		t.Fatalf("%d on disk only with a block in the host tier, want 1", d)
	}
	// A remove of a disk copy never counted (it raced a sweep) leaves no
	// negative count behind.
	noteTierEvent(&h, ix, id, membership.Event{Kind: membership.EventRemove, Hash: 3, BlockSet: tierSetBase})
	if d := h.CountDiskOnly(ix, id, hashes); d != 1 {
		t.Fatalf("%d on disk only after a stray remove, want 1", d)
	}
}

func TestTierRestoreCost(t *testing.T) {
	a := &Agent{}
	if got := a.tierRestoreCost(4, 1<<28); got != time.Second {
		t.Fatalf("4 blocks of 256 MiB, nothing measured: %v, want 1s at 1 GiB/s", got)
	}
	d := &diskTier{}
	a.tiers = &tiers{list: []*diskTier{d}, blockBytes: 1 << 20}
	d.restoreTime.record(4 * time.Millisecond)
	d.restoreTime.record(4 * time.Millisecond)
	if got := a.tierRestoreCost(3, 1<<20); got != 12*time.Millisecond {
		t.Fatalf("3 blocks of 1 MiB at 4 ms each measured: %v, want 12ms", got)
	}
}
