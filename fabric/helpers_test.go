package fabric_test

// Set-up shared by the agent tests: agents on loopback with a development
// CA, engine clients, block sets.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// testConfig is a loopback agent's configuration with a data directory of
// its own, removed when the test ends, and a quiet logger.
func testConfig(t *testing.T, name string) fabric.Config {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := fabric.DefaultLocalConfig()
	c.NodeName = name
	c.DataDir = dir
	c.DevCADir = filepath.Join(dir, "ca")
	c.GossipAddr = "127.0.0.1:0"
	c.PeerAddr = "127.0.0.1:0"
	c.MetricsAddr = "127.0.0.1:0"
	c.Pools = []string{"host=16MiB"}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c.Dumpable = true // softverbs and softcuda read agents' memory from other processes
	return c
}

func startAgent(t *testing.T, c fabric.Config) *fabric.Agent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := fabric.Start(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// clients caches one engine client per agent for dial.
var clients = map[*fabric.Agent]*client.Client{}

// dial returns the test's shared engine client of a, closed when the test
// ends.
func dial(t *testing.T, a *fabric.Agent) *client.Client {
	if c, ok := clients[a]; ok {
		return c
	}
	c, err := client.Dial(context.Background(), a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	clients[a] = c
	t.Cleanup(func() { c.Close(); delete(clients, a) })
	return c
}

// newClient dials a fresh engine client of a (a session of its own),
// closed when the test ends.
func newClient(t *testing.T, a *fabric.Agent) *client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatalf("dial %s's engine socket: %v", a.NodeName(), err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// register makes (or finds) e's block set on the agent c talks to.
func register(t *testing.T, c *client.Client, e client.Engine) *client.BlockSet {
	t.Helper()
	set, err := c.Register(context.Background(), e)
	if err != nil {
		t.Fatalf("register %s: %v", e.Name, err)
	}
	return set
}

// importChecked imports hashes on a into block set name of testModel under
// TP tp and order, and checks that every block arrived with every byte
// (content ids 1, 2, ...).
func importChecked(t *testing.T, a *fabric.Agent, name string, tp int, order layout.KVOrder, hashes []uint64) (*client.Client, *client.BlockSet, *fabricpb.ImportResponse) {
	t.Helper()
	ctx := context.Background()
	c := dial(t, a)
	set := register(t, c, client.Engine{Name: name, Model: testModel, TPSize: tp, PageSize: 16, Order: order, Slots: 64})
	resp, err := c.Import(ctx, set.ID, hashes)
	if err != nil {
		t.Fatalf("import on %s: %v", a.NodeName(), err)
	}
	if len(resp.Blocks) != len(hashes) {
		t.Fatalf("import on %s brought %d of %d blocks: %s", a.NodeName(), len(resp.Blocks), len(hashes), resp.Error)
	}
	for i, b := range resp.Blocks {
		if err := kvtest.Check(set.Layout, set.Ranks, int(b.Slot), uint64(i+1)); err != nil {
			t.Fatalf("import on %s, block %d: %v", a.NodeName(), i, err)
		}
	}
	return c, set, resp
}

// consume imports hashes on a under TP tp, checks every byte, releases the
// blocks, and returns the holders the import's fetches name.
func consume(t *testing.T, a *fabric.Agent, tp int, order layout.KVOrder, hashes []uint64) []string {
	t.Helper()
	c, set, resp := importChecked(t, a, "consumer", tp, order, hashes)
	var from []string
	for _, f := range resp.Fetches {
		from = append(from, f.Node)
	}
	slots := make([]uint32, len(resp.Blocks))
	for i, b := range resp.Blocks {
		slots[i] = b.Slot
	}
	if err := c.Release(context.Background(), set.ID, slots); err != nil {
		t.Fatal(err)
	}
	return from
}

// importAll imports hashes on a under TP tp and order, checks every byte,
// and returns the transports the import's fetches report.
func importAll(t *testing.T, a *fabric.Agent, tp int, order layout.KVOrder, hashes []uint64) []string {
	t.Helper()
	_, _, resp := importChecked(t, a, fmt.Sprintf("consumer-tp%d", tp), tp, order, hashes)
	var via []string
	for _, f := range resp.Fetches {
		via = append(via, f.Transport)
	}
	return via
}

// waitLookup waits until c's agent indexes one holder of every hash.
func waitLookup(t *testing.T, c *client.Client, hashes []uint64) {
	t.Helper()
	wait.For(t, 10*time.Second, "the importer's index has the holder's blocks", func() error {
		ov, err := c.Lookup(context.Background(), hashes)
		if err != nil || len(ov) == 0 || int(ov[0].Blocks) != len(hashes) {
			return fmt.Errorf("overlaps %v %v", ov, err)
		}
		return nil
	})
}
