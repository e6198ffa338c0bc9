package membership

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// startConcurrently starts nodes first..first+n-1 at once, as a cluster
// rollout does, and returns when every Start has returned.
func (c *cluster) startConcurrently(first, n int) {
	c.t.Helper()
	nodes := make([]*testNode, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { nodes[i] = c.startNode(first+i, nil) })
	}
	wg.Wait()
	c.nodes = append(c.nodes, nodes...)
}

// measureConvergence starts a cluster of n nodes (one seed, then the rest at
// once) and returns how long after the starts every node saw all n, and how
// long after a kill without leave every survivor had dropped the dead node.
func measureConvergence(t *testing.T, n int, joinDeadline time.Duration) (join, detect time.Duration) {
	c := newCluster(t, 1, nil)
	start := time.Now()
	c.startConcurrently(1, n-1)
	started := time.Since(start)
	join = waitFor(t, joinDeadline, fmt.Sprintf("%d nodes see each other", n), func() bool {
		if c.allSee(n) {
			return true
		}
		if time.Since(start) > joinDeadline {
			for _, x := range c.live() {
				if got := x.m.NumMembers(); got != n {
					t.Logf("%s sees %d", x.m.Name(), got)
				}
			}
		}
		return false
	})
	t.Logf("%d nodes: starts took %v, all saw each other %v later", n, started, join)
	victim := c.nodes[n/2]
	victim.m.Publish(EventStore, 1, 42)
	waitFor(t, 10*time.Second, "the victim's store spread", func() bool { return c.everyoneHas(victim.m.Name(), 42) })
	victim.m.shutdown(false)
	detect = waitFor(t, 30*time.Second, "the killed node dropped everywhere", func() bool {
		return c.allSee(n-1) && c.nobodyHas(victim.m.Name())
	})
	t.Logf("%d nodes: killed node dropped from every index after %v", n, detect)
	return join, detect
}

// TestConvergenceSixtyFour checks the timings: 64 agents in one process see
// each other within 2 s, every time, and a killed one is detected within
// memberlist's usual 5 to 8 s. Slow (several clusters of 64), so behind
// -kvfabric.long.
func TestConvergenceSixtyFour(t *testing.T) {
	if !*long {
		t.Skip("64-agent convergence runs with -kvfabric.long")
	}
	if raceEnabled {
		// Measured: under the race detector 64 agents on 2 cores starve
		// memberlist's probes, members flap between suspect and alive, and
		// the cluster does not settle in 10 s. The figures are for a normal
		// build; TestClusterOfSixteen covers the same paths under -race.
		t.Skip("64-agent timings are measured without -race")
	}
	deadline := 2 * time.Second
	var joins, detects []time.Duration
	for round := range 5 {
		t.Run(fmt.Sprintf("round=%d", round), func(t *testing.T) {
			j, d := measureConvergence(t, 64, deadline)
			joins = append(joins, j)
			detects = append(detects, d)
		})
	}
	slices.Sort(joins)
	slices.Sort(detects)
	t.Logf("64 nodes, %d rounds: all see each other in %v..%v; killed node detected in %v..%v",
		len(joins), joins[0], joins[len(joins)-1], detects[0], detects[len(detects)-1])
}

// TestConvergenceStockMemberlist is the baseline for the figures above:
// 64 plain memberlist nodes with memberlist's own loopback defaults, started
// the same way. It records how long they take to all see each other, which
// is what the tuned timings and the settle exchanges improve on.
func TestConvergenceStockMemberlist(t *testing.T) {
	if !*long {
		t.Skip("64-agent convergence runs with -kvfabric.long")
	}
	if raceEnabled {
		t.Skip("64-agent timings are measured without -race")
	}
	const n = 64
	for round := range 3 {
		nodes := make([]*memberlist.Memberlist, n)
		mk := func(i int) *memberlist.Memberlist {
			c := memberlist.DefaultLocalConfig()
			c.Name = fmt.Sprintf("stock-%02d", i)
			c.BindAddr = fmt.Sprintf("127.0.0.%d", 10+i)
			c.BindPort = 0
			c.LogOutput = io.Discard
			ml, err := memberlist.Create(c)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ml.Shutdown() })
			return ml
		}
		nodes[0] = mk(0)
		seed := nodes[0].LocalNode().Address()
		start := time.Now()
		var wg sync.WaitGroup
		for i := 1; i < n; i++ {
			wg.Go(func() {
				nodes[i] = mk(i)
				nodes[i].Join([]string{seed})
			})
		}
		wg.Wait()
		d := waitFor(t, 90*time.Second, "stock memberlist nodes see each other", func() bool {
			for _, ml := range nodes {
				if ml.NumMembers() != n {
					return false
				}
			}
			return true
		})
		t.Logf("round %d: stock memberlist, %d nodes: starts took %v, all saw each other %v later", round, n, time.Since(start)-d, d)
		for _, ml := range nodes {
			ml.Shutdown()
		}
	}
}
