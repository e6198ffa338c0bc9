package fabric_test

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
)

// BenchmarkTierRestore is the rate at which an engine's Acquire brings
// blocks back from a disk tier (read with O_DIRECT straight into its
// slots, checked twice; runs of 8, as an engine acquiring prefixes would, the
// engine's calls included), with read-ahead along the sequence on (the
// default, Config.TierReadAhead 16, 14 in its set of 32 slots: the next
// run read while the engine makes its calls) and off (an agent of its own, TierReadAhead 0), against
// O_DIRECT reads of as many bytes (random, so that no layer below serves
// zeros for less) in reads of one block, one at a time,
// from a file in the same directory, in the same run (x-direct, into one
// buffer read into again and again); and against the same reads 8 at a
// time, as many as the tier reads at once, into memory of the set's
// size, block i into the i%32th of 32 buffers as the set's 32 slots take
// the restored blocks (x-slots: the bare reads into memory that is not
// one buffer kept in the caches). x-off is read-ahead on against off
// (off's time over on's); off-x-slots is off against the bare reads;
// ra-hits the fraction of the blocks acquired that read-ahead brought up,
// ra-starts the read-aheads started per run of 8 acquired (1 where each
// run is read ahead on its own, less where one read-ahead follows the
// engine along several).
// 256 blocks of 256 KiB go down once per agent; each iteration restores
// all of them through each agent (they go back to being disk-held as
// later ones take their slots), on and off in turns going first.
func BenchmarkTierRestore(b *testing.B) {
	const blocks = 256
	dir := b.TempDir()
	on := restoreBenchAgent(b, dir, "restore", fabric.DefaultTierReadAhead, blocks)
	off := restoreBenchAgent(b, dir, "restore-off", 0, blocks)
	blockBytes := int(on.set.Layout.Strides().Shard)
	// The baseline's file: as many bytes, random (a file of zeros may be
	// read for less by a virtual disk), written once.
	path := filepath.Join(dir, "baseline")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	content := make([]byte, blocks*blockBytes)
	rand.NewChaCha8([32]byte{1}).Read(content)
	_, werr := f.Write(content)
	if serr := f.Sync(); werr == nil {
		werr = serr
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		b.Fatalf("the baseline's file: %v", werr)
	}
	buf, err := unix.Mmap(-1, 0, blockBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(buf)
	slotMem, err := unix.Mmap(-1, 0, 32*blockBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(slotMem)
	// The bare reads of the same bytes, 8 at a time, into the 32 buffers.
	intoSlots := func() time.Duration {
		start := time.Now()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		next := make(chan int)
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range next {
					at := i % 32 * blockBytes
					if _, err := unix.Pread(fd, slotMem[at:at+blockBytes], int64(i*blockBytes)); err != nil {
						b.Error(err)
					}
				}
			}()
		}
		for i := range blocks {
			next <- i
		}
		close(next)
		wg.Wait()
		return time.Since(start)
	}
	var restore, restoreOff, direct, slots time.Duration
	b.SetBytes(int64(blocks * blockBytes))
	// Once checked byte for byte, outside the timing.
	for _, r := range []*restoreBench{on, off} {
		if got := acquireChecked(b, r.c, r.set, r.hashes, 1); got != blocks {
			b.Fatalf("restored %d of %d blocks", got, blocks)
		}
	}
	hits0 := on.a.Metrics().Tiers[0].ReadAheadHits
	started0, _, _ := fabric.ReadAheadCounts(on.a)
	// On and off take turns going first, so that neither always finds the
	// disk and the caches as the other left them.
	for iter := 0; b.Loop(); iter++ {
		if iter%2 == 0 {
			restore += on.acquireAll(b)
			restoreOff += off.acquireAll(b)
		} else {
			restoreOff += off.acquireAll(b)
			restore += on.acquireAll(b)
		}
		start := time.Now()
		fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECT, 0)
		if err != nil {
			b.Fatal(err)
		}
		for i := range blocks {
			if _, err := unix.Pread(fd, buf, int64(i*blockBytes)); err != nil {
				b.Fatal(err)
			}
		}
		unix.Close(fd)
		direct += time.Since(start)
		slots += intoSlots()
	}
	gb := float64(b.N*blocks*blockBytes) / 1e9
	b.ReportMetric(gb/restore.Seconds(), "restore-GB/s")
	b.ReportMetric(gb/restoreOff.Seconds(), "off-GB/s")
	b.ReportMetric(restoreOff.Seconds()/restore.Seconds(), "x-off")
	b.ReportMetric(gb/direct.Seconds(), "direct-GB/s")
	b.ReportMetric(direct.Seconds()/restore.Seconds(), "x-direct")
	b.ReportMetric(gb/slots.Seconds(), "slots-GB/s")
	b.ReportMetric(slots.Seconds()/restore.Seconds(), "x-slots")
	b.ReportMetric(slots.Seconds()/restoreOff.Seconds(), "off-x-slots")
	b.ReportMetric(float64(on.a.Metrics().Tiers[0].ReadAheadHits-hits0)/float64(b.N*blocks), "ra-hits")
	started, _, _ := fabric.ReadAheadCounts(on.a)
	b.ReportMetric(float64(started-started0)/float64(b.N*blocks/8), "ra-starts")
}

// restoreBench is one agent of BenchmarkTierRestore: a reader's set and
// the sequence it restores, on disk only.
type restoreBench struct {
	a      *fabric.Agent
	c      *client.Client
	set    *client.BlockSet
	hashes []uint64
}

// restoreBenchAgent starts an agent with a disk tier reading ahead up to
// readAhead blocks, stores blocks through a writer's set, frees that set
// (its blocks go down whole) and registers a reader's.
func restoreBenchAgent(b *testing.B, dir, name string, readAhead, blocks int) *restoreBench {
	b.Helper()
	a := startBenchAgentWith(b, dir, filepath.Join(dir, "ca"), name, "127.0.0.1", "host=128MiB", "", func(c *fabric.Config) {
		c.Tiers = []string{"disk=" + filepath.Join(dir, name, "tier") + ":1GiB"}
		c.BlockSetGrace = 100 * time.Millisecond
		c.NoOrphanCache = true // the set is freed, its blocks then on disk only
		c.TierReadAhead = readAhead
	})
	ctx := context.Background()
	model := layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	e := client.Engine{Name: "writer", Model: model, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 32}
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		b.Fatal(err)
	}
	set, err := c.Register(ctx, e)
	if err != nil {
		b.Fatal(err)
	}
	hashes := storeThrough(b, c, set, blocks)
	c.Close() // the set goes down whole
	deadline := time.Now().Add(30 * time.Second)
	c, err = client.Dial(ctx, a.EngineSocket())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	for {
		st, err := c.Status(ctx)
		if err == nil && len(st.BlockSets) == 0 && st.Tiers[0].Blocks == uint64(blocks) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the blocks did not all go down: %v %v", st, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.Name = "reader"
	set, err = c.Register(ctx, e)
	if err != nil {
		b.Fatal(err)
	}
	return &restoreBench{a: a, c: c, set: set, hashes: hashes}
}

// acquireAll acquires and releases every block of r's sequence, 8 at a
// time, and returns the time it took.
func (r *restoreBench) acquireAll(b *testing.B) time.Duration {
	return acquireRuns(b, r.c, r.set.ID, r.hashes)
}

// acquireRuns acquires and releases hashes in runs of 8, as an engine
// acquiring prefixes would (a tier's restores among its calls), and
// returns the time it took. len(hashes) is a multiple of 8.
func acquireRuns(b *testing.B, c *client.Client, set uint64, hashes []uint64) time.Duration {
	ctx := context.Background()
	start := time.Now()
	for from := 0; from < len(hashes); from += 8 {
		refs, err := c.Acquire(ctx, set, hashes[from:from+8])
		if err != nil || len(refs) != 8 {
			b.Fatalf("acquire %d..%d: %d blocks, %v", from, from+7, len(refs), err)
		}
		slots := make([]uint32, len(refs))
		for i, ref := range refs {
			slots[i] = ref.Slot
		}
		if err := c.Release(ctx, set, slots); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}
