//go:build cgo && linux

package testbed

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
)

var benchOFIProvider = flag.String("kvfabric.bench.ofi", "tcp", "libfabric provider BenchmarkImportOFI imports over (tcp; efa or cxi on nodes that have them)")

var benchOFIProfiles = flag.String("kvfabric.bench.pprof", "", "directory BenchmarkImportOFI writes holder.pprof and importer.pprof to: each agent's CPU profile (agent --pprof) over 10 s from the first timed import")

// BenchmarkImportOFI imports Llama-70B blocks between two agent processes
// over libfabric (--fabric ofi, the provider -kvfabric.bench.ofi names,
// tcp by default), TP 4 -> TP 2 HND, through the whole import path
// (index, lease with the holder's endpoint name and keys, plan, fi_read,
// release, register). In the same iteration, and on the same machine, the
// baseline: rdma/ofi/testdata/bare_read.c, a bare C loop of fi_read on
// libfabric's own headers, same provider, same number of bytes, in 1 MiB
// pieces with 64 in flight, its two endpoints in one process polling both
// completion queues. x-bare is the import's throughput over the loop's
// (goal at least 0.8).
//
// CPU per GB: cpu-ms/GB is the importer's and the holder's processes
// together over the import (tcp's serving side works in the holder's
// process), importer-cpu-ms/GB the importer's alone, bare-cpu-ms/GB the
// loop's process (both of its endpoints). Every imported byte is checked,
// untimed.
//
//	go test ./testbed -run '^$' -bench ImportOFI -benchtime 5x -count 3
//
// -kvfabric.bench.pprof DIR starts the agents with --pprof and writes a
// CPU profile of each over 10 s from the first timed import (give
// -benchtime enough imports to fill them; the untimed production and
// checks between imports are in them too).
func BenchmarkImportOFI(b *testing.B) {
	ctx := context.Background()
	prov := *benchOFIProvider
	node := "-"
	args := []string{"--rdma", "on", "--fabric", "ofi", "--fabric-provider", prov}
	if prov == "tcp" {
		node = "127.0.0.1"
		args = append(args, "--fabric-addr", node)
	}
	if *benchOFIProfiles != "" {
		args = append(args, "--pprof", "127.0.0.1:0")
	}
	bare := filepath.Join(b.TempDir(), "bare_read")
	src := filepath.Join("..", "rdma", "ofi", "testdata", "bare_read.c")
	if out, err := exec.Command("gcc", "-O2", "-o", bare, src, "-lfabric").CombinedOutput(); err != nil {
		b.Fatalf("build the C baseline (libfabric-dev, make test-deps): %v\n%s", err, out)
	}

	producer := client.Engine{Name: "producer", Model: llama70B, TPSize: 4, PageSize: 16, Order: layout.HND}
	consumer := client.Engine{Name: "consumer", Model: llama70B, TPSize: 2, PageSize: 16, Order: layout.HND}
	blockBytes := producer.Model.BlockBytes(producer.PageSize)
	nblocks := max(1, int(*benchRDMASize/int64(blockBytes)))
	size := uint64(nblocks) * blockBytes
	producer.Slots, consumer.Slots = 2*nblocks, 2*nblocks
	c, err := Start(ctx, Options{Bin: bin, Nodes: 2, Pool: fmt.Sprintf("host=%d", 5*size/2+64<<20), ExtraArgs: args})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	holder, importer := c.Nodes[0], c.Nodes[1]
	const piece = 1 << 20
	bareBytes := size / piece * piece

	var importTime, bareTime time.Duration
	var importerCPU, holderCPU, bareCPU time.Duration
	var bareMoved float64
	var profiled func() error
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		seqs := Workload{Sequences: 1, Blocks: nblocks, PageSize: 16, Seed: uint64(i) + uint64(time.Now().UnixNano())}.Hashes()
		if err := produceReleased(ctx, holder, producer, seqs[0]); err != nil {
			b.Fatal(err)
		}
		benchIndexed(b, importer, holder.Name, seqs[0])
		b.StartTimer()
		if i == 0 && *benchOFIProfiles != "" {
			if profiled, err = profileAgents(*benchOFIProfiles, 10*time.Second, map[string]*Node{"holder": holder, "importer": importer}); err != nil {
				b.Fatal(err)
			}
		}
		h0 := processCPU(holder)
		took, cpu, err := importChecked(ctx, importer, consumer, seqs[0], "rdma")
		if err != nil {
			b.Fatal(err)
		}
		holderCPU += processCPU(holder) - h0
		importTime += took
		importerCPU += cpu
		out, err := exec.Command(bare, prov, node, fmt.Sprint(bareBytes), fmt.Sprint(piece), "64", "1").Output()
		if err != nil {
			b.Fatalf("bare_read %s: %v", prov, err)
		}
		var moved, wallNS, cpuNS float64
		if _, err := fmt.Sscan(strings.TrimSpace(string(out)), &moved, &wallNS, &cpuNS); err != nil {
			b.Fatalf("bare_read printed %q: %v", out, err)
		}
		bareMoved += moved
		bareTime += time.Duration(wallNS)
		bareCPU += time.Duration(cpuNS)
	}
	b.StopTimer()
	if profiled != nil {
		if err := profiled(); err != nil {
			b.Fatal(err)
		}
	}
	gb := float64(size) * float64(b.N) / 1e9
	bareGB := bareMoved / 1e9
	importRate := gb / max(importTime.Seconds(), 1e-9)
	bareRate := bareGB / max(bareTime.Seconds(), 1e-9)
	b.ReportMetric(importRate, "ofi-GB/s")
	b.ReportMetric(bareRate, "bare-GB/s")
	b.ReportMetric(importRate/bareRate, "x-bare")
	msPerGB := func(d time.Duration, gb float64) float64 { return float64(d) / 1e6 / gb }
	b.ReportMetric(msPerGB(importerCPU+holderCPU, gb), "cpu-ms/GB")
	b.ReportMetric(msPerGB(importerCPU, gb), "importer-cpu-ms/GB")
	b.ReportMetric(msPerGB(bareCPU, bareGB), "bare-cpu-ms/GB")
	b.ReportMetric(0, "ns/op")
}

// profileAgents fetches a CPU profile of d from each agent (started with
// --pprof, whose log names the address) into dir/NAME.pprof, in the
// background; wait returns once all are written, or the first error.
func profileAgents(dir string, d time.Duration, nodes map[string]*Node) (wait func() error, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	at := regexp.MustCompile(`Go profiles at (http://[^ ]+/debug/pprof/)`)
	errs := make(chan error, len(nodes))
	for name, n := range nodes {
		m := at.FindStringSubmatch(n.FullLog())
		if m == nil {
			return nil, fmt.Errorf("%s's log names no profile address:\n%s", n.Name, n.Log())
		}
		url := fmt.Sprintf("%sprofile?seconds=%d", m[1], int(d.Seconds()))
		go func() {
			errs <- func() error {
				resp, err := http.Get(url)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil || resp.StatusCode != http.StatusOK {
					return fmt.Errorf("%s: %s: %v %.200s", name, url, err, b)
				}
				return os.WriteFile(filepath.Join(dir, name+".pprof"), b, 0o644)
			}()
		}()
	}
	return func() error {
		var first error
		for range nodes {
			if err := <-errs; err != nil && first == nil {
				first = err
			}
		}
		return first
	}, nil
}
