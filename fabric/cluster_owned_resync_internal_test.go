package fabric

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// ownedTierAgent starts an agent in owned index mode with a disk tier and
// waits until it joined.
func ownedTierAgent(t *testing.T) *Agent {
	t.Helper()
	return tierAgentIn(t, IndexOwned)
}

// tierAgentIn starts an agent in index mode mode with a disk tier and
// waits until it joined.
func tierAgentIn(t *testing.T, mode string) *Agent {
	t.Helper()
	return tierAgentWith(t, mode, nil)
}

// tierAgentWith is tierAgentIn with the configuration changed by change,
// if not nil, before the agent starts.
func tierAgentWith(t *testing.T, mode string, change func(*Config)) *Agent {
	t.Helper()
	dir := t.TempDir()
	c := DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = "n1", filepath.Join(dir, "n1"), filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "off"
	c.Pools = []string{"host=16MiB"}
	c.Tiers = []string{"disk=" + filepath.Join(dir, "tier") + ":64MiB"}
	c.IndexMode = mode
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if change != nil {
		change(&c)
	}
	a, err := Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	waitUntil(t, 10*time.Second, "the node joined", func() error {
		if a.joined.Load() == nil {
			return context.DeadlineExceeded
		}
		return nil
	})
	return a
}

// ownedCopies fails t unless a's owners are told of held copies of h at
// this node, onDisk of them on disk.
func ownedCopies(t *testing.T, a *Agent, when string, h uint64, held, onDisk int) {
	t.Helper()
	if gotHeld, gotDisk := a.owned.pub.Copies(h); gotHeld != held || gotDisk != onDisk {
		t.Fatalf("%s: the owners are told of %d copies of %#x, %d on disk; want %d and %d", when, gotHeld, h, gotDisk, held, onDisk)
	}
}

// betweenRecordAndAnnouncement records k in tier d and announces it, as a
// copier does, in one step under the tiers' ordering; in between it starts
// other, and announces once other is about to take the ordering. It
// returns when other has.
func betweenRecordAndAnnouncement(t *testing.T, tr *tiers, d *diskTier, k disk.Key, other func()) {
	t.Helper()
	waiting := make(chan struct{})
	var once sync.Once
	hook := func() { once.Do(func() { close(waiting) }) }
	tr.order()
	tr.beforeOrder.Store(&hook)
	defer tr.beforeOrder.Store(nil)
	if !placeCopy(tr, d, k, 4096) {
		tr.announceMu.Unlock()
		t.Fatal("a new block's record not to be announced")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		other()
	}()
	select {
	case <-waiting:
	case <-done:
		tr.announceMu.Unlock()
		t.Fatal("ran between a tier's record and its announcement without the tiers' ordering")
	case <-time.After(10 * time.Second):
		tr.announceMu.Unlock()
		t.Fatal("never took the tiers' ordering")
	}
	tr.announce(true, d.n, k.Hash)
	tr.announceMu.Unlock()
	<-done
}

// In owned index mode, a resync (the pool's events lost) comes while a
// tier has recorded a block and not yet announced it: it waits for the
// announcement, and takes the block from the records once. The owners
// are told of the block on disk once, and of none once its removal is
// announced.
func TestOwnedResyncBetweenATierRecordAndItsAnnouncement(t *testing.T) {
	a := ownedTierAgent(t)
	tr := a.tiers
	d := tr.list[0]
	k := disk.Key{Hash: 0xd15c, Tag: 7}
	betweenRecordAndAnnouncement(t, tr, d, k, func() { a.owned.publish(pool.EventBatch{Dropped: 1}) })
	ownedCopies(t, a, "a block recorded, a resync, then its announcement", k.Hash, 1, 1)
	forgetKey(tr, d, k) // unrecorded and its removal announced
	ownedCopies(t, a, "its removal announced", k.Hash, 0, 0)
}

// A block's removal from a tier, recorded while its store is recorded and
// not yet announced, is announced after the store: the owners are told of
// no copy once both are announced.
func TestOwnedTierRemovalWaitsForTheStoreAnnouncement(t *testing.T) {
	a := ownedTierAgent(t)
	tr := a.tiers
	d := tr.list[0]
	k := disk.Key{Hash: 0xd15d, Tag: 7}
	betweenRecordAndAnnouncement(t, tr, d, k, func() { forgetKey(tr, d, k) })
	if tr.where(k) != nil {
		t.Fatal("a forgotten block still recorded")
	}
	ownedCopies(t, a, "a block's store, then its removal, announced", k.Hash, 0, 0)
}

// A block's store and removal announced in the opposite order to its
// records (a copier recorded it, its removal was recorded and announced,
// then the copier's store announcement came), as the tiers announced them
// before their ordering, leave the owners told of a copy this node does
// not hold; a resync takes the tiers' part from their records and clears
// it, for good.
func TestOwnedResyncClearsATierCopyAnnouncedOutOfOrder(t *testing.T) {
	a := ownedTierAgent(t)
	tr := a.tiers
	d := tr.list[0]
	k := disk.Key{Hash: 0xd15e, Tag: 7}
	if !placeCopy(tr, d, k, 4096) { // recorded, not yet announced
		t.Fatal("a new block's record not to be announced")
	}
	forgetKey(tr, d, k)            // unrecorded and its removal announced first
	tr.announce(true, d.n, k.Hash) // the store's announcement, late
	ownedCopies(t, a, "a block's removal announced before its store", k.Hash, 1, 1)
	for i := range 2 {
		a.owned.publish(pool.EventBatch{Dropped: 1})
		ownedCopies(t, a, []string{"a resync after them", "a second resync"}[i], k.Hash, 0, 0)
	}
}

// In whole index mode the same holds of gossip's reconcile, run where
// the product runs it (the pool's goroutine, on a batch with events
// lost): between a tier's record and its announcement it waits, and the
// node's published holdings count the block once, then not at all once
// its removal is announced.
func TestReconcileBetweenATierRecordAndItsAnnouncement(t *testing.T) {
	// lost, when set, makes the pool's next batch one with events lost
	// and is closed once that batch is published.
	var lost atomic.Pointer[chan struct{}]
	a := tierAgentWith(t, IndexWhole, func(c *Config) {
		c.hooks.poolEvents = func(b pool.EventBatch, publish func(pool.EventBatch)) {
			done := lost.Swap(nil)
			if done != nil {
				b.Dropped++
			}
			publish(b)
			if done != nil {
				close(*done)
			}
		}
	})
	tr := a.tiers
	d := tr.list[0]
	k := disk.Key{Hash: 0xd15f, Tag: 7}
	set, err := a.pool.NewBlockSet(&layout.Layout{Model: layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16},
		PageSize: 16, TPSize: 1, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 256, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	reconcile := func() {
		done := make(chan struct{})
		lost.Store(&done)
		blks, err := set.Allocate(1) // a pool event, to carry the loss
		if err == nil {
			err = set.Commit(blks[0])
		}
		if err == nil {
			_, err = set.Register(blks[0], 0xbeef, 0)
		}
		if err != nil {
			t.Error(err)
			return
		}
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("the pool's batch with events lost never published")
		}
	}
	published := func(when string, want int) {
		t.Helper()
		n := 0
		for _, e := range a.joined.Load().Snapshot().Entries {
			if e.Hash == k.Hash && e.BlockSet == tr.tierSet(d.n) {
				n++
			}
		}
		if n != want {
			t.Fatalf("%s: %d copies of %#x published on tier %d, want %d", when, n, k.Hash, d.n, want)
		}
	}
	reconciled := a.stats.eventsLost.Load()
	betweenRecordAndAnnouncement(t, tr, d, k, reconcile)
	if a.stats.eventsLost.Load() == reconciled {
		t.Fatal("no batch with events lost reached the agent")
	}
	published("a block recorded, a reconcile, then its announcement", 1)
	forgetKey(tr, d, k)
	published("its removal announced", 0)
}

// A change to the tiers' records before announceAll (the node joining) is
// announced by it, not also on its own: the owners are told of one copy.
func TestTierChangeBeforeAnnounceAllAnnouncedOnce(t *testing.T) {
	a := ownedTierAgent(t)
	tr := a.tiers
	d := tr.list[0]
	k := disk.Key{Hash: 0xd160, Tag: 7}
	tr.announcing.Store(false) // as before announceAll
	tr.order()
	if !placeCopy(tr, d, k, 4096) {
		tr.announceMu.Unlock()
		t.Fatal("a new block's record not to be announced")
	}
	tr.announce(true, d.n, k.Hash)
	tr.announceMu.Unlock()
	ownedCopies(t, a, "a block recorded and announced before announceAll", k.Hash, 0, 0)
	tr.announceAll()
	ownedCopies(t, a, "after announceAll", k.Hash, 1, 1)
}

// In owned index mode, a resync that comes while a block's removal from a
// tier is recorded and announced (the tiers' ordering held) reads the
// records once it holds the ordering, after the removal: the owners are
// told of no copy, whether the resync started before the removal was
// recorded or after. One that read the records before taking the
// ordering would give the owners back, for good, the copy the removal's
// announcement took away.
func TestOwnedResyncWaitsForARemovalUnderWay(t *testing.T) {
	for i, tc := range []struct {
		desc         string
		resyncBefore bool // the resync starts before the removal is recorded, else after it is announced
	}{
		{"resync started before the removal's record", true},
		{"resync started after the removal's announcement", false},
	} {
		a := ownedTierAgent(t)
		tr := a.tiers
		d := tr.list[0]
		k := disk.Key{Hash: 0xd170 + uint64(i), Tag: 7}
		tr.order()
		if !placeCopy(tr, d, k, 4096) {
			tr.announceMu.Unlock()
			t.Fatalf("%s: a new block's record not to be announced", tc.desc)
		}
		tr.announce(true, d.n, k.Hash)
		tr.announceMu.Unlock()
		ownedCopies(t, a, tc.desc+": a block recorded and announced", k.Hash, 1, 1)

		waiting := make(chan struct{})
		var once sync.Once
		hook := func() { once.Do(func() { close(waiting) }) }
		done := make(chan struct{})
		resync := func() {
			go func() {
				defer close(done)
				a.owned.publish(pool.EventBatch{Dropped: 1})
			}()
			select {
			case <-waiting:
			case <-done:
				tr.announceMu.Unlock()
				t.Fatalf("%s: a resync ran without the tiers' ordering", tc.desc)
			case <-time.After(10 * time.Second):
				tr.announceMu.Unlock()
				t.Fatalf("%s: a resync never took the tiers' ordering", tc.desc)
			}
		}
		tr.order()
		tr.beforeOrder.Store(&hook)
		if tc.resyncBefore {
			resync()
		}
		tr.mu.Lock()
		tr.unrecordLocked(tr.pos[k])
		tr.mu.Unlock()
		tr.announce(false, d.n, k.Hash)
		if !tc.resyncBefore {
			resync()
		}
		tr.beforeOrder.Store(nil)
		tr.announceMu.Unlock()
		<-done
		ownedCopies(t, a, tc.desc+": its removal announced, then the resync", k.Hash, 0, 0)
	}
}
