package fabric_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// maxRegister is the most blocks one RegisterBlocks call may name.
const maxRegister = 1 << 16

// microModel keeps a block's bytes at 64.
var microModel = layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 1, DType: layout.DTypeBF16}

// One RegisterBlocks of the most blocks a call may name stores far more
// events at once than the pool's event buffer holds: the pool drops some,
// and the node republishes its holdings from the pool's registry, so that
// another node indexes every block, and the node's own index agrees.
func TestRegisterBlocksSeenInFull(t *testing.T) {
	// Engines' blocks are 4 KiB aligned: the pool spans 64 Ki of them,
	// though the blocks' bytes are never written (nor resident).
	agents := clusterWith(t, 2, func(_ int, c *fabric.Config) { c.Pools = []string{"host=320MiB"} })
	n1, n2 := agents[0], agents[1]
	ctx := context.Background()
	c := dial(t, n1)
	set, err := c.Register(ctx, client.Engine{Name: "burst", Model: microModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: maxRegister + 1})
	if err != nil {
		t.Fatal(err)
	}
	slots, err := c.Allocate(ctx, set.ID, maxRegister)
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, maxRegister)
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 7
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wait.For(t, 60*time.Second, "both nodes index all of n1's blocks", func() error {
		for _, a := range agents {
			if got := agentStatus(t, a).Members["n1"]; got != maxRegister {
				return fmt.Errorf("%s indexes %d of n1's %d blocks", a.NodeName(), got, maxRegister)
			}
		}
		return nil
	})
	t.Logf("%d blocks registered in one call indexed by n2 %v later", maxRegister, time.Since(start))

	// One more block than a call may name is refused whole.
	more, err := c.Allocate(ctx, set.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	over := append(append([]uint32(nil), slots...), more...)
	if _, err := c.RegisterBlocks(ctx, set.ID, over, append(hashes, 1)); code(err) != codes.InvalidArgument {
		t.Fatalf("RegisterBlocks of %d blocks: %v, want InvalidArgument", len(over), err)
	}
	if got := agentStatus(t, n2).Members["n1"]; got != maxRegister {
		t.Fatalf("after the refused call n2 indexes %d of n1's blocks, want %d", got, maxRegister)
	}
}
