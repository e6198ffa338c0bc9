package fabric

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// The holder serves reads only inside the slots a peer's own lease holds,
// whichever way a segment walks.
func TestHolderCheckRead(t *testing.T) {
	a := startHolder(t, nil)
	m := layout.ModelConfig{Layers: 2, KVHeads: 2, HeadDim: 8, DType: layout.DTypeF16}
	s, err := a.blockSetFor("e", &layout.Layout{Model: m, PageSize: 4, TPSize: 1, Order: layout.NHD, Arrangement: layout.LayerSeparate, Alignment: 64, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := s.set.Allocate(3)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range blocks {
		s.set.Commit(b)
		if _, err := s.set.Register(b, uint64(100+i), 0); err != nil {
			t.Fatal(err)
		}
	}
	h := a.service
	lease, err := h.Lease(context.Background(), "peer", []uint64{101}, time.Minute)
	if err != nil || lease.ID == 0 || !lease.Blocks[0].Present {
		t.Fatalf("lease: %+v %v", lease, err)
	}
	l := s.set.Layout()
	st := l.Strides()
	slot := int(lease.Blocks[0].Slot)
	row := uint64(m.KVHeads*m.HeadDim) * 2
	set := uint64(s.set.ID())
	// Per-token rows of both layers' K and V of the leased slot.
	ok := []layout.Segment{
		{SrcOffset: l.ChunkOffset(slot, 0, 0), Length: row, Count: 8, SrcStride: row, DstStride: row},
		{SrcOffset: l.ChunkOffset(slot, 0, 0), Length: row, Count: 2, SrcStride: st.Layer, DstStride: row},
	}
	for _, seg := range ok {
		if err := h.CheckRead("peer", lease.ID, set, seg); err != nil {
			t.Errorf("%+v: %v", seg, err)
		}
	}
	bad := []layout.Segment{
		// Rows that run on into the next slot.
		{SrcOffset: l.ChunkOffset(slot, 0, 0), Length: row, Count: 9, SrcStride: row, DstStride: row},
		// The same chunk of the next slot, a block stride on.
		{SrcOffset: l.ChunkOffset(slot, 1, 0), Length: row, Count: 2, SrcStride: st.Block, DstStride: row},
		// Another slot altogether.
		{SrcOffset: l.ChunkOffset(slot+1, 0, 0), Length: row, Count: 1},
	}
	for _, seg := range bad {
		if err := h.CheckRead("peer", lease.ID, set, seg); !errors.Is(err, transfer.ErrLeaseRefused) {
			t.Errorf("%+v: err = %v, want refused", seg, err)
		}
	}
	if err := h.CheckRead("other-peer", lease.ID, set, ok[0]); !errors.Is(err, transfer.ErrLeaseRefused) {
		t.Errorf("another peer's read under this lease: err = %v, want refused", err)
	}
	if valid, err := h.Release(context.Background(), "peer", lease.ID); err != nil || !valid {
		t.Errorf("release: %v %v", valid, err)
	}
	if err := h.CheckRead("peer", lease.ID, set, ok[0]); !errors.Is(err, transfer.ErrLeaseRefused) {
		t.Errorf("read after release: err = %v, want refused", err)
	}
}

// The holder decides how long its memory is pinned: a lease or renewal
// gets at most the holder's LeaseDuration whatever the peer asks, and the
// answer names the digest of the leased block set's layout.
func TestHolderGrantsItsOwnTerm(t *testing.T) {
	a := startHolder(t, func(c *Config) {
		c.LeaseDuration = 5 * time.Second
	})
	m := layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 8, DType: layout.DTypeF16}
	s, err := a.blockSetFor("e", &layout.Layout{Model: m, PageSize: 4, TPSize: 1, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 64, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := s.set.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	s.set.Commit(blocks[0])
	if _, err := s.set.Register(blocks[0], 7, 0); err != nil {
		t.Fatal(err)
	}
	h := a.service
	ctx := context.Background()
	for _, tc := range []struct{ ask, want time.Duration }{
		{time.Minute, 5 * time.Second},     // more than the holder grants
		{5 * time.Second, 5 * time.Second}, // exactly its term
		{2 * time.Second, 2 * time.Second}, // less: the importer may ask for less
	} {
		l, err := h.Lease(ctx, "peer", []uint64{7}, tc.ask)
		if err != nil || l.ID == 0 {
			t.Fatalf("lease for %v: %+v %v", tc.ask, l, err)
		}
		if l.Duration != tc.want {
			t.Errorf("lease asked for %v granted %v, want %v", tc.ask, l.Duration, tc.want)
		}
		d := s.set.Layout().Digest()
		if got := l.LayoutDigests[uint64(s.set.ID())]; string(got) != string(d[:]) {
			t.Errorf("lease names layout digest %x for block set %d, want %x", got, s.set.ID(), d[:])
		}
		before := time.Now()
		if d, err := h.Renew(ctx, "peer", l.ID, tc.ask); d != tc.want || err != nil {
			t.Errorf("renewal asked for %v granted %v (%v), want %v as the lease", tc.ask, d, err, tc.want)
		}
		if d, err := h.Renew(ctx, "peer", l.ID, time.Hour); d != 5*time.Second || err != nil {
			t.Fatalf("renewal asked for an hour: %v %v, want the holder's 5s", d, err)
		}
		h.book.mu.Lock()
		deadline := h.book.leases[pool.LeaseID(l.ID)].deadline
		h.book.mu.Unlock()
		if got := deadline.Sub(before); got > 5*time.Second+time.Second {
			t.Errorf("renewal asked for an hour runs %v, want at most the holder's 5s", got)
		}
		if valid, err := h.Release(ctx, "peer", l.ID); !valid || err != nil {
			t.Fatalf("release: %v %v", valid, err)
		}
	}
}

// A peer that leases the whole pool gets its share (half the slots by
// default) and is refused past it, with an error naming the cap; all
// peers together get three quarters. Room comes back as leases end, and
// a departed peer's leases end at once.
func TestHolderLeaseCaps(t *testing.T) {
	a := startHolder(t, nil)
	m := layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 8, DType: layout.DTypeF16}
	s, err := a.blockSetFor("e", &layout.Layout{Model: m, PageSize: 4, TPSize: 1, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 64, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, 8)
	blocks, err := s.set.Allocate(8)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range blocks {
		hashes[i] = uint64(100 + i)
		s.set.Commit(b)
		if _, err := s.set.Register(b, hashes[i], 0); err != nil {
			t.Fatal(err)
		}
	}
	h := a.service
	ctx := context.Background()
	present := func(l transfer.Lease) int {
		n := 0
		for _, b := range l.Blocks {
			if b.Present {
				n++
			}
		}
		return n
	}
	// p1 asks for the whole pool: it gets its cap of 4 (half of 8).
	l1, err := h.Lease(ctx, "p1", hashes, time.Minute)
	if err != nil || present(l1) != 4 || !l1.Capped {
		t.Fatalf("p1's lease of the whole pool: %d blocks (capped %v), %v; want its cap of 4, marked capped", present(l1), l1.Capped, err)
	}
	// At its cap, p1 gets nothing more, and is told why.
	_, err = h.Lease(ctx, "p1", hashes[4:5], time.Minute)
	if !errors.Is(err, transfer.ErrUnavailable) || !strings.Contains(err.Error(), "cap 4 per peer") {
		t.Fatalf("p1 past its cap: err = %v, want unavailable naming the cap", err)
	}
	// p2 fits exactly its own cap's worth... but only 2 are left under
	// the total cap of 6.
	l2, err := h.Lease(ctx, "p2", hashes, time.Minute)
	if err != nil || present(l2) != 2 {
		t.Fatalf("p2's lease with 2 blocks left under the total cap: %d blocks, %v", present(l2), err)
	}
	if _, err = h.Lease(ctx, "p3", hashes[:1], time.Minute); !errors.Is(err, transfer.ErrUnavailable) || !strings.Contains(err.Error(), "(cap 6)") {
		t.Fatalf("p3 past the total cap: err = %v, want unavailable naming the cap", err)
	}
	// p1 goes: its leases end at once and its room is free again.
	h.peerGone("p1", "test")
	if got := a.pool.Metrics().Leases; got != 1 {
		t.Fatalf("%d leases live after p1 went, want p2's 1", got)
	}
	if valid, _ := h.Release(ctx, "p1", l1.ID); valid {
		t.Fatal("p1's lease is still valid after p1 went")
	}
	l3, err := h.Lease(ctx, "p3", hashes[:4], time.Minute)
	if err != nil || present(l3) != 4 || l3.Capped {
		t.Fatalf("p3 after p1 went: %d blocks (capped %v), %v; want 4, not capped", present(l3), l3.Capped, err)
	}
}

// startHolder starts a loopback agent for the holder-side tests, with
// tweak, if set, applied to its configuration first.
func startHolder(t *testing.T, tweak func(*Config)) *Agent {
	t.Helper()
	dir := t.TempDir()
	c := DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = "h1", dir, filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "off"
	c.Pools = []string{"host=16MiB"}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if tweak != nil {
		tweak(&c)
	}
	a, err := Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// A release's mismatch claims act only on the blocks its lease pinned: a
// block it pinned whose bytes changed is checked and withdrawn, and every
// other hash it names (a changed block it did not pin, one named twice,
// one not here) is refused unchecked and counted. Up to every block the
// lease holds is checked; one past them is not.
func TestMismatchedOnlyForTheLeasesBlocks(t *testing.T) {
	a := startHolder(t, nil)
	const n = 6
	s, hashes, blocks := summedBlocks(t, a, n)
	// Every block but the last changes after registration: each one the
	// holder sums is withdrawn, so a block still registered was never
	// summed.
	for _, b := range blocks[:n-1] {
		s.change(b)
	}
	registered := func(h uint64) bool { _, ok := s.set.Lookup(h); return ok }
	h := a.service
	ctx := context.Background()

	// A lease of two changed blocks and the good one names all three,
	// one changed and the good one twice, two changed blocks it did not
	// pin and a hash not here.
	leased := []uint64{hashes[0], hashes[1], hashes[n-1]}
	l, err := h.Lease(ctx, "peer", leased, time.Minute)
	if err != nil || l.ID == 0 {
		t.Fatalf("lease: %+v %v", l, err)
	}
	h.Mismatched(ctx, "peer", l.ID, []uint64{hashes[2], hashes[0], hashes[n-1], hashes[3], hashes[1], hashes[0], 999, hashes[n-1]})
	for i, want := range []bool{false, false, true, true, true, true} {
		if got := registered(hashes[i]); got != want {
			t.Errorf("block %d registered: %v, want %v (leased: %v)", i, got, want, slices.Contains(leased, hashes[i]))
		}
	}
	// Refused: the two blocks not pinned, the hash not here, and the two
	// named twice.
	if got := a.Metrics(); got.ChecksumWithdrawn != 2 || got.ChecksumClaimsRefused != 5 {
		t.Errorf("withdrew %d, refused %d claims; want the 2 changed leased blocks withdrawn, 5 claims refused", got.ChecksumWithdrawn, got.ChecksumClaimsRefused)
	}
	if valid, err := h.Release(ctx, "peer", l.ID); !valid || err != nil {
		t.Fatalf("release: %v %v", valid, err)
	}

	// Another peer's claim under this peer's lease, and a claim under a
	// lease released, act on nothing.
	l, err = h.Lease(ctx, "peer", hashes[2:3], time.Minute)
	if err != nil || l.ID == 0 {
		t.Fatalf("lease: %+v %v", l, err)
	}
	h.Mismatched(ctx, "other", l.ID, hashes[2:3])
	if !registered(hashes[2]) {
		t.Fatal("a claim by another peer withdrew a block")
	}
	if valid, err := h.Release(ctx, "peer", l.ID); !valid || err != nil {
		t.Fatalf("release: %v %v", valid, err)
	}
	h.Mismatched(ctx, "peer", l.ID, hashes[2:3])
	if !registered(hashes[2]) {
		t.Fatal("a claim under a released lease withdrew a block")
	}
	if got := a.Metrics(); got.ChecksumWithdrawn != 2 {
		t.Errorf("withdrew %d blocks, want still 2", got.ChecksumWithdrawn)
	}
}

// A block two readers leased and both found changed is withdrawn on the
// first one's claim; the second one's claim about it is done with, not
// refused (the block is gone from the registry, but its lease pinned it),
// and does not act on a block of the same hash registered again since in
// another slot, which its lease did not pin.
func TestMismatchedAfterAnotherReaderWithdrewTheBlock(t *testing.T) {
	var logs syncLog
	a := startHolder(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	s, hashes, blocks := summedBlocks(t, a, 2)
	s.change(blocks[0])
	h := a.service
	ctx := context.Background()
	var leases []uint64
	for _, peer := range []string{"p1", "p2"} {
		l, err := h.Lease(ctx, peer, hashes[:1], time.Minute)
		if err != nil || l.ID == 0 {
			t.Fatalf("lease: %+v %v", l, err)
		}
		leases = append(leases, l.ID)
	}
	h.Mismatched(ctx, "p1", leases[0], hashes[:1])
	if _, ok := s.set.Lookup(hashes[0]); ok {
		t.Fatal("the changed block is still registered after the first reader's claim")
	}
	// The same block registered again, in another slot, and changed.
	again := s.register(t, hashes[0], 9)
	s.change(again)
	h.Mismatched(ctx, "p2", leases[1], hashes[:1])
	if b, ok := s.set.Lookup(hashes[0]); !ok || b.Slot != again.Slot {
		t.Errorf("the block registered again in slot %d: lookup %+v %v; want it left, its lease never pinned it", again.Slot, b, ok)
	}
	if got := a.Metrics(); got.ChecksumWithdrawn != 1 || got.ChecksumClaimsRefused != 0 {
		t.Errorf("withdrew %d, refused %d claims; want 1 withdrawn, none refused", got.ChecksumWithdrawn, got.ChecksumClaimsRefused)
	}
	if strings.Contains(logs.String(), "refused unchecked") {
		t.Errorf("the second reader's claim was logged as refused:\n%s", logs.String())
	}
}

// A peer's releases that keep naming blocks their leases did not pin are
// each counted, claim by claim, but logged once per peer in the agent's
// window for repeats, not once per release.
func TestMismatchedRefusalsLoggedOncePerPeer(t *testing.T) {
	var logs syncLog
	a := startHolder(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	_, hashes, _ := summedBlocks(t, a, 1)
	h := a.service
	ctx := context.Background()
	want := uint64(0)
	for _, peer := range []string{"p1", "p2"} {
		for i := range 5 {
			l, err := h.Lease(ctx, peer, hashes, time.Minute)
			if err != nil || l.ID == 0 {
				t.Fatalf("lease: %+v %v", l, err)
			}
			junk := make([]uint64, i+1)
			for k := range junk {
				junk[k] = uint64(1000 + k)
			}
			h.Mismatched(ctx, peer, l.ID, junk)
			want += uint64(len(junk))
			if valid, err := h.Release(ctx, peer, l.ID); !valid || err != nil {
				t.Fatalf("release: %v %v", valid, err)
			}
		}
	}
	if got := a.Metrics().ChecksumClaimsRefused; got != want {
		t.Errorf("%d claims counted refused, want %d", got, want)
	}
	var warned []string
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, "refused unchecked") {
			warned = append(warned, line)
		}
	}
	if len(warned) != 2 || !strings.Contains(warned[0], "peer=p1") || !strings.Contains(warned[1], "peer=p2") {
		t.Errorf("warned %d times, want once for p1 and once for p2:\n%s", len(warned), strings.Join(warned, "\n"))
	}
}

// claimSums counts the blocks a holder's Mismatched sums, per peer, and
// runs then, if set, the function given to onSum.
type claimSums struct {
	mu    sync.Mutex
	n     map[string]int
	onSum func()
}

func (c *claimSums) hook(peer string, _, _ uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[peer]++
	if c.onSum != nil {
		c.onSum()
	}
}

func (c *claimSums) of(peer string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[peer]
}

// A peer that sends the release of one lease many times at once, each
// naming every block the lease pinned as failing, makes the holder sum
// each of those blocks once in all: the first call's claims are checked
// (the changed block withdrawn, the good ones kept), every other call's
// are refused unchecked and counted. Another peer's lease of the same
// blocks, its release sent meanwhile, gets its own check.
func TestMismatchedChecksALeasesClaimsOnce(t *testing.T) {
	var sums claimSums
	a := startHolder(t, func(c *Config) { c.hooks.claimSummed = sums.hook })
	s, hashes, blocks := summedBlocks(t, a, 3)
	s.change(blocks[0])
	h := a.service
	ctx := context.Background()
	l1, err := h.Lease(ctx, "p1", hashes, time.Minute)
	if err != nil || l1.ID == 0 {
		t.Fatalf("lease: %+v %v", l1, err)
	}
	l2, err := h.Lease(ctx, "p2", hashes[1:2], time.Minute)
	if err != nil || l2.ID == 0 {
		t.Fatalf("lease: %+v %v", l2, err)
	}
	const calls = 16
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			h.Mismatched(ctx, "p1", l1.ID, hashes)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		<-start
		h.Mismatched(ctx, "p2", l2.ID, hashes[1:2])
	}()
	close(start)
	wg.Wait()
	if got := sums.of("p1"); got != len(hashes) {
		t.Errorf("%d releases of one lease of %d blocks made the holder sum %d blocks, want %d", calls, len(hashes), got, len(hashes))
	}
	if got := sums.of("p2"); got != 1 {
		t.Errorf("another peer's release of its own lease of a block summed %d blocks, want 1", got)
	}
	if _, ok := s.set.Lookup(hashes[0]); ok {
		t.Error("the changed block is still registered")
	}
	for _, x := range hashes[1:] {
		if _, ok := s.set.Lookup(x); !ok {
			t.Errorf("good block %d withdrawn", x)
		}
	}
	if got := a.Metrics(); got.ChecksumWithdrawn != 1 || got.ChecksumClaimsRefused != (calls-1)*uint64(len(hashes)) {
		t.Errorf("withdrew %d, refused %d claims; want 1 withdrawn, the %d claims of the %d releases after the first refused",
			got.ChecksumWithdrawn, got.ChecksumClaimsRefused, (calls-1)*len(hashes), calls-1)
	}
	if valid, err := h.Release(ctx, "p1", l1.ID); !valid || err != nil {
		t.Fatalf("release: %v %v", valid, err)
	}
	if valid, err := h.Release(ctx, "p2", l2.ID); !valid || err != nil {
		t.Fatalf("release: %v %v", valid, err)
	}
}

// A release that runs past the holder's limit on its sums (PeerTimeout)
// as it checks leaves the rest unchecked, and a release of the lease after
// it checks nothing.
func TestMismatchedClaimsCheckedByALiveCall(t *testing.T) {
	var sums claimSums
	var taken atomic.Int32
	var stop atomic.Pointer[context.CancelFunc]
	a := startHolder(t, func(c *Config) {
		c.hooks.claimSummed = sums.hook
		c.hooks.claimsTaken = func(_ string, _ uint64, end context.CancelFunc) {
			taken.Add(1)
			stop.Store(&end)
		}
	})
	s, hashes, blocks := summedBlocks(t, a, 2)
	for _, b := range blocks {
		s.change(b)
	}
	registered := func(h uint64) bool { _, ok := s.set.Lookup(h); return ok }
	h := a.service
	l, err := h.Lease(context.Background(), "peer", hashes, time.Minute)
	if err != nil || l.ID == 0 {
		t.Fatalf("lease: %+v %v", l, err)
	}
	// The first release runs past the holder's limit as it sums its
	// first block.
	sums.mu.Lock()
	sums.onSum = func() { (*stop.Load())() }
	sums.mu.Unlock()
	h.Mismatched(context.Background(), "peer", l.ID, hashes)
	if got := sums.of("peer"); got != 1 || registered(hashes[0]) || !registered(hashes[1]) {
		t.Fatalf("a release past the holder's limit as it summed its first block: %d blocks summed, registered %v %v; want the first summed and withdrawn, the second left",
			got, registered(hashes[0]), registered(hashes[1]))
	}
	h.Mismatched(context.Background(), "peer", l.ID, hashes)
	if got := sums.of("peer"); got != 1 || !registered(hashes[1]) {
		t.Fatalf("a release after the one that checked its lease's claims summed %d blocks in all, want still 1", got)
	}
	if got := a.Metrics(); got.ChecksumWithdrawn != 1 || got.ChecksumClaimsRefused != uint64(len(hashes)) {
		t.Errorf("withdrew %d, refused %d claims; want 1 withdrawn, the last release's %d claims refused", got.ChecksumWithdrawn, got.ChecksumClaimsRefused, len(hashes))
	}
}

// A release whose call took up its lease's claims and then ended, before
// it summed a block or as it summed one, still checks them all: the
// server (transfer's release method) releases the lease as soon as
// Mismatched returns, whatever the call's ctx says, so no later release of
// the lease could check them. Driven in the server's order: Mismatched,
// then Release.
func TestMismatchedClaimsCheckedPastTheCallersEnd(t *testing.T) {
	for _, tc := range []struct {
		desc   string
		atSum  bool // the call ends as its first block is summed
		before bool // the call had ended before Mismatched began
	}{
		{"the call ended before a block was summed", false, false},
		{"the call ended as its first block was summed", true, false},
		{"the call had ended before the claims were looked at", false, true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			var sums claimSums
			var taken func()
			a := startHolder(t, func(c *Config) {
				c.hooks.claimSummed = sums.hook
				c.hooks.claimsTaken = func(string, uint64, context.CancelFunc) { taken() }
			})
			s, hashes, blocks := summedBlocks(t, a, 2)
			for _, b := range blocks {
				s.change(b)
			}
			registered := func(h uint64) bool { _, ok := s.set.Lookup(h); return ok }
			h := a.service
			l, err := h.Lease(context.Background(), "peer", hashes, time.Minute)
			if err != nil || l.ID == 0 {
				t.Fatalf("lease: %+v %v", l, err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			taken = func() {
				if !tc.atSum {
					cancel()
				}
			}
			if tc.atSum {
				sums.onSum = cancel
			}
			if tc.before {
				cancel()
			}
			h.Mismatched(ctx, "peer", l.ID, hashes)
			if ctx.Err() == nil {
				t.Fatal("the call's ctx did not end while Mismatched checked its claims")
			}
			if valid, err := h.Release(ctx, "peer", l.ID); !valid || err != nil {
				t.Fatalf("release after the claims: %v %v", valid, err)
			}
			if got := sums.of("peer"); got != len(hashes) || registered(hashes[0]) || registered(hashes[1]) {
				t.Fatalf("the lease released: %d blocks summed, registered %v %v; want both summed and withdrawn",
					got, registered(hashes[0]), registered(hashes[1]))
			}
			if got := a.Metrics(); got.ChecksumWithdrawn != uint64(len(hashes)) || got.ChecksumClaimsRefused != 0 {
				t.Errorf("withdrew %d, refused %d claims; want %d withdrawn, none refused",
					got.ChecksumWithdrawn, got.ChecksumClaimsRefused, len(hashes))
			}
		})
	}
}

// Renewals keep a lease alive up to the holder's MaxLeaseAge and no
// further: one asked for at that age is granted its term, one a
// nanosecond past it is refused with an error naming the limit, counted,
// and the lease ends with the term it has (its pool deadline unmoved,
// still valid at its release until then). Asked again, the renewal is
// refused as before and not counted again; a lease past the age whose
// pool lease has ended (the book not yet told) is answered as ended, not
// counted. Unset, the limit is DefaultMaxLeaseAge.
func TestHolderRefusesRenewalPastMaxLeaseAge(t *testing.T) {
	if c := DefaultConfig(); c.MaxLeaseAge != DefaultMaxLeaseAge || DefaultMaxLeaseAge != 10*time.Minute {
		t.Fatalf("default max lease age %v (DefaultMaxLeaseAge %v), want 10m", c.MaxLeaseAge, DefaultMaxLeaseAge)
	}
	const limit = 2 * time.Minute
	a := startHolder(t, func(c *Config) {
		c.LeaseDuration = 5 * time.Second
		c.MaxLeaseAge = limit
	})
	m := layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 8, DType: layout.DTypeF16}
	s, err := a.blockSetFor("e", &layout.Layout{Model: m, PageSize: 4, TPSize: 1, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 64, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := s.set.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	s.set.Commit(blocks[0])
	if _, err := s.set.Register(blocks[0], 7, 0); err != nil {
		t.Fatal(err)
	}
	h := a.service
	ctx := context.Background()
	l, err := h.Lease(ctx, "peer", []uint64{7}, time.Minute)
	if err != nil || l.ID == 0 {
		t.Fatalf("lease: %+v %v", l, err)
	}
	h.book.mu.Lock()
	granted := h.book.leases[pool.LeaseID(l.ID)].granted
	h.book.mu.Unlock()
	for _, age := range []time.Duration{limit / 2, limit} {
		if d, err := h.renew("peer", l.ID, time.Minute, granted.Add(age)); d != 5*time.Second || err != nil {
			t.Fatalf("renewal at age %v (limit %v): %v %v, want the 5s term", age, limit, d, err)
		}
	}
	deadline, err := a.pool.LeaseDeadline(pool.LeaseID(l.ID))
	if err != nil {
		t.Fatal(err)
	}
	for i, past := range []time.Duration{1, time.Minute} {
		d, err := h.renew("peer", l.ID, time.Minute, granted.Add(limit+past))
		if d != 0 || !errors.Is(err, transfer.ErrLeaseRefused) || !strings.Contains(err.Error(), "max lease age of 2m (--max-lease-age)") {
			t.Fatalf("renewal %v past the max lease age: %v %v, want refused naming the limit", past, d, err)
		}
		if got, err := a.pool.LeaseDeadline(pool.LeaseID(l.ID)); err != nil || !got.Equal(deadline) {
			t.Fatalf("refused renewal %d: the lease's deadline %v (%v), want %v unmoved", i+1, got, err, deadline)
		}
		if got := a.Metrics().LeaseRenewalsRefused; got != 1 {
			t.Errorf("after refused renewal %d: %d leases counted refused, want 1", i+1, got)
		}
	}
	// Refused, the lease still runs out its term.
	if valid, err := h.Release(ctx, "peer", l.ID); !valid || err != nil {
		t.Fatalf("release within the term after a refused renewal: %v %v, want valid", valid, err)
	}

	// A lease the pool has ended but the book still has (it drops
	// entries past their deadline only in passing).
	l, err = h.Lease(ctx, "peer", []uint64{7}, time.Minute)
	if err != nil || l.ID == 0 {
		t.Fatalf("lease: %+v %v", l, err)
	}
	if _, err := a.pool.ReleaseLease(pool.LeaseID(l.ID)); err != nil {
		t.Fatal(err)
	}
	if d, err := h.renew("peer", l.ID, time.Minute, time.Now().Add(limit+time.Minute)); d != 0 || err != nil {
		t.Fatalf("renewal past the max lease age of a lease ended: %v %v, want 0, nil (ended)", d, err)
	}
	if got := a.Metrics().LeaseRenewalsRefused; got != 1 {
		t.Errorf("%d leases counted refused, want still 1 (an ended lease is not refused)", got)
	}
}

// hostBlocks is a host block set of the holder-side tests, with its bytes.
type hostBlocks struct {
	*engineSet
	regions [][]byte
}

// summedBlocks registers n blocks (hashes 100 on) in a new host block set
// of a, each with the checksum of its bytes.
func summedBlocks(t *testing.T, a *Agent, n int) (*hostBlocks, []uint64, []pool.Block) {
	t.Helper()
	m := layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 8, DType: layout.DTypeF16}
	es, err := a.blockSetFor("e", &layout.Layout{Model: m, PageSize: 4, TPSize: 1, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 64, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	regions, err := es.set.RegionBytes()
	if err != nil {
		t.Fatal(err)
	}
	s := &hostBlocks{es, regions}
	hashes := make([]uint64, n)
	blocks := make([]pool.Block, n)
	for i := range n {
		hashes[i] = uint64(100 + i)
		blocks[i] = s.register(t, hashes[i], uint64(i+1))
	}
	return s, hashes, blocks
}

// register writes a block of seed's bytes and registers it as hash with
// its checksum.
func (s *hostBlocks) register(t *testing.T, hash, seed uint64) pool.Block {
	t.Helper()
	blocks, err := s.set.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	b := blocks[0]
	kvtest.Fill(s.set.Layout(), s.regions, b.Slot, seed)
	s.set.Commit(b)
	sum, ok := s.takeSum(b.Slot)
	if !ok {
		t.Fatal("no checksum taken of a host block")
	}
	if b, err = s.set.Register(b, hash, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.set.SetSum(b, sum); err != nil {
		t.Fatal(err)
	}
	return b
}

// change writes other bytes into b's slot, as an engine writing into a
// block after registering it would.
func (s *hostBlocks) change(b pool.Block) {
	kvtest.Fill(s.set.Layout(), s.regions, b.Slot, 0xbad)
}

// syncLog collects an agent's log for a test to read while it writes.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A release's sums stop once its lease has left the holder's book: a peer
// that closes its connection (peerGone releases its leases) as the holder
// sums its claims leaves no sums running for a lease released, so that
// reconnecting and leasing again cannot keep sums running past its lease
// cap.
func TestMismatchedStopsOnceThePeerIsGone(t *testing.T) {
	var sums claimSums
	a := startHolder(t, func(c *Config) { c.hooks.claimSummed = sums.hook })
	s, hashes, blocks := summedBlocks(t, a, 2)
	for _, b := range blocks {
		s.change(b)
	}
	h := a.service
	l, err := h.Lease(context.Background(), "peer", hashes, time.Minute)
	if err != nil || l.ID == 0 {
		t.Fatalf("lease: %+v %v", l, err)
	}
	sums.onSum = func() { h.peerGone("peer", "its connection closed") }
	h.Mismatched(context.Background(), "peer", l.ID, hashes)
	if got := sums.of("peer"); got != 1 {
		t.Fatalf("summed %d blocks, want 1: the sums went on after the peer was gone and its lease released", got)
	}
}
