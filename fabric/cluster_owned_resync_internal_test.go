package fabric

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// In owned index mode, a resync (the pool's events lost) and a tier's
// announcement race: the tier records a block, then announces it. A
// resync between the two, then the announcement, leaves the owners told
// of the block on disk once, and its removal, announced later, leaves
// them told of none: the resync takes the tiers' part from what they
// announced, not from their records.
func TestOwnedResyncBetweenATierRecordAndItsAnnouncement(t *testing.T) {
	dir := t.TempDir()
	c := DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = "n1", filepath.Join(dir, "n1"), filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "off"
	c.Pools = []string{"host=16MiB"}
	c.Tiers = []string{"disk=" + filepath.Join(dir, "tier") + ":64MiB"}
	c.IndexMode = IndexOwned
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
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
	o, tr := a.owned, a.tiers
	d := tr.list[0]
	resync := func() { o.publish(pool.EventBatch{Dropped: 1}) }
	copies := func(when string, h uint64, held, onDisk int) {
		t.Helper()
		if gotHeld, gotDisk := o.pub.Copies(h); gotHeld != held || gotDisk != onDisk {
			t.Fatalf("%s: the owners are told of %d copies of %#x, %d on disk; want %d and %d", when, gotHeld, h, gotDisk, held, onDisk)
		}
	}

	k := disk.Key{Hash: 0xd15c, Tag: 7}
	if !tr.placed(d, k, 4096) { // recorded, not yet announced
		t.Fatal("a new block's record not to be announced")
	}
	resync()
	tr.announce(true, d.n, k.Hash) // the announcement, late
	copies("a block recorded, a resync, then its announcement", k.Hash, 1, 1)
	tr.forget(d, k) // unrecorded and its removal announced
	copies("its removal announced", k.Hash, 0, 0)

}
