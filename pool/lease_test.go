package pool

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

func TestLeaseLifecycle(t *testing.T) {
	clock := newManualClock()
	p, b := newTestPool(t, testConfig(clock, nil), testLayout(8, 1, layout.FullyContiguous, 64))
	a := toState(t, b, Registered, 1)
	c := toState(t, b, Registered, 2)
	if err := b.Release(a); err != nil { // a is inactive, c still has a user
		t.Fatal(err)
	}
	id, got, err := b.Lease([]uint64{2, 77, 1, 1}, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	want := []LeasedBlock{
		{Hash: 2, Found: true, Slot: c.Slot, Generation: c.Generation},
		{Hash: 77},
		{Hash: 1, Found: true, Slot: a.Slot, Generation: a.Generation},
		{Hash: 1, Found: true, Slot: a.Slot, Generation: a.Generation},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("answer %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if id == 0 {
		t.Fatal("lease id is zero")
	}
	if m := b.Metrics(); m.Leased != 2 || m.Inactive != 0 || m.Leases != 1 {
		t.Fatalf("while leased: %+v", m)
	}
	// A leased block is never recycled, whatever asks.
	if n := b.Evict(10); n != 0 {
		t.Fatalf("Evict recycled %d leased blocks", n)
	}
	if _, err := b.Allocate(7); !errors.Is(err, ErrExhausted) {
		t.Fatalf("Allocate(7) with 6 free and the rest leased: %v", err)
	}
	clock.Advance(9 * time.Second)
	if err := p.Renew(id, 10*time.Second); err != nil {
		t.Fatalf("renew before the deadline: %v", err)
	}
	clock.Advance(9 * time.Second) // 18 s: past the first deadline, not the renewed one
	if n := p.ExpireLeases(); n != 0 {
		t.Fatalf("%d leases expired before the renewed deadline", n)
	}
	valid, err := p.ReleaseLease(id)
	if err != nil || !valid {
		t.Fatalf("release of a live lease = %v, %v; want valid", valid, err)
	}
	if info, _ := b.Slot(a.Slot); !info.Inactive || info.Leases != 0 {
		t.Errorf("after release the unused block is %+v, want inactive", info)
	}
	if info, _ := b.Slot(c.Slot); info.Inactive || info.Users != 1 {
		t.Errorf("after release the used block is %+v, want active", info)
	}
	if valid, err := p.ReleaseLease(id); valid || !errors.Is(err, ErrUnknownLease) {
		t.Errorf("second release = %v, %v; want false, ErrUnknownLease", valid, err)
	}
	if err := p.Renew(id, time.Second); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("renew after release: %v", err)
	}
	if id, got, err := b.Lease([]uint64{5, 6}, time.Second); id != 0 || err != nil || got[0].Found || got[1].Found {
		t.Errorf("lease of absent hashes = %#x, %+v, %v; want no lease", id, got, err)
	}
	if m := p.Metrics(); m.Leases != 0 {
		t.Errorf("%d leases live at the end", m.Leases)
	}
}

func TestLeaseExpiry(t *testing.T) {
	clock := newManualClock()
	p, b := newTestPool(t, testConfig(clock, nil), testLayout(8, 1, layout.FullyContiguous, 64))
	blk := toState(t, b, Registered, 1)
	if err := b.Release(blk); err != nil {
		t.Fatal(err)
	}
	short, _, _ := b.Lease([]uint64{1}, time.Second)
	long, _, _ := b.Lease([]uint64{1}, time.Minute)
	renewed, _, _ := b.Lease([]uint64{1}, time.Second)
	checked, _, _ := b.Lease([]uint64{1}, time.Second)
	clock.Advance(time.Second)
	// At the deadline a lease is no longer valid, reaped or not.
	if err := p.Renew(renewed, time.Minute); !errors.Is(err, ErrLeaseExpired) {
		t.Errorf("renew at the deadline: %v", err)
	}
	if err := p.CheckRead(checked, b.ID(), 0, 0, 8); !errors.Is(err, ErrLeaseExpired) {
		t.Errorf("read check at the deadline: %v", err)
	}
	if n := p.ExpireLeases(); n != 1 {
		t.Errorf("ExpireLeases reaped %d, want the one lease not reaped yet", n)
	}
	if valid, err := p.ReleaseLease(short); valid || !errors.Is(err, ErrUnknownLease) {
		t.Errorf("release of an expired lease = %v, %v", valid, err)
	}
	if info, _ := b.Slot(blk.Slot); info.Leases != 1 || info.Inactive {
		t.Errorf("slot %+v, want held by the long lease only", info)
	}
	clock.Advance(time.Hour)
	// Released after its deadline but before any reaping: not valid.
	if valid, err := p.ReleaseLease(long); valid || err != nil {
		t.Errorf("late release = %v, %v; want false, nil", valid, err)
	}
	if info, _ := b.Slot(blk.Slot); info.Leases != 0 || !info.Inactive {
		t.Errorf("after every lease ended: %+v, want inactive", info)
	}
	if m := p.Metrics(); m.LeasesExpired != 4 || m.Leases != 0 || m.Leased != 0 {
		t.Errorf("metrics %+v, want 4 expired and none live", m)
	}
}

// LeasedSlots names a live lease's block set and the slots it pinned, each
// once and ascending with the hash it held when leased, a block withdrawn
// since (and its hash registered again elsewhere) included, and nothing
// once the lease has ended. LeaseDeadline gives the lease's deadline, moved
// only by Renew, until then.
func TestLeasedSlots(t *testing.T) {
	clock := newManualClock()
	p, b := newTestPool(t, testConfig(clock, nil), testLayout(8, 1, layout.FullyContiguous, 64))
	x := toState(t, b, Registered, 1)
	y := toState(t, b, Registered, 2)
	toState(t, b, Registered, 3) // registered, not leased
	id, _, err := b.Lease([]uint64{2, 77, 1, 2}, time.Second)
	if err != nil || id == 0 {
		t.Fatalf("lease: %#x %v", id, err)
	}
	want := []LeasedSlot{{x.Slot, 1}, {y.Slot, 2}}
	if y.Slot < x.Slot {
		want[0], want[1] = want[1], want[0]
	}
	set, slots, err := p.LeasedSlots(id)
	if err != nil || set != b.ID() || !slices.Equal(slots, want) {
		t.Fatalf("LeasedSlots = %d, %v, %v; want %d, %v", set, slots, err, b.ID(), want)
	}
	if err := b.Withdraw(y); err != nil {
		t.Fatal(err)
	}
	again := toState(t, b, Registered, 2)
	if _, slots, err := p.LeasedSlots(id); err != nil || !slices.Equal(slots, want) {
		t.Fatalf("block 2 withdrawn and registered again in slot %d: LeasedSlots = %v, %v; want %v", again.Slot, slots, err, want)
	}
	deadline, err := p.LeaseDeadline(id)
	if err != nil || !deadline.Equal(clock.Now().Add(time.Second)) {
		t.Fatalf("LeaseDeadline = %v, %v; want a second from now", deadline, err)
	}
	clock.Advance(time.Second / 2)
	if err := p.Renew(id, time.Second); err != nil {
		t.Fatal(err)
	}
	if d, err := p.LeaseDeadline(id); err != nil || !d.Equal(deadline.Add(time.Second/2)) {
		t.Fatalf("LeaseDeadline after a renewal = %v, %v; want %v", d, err, deadline.Add(time.Second/2))
	}
	clock.Advance(time.Second)
	if _, slots, err := p.LeasedSlots(id); slots != nil || !errors.Is(err, ErrLeaseExpired) {
		t.Errorf("at the deadline: %v, %v; want none, ErrLeaseExpired", slots, err)
	}
	if _, slots, err := p.LeasedSlots(id); slots != nil || !errors.Is(err, ErrUnknownLease) {
		t.Errorf("once reaped: %v, %v; want none, ErrUnknownLease", slots, err)
	}
	if _, err := p.LeaseDeadline(id); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("LeaseDeadline once reaped: %v, want ErrUnknownLease", err)
	}
	if m := p.Metrics(); m.Leases != 0 || m.Leased != 0 {
		t.Errorf("metrics %+v, want the expired lease gone", m)
	}
}

// A reader that dies leaks nothing: the pool's own goroutine reaps.
func TestLeaseExpiryLoop(t *testing.T) {
	clock := newManualClock()
	cfg := testConfig(clock, nil)
	cfg.ExpiryInterval = time.Millisecond
	p, b := newTestPool(t, cfg, testLayout(8, 1, layout.FullyContiguous, 64))
	blk := toState(t, b, Registered, 1)
	b.Release(blk)
	if _, _, err := b.Lease([]uint64{1}, time.Second); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Second)
	wait.For(t, 10*time.Second, "the expiry loop reaps the lease", func() error {
		if n := p.Metrics().Leases; n != 0 {
			return fmt.Errorf("%d leases live", n)
		}
		return nil
	})
	if info, _ := b.Slot(blk.Slot); !info.Inactive {
		t.Errorf("slot %+v, want inactive again", info)
	}
}

func TestLeaseBadRequests(t *testing.T) {
	cfg := testConfig(newManualClock(), nil)
	cfg.MaxLeases = 2
	cfg.MaxLeaseBlocks = 3
	cfg.MaxLeaseDuration = time.Minute
	p, b := newTestPool(t, cfg, testLayout(8, 1, layout.FullyContiguous, 64))
	toState(t, b, Registered, 1)
	cases := []struct {
		desc   string
		hashes []uint64
		d      time.Duration
		want   error
	}{
		{"no hashes", nil, time.Second, ErrBadLease},
		{"too many hashes", []uint64{1, 2, 3, 4}, time.Second, ErrBadLease},
		{"zero duration", []uint64{1}, 0, ErrBadLease},
		{"negative duration", []uint64{1}, -time.Second, ErrBadLease},
		{"too long", []uint64{1}, time.Hour, ErrBadLease},
	}
	for _, tc := range cases {
		if _, _, err := b.Lease(tc.hashes, tc.d); !errors.Is(err, tc.want) {
			t.Errorf("%s: err = %v, want %v", tc.desc, err, tc.want)
		}
	}
	for range 2 {
		if _, _, err := b.Lease([]uint64{1}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := b.Lease([]uint64{1}, time.Second); !errors.Is(err, ErrTooManyLeases) {
		t.Errorf("third lease with MaxLeases 2: %v", err)
	}
	if err := p.Renew(12345, time.Second); !errors.Is(err, ErrUnknownLease) {
		t.Errorf("renew of a made-up id: %v", err)
	}
	if err := p.Renew(12345, time.Hour); !errors.Is(err, ErrBadLease) {
		t.Errorf("renew for too long: %v", err)
	}
}

func TestCheckRead(t *testing.T) {
	// TP 2: chunk 128 bytes, shard 512 per rank.
	type rng struct {
		desc   string
		rank   int
		off    uint64
		length uint64
		ok     bool
	}
	cases := []struct {
		name   string
		layout *layout.Layout
		ranges []rng
	}{
		{"contiguous, padded blocks", testLayout(6, 2, layout.FullyContiguous, 1024), []rng{
			{"inside slot 1", 0, 1024 + 10, 100, true},
			{"all of slot 1's shard", 1, 1024, 512, true},
			{"slot 1 into its padding", 0, 1024, 513, false},
			{"slot 1 across padding into slot 2", 0, 1024 + 500, 600, false},
			{"slot 2", 1, 2048, 512, true},
			{"slot 3, registered but not leased", 0, 3072, 8, false},
			{"slot 0, free", 0, 0, 8, false},
			{"past the region", 0, 6 * 1024, 8, false},
			{"far past the region", 0, 1 << 62, 8, false},
			{"no rank 2", 2, 1024, 8, false},
			{"negative rank", -1, 1024, 8, false},
			{"empty", 0, 1024, 0, false},
			{"wrapping", 0, 1024, math.MaxUint64, false},
		}},
		{"contiguous, packed blocks", testLayout(6, 2, layout.FullyContiguous, 64), []rng{
			{"across adjacent leased slots 1 and 2", 0, 512 + 500, 100, true},
			{"all of slots 1 and 2", 1, 512, 1024, true},
			{"slot 2 into slot 3", 0, 1536 - 10, 20, false},
			{"slot 0 into slot 1", 0, 500, 20, false},
		}},
		{"layer separate", testLayout(6, 2, layout.LayerSeparate, 64), []rng{
			// Block stride 256 (K+V of one layer), layer stride 6×256.
			{"layer 0 of slot 1", 0, 256, 256, true},
			{"layer 1 of slot 2", 1, 1536 + 512, 256, true},
			{"layer 0 of slots 1 and 2", 0, 256, 512, true},
			{"layer 1 of slot 3", 0, 1536 + 768, 1, false},
			{"layer 0 of slot 2 into slot 3", 0, 512 + 200, 100, false},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, b := newTestPool(t, testConfig(newManualClock(), nil), tc.layout)
			blks, _ := b.Allocate(4) // slots 0..3
			for i, blk := range blks[1:] {
				b.Commit(blk)
				if _, err := b.Register(blk, uint64(10+i), 0); err != nil {
					t.Fatal(err)
				}
			}
			id, ans, err := b.Lease([]uint64{10, 11}, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if ans[0].Slot != 1 || ans[1].Slot != 2 {
				t.Fatalf("leased slots %+v, want 1 and 2", ans)
			}
			for _, r := range tc.ranges {
				err := p.CheckRead(id, b.ID(), r.rank, r.off, r.length)
				if r.ok && err != nil {
					t.Errorf("%s: refused: %v", r.desc, err)
				}
				var re *ReadError
				if !r.ok && (!errors.As(err, &re) || re.Reason == "") {
					t.Errorf("%s: err = %v, want a ReadError with a reason", r.desc, err)
				}
			}
			if err := p.CheckRead(id, b.ID()+1, 0, 1024, 8); !errors.Is(err, ErrReadDenied) {
				t.Errorf("read through another block set: %v", err)
			}
			if err := p.CheckRead(id^1, b.ID(), 0, 1024, 8); !errors.Is(err, ErrUnknownLease) {
				t.Errorf("read with a made-up lease: %v", err)
			}
		})
	}
}
