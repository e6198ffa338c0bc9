package fabric_test

// Set-up shared by the agent tests: agents on loopback with a development
// CA, engine clients, block sets.

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
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
