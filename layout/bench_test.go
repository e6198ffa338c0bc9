package layout

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	cRefOnce sync.Once
	cRefDir  string // where the C reference is built; removed by TestMain
	cRefBin  string
	cRefErr  error
)

// TestMain removes what the benchmarks built once every test and
// benchmark of the package has run.
func TestMain(m *testing.M) {
	code := m.Run()
	if cRefDir != "" {
		os.RemoveAll(cRefDir)
	}
	os.Exit(code)
}

// cReference builds testdata/xxh3ref.c once and runs it, returning its ns
// per block measured now.
func cReference() (float64, error) {
	cRefOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvfabric-xxh3ref")
		if err != nil {
			cRefErr = err
			return
		}
		cRefDir = dir
		cRefBin = filepath.Join(dir, "xxh3ref")
		out, err := exec.Command("gcc", "-O3", "-march=native", "-o", cRefBin, "testdata/xxh3ref.c").CombinedOutput()
		if err != nil {
			cRefErr = fmt.Errorf("gcc testdata/xxh3ref.c (needs gcc and libxxhash-dev: make bench-deps): %v: %s", err, out)
		}
	})
	if cRefErr != nil {
		return 0, cRefErr
	}
	out, err := exec.Command(cRefBin, "20000000").Output()
	if err != nil {
		return 0, err
	}
	return strconv.ParseFloat(strings.Fields(string(out))[0], 64)
}

// BenchmarkHashBlock: one 16-token block, against the C reference built
// from the same xxh3 in the same run.
func BenchmarkHashBlock(b *testing.B) {
	h, _ := NewHasher(16, HashOptions{})
	tokens := make([]uint32, 16)
	for i := range tokens {
		tokens[i] = uint32(i * 7919)
	}
	b.SetBytes(64)
	b.ReportAllocs()
	var acc uint64
	i := 0
	for b.Loop() {
		tokens[i&15] = uint32(i)
		i++
		v, _ := h.LocalHash(tokens)
		acc += v
	}
	sink = acc
	goNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	ref, err := cReference()
	if err != nil {
		b.Fatalf("the C baseline could not run: %v", err)
	}
	b.ReportMetric(ref, "c-ns/block")
	b.ReportMetric(goNs/ref, "x-c-time")
}

var sink any

type tpCase struct {
	name             string
	srcTP, dstTP     int
	srcOrd, dstOrder KVOrder
}

var tpCases = []tpCase{
	{"tp=4->2/HND", 4, 2, HND, HND},
	{"tp=2->8/NHD", 2, 8, NHD, NHD},
}

// memcpyGBps measures copy over 64 MiB, the baseline of the benchmarks.
func memcpyGBps() float64 {
	src, dst := make([]byte, 64<<20), make([]byte, 64<<20)
	for i := range src {
		src[i] = 1
	}
	copy(dst, src)
	start := time.Now()
	const n = 8
	for range n {
		copy(dst, src)
	}
	return float64(n*len(src)) / float64(time.Since(start).Nanoseconds())
}

// BenchmarkPlan: planning 1,000 blocks of a Llama-70B-like config, against
// the time memcpy would take to move the same bytes (measured in the run).
func BenchmarkPlan(b *testing.B) {
	gbps := memcpyGBps()
	for _, tc := range tpCases {
		b.Run(tc.name, func(b *testing.B) {
			src, dst := llama70B(tc.srcTP, tc.srcOrd, 1000), llama70B(tc.dstTP, tc.dstOrder, 1000)
			pairs := seqPairs(0, 0, 1000)
			b.ReportAllocs()
			var p *Plan
			for b.Loop() {
				p, _ = NewPlan(src, dst, pairs)
			}
			planNs := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			moveNs := float64(p.Bytes()) / gbps
			segs := 0
			for _, s := range p.Summary() {
				segs += s.Segments
			}
			b.ReportMetric(float64(segs), "segments")
			b.ReportMetric(planNs/1000, "ns/block")
			b.ReportMetric(planNs/moveNs, "x-memcpy-time")
		})
	}
}

// BenchmarkExecute: applying a plan to host memory against one copy of the
// same total bytes. Each iteration does both, back to back, so that both see
// the same noise on a shared machine; x-copy-speed = copy time / plan time.
func BenchmarkExecute(b *testing.B) {
	const blocks = 16 // 84 MB each way: well out of cache
	for _, tc := range tpCases {
		b.Run(tc.name, func(b *testing.B) {
			src, dst := llama70B(tc.srcTP, tc.srcOrd, blocks), llama70B(tc.dstTP, tc.dstOrder, blocks)
			p, err := NewPlan(src, dst, seqPairs(0, 0, blocks))
			if err != nil {
				b.Fatal(err)
			}
			sMem, dMem := regions(src, 1), regions(dst, 0)
			// Written memory on both sides: an untouched source would be
			// read from the kernel's shared zero page, all cache hits.
			flatSrc, flatDst := make([]byte, p.Bytes()), make([]byte, p.Bytes())
			for i := range flatSrc {
				flatSrc[i] = 1
			}
			copy(flatDst, flatSrc)
			if err := Execute(p, sMem, dMem); err != nil {
				b.Fatal(err)
			}
			// No SetBytes: an iteration moves the bytes twice (copy and
			// plan); each one's speed is reported below.
			var copyNs, planNs time.Duration
			timeCopy := func() {
				t := time.Now()
				copy(flatDst, flatSrc)
				copyNs += time.Since(t)
			}
			timePlan := func() {
				t := time.Now()
				if err := Execute(p, sMem, dMem); err != nil {
					b.Fatal(err)
				}
				planNs += time.Since(t)
			}
			// Alternate which goes first, so that neither inherits the
			// other's cache state more often.
			for i := 0; b.Loop(); i++ {
				if i%2 == 0 {
					timeCopy()
					timePlan()
				} else {
					timePlan()
					timeCopy()
				}
			}
			b.ReportMetric(float64(p.Bytes())/float64(planNs.Nanoseconds())*float64(b.N), "plan-GB/s")
			b.ReportMetric(float64(p.Bytes())/float64(copyNs.Nanoseconds())*float64(b.N), "copy-GB/s")
			b.ReportMetric(float64(copyNs)/float64(planNs), "x-copy-speed")
		})
	}
}
