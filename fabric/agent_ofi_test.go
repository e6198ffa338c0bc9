//go:build cgo && linux

package fabric_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma/ofi"
)

// TP 4 -> TP 2 between in-process agents with fabric=ofi over libfabric's
// tcp and shm providers (make test-deps installs libfabric; without it the
// agents refuse to start, rdma=on, and the test fails): byte for byte, the
// fetch says rdma, every byte imported moved over libfabric, and the
// metrics and status name the provider.
func TestImportOverOFI(t *testing.T) {
	for _, prov := range []string{"tcp", "shm"} {
		t.Run(prov, func(t *testing.T) {
			agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
				c.RDMA, c.Fabric, c.FabricProvider = "on", "ofi", prov
				if prov == "tcp" {
					c.FabricAddr = "127.0.0.1"
				}
			})
			n1, n2 := agents[0], agents[1]
			m := importOverRDMA(t, n1, n2)
			if !strings.HasPrefix(m.RDMA.Binding, "ofi:"+prov) || len(m.RDMA.Fallbacks) != 0 {
				t.Errorf("importer's binding %q, fallbacks %v: want ofi:%s and none", m.RDMA.Binding, m.RDMA.Fallbacks, prov)
			}
			s, err := dial(t, n1).Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Pools) == 0 || !strings.HasPrefix(s.Pools[0].RdmaDevice, "ofi:"+prov) {
				t.Errorf("holder's status pools %v: want the pool registered with ofi:%s", s.Pools, prov)
			}
		})
	}
}

// rdma=on refuses to start when the fabric asked for is not there, naming
// what is missing: libfabric without the provider named, and with auto
// both libibverbs and libfabric; fabric=off (rdma=auto) starts without RDMA.
func TestFabricOnWithoutProviderRefusesToStart(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	for _, tc := range []struct {
		name, fabric, provider string
		want                   []string
	}{
		{"ofi without cxi", "ofi", "cxi", []string{"cxi"}},
		{"auto without either", "auto", "", []string{"libibverbs", missing, "libfabric", "cxi, efa or verbs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, "n1")
			c.RDMA, c.RDMALibrary, c.Fabric, c.FabricProvider = "on", missing, tc.fabric, tc.provider
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := fabric.Start(ctx, c)
			if err == nil {
				a.Close()
				t.Fatal("rdma=on started without its fabric")
			}
			for _, w := range append(tc.want, "rdma: on, and") {
				if !errors.Is(err, fabric.ErrConfig) || !strings.Contains(err.Error(), w) {
					t.Errorf("error %q: want fabric.ErrConfig naming %q", err, w)
				}
			}
		})
	}
	c := testConfig(t, "n1")
	c.Fabric = "off"
	a, err := fabric.Start(context.Background(), c)
	if err != nil {
		t.Fatalf("fabric=off: %v", err)
	}
	defer a.Close()
	if a.Metrics().RDMAEnabled {
		t.Error("fabric=off started with RDMA")
	}
}

// A device pool over libfabric is registered as the provider's DevicePlan
// says. tcp offers no FI_HMEM: the pool is staged through host memory,
// said once in the log, and rdma=on starts. A provider that reports
// FI_HMEM (faked here on tcp, whose endpoint then refuses the device
// pointer) has the pool registered by device pointer; when that fails, the
// agent logs it and stages the pool, or with rdma=on refuses to start
// naming the provider and FI_HMEM.
func TestDevicePoolOverOFIFollowsTheProvider(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hmem    bool // faked
		rdma    string
		logWant string // "" for a refused start
	}{
		{"no FI_HMEM, rdma on: staged", false, "on", "staged through host memory"},
		{"FI_HMEM, registration fails: staged", true, "auto", "RDMA registration of the device pool failed"},
		{"FI_HMEM, registration fails, rdma on: refused", true, "on", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cudaLib, _ := gpuLibs(t)
			t.Setenv("SOFTCUDA_DEVICES", "")
			t.Setenv("SOFTCUDA_MEMORY", "64M")
			if tc.hmem {
				defer fabric.SetOFIProviderInfo(func(p ofi.ProviderInfo) ofi.ProviderInfo { p.HMEM = true; return p })()
			}
			var logs bytes.Buffer
			var mu sync.Mutex
			cfg := testConfig(t, "n1")
			cfg.Pools = []string{"device=8MiB"}
			cfg.CUDALibrary = cudaLib
			cfg.RDMA, cfg.Fabric, cfg.FabricProvider, cfg.FabricAddr = tc.rdma, "ofi", "tcp", "127.0.0.1"
			cfg.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := fabric.Start(ctx, cfg)
			if tc.logWant == "" {
				if err == nil {
					a.Close()
					t.Fatal("started with rdma=on and a device pool libfabric did not register")
				}
				for _, w := range []string{"rdma: on, and", "tcp;ofi_rxm", "FI_HMEM"} {
					if !errors.Is(err, fabric.ErrConfig) || !strings.Contains(err.Error(), w) {
						t.Errorf("err = %v, want fabric.ErrConfig naming %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			s, err := newClient(t, a).Status(ctx)
			if err != nil || len(s.Pools) != 1 || s.Pools[0].Kind != "device" || s.Pools[0].RdmaRegistration != "" {
				t.Fatalf("pools %v %v, want a device pool not registered for RDMA", s.GetPools(), err)
			}
			mu.Lock()
			text := logs.String()
			mu.Unlock()
			if !strings.Contains(text, tc.logWant) || !strings.Contains(text, "FI_HMEM") {
				t.Fatalf("log does not say %q and name FI_HMEM:\n%s", tc.logWant, text)
			}
		})
	}
}

// An import into a device pool over libfabric's tcp provider (no FI_HMEM)
// is staged through host memory, TP 2 NHD -> TP 4 HND, byte for byte (the
// bytes copied back from the GPU), while the holder's host pool is
// registered with libfabric.
func TestDevicePoolImportOverOFIStaged(t *testing.T) {
	agents, lib := devicePair(t, 1, func(i int, c *fabric.Config) {
		c.RDMA, c.Fabric, c.FabricProvider, c.FabricAddr = "on", "ofi", "tcp", "127.0.0.1"
	})
	hashes := produce(t, agents[0], 2, layout.NHD, gpuBlocks)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, set := consumerOf(t, agents[1], 4, hashes)
	resp, err := c.Import(ctx, set.ID, hashes)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Blocks) != len(hashes) || len(resp.Fetches) == 0 || resp.Fetches[0].Transport != "quic" {
		t.Fatalf("import brought %d of %d blocks, fetches %v: %s", len(resp.Blocks), len(hashes), resp.Fetches, resp.Error)
	}
	mem := deviceBytes(t, lib, set.Layout)
	for i, b := range resp.Blocks {
		if err := kvtest.Check(set.Layout, mem, int(b.Slot), uint64(i+1)); err != nil {
			t.Fatalf("imported block %d: %v", i, err)
		}
	}
	if m := agents[0].Metrics(); !m.RDMAEnabled {
		t.Error("the holder runs without RDMA")
	}
}

// On a real GPU (KVF_TEST_CUDA_LIB names its driver, as make gpu-check
// sets it; without it the test skips, and with KVF_REQUIRE_GPU=1 fails), a
// device pool over a libfabric provider that registers CUDA memory (shm,
// or KVF_TEST_OFI_PROVIDER) is registered by device pointer, and an import
// lands in GPU memory over libfabric: TP 2 NHD -> TP 4 HND, the fetch over
// rdma, every byte copied back from the GPU right.
func TestDevicePoolOverOFIOnGPU(t *testing.T) {
	lib := os.Getenv("KVF_TEST_CUDA_LIB")
	if lib == "" {
		if os.Getenv("KVF_REQUIRE_GPU") != "" {
			t.Fatal("KVF_REQUIRE_GPU is set but KVF_TEST_CUDA_LIB names no CUDA driver")
		}
		t.Skip("needs a real GPU: KVF_TEST_CUDA_LIB names its driver (make gpu-check)")
	}
	prov := os.Getenv("KVF_TEST_OFI_PROVIDER")
	if prov == "" {
		prov = "shm"
	}
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		c.RDMA, c.Fabric, c.FabricProvider = "on", "ofi", prov
		if i == 1 {
			c.Pools = []string{"device:0=64MiB"}
			c.CUDALibrary = lib
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := dial(t, agents[1])
	s, err := c.Status(ctx)
	if err != nil || len(s.Pools) != 1 || s.Pools[0].RdmaRegistration != "hmem" {
		t.Fatalf("importer's pools %v %v: want the device pool registered by device pointer (hmem)", s.GetPools(), err)
	}
	hashes := produce(t, agents[0], 2, layout.NHD, gpuBlocks)
	set, err := c.Register(ctx, client.Engine{Name: "consumer", Model: testModel, TPSize: 4, PageSize: 16, Order: layout.HND, Slots: 16})
	if err != nil {
		t.Fatal(err)
	}
	waitLookup(t, c, hashes)
	resp, err := c.Import(ctx, set.ID, hashes)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Blocks) != len(hashes) || len(resp.Fetches) == 0 || resp.Fetches[0].Transport != "rdma" {
		t.Fatalf("import brought %d of %d blocks, fetches %v: %s", len(resp.Blocks), len(hashes), resp.Fetches, resp.Error)
	}
	mem := deviceBytes(t, lib, set.Layout)
	for i, b := range resp.Blocks {
		if err := kvtest.Check(set.Layout, mem, int(b.Slot), uint64(i+1)); err != nil {
			t.Fatalf("imported block %d: %v", i, err)
		}
	}
	t.Logf("%d blocks into GPU memory over ofi:%s, fetches %v", len(resp.Blocks), prov, resp.Fetches)
}
