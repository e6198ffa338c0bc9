package fabric_test

import (
	"bytes"
	"context"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
)

// A block set without a tier is a cache that recycles a block only when an
// allocation needs its slot: filled with registered blocks, it keeps every
// one, and one slot more costs one block, the sequence's tail. With
// PoolRecycleAhead it keeps its slots less 5 %, and the allocation that
// leaves fewer free recycles until 10 % are.
func TestPoolRecyclesOnNeed(t *testing.T) {
	const slots = 64
	low, high := int(math.Ceil(0.05*slots)), int(math.Ceil(0.10*slots))
	for _, tc := range []struct {
		name    string
		ahead   bool
		retains int // blocks the set keeps
		kept    int // of them, after one allocation more
	}{
		{"on-need", false, slots, slots - 1},
		{"ahead", true, slots - low, slots - low - (high - (low - 1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, "recycle-"+tc.name)
			c.PoolRecycleAhead = tc.ahead
			a := startAgent(t, c)
			cl := dial(t, a)
			ctx := context.Background()
			set := register(t, cl, client.Engine{Name: "e", Model: smallModel, TPSize: 1, PageSize: 16,
				Order: layout.HND, Slots: slots})
			if set.Retains != tc.retains {
				t.Fatalf("a set of %d slots retains %d blocks, want %d", slots, set.Retains, tc.retains)
			}
			hashes := make([]uint64, tc.retains)
			for i := range hashes {
				hashes[i] = uint64(1000 + i)
			}
			got, err := cl.Allocate(ctx, set.ID, len(hashes))
			if err != nil {
				t.Fatalf("allocate the %d slots the set retains: %v", len(hashes), err)
			}
			refs, err := cl.RegisterBlocks(ctx, set.ID, got, hashes)
			if err != nil || len(refs) != len(hashes) {
				t.Fatalf("register %d blocks: %d registered, %v", len(hashes), len(refs), err)
			}
			release(t, cl, set.ID, refsSlots(refs))
			if held, err := cl.Acquire(ctx, set.ID, hashes); err != nil || len(held) != len(hashes) {
				t.Fatalf("the set holds %d of the %d blocks it retains (%v)", len(held), len(hashes), err)
			} else {
				release(t, cl, set.ID, refsSlots(held))
			}
			if _, err := cl.Allocate(ctx, set.ID, 1); err != nil {
				t.Fatalf("allocate one slot more: %v", err)
			}
			held, err := cl.Acquire(ctx, set.ID, hashes)
			if err != nil {
				t.Fatal(err)
			}
			if len(held) != tc.kept {
				t.Fatalf("after one slot more the set holds the first %d of %d blocks, want %d", len(held), len(hashes), tc.kept)
			}
			release(t, cl, set.ID, refsSlots(held))
		})
	}
}

func refsSlots[T interface{ GetSlot() uint32 }](refs []T) []uint32 {
	out := make([]uint32, len(refs))
	for i, r := range refs {
		out[i] = r.GetSlot()
	}
	return out
}

func release(t *testing.T, cl *client.Client, set uint64, slots []uint32) {
	t.Helper()
	if err := cl.Release(context.Background(), set, slots); err != nil {
		t.Fatalf("release %d blocks: %v", len(slots), err)
	}
}

// PoolRecycleAhead with tiers changes nothing (blocks go down ahead of
// need by the tier watermark) and the agent says so.
func TestPoolRecycleAheadWithTiersWarns(t *testing.T) {
	var logs bytes.Buffer
	var mu sync.Mutex
	c := testConfig(t, "recycle-tiers")
	c.PoolRecycleAhead = true
	c.Tiers = []string{"disk=" + tierDir(t) + ":64MiB"}
	c.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	startAgent(t, c)
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "pool_recycle_ahead has no effect with tiers") {
		t.Fatalf("no warning that pool_recycle_ahead does nothing with tiers in:\n%s", logs.String())
	}
}
