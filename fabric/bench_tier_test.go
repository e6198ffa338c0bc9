package fabric_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
)

// BenchmarkTierAllocate is engine Allocate's latency under a write-heavy
// load, with and without a disk tier: two agents in this process, one with
// --tier, each with an engine that writes blocks of 256 KiB (put's
// default model) through a block set of 128 slots, 8 at a time (Allocate,
// fill, RegisterBlocks, Release), the two engines' batches interleaved so
// that both see the same machine. Past the first 128 blocks every
// allocation recycles: without a tier the old blocks are dropped, with one
// they are copied to disk first. It reports each side's p99 of Allocate
// (the engine's call, round trip included) and their ratio.
func BenchmarkTierAllocate(b *testing.B) { benchAllocate(b, true) }

// BenchmarkTierAllocateNoTier is BenchmarkTierAllocate with neither agent
// given a disk tier: both sides the same, its tier/base is the spread of
// the ratio of two p99s on this machine, which no tier can do better than.
func BenchmarkTierAllocateNoTier(b *testing.B) { benchAllocate(b, false) }

// benchAllocate is BenchmarkTierAllocate; with tier false the second
// agent has no disk tier either.
func benchAllocate(b *testing.B, tier bool) {
	const blocks, batch = 1024, 8
	model := layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	e := client.Engine{Name: "writer", Model: model, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 128}
	type side struct {
		c     *client.Client
		set   *client.BlockSet
		lat   []time.Duration
		agent *fabric.Agent
	}
	var sides [2]*side
	root := b.TempDir()
	for i := range sides {
		a := startBenchAgentWith(b, root, filepath.Join(root, "ca"), fmt.Sprintf("bench%d", i), "127.0.0.1", "host=128MiB", "", func(c *fabric.Config) {
			if i == 1 && tier {
				c.Tiers = []string{"disk=" + filepath.Join(root, "tier") + ":2GiB"}
			}
		})
		c, err := client.Dial(context.Background(), a.EngineSocket())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		set, err := c.Register(context.Background(), e)
		if err != nil {
			b.Fatal(err)
		}
		sides[i] = &side{c: c, set: set, agent: a}
	}
	ctx := context.Background()
	seq := uint64(0)
	for b.Loop() {
		for n := 0; n < blocks; n += batch {
			for k := range sides {
				s := sides[(k+n/batch)%2] // alternate who goes first
				start := time.Now()
				slots, err := s.c.Allocate(ctx, s.set.ID, batch)
				s.lat = append(s.lat, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				hs := make([]uint64, batch)
				for j := range hs {
					seq++
					hs[j] = seq<<20 | uint64(k)
					kvtest.Fill(s.set.Layout, s.set.Ranks, int(slots[j]), hs[j])
				}
				resp, err := s.c.API().RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: s.set.ID, Slots: slots, Hashes: hs})
				if err != nil {
					b.Fatal(err)
				}
				rel := make([]uint32, len(resp.Blocks))
				for j, r := range resp.Blocks {
					rel[j] = r.Slot
				}
				if err := s.c.Release(ctx, s.set.ID, rel); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	p99 := func(l []time.Duration) time.Duration {
		slices.Sort(l)
		return l[len(l)*99/100]
	}
	base, with := p99(sides[0].lat), p99(sides[1].lat)
	b.ReportMetric(float64(base.Microseconds()), "p99-us-base")
	b.ReportMetric(float64(with.Microseconds()), "p99-us-tier")
	b.ReportMetric(with.Seconds()/base.Seconds(), "tier/base")
	if m := sides[1].agent.Metrics(); len(m.Tiers) == 1 {
		b.ReportMetric(float64(m.Tiers[0].Offloads)/float64(b.N), "offloads/op")
		// Blocks whose slots allocations took before their copies ended,
		// copying them out in memory within the Allocate call.
		b.ReportMetric(float64(m.Tiers[0].CopiedOut)/float64(b.N), "copied-out/op")
	}
}
