package transfer

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"
)

// testDigest is the layout digest memHandler's leases name.
var testDigest = sha256.Sum256([]byte("layout-bytes"))

// A lease may ask for MaxLeaseBlocks hashes and no more: the wire refuses
// one more before the holder sees it, as a request error the importer
// caused (never a sign that the holder is unwell).
func TestLeaseBlocksLimit(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("a", "b")
	h := newMemHandler()
	a := newTestNode(t, ca, "a", members, h)
	b := newTestNode(t, ca, "b", members, nil)
	p := dialPeer(t, b, a)
	ctx := context.Background()

	hashes := make([]uint64, MaxLeaseBlocks+1)
	for i := range hashes {
		hashes[i] = uint64(2 * (i + 1))
	}
	l, err := p.Lease(ctx, hashes[:MaxLeaseBlocks], time.Second)
	if err != nil {
		t.Fatalf("lease of %d blocks (the limit): %v", MaxLeaseBlocks, err)
	}
	if len(l.Blocks) != MaxLeaseBlocks || !l.Blocks[MaxLeaseBlocks-1].Present {
		t.Fatalf("lease at the limit answered %d blocks", len(l.Blocks))
	}
	before := h.calls.Load()
	_, err = p.Lease(ctx, hashes, time.Second)
	if !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("lease of %d blocks (one past the limit): err = %v, want ErrInvalidRequest", len(hashes), err)
	}
	if got := h.calls.Load(); got != before {
		t.Errorf("the handler saw the oversized lease (%d calls, %d before)", got, before)
	}
}

// A lease answer must name the layout of every block set it leases from;
// an answer without a well-formed digest is refused, not trusted.
func TestLeaseNeedsLayoutDigest(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("a", "b")
	h := newMemHandler()
	h.badDigest = true
	a := newTestNode(t, ca, "a", members, h)
	b := newTestNode(t, ca, "b", members, nil)
	p := dialPeer(t, b, a)
	_, err := p.Lease(context.Background(), []uint64{2, 4}, time.Second)
	if !errors.Is(err, ErrFrame) {
		t.Fatalf("lease with an 8-byte layout digest: err = %v, want ErrFrame", err)
	}
}
