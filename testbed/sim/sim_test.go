package sim

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/membership"
)

func waitConverged(t *testing.T, c *Cluster, what string, d time.Duration) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	took, err := c.WaitConverged(ctx)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := c.Check(); err != nil {
		t.Fatalf("%s: converged by digest, but: %v", what, err)
	}
	t.Logf("%s: converged in %v", what, took.Round(time.Millisecond))
	return took
}

// TestChurnAndPartitionHeal runs a small cluster under load through a
// join, a crash, a graceful leave and a partition that lasts past failure
// detection, and checks after each that every live node's index holds
// exactly the blocks the live nodes hold, block by block.
func TestChurnAndPartitionHeal(t *testing.T) {
	const n = 12
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mc := membership.DefaultLocalConfig()
	c, err := Start(ctx, Config{Nodes: n, StoreRate: 20, Lifetime: 2 * time.Second, Membership: mc})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitConverged(t, c, "start", 10*time.Second)

	c.StartLoad()
	time.Sleep(time.Second) // the load runs: blocks come and go
	if _, err := c.Join(ctx, 2); err != nil {
		t.Fatal(err)
	}
	live := c.Live()
	if err := c.Kill(live[3]); err != nil {
		t.Fatal(err)
	}
	if err := c.Leave(live[5]); err != nil {
		t.Fatal(err)
	}
	c.StopLoad()
	waitConverged(t, c, "join, crash and leave", 30*time.Second)
	if got := len(c.Live()); got != n {
		t.Fatalf("%d live nodes, want %d", got, n)
	}

	c.StartLoad()
	live = c.Live()
	c.Partition(live[:len(live)/2])
	// Past failure detection: each side declares the other dead and drops
	// its blocks, while both go on storing and removing.
	deadline := time.Now().Add(20 * time.Second)
	for c.Live() != nil {
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
	waitConverged(t, c, "partition heal", 30*time.Second)
}

func TestConfigRefused(t *testing.T) {
	for _, cfg := range []Config{{Nodes: 0}, {Nodes: 2, StoreRate: -1}, {Nodes: 2, Lifetime: -time.Second},
		{Nodes: 2, Mode: "sharded"}, {Nodes: 2, Mode: ModeOwned, Replicas: 9}, {Nodes: 2, Mode: ModeOwned, Replicas: -1}} {
		if _, err := Start(context.Background(), cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Start(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestGossipKeyAndLabel runs a cluster with encrypted, labelled gossip, as
// agents run, to convergence under load; a key of a wrong length is
// refused at the start.
func TestGossipKeyAndLabel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{Nodes: 4, StoreRate: 10, Lifetime: time.Second, Membership: membership.DefaultLocalConfig(),
		GossipKey: make([]byte, 32), ClusterName: "testbed"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitConverged(t, c, "start", 10*time.Second)
	c.StartLoad()
	time.Sleep(time.Second) // the load runs
	c.StopLoad()
	waitConverged(t, c, "load", 10*time.Second)
	if k := c.Counters(); k.GossipIn == 0 || k.Applied == 0 {
		t.Fatalf("no gossip or events: %+v", k)
	}

	if _, err := Start(ctx, Config{Nodes: 2, GossipKey: make([]byte, 5)}); err == nil || !strings.Contains(err.Error(), "5") {
		t.Fatalf("Start with a 5-byte key: %v, want an error naming its length", err)
	}
}

// TestKeepInFlight removes the blocks due at their lifetime, oldest first;
// with KeepInFlight a block still on its way to an index stays and the
// next oldest goes in its place (due or not), so the removes keep their
// count.
func TestKeepInFlight(t *testing.T) {
	for _, tc := range []struct {
		keep      bool
		gone, per []uint64 // removed, held after
	}{
		{keep: false, gone: []uint64{1, 3}, per: []uint64{5, 7}},
		{keep: true, gone: []uint64{3, 5}, per: []uint64{1, 7}},
	} {
		t.Run(strconv.FormatBool(tc.keep), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := Start(ctx, Config{Nodes: 2, Lifetime: time.Second, KeepInFlight: tc.keep, Membership: membership.DefaultLocalConfig()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			waitConverged(t, c, "start", 10*time.Second)
			n := c.Node(c.Live()[0])
			id, _ := c.truth.Lookup(n.Name)
			now := time.Now()
			// Blocks 1 and 3 are due, 5 and 7 are not; 1 is in flight
			// (awaited by one node more than there are, so that it stays).
			c.track.published([]uint64{1}, 3, now)
			c.truth.Store(id, 1, 3, 5, 7)
			if _, err := n.M.Publish(membership.EventStore, 1, 1, 3, 5, 7); err != nil {
				t.Fatal(err)
			}
			n.held = []heldBlock{{1, now.Add(-3 * time.Second)}, {3, now.Add(-2 * time.Second)}, {5, now}, {7, now}}
			c.step(n, now, 0)
			var per []uint64
			for _, b := range n.held {
				per = append(per, b.hash)
			}
			if !slices.Equal(per, tc.per) {
				t.Errorf("held after the step: %v, want %v", per, tc.per)
			}
			for _, h := range []uint64{1, 3, 5, 7} {
				want := !slices.Contains(tc.gone, h)
				if got := len(c.truth.Holders(h)) > 0; got != want {
					t.Errorf("block %d in the ground truth: %v, want %v", h, got, want)
				}
			}
		})
	}
}

// TestPacerSpreadsTheNodesStores: 64 nodes storing 2 blocks a second,
// paced in 20 ms ticks, store in different ticks of each period, as
// agents' engines do, and each at its rate. Starting every node's debt at
// zero made all 64 store in the same tick.
func TestPacerSpreadsTheNodesStores(t *testing.T) {
	const nodes, rate, tick, periods = 64, 2.0, 0.02, 20
	p := newPacer(rate, 1)
	stores := map[string]int{}
	most := 0
	for range int(periods / rate / tick) {
		in := 0
		for i := range nodes {
			name := "n" + strconv.Itoa(i)
			k := p.due(name, tick)
			stores[name] += k
			in += k
		}
		most = max(most, in)
	}
	// 64 stores over 25 ticks: 2.6 a tick on average.
	if most > 12 {
		t.Errorf("up to %d of %d nodes stored in one tick: the load comes in bursts", most, nodes)
	}
	for name, n := range stores {
		if n < periods-1 || n > periods {
			t.Errorf("%s stored %d blocks in %d periods, want %d (or one fewer)", name, n, periods, periods)
		}
	}
}
