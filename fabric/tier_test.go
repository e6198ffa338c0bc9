package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// tierEngine is the engine the tier tests store through: 32 KiB blocks in
// a set of 32 slots (1 MiB).
var tierEngine = client.Engine{Name: "tiered", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 32}

// peerImportsAll has c (a client of another agent) import every block of
// hashes, content ids 1 on, 16 at a time into a set of 64 slots, each
// checked byte for byte.
func peerImportsAll(t *testing.T, c *client.Client, hashes []uint64) {
	t.Helper()
	waitLookup(t, c, hashes)
	e := tierEngine
	e.Name, e.Slots = "importer", 64
	set := register(t, c, e)
	for from := 0; from < len(hashes); from += 16 {
		to := min(from+16, len(hashes))
		resp, err := c.Import(context.Background(), set.ID, hashes[from:to])
		if err != nil || len(resp.Blocks) != to-from {
			t.Fatalf("import of blocks %d..%d: %v %v", from, to-1, err, resp.GetError())
		}
		checkImported(t, set, resp.Blocks, uint64(from+1))
		var rel []uint32
		for _, b := range resp.Blocks {
			rel = append(rel, b.Slot)
		}
		if err := c.Release(context.Background(), set.ID, rel); err != nil {
			t.Fatal(err)
		}
	}
}

// storeThrough stores n blocks with content ids 1..n through set, 8 at a
// time, each batch released once registered, so that the set recycles
// (here: copies down) the older ones. It returns their sequence hashes.
// With an agent in pace, each batch waits for that agent's copies down to
// end, as an engine no faster than the disk would (allocations do not
// wait for the copies: an engine that outruns them loses blocks).
func storeThrough(t testing.TB, c *client.Client, set *client.BlockSet, n int, pace ...*fabric.Agent) []uint64 {
	t.Helper()
	return storeThroughSlots(t, c, set, mappedSlots{set}, n, pace...)
}

// slotBytes writes and checks blocks' content in a block set's slots, as
// an engine would: in memory this process maps (mappedSlots), or on a
// GPU (gpuSlots, where cgo builds the CUDA stand-in).
type slotBytes interface {
	// fill writes content id into slot.
	fill(slot int, id uint64)
	// check says whether slot holds content id, byte for byte.
	check(slot int, id uint64) error
}

// mappedSlots is the slotBytes of a set in host memory, through the
// client's mapping of its regions.
type mappedSlots struct{ set *client.BlockSet }

func (m mappedSlots) fill(slot int, id uint64) { kvtest.Fill(m.set.Layout, m.set.Ranks, slot, id) }

func (m mappedSlots) check(slot int, id uint64) error {
	return kvtest.Check(m.set.Layout, m.set.Ranks, slot, id)
}

// storeThroughSlots is storeThrough with the blocks written through sb;
// a nil sb leaves the slots' bytes as they are.
func storeThroughSlots(t testing.TB, c *client.Client, set *client.BlockSet, sb slotBytes, n int, pace ...*fabric.Agent) []uint64 {
	t.Helper()
	ctx := context.Background()
	tokens := make([]uint32, 16*n)
	for i := range tokens {
		tokens[i] = uint32(i*13 + 5)
	}
	h, _ := layout.NewHasher(16, layout.HashOptions{})
	var hashes []uint64
	for _, b := range h.Sequence(tokens) {
		hashes = append(hashes, b.Sequence)
	}
	for from := 0; from < n; from += 8 {
		to := min(from+8, n)
		slots, err := c.Allocate(ctx, set.ID, to-from)
		if err != nil {
			t.Fatalf("allocate for blocks %d..%d: %v", from, to-1, err)
		}
		if sb != nil {
			for i, s := range slots {
				sb.fill(int(s), uint64(from+i+1))
			}
		}
		req := &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: slots, Hashes: hashes[from:to]}
		if from > 0 {
			req.Parent, req.ParentSet = hashes[from-1], true
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
		for _, a := range pace {
			waitCopies(t, a)
		}
	}
	return hashes
}

// acquireChecked acquires hashes in runs of 8 and checks every byte of
// each block (content ids from first); it returns the blocks found.
func acquireChecked(t testing.TB, c *client.Client, set *client.BlockSet, hashes []uint64, first uint64) int {
	t.Helper()
	return acquireCheckedSlots(t, c, set, mappedSlots{set}, hashes, first)
}

// acquireCheckedSlots is acquireChecked with the blocks read through sb.
func acquireCheckedSlots(t testing.TB, c *client.Client, set *client.BlockSet, sb slotBytes, hashes []uint64, first uint64) int {
	t.Helper()
	ctx := context.Background()
	found := 0
	for from := 0; from < len(hashes); from += 8 {
		to := min(from+8, len(hashes))
		refs, err := c.Acquire(ctx, set.ID, hashes[from:to])
		if err != nil {
			t.Fatalf("acquire %d..%d: %v", from, to-1, err)
		}
		var rel []uint32
		for i, r := range refs {
			if err := sb.check(int(r.Slot), first+uint64(from+i)); err != nil {
				t.Fatalf("block %d (slot %d): %v", from+i, r.Slot, err)
			}
			rel = append(rel, r.Slot)
		}
		found += len(refs)
		if err := c.Release(ctx, set.ID, rel); err != nil {
			t.Fatal(err)
		}
		if len(refs) < to-from {
			break
		}
	}
	return found
}

func tierStatus(t *testing.T, c *client.Client) *fabricpb.Tier {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Tiers) != 1 {
		t.Fatalf("status shows %d tiers, want 1", len(st.Tiers))
	}
	return st.Tiers[0]
}

// waitCopies waits until a has no copy down queued or under way:
// allocations do not wait for them.
func waitCopies(t testing.TB, a *fabric.Agent) {
	t.Helper()
	wait.For(t, 20*time.Second, "the copies down under way ended", func() error {
		if n := fabric.TierCopiesPending(a); n > 0 {
			return fmt.Errorf("%d copies down under way", n)
		}
		return nil
	})
}

func tierDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvft")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// An engine that stores four times its block set keeps every block on the
// node: the ones recycled were copied to disk first, and Acquire restores
// them byte for byte; a peer imports all of them, the disk-held ones
// staged into host slots on the holder.
func TestTierKeepsWhatThePoolRecycles(t *testing.T) {
	const n = 128
	dir := tierDir(t)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		// The one holder stages disk-held blocks for the peer's reads: on
		// a loaded machine it must not be taken for a failed one.
		c.PeerTimeout = 10 * time.Second
		if i == 0 {
			c.Tiers = []string{"disk=" + dir + ":64MiB"}
		}
	})
	n1, n2 := agents[0], agents[1]
	c := dial(t, n1)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, n1)
	if ts := tierStatus(t, c); ts.Offloads < n-32 || ts.Blocks < n-32 {
		t.Fatalf("tier after storing %d blocks through 32 slots: %+v, want %d or more copied down", n, ts, n-32)
	}
	// Lookup says where each block is, and brings the disk-held ones up.
	lr, err := c.API().Lookup(context.Background(), &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: hashes[:8]})
	if err != nil {
		t.Fatal(err)
	}
	if len(lr.LocalTiers) != 8 || lr.LocalTiers[0] != "disk" {
		t.Fatalf("local tiers of the first 8 blocks: %q, want disk first", lr.LocalTiers)
	}
	lr, err = c.API().Lookup(context.Background(), &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: hashes[:1]})
	if err != nil || lr.LocalTiers[0] != "host" {
		t.Fatalf("after a look-up restored it, the first block is in %q (%v), want host", lr.GetLocalTiers(), err)
	}
	if got := acquireChecked(t, c, set, hashes, 1); got != n {
		t.Fatalf("acquired %d of %d blocks", got, n)
	}
	if ts := tierStatus(t, c); ts.Restores == 0 || ts.ChecksumFailures != 0 {
		t.Fatalf("tier after acquiring everything: %+v", ts)
	}

	// A peer imports all of them, 16 at a time, byte for byte.
	peerImportsAll(t, dial(t, n2), hashes)
}

// Blocks copied down go in batches: one journal commit (a data sync and a
// journal sync) carries many blocks, not one each.
func TestTierCopiesDownInBatches(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "batches")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	e := tierEngine
	e.Slots = 64
	set := register(t, c, e)
	hashes := storeThrough(t, c, set, 48) // below the watermark: kept, none copied yet
	waitCopies(t, a)
	before, offloads := fabric.TierCommits(a), tierStatus(t, c).Offloads
	n, err := fabric.TierCopyDown(a, set.ID, hashes)
	if err != nil || n != len(hashes) {
		t.Fatalf("copied %d of %d blocks down: %v", n, len(hashes), err)
	}
	commits := fabric.TierCommits(a) - before
	if got := tierStatus(t, c).Offloads - offloads; got != uint64(len(hashes)) {
		t.Fatalf("%d offloads counted for %d blocks copied down", got, len(hashes))
	}
	if commits == 0 || commits*8 > uint64(n) {
		t.Fatalf("%d blocks copied down in %d commits, want at least 8 blocks a commit", n, commits)
	}
}

// A restarted agent finds its disk blocks again, announces them, every
// one under its tier's block set number and the tier's all in one
// publish, and serves them; a block whose bytes were changed on disk is
// dropped, never served.
func TestTierSurvivesRestartAndDropsCorruptBlocks(t *testing.T) {
	const n = 64
	dir := tierDir(t)
	cfg := testConfig(t, "tiered")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.BlockSetGrace = 100 * time.Millisecond
	cfg.NoOrphanCache = true // the set is freed, its blocks then on disk only
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, a)
	// The engine goes: its set is freed once every block is copied down,
	// so that the node keeps all of them.
	c.Close()
	watcher := newClient(t, a)
	wait.For(t, 20*time.Second, "the engine's set is copied down and freed", func() error {
		st, err := watcher.Status(context.Background())
		if err != nil || len(st.BlockSets) != 0 || st.Tiers[0].Blocks != n {
			return fmt.Errorf("block sets %d, tier %+v, %v", len(st.GetBlockSets()), st.GetTiers(), err)
		}
		return nil
	})
	watcher.Close()
	a.Close()
	before := 0
	{
		b, err := os.ReadFile(filepath.Join(dir, "tier.json"))
		if err != nil || len(b) == 0 {
			t.Fatalf("tier.json: %v", err)
		}
	}
	// Flip a byte of slot 0's block (the first block copied down).
	f, err := os.OpenFile(filepath.Join(dir, "blocks.000"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var one [1]byte
	f.ReadAt(one[:], 100)
	one[0] ^= 0x40
	if _, err := f.WriteAt(one[:], 100); err != nil {
		t.Fatal(err)
	}
	f.Close()

	cfg.EngineSocket = ""
	cfg.Logger = nil
	cfg2 := testConfig(t, "tiered")
	cfg2.Tiers = cfg.Tiers
	type publish struct {
		store  bool
		set    uint32
		hashes []uint64
	}
	var (
		pubMu     sync.Mutex
		publishes []publish
	)
	fabric.OnTierAnnounced(&cfg2, func(store bool, set uint32, hashes []uint64) {
		pubMu.Lock()
		publishes = append(publishes, publish{store, set, slices.Clone(hashes)})
		pubMu.Unlock()
	})
	a2 := startAgent(t, cfg2)
	c2 := newClient(t, a2)
	ts := tierStatus(t, c2)
	if ts.Blocks != n {
		t.Fatalf("after a restart the tier holds %d blocks, want %d", ts.Blocks, n)
	}
	before = int(ts.Blocks)
	// Announced again: the node's index finds them before any is restored.
	wait.For(t, 10*time.Second, "the restarted node announces its disk blocks", func() error {
		ov, err := c2.Lookup(context.Background(), hashes)
		if err != nil || len(ov) == 0 || ov[0].Blocks != n {
			return fmt.Errorf("overlaps %v %v", ov, err)
		}
		return nil
	})
	diskSet := fabric.TierAnnounceSet(a2, 0)
	if held := fabric.OwnHoldingSets(a2); len(held) != 1 || held[diskSet] != n {
		t.Fatalf("the restarted node publishes holdings %v (by block set), want all %d under the disk tier's %d", held, n, diskSet)
	}
	pubMu.Lock()
	got := publishes
	pubMu.Unlock()
	if len(got) != 1 || !got[0].store || got[0].set != diskSet || len(got[0].hashes) != n {
		t.Fatalf("the restarted node's disk blocks announced in %d publishes, want one of all %d under block set %d", len(got), n, diskSet)
	}
	announced := slices.Clone(got[0].hashes)
	slices.Sort(announced)
	want := slices.Clone(hashes)
	slices.Sort(want)
	if !slices.Equal(announced, want) {
		t.Fatalf("announced %v, want the disk blocks %v", announced, want)
	}
	set2 := register(t, c2, tierEngine)
	found := 0
	for i := range hashes {
		refs, err := c2.Acquire(context.Background(), set2.ID, hashes[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) == 1 {
			if err := kvtest.Check(set2.Layout, set2.Ranks, int(refs[0].Slot), uint64(i+1)); err != nil {
				t.Fatalf("block %d restored after a restart: %v", i, err)
			}
			found++
			c2.Release(context.Background(), set2.ID, []uint32{refs[0].Slot})
		}
	}
	ts = tierStatus(t, c2)
	if ts.ChecksumFailures != 1 || found != before-1 {
		t.Fatalf("after flipping a byte of one block: %d of %d restored, tier %+v; want all but one, one checksum failure", found, before, ts)
	}
}

// A full disk tier drops its least recently used blocks for new ones:
// storing far more than it holds never fails.
func TestTierFullEvictsInsteadOfFailing(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "full")
	cfg.Tiers = []string{fmt.Sprintf("disk=%s:%d", dir, fabric.MinTierBytes)}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	const n = 600 // the tier holds 455 blocks of 32 KiB and its trailer
	hashes := storeThrough(t, c, set, n, a)
	ts := tierStatus(t, c)
	if ts.Evictions == 0 || ts.Blocks == 0 || ts.Blocks > uint64(fabric.MinTierBytes)/ts.BlockBytes {
		t.Fatalf("tier after %d blocks: %+v, want it full and evicting", n, ts)
	}
	// The last blocks are all still here, in memory or on disk.
	if got := acquireChecked(t, c, set, hashes[n-64:], n-63); got != 64 {
		t.Fatalf("acquired %d of the last 64 blocks", got)
	}
}

// Prefetch brings a sequence's disk-held blocks up into the engine's set
// ahead of use, at most half of what the set keeps per call, and leaves
// them cached: the Acquire that follows restores nothing.
func TestTierPrefetch(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "prefetch")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, 96, a)
	ctx := context.Background()
	if _, err := c.Prefetch(ctx, set.ID, nil); code(err) != codes.InvalidArgument {
		t.Fatalf("prefetch of nothing: %v, want InvalidArgument", err)
	}
	// The set keeps the sequence's head (recycling takes tails first):
	// prefetch the stretch after it.
	held := 0
	for _, h := range hashes {
		if !fabric.BlockSetHolds(a, set.ID, h) {
			break
		}
		held++
	}
	if held == 0 || held > 32 {
		t.Fatalf("the set holds the first %d blocks", held)
	}
	run := hashes[held : held+8]
	resp, err := c.Prefetch(ctx, set.ID, run)
	if err != nil || resp.InMemory != 8 || resp.Restored != 8 || resp.Error != "" {
		t.Fatalf("prefetch of 8 disk-held blocks: %+v %v", resp, err)
	}
	before := tierStatus(t, c).Restores
	if got := acquireChecked(t, c, set, run, uint64(held+1)); got != 8 {
		t.Fatalf("acquired %d of 8 prefetched blocks", got)
	}
	if after := tierStatus(t, c).Restores; after != before {
		t.Fatalf("the acquire after a prefetch restored %d blocks again", after-before)
	}
	// A long sequence: at most half the set's kept slots come up per call.
	resp, err = c.Prefetch(ctx, set.ID, hashes[held+8:])
	if err != nil || resp.Restored == 0 || int(resp.Restored) > set.Retains/2 {
		t.Fatalf("prefetch of %d blocks into a set keeping %d: %+v %v", len(hashes)-held-8, set.Retains, resp, err)
	}
}

// Prefetch brings the blocks that follow what this node holds from other
// nodes, byte-exact, at most half of what the set keeps per call, cached
// and unreferenced; blocks no node holds end the run without an error.
func TestPrefetchFromPeers(t *testing.T) {
	agents := clusterWith(t, 2, func(int, *fabric.Config) {})
	n1, n2 := agents[0], agents[1]
	ctx := context.Background()
	c2 := dial(t, n2)
	e := tierEngine
	e.Name, e.Slots = "holder", 64
	set2 := register(t, c2, e)
	hashes := storeThrough(t, c2, set2, 40) // all kept by the holder
	c1 := dial(t, n1)
	waitLookup(t, c1, hashes)
	set1 := register(t, c1, tierEngine)

	resp, err := c1.Prefetch(ctx, set1.ID, hashes[:8])
	if err != nil || resp.InMemory != 8 || resp.Imported != 8 || resp.Restored != 0 || resp.Error != "" {
		t.Fatalf("prefetch of 8 blocks a peer holds: %+v %v", resp, err)
	}
	for i, h := range hashes[:8] {
		if !fabric.BlockSetHolds(n1, set1.ID, h) {
			t.Fatalf("block %d not in the set after its prefetch", i)
		}
	}
	if got := acquireChecked(t, c1, set1, hashes[:8], 1); got != 8 {
		t.Fatalf("acquired %d of 8 prefetched blocks", got)
	}
	// The prefetch left no reference of the engine's: one acquire, one
	// release, and a second release is refused.
	refs, err := c1.Acquire(ctx, set1.ID, hashes[:1])
	if err != nil || len(refs) != 1 {
		t.Fatalf("acquire: %v %v", refs, err)
	}
	if err := c1.Release(ctx, set1.ID, []uint32{refs[0].Slot}); err != nil {
		t.Fatal(err)
	}
	if err := c1.Release(ctx, set1.ID, []uint32{refs[0].Slot}); code(err) != codes.FailedPrecondition {
		t.Fatalf("a release past the engine's references after a prefetch: %v, want FailedPrecondition", err)
	}

	// The held head is counted, the rest imported up to half the set's
	// kept slots.
	resp, err = c1.Prefetch(ctx, set1.ID, hashes)
	budget := max(1, set1.Retains/2)
	if err != nil || resp.Imported == 0 || int(resp.Imported) > budget || resp.InMemory != 8+resp.Imported || resp.Error != "" {
		t.Fatalf("prefetch of %d blocks, 8 held, into a set keeping %d: %+v %v", len(hashes), set1.Retains, resp, err)
	}
	if got := acquireChecked(t, c1, set1, hashes[:resp.InMemory], 1); got != int(resp.InMemory) {
		t.Fatalf("acquired %d of the %d blocks in memory after a prefetch", got, resp.InMemory)
	}

	resp, err = c1.Prefetch(ctx, set1.ID, []uint64{1<<63 | 12345})
	if err != nil || resp.InMemory != 0 || resp.Imported != 0 || resp.Error != "" {
		t.Fatalf("prefetch of a block no node holds: %+v %v", resp, err)
	}
}

// Blocks go down in one canonical order: a block set of the same shape but
// another arrangement, alignment and slot count, at TP 2, restores them
// byte for byte.
func TestTierRestoresAcrossArrangements(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "arrange")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.BlockSetGrace = 100 * time.Millisecond
	cfg.NoOrphanCache = true // the set is freed, its blocks then on disk only
	a := startAgent(t, cfg)
	c := newClient(t, a)
	e := tierEngine
	e.TPSize = 2
	set := register(t, c, e)
	hashes := storeThrough(t, c, set, 96, a)
	c.Close() // its set goes down whole and is freed
	c = newClient(t, a)
	wait.For(t, 20*time.Second, "the first set copied down and freed", func() error {
		st, err := c.Status(context.Background())
		if err != nil || len(st.BlockSets) != 0 || st.Tiers[0].Blocks != 96 {
			return fmt.Errorf("sets %d, tiers %v (%v)", len(st.GetBlockSets()), st.GetTiers(), err)
		}
		return nil
	})
	e.Name, e.Arrangement, e.Alignment, e.Slots = "other", layout.LayerSeparate, 8192, 48
	other := register(t, c, e)
	if got := acquireChecked(t, c, other, hashes, 1); got != 96 {
		t.Fatalf("acquired %d of 96 blocks into a layer-separate set", got)
	}
	if ts := tierStatus(t, c); ts.Restores == 0 {
		t.Fatalf("nothing restored from disk: %+v", ts)
	}
}

// Staging at its smallest: with 1 staging slot a peer's lease gets one
// disk-held block at a time, and an import of many still brings them all.
func TestTierStagingAtItsLimit(t *testing.T) {
	// In both index modes: in owned mode the tier's blocks reach the
	// hashes' owners rather than gossip.
	for _, mode := range []string{"whole", "owned"} {
		t.Run(mode, func(t *testing.T) { tierStagingAtItsLimit(t, mode) })
	}
}

func tierStagingAtItsLimit(t *testing.T, mode string) {
	const n = 40
	dir := tierDir(t)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i == 0 {
			c.Tiers = []string{"disk=" + dir + ":64MiB"}
			c.TierStagingSlots = 1
			c.BlockSetGrace = 100 * time.Millisecond
			c.NoOrphanCache = true // the set is freed, its blocks then on disk only
		}
		c.IndexMode = mode
	})
	n1, n2 := agents[0], agents[1]
	c := newClient(t, n1)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, n1)
	c.Close()
	watcher := newClient(t, n1)
	wait.For(t, 20*time.Second, "every block on disk, the engine's set freed", func() error {
		st, err := watcher.Status(context.Background())
		if err != nil || len(st.BlockSets) != 0 || st.Tiers[0].Blocks != n {
			return fmt.Errorf("sets %d, tiers %v (%v)", len(st.GetBlockSets()), st.GetTiers(), err)
		}
		return nil
	})
	c2 := dial(t, n2)
	waitLookup(t, c2, hashes)
	e := tierEngine
	e.Name, e.Slots = "importer", 64
	set2 := register(t, c2, e)
	resp, err := c2.Import(context.Background(), set2.ID, hashes)
	if err != nil || len(resp.Blocks) != n {
		t.Fatalf("import of %d disk-held blocks through 1 staging slot: %v %v", n, err, resp.GetError())
	}
	checkImported(t, set2, resp.Blocks, 1)
	st, err := watcher.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, bs := range st.BlockSets {
		if bs.Engine == "kvfabric-tier-staging" && bs.Slots != 1 {
			t.Fatalf("staging set of %d slots, want 1", bs.Slots)
		}
	}
	if st.Tiers[0].Restores < n {
		t.Fatalf("%d restores for %d blocks served from disk", st.Tiers[0].Restores, n)
	}
}

// Blocks larger than --tier-block-bytes are not copied down: they are
// recycled as without a tier, and nothing waits for them. Their set keeps
// the watermarks of a set without tiers, and says so to its engine: it
// retains as many blocks as one on an agent without tiers, not fewer by
// the room kept for copies down that it never makes.
func TestTierBlockTooLargeIsRecycled(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "small-room")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.TierBlockBytes = 16 << 10 // the blocks are 32 KiB
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	plain := startAgent(t, testConfig(t, "no-tiers"))
	if want := register(t, newClient(t, plain), tierEngine).Retains; set.Retains != want {
		t.Fatalf("a set of blocks no tier takes retains %d of %d slots, want %d as without tiers", set.Retains, tierEngine.Slots, want)
	}
	storeThrough(t, c, set, 96, a)
	if ts := tierStatus(t, c); ts.Offloads != 0 || ts.Blocks != 0 {
		t.Fatalf("tier after blocks larger than its room: %+v", ts)
	}
}

// A tier directory whose tier.json disagrees with the settings, or is not
// one, stops the agent at start with an error naming the file.
func TestTierMetaRefusedAtStart(t *testing.T) {
	for _, tc := range []struct {
		name, meta string
		blockBytes int64
		want       string
	}{
		{"another block size", `{"block_bytes": 40960, "layouts": {}}`, 8192, "tier.json: blocks of 40960 bytes, not 8192"},
		{"not json", `{"block_bytes": `, 0, "tier.json: unexpected end of JSON input"},
		{"block size not aligned", `{"block_bytes": 1000, "layouts": {}}`, 0, "block_bytes 1000 is not a multiple of 4096"},
		{"bad layout tag", `{"block_bytes": 4096, "layouts": {"xyz": "{}"}}`, 0, `layout tag "xyz"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tierDir(t)
			if err := os.WriteFile(filepath.Join(dir, "tier.json"), []byte(tc.meta), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t, "meta")
			cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
			cfg.TierBlockBytes = tc.blockBytes
			a, err := fabric.Start(context.Background(), cfg)
			if err == nil {
				a.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "tiers[0]") {
				t.Fatalf("%v, want it to name tiers[0] and say %q", err, tc.want)
			}
		})
	}
}

// Of two holders of the same blocks, one with them on disk only and one
// in memory, an import goes to the one in memory, and Lookup's estimate
// for the disk holder adds the restore: in whole mode from the importer's
// own index, in owned mode from the owners, which keep each holder's tier.
func TestImportPrefersMemoryHolders(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		nodes int
		index func(c *fabric.Config)
	}{
		{"whole", 3, func(*fabric.Config) {}},
		{"owned", 4, func(c *fabric.Config) {
			// 2 owners of 4: the importer owns some hashes, asks for others.
			c.IndexMode, c.IndexReplicas = fabric.IndexOwned, 2
			c.IndexCacheTTL = time.Millisecond // every poll below asks the owners afresh
		}},
	} {
		t.Run(tc.mode, func(t *testing.T) { importPrefersMemoryHolders(t, tc.nodes, tc.index) })
	}
}

func importPrefersMemoryHolders(t *testing.T, nodes int, index func(c *fabric.Config)) {
	const n = 40
	dir := tierDir(t)
	agents := clusterWith(t, nodes, func(i int, c *fabric.Config) {
		index(c)
		if i == 0 {
			c.Tiers = []string{"disk=" + dir + ":64MiB"}
			c.BlockSetGrace = 100 * time.Millisecond
			c.NoOrphanCache = true // the set is freed, its blocks then on disk only
		}
	})
	onDisk, inMemory, importer := agents[0], agents[1], agents[2]
	c0 := newClient(t, onDisk)
	hashes := storeThrough(t, c0, register(t, c0, tierEngine), n, onDisk)
	c0.Close()
	watcher := newClient(t, onDisk)
	wait.For(t, 20*time.Second, "every block on disk, the engine's set freed", func() error {
		st, err := watcher.Status(context.Background())
		if err != nil || len(st.BlockSets) != 0 || st.Tiers[0].Blocks != n {
			return fmt.Errorf("sets %d, tiers %v (%v)", len(st.GetBlockSets()), st.GetTiers(), err)
		}
		return nil
	})
	// The same blocks, kept in memory by an engine that stays.
	e := tierEngine
	e.Slots = 64
	c1 := dial(t, inMemory)
	if got := storeThrough(t, c1, register(t, c1, e), n); !slices.Equal(got, hashes) {
		t.Fatal("the two holders' hashes differ")
	}
	wait.For(t, 20*time.Second, "the importer learns of both holders, one on disk only", func() error {
		if d := fabric.IndexDiskOnly(importer, onDisk.NodeName(), hashes); d != n {
			return fmt.Errorf("%d of %d blocks on disk only at %s", d, n, onDisk.NodeName())
		}
		if d := fabric.IndexDiskOnly(importer, inMemory.NodeName(), hashes); d != 0 {
			return fmt.Errorf("%d blocks on disk only at %s", d, inMemory.NodeName())
		}
		ov, err := dial(t, importer).Lookup(context.Background(), hashes)
		if err != nil || len(ov) < 2 || ov[0].Blocks != n || ov[1].Blocks != n {
			return fmt.Errorf("overlaps %v (%v)", ov, err)
		}
		if c := fabric.ImportCandidates(importer, hashes); len(c) != 2 {
			return fmt.Errorf("candidates %q", c)
		}
		return nil
	})
	// Equally loaded holders of equal prefixes take turns; the one with
	// the blocks in memory comes first every time.
	for range 4 {
		if c := fabric.ImportCandidates(importer, hashes); c[0] != inMemory.NodeName() {
			t.Fatalf("candidates %q, want %s first", c, inMemory.NodeName())
		}
	}
	c2 := dial(t, importer)
	e.Name = "importer"
	set2 := register(t, c2, e)
	resp, err := c2.Import(context.Background(), set2.ID, hashes)
	if err != nil || len(resp.Blocks) != n {
		t.Fatalf("import of %d blocks: %v %v", n, err, resp.GetError())
	}
	checkImported(t, set2, resp.Blocks, 1)
	if st := tierStatus(t, watcher); st.Restores != 0 {
		t.Fatalf("the disk holder restored %d blocks for an import the memory holder could serve", st.Restores)
	}
	// The import measured the link to the memory holder; the disk holder
	// is estimated from it, plus a restore per block.
	lr, err := c2.API().Lookup(context.Background(), &fabricpb.LookupRequest{Hashes: hashes, BlockSet: set2.ID})
	if err != nil {
		t.Fatal(err)
	}
	est := map[string]*fabricpb.Overlap{}
	for _, o := range lr.Overlaps {
		est[o.Node] = o
	}
	mem, dsk := est[inMemory.NodeName()], est[onDisk.NodeName()]
	if mem == nil || dsk == nil || mem.Blocks != n || dsk.Blocks != n {
		t.Fatalf("overlaps %v", lr.Overlaps)
	}
	if mem.Estimate == "none" || dsk.Estimate == "none" {
		t.Fatalf("no estimate after an import: %v", lr.Overlaps)
	}
	if dsk.FetchEstimateUs <= mem.FetchEstimateUs {
		t.Fatalf("estimate of %d disk-held blocks %d µs, of the same in memory %d µs: want more", n, dsk.FetchEstimateUs, mem.FetchEstimateUs)
	}
}

// An engine's Allocate never waits for the disk: with every block of a
// full set queued for a copy down or written from its copy's buffer, and
// every write held, Allocate still returns (the slots given up: a block
// read already is written from its copy, one not begun is copied out in
// memory or dropped). Then the held writes commit the bytes the blocks
// had before their slots were reused: every block not dropped restores
// byte for byte, though its slot now holds another block.
func TestTierAllocateDoesNotWaitForTheDisk(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "nowait")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	allocateDoesNotWait(t, a, c, set, mappedSlots{set}, true)
}

// allocateDoesNotWait is the body of the tests that an engine's Allocate
// never waits for the disk, in a's block set set, written and read through
// sb: a first 40 blocks copied down open the tier's store (its slot size
// is known from then on, so that copies can be made in memory); then,
// with every write to the top tier held, the set's 32 slots are filled,
// each block's copy down queued or under way, and allocated again twice
// over, each allocation returning within 20 s; no copy completes
// meanwhile. Released, the held writes commit the bytes the blocks had
// before their slots were reused: every block not dropped restores byte
// for byte. copiedOut asks for a block copied out of a slot an allocation
// took, too.
func allocateDoesNotWait(t *testing.T, a *fabric.Agent, c *client.Client, set *client.BlockSet, sb slotBytes, copiedOut bool) {
	t.Helper()
	storeThroughSlots(t, c, set, sb, 40, a)
	held, release := fabric.TierHoldPuts(a)
	start := a.Metrics() // the drops counted below are those after the warm-up
	defer release()
	const n = 32 // the set's slots
	ctx := context.Background()
	hashes := make([]uint64, n)
	for from := 0; from < n; from += 8 {
		slots, err := c.Allocate(ctx, set.ID, 8)
		if err != nil {
			t.Fatalf("allocate %d..%d: %v", from, from+7, err)
		}
		for i, s := range slots {
			hashes[from+i] = 1<<40 + uint64(from+i)
			sb.fill(int(s), uint64(5000+from+i))
		}
		req := &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: slots, Hashes: hashes[from : from+8]}
		if from > 0 {
			req.Parent, req.ParentSet = hashes[from-1], true
		}
		resp, err := c.API().RegisterBlocks(ctx, req)
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
	wait.For(t, 20*time.Second, "copies down holding their writes", func() error {
		if h := held(); h == 0 {
			return errors.New("no write held yet")
		}
		return nil
	})
	before := a.Metrics().Tiers[0].Offloads
	// Every slot holds a block whose copy is under way; allocate them all
	// again, twice over, and write other blocks into them.
	for round := range 2 {
		for from := 0; from < n; from += 8 {
			done := make(chan error, 1)
			var slots []uint32
			go func() {
				var err error
				slots, err = c.Allocate(ctx, set.ID, 8)
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("round %d: allocate with every write held: %v", round, err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("round %d: allocate waited for a held write (%d held)", round, held())
			}
			for i, s := range slots {
				sb.fill(int(s), uint64(9000+100*round+from+i))
			}
			hs := make([]uint64, 8)
			for i := range hs {
				hs[i] = 2<<40 + uint64(1000*round+from+i)
			}
			if _, err := c.API().RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: slots, Hashes: hs}); err != nil {
				t.Fatal(err)
			}
			if err := c.Release(ctx, set.ID, slots); err != nil {
				t.Fatal(err)
			}
		}
	}
	if h, after := held(), a.Metrics().Tiers[0].Offloads; h == 0 || after != before {
		t.Fatalf("after the allocations %d writes held, %d copies completed; want the writes still held", h, after-before)
	}
	release()
	waitCopies(t, a)
	tm := a.Metrics().Tiers[0]
	if copiedOut && tm.CopiedOut == 0 {
		t.Fatalf("tier %+v: no block copied out of a slot an allocation took", tm)
	}
	found := 0
	for i, h := range hashes {
		found += acquireCheckedSlots(t, c, set, sb, []uint64{h}, uint64(5000+i))
	}
	// Blocks dropped since the warm-up (given up to allocations, or past
	// a full queue), the rounds' own included, so want may count low; a
	// block copied out is found again in any case.
	givenUp := a.Metrics().Pool.OffloadsGivenUp - start.Pool.OffloadsGivenUp
	dropped := int(givenUp) + int(tm.QueueFull-start.Tiers[0].QueueFull)
	if want := max(n-dropped, 1); found < want {
		t.Fatalf("%d of %d blocks found again, want %d (tier %+v, %d given up)", found, n, want, tm, givenUp)
	}
}

// A block written to disk straight from its slot whose slot an allocation
// takes under the write is never kept as written: the write (held here
// until the slot holds another block's bytes) is replaced by the bytes the
// allocation copied out, or the block is dropped. With content checksums
// off, the one check left on restore is the store's, of the bytes written:
// every block found again must still be byte-exact, and none fails a check.
func TestTierSlotTakenUnderDirectWrite(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "direct")
	cfg.Tiers = []string{"disk=" + dir + ":64MiB"}
	cfg.NoChecksums = true
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	held, release := fabric.TierHoldPuts(a)
	defer release()
	const n = 32 // the set's slots
	// The set filled, blocks are offered for copies down; the copier
	// begins the first (nothing has taken its slot: no allocation needs
	// it) and its write is held.
	hashes := make([]uint64, n)
	for from := 0; from < n; from += 8 {
		for i := range 8 {
			hashes[from+i] = 3<<40 + uint64(from+i)
		}
		storeBlocks(t, c, set, hashes[from:from+8], uint64(7000+from))
	}
	wait.For(t, 20*time.Second, "a write held after its copy began", func() error {
		if held() == 0 {
			return errors.New("no write held yet")
		}
		return nil
	})
	if direct, _ := fabric.TierDirectWrites(a); direct != 0 {
		t.Fatalf("%d blocks written before the first write was let go", direct)
	}
	// Every slot is taken at once, twice over (those of copies under way
	// included), and filled with other blocks while the write is held.
	for round := range 2 {
		hs := make([]uint64, n)
		for i := range hs {
			hs[i] = 4<<40 + uint64(1000*round+i)
		}
		storeBlocks(t, c, set, hs, uint64(20000+100*round))
	}
	release()
	waitCopies(t, a)
	found := 0
	for i, h := range hashes {
		found += acquireChecked(t, c, set, []uint64{h}, uint64(7000+i))
	}
	if found == 0 {
		t.Fatal("none of the blocks whose slots were taken was found again")
	}
	if ts := tierStatus(t, c); ts.ChecksumFailures != 0 {
		t.Fatalf("tier %+v: a block failed its check on restore; want every block written as it was", ts)
	}
	if direct, rewritten := fabric.TierDirectWrites(a); rewritten == 0 {
		t.Fatalf("no block written again after its slot was taken under its write (%d written straight)", direct)
	}
}

// A disk tier's directory is its own: two tiers naming one directory, or
// one inside the other, by paths that differ (a symbolic link) are
// refused at start, naming both; a second agent on a directory an agent
// has open is refused until that agent closes (its lock file).
func TestTierDirectoryIsItsOwn(t *testing.T) {
	dir := tierDir(t)
	real := filepath.Join(dir, "t1")
	if err := os.MkdirAll(filepath.Join(real, "sub"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, second := range []string{filepath.Join(dir, "link"), filepath.Join(dir, "link", "sub")} {
		cfg := testConfig(t, "twice")
		cfg.Tiers = []string{"disk=" + real + ":16MiB", "disk=" + second + ":16MiB"}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		a, err := fabric.Start(ctx, cfg)
		cancel()
		if err == nil {
			a.Close()
			t.Fatalf("tiers %s and %s started", real, second)
		}
		if !strings.Contains(err.Error(), "tiers[1] "+second) || !strings.Contains(err.Error(), "overlaps tiers[0]") {
			t.Fatalf("tiers %s and %s: %v, want tiers[1] refused as overlapping tiers[0]", real, second, err)
		}
	}

	cfg := testConfig(t, "first")
	cfg.Tiers = []string{"disk=" + real + ":16MiB"}
	first := startAgent(t, cfg)
	cfg2 := testConfig(t, "second")
	cfg2.Tiers = []string{"disk=" + filepath.Join(dir, "link") + ":16MiB"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if a, err := fabric.Start(ctx, cfg2); err == nil || !strings.Contains(err.Error(), "in use") {
		if a != nil {
			a.Close()
		}
		t.Fatalf("a second agent on an open tier's directory: %v, want it refused as in use", err)
	}
	first.Close()
	startAgent(t, cfg2)
}

// The tiers' staging sets (disk-held blocks staged for peers) and engines'
// sets are never each other's: a live engine's set of the staging set's
// layout and slot count is not taken for staging, an engine registering
// that layout afterwards gets no staging set, a call naming a staging set
// finds none, and no engine may call itself the staging engine.
func TestTierStagingSetsAreNoEnginesAndTakeNone(t *testing.T) {
	const n = 16
	dir := tierDir(t)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i == 0 {
			c.Tiers = []string{"disk=" + dir + ":64MiB"}
			c.BlockSetGrace = 100 * time.Millisecond
			c.NoOrphanCache = true // the set is freed, its blocks then on disk only
		}
	})
	n1, n2 := agents[0], agents[1]
	ctx := context.Background()
	writer := newClient(t, n1)
	hashes := storeThrough(t, writer, register(t, writer, tierEngine), n, n1)
	writer.Close()
	c := newClient(t, n1)
	wait.For(t, 20*time.Second, "every block on disk, the writer's set freed", func() error {
		st, err := c.Status(ctx)
		if err != nil || len(st.BlockSets) != 0 || st.Tiers[0].Blocks != n {
			return fmt.Errorf("sets %d, tiers %v (%v)", len(st.GetBlockSets()), st.GetTiers(), err)
		}
		return nil
	})
	live := tierEngine
	live.Name, live.Slots = "live", fabric.DefaultTierStagingSlots
	mine := register(t, c, live)
	peerImportsAll(t, dial(t, n2), hashes)
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var staging uint64
	for _, bs := range st.BlockSets {
		if bs.Engine == "kvfabric-tier-staging" {
			staging = bs.Id
		}
	}
	if staging == 0 || staging == mine.ID {
		t.Fatalf("staging set %d, the live engine's %d: the blocks were staged into an engine's set (sets %v)", staging, mine.ID, st.BlockSets)
	}
	if _, err := c.Allocate(ctx, staging, 1); code(err) != codes.NotFound {
		t.Fatalf("an engine's Allocate in the staging set %d: %v, want NOT_FOUND", staging, err)
	}
	other := newClient(t, n1)
	set, err := other.Register(ctx, live)
	if err != nil {
		t.Fatal(err)
	}
	if set.ID == staging {
		t.Fatalf("an engine of the staging set's layout registering was given the staging set %d", staging)
	}
	forged := live
	forged.Name = "kvfabric-tier-staging"
	if _, err := newClient(t, n1).Register(ctx, forged); code(err) != codes.InvalidArgument {
		t.Fatalf("an engine registering as the staging engine: %v, want INVALID_ARGUMENT", err)
	}
}
