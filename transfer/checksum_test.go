package transfer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// sumHandler is memHandler with content checksums on its leases, and a
// record of the mismatches readers report.
type sumHandler struct {
	*memHandler
	mu         sync.Mutex
	mismatched [][]uint64
	released   bool // Release ran before a report arrived
}

func (h *sumHandler) Lease(ctx context.Context, peer string, hashes []uint64, d time.Duration) (Lease, error) {
	l, err := h.memHandler.Lease(ctx, peer, hashes, d)
	for i := range l.Blocks {
		if l.Blocks[i].Present {
			l.Blocks[i].Sum, l.Blocks[i].HasSum = l.Blocks[i].Hash*3, true
		}
	}
	return l, err
}

func (h *sumHandler) Mismatched(ctx context.Context, peer string, id uint64, hashes []uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mismatched = append(h.mismatched, slices.Clone(hashes))
}

func (h *sumHandler) Release(ctx context.Context, peer string, id uint64) (bool, error) {
	h.mu.Lock()
	h.released = len(h.mismatched) == 0
	h.mu.Unlock()
	return h.memHandler.Release(ctx, peer, id)
}

// Leases carry each block's checksum; a release carries the blocks that
// failed theirs to the holder before the lease ends, up to MaxLeaseBlocks
// of them, and one more is refused before the holder sees it.
func TestChecksumsTravel(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("a", "b")
	h := &sumHandler{memHandler: newMemHandler()}
	a := newTestNode(t, ca, "a", members, h)
	b := newTestNode(t, ca, "b", members, nil)
	p := dialPeer(t, b, a)
	ctx := context.Background()
	l, err := p.Lease(ctx, []uint64{2, 3, 4}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, blk := range l.Blocks {
		if blk.Present != blk.HasSum || (blk.HasSum && blk.Sum != blk.Hash*3) {
			t.Fatalf("block %d: sum %d (has %v), want %d where present", blk.Hash, blk.Sum, blk.HasSum, blk.Hash*3)
		}
	}
	if ok, err := p.Release(ctx, l.ID, 4); err != nil || !ok {
		t.Fatalf("release reporting a mismatch: %v %v", ok, err)
	}
	h.mu.Lock()
	got, early := h.mismatched, h.released
	h.mu.Unlock()
	if len(got) != 1 || !slices.Equal(got[0], []uint64{4}) || early {
		t.Fatalf("holder got reports %v (released first: %v), want [[4]] before the release", got, early)
	}
	many := make([]uint64, MaxLeaseBlocks+1)
	if _, err := p.Release(ctx, 42, many[:MaxLeaseBlocks]...); err != nil {
		t.Fatalf("release reporting %d mismatches (the limit): %v", MaxLeaseBlocks, err)
	}
	if _, err := p.Release(ctx, 42, many...); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("release reporting %d mismatches: %v, want ErrInvalidRequest", len(many), err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.mismatched) != 2 {
		t.Fatalf("the holder saw %d reports, want 2 (the one past the limit refused)", len(h.mismatched))
	}
}
