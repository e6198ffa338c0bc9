package fabric_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// The import flow works the same over either index: blocks stored on one
// node are found and imported on another, then imported again from their
// second holder once the first leaves.
func TestIndexModesImport(t *testing.T) {
	for _, mode := range []string{fabric.IndexWhole, fabric.IndexOwned} {
		t.Run(mode, func(t *testing.T) {
			agents := clusterWith(t, 4, func(_ int, c *fabric.Config) {
				c.IndexMode = mode
				c.IndexReplicas = 2 // with 4 nodes, not every node owns every hash
			})
			n1, n2, n3 := agents[0], agents[1], agents[2]
			hashes := produce(t, n1, 2, layout.HND, 20)
			waitHolders(t, n2, hashes, map[string]int{"n1": 20})
			waitHolders(t, n3, hashes, map[string]int{"n1": 20})
			if mode == fabric.IndexOwned {
				// Every node asked owns a part, and some of it is n3's
				// own: lookups went out to the others.
				if fabric.IndexLookupCalls(n3) == 0 {
					t.Fatal("n3 found n1's blocks without asking an owner")
				}
				if !slices.Equal(fabric.IndexMembers(n3), []string{"n1", "n2", "n3", "n4"}) {
					t.Fatalf("n3 places hashes over %v", fabric.IndexMembers(n3))
				}
			}
			if from := consume(t, n2, 1, layout.NHD, hashes); len(from) != 1 || from[0] != "n1" {
				t.Fatalf("n2 imported from %v, want n1", from)
			}
			waitHolders(t, n3, hashes, map[string]int{"n1": 20, "n2": 20})
			if err := n1.Close(); err != nil {
				t.Fatal(err)
			}
			waitHolders(t, n3, hashes, map[string]int{"n2": 20})
			if from := consume(t, n3, 2, layout.HND, hashes); len(from) != 1 || from[0] != "n2" {
				t.Fatalf("n3 imported from %v, want n2", from)
			}
		})
	}
}

// waitHolders waits until a's lookup of hashes names exactly the holders
// want, with the leading blocks each holds.
func waitHolders(t *testing.T, a *fabric.Agent, hashes []uint64, want map[string]int) {
	t.Helper()
	wait.For(t, 20*time.Second, fmt.Sprintf("%s's lookup finds %v", a.NodeName(), want), func() error {
		ov, err := dial(t, a).Lookup(context.Background(), hashes)
		if err != nil {
			return err
		}
		got := map[string]int{}
		for _, o := range ov {
			if o.Blocks > 0 {
				got[o.Node] = int(o.Blocks)
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("lookup names %v", got)
		}
		return nil
	})
}

// holdings is what the test registered on each node: its ground truth.
type holdings map[string]map[uint64]bool

// registerHashes registers n blocks with hashes of its own on a, in a
// block set of name, and records them.
func registerHashes(t *testing.T, a *fabric.Agent, truth holdings, name string, n int, seed uint64) *client.BlockSet {
	t.Helper()
	ctx := context.Background()
	c := dial(t, a)
	set := register(t, c, client.Engine{Name: name, Model: microModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: n})
	slots, err := c.Allocate(ctx, set.ID, n)
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = (seed<<32 | uint64(i)) * 0x9e3779b97f4a7c15
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
		t.Fatal(err)
	}
	if truth[a.NodeName()] == nil {
		truth[a.NodeName()] = map[uint64]bool{}
	}
	for _, h := range hashes {
		truth[a.NodeName()][h] = true
	}
	return set
}

// checkSlices reports how the owners' slices differ from truth: each
// live node must index, for each hash it owns, exactly the live nodes
// that hold it, and nothing else; and every node must agree on the
// members.
func checkSlices(live []*fabric.Agent, truth holdings) error {
	var names []string
	for _, a := range live {
		names = append(names, a.NodeName())
	}
	slices.Sort(names)
	holders := map[uint64][]string{}
	for _, n := range names {
		for h := range truth[n] {
			holders[h] = append(holders[h], n)
		}
	}
	for _, a := range live {
		if m := fabric.IndexMembers(a); !slices.Equal(m, names) {
			return fmt.Errorf("%s places over %v, the live nodes are %v", a.NodeName(), m, names)
		}
		var want int64
		for h, hs := range holders {
			owners := fabric.IndexOwners(a, h)
			got := fabric.IndexHolders(a, h)
			slices.Sort(got)
			if !slices.Contains(owners, a.NodeName()) {
				if len(got) > 0 {
					return fmt.Errorf("%s does not own %#x but indexes %v", a.NodeName(), h, got)
				}
				continue
			}
			want += int64(len(hs))
			if !slices.Equal(got, hs) {
				return fmt.Errorf("%s owns %#x and indexes %v, the holders are %v", a.NodeName(), h, got, hs)
			}
		}
		if got := fabric.IndexPairs(a); got != want {
			return fmt.Errorf("%s indexes %d pairs, owns %d", a.NodeName(), got, want)
		}
	}
	return nil
}

// Owners hand their slices on as members join and leave: after each change
// every owner indexes exactly the blocks live nodes hold.
func TestOwnedIndexChurn(t *testing.T) {
	const blocks = 200
	agents := clusterWith(t, 5, func(_ int, c *fabric.Config) {
		c.IndexMode = fabric.IndexOwned
		c.IndexReplicas = 2
		c.BlockSetGrace = 100 * time.Millisecond // a dropped set's blocks go at once
		c.NoOrphanCache = true                   // rather than stay as a cache
	})
	truth := holdings{}
	for i, a := range agents {
		registerHashes(t, a, truth, "e", blocks, uint64(i+1))
	}
	// Blocks two nodes both hold.
	shared := registerHashes(t, agents[1], truth, "shared", 50, 100)
	registerHashes(t, agents[2], truth, "shared", 50, 100)
	live := slices.Clone(agents)
	settle := func(what string) {
		t.Helper()
		wait.For(t, 30*time.Second, "the owners' slices hold the live nodes' blocks "+what, func() error {
			return checkSlices(live, truth)
		})
	}
	settle("at start")

	// A join: the newcomer takes its share of every slice.
	c := testConfig(t, "n6")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.6:0", "127.0.0.6:0", "off"
	c.Join = []string{agents[0].GossipAddr()}
	c.IndexMode, c.IndexReplicas = fabric.IndexOwned, 2
	c.DevCADir = devCADirOf(agents[0])
	n6 := startAgent(t, c)
	live = append(live, n6)
	registerHashes(t, n6, truth, "e", blocks, 6)
	settle("after n6 joined")

	// Removes: a dropped block set's blocks leave the index once its
	// grace is over.
	if _, err := dial(t, agents[1]).DropBlockSet(context.Background(), shared.ID); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		delete(truth["n2"], (uint64(100)<<32|uint64(i))*0x9e3779b97f4a7c15)
	}
	settle("after n2 dropped a block set")

	// A leave: the owners that gain its hashes are sent them by their
	// holders, and its own blocks leave every slice.
	if err := agents[3].Close(); err != nil {
		t.Fatal(err)
	}
	live = slices.DeleteFunc(live, func(a *fabric.Agent) bool { return a == agents[3] })
	settle("after n4 left")

	// Every live node's blocks are found by a node that owns none of them.
	for _, a := range live {
		for h := range truth[a.NodeName()] {
			waitHolders(t, live[0], []uint64{h}, holdersOf(live, truth, h))
			break
		}
	}
}

// holdersOf is the lookup answer truth gives for h over live.
func holdersOf(live []*fabric.Agent, truth holdings, h uint64) map[string]int {
	out := map[string]int{}
	for _, a := range live {
		if truth[a.NodeName()][h] {
			out[a.NodeName()] = 1
		}
	}
	return out
}

// devCADirOf is the development CA directory a's cluster shares.
func devCADirOf(a *fabric.Agent) string { return fabric.AgentConfig(a).DevCADir }
