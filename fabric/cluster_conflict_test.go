package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
)

// Two agents under one node name (cloned hosts keep the host name): the
// second refuses to run, naming the first's address, and the node it
// joined through keeps every block of the first indexed, and imports from
// it, through several push/pull rounds after the duplicate went.
func TestDuplicateNodeNameRefused(t *testing.T) {
	agents := cluster(t, 2)
	n1, n2 := agents[0], agents[1]
	hashes := produce(t, n1, 1, layout.HND, 20)
	indexed := func() error {
		if got := agentStatus(t, n2).Members["n1"]; got != 20 {
			return fmt.Errorf("n2 indexes %d blocks of n1", got)
		}
		return nil
	}
	wait.For(t, 5*time.Second, "n2 indexes n1's blocks", indexed)

	dir := t.TempDir()
	c := fabric.DefaultLocalConfig()
	c.NodeName = "n1"
	c.DataDir = filepath.Join(dir, "dup")
	c.DevCADir = filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.3:0", "127.0.0.3:0", "off"
	c.Pools = []string{"host=64MiB"}
	c.Join = []string{n2.GossipAddr()}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dup, err := fabric.Start(ctx, c)
	if err == nil {
		dup.Close()
		t.Fatal("a second agent named n1 started")
	}
	if !errors.Is(err, membership.ErrNameConflict) || !strings.Contains(err.Error(), n1.GossipAddr()) {
		t.Fatalf("err = %v, want a name conflict naming n1's address %s", err, n1.GossipAddr())
	}

	deadline := time.Now().Add(3 * time.Second) // past several local push/pull rounds
	for time.Now().Before(deadline) {
		if err := indexed(); err != nil {
			t.Fatalf("after the duplicate: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if from := consume(t, n2, 2, layout.NHD, hashes); len(from) != 1 || from[0] != "n1" {
		t.Fatalf("n2 imported from %v, want n1", from)
	}
}
