package fabric_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// readAheadAgent is an agent with a disk tier reading ahead up to
// readAhead blocks, holding a sequence of 96 blocks (content ids 1 on) on
// disk only: stored through a writer's set, freed (after a grace of
// 50 ms, kept as no cache) once its session ended, its blocks copied down
// first. It returns a client of its own and a reader's set of the same
// layout, which holds none of them (made through read, if not nil).
func readAheadAgent(t *testing.T, readAhead int, read ...*client.Client) (*fabric.Agent, *client.Client, *client.BlockSet, []uint64) {
	t.Helper()
	return readAheadAgentWith(t, readAhead, nil, read...)
}

// readAheadAgentWith is readAheadAgent with the agent's configuration
// changed by mod first (unless nil).
func readAheadAgentWith(t *testing.T, readAhead int, mod func(*fabric.Config), read ...*client.Client) (*fabric.Agent, *client.Client, *client.BlockSet, []uint64) {
	t.Helper()
	dir := tierDir(t)
	cfg := testConfig(t, "readahead")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.TierReadAhead = readAhead
	cfg.BlockSetGrace = 50 * time.Millisecond
	cfg.NoOrphanCache = true
	if mod != nil {
		mod(&cfg)
	}
	a := startAgent(t, cfg)
	wc := newClient(t, a)
	writer := register(t, wc, tierEngine)
	hashes := storeThrough(t, wc, writer, 96, a)
	wc.Close()
	c := newClient(t, a)
	wait.For(t, 30*time.Second, "the writer's set freed, its blocks on disk", func() error {
		st, err := c.Status(context.Background())
		if err != nil {
			return err
		}
		if len(st.BlockSets) != 0 || len(st.Tiers) == 0 || st.Tiers[0].Blocks != 96 {
			return fmt.Errorf("%d block sets, tiers %v", len(st.BlockSets), st.Tiers)
		}
		return nil
	})
	if n := fabric.TierLinks(a); n != 95 {
		t.Fatalf("the tier keeps %d links after a sequence of 96 blocks went down; want 95", n)
	}
	if len(read) == 0 {
		return a, c, registerReader(t, c), hashes
	}
	return a, c, nil, hashes
}

// registerReader registers the reader's engine (tierEngine's layout, a set
// of its own) through c.
func registerReader(t *testing.T, c *client.Client) *client.BlockSet {
	t.Helper()
	e := tierEngine
	e.Name = "reader"
	return register(t, c, e)
}

// waitAheadHeld waits for a read-ahead held by HoldReadAheads to signal held.
func waitAheadHeld(t *testing.T, held <-chan struct{}) {
	t.Helper()
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("no read-ahead started")
	}
}

func readAheadMetrics(a *fabric.Agent) fabric.TierMetrics { return a.Metrics().Tiers[0] }

// waitReadAheads waits until a's read-aheads started have all ended, and
// n have.
func waitReadAheads(t *testing.T, a *fabric.Agent, n uint64) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("%d read-aheads ended", n), func() error {
		started, ended, _ := fabric.ReadAheadCounts(a)
		if started != n || ended != n {
			return fmt.Errorf("%d started, %d ended", started, ended)
		}
		return nil
	})
}

// acquireRun acquires hashes (content ids first on), checks each block
// byte for byte, and releases them.
func acquireRun(t *testing.T, c *client.Client, set *client.BlockSet, hashes []uint64, first uint64) {
	t.Helper()
	if got := acquireChecked(t, c, set, hashes, first); got != len(hashes) {
		t.Fatalf("acquired %d of %d blocks", got, len(hashes))
	}
}

// acquireAsync starts an Acquire of hashes (content ids first on) through
// c and returns at once; the function it returns waits for the Acquire,
// checks that every block came, each byte for byte, and releases them.
func acquireAsync(t *testing.T, c *client.Client, set *client.BlockSet, hashes []uint64, first uint64) func() {
	t.Helper()
	var refs []*fabricpb.BlockRef
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		refs, err = c.Acquire(context.Background(), set.ID, hashes)
	}()
	return func() {
		t.Helper()
		<-done
		if err != nil || len(refs) != len(hashes) {
			t.Fatalf("acquire of %d blocks: %d came, %v", len(hashes), len(refs), err)
		}
		var slots []uint32
		for i, r := range refs {
			if r.Hash != hashes[i] {
				t.Fatalf("block %d: hash %x, want %x", i, r.Hash, hashes[i])
			}
			if err := (mappedSlots{set}).check(int(r.Slot), first+uint64(i)); err != nil {
				t.Fatalf("block %d (slot %d): %v", i, r.Slot, err)
			}
			slots = append(slots, r.Slot)
		}
		if err := c.Release(context.Background(), set.ID, slots); err != nil {
			t.Fatal(err)
		}
	}
}

// readAheadTo checks that set holds blocks from..to-1 of hashes (read
// ahead, within bound) and not block to, one past them.
func readAheadTo(t *testing.T, a *fabric.Agent, set uint64, hashes []uint64, from, to int, bound string) {
	t.Helper()
	for i := from; i < to; i++ {
		if !fabric.BlockSetHolds(a, set, hashes[i]) {
			t.Fatalf("block %d, within %s, was not read ahead", i, bound)
		}
	}
	if fabric.BlockSetHolds(a, set, hashes[to]) {
		t.Fatalf("block %d, one past %s, came up", to, bound)
	}
}

// After a restore, the run that follows on disk comes up in the
// background, at most TierReadAhead blocks (at the limit: 8 come up, the
// ninth does not); the engine's Acquire then finds it in memory, byte for
// byte, reads nothing again and counts hits, and reads the next run ahead.
func TestTierReadAheadBringsTheNextRun(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	acquireRun(t, c, set, hashes[:8], 1)
	waitReadAheads(t, a, 1)
	readAheadTo(t, a, set.ID, hashes, 8, 16, "the read-ahead's bound of 8")
	m := readAheadMetrics(a)
	if m.ReadAhead != 8 || m.ReadAheadHits != 0 || m.Restores != 16 {
		t.Fatalf("after one run and its read-ahead: %d read ahead, %d hits, %d restores; want 8, 0, 16", m.ReadAhead, m.ReadAheadHits, m.Restores)
	}
	// The run read ahead, taken: no read again, 8 hits, and the next run
	// read ahead.
	acquireRun(t, c, set, hashes[8:16], 9)
	waitReadAheads(t, a, 2)
	m = readAheadMetrics(a)
	if m.ReadAhead != 16 || m.ReadAheadHits != 8 || m.Restores != 24 {
		t.Fatalf("after taking the run read ahead: %d read ahead, %d hits, %d restores; want 16, 8, 24", m.ReadAhead, m.ReadAheadHits, m.Restores)
	}
	acquireRun(t, c, set, hashes[16:24], 17)
	if m = readAheadMetrics(a); m.ReadAheadHits != 16 {
		t.Fatalf("%d hits after taking two runs read ahead; want 16", m.ReadAheadHits)
	}
	// Status shows the same counts, on the first tier.
	waitReadAheads(t, a, 3)
	m = readAheadMetrics(a)
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Tiers) != 1 {
		t.Fatalf("status lists %d tiers; want 1", len(st.Tiers))
	}
	if got := st.Tiers[0]; got.ReadAheadBlocks != 24 || got.ReadAheadHits != 16 || got.ReadAheadUnused != m.ReadAheadUnused ||
		m.ReadAhead != 24 {
		t.Fatalf("status: %d read ahead, %d hits, %d unused; metrics %d, %d, %d; want 24, 16 and the metrics' unused",
			got.ReadAheadBlocks, got.ReadAheadHits, got.ReadAheadUnused, m.ReadAhead, m.ReadAheadHits, m.ReadAheadUnused)
	}
}

// An Acquire of blocks the read-ahead is bringing up waits for it and
// takes them from memory: each read once, registered once, the right
// bytes, no error.
func TestTierReadAheadAcquireRacesIt(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	release := make(chan struct{})
	held := make(chan struct{}, 1)
	fabric.HoldReadAheads(a, func(ctx context.Context) {
		held <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
		}
	})
	acquireRun(t, c, set, hashes[:8], 1)
	waitAheadHeld(t, held) // the read-ahead holds its slots and has read nothing
	fabric.HoldReadAheads(a, nil)
	acquired := acquireAsync(t, c, set, hashes[8:16], 9)
	wait.For(t, 30*time.Second, "the acquire waiting for the read-ahead", func() error {
		if _, _, waits := fabric.ReadAheadCounts(a); waits != 1 {
			return fmt.Errorf("%d restores waited", waits)
		}
		return nil
	})
	close(release)
	acquired()
	// The blocks taken make room for 8 more: in the same read-ahead where
	// it has not yet ended when they are taken, else in a second one.
	wait.For(t, 30*time.Second, "the read-aheads over, 16 blocks read ahead", func() error {
		started, ended, _ := fabric.ReadAheadCounts(a)
		if n := readAheadMetrics(a).ReadAhead; started != ended || n != 16 || started < 1 || started > 2 {
			return fmt.Errorf("%d started, %d ended, %d blocks read ahead", started, ended, n)
		}
		return nil
	})
	m := readAheadMetrics(a)
	// 8 restored by the first acquire, 8 read ahead (taken by the second),
	// 8 read ahead after them: none twice.
	if m.ReadAheadHits != 8 || m.ReadAhead != 16 || m.Restores != 24 {
		t.Fatalf("after the race: %d hits, %d read ahead, %d restores; want 8, 16, 24", m.ReadAheadHits, m.ReadAhead, m.Restores)
	}
}

// A restore that found no read-ahead under way and reads blocks that a
// read-ahead then registers first gets the read-ahead's copies (its own
// are given back): they are taken as an Acquire takes them, counted as
// hits, not left to count as unused once recycled, and the run after them
// is read ahead.
func TestTierReadAheadCopyKeptByARestoreIsTaken(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	paused, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	var released sync.Once
	let := func() { released.Do(func() { close(release) }) }
	t.Cleanup(let)
	fabric.HoldRestores(a, func() {
		if !first.CompareAndSwap(false, true) {
			return // the restores after the first go on
		}
		close(paused)
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
	})
	t.Cleanup(func() { fabric.HoldRestores(a, nil) })
	acquired := acquireAsync(t, c, set, hashes[8:16], 9)
	select {
	case <-paused: // 8..15's restore has its slots and has read nothing
	case <-time.After(30 * time.Second):
		t.Fatal("the restore of 8..15 did not start")
	}
	acquireRun(t, c, set, hashes[:8], 1) // restores 0..7, reads 8..15 ahead
	waitReadAheads(t, a, 1)
	if m := readAheadMetrics(a); m.ReadAhead != 8 {
		t.Fatalf("%d blocks read ahead after 0..7; want 8", m.ReadAhead)
	}
	let()
	acquired()
	waitReadAheads(t, a, 2)
	if m := readAheadMetrics(a); m.ReadAheadHits != 8 || m.ReadAhead != 16 || m.ReadAheadUnused != 0 {
		t.Fatalf("%d hits, %d read ahead, %d unused; want 8, 16, 0", m.ReadAheadHits, m.ReadAhead, m.ReadAheadUnused)
	}
	for i := 16; i < 24; i++ {
		if !fabric.BlockSetHolds(a, set.ID, hashes[i]) {
			t.Fatalf("block %d was not read ahead after 8..15 were taken", i)
		}
	}
}

// Blocks an earlier read-ahead brought up and nothing took yet count
// against the next one's bound: after a run of 8 read ahead of which the
// engine takes 4, the read-ahead that follows reads 4 (16..19), not 8,
// so that 8 blocks are ahead of use, not 12 (at the limit: 19 comes up,
// 20 does not); once the engine takes the other 4, 4 more come up.
func TestTierReadAheadCountsBlocksLeftAhead(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	acquireRun(t, c, set, hashes[:8], 1)
	waitReadAheads(t, a, 1)
	acquireRun(t, c, set, hashes[8:12], 9) // 12..15 left, read ahead and untaken
	wait.For(t, 30*time.Second, "the read-ahead after the four taken", func() error {
		started, ended, _ := fabric.ReadAheadCounts(a)
		if n := readAheadMetrics(a).ReadAhead; started != 2 || ended != 2 || n != 12 {
			return fmt.Errorf("%d started, %d ended, %d blocks read ahead", started, ended, n)
		}
		return nil
	})
	readAheadTo(t, a, set.ID, hashes, 12, 20, "the bound of 8 with 12..15 untaken (12 ahead of use)")
	// The four left taken make room for four more, in the read-ahead
	// under way or in one after it.
	acquireRun(t, c, set, hashes[12:16], 13)
	wait.For(t, 30*time.Second, "four more read ahead", func() error {
		started, ended, _ := fabric.ReadAheadCounts(a)
		if n := readAheadMetrics(a).ReadAhead; started != ended || n != 16 {
			return fmt.Errorf("%d started, %d ended, %d blocks read ahead", started, ended, n)
		}
		return nil
	})
	readAheadTo(t, a, set.ID, hashes, 16, 24, "the bound of 8")
	if m := readAheadMetrics(a); m.ReadAheadHits != 8 || m.ReadAheadUnused != 0 {
		t.Fatalf("%d hits, %d unused; want 8, 0", m.ReadAheadHits, m.ReadAheadUnused)
	}
}

// A run read ahead that the engine takes as the read-ahead ends (after it
// last looked for room, before it has ended) is followed all the same:
// the Acquire that took it cannot start the next read-ahead while this one
// is under way, so this one starts it once it has ended, after the last
// block taken, and the next run comes up as it would have had the take
// come a moment later.
func TestTierReadAheadTakenAsItEndsIsFollowed(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	closing := make(chan struct{}, 1)
	release := make(chan struct{})
	var once, released sync.Once
	let := func() { released.Do(func() { close(release) }) }
	t.Cleanup(let) // a failure before it lets the read-ahead end, not wait 30 s
	fabric.HoldReadAheadEnds(a, func() {
		once.Do(func() {
			closing <- struct{}{}
			select {
			case <-release:
			case <-time.After(30 * time.Second):
			}
		})
	})
	t.Cleanup(func() { fabric.HoldReadAheadEnds(a, nil) })
	acquireRun(t, c, set, hashes[:8], 1)
	select {
	case <-closing: // all 8 read ahead, no room left: it is ending
	case <-time.After(30 * time.Second):
		t.Fatal("the read-ahead did not come to its end")
	}
	if started, ended, _ := fabric.ReadAheadCounts(a); started != 1 || ended != 0 {
		t.Fatalf("%d read-aheads started, %d ended, as the first ends; want 1, 0", started, ended)
	}
	acquireRun(t, c, set, hashes[8:16], 9) // taken from the read-ahead as it ends
	let()
	wait.For(t, 30*time.Second, "a second read-ahead, after the blocks taken", func() error {
		started, ended, _ := fabric.ReadAheadCounts(a)
		if n := readAheadMetrics(a).ReadAhead; started != 2 || ended != 2 || n != 16 {
			return fmt.Errorf("%d started, %d ended, %d blocks read ahead", started, ended, n)
		}
		return nil
	})
	for i := 16; i < 24; i++ {
		if !fabric.BlockSetHolds(a, set.ID, hashes[i]) {
			t.Fatalf("block %d, after the run taken, was not read ahead", i)
		}
	}
	if m := readAheadMetrics(a); m.ReadAheadHits != 8 || m.Restores != 24 {
		t.Fatalf("%d hits, %d restores; want 8, 24", m.ReadAheadHits, m.Restores)
	}
	acquireRun(t, c, set, hashes[16:24], 17)
	if m := readAheadMetrics(a); m.ReadAheadHits != 16 {
		t.Fatalf("after taking the run followed: %d hits; want 16", m.ReadAheadHits)
	}
}

// The read-ahead takes only spare slots: free ones above the low
// watermark, or those of unused blocks the tier holds too; never a
// referenced block's nor one the set alone holds.
func TestTierReadAheadEvictsNothingItShouldNot(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	ctx := context.Background()
	// 16 blocks of the engine's own, in no tier: 8 referenced, 8 not.
	slots, err := c.Allocate(ctx, set.ID, 16)
	if err != nil {
		t.Fatal(err)
	}
	own := make([]uint64, 16)
	for i := range own {
		own[i] = 0xabc000 + uint64(i)
		(mappedSlots{set}).fill(int(slots[i]), uint64(1000+i))
	}
	for i := range own {
		// Each its own sequence: every unreferenced one is a leaf that
		// recycling could take.
		req := &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: slots[i : i+1], Hashes: own[i : i+1]}
		if _, err := c.API().RegisterBlocks(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Release(ctx, set.ID, slots[8:]); err != nil {
		t.Fatal(err)
	}
	// 8 restored, held: 8 slots left free, 4 of them the low watermark's.
	refs, err := c.Acquire(ctx, set.ID, hashes[:8])
	if err != nil || len(refs) != 8 {
		t.Fatalf("acquire: %d blocks, %v", len(refs), err)
	}
	waitReadAheads(t, a, 1)
	low := int(set.Layout.Slots) - set.Retains
	if got, want := readAheadMetrics(a).ReadAhead, uint64(8-low); got != want {
		t.Fatalf("%d blocks read ahead; want the %d free slots above the low watermark", got, want)
	}
	for i, h := range own {
		if !fabric.BlockSetHolds(a, set.ID, h) {
			t.Fatalf("the engine's own block %d (referenced: %v) was pushed out by the read-ahead", i, i < 8)
		}
	}
	for i, h := range hashes[:8] {
		if !fabric.BlockSetHolds(a, set.ID, h) {
			t.Fatalf("referenced block %d was pushed out by the read-ahead", i)
		}
	}
}

// TierReadAhead 0 turns read-ahead off: a restore starts none, and
// nothing after its run comes up.
func TestTierReadAheadOff(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 0)
	acquireRun(t, c, set, hashes[:8], 1)
	acquireRun(t, c, set, hashes[8:16], 9)
	if started, _, _ := fabric.ReadAheadCounts(a); started != 0 {
		t.Fatalf("%d read-aheads started with TierReadAhead 0", started)
	}
	if m := readAheadMetrics(a); m.ReadAhead != 0 || m.Restores != 16 {
		t.Fatalf("with read-ahead off: %d read ahead, %d restores; want 0, 16", m.ReadAhead, m.Restores)
	}
	if fabric.BlockSetHolds(a, set.ID, hashes[16]) {
		t.Fatal("block 16 came up with read-ahead off")
	}
}

// A bound of 3: three blocks come up, the fourth does not.
func TestTierReadAheadBound(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 3)
	acquireRun(t, c, set, hashes[:8], 1)
	waitReadAheads(t, a, 1)
	readAheadTo(t, a, set.ID, hashes, 8, 11, "the bound of 3")
	if m := readAheadMetrics(a); m.ReadAhead != 3 {
		t.Fatalf("%d blocks read ahead; want 3", m.ReadAhead)
	}
}

// A set freed while its read-ahead holds slots ends it: the read-ahead
// gives its slots back, the set is freed, and the agent closes with
// nothing left running.
func TestTierReadAheadSetFreedWhileItRuns(t *testing.T) {
	a, c, _, hashes := readAheadAgent(t, 8, nil)
	// The reader in a session of its own, ended while the read-ahead
	// holds its slots.
	rc := newClient(t, a)
	reader := registerReader(t, rc)
	held := make(chan struct{}, 1)
	stopped := make(chan struct{})
	fabric.HoldReadAheads(a, func(ctx context.Context) {
		held <- struct{}{}
		<-ctx.Done() // until the set is freed
		close(stopped)
	})
	acquireRun(t, rc, reader, hashes[:8], 1)
	waitAheadHeld(t, held)
	rc.Close()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the read-ahead was not stopped by its set's freeing")
	}
	waitReadAheads(t, a, 1)
	wait.For(t, 30*time.Second, "the reader's set freed", func() error {
		st, err := c.Status(context.Background())
		if err != nil {
			return err
		}
		for _, bs := range st.BlockSets {
			if bs.Id == reader.ID {
				return fmt.Errorf("set %d still there", reader.ID)
			}
		}
		return nil
	})
	// Whatever came up before the set went went with it, unused.
	if m := readAheadMetrics(a); m.ReadAheadUnused != m.ReadAhead || m.ReadAheadHits != 0 {
		t.Fatalf("a set freed under its read-ahead: %d read ahead, %d unused, %d hits", m.ReadAhead, m.ReadAheadUnused, m.ReadAheadHits)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

// An Allocate that needs the slots a read-ahead holds ends the read-ahead
// and gets them: reading ahead never makes an allocation fail that would
// succeed without it. Here every slot of the set is asked for while the
// read-ahead holds 8 of them before reading any.
func TestTierReadAheadYieldsToAllocate(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	held := make(chan struct{}, 1)
	stopped := make(chan struct{})
	fabric.HoldReadAheads(a, func(ctx context.Context) {
		held <- struct{}{}
		<-ctx.Done() // until the allocation ends it
		close(stopped)
	})
	acquireRun(t, c, set, hashes[:8], 1)
	waitAheadHeld(t, held)
	all := int(set.Layout.Slots)
	slots, err := c.Allocate(context.Background(), set.ID, all)
	if err != nil || len(slots) != all {
		t.Fatalf("allocate all %d slots while a read-ahead holds 8: %d slots, %v", all, len(slots), err)
	}
	select {
	case <-stopped:
	default:
		t.Fatal("the allocation succeeded without ending the read-ahead")
	}
	waitReadAheads(t, a, 1)
	if err := c.Free(context.Background(), set.ID, slots); err != nil {
		t.Fatal(err)
	}
}

// A read-ahead that brought blocks up into a set freed before anything
// took them counts them unused: all of them, none a hit.
func TestTierReadAheadUnusedWhenFreed(t *testing.T) {
	a, c, _, hashes := readAheadAgent(t, 8, nil)
	rc := newClient(t, a)
	reader := registerReader(t, rc)
	acquireRun(t, rc, reader, hashes[:8], 1)
	waitReadAheads(t, a, 1)
	for i := 8; i < 16; i++ {
		if !fabric.BlockSetHolds(a, reader.ID, hashes[i]) {
			t.Fatalf("block %d was not read ahead", i)
		}
	}
	if m := readAheadMetrics(a); m.ReadAhead != 8 || m.ReadAheadUnused != 0 {
		t.Fatalf("before the set is freed: %d read ahead, %d unused; want 8, 0", m.ReadAhead, m.ReadAheadUnused)
	}
	rc.Close()
	wait.For(t, 30*time.Second, "the reader's set freed", func() error {
		st, err := c.Status(context.Background())
		if err != nil {
			return err
		}
		for _, bs := range st.BlockSets {
			if bs.Id == reader.ID {
				return fmt.Errorf("set %d still there", reader.ID)
			}
		}
		return nil
	})
	if m := readAheadMetrics(a); m.ReadAheadUnused != 8 || m.ReadAheadHits != 0 {
		t.Fatalf("a set freed holding 8 blocks read ahead: %d unused, %d hits; want 8, 0", m.ReadAheadUnused, m.ReadAheadHits)
	}
}

// A Lookup that restores a run, and an Import that takes it from the
// tier, each start the read-ahead of the run that follows.
func TestTierReadAheadAfterLookupAndImport(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restore func(t *testing.T, c *client.Client, set *client.BlockSet, hashes []uint64)
	}{
		{"lookup", func(t *testing.T, c *client.Client, set *client.BlockSet, hashes []uint64) {
			lr, err := c.API().Lookup(context.Background(), &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: hashes})
			if err != nil || len(lr.LocalTiers) != len(hashes) {
				t.Fatalf("lookup of %d blocks on disk: %v, %v", len(hashes), lr.GetLocalTiers(), err)
			}
		}},
		{"import", func(t *testing.T, c *client.Client, set *client.BlockSet, hashes []uint64) {
			resp, err := c.Import(context.Background(), set.ID, hashes)
			if err != nil || len(resp.Blocks) != len(hashes) {
				t.Fatalf("import of %d blocks on disk: %d blocks, %v, %s", len(hashes), len(resp.GetBlocks()), err, resp.GetError())
			}
			var slots []uint32
			for _, b := range resp.Blocks {
				slots = append(slots, b.Slot)
			}
			if err := c.Release(context.Background(), set.ID, slots); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, c, set, hashes := readAheadAgent(t, 8)
			tc.restore(t, c, set, hashes[:8])
			for i := range 8 {
				if !fabric.BlockSetHolds(a, set.ID, hashes[i]) {
					t.Fatalf("block %d was not restored", i)
				}
			}
			waitReadAheads(t, a, 1)
			for i := 8; i < 16; i++ {
				if !fabric.BlockSetHolds(a, set.ID, hashes[i]) {
					t.Fatalf("block %d was not read ahead after the %s", i, tc.name)
				}
			}
			if m := readAheadMetrics(a); m.ReadAhead != 8 {
				t.Fatalf("%d blocks read ahead after the %s; want 8", m.ReadAhead, tc.name)
			}
		})
	}
}

// A read-ahead brings up at most half the blocks its set keeps, however
// large TierReadAhead: at that bound every block comes up, one past it
// none does.
func TestTierReadAheadHalfTheSet(t *testing.T) {
	a, c, _, hashes := readAheadAgent(t, fabric.MaxTierReadAhead, nil)
	e := tierEngine
	e.Name, e.Slots = "small", 12
	set := register(t, c, e)
	bound := set.Retains / 2
	if bound < 2 || bound >= fabric.MaxTierReadAhead || set.Retains-2 < bound {
		t.Fatalf("a set of %d slots keeping %d: no room to read %d ahead", e.Slots, set.Retains, bound)
	}
	acquireRun(t, c, set, hashes[:2], 1)
	waitReadAheads(t, a, 1)
	if !fabric.TierHolds(a, hashes[2+bound]) {
		t.Fatalf("block %d, one past half the %d blocks the set keeps, is not in the tiers to be read ahead", 2+bound, set.Retains)
	}
	readAheadTo(t, a, set.ID, hashes, 2, 2+bound, fmt.Sprintf("half the %d blocks the set keeps", set.Retains))
	if m := readAheadMetrics(a); m.ReadAhead != uint64(bound) {
		t.Fatalf("%d blocks read ahead; want %d", m.ReadAhead, bound)
	}
}

// An Acquire whose restore needs the slots a read-ahead holds ends the
// read-ahead and restores its run, byte for byte, as it would without it.
func TestTierReadAheadYieldsToARestore(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	ctx := context.Background()
	low := int(set.Layout.Slots) - set.Retains
	// Slots the engine holds, so that with the first run referenced the
	// read-ahead takes the free slots above the low watermark, 8 of them.
	mine, err := c.Allocate(ctx, set.ID, int(set.Layout.Slots)-16-low)
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{}, 1)
	stopped := make(chan struct{})
	fabric.HoldReadAheads(a, func(ctx context.Context) {
		held <- struct{}{}
		<-ctx.Done() // until the restore ends it
		close(stopped)
	})
	first, err := c.Acquire(ctx, set.ID, hashes[:8])
	if err != nil || len(first) != 8 {
		t.Fatalf("acquire of the first run: %d blocks, %v", len(first), err)
	}
	waitAheadHeld(t, held)
	fabric.HoldReadAheads(a, nil)
	// Another run, not the one read ahead: the low watermark's free slots
	// are too few for it.
	run := hashes[40:48]
	refs, err := c.Acquire(ctx, set.ID, run)
	if err != nil || len(refs) != len(run) {
		t.Fatalf("acquire of %d blocks while a read-ahead holds 8 slots (%d free): %d blocks, %v", len(run), low, len(refs), err)
	}
	for i, r := range refs {
		if err := (mappedSlots{set}).check(int(r.Slot), uint64(41+i)); err != nil {
			t.Fatalf("block %d (slot %d): %v", 40+i, r.Slot, err)
		}
	}
	select {
	case <-stopped:
	default:
		t.Fatal("the restore succeeded without ending the read-ahead")
	}
	if err := c.Free(ctx, set.ID, mine); err != nil {
		t.Fatal(err)
	}
}

// A Register that needs the room of its engine's idle set (here within
// the engine's quota, which counts that set) frees that set even while
// its read-ahead holds slots: the read-ahead is ended first, not the set
// skipped as busy.
func TestTierReadAheadEndedForRoom(t *testing.T) {
	cfg := testConfig(t, "readahead-room")
	cfg.Tiers = []string{"disk=" + tierDir(t) + ":64MiB"}
	cfg.BlockSetGrace = time.Hour     // only a Register for room frees the idle set
	cfg.Pools = []string{"host=2MiB"} // the writer's set, the reader's, and 8 slots
	a := startAgent(t, cfg)
	c := newClient(t, a)
	ctx := context.Background()
	writer := register(t, c, tierEngine)
	hashes := storeThrough(t, c, writer, 96, a)
	e := tierEngine
	e.Name, e.Slots = "reader", 24 // a set of its own
	rc := newClient(t, a)
	reader := register(t, rc, e)
	if reader.ID == writer.ID {
		t.Fatal("the reader was given the writer's set")
	}
	held := make(chan struct{}, 1)
	stopped := make(chan struct{})
	fabric.HoldReadAheads(a, func(ctx context.Context) {
		held <- struct{}{}
		<-ctx.Done() // until the set is freed for room
		close(stopped)
	})
	// More slots than the pool (and the engine's quota) has room for
	// beside the idle set, fewer than with its room.
	free := idleReaderAhead(t, a, c, writer, hashes, rc, reader, held)
	rc2 := newClient(t, a)
	e.Slots = int(free) + e.Slots/2
	set, err := rc2.Register(ctx, e)
	if err != nil {
		t.Fatalf("register of %d slots with room for %d beside the idle set of 24: %v", e.Slots, free, err)
	}
	if set.ID == reader.ID {
		t.Fatal("given the idle set back, not a new one")
	}
	select {
	case <-stopped:
	default:
		t.Fatal("the set was freed without ending its read-ahead")
	}
	waitReadAheads(t, a, 1)
}

// A Register that frees an idle set for room waits for the set's
// read-ahead without the agent's lock or the set's: while the read-ahead
// it ended has not (held here past its cancellation), Status (which
// takes both) and an Acquire on another set answer, the Register has not;
// once the read-ahead ends, the Register gets its set.
func TestTierIdleReadAheadWaitedWithoutTheAgentLock(t *testing.T) {
	cfg := testConfig(t, "readahead-idle-unlocked")
	cfg.Tiers = []string{"disk=" + tierDir(t) + ":64MiB"}
	cfg.BlockSetGrace = time.Hour     // only a Register for room frees the idle set
	cfg.Pools = []string{"host=2MiB"} // the writer's set, the reader's, and 8 slots
	a := startAgent(t, cfg)
	c := newClient(t, a)
	ctx := context.Background()
	writer := register(t, c, tierEngine)
	hashes := storeThrough(t, c, writer, 96, a)
	e := tierEngine
	e.Name, e.Slots = "reader", 24 // a set of its own
	rc := newClient(t, a)
	reader := register(t, rc, e)
	held := make(chan struct{}, 1)
	ending := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo) // a failed test does not leave the Register waiting
	fabric.HoldReadAheads(a, func(ctx context.Context) {
		held <- struct{}{}
		<-ctx.Done() // the Register ends it
		close(ending)
		<-release // and waits, holding the read-ahead's slots, until the test lets go
	})
	free := idleReaderAhead(t, a, c, writer, hashes, rc, reader, held)
	e.Slots = int(free) + e.Slots/2 // fits only with the idle set's room
	type registered struct {
		set *client.BlockSet
		err error
	}
	done := make(chan registered, 1)
	rc2 := newClient(t, a)
	go func() {
		set, err := rc2.Register(ctx, e)
		done <- registered{set, err}
	}()
	select {
	case <-ending:
	case r := <-done:
		t.Fatalf("the Register returned (%v) without ending the idle set's read-ahead", r.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the Register did not end the idle set's read-ahead")
	}
	// The Register waits for the read-ahead now; the engine API does not.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := c.Status(sctx)
	if err != nil {
		t.Fatalf("status while a Register waits for an idle set's read-ahead: %v", err)
	}
	if len(st.BlockSets) != 2 {
		t.Fatalf("status lists %d block sets while the idle one is being freed; want 2 (the writer's, the idle reader's)", len(st.BlockSets))
	}
	if got := acquireChecked(t, c, writer, hashes[:1], 1); got != 1 {
		t.Fatalf("acquired %d of the writer's first block while a Register waits", got)
	}
	select {
	case r := <-done:
		t.Fatalf("the Register returned (%v) before the read-ahead it waits for ended", r.err)
	default:
	}
	letGo()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("register of %d slots with room for %d beside the idle set of 24: %v", e.Slots, free, r.err)
		}
		if r.set.ID == reader.ID {
			t.Fatal("given the idle set back, not a new one")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the Register did not return once the read-ahead ended")
	}
	waitReadAheads(t, a, 1)
}

// A read-ahead whose blocks are gone from the store (an eviction deleting
// them before it forgets their records) ends while another holds the
// agent's lock, as a Register freeing its set for room does while it
// waits for it: the blocks are forgotten only after it ends, and then
// they are.
func TestTierReadAheadMissingBlocksEndWithoutTheAgentLock(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	held := make(chan struct{}, 1)
	proceed := make(chan struct{})
	fabric.HoldReadAheads(a, func(ctx context.Context) {
		for _, h := range hashes[8:16] {
			if !fabric.TierDropStored(a, h) {
				t.Errorf("block %016x not in a tier's store", h)
			}
		}
		held <- struct{}{}
		<-proceed
	})
	acquireRun(t, c, set, hashes[:8], 1)
	waitAheadHeld(t, held)
	fabric.HoldReadAheads(a, nil)
	unlock := fabric.LockAgent(a)
	var once sync.Once
	defer once.Do(unlock)
	close(proceed)
	wait.For(t, 30*time.Second, "the read-ahead ended while the agent's lock is held", func() error {
		if _, ended, _ := fabric.ReadAheadCounts(a); ended != 1 {
			return fmt.Errorf("%d read-aheads ended", ended)
		}
		return nil
	})
	once.Do(unlock)
	for i, h := range hashes[8:16] {
		if fabric.BlockSetHolds(a, set.ID, h) {
			t.Fatalf("block %d, gone from the store, was read ahead", 8+i)
		}
	}
	wait.For(t, 30*time.Second, "the lost blocks forgotten", func() error {
		if fabric.TierHolds(a, hashes[8]) {
			return fmt.Errorf("the tiers still hold block 8")
		}
		return nil
	})
	if _, err := c.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// A read-ahead cancelled (its set freed) before it reads reads none of
// its blocks: here they are gone from the store once it is cancelled, and
// a read would find them missing and drop their records; they are kept.
func TestTierReadAheadCancelledReadsNothing(t *testing.T) {
	a, _, _, hashes := readAheadAgent(t, 8, nil)
	rc := newClient(t, a)
	reader := registerReader(t, rc)
	held := make(chan struct{}, 1)
	fabric.HoldReadAheads(a, func(ctx context.Context) {
		held <- struct{}{}
		<-ctx.Done() // until the set is freed
		for _, h := range hashes[8:16] {
			if !fabric.TierDropStored(a, h) {
				t.Errorf("block %016x not in a tier's store", h)
			}
		}
	})
	acquireRun(t, rc, reader, hashes[:8], 1)
	waitAheadHeld(t, held)
	fabric.HoldReadAheads(a, nil)
	rc.Close()
	waitReadAheads(t, a, 1)
	fabric.ReadAheadsWait(a)
	for i, h := range hashes[8:16] {
		if !fabric.TierHolds(a, h) {
			t.Fatalf("block %d, which a cancelled read-ahead had not read yet, was read", 8+i)
		}
	}
}

// A read-ahead keeps its reads going along the chain as the engine takes
// blocks: an Acquire of the run it waits for returns once that run has
// landed, while the reads of the blocks after it have not ended, and the
// blocks it took make room in the same read-ahead for blocks past the run
// it started with, read while the others are still under way; the blocks
// read ahead are then taken from memory, byte for byte.
func TestTierReadAheadKeepsReadingAsBlocksAreTaken(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 16) // 14 ahead: half the 28 slots the set of 32 keeps
	index := map[uint64]int{}
	for i, h := range hashes {
		index[h] = i
	}
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	past := make(chan int, len(hashes))
	fabric.HoldReadAheadReads(a, func(ctx context.Context, h uint64) {
		i := index[h]
		if i >= 22 {
			past <- i // past the 14 blocks it started with (8..21)
		}
		if i >= 16 {
			select { // blocks 16 on are not read until the test lets go
			case <-release:
			case <-ctx.Done():
			}
		}
	})
	acquireRun(t, c, set, hashes[:8], 1)
	// 8..15 land; 16..21 are held. The Acquire takes 8..15 without them.
	acquireRun(t, c, set, hashes[8:16], 9)
	select {
	case i := <-past:
		if i > 23 {
			// 6 reads held (16..21) of 8 at once: 2 more.
			t.Fatalf("block %d read next; want 22 or 23, after the run it started with", i)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the blocks taken made no room for the next along the chain")
	}
	if started, ended, _ := fabric.ReadAheadCounts(a); started != 1 || ended != 0 {
		t.Fatalf("%d read-aheads started, %d ended; want the one still under way", started, ended)
	}
	letGo()
	fabric.HoldReadAheadReads(a, nil)
	acquireRun(t, c, set, hashes[16:24], 17)
	if m := readAheadMetrics(a); m.ReadAheadHits != 16 {
		t.Fatalf("%d hits after taking blocks 8..23; want 16, all read ahead", m.ReadAheadHits)
	}
}

// A read-ahead given fewer spare slots than its chain asks for reads into
// every slot it was given, not only the first round's: here a set of 64
// slots, 37 held by the engine and the 8 restored referenced, leaves 12
// above its low watermark for a chain of 16. All 12 come up, the 13th
// does not (no slot for it), and no slot is given back unread.
func TestTierReadAheadReadsEverySlotItGot(t *testing.T) {
	a, c, _, hashes := readAheadAgent(t, 16, nil)
	ctx := context.Background()
	e := tierEngine
	e.Name, e.Slots = "reader", 64
	set := register(t, c, e)
	low := int(set.Layout.Slots) - set.Retains
	mine, err := c.Allocate(ctx, set.ID, 37)
	if err != nil || len(mine) != 37 {
		t.Fatalf("allocate 37: %d slots, %v", len(mine), err)
	}
	refs, err := c.Acquire(ctx, set.ID, hashes[:8])
	if err != nil || len(refs) != 8 {
		t.Fatalf("acquire: %d blocks, %v", len(refs), err)
	}
	waitReadAheads(t, a, 1)
	spare := int(set.Layout.Slots) - 37 - 8 - low
	if bound := min(16, set.Retains/2); spare >= bound || spare <= 8 {
		t.Fatalf("%d spare slots for a chain of %d: not fewer than it asks for, or no more than one round's reads", spare, bound)
	}
	if got := readAheadMetrics(a).ReadAhead; got != uint64(spare) {
		t.Fatalf("%d blocks read ahead into %d spare slots; want %d", got, spare, spare)
	}
	readAheadTo(t, a, set.ID, hashes, 8, 8+spare, fmt.Sprintf("the %d spare slots", spare))
	var slots []uint32
	for _, r := range refs {
		slots = append(slots, r.Slot)
	}
	if err := c.Release(ctx, set.ID, slots); err != nil {
		t.Fatal(err)
	}
	if err := c.Free(ctx, set.ID, mine); err != nil {
		t.Fatal(err)
	}
}

// A block read ahead past one the set already holds (a restore brought it
// up meanwhile, and the chain steps over it) is registered after that
// block, in a batch of its own detached from the one before the step: its
// parent is the block stepped over, not the last one read ahead, and it
// does not extend that one in the set. Here blocks 8..11 are read ahead
// (11 held back), the engine restores 12 itself and takes 8, and the room
// that makes goes to 13, past 12.
func TestTierReadAheadPastAHeldBlockNamesItsParent(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 4)
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	reading := make(chan uint64, len(hashes))
	fabric.HoldReadAheadReads(a, func(ctx context.Context, h uint64) {
		reading <- h
		if h == hashes[11] {
			select { // block 11 is not read until the test lets go
			case <-release:
			case <-ctx.Done():
			}
		}
	})
	t.Cleanup(func() { fabric.HoldReadAheadReads(a, nil) })
	acquireRun(t, c, set, hashes[:8], 1)
	wait.For(t, 30*time.Second, "blocks 8..10 read ahead", func() error {
		for i := 8; i < 11; i++ {
			if !fabric.BlockSetHolds(a, set.ID, hashes[i]) {
				return fmt.Errorf("block %d not in the set", i)
			}
		}
		return nil
	})
	acquireRun(t, c, set, hashes[12:13], 13) // restored by the engine, not read ahead
	acquireRun(t, c, set, hashes[8:9], 9)    // taken: room for one more
	timeout := time.After(30 * time.Second)
	for seen := false; !seen; {
		select {
		case h := <-reading:
			if h == hashes[12] {
				t.Fatal("block 12, which the set holds, was read ahead")
			}
			seen = h == hashes[13]
		case <-timeout:
			t.Fatal("block 13 was not read ahead past block 12")
		}
	}
	letGo()
	waitReadAheads(t, a, 1)
	parent, _, ok := fabric.BlockSetLinks(a, set.ID, hashes[13])
	if !ok {
		t.Fatal("block 13 was not registered")
	}
	if parent != hashes[12] {
		t.Fatalf("block 13 registered after %016x; want block 12, %016x (block 11 is %016x)", parent, hashes[12], hashes[11])
	}
	if _, children, ok := fabric.BlockSetLinks(a, set.ID, hashes[11]); !ok || children != 0 {
		t.Fatalf("block 11 (in the set: %v) extended by %d blocks; want none, block 13 detached", ok, children)
	}
	if parent, _, ok := fabric.BlockSetLinks(a, set.ID, hashes[11]); !ok || parent != hashes[10] {
		t.Fatalf("block 11 registered after %016x; want block 10, %016x", parent, hashes[10])
	}
	if m := readAheadMetrics(a); m.ReadAhead != 5 {
		t.Fatalf("%d blocks read ahead; want 5 (8..11, 13)", m.ReadAhead)
	}
}

// A block read ahead, untaken, that leaves its set while a later
// read-ahead is under way (after that one counted what had left before it
// began), and is read ahead again by it, counts unused once: not lost
// when the new block takes its place. Here blocks 8..11 are read ahead
// after 4..7 and left; a read-ahead after 0..1 reads 2 and 3, and, past
// 4..7, block 8 again, taken out of the set once that read-ahead began;
// past it 9..11, still ahead of use, fill its room (12 is not read).
func TestTierReadAheadAgainCountsTheFirstUnused(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 4)
	acquireRun(t, c, set, hashes[4:8], 5)
	waitReadAheads(t, a, 1)
	for i := 8; i < 12; i++ {
		if !fabric.BlockSetHolds(a, set.ID, hashes[i]) {
			t.Fatalf("block %d was not read ahead", i)
		}
	}
	withdrawn := make(chan bool, 1)
	fabric.HoldReadAheads(a, func(context.Context) {
		withdrawn <- fabric.BlockSetWithdraw(a, set.ID, hashes[8])
	})
	t.Cleanup(func() { fabric.HoldReadAheads(a, nil) })
	acquireRun(t, c, set, hashes[0:2], 1)
	waitReadAheads(t, a, 2)
	if !<-withdrawn {
		t.Fatal("block 8 was not in the set to take out")
	}
	if !fabric.BlockSetHolds(a, set.ID, hashes[8]) {
		t.Fatal("block 8 was not read ahead again")
	}
	if fabric.BlockSetHolds(a, set.ID, hashes[12]) {
		t.Fatal("block 12 was read ahead past 9..11, read ahead before and untaken: past the bound of 4")
	}
	m := readAheadMetrics(a)
	if m.ReadAhead != 7 || m.ReadAheadUnused != 1 || m.ReadAheadHits != 0 {
		t.Fatalf("block 8 read ahead twice, the first taken out untaken: %d read ahead, %d unused, %d hits; want 7, 1, 0",
			m.ReadAhead, m.ReadAheadUnused, m.ReadAheadHits)
	}
	// The second is the one a take finds: a hit, nothing more unused.
	acquireRun(t, c, set, hashes[8:9], 9)
	if m = readAheadMetrics(a); m.ReadAheadUnused != 1 || m.ReadAheadHits != 1 {
		t.Fatalf("block 8 taken: %d unused, %d hits; want 1, 1", m.ReadAheadUnused, m.ReadAheadHits)
	}
}

// idleReaderAhead leaves reader's set idle with a read-ahead under way in
// it: the reader acquires a run on disk with the run that follows it there
// (the writer's set keeps the sequence's head), its read-ahead holds its
// slots (held receives once it does; the hook is taken off then), and the
// reader's session ends. It returns how many slots of reader's layout the
// pool has room for beside the idle set.
func idleReaderAhead(t *testing.T, a *fabric.Agent, c *client.Client, writer *client.BlockSet, hashes []uint64,
	rc *client.Client, reader *client.BlockSet, held chan struct{}) uint64 {
	t.Helper()
	ctx := context.Background()
	from := slices.IndexFunc(hashes, func(h uint64) bool { return !fabric.BlockSetHolds(a, writer.ID, h) })
	for from >= 0 && from+16 <= len(hashes) && slices.ContainsFunc(hashes[from:from+16], func(h uint64) bool { return fabric.BlockSetHolds(a, writer.ID, h) }) {
		from++
	}
	if from < 0 || from+16 > len(hashes) {
		t.Fatalf("the writer's set holds blocks up to %d of %d", from, len(hashes))
	}
	wait.For(t, 30*time.Second, "the run and the next on disk", func() error {
		for i := from; i < from+16; i++ {
			if fabric.TierHolding(a, writer.ID, hashes[i]) != "disk" {
				return fmt.Errorf("block %d not on disk", i)
			}
		}
		return nil
	})
	acquireRun(t, rc, reader, hashes[from:from+8], uint64(from+1))
	waitAheadHeld(t, held)
	fabric.HoldReadAheads(a, nil)
	rc.Close()
	wait.For(t, 30*time.Second, "the reader's session ended", func() error {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		if len(st.Sessions) != 1 {
			return fmt.Errorf("%d sessions", len(st.Sessions))
		}
		return nil
	})
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return (st.Pools[0].SizeBytes - st.Pools[0].CarvedBytes) / uint64(reader.Layout.Strides().Block)
}

// aheadOnDisk starts an agent named name with a disk tier in dir, stores
// n blocks through a writer's set (with writer, if not nil, called before
// the writer goes) and waits until the set is freed, its n blocks on disk
// only. It returns the agent, for the caller to close, and the blocks'
// hashes.
func aheadOnDisk(t *testing.T, name, dir string, n int, writer func(a *fabric.Agent, set *client.BlockSet, hashes []uint64)) (*fabric.Agent, []uint64) {
	t.Helper()
	return aheadStored(t, name, dir, n, func(a *fabric.Agent, c *client.Client, set *client.BlockSet) []uint64 {
		hashes := storeThrough(t, c, set, n, a)
		if writer != nil {
			writer(a, set, hashes)
		}
		return hashes
	})
}

// aheadAgent starts an agent named name with a disk tier in dir, reading
// 8 blocks ahead, whose sets are freed 50 ms after their last session
// ended, their blocks copied down (kept as no cache).
func aheadAgent(t *testing.T, name, dir string) *fabric.Agent {
	t.Helper()
	cfg := testConfig(t, name)
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.TierReadAhead = 8
	cfg.BlockSetGrace = 50 * time.Millisecond
	cfg.NoOrphanCache = true
	return startAgent(t, cfg)
}

// aheadStored is aheadOnDisk with the n blocks stored by store, through
// the writer's client c and set (the blocks' hashes returned).
func aheadStored(t *testing.T, name, dir string, n int, store func(a *fabric.Agent, c *client.Client, set *client.BlockSet) []uint64) (*fabric.Agent, []uint64) {
	t.Helper()
	a := aheadAgent(t, name, dir)
	wc := newClient(t, a)
	set := register(t, wc, tierEngine)
	hashes := store(a, wc, set)
	wc.Close()
	c := newClient(t, a)
	defer c.Close()
	wait.For(t, 30*time.Second, "the writer's set freed, its blocks on disk", func() error {
		st, err := c.Status(context.Background())
		if err != nil {
			return err
		}
		if len(st.BlockSets) != 0 || len(st.Tiers) == 0 || st.Tiers[0].Blocks != uint64(n) {
			return fmt.Errorf("%d block sets, tiers %v", len(st.BlockSets), st.Tiers)
		}
		return nil
	})
	return a, hashes
}

// aheadRestarted starts the agent aheadOnDisk made again, over the same
// disk tier, reading 8 blocks ahead.
func aheadRestarted(t *testing.T, name, dir string) *fabric.Agent {
	t.Helper()
	cfg := testConfig(t, name)
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.TierReadAhead = 8
	return startAgent(t, cfg)
}

// readsAheadAfterRestart acquires the first 8 of hashes (numbered from 1)
// in a new reader's set on the restarted agent a, waits for the one
// read-ahead that starts, and checks that it brought blocks 8..15 into the
// set; it returns the reader's client and set.
func readsAheadAfterRestart(t *testing.T, a *fabric.Agent, hashes []uint64) (*client.Client, *client.BlockSet) {
	t.Helper()
	c := newClient(t, a)
	set := registerReader(t, c)
	acquireRun(t, c, set, hashes[:8], 1)
	waitReadAheads(t, a, 1)
	for i := 8; i < 16; i++ {
		if !fabric.BlockSetHolds(a, set.ID, hashes[i]) {
			t.Fatalf("block %d was not read ahead after a restart", i)
		}
	}
	return c, set
}

// The links outlive the agent with the blocks on disk: a restarted agent
// finds the sequence's links again (its copies' journal records keep each
// block's parent), and an Acquire of the sequence's head reads the next
// run ahead at once, as before the restart, with no block copied down
// anew. The parents are kept by the copies' puts alone: no link record is
// written for them, at their link nor at Close (a copy put with no parent
// costs one each, the journal growing twice as fast).
func TestTierReadAheadAfterARestart(t *testing.T) {
	const n = 32
	dir := tierDir(t)
	a, hashes := aheadOnDisk(t, "aheadrestart", dir, n, nil)
	if got := fabric.TierLinks(a); got != n-1 {
		t.Fatalf("%d links before the restart; want %d", got, n-1)
	}
	a.Close()
	if got := fabric.TierLinkRecords(a); got != 0 {
		t.Fatalf("%d link records written for %d blocks copied down in one sequence; want none, their puts keeping their parents", got, n)
	}

	a2 := aheadRestarted(t, "aheadrestart", dir)
	if got := fabric.TierLinks(a2); got != n-1 {
		t.Fatalf("%d links after a restart; want the %d the blocks on disk had", got, n-1)
	}
	c2, set := readsAheadAfterRestart(t, a2, hashes)
	if m := readAheadMetrics(a2); m.ReadAhead != 8 || m.Offloads != 0 {
		t.Fatalf("after a restart and one run: %d read ahead, %d copied down; want 8, 0", m.ReadAhead, m.Offloads)
	}
	acquireRun(t, c2, set, hashes[8:16], 9)
	if m := readAheadMetrics(a2); m.ReadAheadHits != 8 {
		t.Fatalf("%d hits taking the run read ahead after a restart; want 8", m.ReadAheadHits)
	}
}

// A restarted agent's relinked child whose first read fails (its bytes
// changed on disk) loses its link with its record (unrecordLocked): the
// links drop by one, the read-ahead after its parent stops there, every
// block before it is served byte for byte and it is not served.
func TestTierReadAheadAfterARestartLosesACorruptChildsLink(t *testing.T) {
	const (
		n       = 16
		corrupt = 5
	)
	dir := tierDir(t)
	var want []byte
	a, hashes := aheadOnDisk(t, "aheadcorrupt", dir, n, func(a *fabric.Agent, writer *client.BlockSet, hashes []uint64) {
		// The corrupt block's bytes as its copy down wrote them, to find
		// its slot in the tier's file.
		pieces := fabric.TierSlotPieces(a, writer.ID, hashes[corrupt])
		if len(pieces) == 0 {
			t.Fatalf("block %d not written straight", corrupt)
		}
		want = slices.Concat(pieces...)
	})
	a.Close()

	// Flip a byte in the middle of the corrupt block on disk.
	path := filepath.Join(dir, "blocks.000")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(b, want)
	if at < 0 || bytes.Contains(b[at+1:], want) {
		t.Fatalf("block %d found at %d in %s, want once", corrupt, at, path)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{b[at+len(want)/2] ^ 0x40}, int64(at+len(want)/2)); err != nil {
		t.Fatal(err)
	}
	f.Close()

	a2 := aheadRestarted(t, "aheadcorrupt", dir)
	if got := fabric.TierLinks(a2); got != n-1 {
		t.Fatalf("%d links after a restart; want the %d the blocks on disk had", got, n-1)
	}
	c2 := newClient(t, a2)
	set := registerReader(t, c2)
	// Up to the corrupt block: its parent's read-ahead reads it first.
	acquireRun(t, c2, set, hashes[:corrupt], 1)
	waitReadAheads(t, a2, 1)
	if got := fabric.TierLinks(a2); got != n-2 {
		t.Fatalf("%d links once the relinked block %d was found corrupt; want %d (its link to its parent gone)", got, corrupt, n-2)
	}
	for i := corrupt; i < n; i++ {
		if fabric.BlockSetHolds(a2, set.ID, hashes[i]) {
			t.Fatalf("block %d read ahead past the corrupt block %d", i, corrupt)
		}
	}
	if fabric.TierHolds(a2, hashes[corrupt]) {
		t.Fatalf("the corrupt block %d still recorded", corrupt)
	}
	if m := readAheadMetrics(a2); m.ReadAhead != 0 {
		t.Fatalf("%d blocks read ahead; want none past the corrupt one", m.ReadAhead)
	}
	// It is not served; the blocks after it still are, byte for byte.
	if got := acquireChecked(t, c2, set, hashes[corrupt:corrupt+1], corrupt+1); got != 0 {
		t.Fatalf("the corrupt block %d served", corrupt)
	}
	acquireRun(t, c2, set, hashes[corrupt+1:corrupt+3], corrupt+2)
}

// A journal whose parents make loops (a block its own parent, two blocks
// each other's) does not make the read-ahead loop after a restart: an
// Acquire of either head returns, byte for byte, and no block is read
// ahead twice. A guard: a self-parent is never linked (linkable, in
// relinkLocked), and the chain's walks are bounded (chain, nextAhead); the
// links counted fail where the self-parent check is gone.
func TestTierReadAheadAfterARestartWithLoopedParents(t *testing.T) {
	const n = 16
	dir := tierDir(t)
	a, hashes := aheadOnDisk(t, "aheadloops", dir, n, nil)
	// Blocks 0 and 1 each other's parent, 2 after hash 0 (none), 15 its
	// own parent; 3..14 as they went down.
	for _, p := range []struct {
		i      int
		parent uint64
	}{{0, hashes[1]}, {2, 0}, {15, hashes[15]}} {
		if !fabric.TierKeepParent(a, hashes[p.i], p.parent) {
			t.Fatalf("block %d not put again with parent %d", p.i, p.parent)
		}
	}
	a.Close()

	a2 := aheadRestarted(t, "aheadloops", dir)
	// 0 -> 1 and 1 -> 0, 2 -> 3 .. 13 -> 14; none to 2 nor to 15.
	if got := fabric.TierLinks(a2); got != n-2 {
		t.Fatalf("%d links after a restart; want %d", got, n-2)
	}
	c2 := newClient(t, a2)
	set := registerReader(t, c2)
	acquire := func(from, to int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		refs, err := c2.Acquire(ctx, set.ID, hashes[from:to])
		if err != nil || len(refs) != to-from {
			t.Fatalf("acquire %d..%d: %d blocks, %v", from, to-1, len(refs), err)
		}
		var rel []uint32
		for i, r := range refs {
			if err := (mappedSlots{set}).check(int(r.Slot), uint64(from+i+1)); err != nil {
				t.Fatalf("block %d (slot %d): %v", from+i, r.Slot, err)
			}
			rel = append(rel, r.Slot)
		}
		if err := c2.Release(ctx, set.ID, rel); err != nil {
			t.Fatal(err)
		}
	}
	wantAhead := func(what string, started, blocks, hits uint64) {
		t.Helper()
		waitReadAheads(t, a2, started)
		if m := readAheadMetrics(a2); m.ReadAhead != blocks || m.ReadAheadHits != hits {
			t.Fatalf("%s: %d read ahead, %d hits; want %d, %d", what, m.ReadAhead, m.ReadAheadHits, blocks, hits)
		}
	}
	// The two-block loop's head: its other block read ahead, once.
	acquire(0, 1)
	wantAhead("block 0 acquired", 1, 1, 0)
	if !fabric.BlockSetHolds(a2, set.ID, hashes[1]) {
		t.Fatal("block 1, block 0's child, was not read ahead")
	}
	// The other: taken as read ahead; nothing after it but block 0, held.
	acquire(1, 2)
	wantAhead("block 1 acquired", 1, 1, 1)
	// The self-parented block: nothing read ahead after it.
	acquire(15, 16)
	wantAhead("block 15 acquired", 1, 1, 1)
	// The sequence from 2: read ahead up to 14, whose child 15 names
	// itself and is no link.
	acquire(2, 8)
	wantAhead("blocks 2..7 acquired", 2, 8, 1)
	for i := 8; i < 15; i++ {
		if !fabric.BlockSetHolds(a2, set.ID, hashes[i]) {
			t.Fatalf("block %d was not read ahead", i)
		}
	}
}

// putDown registers hashes in the set of a new client of a (the tier
// engine's, which no other session may use), their contents ids first on,
// the first after parent (none where 0), and closes the client: the set
// freed, its blocks are offered to the tiers, each naming its parent. It
// waits for that and for the copies down.
func putDown(t *testing.T, a *fabric.Agent, hashes []uint64, first, parent uint64) {
	t.Helper()
	ctx := context.Background()
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	slots, err := c.Allocate(ctx, set.ID, len(hashes))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		mappedSlots{set}.fill(int(s), first+uint64(i))
	}
	req := &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: slots, Hashes: hashes}
	if parent != 0 {
		req.Parent, req.ParentSet = parent, true
	}
	resp, err := c.API().RegisterBlocks(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	rel := make([]uint32, len(resp.Blocks))
	for i, b := range resp.Blocks {
		rel[i] = b.Slot
	}
	if err := c.Release(ctx, set.ID, rel); err != nil {
		t.Fatal(err)
	}
	c.Close()
	s := newClient(t, a)
	defer s.Close()
	wait.For(t, 30*time.Second, "the set freed", func() error {
		st, err := s.Status(ctx)
		if err != nil {
			return err
		}
		if len(st.BlockSets) != 0 {
			return fmt.Errorf("%d block sets", len(st.BlockSets))
		}
		return nil
	})
	waitCopies(t, a)
}

// childAfter checks that a's tiers link want to parent (block set
// shape of the tier engine's, through a client of its own).
func childAfter(t *testing.T, a *fabric.Agent, parent, want uint64, what string) {
	t.Helper()
	c := newClient(t, a)
	defer c.Close()
	set := registerReader(t, c)
	if got, ok := fabric.TierChild(a, set.ID, parent); !ok || got != want {
		t.Fatalf("%s: the child of %x is %x (%v); want %x", what, parent, got, ok, want)
	}
}

// seqHashes is the hashes storeThrough gives n blocks.
func seqHashes(n int) []uint64 {
	tokens := make([]uint32, 16*n)
	for i := range tokens {
		tokens[i] = uint32(i*13 + 5)
	}
	h, _ := layout.NewHasher(16, layout.HashOptions{})
	var hashes []uint64
	for _, b := range h.Sequence(tokens) {
		hashes = append(hashes, b.Sequence)
	}
	return hashes
}

// A link made after its block went down (an offer of a block a tier
// holds, naming a parent its copy was put without) outlives the agent: a
// restarted agent finds it (its store journalled it: SetParent), and an
// Acquire of the parent's run reads the block's run ahead.
func TestTierReadAheadAfterARestartKeepsALinkMadeLater(t *testing.T) {
	const n = 16
	dir := tierDir(t)
	hashes := seqHashes(n)
	a := aheadAgent(t, "aheadlater", dir)
	// Blocks 8..15 go down first with block 8 given no parent, then
	// 0..7; then 8..15 are offered again, block 8 after 7.
	putDown(t, a, hashes[8:], 9, 0)
	putDown(t, a, hashes[:8], 1, 0)
	if got := fabric.TierLinks(a); got != n-2 {
		t.Fatalf("%d links before block 8's parent was named; want %d", got, n-2)
	}
	putDown(t, a, hashes[8:], 9, hashes[7])
	if got := fabric.TierLinks(a); got != n-1 {
		t.Fatalf("%d links once block 8's parent was named; want %d", got, n-1)
	}
	a.Close()

	a2 := aheadRestarted(t, "aheadlater", dir)
	if got := fabric.TierLinks(a2); got != n-1 {
		t.Fatalf("%d links after a restart; want %d, block 8's to 7 among them", got, n-1)
	}
	c2, set := readsAheadAfterRestart(t, a2, hashes)
	acquireRun(t, c2, set, hashes[8:], 9)
	if m := readAheadMetrics(a2); m.ReadAhead != 8 || m.ReadAheadHits != 8 {
		t.Fatalf("after a restart: %d read ahead, %d hits; want 8, 8", m.ReadAhead, m.ReadAheadHits)
	}
}

// Where a parent has two children on disk, a restart keeps the link of
// the one placed or linked last, as the running agent does, every time: a
// block put after the parent's first child wins; then the first child,
// offered again after that parent (linked again, and journalled), wins.
func TestTierReadAheadAfterARestartLastChildWins(t *testing.T) {
	const (
		n        = 16
		restarts = 5
	)
	dir := tierDir(t)
	hashes := seqHashes(n + 1)
	other := hashes[n] ^ 0x5a5a5a5a // no block of the sequence's
	a := aheadAgent(t, "aheadlast", dir)
	putDown(t, a, hashes[:n], 1, 0)
	putDown(t, a, []uint64{other}, 100, hashes[7])
	childAfter(t, a, hashes[7], other, "running, the block put last")
	a.Close()
	// restarted restarts the agent, restarts times, and checks block 7's
	// child each time; it returns the last agent, running.
	restarted := func(want uint64, what string) *fabric.Agent {
		t.Helper()
		for i := 1; ; i++ {
			a := aheadAgent(t, "aheadlast", dir)
			childAfter(t, a, hashes[7], want, fmt.Sprintf("restart %d, %s", i, what))
			if i == restarts {
				return a
			}
			a.Close()
		}
	}
	a2 := restarted(other, "the block put last")
	// Block 8 offered again after block 7: linked to it again.
	putDown(t, a2, hashes[8:9], 9, hashes[7])
	childAfter(t, a2, hashes[7], hashes[8], "running, block 8 linked again")
	a2.Close()
	a3 := restarted(hashes[8], "block 8 linked last")
	// The read-ahead after block 7 follows the link kept.
	c3 := newClient(t, a3)
	set := registerReader(t, c3)
	acquireRun(t, c3, set, hashes[:8], 1)
	waitReadAheads(t, a3, 1)
	if !fabric.BlockSetHolds(a3, set.ID, hashes[8]) || fabric.BlockSetHolds(a3, set.ID, other) {
		t.Fatal("the read-ahead after block 7 did not follow block 8, its child linked last")
	}
}

// An engine that computes and registers blocks a read-ahead brought up
// (it did not look, or looked before they came) gets the read-ahead's
// copies back as duplicates, byte for byte: those are the engine's now,
// taken as by an Acquire (hits, none left ahead of use to be counted
// unused once recycled).
func TestTierReadAheadCopyRegisteredAgainIsTaken(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	acquireRun(t, c, set, hashes[:8], 1) // restores 0..7, reads 8..15 ahead
	waitReadAheads(t, a, 1)
	readAheadTo(t, a, set.ID, hashes, 8, 16, "the read-ahead's bound of 8")
	ctx := context.Background()
	slots, err := c.Allocate(ctx, set.ID, 8)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		(mappedSlots{set}).fill(int(s), uint64(9+i))
	}
	resp, err := c.API().RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: slots, Hashes: hashes[8:16],
		Parent: hashes[7], ParentSet: true})
	if err != nil {
		t.Fatal(err)
	}
	var held []uint32
	for i, b := range resp.Blocks {
		if !b.Duplicate || slices.Contains(slots, b.Slot) {
			t.Fatalf("block %d: registered in slot %d (duplicate %v); want the read-ahead's copy", 8+i, b.Slot, b.Duplicate)
		}
		if err := (mappedSlots{set}).check(int(b.Slot), uint64(9+i)); err != nil {
			t.Fatalf("block %d: %v", 8+i, err)
		}
		held = append(held, b.Slot)
	}
	if m := readAheadMetrics(a); m.ReadAheadHits != 8 || m.ReadAhead != 8 || m.ReadAheadUnused != 0 {
		t.Fatalf("%d hits, %d read ahead, %d unused; want 8, 8, 0", m.ReadAheadHits, m.ReadAhead, m.ReadAheadUnused)
	}
	if err := c.Release(ctx, set.ID, held); err != nil {
		t.Fatal(err)
	}
}

// A block a read-ahead registers is among the blocks read ahead from the
// moment an engine can take it: an Acquire that takes it between its
// registration and the read-ahead's record of it (held there) counts a
// hit, gets it byte for byte, and leaves none ahead of use.
func TestTierReadAheadBlockTakenAsItLandsIsAHit(t *testing.T) {
	a, c, set, hashes := readAheadAgent(t, 8)
	var fired atomic.Bool
	var refs []*fabricpb.BlockRef
	var acqErr error
	acquired := make(chan struct{})
	fabric.OnReadAheadRegistered(a, func() {
		if !fabric.BlockSetHolds(a, set.ID, hashes[8]) || !fired.CompareAndSwap(false, true) {
			return
		}
		go func() {
			defer close(acquired)
			refs, acqErr = c.Acquire(context.Background(), set.ID, hashes[8:9])
		}()
		// Until the Acquire has taken the block from the set (the
		// read-ahead's reference and the engine's), or has ended.
		wait.For(t, 30*time.Second, "the Acquire of block 8 took it from the set", func() error {
			select {
			case <-acquired:
				return nil
			default:
			}
			if n := fabric.BlockUsers(a, set.ID, hashes[8]); n < 2 {
				return fmt.Errorf("%d users", n)
			}
			return nil
		})
	})
	t.Cleanup(func() { fabric.OnReadAheadRegistered(a, nil) })
	acquireRun(t, c, set, hashes[:8], 1) // restores 0..7; 8..15 are read ahead
	select {
	case <-acquired:
	case <-time.After(30 * time.Second):
		t.Fatal("the Acquire of block 8 did not end")
	}
	if !fired.Load() {
		t.Fatal("no read-ahead registered block 8")
	}
	if acqErr != nil || len(refs) != 1 {
		t.Fatalf("acquire of block 8 as it landed: %v, %v", refs, acqErr)
	}
	if err := (mappedSlots{set}).check(int(refs[0].Slot), 9); err != nil {
		t.Fatalf("block 8: %v", err)
	}
	wait.For(t, 30*time.Second, "the read-aheads ended", func() error {
		if started, ended, _ := fabric.ReadAheadCounts(a); started == 0 || started != ended {
			return fmt.Errorf("%d started, %d ended", started, ended)
		}
		return nil
	})
	if m := readAheadMetrics(a); m.ReadAheadHits != 1 {
		t.Fatalf("%d hits after block 8 was taken as it landed; want 1", m.ReadAheadHits)
	}
	if err := c.Release(context.Background(), set.ID, []uint32{refs[0].Slot}); err != nil {
		t.Fatal(err)
	}
}

// A RegisterBlocks whose session ends during the call gives back the
// read-ahead's copies it got as duplicates: nothing reached the engine,
// so none counts as taken: they stay read ahead, cached and unreferenced
// (the read-ahead has ended), and the next taker takes them.
func TestTierReadAheadCopyRegisteredBySessionEndedIsNotTaken(t *testing.T) {
	const keepalive = time.Second
	h := &holdStaller{armed: map[uint64]*stalledSession{}}
	a, c, set, hashes := readAheadAgentWith(t, 8, func(cfg *fabric.Config) {
		cfg.SessionKeepalive = keepalive
		fabric.BeforeHold(cfg, h.hold)
	})
	acquireRun(t, c, set, hashes[:8], 1) // restores 0..7, reads 8..15 ahead
	waitReadAheads(t, a, 1)
	readAheadTo(t, a, set.ID, hashes, 8, 16, "the read-ahead's bound of 8")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s := h.open(t, ctx, a, keepalive)
	al, err := s.api.Allocate(s.ctx(ctx), &fabricpb.AllocateRequest{BlockSet: set.ID, Count: 8})
	if err != nil {
		t.Fatal(err)
	}
	err = s.stall(func() error {
		_, err := s.api.RegisterBlocks(s.ctx(ctx), &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: al.Slots, Hashes: hashes[8:16],
			Parent: hashes[7], ParentSet: true})
		return err
	})
	wantEnded(t, "RegisterBlocks", err)
	if m, n := readAheadMetrics(a), fabric.AheadUntaken(a, set.ID); m.ReadAheadHits != 0 || n != 8 {
		t.Fatalf("%d hits, %d read ahead and untaken after a RegisterBlocks that ended with its session; want 0, 8", m.ReadAheadHits, n)
	}
	for i := 8; i < 16; i++ {
		if u := fabric.BlockUsers(a, set.ID, hashes[i]); u != 0 {
			t.Fatalf("block %d: %d references after the read-ahead ended and the call gave its copy back; want 0", i, u)
		}
	}
	// The next taker takes them: 8 hits.
	acquireRun(t, c, set, hashes[8:16], 9)
	if m := readAheadMetrics(a); m.ReadAheadHits != 8 {
		t.Fatalf("%d hits after an Acquire of the blocks read ahead; want 8", m.ReadAheadHits)
	}
}
