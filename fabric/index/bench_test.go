package index

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// benchIndex builds an index of about entries (hash, node) pairs over nodes
// nodes: chains of 128 blocks, each chain held by a few nodes.
func benchIndex(b *testing.B, entries, nodes int) (*Index, map[uint64][]NodeID, [][]uint64) {
	ix, _ := New(DefaultConfig())
	plain := make(map[uint64][]NodeID, entries)
	r := rand.New(rand.NewPCG(1, 2))
	ids := make([]NodeID, nodes)
	for i := range ids {
		ids[i], _ = ix.ID(fmt.Sprintf("node-%d", i))
	}
	var chains [][]uint64
	for n := 0; n < entries; {
		chain := make([]uint64, 128)
		for i := range chain {
			chain[i] = r.Uint64()
		}
		for k := 0; k < 4; k++ {
			id := ids[r.IntN(nodes)]
			ix.Store(id, chain...)
			for _, h := range chain {
				plain[h] = append(plain[h], id)
			}
			n += len(chain)
		}
		chains = append(chains, chain)
	}
	return ix, plain, chains
}

// BenchmarkFindMatches queries 128-block chains on an index of 1M entries
// over 64 nodes. The baseline is the least any index must do: one plain map
// lookup per block, without locks, intersection or result.
func BenchmarkFindMatches(b *testing.B) {
	ix, plain, chains := benchIndex(b, 1<<20, 64)
	var base, ours float64
	b.Run("baseline=map-lookups", func(b *testing.B) {
		i := 0
		sink := 0
		for b.Loop() {
			for _, h := range chains[i%len(chains)] {
				sink += len(plain[h])
			}
			i += 7919
		}
		if sink == 0 {
			b.Fatal("no holders found")
		}
		base = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		b.ReportMetric(base, "ns/query")
	})
	b.Run("index", func(b *testing.B) {
		b.ReportAllocs()
		var buf []Match
		i := 0
		for b.Loop() {
			buf = ix.AppendMatches(buf[:0], chains[i%len(chains)])
			if len(buf) == 0 || buf[0].Blocks != 128 {
				b.Fatalf("chain not found: %v", buf)
			}
			i += 7919
		}
		ours = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		b.ReportMetric(ours, "ns/query")
		if base > 0 {
			b.ReportMetric(ours/base, "x-baseline")
		}
	})
}

// BenchmarkStore measures applying store events to a large index, against
// inserting into a plain map.
func BenchmarkStore(b *testing.B) {
	var base float64
	b.Run("baseline=map-insert", func(b *testing.B) {
		m := make(map[uint64]uint64)
		var h uint64
		for b.Loop() {
			h += 0x9e3779b97f4a7c15
			m[h] |= 1
			if len(m) > 1<<20 {
				clear(m)
			}
		}
		base = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		b.ReportMetric(1e9/base, "events/s")
	})
	b.Run("index", func(b *testing.B) {
		ix, _ := New(DefaultConfig())
		id, _ := ix.ID("a")
		var h uint64
		n := 0
		for b.Loop() {
			h += 0x9e3779b97f4a7c15
			ix.Store(id, h)
			if n++; n > 1<<20 {
				ix.DropNode(id)
				ix.Sweep()
				id, _ = ix.ID("a")
				n = 0
			}
		}
		ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
		b.ReportMetric(1e9/ns, "events/s")
		if base > 0 {
			b.ReportMetric(ns/base, "x-baseline")
		}
	})
}
