package fabric_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// hostTierBlocks is what a host tier of fabric.MinHostTierBytes holds of
// tierEngine's blocks: 32 KiB and a trailer, in slots of 36 KiB.
const hostTierBlocks = fabric.MinHostTierBytes / (36 << 10)

// tiersStatus returns the status of each of c's agent's tiers, want of
// them.
func tiersStatus(t *testing.T, c *client.Client, want int) []*fabricpb.Tier {
	t.Helper()
	st, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Tiers) != want {
		t.Fatalf("status shows %d tiers, want %d", len(st.Tiers), want)
	}
	return st.Tiers
}

func localTier(t *testing.T, c *client.Client, set *client.BlockSet, hash uint64) string {
	t.Helper()
	lr, err := c.API().Lookup(context.Background(), &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: []uint64{hash}})
	if err != nil || len(lr.LocalTiers) != 1 {
		t.Fatalf("look-up of %016x: %v %q", hash, err, lr.GetLocalTiers())
	}
	return lr.LocalTiers[0]
}

// Blocks the pool recycles go to the host tier first; the full host tier
// moves its least recently used blocks down to the disk tier instead of
// dropping them; every block, in either tier, restores byte for byte.
func TestHostTierMovesItsOldestBlocksToDisk(t *testing.T) {
	const n = 600 // more than the set's 32 slots and the host tier's blocks together
	dir := tierDir(t)
	cfg := testConfig(t, "cascade")
	cfg.Tiers = []string{fmt.Sprintf("disk=%s:64MiB", dir), fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, a)
	ts := tiersStatus(t, c, 2)
	host, dsk := ts[0], ts[1]
	if host.Kind != "host" || dsk.Kind != "disk" || dsk.Path != dir {
		t.Fatalf("tiers %v, want the host tier first, then the disk tier", ts)
	}
	if host.Blocks == 0 || host.Blocks > hostTierBlocks || host.Evictions != 0 || host.Offloads < n-32 {
		t.Fatalf("host tier after %d blocks: %+v, want it full, every block copied to it, none dropped", n, host)
	}
	if moved := n - 32 - int(host.Blocks); dsk.Offloads < uint64(moved) || dsk.Blocks < uint64(moved) || dsk.Evictions != 0 {
		t.Fatalf("disk tier after %d blocks: %+v, want the %d the host tier had no room for moved there", n, dsk, moved)
	}
	// The oldest are on disk, the newer ones in host memory.
	if got := fabric.TierHolding(a, set.ID, hashes[0]); got != "disk" {
		t.Fatalf("the first block is held by tier %q, want disk", got)
	}
	if got := fabric.TierHolding(a, set.ID, hashes[n-100]); got != "host" {
		t.Fatalf("block %d is held by tier %q, want host", n-100, got)
	}
	if got := localTier(t, c, set, hashes[0]); got != "disk" {
		t.Fatalf("look-up: the first block in %q, want disk", got)
	}
	// That look-up started a read-ahead of the blocks after the first,
	// which takes its slots as it begins (AllocateSpare, keeping the
	// first block). Begun only once the next look-up has restored its
	// block (the first recycled for it by then, the blocks the set held
	// being copied down), that block would be the only unused one with a
	// copy below, and recycled by the read-ahead, even where it then gets
	// no slot: it ends before the next look-up.
	fabric.ReadAheadsWait(a)
	if got := localTier(t, c, set, hashes[n-100]); got != "host" {
		t.Fatalf("look-up: block %d in %q, want host", n-100, got)
	}
	// A look-up brings the run it answers "host" up, as it does "disk".
	if !fabric.BlockSetHolds(a, set.ID, hashes[n-100]) {
		t.Fatalf("block %d, answered host by a look-up, is not restored into the set", n-100)
	}
	// Down two tiers and up again, byte for byte.
	if got := acquireChecked(t, c, set, hashes, 1); got != n {
		t.Fatalf("acquired %d of %d blocks", got, n)
	}
	ts = tiersStatus(t, c, 2)
	if ts[0].Restores == 0 || ts[1].Restores == 0 || ts[0].ChecksumFailures != 0 || ts[1].ChecksumFailures != 0 {
		t.Fatalf("tiers after acquiring everything: %v, want restores from both, no checksum failure", ts)
	}
}

// With no disk tier, the host tier is the bottom one: full, it drops its
// least recently used blocks; storing far more than it holds never fails.
func TestHostTierAloneEvicts(t *testing.T) {
	const n = 600
	cfg := testConfig(t, "hostonly")
	cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, a)
	ts := tiersStatus(t, c, 1)[0]
	if ts.Kind != "host" || ts.Path != "" || ts.Evictions == 0 || ts.Blocks == 0 || ts.Blocks > hostTierBlocks {
		t.Fatalf("host tier after %d blocks: %+v, want it full and evicting", n, ts)
	}
	if got := fabric.TierHolding(a, set.ID, hashes[0]); got != "" || fabric.BlockSetHolds(a, set.ID, hashes[0]) {
		t.Fatalf("the first block is still held (tier %q)", got)
	}
	if got := acquireChecked(t, c, set, hashes[:1], 1); got != 0 {
		t.Fatal("the first block, evicted, was acquired")
	}
	if got := acquireChecked(t, c, set, hashes[n-64:], n-63); got != 64 {
		t.Fatalf("acquired %d of the last 64 blocks", got)
	}
}

// A host-tier block whose bytes changed in memory is detected on its way
// up and dropped, never served; the others restore byte for byte.
func TestHostTierDropsACorruptBlock(t *testing.T) {
	const n = 96
	cfg := testConfig(t, "hostcorrupt")
	cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, a)
	var onlyHost []int
	for i, h := range hashes {
		if fabric.TierHolding(a, set.ID, h) == "host" && !fabric.BlockSetHolds(a, set.ID, h) {
			onlyHost = append(onlyHost, i)
		}
	}
	if len(onlyHost) < 2 {
		t.Fatalf("%d blocks held in the host tier alone, want 2 or more", len(onlyHost))
	}
	bad, good := onlyHost[0], onlyHost[1]
	if !fabric.TierCorruptHost(a, set.ID, hashes[bad], 1000) {
		t.Fatalf("block %d not corrupted", bad)
	}
	refs, err := c.Acquire(context.Background(), set.ID, hashes[bad:bad+1])
	if err != nil || len(refs) != 0 {
		t.Fatalf("acquire of the corrupted block: %d blocks, %v; want none", len(refs), err)
	}
	if ts := tiersStatus(t, c, 1)[0]; ts.ChecksumFailures != 1 {
		t.Fatalf("host tier %+v, want one checksum failure", ts)
	}
	if got := fabric.TierHolding(a, set.ID, hashes[bad]); got != "" {
		t.Fatalf("the corrupted block is still in tier %q", got)
	}
	if got := acquireChecked(t, c, set, hashes[good:good+1], uint64(good+1)); got != 1 {
		t.Fatalf("block %d, intact in the host tier, not acquired", good)
	}
}

// A peer imports blocks this node holds in its host tier alone, byte for
// byte.
func TestHostTierServesPeers(t *testing.T) {
	const n = 128
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i == 0 {
			c.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
		}
	})
	n1, n2 := agents[0], agents[1]
	c := dial(t, n1)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, n1)
	if fabric.TierHolding(n1, set.ID, hashes[0]) != "host" || fabric.BlockSetHolds(n1, set.ID, hashes[0]) {
		t.Fatal("the first block is not in the host tier alone")
	}
	peerImportsAll(t, dial(t, n2), hashes)
	if ts := tiersStatus(t, c, 1)[0]; ts.Restores == 0 || ts.ChecksumFailures != 0 {
		t.Fatalf("host tier after the imports: %+v, want blocks staged from it for the peer", ts)
	}
}

// An engine's Allocate never waits for a copy down to the host tier: with
// every block of a full set queued or under way and every write held,
// Allocate still returns; the held writes then commit the bytes the
// blocks had, and every block not dropped restores byte for byte.
func TestHostTierAllocateDoesNotWait(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "hostnowait")
	cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes), "disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	allocateDoesNotWait(t, a, c, set, mappedSlots{set}, false)
}

// The host tier is not persistent: a restarted agent finds the disk
// tier's blocks again, and none of the host tier's; and the links of the
// blocks on disk, moved there from the host tier, their parents kept in
// the disk tier's journal by the moves' puts alone: no link record is
// written for them (a block moved down with no parent costs one).
func TestHostTierIsNotKeptAcrossRestarts(t *testing.T) {
	const n = 600
	dir := tierDir(t)
	cfg := testConfig(t, "hostrestart")
	cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes), "disk=" + dir + ":64MiB"}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, a)
	before := tiersStatus(t, c, 2)
	if before[0].Blocks == 0 || before[1].Blocks == 0 {
		t.Fatalf("tiers %v, want blocks in both", before)
	}
	if fabric.TierHolding(a, set.ID, hashes[n-100]) != "host" {
		t.Fatalf("block %d not in the host tier", n-100)
	}
	c.Close()
	a.Close()
	if got := fabric.TierLinkRecords(a); got != 0 {
		t.Fatalf("%d link records written for the %d blocks moved down in one sequence; want none, their puts keeping their parents", got, before[1].Blocks)
	}

	cfg2 := testConfig(t, "hostrestart")
	cfg2.Tiers = cfg.Tiers
	a2 := startAgent(t, cfg2)
	c2 := newClient(t, a2)
	after := tiersStatus(t, c2, 2)
	if after[0].Blocks != 0 || after[1].Blocks != before[1].Blocks {
		t.Fatalf("after a restart the tiers hold %d and %d blocks, want 0 and %d", after[0].Blocks, after[1].Blocks, before[1].Blocks)
	}
	// One sequence, its first block on disk (acquired below): every
	// other block on disk links its parent to it.
	if got := fabric.TierLinks(a2); uint64(got) != after[1].Blocks-1 {
		t.Fatalf("after a restart the tiers keep %d links for the %d blocks of one sequence on disk, want %d",
			got, after[1].Blocks, after[1].Blocks-1)
	}
	set2 := register(t, c2, tierEngine)
	if got := fabric.TierHolding(a2, set2.ID, hashes[n-100]); got != "" {
		t.Fatalf("block %d, in host memory before the restart, is held by tier %q", n-100, got)
	}
	if got := acquireChecked(t, c2, set2, hashes[:8], 1); got != 8 {
		t.Fatalf("acquired %d of the 8 oldest blocks, kept on disk", got)
	}
}

// A host tier too small for one block of the tiers' size is left out:
// blocks go down to the disk tier as without it.
func TestHostTierTooSmallForABlock(t *testing.T) {
	dir := tierDir(t)
	cfg := testConfig(t, "hostsmall")
	cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes), "disk=" + dir + ":64MiB"}
	cfg.TierBlockBytes = fabric.MinHostTierBytes + 4096
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, 40, a)
	ts := tiersStatus(t, c, 2)
	if ts[0].Blocks != 0 || ts[0].Offloads != 0 || ts[1].Offloads == 0 {
		t.Fatalf("tiers %v, want every block copied down to disk, none to the host tier", ts)
	}
	onDisk := 0
	for _, h := range hashes {
		if fabric.TierHolding(a, set.ID, h) == "disk" {
			onDisk++
		}
	}
	if onDisk == 0 || uint64(onDisk) != ts[1].Blocks {
		t.Fatalf("%d blocks held on disk, status says %d", onDisk, ts[1].Blocks)
	}
}

// Prefetch brings blocks held in the host tier up into the engine's set,
// and the Acquire that follows restores nothing more.
func TestHostTierPrefetch(t *testing.T) {
	cfg := testConfig(t, "hostprefetch")
	cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, 96, a)
	held := 0
	for _, h := range hashes {
		if !fabric.BlockSetHolds(a, set.ID, h) {
			break
		}
		held++
	}
	if held == 0 || held > 32 || fabric.TierHolding(a, set.ID, hashes[held]) != "host" {
		t.Fatalf("the set holds the first %d blocks, the next not in the host tier", held)
	}
	run := hashes[held : held+8]
	resp, err := c.Prefetch(context.Background(), set.ID, run)
	if err != nil || resp.InMemory != 8 || resp.Restored != 8 || resp.Error != "" {
		t.Fatalf("prefetch of 8 host-tier blocks: %+v %v", resp, err)
	}
	before := tiersStatus(t, c, 1)[0].Restores
	if got := acquireChecked(t, c, set, run, uint64(held+1)); got != 8 {
		t.Fatalf("acquired %d of 8 prefetched blocks", got)
	}
	if after := tiersStatus(t, c, 1)[0].Restores; after != before || before < 8 {
		t.Fatalf("restores %d before the acquire, %d after: want the prefetch's 8, none after", before, after)
	}
}

// Under a full host tier a full disk tier makes room as it does alone, by
// dropping its own least recently used blocks: the host tier keeps
// moving its oldest down, dropping none itself, and the newest blocks all
// restore byte for byte.
func TestHostTierOverAFullDiskTier(t *testing.T) {
	const n = 1100 // the set's 32, the host tier's 455 and the disk tier's 455, and more
	dir := tierDir(t)
	cfg := testConfig(t, "hostfull")
	cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes), fmt.Sprintf("disk=%s:%d", dir, fabric.MinTierBytes)}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, n, a)
	ts := tiersStatus(t, c, 2)
	if ts[0].Evictions != 0 || ts[0].Blocks != hostTierBlocks || ts[1].Evictions == 0 || ts[1].Blocks == 0 {
		t.Fatalf("tiers after %d blocks: %v, want both full, the disk tier evicting, the host tier not", n, ts)
	}
	if got := acquireChecked(t, c, set, hashes[n-600:], n-599); got != 600 {
		t.Fatalf("acquired %d of the last 600 blocks", got)
	}
}

// A restore that found a block in the host tier, and reads it after the
// block moved down to the disk tier (the copier making room while the
// restore waited for slots), reads it from the disk tier: the disk tier's
// record of it stays, the tiers' byte counts stay true, and it restores
// byte for byte.
func TestHostTierRestoreAcrossAMoveDown(t *testing.T) {
	cfg := testConfig(t, "restoremove")
	cfg.Tiers = []string{fmt.Sprintf("disk=%s:64MiB", tierDir(t)), fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, 64, a) // more than the set's 32 slots: some recycled into the host tier
	hash, found, n, err := fabric.TierRestoreAcrossMove(a, set.ID)
	if found != "host" || n != 1 || err != nil {
		t.Fatalf("restore across a move down: found in %q, %d restored, %v; want found in host, 1 restored", found, n, err)
	}
	if got := fabric.TierHolding(a, set.ID, hash); got != "disk" {
		t.Fatalf("after the move and the restore the block is held by tier %q, want disk", got)
	}
	ts := tiersStatus(t, c, 2)
	if ts[1].Blocks != 1 || ts[1].Restores != 1 || ts[0].Restores != 0 {
		t.Fatalf("tiers %v, want the moved block on disk, restored from there", ts)
	}
	// The host tier's bytes (its records) and blocks (its store) agree
	// once copies under way have settled: the restore's allocations may
	// have pushed blocks out of the set whose copies down are under way
	// (in the store, not yet recorded); none is counted twice or left
	// unrecorded for good.
	wait.For(t, 20*time.Second, "the host tier's bytes and blocks agree", func() error {
		ts := tiersStatus(t, c, 2)
		if per := ts[1].Bytes; per == 0 || ts[0].Bytes != ts[0].Blocks*per {
			return fmt.Errorf("tiers' bytes: host %d for %d blocks, disk %d for its one", ts[0].Bytes, ts[0].Blocks, per)
		}
		return nil
	})
	i := slices.Index(hashes, hash)
	if got := acquireChecked(t, c, set, hashes[i:i+1], uint64(i+1)); got != 1 {
		t.Fatalf("acquired %d of the moved block", got)
	}
}

// With the host tier missing (its size holds no block), a copy down that
// fails is counted on the disk tier it was written to, not on the host
// tier.
func TestHostTierMissingFailuresCountedBelow(t *testing.T) {
	cfg := testConfig(t, "hostfail")
	cfg.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes), "disk=" + tierDir(t) + ":64MiB"}
	cfg.TierBlockBytes = fabric.MinHostTierBytes + 4096
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	fabric.TierFailIO(a, func(write, _ bool) error {
		if write {
			return unix.EIO
		}
		return nil
	})
	storeThrough(t, c, set, 40, a)
	m := a.Metrics()
	if len(m.Tiers) != 2 || m.Tiers[0].Failures != 0 || m.Tiers[1].Failures == 0 {
		t.Fatalf("tiers' failures %+v, want none on the host tier, some on the disk tier", m.Tiers)
	}
}

// An import that another set of the node's finds in the host tier says
// so: its fetch's transport is "host"; one found on disk says "disk".
func TestHostTierImportTransport(t *testing.T) {
	cfg := testConfig(t, "hostimport")
	cfg.Tiers = []string{fmt.Sprintf("disk=%s:64MiB", tierDir(t)), fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
	// No read-ahead: the first import's would bring up blocks of the
	// importer's set beside the test, which picks the next block to
	// import as one the set does not hold.
	cfg.TierReadAhead = 0
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, 64, a)
	e := tierEngine
	e.Name = "importer"
	set2 := register(t, c, e)
	for _, want := range []string{"host", "disk"} {
		if want == "disk" {
			if !fabric.TierMoveAllDown(a) {
				t.Fatal("nothing moved down from the host tier")
			}
		}
		i := slices.IndexFunc(hashes, func(h uint64) bool {
			return fabric.TierHolding(a, set.ID, h) == want && !fabric.BlockSetHolds(a, set2.ID, h)
		})
		if i < 0 {
			t.Fatalf("no block in the %s tier to import", want)
		}
		resp, err := c.Import(context.Background(), set2.ID, hashes[i:i+1])
		if err != nil || len(resp.Blocks) != 1 || len(resp.Fetches) != 1 || resp.Fetches[0].Transport != want {
			t.Fatalf("import of a block in the %s tier: %v, fetches %v, %s", want, err, resp.GetFetches(), resp.GetError())
		}
	}
}

// Peers count a holder's host-tier blocks as in memory and its disk
// tiers' as on disk only, in either index mode: once the holder's blocks
// sit in its set, its host tier and its disk tier, an importer's index
// says exactly the disk tier's are on disk only.
func TestHostTierBlocksCountInMemoryAtPeers(t *testing.T) {
	for _, tc := range []struct {
		mode  string
		nodes int
		index func(c *fabric.Config)
	}{
		{"whole", 2, func(*fabric.Config) {}},
		{"owned", 3, func(c *fabric.Config) {
			c.IndexMode, c.IndexReplicas = fabric.IndexOwned, 2
			c.IndexCacheTTL = time.Millisecond // every poll below asks the owners afresh
		}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			const n = 600 // more than the set's 32 slots and the host tier's blocks together
			dir := tierDir(t)
			agents := clusterWith(t, tc.nodes, func(i int, c *fabric.Config) {
				tc.index(c)
				if i == 0 {
					c.Tiers = []string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes), "disk=" + dir + ":64MiB"}
				}
			})
			holder, importer := agents[0], agents[1]
			c := dial(t, holder)
			hashes := storeThrough(t, c, register(t, c, tierEngine), n, holder)
			ts := tiersStatus(t, c, 2)
			if ts[0].Blocks == 0 || ts[1].Blocks == 0 {
				t.Fatalf("tiers %v, want blocks in both", ts)
			}
			onDisk := int(ts[1].Blocks)
			wait.For(t, 20*time.Second, "the importer counts the disk tier's blocks alone as on disk only", func() error {
				ov, err := dial(t, importer).Lookup(context.Background(), hashes)
				if err != nil || len(ov) == 0 || ov[0].Blocks != n {
					return fmt.Errorf("overlaps %v (%v)", ov, err)
				}
				if d := fabric.IndexDiskOnly(importer, holder.NodeName(), hashes); d != onDisk {
					return fmt.Errorf("%d of %d blocks on disk only, the disk tier holds %d", d, n, onDisk)
				}
				return nil
			})
		})
	}
}

// A block moved down from the host tier keeps its parent's link to it
// only while it is that parent's child: one linked to the same parent
// since stays the parent's child, whichever of the two moves first.
func TestHostTierMoveKeepsTheNewerLink(t *testing.T) {
	cfg := testConfig(t, "hostlink")
	cfg.Tiers = []string{fmt.Sprintf("disk=%s:64MiB", tierDir(t)), fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}
	cfg.TierReadAhead = 0
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	hashes := storeThrough(t, c, set, 64, a)
	var inHost []uint64
	for _, h := range hashes {
		if fabric.TierHolding(a, set.ID, h) == "host" {
			inHost = append(inHost, h)
		}
	}
	if len(inHost) < 2 {
		t.Fatalf("%d blocks in the host tier, want 2 or more", len(inHost))
	}
	const parent = 1<<62 | 0x5eed
	older, newer := inHost[0], inHost[len(inHost)-1]
	if !fabric.TierLink(a, set.ID, older, parent) || !fabric.TierLink(a, set.ID, newer, parent) {
		t.Fatal("blocks in the host tier not linked")
	}
	check := func(when string) {
		t.Helper()
		if c, ok := fabric.TierChild(a, set.ID, parent); !ok || c != newer {
			t.Fatalf("%s: the parent's child is %x (%v), want the newer %x", when, c, ok, newer)
		}
	}
	check("before any move")
	for moves := 0; fabric.TierHolding(a, set.ID, older) == "host" || fabric.TierHolding(a, set.ID, newer) == "host"; moves++ {
		if moves > len(hashes) {
			t.Fatal("the two blocks linked did not move down")
		}
		if fabric.TierMoveDown(a, 1) == 0 {
			t.Fatal("nothing moved down from the host tier")
		}
		check(fmt.Sprintf("after %d moves", moves+1))
	}
	if fabric.TierHolding(a, set.ID, older) != "disk" || fabric.TierHolding(a, set.ID, newer) != "disk" {
		t.Fatal("the blocks linked are not on disk after the moves")
	}
}
