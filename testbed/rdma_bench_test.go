//go:build cgo && linux

package testbed

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

var benchRDMASize = flag.Int64("kvfabric.bench.rdma", 128<<20, "bytes BenchmarkImportRDMA imports per iteration")

// llama70B is Llama-70B's KV geometry: with 16-token pages, a block of
// 5.2 MB (1.3 MB a rank under TP 4).
var llama70B = layout.ModelConfig{Layers: 80, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}

// BenchmarkImportRDMA imports Llama-70B blocks between two agent processes
// over RDMA on softverbs, the software NIC, TP 4 -> TP 2 HND, through the
// whole import path (index, lease with remote keys, plan, RDMA READs,
// release, register). In the same iteration, and on the same machine:
//
//   - pvr: one process_vm_readv of the same number of bytes from another
//     process, the stand-in's wire speed (softverbs moves a READ with
//     process_vm_readv); x-pvr is the import's throughput over it (goal
//     at least 0.8);
//   - pvr2: the same bytes in two halves, each on a thread of its own, the
//     wire of the two queue pairs a chunk's lanes read on (softverbs
//     copies a queue pair's READs on its polling thread); x-pvr2 is the
//     import's throughput over it;
//   - quic: the same import between two other agent processes with
//     --rdma off; x-quic is RDMA's throughput over QUIC's.
//
// It also reports the work requests per import (wr/import), the mean
// scatter-list length (sge/wr), and the importer's CPU time per GB moved
// over each transport (cpu-ms/GB; over RDMA it includes softverbs' own
// copies, which a real NIC does without the CPU). The RDMA figure is then
// split: sv-copy-cpu-ms/GB is softverbs' copies (its counters, whichever
// thread made them), post-poll-cpu-ms/GB the posting and polling threads'
// time (kvfabric_rdma_read_cpu_seconds_total) less the copies softverbs
// made while polling on them, and host-cpu-ms/GB everything the importer
// spent but the copies: what it would cost with a NIC. Every imported byte
// is checked, untimed.
//
//	go test ./testbed -run '^$' -bench ImportRDMA -benchtime 5x -count 3
func BenchmarkImportRDMA(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	lib, err := softverbs.BuildShared()
	if err != nil {
		b.Fatalf("softverbs (make test installs libibverbs-dev): %v", err)
	}
	// The agents inherit the environment: one softverbs registry for all.
	registry := filepath.Join(dir, "registry")
	os.Setenv("SOFTVERBS_REGISTRY", registry)
	defer os.Unsetenv("SOFTVERBS_REGISTRY")

	producer := client.Engine{Name: "producer", Model: llama70B, TPSize: 4, PageSize: 16, Order: layout.HND}
	consumer := client.Engine{Name: "consumer", Model: llama70B, TPSize: 2, PageSize: 16, Order: layout.HND}
	m := producer.Model
	blockBytes := m.BlockBytes(producer.PageSize)
	nblocks := max(1, int(*benchRDMASize/int64(blockBytes)))
	size := uint64(nblocks) * blockBytes
	// Room for every iteration's blocks until eviction recycles them.
	producer.Slots, consumer.Slots = 2*nblocks, 2*nblocks
	pool := fmt.Sprintf("host=%d", 5*size/2+64<<20)

	start := func(args ...string) *Cluster {
		c, err := Start(ctx, Options{Bin: bin, Nodes: 2, Pool: pool, ExtraArgs: args})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	rd := start("--rdma", "on", "--rdma-library", lib)
	qc := start("--rdma", "off")
	pvr := startPVRSource(b, dir, size)
	dst := make([]byte, size)
	// One untimed read first: the baseline's destination pages fault in
	// now, as the agents' pool pages did when they were registered.
	if err := pvr.read(dst); err != nil {
		b.Fatal(err)
	}

	var rdmaTime, quicTime, pvrTime, pvr2Time time.Duration
	var rdmaCPU, quicCPU time.Duration
	wr0, sge0 := benchMetric(b, rd.Nodes[1], "kvfabric_rdma_work_requests_total"), benchMetric(b, rd.Nodes[1], "kvfabric_rdma_scatter_entries_total")
	pollCPU0 := benchMetric(b, rd.Nodes[1], "kvfabric_rdma_read_cpu_seconds_total")
	// The importer has read nothing yet: no counters is all zeros.
	sv0, _ := softverbs.ReadStats(registry, rd.Nodes[1].cmd.Process.Pid)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := range b.N {
		seqs := Workload{Sequences: 1, Blocks: nblocks, PageSize: 16, Seed: uint64(i) + uint64(time.Now().UnixNano())}.Hashes()
		for _, tc := range []struct {
			c        *Cluster
			want     string
			elapsed  *time.Duration
			cpu      *time.Duration
			producer client.Engine
		}{{rd, "rdma", &rdmaTime, &rdmaCPU, producer}, {qc, "quic", &quicTime, &quicCPU, producer}} {
			b.StopTimer()
			if err := produceReleased(ctx, tc.c.Nodes[0], tc.producer, seqs[0]); err != nil {
				b.Fatal(err)
			}
			benchIndexed(b, tc.c.Nodes[1], tc.c.Nodes[0].Name, seqs[0])
			b.StartTimer()
			took, cpu, err := importChecked(ctx, tc.c.Nodes[1], consumer, seqs[0], tc.want)
			if err != nil {
				b.Fatal(err)
			}
			*tc.elapsed += took
			*tc.cpu += cpu
		}
		t0 := time.Now()
		if err := pvr.read(dst); err != nil {
			b.Fatal(err)
		}
		pvrTime += time.Since(t0)
		t0 = time.Now()
		if err := pvr.readLanes(dst, 2); err != nil {
			b.Fatal(err)
		}
		pvr2Time += time.Since(t0)
	}
	b.StopTimer()
	gb := float64(size) * float64(b.N) / 1e9
	rate := func(d time.Duration) float64 { return gb / max(d.Seconds(), 1e-9) }
	b.ReportMetric(rate(rdmaTime), "rdma-GB/s")
	b.ReportMetric(rate(pvrTime), "pvr-GB/s")
	b.ReportMetric(rate(quicTime), "quic-GB/s")
	b.ReportMetric(pvrTime.Seconds()/rdmaTime.Seconds(), "x-pvr")
	b.ReportMetric(rate(pvr2Time), "pvr2-GB/s")
	b.ReportMetric(pvr2Time.Seconds()/rdmaTime.Seconds(), "x-pvr2")
	b.ReportMetric(quicTime.Seconds()/rdmaTime.Seconds(), "x-quic")
	wr := benchMetric(b, rd.Nodes[1], "kvfabric_rdma_work_requests_total") - wr0
	sge := benchMetric(b, rd.Nodes[1], "kvfabric_rdma_scatter_entries_total") - sge0
	b.ReportMetric(wr/float64(b.N), "wr/import")
	b.ReportMetric(sge/max(wr, 1), "sge/wr")
	b.ReportMetric(float64(rdmaCPU.Milliseconds())/gb, "rdma-cpu-ms/GB")
	b.ReportMetric(float64(quicCPU.Milliseconds())/gb, "quic-cpu-ms/GB")
	sv, err := softverbs.ReadStats(registry, rd.Nodes[1].cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	if got := sv.Bytes - sv0.Bytes; got != size*uint64(b.N) {
		b.Fatalf("softverbs moved %d bytes for the importer, want %d", got, size*uint64(b.N))
	}
	copies := sv.CopyCPU() - sv0.CopyCPU()
	pollCPU := time.Duration((benchMetric(b, rd.Nodes[1], "kvfabric_rdma_read_cpu_seconds_total") - pollCPU0) * 1e9)
	msPerGB := func(d time.Duration) float64 { return float64(d) / 1e6 / gb }
	b.ReportMetric(msPerGB(copies), "sv-copy-cpu-ms/GB")
	b.ReportMetric(msPerGB(pollCPU-(sv.PollerCPU-sv0.PollerCPU)), "post-poll-cpu-ms/GB")
	b.ReportMetric(msPerGB(rdmaCPU-copies), "host-cpu-ms/GB")
	b.ReportMetric(0, "ns/op")
}

// produceReleased stores hashes on n as engine e, as Produce does, and
// releases the engine's references: the blocks stay registered and
// served until eviction recycles them for later iterations.
func produceReleased(ctx context.Context, n *Node, e client.Engine, hashes []uint64) error {
	c, err := n.Client(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	set, err := c.Register(ctx, e)
	if err != nil {
		return err
	}
	slots, err := c.Allocate(ctx, set.ID, len(hashes))
	if err != nil {
		return err
	}
	for j, s := range slots {
		kvtest.Fill(set.Layout, set.Ranks, int(s), hashes[j])
	}
	refs, err := c.RegisterBlocks(ctx, set.ID, slots, hashes)
	if err != nil {
		return err
	}
	held := make([]uint32, len(refs))
	for i, r := range refs {
		held[i] = r.Slot
	}
	return c.Release(ctx, set.ID, held)
}

// importChecked imports hashes on n as engine e in one call, checks that
// every block came over want and holds what Produce wrote, and releases
// them. It returns the call's time and the importer's CPU time in it.
func importChecked(ctx context.Context, n *Node, e client.Engine, hashes []uint64, want string) (time.Duration, time.Duration, error) {
	c, err := n.Client(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	set, err := c.Register(ctx, e)
	if err != nil {
		return 0, 0, err
	}
	cpu0 := processCPU(n)
	t0 := time.Now()
	resp, err := c.Import(ctx, set.ID, hashes)
	took := time.Since(t0)
	cpu := processCPU(n) - cpu0
	if err != nil {
		return 0, 0, err
	}
	if len(resp.Blocks) != len(hashes) {
		return 0, 0, fmt.Errorf("%s: %d of %d blocks: %s", n.Name, len(resp.Blocks), len(hashes), resp.Error)
	}
	slots := make([]uint32, len(resp.Blocks))
	for i, blk := range resp.Blocks {
		if err := kvtest.Check(set.Layout, set.Ranks, int(blk.Slot), hashes[i]); err != nil {
			return 0, 0, fmt.Errorf("%s: block %d: %w", n.Name, i, err)
		}
		slots[i] = blk.Slot
	}
	for _, f := range resp.Fetches {
		if f.Transport != want {
			return 0, 0, fmt.Errorf("%s: %d blocks came from %s over %s, want %s", n.Name, f.Blocks, f.Node, f.Transport, want)
		}
	}
	return took, cpu, c.Release(ctx, set.ID, slots)
}

// processCPU is the user and system time n's process has used.
func processCPU(n *Node) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which ends with the last ')'.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / 100 // USER_HZ
}

// benchIndexed waits until n's index has holder's blocks of hashes.
func benchIndexed(b *testing.B, n *Node, holder string, hashes []uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.WaitIndexed(ctx, holder, hashes); err != nil {
		b.Fatal(err)
	}
}

// benchMetric reads one of n's metrics; a metric missing (renamed, or RDMA
// off) fails the benchmark rather than report zero.
func benchMetric(b *testing.B, n *Node, name string) float64 {
	v, err := metricValue(n, name)
	if err != nil {
		b.Fatalf("%s: %v", name, err)
	}
	return v
}

// pvrSource is another process holding size bytes, read with one
// process_vm_readv: the stand-in NIC's wire.
type pvrSource struct {
	pid  int
	addr uintptr
	size uint64
}

const pvrSourceC = `#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char **argv) {
	size_t n = strtoull(argv[1], 0, 10);
	char *p = malloc(n);
	if (!p) return 1;
	memset(p, 7, n);
	printf("%p\n", (void *)p);
	fflush(stdout);
	return getchar() == EOF ? 0 : 0;
}
`

func startPVRSource(b *testing.B, dir string, size uint64) *pvrSource {
	src := filepath.Join(dir, "pvr.c")
	exe := filepath.Join(dir, "pvr")
	if err := os.WriteFile(src, []byte(pvrSourceC), 0o644); err != nil {
		b.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-O2", src, "-o", exe).CombinedOutput(); err != nil {
		b.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(exe, strconv.FormatUint(size, 10))
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stdin.Close(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		b.Fatal(err)
	}
	addr, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(line), "0x"), 16, 64)
	if err != nil {
		b.Fatalf("pvr source said %q: %v", line, err)
	}
	return &pvrSource{pid: cmd.Process.Pid, addr: uintptr(addr), size: size}
}

// read copies the source's bytes into dst with process_vm_readv, as few
// calls as the kernel allows.
func (s *pvrSource) read(dst []byte) error {
	if err := s.readRange(dst, 0, len(dst)); err != nil {
		return err
	}
	if dst[0] != 7 || dst[len(dst)-1] != 7 {
		return fmt.Errorf("process_vm_readv read %d and %d, want 7", dst[0], dst[len(dst)-1])
	}
	return nil
}

// readRange copies bytes [from, to) of the source into the same range of
// dst.
func (s *pvrSource) readRange(dst []byte, from, to int) error {
	for off := from; off < to; {
		local := []unix.Iovec{{Base: &dst[off]}}
		local[0].SetLen(to - off)
		remote := []unix.RemoteIovec{{Base: s.addr + uintptr(off), Len: to - off}}
		n, err := unix.ProcessVMReadv(s.pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("process_vm_readv: %w", err)
		}
		off += n
	}
	return nil
}

// readLanes is read in n contiguous parts, each on a goroutine of its own.
func (s *pvrSource) readLanes(dst []byte, n int) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.readRange(dst, len(dst)*i/n, len(dst)*(i+1)/n)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if dst[0] != 7 || dst[len(dst)-1] != 7 {
		return fmt.Errorf("process_vm_readv read %d and %d, want 7", dst[0], dst[len(dst)-1])
	}
	return nil
}
