package sim

import (
	"context"
	"flag"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/membership"
)

var long = flag.Bool("kvfabric.long", false, "run the slow suites (the owned slices' churn at 48 nodes, many rounds)")

// TestOwnedChurnAndPartitionHeal runs the owned-slices design under load
// through joins, crashes, graceful leaves and a partition that lasts past
// failure detection, and checks after each round that every owner's slice
// holds exactly the blocks the live nodes hold of the hashes it owns, block
// by block, against the ground truth. -kvfabric.long runs more nodes and
// rounds.
func TestOwnedChurnAndPartitionHeal(t *testing.T) {
	n, rounds := 12, 1
	if *long {
		n, rounds = 48, 4
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{Nodes: n, StoreRate: 20, Lifetime: 2 * time.Second, Membership: membership.DefaultLocalConfig(),
		Mode: ModeOwned, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitConverged(t, c, "start", 30*time.Second)
	for round := range rounds {
		c.StartLoad()
		time.Sleep(time.Second) // the load runs: blocks come and go
		jctx, jcancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := c.Join(jctx, 2)
		jcancel()
		if err != nil {
			t.Fatal(err)
		}
		live := c.Live()
		if err := c.Kill(live[3+round]); err != nil {
			t.Fatal(err)
		}
		if err := c.Leave(live[5+round]); err != nil {
			t.Fatal(err)
		}
		c.StopLoad()
		waitConverged(t, c, "join, crash and leave", 60*time.Second)
		if got := len(c.Live()); got != n {
			t.Fatalf("%d live nodes, want %d", got, n)
		}

		c.StartLoad()
		live = c.Live()
		c.Partition(live[:len(live)/2])
		// Past failure detection: each side declares the other dead and
		// drops its blocks, and each side's hashes move to owners on it,
		// while both go on storing and removing.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if n := c.Node(live[0]); n != nil && n.M.NumMembers() == len(live)/2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the partition was never detected")
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Heal()
		c.StopLoad()
		waitConverged(t, c, "partition heal", 60*time.Second)
	}
}
