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

// BenchmarkTierOffloadFullHost is the rate at which blocks go down through
// a full host tier (each block copied into it makes room by moving one of
// its least recently used blocks down to the disk tier), against the same
// blocks going down to the disk tier alone, in the same run: two agents in
// one process, one with a host tier of 64 MiB (252 blocks) above its disk
// tier, one with the disk tier alone. 256 blocks of 256 KiB registered
// once on each; each iteration copies all of them down as the copiers do
// (TierCopyDown), after, outside the timing, dropping them from the tiers
// and filling the host tier with 256 blocks of another shape.
func BenchmarkTierOffloadFullHost(b *testing.B) {
	const blocks, fill = 256, 256
	dir := b.TempDir()
	ctx := context.Background()
	model := layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	type side struct {
		a            *fabric.Agent
		set, filler  *client.BlockSet
		hashes, fill []uint64
		took         time.Duration
	}
	start := func(name string, tiers ...string) *side {
		a := startBenchAgentWith(b, dir, filepath.Join(dir, "ca"), name, "127.0.0.1", "host=256MiB", "", func(c *fabric.Config) {
			c.Tiers = tiers
		})
		c, err := client.Dial(ctx, a.EngineSocket())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		s := &side{a: a}
		if s.set, err = c.Register(ctx, client.Engine{Name: "writer", Model: model, TPSize: 1, PageSize: 16,
			Order: layout.HND, Slots: blocks}); err != nil {
			b.Fatal(err)
		}
		s.hashes = storeThrough(b, c, s.set, blocks) // all kept: a slot for each
		// Another shape (the same bytes), so that its hashes are other blocks.
		if s.filler, err = c.Register(ctx, client.Engine{Name: "filler", Model: model, TPSize: 1, PageSize: 16,
			Order: layout.NHD, Slots: fill}); err != nil {
			b.Fatal(err)
		}
		s.fill = storeThrough(b, c, s.filler, fill)
		return s
	}
	full := start("fullhost", "disk="+filepath.Join(dir, "full")+":1GiB", "host=64MiB")
	alone := start("diskonly", "disk="+filepath.Join(dir, "alone")+":1GiB")
	run := func(s *side) {
		b.StopTimer()
		for _, drop := range []struct {
			set    *client.BlockSet
			hashes []uint64
		}{{s.set, s.hashes}, {s.filler, s.fill}} {
			if err := fabric.TierDrop(s.a, drop.set.ID, drop.hashes); err != nil {
				b.Fatal(err)
			}
		}
		if n, err := fabric.TierCopyDown(s.a, s.filler.ID, s.fill); err != nil || n < fill/2 {
			b.Fatalf("filled the tiers with %d of %d blocks: %v", n, fill, err)
		}
		b.StartTimer()
		begin := time.Now()
		n, err := fabric.TierCopyDown(s.a, s.set.ID, s.hashes)
		if err != nil || n != blocks {
			b.Fatalf("copied %d of %d blocks down: %v", n, blocks, err)
		}
		s.took += time.Since(begin)
	}
	b.SetBytes(int64(blocks) * int64(full.set.Layout.Strides().Shard))
	for b.Loop() {
		run(full)
		run(alone)
	}
	// The host tier holds 252 of the 512 blocks: the rest were moved down.
	below := 0
	for _, h := range full.hashes {
		if fabric.TierHolding(full.a, full.set.ID, h) == "disk" {
			below++
		}
	}
	for _, h := range full.fill {
		if fabric.TierHolding(full.a, full.filler.ID, h) == "disk" {
			below++
		}
	}
	if below < blocks {
		b.Fatalf("%d blocks moved down through the full host tier, want %d at least", below, blocks)
	}
	gb := float64(b.N) * float64(blocks) * float64(full.set.Layout.Strides().Shard) / 1e9
	b.ReportMetric(gb/full.took.Seconds(), "fullhost-GB/s")
	b.ReportMetric(gb/alone.took.Seconds(), "diskonly-GB/s")
	b.ReportMetric(alone.took.Seconds()/full.took.Seconds(), "x-diskonly")
}
