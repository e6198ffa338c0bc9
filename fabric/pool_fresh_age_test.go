package fabric_test

import (
	"context"
	"testing"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
)

// EvictionFreshAge reaches the pool: in a set of 64 slots, block 1 is
// stored and hit (acquired again), then 63 blocks are stored and never
// hit. One slot more recycles block 1, the least recently used, by last
// use alone; with a fresh age of one set size it recycles a block never
// hit instead, and block 1 stays.
func TestEvictionFreshAgeKeepsTheBlockHit(t *testing.T) {
	const slots = 64
	for _, tc := range []struct {
		name  string
		age   float64
		stays bool
	}{
		{"by-last-use", 0, false},
		{"fresh-age", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, "fresh-"+tc.name)
			c.EvictionFreshAge = tc.age
			a := startAgent(t, c)
			cl := dial(t, a)
			ctx := context.Background()
			set := register(t, cl, client.Engine{Name: "e", Model: smallModel, TPSize: 1, PageSize: 16,
				Order: layout.HND, Slots: slots})
			store := func(h uint64) {
				t.Helper()
				got, err := cl.Allocate(ctx, set.ID, 1)
				if err != nil {
					t.Fatalf("allocate for block %d: %v", h, err)
				}
				refs, err := cl.RegisterBlocks(ctx, set.ID, got, []uint64{h})
				if err != nil || len(refs) != 1 {
					t.Fatalf("register block %d: %d registered, %v", h, len(refs), err)
				}
				release(t, cl, set.ID, refsSlots(refs))
			}
			store(1)
			held, err := cl.Acquire(ctx, set.ID, []uint64{1})
			if err != nil || len(held) != 1 {
				t.Fatalf("acquire block 1: %d, %v", len(held), err)
			}
			release(t, cl, set.ID, refsSlots(held))
			for h := uint64(100); h < 100+slots-1; h++ {
				store(h)
			}
			if _, err := cl.Allocate(ctx, set.ID, 1); err != nil {
				t.Fatalf("allocate one slot more: %v", err)
			}
			held, err = cl.Acquire(ctx, set.ID, []uint64{1})
			if err != nil {
				t.Fatal(err)
			}
			if stays := len(held) == 1; stays != tc.stays {
				t.Fatalf("block 1 still here: %v, want %v", stays, tc.stays)
			}
			release(t, cl, set.ID, refsSlots(held))
		})
	}
}
