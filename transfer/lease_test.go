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

// A renewal grants the holder's term, capped as a lease's is: at the cap
// and past it the reader gets the cap, not what it asked for, and a
// handler that grants more than was asked is cut to the ask. The term
// travels on the wire, so the reader learns it.
func TestRenewHonoursHolderCap(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("a", "b")
	h := newMemHandler()
	a := newTestNode(t, ca, "a", members, h)
	b := newTestNode(t, ca, "b", members, nil)
	p := dialPeer(t, b, a)
	ctx := context.Background()
	const holderCap = 2 * time.Second
	capped := func(asked time.Duration) time.Duration { return min(asked, holderCap) }
	generous := func(asked time.Duration) time.Duration { return asked + time.Hour }
	for _, tc := range []struct {
		name  string
		grant func(time.Duration) time.Duration
		ask   time.Duration
		want  time.Duration
	}{
		{"under the cap", capped, time.Second, time.Second},
		{"at the cap", capped, holderCap, holderCap},
		{"past the cap", capped, holderCap + time.Millisecond, holderCap},
		{"far past the cap", capped, 5 * time.Minute, holderCap},
		{"a handler granting more than asked", generous, 3 * time.Second, 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h.setGrant(tc.grant)
			l, err := p.Lease(ctx, []uint64{2}, tc.ask)
			if err != nil {
				t.Fatal(err)
			}
			if l.Duration != tc.want {
				t.Errorf("lease asked for %v granted %v, want %v", tc.ask, l.Duration, tc.want)
			}
			d, err := p.Renew(ctx, l.ID, tc.ask)
			if err != nil || d != tc.want {
				t.Errorf("renewal asked for %v granted %v (%v), want %v as the lease", tc.ask, d, err, tc.want)
			}
		})
	}
	if d, err := p.Renew(ctx, 43, holderCap); err != nil || d != 0 {
		t.Errorf("renewal of a lease the holder does not hold: %v, %v; want 0", d, err)
	}
}

// A holder may cap the term of a lease or a renewal, never lengthen it:
// a grant at the ask is taken, one millisecond past it is a protocol error,
// and so is a count of milliseconds that would overflow a Duration.
func TestGrantNeverLongerThanAsked(t *testing.T) {
	const ask = 3 * time.Second
	for _, tc := range []struct {
		name    string
		granted uint64
		want    time.Duration
		wantErr bool
	}{
		{"nothing", 0, 0, false},
		{"capped", 1500, 1500 * time.Millisecond, false},
		{"at the ask", 3000, ask, false},
		{"one past the ask", 3001, 0, true},
		{"past a Duration", 1 << 63, 0, true},
		{"the largest count", ^uint64(0), 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := grantedByHolder("lease", "h", tc.granted, ask)
			if tc.wantErr {
				if !errors.Is(err, ErrFrame) || got != 0 {
					t.Fatalf("grant of %d ms for %v asked: %v, %v; want ErrFrame", tc.granted, ask, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("grant of %d ms for %v asked: %v, %v; want %v", tc.granted, ask, got, err, tc.want)
			}
		})
	}
}
