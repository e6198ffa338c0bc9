package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// The blocks of a put outlive it: past the grace period its block set is
// kept as a cache, and status says so.
func TestStatusShowsSetKeptAfterItsEngine(t *testing.T) {
	a := startTestAgentWith(t, "cli-orphan", func(c *fabric.Config) { c.BlockSetGrace = 100 * time.Millisecond })
	sock := []string{"--socket", a.EngineSocket()}
	code, _, errs := runCmd(t, "", append([]string{"put", "--generate", "4", "--tp", "1", "--layers", "2", "--head-dim", "16", "--slots", "64"}, sock...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wait.For(t, 10*time.Second, "the put's set kept as a cache", func() error {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		if len(st.BlockSets) != 1 || !st.BlockSets[0].Orphaned || st.BlockSets[0].Registered != 4 {
			return fmt.Errorf("block sets %v", st.BlockSets)
		}
		return nil
	})
	code, out, errs := runCmd(t, "", append([]string{"status"}, sock...)...)
	if code != 0 {
		t.Fatalf("status: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "cached, engine gone") || !strings.Contains(out, "1 block sets (4 blocks) cached after their engines") {
		t.Fatalf("status does not show the kept set:\n%s", out)
	}
}
