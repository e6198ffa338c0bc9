//go:build cgo && linux

package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/pool/cuda/softcuda"
	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

// Two agent processes, each with a device pool on its own softcuda GPU and
// RDMA on softverbs. The test process is the engine on both: on the holder
// it opens the IPC handle through the Go client and writes TP 4 KV with the
// driver's copies; on the importer it opens that agent's handle too,
// imports TP 4 -> TP 2 (over RDMA, the pools registered by dma-buf), and
// checks every element copied back from the importer's GPU. Then the same
// with RDMA off, through pinned staging on both sides.
func TestGPUPoolsAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	cudaLib, real := gpuLib(t, dir)
	verbsLib := ""
	if !real {
		var err error
		if verbsLib, err = softverbs.BuildShared(); err != nil {
			t.Fatalf("softverbs (make test installs libibverbs-dev): %v", err)
		}
	}
	// The agents inherit the environment: one softverbs registry for all,
	// a 64 MiB GPU each.
	t.Setenv("SOFTVERBS_REGISTRY", filepath.Join(dir, "registry"))
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	// Copies take time, as on a GPU: a missing synchronisation shows.
	t.Setenv("SOFTCUDA_COPY_DELAY_US", "200")
	drv, err := cuda.Open(cuda.Config{Path: cudaLib})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	for _, tc := range []struct {
		rdma, transport, registration string
	}{
		{"on", "rdma", "dmabuf"},
		{"off", "quic", ""},
	} {
		t.Run("rdma="+tc.rdma, func(t *testing.T) {
			args := []string{"--cuda-library", cudaLib, "--rdma", tc.rdma}
			if tc.rdma == "on" {
				if real {
					t.Skip("a real GPU's dma-buf needs a real NIC: softverbs registers memfds only")
				}
				args = append(args, "--rdma-library", verbsLib)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := Start(ctx, Options{Bin: bin, Nodes: 2, Pool: "device=16MiB", ExtraArgs: args})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			holder, importer := c.Nodes[0], c.Nodes[1]
			hc, err := holder.Client(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer hc.Close()
			const n = 10
			prod, err := hc.Register(ctx, client.Engine{Name: "producer", Model: gpuModel, TPSize: 4, PageSize: 16, Order: layout.HND, Slots: 32, CUDA: drv})
			if err != nil {
				t.Fatal(err)
			}
			slots, err := hc.Allocate(ctx, prod.ID, n)
			if err != nil {
				t.Fatal(err)
			}
			writeDevice(t, drv, prod, slots)
			hashes := gpuHashes(n)
			if _, err := hc.RegisterBlocks(ctx, prod.ID, slots, hashes); err != nil {
				t.Fatal(err)
			}
			st, err := hc.Status(ctx)
			if err != nil || len(st.Pools) != 1 || st.Pools[0].Kind != "device" || st.Pools[0].RdmaRegistration != tc.registration {
				t.Fatalf("holder's pools %v %v", st.GetPools(), err)
			}

			ic, err := importer.Client(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer ic.Close()
			cons, err := ic.Register(ctx, client.Engine{Name: "consumer", Model: gpuModel, TPSize: 2, PageSize: 16, Order: layout.HND, Slots: 32, CUDA: drv})
			if err != nil {
				t.Fatal(err)
			}
			ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = importer.WaitIndexed(ictx, holder.Name, hashes)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			resp, err := ic.Import(ctx, cons.ID, hashes)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Blocks) != n || len(resp.Fetches) == 0 {
				t.Fatalf("import brought %d of %d blocks: %s\n%s", len(resp.Blocks), n, resp.Error, importer.Log())
			}
			for _, f := range resp.Fetches {
				if f.Transport != tc.transport {
					t.Fatalf("fetch %v, want %s", f, tc.transport)
				}
			}
			mem := readDevice(t, drv, cons)
			for i, b := range resp.Blocks {
				if err := kvtest.Check(cons.Layout, mem, int(b.Slot), uint64(i+1)); err != nil {
					t.Fatalf("block %d copied back from the importer's GPU: %v", i, err)
				}
			}
			if log := holder.FullLog(); !strings.Contains(log, "device pool made") {
				t.Fatalf("holder's log says nothing of its device pool:\n%s", log)
			}
		})
	}
}

// envTestCUDALib names a real driver (libcuda.so.1) for the GPU test and
// benchmark to run on instead of softcuda (make gpu-check); RDMA then
// stays off, as softverbs registers no real GPU's dma-buf.
const envTestCUDALib = "KVF_TEST_CUDA_LIB"

// gpuLib returns the driver the agents and the test's engine load: the one
// KVF_TEST_CUDA_LIB names (real), or softcuda built into dir.
func gpuLib(tb testing.TB, dir string) (lib string, real bool) {
	tb.Helper()
	if p := os.Getenv(envTestCUDALib); p != "" {
		return p, true
	}
	lib, err := softcuda.Build(filepath.Join(dir, "cuda"))
	if err != nil {
		tb.Fatal(err)
	}
	return lib, false
}

var gpuModel = layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 16, DType: layout.DTypeBF16}

func gpuHashes(n int) []uint64 {
	tokens := make([]uint32, 16*n)
	for i := range tokens {
		tokens[i] = uint32(i*11 + 5)
	}
	h, _ := layout.NewHasher(16, layout.HashOptions{})
	var out []uint64
	for _, b := range h.Sequence(tokens) {
		out = append(out, b.Sequence)
	}
	return out
}

// writeDevice writes logical block i+1 into slots[i] of set's device
// regions.
func writeDevice(t testing.TB, drv *cuda.Driver, set *client.BlockSet, slots []uint32) {
	t.Helper()
	ids := make([]uint64, len(slots))
	for i := range ids {
		ids[i] = uint64(i + 1)
	}
	writeDeviceIDs(t, drv, set, slots, ids)
}

// writeDeviceIDs writes logical block ids[i] into slots[i].
func writeDeviceIDs(t testing.TB, drv *cuda.Driver, set *client.BlockSet, slots []uint32, ids []uint64) {
	t.Helper()
	if len(set.Device) != set.Layout.TPSize {
		t.Fatalf("block set has %d device regions for TP %d", len(set.Device), set.Layout.TPSize)
	}
	streams, closeStreams := rankStreams(t, drv, set)
	defer closeStreams()
	strides := set.Layout.Strides()
	host := make([][]byte, set.Layout.TPSize)
	for r := range host {
		host[r] = make([]byte, strides.Region)
	}
	for i, s := range slots {
		kvtest.Fill(set.Layout, host, int(s), ids[i])
		off := uint64(s) * strides.Block
		for r, d := range set.Device {
			if err := streams[r].CopyHtoD(d.Ptr+off, host[r][off:off+strides.Shard]); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// rankStreams makes a stream per rank of set on the rank's GPU (a block
// set may span GPUs); closeAll closes them (before the driver).
func rankStreams(t testing.TB, drv *cuda.Driver, set *client.BlockSet) (out []*cuda.Stream, closeAll func()) {
	t.Helper()
	closeAll = func() {
		for _, st := range out {
			if st != nil {
				st.Close()
			}
		}
	}
	out = make([]*cuda.Stream, len(set.Device))
	for r, d := range set.Device {
		st, err := drv.NewStream(d.GPU)
		if err != nil {
			closeAll()
			t.Fatal(err)
		}
		out[r] = st
	}
	return out, closeAll
}

// readDevice copies set's device regions out.
func readDevice(t testing.TB, drv *cuda.Driver, set *client.BlockSet) [][]byte {
	t.Helper()
	if len(set.Device) != set.Layout.TPSize {
		t.Fatalf("block set has %d device regions for TP %d", len(set.Device), set.Layout.TPSize)
	}
	streams, closeStreams := rankStreams(t, drv, set)
	defer closeStreams()
	out := make([][]byte, len(set.Device))
	for r, d := range set.Device {
		out[r] = make([]byte, d.Size)
		if err := streams[r].CopyDtoH(out[r], d.Ptr); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// BenchmarkImportGPU imports Llama-70B blocks TP 4 -> TP 2 HND between two
// agent processes whose pools are GPU memory on softcuda: over RDMA on
// softverbs into and out of HBM (dma-buf registrations), and with RDMA off
// over QUIC through pinned staging on both sides; in the same iteration,
// the same import between two agents with host pools over QUIC, the
// baseline (x-host is each one's throughput over it). Producing and
// checking every byte (copied back from the importer's GPU) are untimed.
// softcuda's copies are memcpy: this measures the path's overheads, not a
// GPU's copy engines (BENCHMARKS.md says how to measure those).
//
//	go test ./testbed -run '^$' -bench ImportGPU -benchtime 5x
func BenchmarkImportGPU(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	cudaLib, real := gpuLib(b, dir)
	verbsLib := ""
	if !real {
		var err error
		if verbsLib, err = softverbs.BuildShared(); err != nil {
			b.Fatalf("softverbs (make test installs libibverbs-dev): %v", err)
		}
	}
	b.Setenv("SOFTVERBS_REGISTRY", filepath.Join(dir, "registry"))
	b.Setenv("SOFTCUDA_MEMORY", "1G")
	drv, err := cuda.Open(cuda.Config{Path: cudaLib})
	if err != nil {
		b.Fatal(err)
	}
	defer drv.Close()

	producer := client.Engine{Name: "producer", Model: llama70B, TPSize: 4, PageSize: 16, Order: layout.HND}
	consumer := client.Engine{Name: "consumer", Model: llama70B, TPSize: 2, PageSize: 16, Order: layout.HND}
	m := producer.Model
	blockBytes := m.BlockBytes(producer.PageSize)
	nblocks := max(1, int(*benchRDMASize/int64(blockBytes)))
	size := uint64(nblocks) * blockBytes
	producer.Slots, consumer.Slots = 2*nblocks, 2*nblocks
	poolSize := 5*size/2 + 64<<20
	start := func(pool string, args ...string) *Cluster {
		c, err := Start(ctx, Options{Bin: bin, Nodes: 2, Pool: pool, ExtraArgs: args})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	dev := fmt.Sprintf("device=%d", poolSize)
	var rd *Cluster
	if !real { // a real GPU's dma-buf needs a real NIC
		rd = start(dev, "--cuda-library", cudaLib, "--rdma", "on", "--rdma-library", verbsLib)
	}
	staged := start(dev, "--cuda-library", cudaLib, "--rdma", "off")
	host := start(fmt.Sprintf("host=%d", poolSize), "--rdma", "off")

	var rdmaTime, stagedTime, hostTime time.Duration
	b.SetBytes(int64(size))
	b.ResetTimer()
	for i := range b.N {
		seqs := Workload{Sequences: 1, Blocks: nblocks, PageSize: 16, Seed: uint64(i) + uint64(time.Now().UnixNano())}.Hashes()
		hashes := seqs[0]
		for _, tc := range []struct {
			c       *Cluster
			want    string
			elapsed *time.Duration
		}{{rd, "rdma", &rdmaTime}, {staged, "quic", &stagedTime}, {host, "quic", &hostTime}} {
			if tc.c == nil {
				continue
			}
			b.StopTimer()
			if tc.c == host {
				if err := produceReleased(ctx, tc.c.Nodes[0], producer, hashes); err != nil {
					b.Fatal(err)
				}
				benchIndexed(b, tc.c.Nodes[1], tc.c.Nodes[0].Name, hashes)
				b.StartTimer()
				took, _, err := importChecked(ctx, tc.c.Nodes[1], consumer, hashes, tc.want)
				if err != nil {
					b.Fatal(err)
				}
				*tc.elapsed += took
				continue
			}
			produceDevice(b, drv, tc.c.Nodes[0], producer, hashes)
			benchIndexed(b, tc.c.Nodes[1], tc.c.Nodes[0].Name, hashes)
			b.StartTimer()
			*tc.elapsed += importDevice(b, drv, tc.c.Nodes[1], consumer, hashes, tc.want)
		}
	}
	b.StopTimer()
	gb := float64(size) * float64(b.N) / 1e9
	rate := func(d time.Duration) float64 { return gb / max(d.Seconds(), 1e-9) }
	if rd != nil {
		b.ReportMetric(rate(rdmaTime), "rdma-hbm-GB/s")
		b.ReportMetric(hostTime.Seconds()/rdmaTime.Seconds(), "rdma-x-host")
	}
	b.ReportMetric(rate(stagedTime), "staged-hbm-GB/s")
	b.ReportMetric(rate(hostTime), "host-quic-GB/s")
	b.ReportMetric(hostTime.Seconds()/stagedTime.Seconds(), "staged-x-host")
	b.ReportMetric(0, "ns/op")
}

// produceDevice stores hashes on n's device pool as engine e, writing
// through the IPC handle, and releases the engine's references.
func produceDevice(b *testing.B, drv *cuda.Driver, n *Node, e client.Engine, hashes []uint64) {
	ctx := context.Background()
	c, err := n.Client(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	e.CUDA = drv
	set, err := c.Register(ctx, e)
	if err != nil {
		b.Fatal(err)
	}
	slots, err := c.Allocate(ctx, set.ID, len(hashes))
	if err != nil {
		b.Fatal(err)
	}
	writeDeviceIDs(b, drv, set, slots, hashes)
	refs, err := c.RegisterBlocks(ctx, set.ID, slots, hashes)
	if err != nil {
		b.Fatal(err)
	}
	held := make([]uint32, len(refs))
	for i, r := range refs {
		held[i] = r.Slot
	}
	if err := c.Release(ctx, set.ID, held); err != nil {
		b.Fatal(err)
	}
}

// importDevice imports hashes into n's device pool as engine e, checks
// every block (copied back, untimed) came over want, releases them, and
// returns the import call's time.
func importDevice(b *testing.B, drv *cuda.Driver, n *Node, e client.Engine, hashes []uint64, want string) time.Duration {
	ctx := context.Background()
	c, err := n.Client(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	e.CUDA = drv
	set, err := c.Register(ctx, e)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	resp, err := c.Import(ctx, set.ID, hashes)
	took := time.Since(t0)
	b.StopTimer()
	defer b.StartTimer()
	if err != nil {
		b.Fatal(err)
	}
	if len(resp.Blocks) != len(hashes) {
		b.Fatalf("%s: %d of %d blocks: %s", n.Name, len(resp.Blocks), len(hashes), resp.Error)
	}
	for _, f := range resp.Fetches {
		if f.Transport != want {
			b.Fatalf("%s: %d blocks came from %s over %s, want %s", n.Name, f.Blocks, f.Node, f.Transport, want)
		}
	}
	mem := readDevice(b, drv, set)
	slots := make([]uint32, len(resp.Blocks))
	for i, blk := range resp.Blocks {
		if err := kvtest.Check(set.Layout, mem, int(blk.Slot), hashes[i]); err != nil {
			b.Fatalf("%s: block %d: %v", n.Name, i, err)
		}
		slots[i] = blk.Slot
	}
	if err := c.Release(ctx, set.ID, slots); err != nil {
		b.Fatal(err)
	}
	return took
}
