package fabric_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// A cluster upgraded one node at a time works across the change to
// lookups with tiers and disk copies, both ways. Nodes of this version
// send an owner of the older one (n2) a holder's disk copies as plain
// copies and ask it the older lookup, whose holders count as in memory,
// while the newer owners still say which holder has a hash on disk only;
// the older node's lookup, of the older kind, is answered by the newer
// owners.
func TestOwnedIndexOwnerBeforeTiers(t *testing.T) {
	const n = 40
	dir := tierDir(t)
	agents := clusterWith(t, 3, func(i int, c *fabric.Config) {
		// One owner a hash: what n2 owns, only n2 can tell.
		c.IndexMode, c.IndexReplicas = fabric.IndexOwned, 1
		c.IndexCacheTTL = time.Millisecond // every poll below asks the owners afresh
		switch i {
		case 0:
			c.Tiers = []string{"disk=" + dir + ":64MiB"}
			c.BlockSetGrace = 100 * time.Millisecond
			c.NoOrphanCache = true // the set is freed, its blocks then on disk only
		case 1:
			fabric.ServeIndexBeforeTiers(c)
		}
	})
	origin, old, asker := agents[0], agents[1], agents[2]
	c0 := newClient(t, origin)
	hashes := storeThrough(t, c0, register(t, c0, tierEngine), n, origin)
	c0.Close()
	watcher := newClient(t, origin)
	wait.For(t, 20*time.Second, "every block on disk, the engine's set freed", func() error {
		st, err := watcher.Status(context.Background())
		if err != nil || len(st.BlockSets) != 0 || st.Tiers[0].Blocks != n {
			return fmt.Errorf("sets %d, tiers %v (%v)", len(st.GetBlockSets()), st.GetTiers(), err)
		}
		return nil
	})
	byOwner := map[string][]uint64{}
	for _, h := range hashes {
		w := fabric.IndexOwners(asker, h)
		if len(w) != 1 {
			t.Fatalf("hash %#x has owners %v, want one", h, w)
		}
		byOwner[w[0]] = append(byOwner[w[0]], h)
	}
	if len(byOwner["n2"]) == 0 || len(byOwner["n2"]) == n {
		t.Fatalf("n2 owns %d of the %d hashes: the test needs both kinds of owner", len(byOwner["n2"]), n)
	}
	wait.For(t, 20*time.Second, "the blocks indexed by both kinds of owner", func() error {
		// Without the fallback, the stream to n2 stops at the first
		// disk copy, which n2 refuses, and waits for ever.
		if q := fabric.IndexQueuedOps(origin); q != 0 {
			return fmt.Errorf("%d of the origin's ops not applied", q)
		}
		for _, h := range byOwner["n2"] {
			if hs := fabric.IndexHolders(old, h); !slices.Equal(hs, []string{"n1"}) {
				return fmt.Errorf("n2 indexes %v as holders of %#x", hs, h)
			}
		}
		ov, err := dial(t, asker).Lookup(context.Background(), hashes)
		if err != nil || len(ov) == 0 || ov[0].Node != "n1" || ov[0].Blocks != n || (len(ov) > 1 && ov[1].Blocks != 0) {
			return fmt.Errorf("overlaps %v (%v)", ov, err)
		}
		if d, want := fabric.IndexDiskOnly(asker, "n1", hashes), n-len(byOwner["n2"]); d != want {
			return fmt.Errorf("n1 has %d blocks on disk only, want %d (those the newer owners own)", d, want)
		}
		return nil
	})
	for _, a := range []*fabric.Agent{origin, asker} {
		if !fabric.IndexLegacyOwner(a, "n2") || fabric.IndexLegacyOwner(a, "n3") || fabric.IndexLegacyOwner(a, "n1") {
			t.Fatalf("%s does not send n2 alone the older calls", a.NodeName())
		}
	}
	// The older node's own lookup, of each newer owner.
	for _, w := range []string{"n1", "n3"} {
		if len(byOwner[w]) == 0 {
			continue
		}
		got, err := fabric.IndexLookupBeforeTiers(old, w, byOwner[w])
		if err != nil {
			t.Fatalf("an older lookup of %s: %v", w, err)
		}
		for i, hs := range got {
			if !slices.Equal(hs, []string{"n1"}) {
				t.Fatalf("%s answers an older lookup of %#x with %v, want n1", w, byOwner[w][i], hs)
			}
		}
	}
}
