package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// storeBlocks allocates a slot for each of hashes (the allocation must
// not wait for the disk), fills them (content ids from content),
// registers them as one chain and releases them.
func storeBlocks(t *testing.T, c *client.Client, set *client.BlockSet, hashes []uint64, content uint64) {
	t.Helper()
	ctx := context.Background()
	done := make(chan error, 1)
	var slots []uint32
	go func() {
		var err error
		slots, err = c.Allocate(ctx, set.ID, len(hashes))
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("allocate %d slots: %v", len(hashes), err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("allocate %d slots waited for the disk", len(hashes))
	}
	for i, s := range slots {
		kvtest.Fill(set.Layout, set.Ranks, int(s), content+uint64(i))
	}
	resp, err := c.API().RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: slots, Hashes: hashes})
	if err != nil {
		t.Fatal(err)
	}
	var rel []uint32
	for _, b := range resp.Blocks {
		rel = append(rel, b.Slot)
	}
	if err := c.Release(ctx, set.ID, rel); err != nil {
		t.Fatal(err)
	}
}

// A block whose write straight from its slot fails (EIO) is not on disk,
// and its slot is never taken as if it were: its copy ends at once and the
// block stays in memory, to be offered again. Here the commit of the batch
// whose writes failed is held while allocations take every slot twice
// over, and the disk works again: each block is then found again byte for
// byte, or was dropped and counted (given up, queue full), none lost
// unseen.
func TestTierFailedDirectWriteIsNotCopied(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "failwrite")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.TierInFlight = 1 // every slot may wait for a copy: recycling drops none uncounted
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	var failing atomic.Bool
	var failed atomic.Int64
	failing.Store(true)
	fabric.TierFailIO(a, func(write, straight bool) error {
		if write && straight && failing.Load() {
			failed.Add(1)
			return unix.EIO
		}
		return nil
	})
	held, release := fabric.TierHoldCommits(a)
	defer release()
	const n = 32 // the set's slots
	hashes := make([]uint64, n)
	for from := 0; from < n; from += 8 {
		for i := range 8 {
			hashes[from+i] = 5<<40 + uint64(from+i)
		}
		storeBlocks(t, c, set, hashes[from:from+8], uint64(3000+from))
	}
	wait.For(t, 20*time.Second, "a commit held after its writes failed", func() error {
		if held() == 0 || failed.Load() == 0 {
			return fmt.Errorf("%d commits held, %d writes failed", held(), failed.Load())
		}
		return nil
	})
	failing.Store(false)
	before := a.Metrics()
	for round := range 2 {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = 6<<40 + uint64(1000*round+i)
		}
		storeBlocks(t, c, set, hs, uint64(40000+100*round))
	}
	release()
	waitCopies(t, a)
	after := a.Metrics()
	dropped := int(after.Pool.OffloadsGivenUp-before.Pool.OffloadsGivenUp) + int(after.Tiers[0].QueueFull-before.Tiers[0].QueueFull)
	found := 0
	for i, h := range hashes {
		found += acquireChecked(t, c, set, []uint64{h}, uint64(3000+i))
	}
	if found+dropped < n {
		t.Fatalf("%d of %d blocks found again and %d counted dropped: %d lost unseen (%d writes failed)", found, n, dropped, n-found-dropped, failed.Load())
	}
	if fabric.TierDirectOff(a) {
		t.Fatal("a disk error (EIO) turned writes straight from pool memory off; only O_DIRECT refusing memory does")
	}
}

// O_DIRECT refusing pool memory (EINVAL) for one write straight from a
// slot: the block stays in memory and is written through a buffer when it
// is offered again, and every write and read after goes through buffers.
// Each block stored is found again byte for byte, the first 64 (the
// refused one among them) from disk, none of them left in memory.
func TestTierDirectWriteRefusedFallsBackToBuffers(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "einvalw")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	var refused atomic.Int64
	fabric.TierFailIO(a, func(write, straight bool) error {
		if write && straight && refused.CompareAndSwap(0, 1) {
			return unix.EINVAL
		}
		return nil
	})
	const n = 112
	hashes := storeThrough(t, c, set, n, a)
	if refused.Load() == 0 {
		t.Fatal("no write straight from a slot was made")
	}
	for i, h := range hashes[:64] {
		if fabric.BlockSetHolds(a, set.ID, h) {
			t.Fatalf("block %d of %d stored through 32 slots is still in memory", i, n)
		}
	}
	if !fabric.TierDirectOff(a) {
		t.Fatal("writes straight from pool memory still on after O_DIRECT refused one")
	}
	if found := acquireChecked(t, c, set, hashes, 1); found != n {
		t.Fatalf("%d of %d blocks found again", found, n)
	}
	if tm := a.Metrics().Tiers[0]; tm.Failures == 0 {
		t.Fatalf("tier %+v: the refused write is not counted as a failed copy", tm)
	}
}

// O_DIRECT refusing pool memory (EINVAL) for a read straight into a slot:
// the restore reads the block again through a buffer, byte-exact, and
// reads and writes go through buffers from then on.
func TestTierDirectReadRefusedRetriesThroughBuffer(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "einvalr")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	var refused atomic.Int64
	fabric.TierFailIO(a, func(write, straight bool) error {
		if !write && straight && refused.CompareAndSwap(0, 1) {
			return unix.EINVAL
		}
		return nil
	})
	const n = 48
	hashes := storeThrough(t, c, set, n, a)
	if fabric.TierDirectOff(a) {
		t.Fatal("direct I/O off before any read was refused")
	}
	if found := acquireChecked(t, c, set, hashes, 1); found != n {
		t.Fatalf("%d of %d blocks found again", found, n)
	}
	if refused.Load() == 0 {
		t.Fatal("no read straight into a slot was made")
	}
	if !fabric.TierDirectOff(a) {
		t.Fatal("reads straight into pool memory still on after O_DIRECT refused one")
	}
	if ts := tierStatus(t, c); ts.ChecksumFailures != 0 {
		t.Fatalf("tier %+v: a block failed its check", ts)
	}
}

// A block written straight from its slot whose slot an allocation takes
// under the write, with no copy of its bytes made (OffloadTake refuses),
// is dropped from the batch (counted given up), never committed with the
// bytes the write took from the slot, which are another block's by then.
// With content checksums off, every block found again must still be
// byte-exact.
func TestTierSlotTakenUnderDirectWriteDropped(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "dropw")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.NoChecksums = true
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	held, release := fabric.TierHoldPuts(a)
	defer release()
	const n = 32 // the set's slots
	hashes := make([]uint64, n)
	for from := 0; from < n; from += 8 {
		for i := range 8 {
			hashes[from+i] = 9<<40 + uint64(from+i)
		}
		storeBlocks(t, c, set, hashes[from:from+8], uint64(11000+from))
	}
	wait.For(t, 20*time.Second, "a write held after its copy began", func() error {
		if held() == 0 {
			return errors.New("no write held yet")
		}
		return nil
	})
	fabric.TierForgetQueued(a)
	before := a.Metrics().Pool.OffloadsGivenUp
	for round := range 2 {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = 10<<40 + uint64(1000*round+i)
		}
		storeBlocks(t, c, set, hs, uint64(50000+100*round))
	}
	release()
	wait.For(t, 20*time.Second, "the copies down ended", func() error {
		if p := fabric.TierHashesPending(a); p > 0 {
			return fmt.Errorf("%d hashes with copies under way", p)
		}
		return nil
	})
	if a.Metrics().Pool.OffloadsGivenUp == before {
		t.Fatal("no block was given up with its slot taken and no copy of it made")
	}
	for i, h := range hashes {
		acquireChecked(t, c, set, []uint64{h}, uint64(11000+i)) // fails on a block committed with another's bytes
	}
	if ts := tierStatus(t, c); ts.ChecksumFailures != 0 {
		t.Fatalf("tier %+v: a block failed its check on restore", ts)
	}
	if _, rewritten := fabric.TierDirectWrites(a); rewritten != 0 {
		t.Fatalf("%d blocks written again with no copy of their bytes made", rewritten)
	}
}

// A copy down that cannot read its slot (a device set's download that
// fails) ends its offload at once and wakes the allocations waiting for
// slots being read: an allocation of every slot of the set does not wait
// for the batch's commit, held here until the test ends, and the blocks
// whose reads failed stay in memory until it takes them.
func TestTierFailedSlotReadDoesNotHoldAllocate(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "readfail")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	storeThrough(t, c, set, 8, a) // a first copy down opens the store
	var failed atomic.Int64
	fabric.TierFailSlotReads(a, func(uint64) error {
		failed.Add(1)
		return errors.New("slot unreadable")
	})
	defer fabric.TierFailSlotReads(a, nil)
	held, release := fabric.TierHoldCommits(a)
	defer release()
	hashes := make([]uint64, 24)
	for i := range hashes {
		hashes[i] = 3<<40 + uint64(i)
	}
	storeBlocks(t, c, set, hashes, 7000) // 32 of 32 slots used: copies down ahead of need
	wait.For(t, 20*time.Second, "a batch whose slot reads failed at its commit", func() error {
		if failed.Load() == 0 || held() == 0 {
			return fmt.Errorf("%d slot reads failed, %d commits held", failed.Load(), held())
		}
		return nil
	})
	var all []uint64
	for i := range tierEngine.Slots {
		all = append(all, 4<<40+uint64(i))
	}
	storeBlocks(t, c, set, all, 8000) // fails the test if the allocation waits
	if m := a.Metrics().Tiers[0]; m.Failures == 0 {
		t.Fatalf("tier %+v: no failed copy counted", m)
	}
}

// A block whose slot a copy down cannot read is not offered again at
// once: while an engine keeps allocating, each such block's reads are
// tried a few times (the back-off doubling from 100 ms), not at every
// allocation, and the blocks are recycled as the bottom tier's instead.
func TestTierFailedSlotReadBacksOff(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "readbackoff")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	storeThrough(t, c, set, 8, a) // a first copy down opens the store
	var mu sync.Mutex
	tries := map[uint64]int{}
	fabric.TierFailSlotReads(a, func(hash uint64) error {
		mu.Lock()
		tries[hash]++
		mu.Unlock()
		return errors.New("slot unreadable")
	})
	defer fabric.TierFailSlotReads(a, nil)
	start := time.Now()
	for i := range 400 {
		storeBlocks(t, c, set, []uint64{5<<40 + uint64(i)}, 9000+uint64(i))
	}
	took := time.Since(start)
	waitCopies(t, a)
	mu.Lock()
	defer mu.Unlock()
	most := 0
	for _, n := range tries {
		most = max(most, n)
	}
	// Delays of 100 ms, 200 ms, 400 ms... in a row: a block tried more
	// often than that bound allows was offered again too soon.
	bound := 2
	for d := 100 * time.Millisecond; d < took; d *= 2 {
		bound++
	}
	if len(tries) == 0 || most > bound {
		t.Fatalf("%d blocks' slot reads failed, one tried %d times in %v: want at most %d", len(tries), most, took, bound)
	}
}
