package layout

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

// The mirror of xxh3.Hasher must hold for the xxh3 this module builds
// with: otherwise every run is copied through the Hasher's buffer again
// (still right, but several times slower).
func TestSumHasherInPlace(t *testing.T) {
	if !inPlaceOK() {
		t.Fatal("sumHasher's mirror of xxh3.Hasher does not match this xxh3: runs are hashed through its buffer")
	}
}

// Runs of any lengths, fed in place or through Write, hash as xxh3.Hash
// hashes them whole: around the Hasher's block and buffer edges and at
// random.
func TestSumHasherMatchesHash(t *testing.T) {
	data := make([]byte, 64<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	edges := []int{0, 1, 63, 64, 65, 1023, 1024, 1025, 1087, 1088, 1089, 2176, 2177, 2178, 4096, 16384}
	check := func(t *testing.T, lens []int) {
		t.Helper()
		var s, w sumHasher
		at := 0
		for _, n := range lens {
			s.writeInPlace(data[at : at+n])
			w.h.Write(data[at : at+n])
			at += n
		}
		want := xxh3.Hash(data[:at])
		if got := s.sum64(); got != want {
			t.Fatalf("runs %v: in place %016x, xxh3.Hash %016x", lens, got, want)
		}
		if got := w.sum64(); got != want {
			t.Fatalf("runs %v: through Write %016x, xxh3.Hash %016x", lens, got, want)
		}
	}
	for _, a := range edges {
		for _, b := range edges {
			for _, c := range edges {
				check(t, []int{a, b, c})
			}
		}
	}
	for range 2000 {
		lens := make([]int, 1+rng.IntN(12))
		total := 0
		for i := range lens {
			lens[i] = rng.IntN(5000)
			if rng.IntN(4) == 0 {
				lens[i] = edges[rng.IntN(len(edges))]
			}
			if total+lens[i] > len(data) {
				lens = lens[:i]
				break
			}
			total += lens[i]
		}
		check(t, lens)
	}
}

// BenchmarkSumHasher hashes 64 MiB in runs of 16 KiB (one rank's four
// heads of a layer's plane, 16 tokens of bf16 dim 128) in place, and
// through xxh3.Hasher's Write alternating with it in each iteration.
func BenchmarkSumHasher(b *testing.B) {
	const size, run = 64 << 20, 16 << 10
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var inPlace, write time.Duration
	var sink uint64
	b.SetBytes(size)
	for b.Loop() {
		t0 := time.Now()
		for blk := 0; blk < size; blk += 2 << 20 {
			var s sumHasher
			for off := blk; off < blk+2<<20; off += run {
				s.writeInPlace(data[off : off+run])
			}
			sink += s.sum64()
		}
		t1 := time.Now()
		for blk := 0; blk < size; blk += 2 << 20 {
			var h xxh3.Hasher
			for off := blk; off < blk+2<<20; off += run {
				h.Write(data[off : off+run])
			}
			sink += h.Sum64()
		}
		inPlace += t1.Sub(t0)
		write += time.Since(t1)
	}
	_ = sink
	b.ReportMetric(float64(size)*float64(b.N)/inPlace.Seconds()/1e9, "inplace-GB/s")
	b.ReportMetric(float64(size)*float64(b.N)/write.Seconds()/1e9, "write-GB/s")
	b.ReportMetric(write.Seconds()/inPlace.Seconds(), "x-write")
}
