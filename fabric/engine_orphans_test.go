package fabric_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// setStatus returns block set id as a's status lists it, nil when it is
// not there.
func setStatus(t *testing.T, c *client.Client, id uint64) *fabricpb.BlockSet {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range st.BlockSets {
		if b.Id == id {
			return b
		}
	}
	return nil
}

// waitOrphaned waits until set id on c's agent is kept as a cache.
func waitOrphaned(t *testing.T, c *client.Client, id uint64) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("block set %d kept as a cache", id), func() error {
		if b := setStatus(t, c, id); b == nil || !b.Orphaned || b.Sessions != 0 {
			return fmt.Errorf("block set %d: %v", id, b)
		}
		return nil
	})
}

// The blocks an engine process registered outlive it: past the grace
// period its set is kept, a peer still imports its blocks byte for byte,
// and the next engine of its layout takes the set up and finds them by
// Lookup and Acquire. When that engine goes too and a new block set needs
// the memory, the cached set is freed first (although its engine is
// within its fair share of the pool) and the peer's index forgets it.
func TestOrphanCacheOutlivesItsEngine(t *testing.T) {
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		c.BlockSetGrace = 200 * time.Millisecond
		if i == 0 {
			// The tenant's set (64 KiB) and big's (1,000 KiB) do not fit
			// together.
			c.Pools = []string{"host=1MiB"}
		}
	})
	n1, n2 := agents[0], agents[1]
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hashes := []uint64{0xb1, 0xb2, 0xb3}

	tenant := startTenant(t, n1, "fd")
	tenant.do("store")
	tenant.in.Close()
	if err := tenant.cmd.Wait(); err != nil {
		t.Fatalf("engine helper: %v", err)
	}
	c1 := dial(t, n1)
	// Past the grace period the set is kept (and stays: it is still there
	// for the import and the take-up below).
	waitOrphaned(t, c1, tenant.set)
	if b := setStatus(t, c1, tenant.set); b == nil || !b.Orphaned || b.Registered != 4 {
		t.Fatalf("past the grace period: %v, want the set kept with its 4 blocks", b)
	}
	if m := n1.Metrics().Orphans; m.Sets != 1 || m.Blocks != 4 || m.Bytes == 0 {
		t.Fatalf("orphan metrics %+v, want 1 set of 4 blocks", m)
	}

	// A peer imports the cached blocks.
	c2 := dial(t, n2)
	wait.For(t, 10*time.Second, "n2 indexes n1's cached blocks", func() error {
		ov, err := c2.Lookup(ctx, hashes)
		if err != nil || len(ov) == 0 || ov[0].Node != "n1" || int(ov[0].Blocks) != len(hashes) {
			return fmt.Errorf("overlaps %v %v", ov, err)
		}
		return nil
	})
	reader := register(t, c2, client.Engine{Name: "reader", Model: smallModel, TPSize: 1, PageSize: 4, Order: layout.NHD, Slots: 8})
	resp, err := c2.Import(ctx, reader.ID, hashes)
	if err != nil || len(resp.Blocks) != len(hashes) {
		t.Fatalf("import of the cached blocks: %v %v", resp, err)
	}
	for i, b := range resp.Blocks {
		if err := kvtest.Check(reader.Layout, reader.Ranks, int(b.Slot), hashes[i]); err != nil {
			t.Fatalf("imported block %#x: %v", hashes[i], err)
		}
	}

	// The next engine of the layout (this process) takes the set up.
	next, err := client.Dial(ctx, n1.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	set, err := next.Register(ctx, isolationEngine)
	if err != nil {
		t.Fatal(err)
	}
	if set.ID != tenant.set {
		t.Fatalf("set %d made, want the cached set %d taken up", set.ID, tenant.set)
	}
	ov, err := next.Lookup(ctx, hashes)
	if err != nil || len(ov) == 0 || ov[0].Node != "n1" || int(ov[0].Blocks) != len(hashes) {
		t.Fatalf("lookup by the next engine: %v %v", ov, err)
	}
	refs, err := next.Acquire(ctx, set.ID, hashes)
	if err != nil || len(refs) != len(hashes) {
		t.Fatalf("acquire by the next engine: %v %v", refs, err)
	}
	for i, b := range refs {
		if err := kvtest.Check(set.Layout, set.Ranks, int(b.Slot), hashes[i]); err != nil {
			t.Fatalf("cached block %#x: %v", hashes[i], err)
		}
	}
	if m := n1.Metrics().Orphans; m.Sets != 0 || m.Adoptions != 1 {
		t.Fatalf("orphan metrics after the take-up %+v, want none kept and 1 adoption", m)
	}
	if b := setStatus(t, c1, set.ID); b.Orphaned || b.Adoptions != 1 || b.Sessions != 1 {
		t.Fatalf("status after the take-up: %v", b)
	}

	// That engine goes; a new block set needs the memory.
	next.Close()
	waitOrphaned(t, c1, set.ID)
	big := client.Engine{Name: "big", Model: smallModel, TPSize: 1, PageSize: 4, Order: layout.NHD, Slots: 250}
	other := newClient(t, n1)
	bigSet, err := other.Register(ctx, big)
	if err != nil {
		t.Fatalf("a new block set that needs the cached set's memory: %v", err)
	}
	if bigSet.ID == set.ID {
		t.Fatalf("big was given the cached set")
	}
	if b := setStatus(t, c1, set.ID); b != nil {
		t.Fatalf("the cached set is still there: %v", b)
	}
	if m := n1.Metrics().Orphans; m.Sets != 0 || m.Blocks != 0 || m.Reclaimed != 1 {
		t.Fatalf("orphan metrics after the reclaim %+v, want none and 1 reclaimed", m)
	}
	wait.For(t, 10*time.Second, "n2 forgets n1's freed blocks", func() error {
		if got := agentStatus(t, n2).Members["n1"]; got != 0 {
			return fmt.Errorf("n2 indexes %d blocks of n1", got)
		}
		return nil
	})
	// The fresh set's slots show nothing of the engine that is gone.
	slots, err := other.Allocate(ctx, bigSet.ID, big.Slots-20)
	if err != nil {
		t.Fatal(err)
	}
	checkFresh(t, bigSet, slots)
}

// A set that holds no registered block is freed at the grace period, and
// with NoOrphanCache so is one that does.
func TestOrphanCacheKeepsOnlySetsWithBlocks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noCache bool
		store   bool
	}{
		{"no blocks", false, false},
		{"blocks, no orphan cache", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "n1")
			cfg.BlockSetGrace = 100 * time.Millisecond
			cfg.NoOrphanCache = tc.noCache
			a := startAgent(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			e := newClient(t, a)
			set := register(t, e, sessionEngine)
			if tc.store {
				slots, err := e.Allocate(ctx, set.ID, 1)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := e.RegisterBlocks(ctx, set.ID, slots, []uint64{7}); err != nil {
					t.Fatal(err)
				}
			}
			e.Close()
			c := dial(t, a)
			wait.For(t, 10*time.Second, "the idle set freed", func() error {
				if b := setStatus(t, c, set.ID); b != nil {
					return fmt.Errorf("block set %v", b)
				}
				return nil
			})
			if m := a.Metrics().Orphans; m.Sets != 0 || m.Reclaimed != 0 {
				t.Fatalf("orphan metrics %+v, want none", m)
			}
		})
	}
}
