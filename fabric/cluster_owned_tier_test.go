package fabric_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// In owned mode the owners keep each holder's tier: of two holders of the
// same blocks, one with them on disk only and one in memory, the
// importer's lookup (asked of the owners) says which, an import goes to
// the one in memory, and Lookup's estimate for the disk holder adds the
// restore, as in whole mode (TestTierImportPrefersMemoryHolders).
func TestOwnedIndexPrefersMemoryHolders(t *testing.T) {
	const n = 40
	dir := tierDir(t)
	agents := clusterWith(t, 4, func(i int, c *fabric.Config) {
		// 2 owners of 4: the importer owns some hashes, asks for others.
		c.IndexMode, c.IndexReplicas = fabric.IndexOwned, 2
		c.IndexCacheTTL = time.Millisecond // every poll below asks the owners afresh
		if i == 0 {
			c.Tiers = []string{"disk=" + dir + ":64MiB"}
			c.BlockSetGrace = 100 * time.Millisecond
			c.NoOrphanCache = true // the set is freed, its blocks then on disk only
		}
	})
	onDisk, inMemory, importer := agents[0], agents[1], agents[2]
	c0 := newClient(t, onDisk)
	hashes := storeThrough(t, c0, register(t, c0, tierEngine), n)
	c0.Close()
	watcher := newClient(t, onDisk)
	wait.For(t, 20*time.Second, "every block on disk, the engine's set freed", func() error {
		st, err := watcher.Status(context.Background())
		if err != nil || len(st.BlockSets) != 0 || st.Tiers[0].Blocks != n {
			return fmt.Errorf("sets %d, tiers %v (%v)", len(st.GetBlockSets()), st.GetTiers(), err)
		}
		return nil
	})
	e := tierEngine
	e.Slots = 64
	c1 := dial(t, inMemory)
	if got := storeThrough(t, c1, register(t, c1, e), n); !slices.Equal(got, hashes) {
		t.Fatal("the two holders' hashes differ")
	}
	wait.For(t, 20*time.Second, "the owners tell the importer of both holders, one on disk only", func() error {
		if d := fabric.IndexDiskOnly(importer, onDisk.NodeName(), hashes); d != n {
			return fmt.Errorf("%d of %d blocks on disk only at %s", d, n, onDisk.NodeName())
		}
		if d := fabric.IndexDiskOnly(importer, inMemory.NodeName(), hashes); d != 0 {
			return fmt.Errorf("%d blocks on disk only at %s", d, inMemory.NodeName())
		}
		if c := fabric.ImportCandidates(importer, hashes); len(c) != 2 {
			return fmt.Errorf("candidates %q", c)
		}
		return nil
	})
	for range 4 {
		if c := fabric.ImportCandidates(importer, hashes); c[0] != inMemory.NodeName() {
			t.Fatalf("candidates %q, want %s first", c, inMemory.NodeName())
		}
	}
	c2 := dial(t, importer)
	e.Name = "importer"
	set2 := register(t, c2, e)
	resp, err := c2.Import(context.Background(), set2.ID, hashes)
	if err != nil || len(resp.Blocks) != n {
		t.Fatalf("import of %d blocks: %v %v", n, err, resp.GetError())
	}
	checkImported(t, set2, resp.Blocks, 1)
	if st := tierStatus(t, watcher); st.Restores != 0 {
		t.Fatalf("the disk holder restored %d blocks for an import the memory holder could serve", st.Restores)
	}
	lr, err := c2.API().Lookup(context.Background(), &fabricpb.LookupRequest{Hashes: hashes, BlockSet: set2.ID})
	if err != nil {
		t.Fatal(err)
	}
	est := map[string]*fabricpb.Overlap{}
	for _, o := range lr.Overlaps {
		est[o.Node] = o
	}
	mem, dsk := est[inMemory.NodeName()], est[onDisk.NodeName()]
	if mem == nil || dsk == nil || mem.Blocks != n || dsk.Blocks != n || mem.Estimate == "none" || dsk.Estimate == "none" {
		t.Fatalf("overlaps %v", lr.Overlaps)
	}
	if dsk.FetchEstimateUs <= mem.FetchEstimateUs {
		t.Fatalf("estimate of %d disk-held blocks %d µs, of the same in memory %d µs: want more", n, dsk.FetchEstimateUs, mem.FetchEstimateUs)
	}
}
