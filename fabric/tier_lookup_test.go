package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// answer is a Lookup's response and error.
type answer struct {
	lr  *fabricpb.LookupResponse
	err error
}

// lookupAsync calls Lookup with req on c and sends its answer on the
// channel it returns.
func lookupAsync(ctx context.Context, c *client.Client, req *fabricpb.LookupRequest) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		lr, err := c.API().Lookup(ctx, req)
		done <- answer{lr, err}
	}()
	return done
}

// awaitTiers waits (20 s at most) for the answer on done of the look-up
// what describes, and fails unless it has no error and says the blocks
// are in the local tiers want.
func awaitTiers(t *testing.T, done <-chan answer, want []string, what string) {
	t.Helper()
	var got answer
	select {
	case got = <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: no answer within 20s", what)
	}
	if got.err != nil {
		t.Fatalf("%s: %v", what, got.err)
	}
	if fmt.Sprint(got.lr.LocalTiers) != fmt.Sprint(want) {
		t.Fatalf("%s: local tiers %q, want %q", what, got.lr.LocalTiers, want)
	}
}

// Lookup answers at once, whatever copies down are under way: of a block
// on disk and one whose copy down is held (its slot taken by allocations,
// so in neither memory nor the tier), it says "disk" and "" without
// waiting for the copy, restores the first and not the second.
func TestTierLookupDoesNotWaitForCopiesDown(t *testing.T) {
	a, c, set, onDisk, pending, held, release := heldCopyDown(t, "lookupnw")
	defer release()
	done := lookupAsync(context.Background(), c, &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: []uint64{onDisk, pending}})
	awaitTiers(t, done, []string{"disk", ""}, fmt.Sprintf("Lookup, a copy down under way (%d held)", held()))
	if !fabric.BlockSetHolds(a, set.ID, onDisk) {
		t.Fatal("the block on disk was not restored by the look-up")
	}
	if fabric.BlockSetHolds(a, set.ID, pending) {
		t.Fatal("the look-up restored the block it answered not held")
	}
}

// A look-up with no_restore says where each block will be once the
// copies down under way end: of a block on disk and one whose copy down
// is held, it waits for that copy and answers "disk" for both (where a
// look-up that restores answers "" for the second at once,
// TestTierLookupDoesNotWaitForCopiesDown), restoring neither. Its wait
// ends short of the call's deadline: with the copy held past it, the
// answer comes before the deadline, the held block "".
func TestTierLookupNoRestoreWaitsForCopiesDown(t *testing.T) {
	a, c, set, onDisk, pending, held, release := heldCopyDown(t, "lookupnw2")
	req := &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: []uint64{onDisk, pending}, NoRestore: true}
	before := tierStatus(t, c)

	// The copy held past the call's deadline: an answer, not the deadline
	// (the wait ends 0.8 s before it; a run under -race has answered in
	// 3.7 s of a 4 s deadline, 0.12 s after its wait ended).
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	lr, err := c.API().Lookup(ctx, req)
	cancel()
	if err != nil {
		t.Fatalf("a look-up with no_restore, its copy down held past the call's deadline: %v; want an answer", err)
	}
	if want := []string{"disk", ""}; fmt.Sprint(lr.LocalTiers) != fmt.Sprint(want) {
		t.Fatalf("local tiers %q with the copy down held, want %q", lr.LocalTiers, want)
	}

	// The copy released once the look-up waits for it.
	waits := fabric.TierPendingWaits(a)
	// A deadline, so that the wait is not cut short by the bound on one
	// without (TestTierLookupNoRestoreWithoutADeadlineWaitsBounded).
	ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := lookupAsync(ctx, c, req)
	select {
	case got := <-done:
		t.Fatalf("a look-up with no_restore answered %q (%v) without waiting for the copy down under way (%d held)",
			got.lr.GetLocalTiers(), got.err, held())
	case <-waits:
	case <-time.After(20 * time.Second):
		t.Fatal("a look-up with no_restore neither answered nor waited for the copy down under way")
	}
	release()
	awaitTiers(t, done, []string{"disk", "disk"}, "a look-up with no_restore, the copy down it waited for released")
	if fabric.BlockSetHolds(a, set.ID, onDisk) || fabric.BlockSetHolds(a, set.ID, pending) {
		t.Fatal("a look-up with no_restore brought a block up")
	}
	if after := tierStatus(t, c); after.Restores != before.Restores || after.ReadAheadBlocks != before.ReadAheadBlocks {
		t.Fatalf("a look-up with no_restore: restores %d -> %d, read ahead %d -> %d; want both unchanged",
			before.Restores, after.Restores, before.ReadAheadBlocks, after.ReadAheadBlocks)
	}
}

// A look-up with no_restore whose call has no deadline waits for a copy
// down under way only so long (noDeadlineCountWait; here made 300 ms):
// with the copy held, it answers, the held block "", rather than never.
func TestTierLookupNoRestoreWithoutADeadlineWaitsBounded(t *testing.T) {
	a, c, set, onDisk, pending, held, release := heldCopyDown(t, "lookupnw3")
	defer release()
	fabric.TierCountWaitCap(a, 300*time.Millisecond)
	waits := fabric.TierPendingWaits(a)
	done := lookupAsync(context.Background(), c, &fabricpb.LookupRequest{
		BlockSet: set.ID, Hashes: []uint64{onDisk, pending}, NoRestore: true})
	select {
	case <-waits:
	case got := <-done:
		t.Fatalf("a look-up with no_restore answered %q (%v) without waiting for the copy down under way (%d held)",
			got.lr.GetLocalTiers(), got.err, held())
	case <-time.After(20 * time.Second):
		t.Fatal("a look-up with no_restore neither answered nor waited for the copy down under way")
	}
	awaitTiers(t, done, []string{"disk", ""}, fmt.Sprintf("a look-up with no_restore and no deadline, a copy down held (%d held) past its bound of 300ms", held()))
}

// heldCopyDown starts an agent with a disk tier (named name) and a block
// set of 32 slots, and returns a block of the set on disk, onDisk, and
// one whose copy down is held, pending: its slot taken by allocations
// since, so in neither memory nor the tier until release is called (held
// says how many copies wait).
func heldCopyDown(t *testing.T, name string) (a *fabric.Agent, c *client.Client, set *client.BlockSet, onDisk, pending uint64, held func() int, release func()) {
	t.Helper()
	dir := tierDir(t)
	cfg := testConfig(t, name)
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a = startAgent(t, cfg)
	c = newClient(t, a)
	set = register(t, c, tierEngine)
	stored := storeThrough(t, c, set, 64, a)
	for _, h := range stored {
		if !fabric.BlockSetHolds(a, set.ID, h) {
			onDisk = h
			break
		}
	}
	if onDisk == 0 || tierStatus(t, c).Blocks == 0 {
		t.Fatal("64 blocks stored through 32 slots are all still in memory, or none on disk")
	}
	held, release = fabric.TierHoldPuts(a)
	t.Cleanup(release)
	const n = 32 // the set's slots
	hashes := make([]uint64, n)
	for from := 0; from < n; from += 8 {
		for i := range 8 {
			hashes[from+i] = 7<<40 + uint64(from+i)
		}
		storeBlocks(t, c, set, hashes[from:from+8], uint64(8000+from))
	}
	wait.For(t, 20*time.Second, "a copy down held", func() error {
		if held() == 0 {
			return errors.New("no write held yet")
		}
		return nil
	})
	// Every slot taken again: the blocks whose copies are under way leave
	// memory, not yet on disk.
	others := make([]uint64, n)
	for i := range others {
		others[i] = 8<<40 + uint64(i)
	}
	storeBlocks(t, c, set, others, 90000)
	for _, h := range hashes {
		if !fabric.BlockSetHolds(a, set.ID, h) {
			pending = h
			break
		}
	}
	if pending == 0 {
		t.Fatal("every block whose copy is held is still in memory")
	}
	if fabric.TierCopiesPending(a) == 0 {
		t.Fatal("no copy down under way")
	}
	return a, c, set, onDisk, pending, held, release
}

// A look-up with no_restore says where each block is held and leaves the
// set and the tiers as they were: the disk-held blocks it names stay on
// disk, and nothing is restored or read ahead. The same look-up without
// it brings the first one up.
func TestTierLookupNoRestoreBringsNothingUp(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "lookupnr")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, 128, a)
	waitCopies(t, a)
	if fabric.BlockSetHolds(a, set.ID, hashes[0]) {
		t.Fatal("128 blocks stored through 32 slots: the first is still in memory")
	}
	before := tierStatus(t, c)
	req := &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: hashes[:8], NoRestore: true}
	for range 2 {
		lr, err := c.API().Lookup(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{"disk", "disk", "disk", "disk", "disk", "disk", "disk", "disk"}; fmt.Sprint(lr.LocalTiers) != fmt.Sprint(want) {
			t.Fatalf("local tiers %q, want %q", lr.LocalTiers, want)
		}
	}
	if fabric.BlockSetHolds(a, set.ID, hashes[0]) {
		t.Fatal("a look-up with no_restore brought the first block up")
	}
	if after := tierStatus(t, c); after.Restores != before.Restores || after.ReadAheadBlocks != before.ReadAheadBlocks {
		t.Fatalf("a look-up with no_restore: restores %d -> %d, read ahead %d -> %d; want both unchanged",
			before.Restores, after.Restores, before.ReadAheadBlocks, after.ReadAheadBlocks)
	}
	req.NoRestore = false
	if _, err := c.API().Lookup(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if !fabric.BlockSetHolds(a, set.ID, hashes[0]) {
		t.Fatal("a look-up without no_restore did not bring the first block up")
	}
}
