package fabric_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// A block two nodes hold is demoted in both pools (recycled before the
// blocks only one node holds), and when one node lets its copy go, the
// other's copy is the last and loses the mark. A node with
// NoClusterEviction marks nothing in its own pool.
func TestSharedBlocksDemoted(t *testing.T) {
	agents := clusterWith(t, 3, func(i int, c *fabric.Config) {
		c.BlockSetGrace = 100 * time.Millisecond
		c.NoOrphanCache = true // n2's copies go when its engine drops its set
		c.NoClusterEviction = i == 2
	})
	n1, n2 := agents[0], agents[1]
	hashes := produce(t, n1, 1, layout.HND, 4)
	waitDemoted := func(a *fabric.Agent, want int) {
		t.Helper()
		wait.For(t, 10*time.Second, fmt.Sprintf("%s demotes %d blocks", a.NodeName(), want), func() error {
			if got := a.Metrics().Pool.Demoted; got != want {
				return fmt.Errorf("%d demoted", got)
			}
			return nil
		})
	}
	if got := n1.Metrics().Pool.Demoted; got != 0 {
		t.Fatalf("n1 demotes %d blocks that only it holds", got)
	}
	c2 := dial(t, n2)
	waitLookup(t, c2, hashes)
	// n2 imports two: both nodes hold them now.
	c, set, _ := importChecked(t, n2, "consumer", 1, layout.HND, hashes[:2])
	waitDemoted(n1, 2)
	waitDemoted(n2, 2)
	if _, err := c.DropBlockSet(context.Background(), set.ID); err != nil {
		t.Fatal(err)
	}
	// n2 frees its set after the grace period: n1 holds the last copies.
	waitDemoted(n1, 0)
	// n3 recycles by use alone: its copy marks nothing, and others' stores
	// mark nothing in its pool.
	n3 := agents[2]
	waitLookup(t, dial(t, n3), hashes)
	importChecked(t, n3, "consumer", 1, layout.HND, hashes[:3])
	wait.For(t, 10*time.Second, "n1 demotes the blocks n3 brought", func() error {
		if got := n1.Metrics().Pool.Demoted; got != 3 {
			return fmt.Errorf("%d demoted", got)
		}
		return nil
	})
	if got := n3.Metrics().Pool.Demoted; got != 0 {
		t.Fatalf("n3, without cluster eviction, demotes %d blocks", got)
	}
	if m := n1.Metrics(); m.DemotionsDropped != 0 {
		t.Fatalf("%d marks dropped", m.DemotionsDropped)
	}
}
