package fabric_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
)

// An import registers its blocks with the pool in batches of at most
// pool.MaxRegisterBatch. At the limit and past it (a copy from another
// block set of the node is one run of blocks, not cut into chunks) every
// block lands byte for byte, registered in the importer's set in its own
// slot, with exactly one reference for the engine.
func TestImportRegistersInBatches(t *testing.T) {
	for _, n := range []int{pool.MaxRegisterBatch, pool.MaxRegisterBatch + 1, 2*pool.MaxRegisterBatch + 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			a := startAgent(t, batchConfig(t))
			ctx := context.Background()
			e := client.Engine{Name: "writer", Model: tinyModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: n}
			hashes := sumHashes(uint32(n), n)
			holdBlocks(t, a, e, hashes, 1)
			c := dial(t, a)
			// Another layout: a set of its own, into which the blocks are
			// copied rather than found.
			e.Name, e.Order = "reader", layout.NHD
			set := register(t, c, e)
			resp, err := c.Import(ctx, set.ID, hashes)
			if err != nil || len(resp.GetBlocks()) != n {
				t.Fatalf("import of %d blocks: %d brought, %v", n, len(resp.GetBlocks()), err)
			}
			checkImported(t, set, resp.GetBlocks(), 1)
			for i, r := range resp.GetResults() {
				if r.GetOutcome() != fabricpb.Outcome_OUTCOME_IMPORTED {
					t.Fatalf("block %d: %s, want imported (copied from the writer's set)", i, r.GetOutcome())
				}
			}
			slots := make([]uint32, n)
			seen := make(map[uint32]bool, n)
			for i, b := range resp.GetBlocks() {
				if b.Hash != hashes[i] || b.Duplicate || seen[b.Slot] {
					t.Fatalf("block %d: %+v, want hash %d in a slot of its own", i, b, hashes[i])
				}
				seen[b.Slot] = true
				slots[i] = b.Slot
			}
			// Registered in the reader's set: found there by hash.
			got, err := c.Acquire(ctx, set.ID, hashes)
			if err != nil || len(got) != n {
				t.Fatalf("acquire of the imported blocks: %d found, %v", len(got), err)
			}
			for i, b := range got {
				if b.Slot != slots[i] {
					t.Fatalf("block %d acquired in slot %d, imported into %d", i, b.Slot, slots[i])
				}
			}
			// The import's reference and the acquire's, no more.
			for range 2 {
				if err := c.Release(ctx, set.ID, slots); err != nil {
					t.Fatalf("release: %v", err)
				}
			}
			if err := c.Release(ctx, set.ID, slots[:1]); err == nil {
				t.Fatal("a third release succeeded: the import recorded more than one reference")
			}
		})
	}
}

// batchConfig is one node with room for two engines' sets of 8,195 blocks.
func batchConfig(t *testing.T) fabric.Config {
	c := testConfig(t, "n1")
	c.Pools = []string{"host=300MiB"}
	return c
}
