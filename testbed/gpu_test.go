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
	"github.com/kvfabric/kvfabric/internal/wait"
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
	cudaLib, err := softcuda.Build(filepath.Join(dir, "cuda"))
	if err != nil {
		t.Fatal(err)
	}
	verbsLib, err := softverbs.Build(filepath.Join(os.TempDir(), "kvfabric-softverbs"))
	if err != nil {
		t.Fatalf("softverbs (make test installs libibverbs-dev): %v", err)
	}
	// The agents inherit the environment: one softverbs registry for all,
	// a 64 MiB GPU each.
	t.Setenv("SOFTVERBS_REGISTRY", filepath.Join(dir, "registry"))
	t.Setenv("SOFTCUDA_MEMORY", "64M")
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
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := Start(ctx, Options{Bin: bin, Nodes: 2, Pool: "device=16MiB",
				ExtraArgs: []string{"--cuda-library", cudaLib, "--rdma", tc.rdma, "--rdma-library", verbsLib}})
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
			wait.For(t, 10*time.Second, "the importer indexes the holder's blocks", func() error {
				ov, err := ic.Lookup(ctx, hashes)
				if err != nil || len(ov) == 0 || int(ov[0].Blocks) != n {
					return fmt.Errorf("overlaps %v %v", ov, err)
				}
				return nil
			})
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
			if log := holder.Log(); !strings.Contains(log, "device pool made") {
				t.Fatalf("holder's log says nothing of its device pool:\n%s", log)
			}
		})
	}
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
func writeDevice(t *testing.T, drv *cuda.Driver, set *client.BlockSet, slots []uint32) {
	t.Helper()
	if len(set.Device) != set.Layout.TPSize {
		t.Fatalf("block set has %d device regions for TP %d", len(set.Device), set.Layout.TPSize)
	}
	st, err := drv.NewStream(set.Device[0].GPU)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	strides := set.Layout.Strides()
	host := make([][]byte, set.Layout.TPSize)
	for r := range host {
		host[r] = make([]byte, strides.Region)
	}
	for i, s := range slots {
		kvtest.Fill(set.Layout, host, int(s), uint64(i+1))
		off := uint64(s) * strides.Block
		for r, d := range set.Device {
			if err := st.CopyHtoD(d.Ptr+off, host[r][off:off+strides.Shard]); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// readDevice copies set's device regions out.
func readDevice(t *testing.T, drv *cuda.Driver, set *client.BlockSet) [][]byte {
	t.Helper()
	if len(set.Device) != set.Layout.TPSize {
		t.Fatalf("block set has %d device regions for TP %d", len(set.Device), set.Layout.TPSize)
	}
	st, err := drv.NewStream(set.Device[0].GPU)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	out := make([][]byte, len(set.Device))
	for r, d := range set.Device {
		out[r] = make([]byte, d.Size)
		if err := st.CopyDtoH(out[r], d.Ptr); err != nil {
			t.Fatal(err)
		}
	}
	return out
}
