package pool

import (
	"errors"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// A recorded sum travels with the lease; a withdrawn block leaves the
// registry with one remove event, keeps serving the references held on it,
// is recycled once they are gone without a second event, and its hash can
// be registered again meanwhile.
func TestSumAndWithdraw(t *testing.T) {
	var rec recorder
	cfg := testConfig(nil, rec.sink)
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(4, 1, layout.FullyContiguous, 64))
	blk := toState(t, b, Registered, 0xaa)
	if _, ok := b.Sum(blk); ok {
		t.Fatal("a sum before any was recorded")
	}
	if err := b.SetSum(blk, 0x5eed); err != nil {
		t.Fatal(err)
	}
	if sum, ok := b.Sum(blk); !ok || sum != 0x5eed {
		t.Fatalf("sum %x %v", sum, ok)
	}
	id, got, err := b.Lease([]uint64{0xaa}, time.Second)
	if err != nil || !got[0].HasSum || got[0].Sum != 0x5eed {
		t.Fatalf("lease: %+v %v, want the sum", got, err)
	}
	p.ReleaseLease(id)
	if err := b.Withdraw(blk); err != nil {
		t.Fatal(err)
	}
	if err := b.Withdraw(blk); !errors.Is(err, ErrInvalidTransition) {
		t.Fatalf("second withdraw: %v", err)
	}
	if err := b.SetSum(blk, 1); !errors.Is(err, ErrInvalidTransition) {
		t.Fatalf("sum of a withdrawn block: %v", err)
	}
	if _, ok := b.Acquire(0xaa); ok {
		t.Fatal("a withdrawn block acquired")
	}
	if _, got, _ := b.Lease([]uint64{0xaa}, time.Second); got[0].Found {
		t.Fatal("a withdrawn block leased")
	}
	again := toState(t, b, Registered, 0xaa)
	if again.Slot == blk.Slot {
		t.Fatal("the withdrawn slot reused while referenced")
	}
	if err := b.Release(blk); err != nil {
		t.Fatalf("release of the withdrawn block: %v", err)
	}
	if n := b.Evict(1); n != 1 {
		t.Fatalf("evicted %d, want the withdrawn block", n)
	}
	if got, ok := b.Acquire(0xaa); !ok || got.Slot != again.Slot {
		t.Fatalf("the new block of the hash: %v %v", got, ok)
	}
	p.Close()
	evs, _ := rec.events()
	removes := 0
	for _, e := range evs {
		if e.Kind == EventRemove && e.Hash == 0xaa {
			removes++
			if e.Slot != blk.Slot {
				t.Fatalf("remove event for slot %d, want the withdrawn %d", e.Slot, blk.Slot)
			}
		}
	}
	if removes != 1 {
		t.Fatalf("%d remove events for the withdrawn block, want 1", removes)
	}
}
