package pool

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// The baselines are the least a slot allocator can be: a mutex and a slice
// (and a map for the registry), with no states, generations, watermarks,
// metrics or events. The ratios say what the pool's bookkeeping costs.

type bareFreeList struct {
	mu   sync.Mutex
	free []int32
}

func (f *bareFreeList) alloc() (int32, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.free) == 0 {
		return 0, false
	}
	i := f.free[len(f.free)-1]
	f.free = f.free[:len(f.free)-1]
	return i, true
}

func (f *bareFreeList) release(i int32) {
	f.mu.Lock()
	f.free = append(f.free, i)
	f.mu.Unlock()
}

func newBareFreeList(n int) *bareFreeList {
	f := &bareFreeList{}
	for i := range n {
		f.free = append(f.free, int32(i))
	}
	return f
}

// samples keeps per-operation latencies, up to a bound.
type samples []time.Duration

const maxSamples = 1 << 20

func (s *samples) add(d time.Duration) {
	if len(*s) < maxSamples {
		*s = append(*s, d)
	}
}

func (s samples) quantile(q float64) float64 {
	if len(s) == 0 {
		return 0
	}
	c := slices.Clone(s)
	slices.Sort(c)
	return float64(c[int(q*float64(len(c)-1))].Nanoseconds())
}

func benchPool(b *testing.B, slots int) (*Pool, *BlockSet) {
	cfg := DefaultConfig()
	cfg.ExpiryInterval = -1
	cfg.LowWatermark = -1
	return newTestPool(b, cfg, testLayout(slots, 1, layout.FullyContiguous, 64))
}

// measure runs op n times on one goroutine and returns ns per op.
func measure(n int, op func()) float64 {
	start := time.Now()
	for range n {
		op()
	}
	return float64(time.Since(start).Nanoseconds()) / float64(n)
}

// measureParallelLatency runs op n times on each of g goroutines, timing
// each call as the pool's parallel benchmark does, and returns wall ns per
// op over all of them and the latencies.
func measureParallelLatency(g, n int, op func()) (float64, samples) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var all samples
	start := time.Now()
	for range g {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make(samples, 0, min(n, 1<<16))
			for range n {
				t0 := time.Now()
				op()
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return float64(time.Since(start).Nanoseconds()) / float64(g*n), all
}

// BenchmarkAllocRelease allocates one slot and gives it back (Allocate(1)
// then Abort), reporting p50 and p99 of the pair and the ratio of ns/op to
// the bare free list. Both sides time every pair with the clock, so the
// clock's cost is in both and the ratio is fair; ns/op includes it.
func BenchmarkAllocRelease(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		_, set := benchPool(b, 1024)
		bare := newBareFreeList(1024)
		base, baseLat := measureParallelLatency(1, 1<<18, func() {
			i, _ := bare.alloc()
			bare.release(i)
		})
		dst := make([]Block, 0, 1)
		lat := make(samples, 0, maxSamples)
		b.ReportAllocs()
		var n int
		start := time.Now()
		for b.Loop() {
			t0 := time.Now()
			blks, err := set.AppendAllocate(dst[:0], 1)
			if err != nil {
				b.Fatal(err)
			}
			if err := set.Abort(blks[0]); err != nil {
				b.Fatal(err)
			}
			lat.add(time.Since(t0))
			n++
		}
		wall := float64(time.Since(start).Nanoseconds()) / float64(n)
		b.ReportMetric(lat.quantile(0.50), "p50-ns")
		b.ReportMetric(lat.quantile(0.99), "p99-ns")
		b.ReportMetric(base, "baseline-ns/op")
		b.ReportMetric(baseLat.quantile(0.50), "baseline-p50-ns")
		b.ReportMetric(baseLat.quantile(0.99), "baseline-p99-ns")
		b.ReportMetric(wall/base, "x-baseline")
	})
	b.Run("parallel", func(b *testing.B) {
		_, set := benchPool(b, 4096)
		bare := newBareFreeList(4096)
		procs := testingProcs()
		base, baseLat := measureParallelLatency(procs, 1<<17, func() {
			i, _ := bare.alloc()
			bare.release(i)
		})
		var mu sync.Mutex
		var all samples
		b.ReportAllocs()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			dst := make([]Block, 0, 1)
			lat := make(samples, 0, 1<<16)
			for pb.Next() {
				t0 := time.Now()
				blks, err := set.AppendAllocate(dst[:0], 1)
				if err != nil {
					b.Error(err)
					return
				}
				if err := set.Abort(blks[0]); err != nil {
					b.Error(err)
					return
				}
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
		wall := float64(time.Since(start).Nanoseconds()) / float64(b.N)
		b.ReportMetric(all.quantile(0.50), "p50-ns")
		b.ReportMetric(all.quantile(0.99), "p99-ns")
		b.ReportMetric(base, "baseline-ns/op")
		b.ReportMetric(baseLat.quantile(0.50), "baseline-p50-ns")
		b.ReportMetric(baseLat.quantile(0.99), "baseline-p99-ns")
		b.ReportMetric(wall/base, "x-baseline")
	})
}

func testingProcs() int {
	return max(1, runtimeProcs())
}

// BenchmarkLookup finds a Registered block by sequence hash among 4096,
// against a bare mutex and map.
func BenchmarkLookup(b *testing.B) {
	const n = 4096
	_, set := benchPool(b, n)
	bare := map[uint64]int32{}
	var bareMu sync.Mutex
	hashes := make([]uint64, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range hashes {
		hashes[i] = rng.Uint64()
		blks, _ := set.Allocate(1)
		set.Commit(blks[0])
		if _, err := set.Register(blks[0], hashes[i], 0); err != nil {
			b.Fatal(err)
		}
		bare[hashes[i]] = int32(i)
	}
	k := 0
	base := measure(1<<18, func() {
		bareMu.Lock()
		_ = bare[hashes[k%n]]
		bareMu.Unlock()
		k++
	})
	b.ReportAllocs()
	k = 0
	start := time.Now()
	var iters int
	for b.Loop() {
		if _, ok := set.Lookup(hashes[k%n]); !ok {
			b.Fatal("registered hash not found")
		}
		k++
		iters++
	}
	per := float64(time.Since(start).Nanoseconds()) / float64(iters)
	b.ReportMetric(base, "baseline-ns/op")
	b.ReportMetric(per/base, "x-baseline")
}

// BenchmarkLease64 leases 64 Registered blocks and releases the lease, as
// one import from a holder does, against taking and dropping 64 bare
// reference counts under a mutex.
func BenchmarkLease64(b *testing.B) {
	const n, per = 4096, 64
	p, set := benchPool(b, n)
	hashes := make([]uint64, n)
	bare := map[uint64]int32{}
	refs := make([]int32, n)
	var bareMu sync.Mutex
	for i := range hashes {
		hashes[i] = uint64(i)*0x9e3779b97f4a7c15 + 1
		blks, _ := set.Allocate(1)
		set.Commit(blks[0])
		blk, err := set.Register(blks[0], hashes[i], 0)
		if err != nil {
			b.Fatal(err)
		}
		set.Release(blk)
		bare[hashes[i]] = int32(i)
	}
	k := 0
	base := measure(1<<14, func() {
		q := hashes[(k*per)%n : (k*per)%n+per]
		bareMu.Lock()
		for _, h := range q {
			refs[bare[h]]++
		}
		bareMu.Unlock()
		bareMu.Lock()
		for _, h := range q {
			refs[bare[h]]--
		}
		bareMu.Unlock()
		k++
	})
	b.ReportAllocs()
	k = 0
	lat := make(samples, 0, maxSamples)
	start := time.Now()
	var iters int
	for b.Loop() {
		q := hashes[(k*per)%n : (k*per)%n+per]
		t0 := time.Now()
		id, _, err := set.Lease(q, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		if valid, err := p.ReleaseLease(id); !valid || err != nil {
			b.Fatal("lease not valid at release", err)
		}
		lat.add(time.Since(t0))
		k++
		iters++
	}
	total := float64(time.Since(start).Nanoseconds()) / float64(iters)
	b.ReportMetric(total/per, "ns/block")
	b.ReportMetric(lat.quantile(0.99), "p99-ns")
	b.ReportMetric(base, "baseline-ns/op")
	b.ReportMetric(total/base, "x-baseline")
}
