package fabric_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
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

// An engine's RegisterBlocks goes to the pool in runs of at most
// pool.MaxRegisterBatch too, cut where a slot is refused: each slot gets
// its own outcome, a refused slot stays the engine's, and every other slot
// past the limit is registered.
func TestRegisterBlocksInBatches(t *testing.T) {
	n := pool.MaxRegisterBatch + 2
	a := startAgent(t, batchConfig(t))
	ctx := context.Background()
	c := dial(t, a)
	set := register(t, c, client.Engine{Name: "writer", Model: tinyModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: n + 1})
	slots, err := c.Allocate(ctx, set.ID, n+1)
	if err != nil {
		t.Fatal(err)
	}
	hashes := sumHashes(7, n+1)
	for i, s := range slots {
		kvtest.Fill(set.Layout, set.Ranks, int(s), 1+uint64(i))
	}
	// Slot 0 is registered already, under another hash: the pool refuses
	// it. The slot at the batch limit is no longer the engine's: refused
	// before the pool. The extra slot and hash give slot 0's first home.
	if _, err := c.RegisterBlocks(ctx, set.ID, slots[n:], hashes[n:]); err != nil {
		t.Fatal(err)
	}
	req := append([]uint32{slots[n]}, slots[1:n]...)
	gone := pool.MaxRegisterBatch
	if err := c.Free(ctx, set.ID, req[gone:gone+1]); err != nil {
		t.Fatal(err)
	}
	resp, err := c.API().RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: req, Hashes: hashes[:n]})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResults()) != n || len(resp.GetBlocks()) != n-2 {
		t.Fatalf("%d results, %d blocks; want %d and %d", len(resp.GetResults()), len(resp.GetBlocks()), n, n-2)
	}
	for i, r := range resp.GetResults() {
		want := fabricpb.Outcome_OUTCOME_REGISTERED
		if i == 0 || i == gone {
			want = fabricpb.Outcome_OUTCOME_REFUSED
		}
		if r.GetOutcome() != want || r.GetHash() != hashes[i] || r.GetRequestSlot() != req[i] {
			t.Fatalf("result %d: %v, want %s of slot %d", i, r, want, req[i])
		}
		if want == fabricpb.Outcome_OUTCOME_REGISTERED && r.GetSlot() != req[i] {
			t.Fatalf("result %d: slot %d, want its own %d", i, r.GetSlot(), req[i])
		}
		if want == fabricpb.Outcome_OUTCOME_REFUSED && (codes.Code(r.GetCode()) != codes.FailedPrecondition || r.GetReason() == "") {
			t.Fatalf("result %d: refused with %s %q, want FailedPrecondition and a reason", i, codes.Code(r.GetCode()), r.GetReason())
		}
	}
	// Registered past the refusals, each found by its hash in its slot.
	for _, run := range [][2]int{{1, gone}, {gone + 1, n}} {
		got, err := c.Acquire(ctx, set.ID, hashes[run[0]:run[1]])
		if err != nil || len(got) != run[1]-run[0] {
			t.Fatalf("blocks %d..%d: %d found, %v", run[0], run[1]-1, len(got), err)
		}
		for j, b := range got {
			if b.Slot != req[run[0]+j] {
				t.Fatalf("block %d in slot %d, want %d", run[0]+j, b.Slot, req[run[0]+j])
			}
		}
	}
	// The refused registered slot is still the engine's, once.
	if err := c.Release(ctx, set.ID, req[:1]); err != nil {
		t.Fatalf("release of the refused slot: %v", err)
	}
	if err := c.Release(ctx, set.ID, req[:1]); err == nil {
		t.Fatal("the refused slot was released twice")
	}
}
