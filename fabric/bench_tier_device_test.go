//go:build cgo && linux

package fabric_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
)

// BenchmarkTierRestoreDevice is the rate at which an engine's Acquire
// brings blocks back from a disk tier into a block set in a device pool
// (read with O_DIRECT, the store's checksum, uploaded through pinned
// staging with the CUDA stand-in's copies), against the same restore into
// a block set in a host pool (the same read and checks, a copy into the
// slots, the content checksum over them), in the same run: two agents,
// each with a tier of its own; 256 blocks of 256 KiB go down once, each
// iteration restores all of them on each agent in runs of 8 through a
// set of 32 slots, the engine's calls included. The stand-in copies with
// the CPU: the ratio is the staging path's cost on the host, not a GPU's.
func BenchmarkTierRestoreDevice(b *testing.B) {
	const blocks = 256
	lib, _ := gpuLibs(b)
	b.Setenv("SOFTCUDA_DEVICES", "")
	b.Setenv("SOFTCUDA_MEMORY", "128M")
	b.Setenv("SOFTCUDA_COPY_DELAY_US", "")
	b.Setenv("SOFTCUDA_FAIL", "")
	dir := b.TempDir()
	model := layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	e := client.Engine{Name: "writer", Model: model, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 32}
	ctx := context.Background()
	type side struct {
		a     *fabric.Agent
		c     *client.Client
		set   *client.BlockSet
		g     *gpuSlots // nil: host
		spent time.Duration
	}
	var hashes []uint64
	start := func(name, pools string, device bool) *side {
		a := startBenchAgentWith(b, dir, filepath.Join(dir, "ca"), name, "127.0.0.1", pools, "", func(c *fabric.Config) {
			c.Tiers = []string{"disk=" + filepath.Join(dir, name+"-tier") + ":1GiB"}
			c.BlockSetGrace = 100 * time.Millisecond
			c.NoOrphanCache = true // the set is freed, its blocks then on disk only
			if device {
				c.CUDALibrary, c.RDMA = lib, "off"
			}
		})
		c, err := client.Dial(ctx, a.EngineSocket())
		if err != nil {
			b.Fatal(err)
		}
		set, err := c.Register(ctx, e)
		if err != nil {
			b.Fatal(err)
		}
		if device {
			g := newGPUSlots(b, lib, set.Layout)
			hashes = storeThroughSlots(b, c, set, g, blocks, a)
			g.close()
		} else {
			hashes = storeThrough(b, c, set, blocks, a)
		}
		c.Close() // the set goes down whole
		if c, err = client.Dial(ctx, a.EngineSocket()); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		deadline := time.Now().Add(30 * time.Second)
		for {
			st, err := c.Status(ctx)
			if err == nil && len(st.BlockSets) == 0 && st.Tiers[0].Blocks == blocks {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s: the blocks did not all go down: %v %v", name, st, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		r := e
		r.Name = "reader"
		if set, err = c.Register(ctx, r); err != nil {
			b.Fatal(err)
		}
		s := &side{a: a, c: c, set: set}
		// Once checked byte for byte, outside the timing.
		got := 0
		if device {
			s.g = newGPUSlots(b, lib, set.Layout)
			got = acquireCheckedSlots(b, c, set, s.g, hashes, 1)
		} else {
			got = acquireChecked(b, c, set, hashes, 1)
		}
		if got != blocks {
			b.Fatalf("%s: restored %d of %d blocks", name, got, blocks)
		}
		return s
	}
	host := start("host", "host=128MiB", false)
	dev := start("device", "device:0=64MiB", true)
	blockBytes := int(host.set.Layout.Strides().Shard)
	b.SetBytes(int64(blocks * blockBytes))
	restoreAll := func(s *side) { s.spent += acquireRuns(b, s.c, s.set.ID, hashes[:blocks]) }
	for b.Loop() {
		restoreAll(dev)
		restoreAll(host)
	}
	gb := float64(b.N*blocks*blockBytes) / 1e9
	b.ReportMetric(gb/dev.spent.Seconds(), "device-GB/s")
	b.ReportMetric(gb/host.spent.Seconds(), "host-GB/s")
	b.ReportMetric(host.spent.Seconds()/dev.spent.Seconds(), "x-host")
}

// BenchmarkTierOffloadDevice is the rate at which the disk tier copies
// blocks down out of a block set in a device pool (each block downloaded
// device to host through pinned staging with the CUDA stand-in's copies,
// then written as any block: the copier's batches, O_DIRECT, one data and
// journal sync per batch), against the same copies out of a block set in
// a host pool (gathered with the CPU), in the same run: two agents, each
// with a tier of its own, 256 blocks of 256 KiB registered once in a set
// that keeps them all; each iteration copies all of them down on each
// agent (dropped from the tiers again between iterations, outside the
// timing). The stand-in copies with the CPU: the ratio is the staging
// path's cost on the host, not a GPU's.
func BenchmarkTierOffloadDevice(b *testing.B) {
	const blocks = 256
	lib, _ := gpuLibs(b)
	b.Setenv("SOFTCUDA_DEVICES", "")
	b.Setenv("SOFTCUDA_MEMORY", "256M")
	b.Setenv("SOFTCUDA_COPY_DELAY_US", "")
	b.Setenv("SOFTCUDA_FAIL", "")
	dir := b.TempDir()
	model := layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	e := client.Engine{Name: "writer", Model: model, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: blocks}
	ctx := context.Background()
	type side struct {
		a      *fabric.Agent
		set    uint64
		hashes []uint64
		bytes  int // a block's, on disk with its trailer
		spent  time.Duration
	}
	start := func(name, pools string, device bool) *side {
		a := startBenchAgentWith(b, dir, filepath.Join(dir, "ca"), name, "127.0.0.1", pools, "", func(c *fabric.Config) {
			c.Tiers = []string{"disk=" + filepath.Join(dir, name+"-tier") + ":1GiB"}
			if device {
				c.CUDALibrary, c.RDMA = lib, "off"
			}
		})
		c, err := client.Dial(ctx, a.EngineSocket())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		set, err := c.Register(ctx, e)
		if err != nil {
			b.Fatal(err)
		}
		s := &side{a: a, set: set.ID, bytes: int(set.Layout.Strides().Shard)}
		if device {
			g := newGPUSlots(b, lib, set.Layout)
			s.hashes = storeThroughSlots(b, c, set, g, blocks, a) // all kept: the set has a slot for each
		} else {
			s.hashes = storeThrough(b, c, set, blocks)
		}
		return s
	}
	host := start("host", "host=128MiB", false)
	dev := start("device", "device:0=96MiB", true)
	blockBytes := (host.bytes + 16 + 4095) &^ 4095
	b.SetBytes(int64(blocks * blockBytes))
	copyDown := func(s *side) {
		b.StopTimer()
		if err := fabric.TierDrop(s.a, s.set, s.hashes); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		n, err := fabric.TierCopyDown(s.a, s.set, s.hashes)
		if err != nil || n != blocks {
			b.Fatalf("copied %d of %d blocks down: %v", n, blocks, err)
		}
		s.spent += time.Since(start)
	}
	for b.Loop() {
		copyDown(dev)
		copyDown(host)
	}
	gb := float64(b.N*blocks*blockBytes) / 1e9
	b.ReportMetric(gb/dev.spent.Seconds(), "device-GB/s")
	b.ReportMetric(gb/host.spent.Seconds(), "host-GB/s")
	b.ReportMetric(host.spent.Seconds()/dev.spent.Seconds(), "x-host")
}
