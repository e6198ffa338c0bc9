package fabric_test

import (
	"context"
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

// BenchmarkTierOffload is the rate at which the disk tier copies blocks
// down as its copier does (the blocks queued taken in batches of up to 128,
// each block written with O_DIRECT straight from its slot, or gathered
// into canonical order first where O_DIRECT does not take the slot's
// memory as it is, its write started at once, each batch's data and
// journal records synced once; straight/block says which), against
// O_DIRECT writes of the same bytes from 8 goroutines to a file in the
// same directory, then one data sync, in the same run; and against the
// same writes from the blocks' own slots (the pieces and a trailer page a
// copy down writes straight, one vectored write each: x-slots), the bare
// disk's rate from pool memory rather than from one buffer per writer
// written again and again. 256 blocks of 256 KiB
// registered once; each iteration copies all of them down (dropped from
// the tier again between iterations, outside the timing).
func BenchmarkTierOffload(b *testing.B) {
	const blocks, copiers = 256, 8
	dir := b.TempDir()
	a := startBenchAgentWith(b, dir, filepath.Join(dir, "ca"), "offload", "127.0.0.1", "host=128MiB", "", func(c *fabric.Config) {
		c.Tiers = []string{"disk=" + filepath.Join(dir, "tier") + ":1GiB"}
	})
	ctx := context.Background()
	model := layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	e := client.Engine{Name: "writer", Model: model, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: blocks}
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	set, err := c.Register(ctx, e)
	if err != nil {
		b.Fatal(err)
	}
	hashes := storeThrough(b, c, set, blocks) // all kept: the set has a slot for each
	blockBytes := int(set.Layout.Strides().Shard) + 16
	blockBytes = (blockBytes + 4095) &^ 4095
	path := filepath.Join(dir, "baseline")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_DIRECT, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(blocks*blockBytes)); err != nil {
		b.Fatal(err)
	}
	// Each block's slot memory as a copy down writes it straight, with a
	// trailer page of its own.
	pieces := make([][][]byte, blocks)
	trailers, err := unix.Mmap(-1, 0, blocks*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(trailers)
	for i, h := range hashes {
		p := fabric.TierSlotPieces(a, set.ID, h)
		if p == nil {
			b.Fatalf("block %d is not written straight from its slot", i)
		}
		pieces[i] = append(p, trailers[i*4096:(i+1)*4096])
	}
	direct := func(fromSlots bool) time.Duration {
		start := time.Now()
		next := make(chan int)
		var wg sync.WaitGroup
		for range copiers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf, _ := unix.Mmap(-1, 0, blockBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
				defer unix.Munmap(buf)
				for i := range next {
					var err error
					if fromSlots {
						_, err = unix.Pwritev(int(f.Fd()), pieces[i], int64(i*blockBytes))
					} else {
						_, err = unix.Pwrite(int(f.Fd()), buf, int64(i*blockBytes))
					}
					if err != nil {
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
		if err := unix.Fdatasync(int(f.Fd())); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	var offload, base, slots time.Duration
	straight0, _ := fabric.TierDirectWrites(a)
	b.SetBytes(int64(blocks * blockBytes))
	for b.Loop() {
		b.StopTimer()
		if err := fabric.TierDrop(a, set.ID, hashes); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		n, err := fabric.TierCopyDown(a, set.ID, hashes)
		if err != nil || n != blocks {
			b.Fatalf("copied %d of %d blocks down: %v", n, blocks, err)
		}
		offload += time.Since(start)
		base += direct(false)
		slots += direct(true)
	}
	gb := float64(b.N*blocks*blockBytes) / 1e9
	b.ReportMetric(gb/offload.Seconds(), "offload-GB/s")
	b.ReportMetric(gb/base.Seconds(), "direct-GB/s")
	b.ReportMetric(base.Seconds()/offload.Seconds(), "x-direct")
	b.ReportMetric(gb/slots.Seconds(), "slots-GB/s")
	b.ReportMetric(slots.Seconds()/offload.Seconds(), "x-slots")
	straight, _ := fabric.TierDirectWrites(a)
	b.ReportMetric(float64(straight-straight0)/float64(b.N*blocks), "straight/block")
}
