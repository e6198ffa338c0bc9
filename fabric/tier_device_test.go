//go:build cgo && linux

package fabric_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// gpuSlots reads and writes the slots of a block set in an agent's
// device pool from this process, through the same softcuda the agent
// loaded, as an engine's kernels would: one chunk at a time.
type gpuSlots struct {
	t       testing.TB
	l       *layout.Layout
	drv     *cuda.Driver
	streams []*cuda.Stream
	host    [][]byte // a region's worth per rank, for kvtest
}

func newGPUSlots(t testing.TB, lib string, l *layout.Layout) *gpuSlots {
	t.Helper()
	if len(l.Regions) == 0 || l.Regions[0].Kind != layout.Device {
		t.Fatalf("block set in %v memory, want device", l.Regions)
	}
	drv, err := cuda.Open(cuda.Config{Path: lib})
	if err != nil {
		t.Fatal(err)
	}
	g := &gpuSlots{t: t, l: l, drv: drv}
	t.Cleanup(g.close)
	for _, reg := range l.Regions {
		st, err := drv.NewStream(int(reg.Device))
		if err != nil {
			t.Fatal(err)
		}
		g.streams = append(g.streams, st)
		g.host = append(g.host, make([]byte, reg.Size))
	}
	return g
}

func (g *gpuSlots) close() {
	for _, st := range g.streams {
		st.Close()
	}
	g.streams = nil
	if g.drv != nil {
		g.drv.Close()
		g.drv = nil
	}
}

// chunks calls f with each chunk of slot: its rank and offset.
func (g *gpuSlots) chunks(slot int, f func(r int, off uint64) error) {
	g.t.Helper()
	planes := 2
	if g.l.Model.MLA {
		planes = 1
	}
	for r := range g.l.Regions {
		for layer := range g.l.Model.Layers {
			for p := range planes {
				if err := f(r, g.l.ChunkOffset(slot, layer, p)); err != nil {
					g.t.Fatalf("slot %d rank %d: %v", slot, r, err)
				}
			}
		}
	}
}

// fill writes block content id into slot.
func (g *gpuSlots) fill(slot int, id uint64) {
	g.t.Helper()
	kvtest.Fill(g.l, g.host, slot, id)
	n := g.l.Strides().Chunk
	g.chunks(slot, func(r int, off uint64) error {
		return g.streams[r].CopyHtoD(g.l.Regions[r].Base+off, g.host[r][off:off+n])
	})
}

// check reads slot back from the GPU and checks it holds block content id.
func (g *gpuSlots) check(slot int, id uint64) error {
	g.t.Helper()
	n := g.l.Strides().Chunk
	g.chunks(slot, func(r int, off uint64) error {
		clear(g.host[r][off : off+n])
		return g.streams[r].CopyDtoH(g.host[r][off:off+n], g.l.Regions[r].Base+off)
	})
	return kvtest.Check(g.l, g.host, slot, id)
}

// deviceTierConfig gives c a device pool of 8 MiB on softcuda's GPU 0
// and a disk tier in dir.
func deviceTierConfig(c *fabric.Config, lib, dir string) {
	c.RDMA = "off"
	c.Pools = []string{"device:0=8MiB"}
	c.CUDALibrary = lib
	c.Tiers = []string{"disk=" + dir + ":64MiB"}
}

// A device block set that stores four times its slots keeps every block
// on the node: the blocks it recycles are copied down from the GPU
// through pinned staging to the disk tier, Lookup says so and brings them
// up, Prefetch and Acquire restore them into the set's slots byte for byte
// (read back from the GPU), and a peer imports all of them byte for byte, the
// disk-held ones staged on the holder into device slots of their own.
// A block whose chunks lie together in its region moves in one copy per
// rank; staging parts of 1000 bytes cut it (and each 4 KiB chunk) into
// many; a set arranged layer by layer, over two ranks, moves chunk by
// chunk; a set whose two ranks are on two GPUs (each copy on its rank's
// GPU, strictly, and slow, so that a missing synchronisation shows) moves
// a run per GPU.
func TestTierDevicePoolKeepsWhatItRecycles(t *testing.T) {
	layerSeparate := tierEngine
	layerSeparate.TPSize, layerSeparate.Arrangement = 2, layout.LayerSeparate
	twoRanks := tierEngine
	twoRanks.TPSize = 2
	for _, tc := range []struct {
		name   string
		engine client.Engine
		stage  uint64
		gpus   int
	}{
		{"staged 4 MiB at a time", tierEngine, 0, 1},
		{"staged in parts of 1000 bytes", tierEngine, 1000, 1},
		{"layer by layer over two ranks", layerSeparate, 0, 1},
		{"two ranks on two GPUs", twoRanks, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const n = 128
			lib, _ := gpuLibs(t)
			if tc.gpus == 2 {
				twoStrictGPUs(t, "0000:18:00.0,0000:2A:00.0")
			} else {
				t.Setenv("SOFTCUDA_DEVICES", "")
				t.Setenv("SOFTCUDA_MEMORY", "64M")
			}
			dir := tierDir(t)
			agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
				c.RDMA = "off"
				// A lease of disk-held blocks stages each into a device
				// slot first, here in parts of 1000 bytes through a strict
				// stand-in GPU: under -race on loaded cores it can outlast
				// the default bound of a control call (half of 2 s).
				c.PeerTimeout = 10 * time.Second
				if i == 0 {
					deviceTierConfig(c, lib, dir)
					// No read-ahead: the look-up's would bring up blocks
					// beside the test, which picks the blocks to prefetch
					// as ones the set does not hold.
					c.TierReadAhead = 0
					if tc.gpus == 2 {
						c.Pools = []string{"device=8MiB"}
					}
					fabric.SetStageBytes(c, tc.stage)
				}
			})
			n1, n2 := agents[0], agents[1]
			c := dial(t, n1)
			set := register(t, c, tc.engine)
			if gpus := set.Layout.Regions[len(set.Layout.Regions)-1].Device + 1; int(gpus) != tc.gpus {
				t.Fatalf("the set's ranks are on %d GPUs, want %d", gpus, tc.gpus)
			}
			g := newGPUSlots(t, lib, set.Layout)
			hashes := storeThroughSlots(t, c, set, g, n, n1)
			if ts := tierStatus(t, c); ts.Offloads < n-32 || ts.Blocks < n-32 {
				t.Fatalf("tier after storing %d blocks through 32 device slots: %+v, want %d or more copied down", n, ts, n-32)
			}
			lr, err := c.API().Lookup(context.Background(), &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: hashes[:8]})
			if err != nil {
				t.Fatal(err)
			}
			if len(lr.LocalTiers) != 8 || lr.LocalTiers[0] != "disk" {
				t.Fatalf("local tiers of the first 8 blocks: %q, want disk first", lr.LocalTiers)
			}
			lr, err = c.API().Lookup(context.Background(), &fabricpb.LookupRequest{BlockSet: set.ID, Hashes: hashes[:1]})
			if err != nil || lr.LocalTiers[0] != "device" {
				t.Fatalf("after a look-up restored it, the first block is in %q (%v), want device", lr.GetLocalTiers(), err)
			}
			// Prefetch brings 8 disk-held blocks up into device slots.
			from := 8
			for from+8 < n && slices.ContainsFunc(hashes[from:from+8], func(h uint64) bool { return fabric.BlockSetHolds(n1, set.ID, h) }) {
				from++
			}
			pr, err := c.Prefetch(context.Background(), set.ID, hashes[from:from+8])
			if err != nil || pr.InMemory != 8 || pr.Restored != 8 || pr.Error != "" {
				t.Fatalf("prefetch of blocks %d..%d, on disk: %+v %v", from, from+7, pr, err)
			}
			if got := acquireCheckedSlots(t, c, set, g, hashes[from:from+8], uint64(from+1)); got != 8 {
				t.Fatalf("acquired %d of 8 prefetched blocks", got)
			}
			if got := acquireCheckedSlots(t, c, set, g, hashes, 1); got != n {
				t.Fatalf("acquired %d of %d blocks", got, n)
			}
			if ts := tierStatus(t, c); ts.Restores < n-32 || ts.ChecksumFailures != 0 {
				t.Fatalf("tier after acquiring everything: %+v, want %d or more restores", ts, n-32)
			}

			peerImportsAll(t, dial(t, n2), hashes)
		})
	}
}

// deviceBlocksOnDisk stores n blocks (content ids 1..n) through a device
// block set of an agent with a disk tier in a new directory, lets the
// engine go so that its set is copied down and freed, and closes the
// agent: every block is then on disk only. It returns the directory, the
// agent's lib and the blocks' hashes.
func deviceBlocksOnDisk(t *testing.T, n int) (dir, lib string, hashes []uint64) {
	t.Helper()
	lib, _ = gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	dir = tierDir(t)
	cfg := testConfig(t, "gpu-tiered")
	deviceTierConfig(&cfg, lib, dir)
	cfg.BlockSetGrace = 100 * time.Millisecond
	cfg.NoOrphanCache = true // the set is freed, its blocks then on disk only
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	g := newGPUSlots(t, lib, set.Layout)
	hashes = storeThroughSlots(t, c, set, g, n, a)
	// The engine goes: its set is freed once the blocks still in device
	// slots are copied down too.
	g.close()
	c.Close()
	watcher := newClient(t, a)
	wait.For(t, 20*time.Second, "the engine's device set is copied down and freed", func() error {
		st, err := watcher.Status(context.Background())
		if err != nil || len(st.BlockSets) != 0 || st.Tiers[0].Blocks != uint64(n) {
			return fmt.Errorf("block sets %d, tier %+v, %v", len(st.GetBlockSets()), st.GetTiers(), err)
		}
		return nil
	})
	watcher.Close()
	a.Close()
	return dir, lib, hashes
}

// A device set whose engine has gone copies its blocks down before it is
// freed; a restarted agent with a device pool finds them (the tier's
// journal), announces them, serves them to a peer and restores them
// into a new engine's device set byte for byte; a block whose bytes were
// changed on disk is dropped, never uploaded into a slot.
func TestTierDevicePoolSurvivesRestart(t *testing.T) {
	const n = 64
	dir, lib, hashes := deviceBlocksOnDisk(t, n)

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

	cfg2 := testConfig(t, "gpu-tiered")
	deviceTierConfig(&cfg2, lib, dir)
	a2 := startAgent(t, cfg2)
	c2 := newClient(t, a2)
	if ts := tierStatus(t, c2); ts.Blocks != n {
		t.Fatalf("after a restart the tier holds %d blocks, want %d", ts.Blocks, n)
	}
	wait.For(t, 10*time.Second, "the restarted node announces its disk blocks", func() error {
		ov, err := c2.Lookup(context.Background(), hashes)
		if err != nil || len(ov) == 0 || ov[0].Blocks != n {
			return fmt.Errorf("overlaps %v %v", ov, err)
		}
		return nil
	})
	// A peer imports them, the restarted node holding no engine set of
	// their layout: each staged from disk into a device staging set and
	// served from there, byte for byte; the changed block is not served.
	cfg3 := testConfig(t, "gpu-peer")
	cfg3.DevCADir = cfg2.DevCADir
	cfg3.Join = []string{a2.GossipAddr()}
	cfg3.RDMA = "off"
	// Staging from disk through the soft GPU under the race detector on a
	// loaded machine can take past the 2 s default.
	cfg3.PeerTimeout = 10 * time.Second
	a3 := startAgent(t, cfg3)
	c3 := newClient(t, a3)
	waitLookup(t, c3, hashes)
	e := tierEngine
	e.Name = "importer"
	set3 := register(t, c3, e)
	imported := 0
	var missed []string
	for i := range hashes {
		resp, err := c3.Import(context.Background(), set3.ID, hashes[i:i+1])
		if err != nil && code(err) != codes.Unavailable { // the changed block: its holder no longer has it
			t.Fatalf("import of block %d: %v", i, err)
		}
		if err == nil && len(resp.Blocks) == 1 {
			checkImported(t, set3, resp.Blocks, uint64(i+1))
			imported++
			c3.Release(context.Background(), set3.ID, []uint32{resp.Blocks[0].Slot})
		} else {
			missed = append(missed, fmt.Sprintf("block %d: %v", i, err))
		}
	}
	if ts := tierStatus(t, c2); imported != n-1 || ts.ChecksumFailures != 1 {
		t.Fatalf("a peer imported %d of %d blocks (missed %q), tier %+v; want all but the changed one, one checksum failure", imported, n, missed, ts)
	}

	set2 := register(t, c2, tierEngine)
	g2 := newGPUSlots(t, lib, set2.Layout)
	found := 0
	for i := range hashes {
		refs, err := c2.Acquire(context.Background(), set2.ID, hashes[i:i+1])
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) == 1 {
			if err := g2.check(int(refs[0].Slot), uint64(i+1)); err != nil {
				t.Fatalf("block %d restored after a restart: %v", i, err)
			}
			found++
			c2.Release(context.Background(), set2.ID, []uint32{refs[0].Slot})
		}
	}
	if ts := tierStatus(t, c2); ts.ChecksumFailures != 1 || found != n-1 {
		t.Fatalf("after flipping a byte of one block: %d of %d restored, tier %+v; want all but one, one checksum failure", found, n, ts)
	}
}

// An allocation in a device set never waits for the disk: with every
// write to the tier held, the set's slots, each holding a block whose
// copy down is under way, are allocated again twice over without
// waiting; the blocks whose copies had not begun are copied out of the
// GPU when their slots are taken, and every block not dropped restores
// byte for byte once the writes go on.
func TestTierDevicePoolAllocateDoesNotWaitForTheDisk(t *testing.T) {
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	dir := tierDir(t)
	cfg := testConfig(t, "gpu-nowait")
	deviceTierConfig(&cfg, lib, dir)
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	allocateDoesNotWait(t, a, c, set, newGPUSlots(t, lib, set.Layout), true)
}

// A copy down whose download from the GPU fails (the driver refuses
// every event the stager records) is counted as a failure and writes nothing to disk;
// the block stays in its slot as before its offer, allocations go on,
// and the blocks still in memory read back whole.
func TestTierDevicePoolCopyFailureKeepsTheBlock(t *testing.T) {
	const n = 64
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	t.Setenv("SOFTCUDA_FAIL", "cuEventRecord=1") // CUDA_ERROR_INVALID_VALUE: staging fails
	dir := tierDir(t)
	cfg := testConfig(t, "gpu-fail")
	deviceTierConfig(&cfg, lib, dir)
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	g := newGPUSlots(t, lib, set.Layout)
	hashes := storeThroughSlots(t, c, set, g, n, a)
	tm := a.Metrics().Tiers[0]
	if tm.Failures == 0 || tm.Offloads != 0 || tm.Blocks != 0 {
		t.Fatalf("tier after every download failed: %+v, want failures and nothing on disk", tm)
	}
	// The set's slots hold blocks still, whole: at least half of them.
	found := 0
	for i, h := range hashes {
		found += acquireCheckedSlots(t, c, set, g, []uint64{h}, uint64(i+1))
	}
	if found < 16 {
		t.Fatalf("%d blocks of %d found in the set's 32 slots, want 16 or more", found, n)
	}
}

// Over device pools the tier's watermark defaults to 0.85 of a set's
// slots (host pools: 0.90), and --tier-watermark sets it for both: a set
// of 32 slots keeps 27 registered blocks before recycling (5 slots kept
// free, copying down ahead of need), 28 at 0.90.
func TestTierDevicePoolWatermark(t *testing.T) {
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	for _, tc := range []struct {
		name      string
		device    bool
		watermark float64
		retains   int
	}{
		{"device pool, default", true, 0, 27},
		{"device pool, 0.90", true, 0.90, 28},
		{"host pool, default", false, 0, 28},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "watermark")
			cfg.Tiers = []string{"disk=" + tierDir(t) + ":64MiB"}
			if tc.device {
				deviceTierConfig(&cfg, lib, tierDir(t))
			}
			cfg.TierWatermark = tc.watermark
			a := startAgent(t, cfg)
			set := register(t, newClient(t, a), tierEngine)
			if dev := len(set.Layout.Regions) > 0 && set.Layout.Regions[0].Kind == layout.Device; dev != tc.device {
				t.Fatalf("set in device memory: %v, want %v", dev, tc.device)
			}
			if set.Retains != tc.retains {
				t.Fatalf("a set of %d slots retains %d blocks, want %d", tierEngine.Slots, set.Retains, tc.retains)
			}
		})
	}
}

// A device block set's recycled blocks go down two tiers, through the
// driver's staging to the host tier, then, once it is full, to the disk
// tier; every one restores into the set's device slots byte for byte.
func TestHostTierUnderADevicePool(t *testing.T) {
	const n = 600
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	dir := tierDir(t)
	cfg := testConfig(t, "devhost")
	deviceTierConfig(&cfg, lib, dir)
	cfg.Tiers = append([]string{fmt.Sprintf("host=%d", fabric.MinHostTierBytes)}, cfg.Tiers...)
	a := startAgent(t, cfg)
	c := newClient(t, a)
	set := register(t, c, tierEngine)
	g := newGPUSlots(t, lib, set.Layout)
	hashes := storeThroughSlots(t, c, set, g, n, a)
	ts := tiersStatus(t, c, 2)
	if ts[0].Kind != "host" || ts[0].Offloads < n-32 || ts[0].Evictions != 0 || ts[1].Offloads == 0 || ts[1].Evictions != 0 {
		t.Fatalf("tiers after %d blocks through 32 device slots: %v, want all copied to the host tier, its oldest moved to disk", n, ts)
	}
	if h0, h1 := fabric.TierHolding(a, set.ID, hashes[0]), fabric.TierHolding(a, set.ID, hashes[n-100]); h0 != "disk" || h1 != "host" {
		t.Fatalf("the first block in tier %q, block %d in %q; want disk, host", h0, n-100, h1)
	}
	if got := acquireCheckedSlots(t, c, set, g, hashes, 1); got != n {
		t.Fatalf("acquired %d of %d blocks", got, n)
	}
}

// A restore whose upload into a device slot cannot be synchronised (the
// driver fails the stream's synchronisation: the copy may still land)
// keeps that slot out of use: the block is not served, and the set then
// allocates every slot but that one, so that no later block's bytes can
// be overwritten by the late copy.
func TestTierDevicePoolUnsyncedRestoreKeepsItsSlot(t *testing.T) {
	const n = 64
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	// The process's first stream synchronisation fails: the blocks are
	// stored without writes from here and copied down by downloads,
	// which synchronise on events, so it is the restore's upload.
	t.Setenv("SOFTCUDA_FAIL", "cuStreamSynchronize=1@1")
	dir := tierDir(t)
	cfg := testConfig(t, "gpu-unsynced")
	deviceTierConfig(&cfg, lib, dir)
	a := startAgent(t, cfg)
	c := newClient(t, a)
	ctx := context.Background()
	set := register(t, c, tierEngine)
	hashes := storeThroughSlots(t, c, set, nil, n, a)
	i := slices.IndexFunc(hashes, func(h uint64) bool {
		return fabric.TierHolding(a, set.ID, h) == "disk" && !fabric.BlockSetHolds(a, set.ID, h)
	})
	if i < 0 {
		t.Fatalf("no block on disk alone: %+v", a.Metrics().Tiers)
	}
	refs, err := c.Acquire(ctx, set.ID, hashes[i:i+1])
	if err == nil && len(refs) != 0 {
		t.Fatalf("a block whose upload failed was served: %v", refs)
	}
	if r := a.Metrics().Pool.Retired; r != 1 {
		t.Fatalf("%d slots retired (kept out of use), want 1", r)
	}
	slots, err := c.Allocate(ctx, set.ID, int(tierEngine.Slots))
	if err == nil {
		t.Fatalf("allocated all %d slots, the one an upload may still land in among them: %v", tierEngine.Slots, slots)
	}
	slots, err = c.Allocate(ctx, set.ID, int(tierEngine.Slots)-1)
	if err != nil {
		t.Fatalf("every slot but the one kept: %v", err)
	}
	if len(slots) != int(tierEngine.Slots)-1 {
		t.Fatalf("allocated %d slots, want %d", len(slots), tierEngine.Slots-1)
	}
}

// Blocks a device set copied down carry no content checksum (device
// memory is not summed); restored into host memory (here a host pool's
// agent restarted on the tier, staging them for a peer) they get one,
// taken over the bytes the store checked, so that the peer checks every
// block it imports, byte for byte.
func TestTierDeviceBlocksRestoredIntoHostMemoryAreSummed(t *testing.T) {
	const n = 16
	dir, _, hashes := deviceBlocksOnDisk(t, n)

	cfg2 := testConfig(t, "host-tiered")
	cfg2.Tiers = []string{"disk=" + dir + ":64MiB"}
	a2 := startAgent(t, cfg2)
	cfg3 := testConfig(t, "host-peer")
	cfg3.DevCADir = cfg2.DevCADir
	cfg3.Join = []string{a2.GossipAddr()}
	cfg3.PeerTimeout = 10 * time.Second
	a3 := startAgent(t, cfg3)
	peerImportsAll(t, dial(t, a3), hashes)
	if m := a3.Metrics(); m.ChecksumsVerified != n || m.ChecksumsFailed != 0 {
		t.Fatalf("the peer checked %d of %d blocks staged from disk into host memory (%d failed): want all", m.ChecksumsVerified, n, m.ChecksumsFailed)
	}
}
