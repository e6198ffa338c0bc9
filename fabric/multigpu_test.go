//go:build cgo && linux

package fabric_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// twoStrictGPUs sets softcuda up, for the agents this test starts, with
// two GPUs of 64 MiB at the given PCI bus ids, strict: every copy must run
// on its memory's GPU, and copies across GPUs be peer copies, or softcuda
// refuses them.
func twoStrictGPUs(t *testing.T, busIDs string) {
	t.Helper()
	for _, k := range []string{"SOFTCUDA_DMABUF", "SOFTCUDA_FAIL", "SOFTCUDA_COPY_DELAY_US"} {
		t.Setenv(k, "")
	}
	// Copies take time, as on a GPU: a missing synchronisation shows.
	t.Setenv("SOFTCUDA_COPY_DELAY_US", "200")
	t.Setenv("SOFTCUDA_DEVICES", "2")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	t.Setenv("SOFTCUDA_PCI_BUS_IDS", busIDs)
	t.Setenv("SOFTCUDA_STRICT_DEVICE", "1")
}

// Block sets span GPUs, a TP rank per GPU: an engine process writes a TP 4
// set whose ranks alternate over the holder's two GPUs; another agent with
// two GPUs imports it into a TP 2 set placed by the engine (rank 0 on GPU 1
// by PCI bus id, rank 1 on GPU 0 by index), over RDMA with both pools
// registered by dma-buf, or over QUIC staged per GPU; then a TP 1 set on
// GPU 0 is filled from it by the copy engines, one rank with a peer copy
// from GPU 1. Every element is checked, copied back from its GPU.
func TestDevicePoolsSpanGPUs(t *testing.T) {
	for _, tc := range []struct {
		rdma, transport, reg string
	}{
		{"on", "rdma", "dmabuf"},
		{"off", "quic", ""},
	} {
		t.Run(tc.transport, func(t *testing.T) {
			libs := make([]string, 2)
			var verbs string
			for i := range libs {
				libs[i], verbs = gpuLibs(t)
			}
			twoStrictGPUs(t, "0000:18:00.0,0000:2A:00.0")
			agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
				c.Pools = []string{"device=16MiB"}
				c.CUDALibrary = libs[i]
				c.RDMA, c.RDMALibrary = tc.rdma, verbs
			})
			holder, importer := agents[0], agents[1]
			runGPUEngine(t, holder.EngineSocket(), libs[0])

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, err := dial(t, holder).Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			// The producer's TP 4 set: ranks 0 and 2 on GPU 0, 1 and 3 on
			// GPU 1, an equal share of each pool.
			if len(s.Pools) != 2 {
				t.Fatalf("holder pools %v, want one per GPU", s.Pools)
			}
			for g, p := range s.Pools {
				if p.Kind != "device" || int(p.Device) != g || p.SizeBytes != 16<<20 || p.RdmaRegistration != tc.reg ||
					p.BlockSets != 1 || p.CarvedBytes != s.Pools[0].CarvedBytes || p.CarvedBytes == 0 {
					t.Fatalf("holder pool %d: %v", g, p)
				}
			}

			hashes := gpuHashes()
			c := dial(t, importer)
			consumer := client.Engine{Name: "gpu-consumer", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.HND, Slots: 32,
				Devices: []string{"0000:2a:00.0", "0"}}
			set := register(t, c, consumer)
			for r, want := range []int{1, 0} {
				m, reg := set.Memory[r], set.Layout.Regions[r]
				if int(m.CudaDevice) != want || int(reg.Device) != want || len(m.CudaIpcHandle) != 64 {
					t.Fatalf("rank %d: memory %v, region %+v; want GPU %d", r, m, reg, want)
				}
			}
			if string(set.Memory[0].CudaIpcHandle) == string(set.Memory[1].CudaIpcHandle) {
				t.Fatal("ranks on two GPUs name one IPC handle")
			}
			// The same layout placed the same way is the same set; placed
			// otherwise, another.
			again, err := c.Register(ctx, consumer)
			if err != nil || again.ID != set.ID {
				t.Fatalf("same placement: set %v (want %d) %v", again, set.ID, err)
			}
			swapped := consumer
			swapped.Devices = nil
			other, err := c.Register(ctx, swapped)
			if err != nil || other.ID == set.ID || other.Memory[0].CudaDevice != 0 || other.Memory[1].CudaDevice != 1 {
				t.Fatalf("default placement: %v %v", other, err)
			}

			waitLookup(t, c, hashes)
			resp, err := c.Import(ctx, set.ID, hashes)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Blocks) != len(hashes) {
				t.Fatalf("import brought %d of %d blocks: %s", len(resp.Blocks), len(hashes), resp.Error)
			}
			for _, f := range resp.Fetches {
				if f.Transport != tc.transport || f.Node != holder.NodeName() {
					t.Fatalf("fetch %v: want %s from %s", f, tc.transport, holder.NodeName())
				}
			}
			mem := deviceBytes(t, libs[1], set.Layout)
			for i, b := range resp.Blocks {
				if err := kvtest.Check(set.Layout, mem, int(b.Slot), uint64(i+1)); err != nil {
					t.Fatalf("imported block %d, copied back from the importer's GPUs: %v", i, err)
				}
			}

			// TP 2 -> 1 on the importer: rank 0's heads come from GPU 1 by
			// peer copy, rank 1's from GPU 0.
			importDeviceChecked(t, c, libs[1], client.Engine{Name: "gpu-tp1", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.NHD, Slots: 16,
				Devices: []string{"0"}}, hashes[:4], 0, "local")
		})
	}
}

// A placement the agent cannot honour is refused, naming the entry; at the
// limit, the last GPU by index and by PCI bus id is accepted.
func TestDevicePlacementRefusals(t *testing.T) {
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "3")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	t.Setenv("SOFTCUDA_PCI_BUS_IDS", "0000:18:00.0,0000:2a:00.0,0000:3b:00.0")
	cfg := testConfig(t, "n1")
	// Pools on GPUs 0 and 2 only: GPU 1 has none.
	cfg.Pools = []string{"device:0=8MiB", "device:2=8MiB"}
	cfg.CUDALibrary = lib
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newClient(t, a)
	e := client.Engine{Name: "e", Model: smallModel, TPSize: 2, PageSize: 4, Order: layout.HND, Slots: 8}
	for _, tc := range []struct {
		devices []string
		want    string
	}{
		{[]string{"0"}, "devices: 1 entries for TP 2"},
		{[]string{"0", "0", "2"}, "devices: 3 entries for TP 2"},
		{[]string{"1", ""}, `devices[0]: "1" names no GPU with a device pool`},
		{[]string{"", "3"}, `devices[1]: "3"`},
		{[]string{"0", "0000:2a:00.0"}, `devices[1]: "0000:2a:00.0"`},
		{[]string{"-1", "0"}, `devices[0]`},
	} {
		e.Devices = tc.devices
		_, err := c.Register(ctx, e)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("devices %q: %v, want InvalidArgument naming %q", tc.devices, err, tc.want)
		}
	}
	// The driver's form and NVML's (an eight-digit domain) name one GPU.
	e.Devices = []string{"2", "00000000:3B:00.0"}
	set := register(t, c, e)
	for r := range 2 {
		if set.Memory[r].CudaDevice != 2 || !strings.EqualFold(set.Memory[r].PciBusId, "0000:3b:00.0") {
			t.Fatalf("rank %d: %v, want GPU 2", r, set.Memory[r])
		}
	}
	s, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Pools) != 2 || s.Pools[0].Device != 0 || s.Pools[1].Device != 2 || s.Pools[0].BlockSets != 0 || s.Pools[1].BlockSets != 1 {
		t.Fatalf("pools %v", s.Pools)
	}

	// Without a slot count a set takes a quarter of the pool its ranks
	// are on, not of all pools: TP 1 on GPU 0, then TP 2 with both ranks
	// on GPU 2, each fitting beside the sets already there.
	carved := func() []uint64 {
		s, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return []uint64{s.Pools[0].CarvedBytes, s.Pools[1].CarvedBytes}
	}
	before := carved()
	e.Slots, e.Devices, e.TPSize, e.PageSize = 0, nil, 1, 8 // a new shape: no set to share
	if _, err := c.Register(ctx, e); err != nil {
		t.Fatal(err)
	}
	e.TPSize, e.Devices = 2, []string{"2", "2"}
	if _, err := c.Register(ctx, e); err != nil {
		t.Fatal(err)
	}
	after := carved()
	for i, quarter := range []uint64{2 << 20, 2 << 20} {
		if got := after[i] - before[i]; got == 0 || got > quarter {
			t.Fatalf("pool %d: %d bytes carved by a set of default slots, want at most a quarter of its 8 MiB", i, got)
		}
	}
}

// With a NIC per GPU, each GPU's pool is registered with the NIC nearest
// it, and an import between two such agents reads each rank through the
// NICs at its two ends, both NICs of the importer moving bytes.
func TestDevicePoolsUseTheNICNearestEachGPU(t *testing.T) {
	libs := make([]string, 2)
	var verbs string
	for i := range libs {
		libs[i], verbs = gpuLibs(t)
	}
	root := fakeTopology(t)
	twoStrictGPUs(t, "0000:02:00.0,0000:82:00.0")
	t.Setenv("SOFTVERBS_DEVICES", "sv0,sv1")
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		c.Pools = []string{"device=16MiB"}
		c.CUDALibrary = libs[i]
		c.RDMA, c.RDMALibrary = "on", verbs
		fabric.SetSysfsRoot(c, root)
	})
	holder, importer := agents[0], agents[1]
	runGPUEngine(t, holder.EngineSocket(), libs[0])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, a := range agents {
		s, err := dial(t, a).Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Pools) != 2 || s.Pools[0].RdmaDevice != "sv1" || s.Pools[1].RdmaDevice != "sv0" ||
			s.Pools[0].RdmaRegistration != "dmabuf" || s.Pools[1].RdmaRegistration != "dmabuf" {
			t.Fatalf("%s pools %v: want GPU 0's on sv1 and GPU 1's on sv0, by dma-buf", a.NodeName(), s.Pools)
		}
	}
	hashes := gpuHashes()
	c := dial(t, importer)
	// The holder's metadata tells the cluster what its GPUs hold.
	wait.For(t, 10*time.Second, "the importer sees the holder's GPU summary", func() error {
		s, err := c.Status(ctx)
		if err != nil {
			return err
		}
		for _, m := range s.Members {
			if m.Node == holder.NodeName() {
				if !m.Rdma || m.Gpus != 2 || m.GpuNics != 2 || m.GpuPoolBytes != 32<<20 || m.GpuModel == "" {
					return fmt.Errorf("holder as a member: %v", m)
				}
				return nil
			}
		}
		return fmt.Errorf("no member %s in %v", holder.NodeName(), s.Members)
	})
	waitLookup(t, c, hashes)
	// TP 1 on GPU 1: every byte lands through sv0, the NIC near GPU 1
	// (the importer's device 1), though it leaves the holder through both
	// of its NICs.
	half := len(hashes) / 2
	importDeviceChecked(t, c, libs[1], client.Engine{Name: "tp1", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.NHD, Slots: 16,
		Devices: []string{"1"}}, hashes[:half], 0, "rdma")
	m := importer.Metrics().RDMA
	if len(m.Devices) != 2 || m.Devices[0].Name != "sv1" || m.Devices[1].Name != "sv0" ||
		m.Devices[0].ReadBytes != 0 || m.Devices[1].ReadBytes != m.Bytes || m.Bytes == 0 {
		t.Fatalf("importer's RDMA devices %+v, %d bytes read: want all through sv0", m.Devices, m.Bytes)
	}
	// TP 2, a rank per GPU: rank 0 (GPU 0, sv1) and rank 1 (GPU 1, sv0)
	// hold the same bytes of each block, each NIC half of them.
	importDeviceChecked(t, c, libs[1], client.Engine{Name: "tp2", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.HND, Slots: 32},
		hashes[half:], half, "rdma")
	m2 := importer.Metrics().RDMA
	got0, got1 := m2.Devices[0].ReadBytes-m.Devices[0].ReadBytes, m2.Devices[1].ReadBytes-m.Devices[1].ReadBytes
	if got0 == 0 || got0 != got1 || got0+got1 != m2.Bytes-m.Bytes {
		t.Fatalf("importer's RDMA devices %+v after %+v: want the second import half through each", m2.Devices, m.Devices)
	}
}
