//go:build cgo && linux

package ofi

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// BenchmarkRead reads a 64 MiB region in 1 MiB pieces between two endpoints
// of one process, against testdata/bare_read.c: the same reads posted by a
// bare C loop on libfabric's own headers, same provider, same bytes, run in
// the same benchmark. It reports both rates, their ratio (x-bare) and CPU
// per GB for both. KVFABRIC_OFI_BENCH_PROVIDERS (comma-separated) names
// other providers than tcp and shm, such as efa or cxi on nodes that have them.
func BenchmarkRead(b *testing.B) {
	const bytes, piece, window = 64 << 20, 1 << 20, 64
	bare := buildBareRead(b)
	for _, prov := range benchProviders() {
		b.Run(prov, func(b *testing.B) {
			bareGBs, bareCPU := runBareRead(b, bare, prov, bytes, piece, window, 16)

			// Host-only, as the loop opens it (and an agent without
			// device pools): shm reads by cross-memory attach.
			l, err := Load(Config{Provider: prov, Node: nodeFor(prov), HostOnly: true})
			if err != nil {
				b.Fatalf("libfabric (make test-deps): %v", err)
			}
			b.Cleanup(func() { l.Close() })
			holder, reader := openEndpoint(b, l), openEndpoint(b, l)
			src := mapped(b, bytes)
			fill(src, 1)
			srcReg := register(b, holder, src)
			dstReg := register(b, reader, mapped(b, bytes))
			peer, err := reader.AddPeer(holder.Name())
			if err != nil {
				b.Fatal(err)
			}
			var segs []Segment
			for off := uint64(0); off < bytes; off += piece {
				segs = append(segs, Segment{LocalOff: off, RemoteOff: off, Len: piece, Remote: srcReg.Remote()})
			}
			b.SetBytes(bytes)
			b.ReportAllocs()
			cpu0 := cpuTime()
			start := time.Now()
			for b.Loop() {
				if err := reader.Read(context.Background(), peer, dstReg, segs); err != nil {
					b.Fatal(err)
				}
			}
			wall := time.Since(start)
			cpu := cpuTime() - cpu0
			gbs := float64(b.N) * bytes / float64(wall.Nanoseconds())
			b.ReportMetric(gbs, "GB/s")
			b.ReportMetric(bareGBs, "bare-GB/s")
			b.ReportMetric(gbs/bareGBs, "x-bare")
			b.ReportMetric(float64(cpu.Milliseconds())/(float64(b.N)*bytes/1e9), "cpu-ms/GB")
			b.ReportMetric(bareCPU, "bare-cpu-ms/GB")
		})
	}
}

// buildBareRead compiles testdata/bare_read.c, the C baseline of the
// read benchmarks, and returns its path.
func buildBareRead(b *testing.B) string {
	b.Helper()
	bare := filepath.Join(b.TempDir(), "bare_read")
	if out, err := exec.Command("gcc", "-O2", "-o", bare, "testdata/bare_read.c", "-lfabric").CombinedOutput(); err != nil {
		b.Fatalf("build the C baseline (libfabric-dev, make test-deps): %v\n%s", err, out)
	}
	return bare
}

// benchProviders is the providers the read benchmarks run on: tcp and shm,
// or those KVFABRIC_OFI_BENCH_PROVIDERS names (comma-separated).
func benchProviders() []string {
	if env := os.Getenv("KVFABRIC_OFI_BENCH_PROVIDERS"); env != "" {
		return strings.Split(env, ",")
	}
	return providers
}

// runBareRead runs the bare loop at bare on prov: bytes read in pieces of
// piece, window in flight, repeated rounds times. It returns the loop's
// rate (GB/s) and CPU per GB (ms).
func runBareRead(b *testing.B, bare, prov string, bytes, piece, window, rounds int) (gbs, cpuPerGB float64) {
	b.Helper()
	node := nodeFor(prov)
	if node == "" {
		node = "-"
	}
	out, err := exec.Command(bare, prov, node, fmt.Sprint(bytes), fmt.Sprint(piece), fmt.Sprint(window), fmt.Sprint(rounds)).Output()
	if err != nil {
		b.Fatalf("bare_read %s: %v", prov, err)
	}
	var moved, wallNS, cpuNS float64
	if _, err := fmt.Sscan(strings.TrimSpace(string(out)), &moved, &wallNS, &cpuNS); err != nil {
		b.Fatalf("bare_read printed %q: %v", out, err)
	}
	return moved / wallNS, cpuNS / 1e6 / (moved / 1e9)
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReadScattered reads as an agent's import of TP 4 -> TP 2 HND
// blocks does: two Reads at once on one endpoint, each of a holder's
// contiguous 32 MiB landing in 8 KiB pieces 16 KiB apart (so each request
// gathers up to the provider's iov limit of pieces), from an endpoint that
// serves (Serve) in the same process. Baselines, run in the same
// benchmark: testdata/bare_read.c over the same number of bytes in 1 MiB
// pieces (x-bare; the baseline BenchmarkImportOFI uses) and in pieces of
// the size the binding's in-place requests have here (x-bare-req: 8 KiB
// times the iov limit). CPU per GB counts the whole process, both
// endpoints, as the loop's counts its one process. shm-inline is shm with
// the holder serving as an agent serves a reader whose reads complete
// inline (ServeInline).
//
//	go test -run '^$' -bench ReadScattered -benchtime 20x ./rdma/ofi
func BenchmarkReadScattered(b *testing.B) {
	const half, piece = 32 << 20, 8 << 10
	bare := buildBareRead(b)
	type run struct {
		name, prov string
		inline     bool
	}
	var runs []run
	for _, prov := range benchProviders() {
		runs = append(runs, run{prov, prov, false})
		if prov == "shm" {
			runs = append(runs, run{"shm-inline", prov, true})
		}
	}
	for _, r := range runs {
		prov := r.prov
		b.Run(r.name, func(b *testing.B) {
			l, err := Load(Config{Provider: prov, Node: nodeFor(prov), HostOnly: true})
			if err != nil {
				b.Fatalf("libfabric (make test-deps): %v", err)
			}
			b.Cleanup(func() { l.Close() })
			holder, reader := openIdle(b, l), openIdle(b, l)
			if r.inline {
				b.Cleanup(holder.ServeInline(time.Now().Add(time.Hour)))
			} else {
				b.Cleanup(holder.Serve(time.Now().Add(time.Hour)))
			}
			src := mapped(b, 2*half)
			fill(src, 3)
			srcReg := register(b, holder, src)
			dst := mapped(b, 2*half)
			dstReg := register(b, reader, dst)
			peer, err := reader.AddPeer(holder.Name())
			if err != nil {
				b.Fatal(err)
			}
			var segs [2][]Segment
			for k := range 2 {
				for off := uint64(0); off < half; off += piece {
					segs[k] = append(segs[k], Segment{LocalOff: uint64(k)*piece + 2*off, RemoteOff: uint64(k)*half + off, Len: piece, Remote: srcReg.Remote()})
				}
			}
			bareGBs, bareCPU := runBareRead(b, bare, prov, 2*half, 1<<20, 64, 4)
			reqGBs, _ := runBareRead(b, bare, prov, 2*half, piece*min(max(reader.Info().IOVLimit, 1), 8), 64, 4)

			b.SetBytes(2 * half)
			cpu0 := cpuTime()
			start := time.Now()
			for b.Loop() {
				var wg sync.WaitGroup
				errs := make([]error, 2)
				for k := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs[k] = reader.Read(context.Background(), peer, dstReg, segs[k])
					}()
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			wall := time.Since(start)
			cpu := cpuTime() - cpu0
			b.StopTimer()
			for k := range 2 {
				for i, s := range segs[k] {
					if !bytes.Equal(dst[s.LocalOff:s.LocalOff+piece], src[s.RemoteOff:s.RemoteOff+piece]) {
						b.Fatalf("read %d, piece %d differs", k, i)
					}
				}
			}
			gbs := float64(b.N) * 2 * half / float64(wall.Nanoseconds())
			b.ReportMetric(gbs, "GB/s")
			b.ReportMetric(bareGBs, "bare-GB/s")
			b.ReportMetric(gbs/bareGBs, "x-bare")
			b.ReportMetric(gbs/reqGBs, "x-bare-req")
			b.ReportMetric(float64(cpu.Milliseconds())/(float64(b.N)*2*half/1e9), "cpu-ms/GB")
			b.ReportMetric(bareCPU, "bare-cpu-ms/GB")
		})
	}
}
