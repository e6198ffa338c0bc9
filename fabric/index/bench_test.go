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

// BenchmarkOwners is what the owned slices add to a lookup and to a
// membership change: finding a hash's owners by rendezvous hashing, O(N)
// a hash. The baseline, in the same run, is the whole index's answer for
// the same hash (FindMatches of one hash on an index of 1M entries over
// 64 nodes); ratio is owners / baseline.
func BenchmarkOwners(b *testing.B) {
	ix, _, chains := benchIndex(b, 1<<20, 64)
	var base float64
	b.Run("baseline=FindMatches1", func(b *testing.B) {
		q := chains[0][:1]
		var buf []Match
		b.ReportAllocs()
		for b.Loop() {
			buf = ix.AppendMatches(buf[:0], q)
		}
		base = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	for _, n := range []int{64, 1000} {
		b.Run(fmt.Sprintf("members=%d", n), func(b *testing.B) {
			p := NewPlacement(names(n), 3)
			var dst [MaxReplicas]string
			h := uint64(1)
			b.ReportAllocs()
			for b.Loop() {
				p.AppendOwners(dst[:0], h)
				h += 0x9e3779b97f4a7c15
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			b.ReportMetric(ns/float64(n), "ns/member")
			if base > 0 {
				b.ReportMetric(ns/base, "ratio")
			}
		})
	}
}

// BenchmarkSetMembers is a publisher holding 10,000 hashes moving them as
// one member joins 1,000: the pass over its holdings that every member
// change costs each node. ns/hash scales it to other holdings.
func BenchmarkSetMembers(b *testing.B) {
	const held = 10000
	all := names(1001)
	p := NewPublisher(all[0], 3, 0)
	hs := make([]uint64, held)
	for i := range hs {
		hs[i] = uint64(i+1) * 0x9e3779b97f4a7c15
	}
	p.Store(hs...)
	p.SetMembers(all[:1000])
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		// Alternate the 1,001st member in and out: each call is a change.
		if i++; i%2 == 1 {
			p.SetMembers(all)
		} else {
			p.SetMembers(all[:1000])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/held, "ns/hash")
}
