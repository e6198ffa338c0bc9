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

// BenchmarkTierRestoreHost is the rate at which an engine's Acquire brings
// blocks back from the host tier, against the same from a disk tier, in
// the same run: two agents in one process, one with a host tier of 128
// MiB above its disk tier, one with the disk tier alone. On each, 256
// blocks of 256 KiB go down once (the engine's set freed: every block in
// the host tier on the first, on disk on the second); each iteration an
// engine Acquires all of them in runs of 8 through a set of 32 slots on
// each agent, the engine's calls included (the blocks stay in their
// tier: restored blocks are recycled without a copy).
func BenchmarkTierRestoreHost(b *testing.B) {
	const blocks = 256
	dir := b.TempDir()
	ctx := context.Background()
	model := layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	e := client.Engine{Name: "writer", Model: model, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 32}
	type side struct {
		c      *client.Client
		set    *client.BlockSet
		hashes []uint64
		took   time.Duration
	}
	start := func(name string, tiers ...string) *side {
		a := startBenchAgentWith(b, dir, filepath.Join(dir, "ca"), name, "127.0.0.1", "host=128MiB", "", func(c *fabric.Config) {
			c.Tiers = tiers
			c.BlockSetGrace = 100 * time.Millisecond
			c.NoOrphanCache = true // the set is freed, its blocks then in a tier only
		})
		c, err := client.Dial(ctx, a.EngineSocket())
		if err != nil {
			b.Fatal(err)
		}
		e := e
		set, err := c.Register(ctx, e)
		if err != nil {
			b.Fatal(err)
		}
		hashes := storeThrough(b, c, set, blocks)
		c.Close()
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
				b.Fatalf("%s: the blocks did not all go down to its first tier: %v %v", name, st, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		e.Name = "reader"
		if set, err = c.Register(ctx, e); err != nil {
			b.Fatal(err)
		}
		// Once checked byte for byte, outside the timing.
		if got := acquireChecked(b, c, set, hashes, 1); got != blocks {
			b.Fatalf("%s: restored %d of %d blocks", name, got, blocks)
		}
		return &side{c: c, set: set, hashes: hashes}
	}
	host := start("hosttier", "host=128MiB", "disk="+filepath.Join(dir, "tier-h")+":1GiB")
	disk := start("disktier", "disk="+filepath.Join(dir, "tier-d")+":1GiB")
	restore := func(s *side) { s.took += acquireRuns(b, s.c, s.set.ID, s.hashes[:blocks]) }
	blockBytes := int(host.set.Layout.Strides().Shard)
	b.SetBytes(int64(blocks * blockBytes))
	for b.Loop() {
		restore(host)
		restore(disk)
	}
	gb := float64(b.N*blocks*blockBytes) / 1e9
	b.ReportMetric(gb/host.took.Seconds(), "host-GB/s")
	b.ReportMetric(gb/disk.took.Seconds(), "disk-GB/s")
	b.ReportMetric(disk.took.Seconds()/host.took.Seconds(), "x-disk")
}
