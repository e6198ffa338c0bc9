package index

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"testing"
)

// memCase is a cluster's holdings: nodes nodes, each storing blocks random
// hashes, each hash stored by share nodes (consecutive ones).
type memCase struct {
	name                 string
	nodes, blocks, share int
}

var memCases = []memCase{
	{"distinct/64x100000", 64, 100000, 1},
	{"distinct/256x20000", 256, 20000, 1},
	{"shared4/64x100000", 64, 100000, 4},
	{"distinct/1000x5000", 1000, 5000, 1},
	{"shared2/1000x5000", 1000, 5000, 2},
}

// fill stores c's holdings into ix (nil: none) and plain (nil: none), and
// returns the pairs stored.
func (c memCase) fill(tb testing.TB, ix *Index, plain map[uint64][]uint16) int {
	r := rand.New(rand.NewPCG(uint64(c.nodes), uint64(c.blocks)))
	var ids []NodeID
	if ix != nil {
		ids = make([]NodeID, c.nodes)
		for i := range ids {
			var err error
			if ids[i], err = ix.ID(fmt.Sprintf("node-%d", i)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	hashes := make([]uint64, 0, 1024)
	pairs := 0
	// Each group of share nodes stores the same hashes.
	for g := 0; g < c.nodes; g += c.share {
		for done := 0; done < c.blocks; {
			hashes = hashes[:0]
			for range min(cap(hashes), c.blocks-done) {
				hashes = append(hashes, r.Uint64())
			}
			done += len(hashes)
			for n := g; n < min(g+c.share, c.nodes); n++ {
				if ix != nil {
					if err := ix.Store(ids[n], hashes...); err != nil {
						tb.Fatal(err)
					}
				}
				if plain != nil {
					for _, h := range hashes {
						plain[h] = append(plain[h], uint16(n))
					}
				}
				pairs += len(hashes)
			}
		}
	}
	return pairs
}

// heapAfter returns the live heap growth from f, measured after collections.
func heapAfter(f func() any) (int64, any) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	keep := f()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc), keep
}

// BenchmarkMemory measures the heap an index takes per (hash, holder) pair
// after storing each case's holdings (random 64-bit hashes), against a plain
// map from hash to a slice of holder slots. Run with -benchtime=1x: each
// iteration builds the whole index.
func BenchmarkMemory(b *testing.B) {
	for _, c := range memCases {
		b.Run(c.name, func(b *testing.B) {
			var base, ours float64
			for b.Loop() {
				var pairs int
				used, keep := heapAfter(func() any {
					m := make(map[uint64][]uint16)
					pairs = c.fill(b, nil, m)
					return m
				})
				runtime.KeepAlive(keep)
				keep = nil
				base = float64(used) / float64(pairs)
				var acct int64
				used, keep = heapAfter(func() any {
					ix, _ := New(DefaultConfig())
					pairs = c.fill(b, ix, nil)
					acct = ix.Metrics().Bytes
					return ix
				})
				runtime.KeepAlive(keep)
				ours = float64(used) / float64(pairs)
				b.ReportMetric(float64(acct)/float64(pairs), "counted-B/pair")
			}
			b.ReportMetric(base, "baseline-B/pair")
			b.ReportMetric(ours, "B/pair")
			b.ReportMetric(ours/base, "x-baseline")
		})
	}
}

// memChildEnv marks the process TestMemoryPerPair measures in.
const memChildEnv = "KVFABRIC_INDEX_MEM_CHILD"

// TestMemoryPerPair holds the index to its size budget at a size that
// runs in a test: single-holder hashes of a large cluster (pairs, inline)
// at most 20 bytes a pair on the heap, shared ones less. The budget is the
// load range of the table (12-byte slots at 75% to 90% full: 13 to 16
// bytes a hash) with a margin; the counted bytes ([Metrics.Bytes]) must
// agree with the heap within a few bytes a pair.
func TestMemoryPerPair(t *testing.T) {
	if testing.Short() {
		t.Skip("builds indexes of a million pairs; skipped in -short")
	}
	if os.Getenv(memChildEnv) == "" {
		// Measured in a process of its own: goroutines that other tests
		// of the package leave behind allocate and free on the heap
		// while it is measured, by megabytes.
		cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryPerPair$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), memChildEnv+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("measured in a process of its own:\n%s", out)
		if err != nil {
			t.Fatalf("the measuring process: %v", err)
		}
		if !bytes.Contains(out, []byte("--- PASS: TestMemoryPerPair")) {
			t.Fatal("the measuring process did not run TestMemoryPerPair")
		}
		return
	}
	for _, c := range []struct {
		memCase
		max float64
	}{
		{memCase{"distinct", 256, 4000, 1}, 20},
		{memCase{"shared4", 64, 16000, 4}, 10},
	} {
		t.Run(c.name, func(t *testing.T) {
			var pairs int
			var acct int64
			used, keep := heapAfter(func() any {
				ix, _ := New(DefaultConfig())
				pairs = c.fill(t, ix, nil)
				acct = ix.Metrics().Bytes
				if got := ix.Metrics().Pairs; got != int64(pairs) {
					t.Fatalf("index counts %d pairs, stored %d", got, pairs)
				}
				return ix
			})
			runtime.KeepAlive(keep)
			per := float64(used) / float64(pairs)
			counted := float64(acct) / float64(pairs)
			t.Logf("%d pairs: %.1f B/pair on the heap, %.1f counted", pairs, per, counted)
			if per > c.max {
				t.Errorf("%.1f bytes a pair, budget %.0f", per, c.max)
			}
			if d := per - counted; d > 3 || d < -3 {
				t.Errorf("counted %.1f B/pair, heap %.1f", counted, per)
			}
		})
	}
}
