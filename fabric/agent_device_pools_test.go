//go:build cgo && linux

package fabric_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/pool/cuda/softcuda"
	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

// The device-pool engine helper: a separate process (the driver refuses to
// open an IPC handle in the process that made it, and softcuda with it)
// that registers on an agent with a device pool, opens the IPC handle
// through pool/cuda, writes gpuBlocks blocks with the driver's copies and
// registers them.
const (
	gpuHelperEnv    = "KVFABRIC_TEST_GPU_ENGINE" // the engine socket
	gpuHelperLibEnv = "KVFABRIC_TEST_GPU_ENGINE_LIB"
	gpuBlocks       = 12
)

// gpuProducer is the engine that writes KV into the holder's device pool.
var gpuProducer = client.Engine{Name: "gpu-producer", Model: testModel, TPSize: 4, PageSize: 16, Order: layout.HND, Slots: 32}

// gpuHashes are the sequence hashes of the helper's blocks (token i*7+3,
// as produce).
func gpuHashes() []uint64 {
	tokens := make([]uint32, 16*gpuBlocks)
	for i := range tokens {
		tokens[i] = uint32(i*7 + 3)
	}
	h, _ := layout.NewHasher(16, layout.HashOptions{})
	var out []uint64
	for _, b := range h.Sequence(tokens) {
		out = append(out, b.Sequence)
	}
	return out
}

// init runs the helper instead of the tests in the helper's process.
func init() {
	if socket := os.Getenv(gpuHelperEnv); socket != "" {
		if err := gpuEngineHelper(socket); err != nil {
			fmt.Fprintln(os.Stderr, "gpu engine helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

func gpuEngineHelper(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	drv, err := cuda.Open(cuda.Config{Path: os.Getenv(gpuHelperLibEnv)})
	if err != nil {
		return err
	}
	defer drv.Close()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		return err
	}
	e := gpuProducer
	e.CUDA = drv
	set, err := c.Register(ctx, e)
	if err != nil {
		c.Close()
		return err
	}
	if len(set.Device) != e.TPSize || set.Ranks != nil {
		c.Close()
		return fmt.Errorf("block set: %d device regions and %d host ones for TP %d", len(set.Device), len(set.Ranks), e.TPSize)
	}
	slots, err := c.Allocate(ctx, set.ID, gpuBlocks)
	if err != nil {
		c.Close()
		return err
	}
	// A stream per rank, on the rank's GPU: the ranks may span GPUs.
	streams := make([]*cuda.Stream, len(set.Device))
	for r, d := range set.Device {
		if streams[r], err = drv.NewStream(d.GPU); err != nil {
			c.Close()
			return err
		}
		defer streams[r].Close()
	}
	// Each block's shard, filled in host memory and copied to the device;
	// then read back, to show the bytes are where the description says.
	l := set.Layout
	strides := l.Strides()
	host := make([][]byte, l.TPSize)
	for r := range host {
		host[r] = make([]byte, strides.Region)
	}
	for i, s := range slots {
		kvtest.Fill(l, host, int(s), uint64(i+1))
		off := uint64(s) * strides.Block
		for r, d := range set.Device {
			if err := streams[r].CopyHtoD(d.Ptr+off, host[r][off:off+strides.Shard]); err != nil {
				return err
			}
		}
	}
	back := make([][]byte, l.TPSize)
	for r, d := range set.Device {
		back[r] = make([]byte, strides.Region)
		if err := streams[r].CopyDtoH(back[r], d.Ptr); err != nil {
			return err
		}
	}
	for i, s := range slots {
		if err := kvtest.Check(l, back, int(s), uint64(i+1)); err != nil {
			return fmt.Errorf("read back from the device: %w", err)
		}
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots, gpuHashes()); err != nil {
		c.Close()
		return err
	}
	// Close unmaps the IPC memory; the blocks stay registered.
	return c.Close()
}

var (
	gpuLibOnce   sync.Once
	gpuLibDir    string
	gpuLibPath   string
	gpuVerbsPath string
	gpuLibErr    error
)

// removeGPULibs removes softcuda's build directory: the test binary's,
// made once for every GPU test, it goes with the run.
func removeGPULibs() {
	if gpuLibDir != "" {
		os.RemoveAll(gpuLibDir)
	}
}

// gpuLibs builds softcuda and softverbs once per test binary and returns
// a fresh copy of softcuda per call (a GPU of its own, with its own
// SOFTCUDA_* settings read at its cuInit) and softverbs, with a registry
// of this test's own.
func gpuLibs(t testing.TB) (cudaLib, verbsLib string) {
	t.Helper()
	gpuLibOnce.Do(func() {
		gpuLibDir, gpuLibErr = os.MkdirTemp("", "kvfabric-gpu-")
		if gpuLibErr == nil {
			gpuLibPath, gpuLibErr = softcuda.Build(gpuLibDir)
		}
		if gpuLibErr == nil {
			gpuVerbsPath, gpuLibErr = softverbs.BuildShared()
		}
	})
	if gpuLibErr != nil {
		t.Fatalf("build softcuda and softverbs (make test installs libibverbs-dev): %v", gpuLibErr)
	}
	src, err := os.ReadFile(gpuLibPath)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cudaLib = filepath.Join(dir, "libsoftcuda.so")
	if err := os.WriteFile(cudaLib, src, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SOFTVERBS_REGISTRY", filepath.Join(dir, "registry"))
	t.Setenv("SOFTVERBS_CONTROL", filepath.Join(dir, "control"))
	return cudaLib, gpuVerbsPath
}

// devicePair starts two agents on softcuda, agent device with an 8 MiB
// device pool, each config passed to configure (nil for none) after that;
// it returns them and the CUDA library agent device uses. Set SOFTCUDA_*
// faults before calling it.
func devicePair(t *testing.T, device int, configure func(i int, c *fabric.Config)) ([]*fabric.Agent, string) {
	t.Helper()
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i == device {
			c.Pools = []string{"device:0=8MiB"}
			c.CUDALibrary = lib
		}
		if configure != nil {
			configure(i, c)
		}
	})
	return agents, lib
}

// consumerOf registers a 16-slot HND block set of testModel at TP tp on a,
// and waits until a's index finds hashes; it returns a's shared client.
func consumerOf(t *testing.T, a *fabric.Agent, tp int, hashes []uint64) (*client.Client, *client.BlockSet) {
	t.Helper()
	c := dial(t, a)
	set := register(t, c, client.Engine{Name: "consumer", Model: testModel, TPSize: tp, PageSize: 16, Order: layout.HND, Slots: 16})
	waitLookup(t, c, hashes)
	return c, set
}

// runGPUEngine runs the helper against socket in another process.
func runGPUEngine(t *testing.T, socket, lib string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), gpuHelperEnv+"="+socket, gpuHelperLibEnv+"="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("engine process: %v\n%s", err, out)
	}
}

// deviceBytes copies a block set's regions out of an agent's device pool
// in this process, through the same softcuda the agent loaded.
func deviceBytes(t *testing.T, lib string, l *layout.Layout) [][]byte {
	t.Helper()
	drv, err := cuda.Open(cuda.Config{Path: lib})
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Close()
	out := make([][]byte, len(l.Regions))
	for r, reg := range l.Regions {
		st, err := drv.NewStream(int(reg.Device))
		if err != nil {
			t.Fatal(err)
		}
		out[r] = make([]byte, reg.Size)
		err = st.CopyDtoH(out[r], reg.Base)
		st.Close()
		if err != nil {
			t.Fatalf("rank %d on GPU %d: %v", r, reg.Device, err)
		}
	}
	return out
}

// An engine process opens the holder's device pool by IPC handle, writes
// KV with the driver's copies and registers it; another agent with a
// device pool imports it TP 4 -> TP 2 over RDMA, the holder's pool and its
// own registered by dma-buf, and the bytes copied back from its GPU are
// every element right.
func TestDevicePoolImportOverRDMA(t *testing.T) {
	libs := make([]string, 2)
	var verbs string
	for i := range libs {
		libs[i], verbs = gpuLibs(t)
	}
	for _, k := range []string{"SOFTCUDA_DEVICES", "SOFTCUDA_DMABUF", "SOFTCUDA_FAIL", "SOFTCUDA_COPY_DELAY_US", "SOFTCUDA_PCI_BUS_IDS"} {
		t.Setenv(k, "")
	}
	// Copies take time, as on a GPU: a missing synchronisation shows.
	t.Setenv("SOFTCUDA_COPY_DELAY_US", "200")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		c.Pools = []string{"host=16MiB", "device=16MiB"}
		c.CUDALibrary = libs[i]
		c.RDMA, c.RDMALibrary = "on", verbs
	})
	holder, importer := agents[0], agents[1]
	runGPUEngine(t, holder.EngineSocket(), libs[0])

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, a := range agents {
		s, err := dial(t, a).Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Pools) != 1 || s.Pools[0].Kind != "device" || s.Pools[0].Device != 0 || s.Pools[0].SizeBytes != 16<<20 ||
			s.Pools[0].RdmaRegistration != "dmabuf" {
			t.Fatalf("agent %d pools: %v", i, s.Pools)
		}
	}
	hashes := gpuHashes()
	c := dial(t, importer)
	set, err := c.Register(ctx, client.Engine{Name: "gpu-consumer", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.HND, Slots: 32})
	if err != nil {
		t.Fatal(err)
	}
	// Without a driver of its own the client hands the IPC handle over.
	if set.Ranks != nil || set.Device != nil || len(set.Memory) != 2 || len(set.Memory[0].CudaIpcHandle) != 64 ||
		set.Memory[0].Path != "" || set.Memory[0].PciBusId == "" || set.Layout.Regions[0].Kind != layout.Device {
		t.Fatalf("device block set as the engine sees it: %+v, memory %v", set, set.Memory)
	}
	holderHas := func() error {
		ov, err := c.Lookup(ctx, hashes)
		if err != nil {
			return err
		}
		for _, o := range ov {
			if o.Node == holder.NodeName() && int(o.Blocks) == len(hashes) {
				return nil
			}
		}
		return fmt.Errorf("overlaps %v", ov)
	}
	wait.For(t, 10*time.Second, "the importer's index has the holder's blocks", holderHas)
	resp, err := c.Import(ctx, set.ID, hashes)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Blocks) != len(hashes) {
		t.Fatalf("import brought %d of %d blocks: %s", len(resp.Blocks), len(hashes), resp.Error)
	}
	for _, f := range resp.Fetches {
		if f.Transport != "rdma" || f.Node != holder.NodeName() {
			t.Fatalf("fetch %v: want rdma from %s", f, holder.NodeName())
		}
	}
	mem := deviceBytes(t, libs[1], set.Layout)
	for i, b := range resp.Blocks {
		if err := kvtest.Check(set.Layout, mem, int(b.Slot), uint64(i+1)); err != nil {
			t.Fatalf("imported block %d, copied back from the importer's GPU: %v", i, err)
		}
	}
	// A block set of another shape on the importer is filled from the
	// imported one by the GPU's copy engine (a local copy, TP 2 -> 1).
	importDeviceChecked(t, c, libs[1], client.Engine{Name: "gpu-tp1", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.NHD, Slots: 16},
		hashes[:4], 0, "local")
}

// importDeviceChecked registers e through c, imports hashes into its block
// set, and checks that they came over transport and that every element is
// right (the producer's block first+i carries id first+i+1), copied back
// from the agent's GPUs through lib. It returns the set.
func importDeviceChecked(t *testing.T, c *client.Client, lib string, e client.Engine, hashes []uint64, first int, transport string) *client.BlockSet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	set := register(t, c, e)
	resp, err := c.Import(ctx, set.ID, hashes)
	if err != nil || len(resp.Blocks) != len(hashes) || len(resp.Fetches) == 0 {
		t.Fatalf("import of %d blocks into %s: %v %v", len(hashes), e.Name, resp, err)
	}
	for _, f := range resp.Fetches {
		if f.Transport != transport {
			t.Fatalf("import into %s: fetch %v, want %s", e.Name, f, transport)
		}
	}
	mem := deviceBytes(t, lib, set.Layout)
	for i, b := range resp.Blocks {
		if err := kvtest.Check(set.Layout, mem, int(b.Slot), uint64(first+i+1)); err != nil {
			t.Fatalf("block %d imported into %s: %v", first+i, e.Name, err)
		}
	}
	return set
}

// Without RDMA, GPU memory is filled and served over QUIC through pinned
// staging: an import into a device pool lands TP 2 NHD -> TP 4 HND
// byte-exact (the bytes copied back from the GPU), and one out of a
// holder's device pool (an engine process wrote it through the IPC handle)
// TP 4 -> TP 2, with the holder staging its default 4 MiB at a time, or
// batches at the size of the pieces it serves (1 KiB: two heads of a TP 4
// HND chunk), 24 bytes under it (each piece split in two) and three pieces'
// worth. The importer stages in parts of the same size (many parts, two
// buffers taking turns, where 1000 bytes cuts its pieces).
func TestDevicePoolImportOverStagedQUIC(t *testing.T) {
	for _, tc := range []struct {
		name   string
		device int    // which agent has the device pool
		tp     int    // the importer's
		stage  uint64 // the holder's staging batch; 0: the default
	}{
		{"into GPU memory", 1, 4, 0},
		{"into GPU memory in parts of 1000 bytes", 1, 4, 1000},
		{"out of GPU memory", 0, 2, 0},
		{"out of GPU memory staged a piece at a time", 0, 2, 1024},
		{"out of GPU memory staged in parts of pieces", 0, 2, 1000},
		{"out of GPU memory staged three pieces at a time", 0, 2, 3072},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agents, lib := devicePair(t, tc.device, func(i int, c *fabric.Config) {
				c.RDMA = "off"
				fabric.SetStageBytes(c, tc.stage)
			})
			var hashes []uint64
			if tc.device == 0 {
				runGPUEngine(t, agents[0].EngineSocket(), lib)
				hashes = gpuHashes()
			} else {
				hashes = produce(t, agents[0], 2, layout.NHD, gpuBlocks)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, set := consumerOf(t, agents[1], tc.tp, hashes)
			resp, err := c.Import(ctx, set.ID, hashes)
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Blocks) != len(hashes) || len(resp.Fetches) == 0 || resp.Fetches[0].Transport != "quic" {
				t.Fatalf("import brought %d of %d blocks, fetches %v: %s", len(resp.Blocks), len(hashes), resp.Fetches, resp.Error)
			}
			mem := set.Ranks
			if tc.device == 1 {
				mem = deviceBytes(t, lib, set.Layout)
			}
			for i, b := range resp.Blocks {
				if err := kvtest.Check(set.Layout, mem, int(b.Slot), uint64(i+1)); err != nil {
					t.Fatalf("imported block %d: %v", i, err)
				}
			}
		})
	}
}

// Without a CUDA driver, or with a driver that sees no GPU, an agent asked
// for a device pool runs on its host pool and says so in one log line.
func TestDevicePoolFallsBackToHost(t *testing.T) {
	lib, _ := gpuLibs(t)
	for _, tc := range []struct {
		name, lib, devices, reason string
	}{
		{"no driver", filepath.Join(t.TempDir(), "libcuda.so.1"), "", "libcuda.so.1"},
		{"no GPU", lib, "0", "no devices"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SOFTCUDA_DEVICES", tc.devices)
			var logs bytes.Buffer
			var mu sync.Mutex
			cfg := testConfig(t, "n1")
			cfg.Pools = []string{"host=8MiB", "device=0.5"}
			cfg.CUDALibrary = tc.lib
			cfg.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
			a := startAgent(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := newClient(t, a)
			s, err := c.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Pools) != 1 || s.Pools[0].Kind != "host" || s.Pools[0].SizeBytes != 8<<20 || s.Pools[0].Device != -1 {
				t.Fatalf("pools %v, want the host pool of 8 MiB", s.Pools)
			}
			set, err := c.Register(ctx, client.Engine{Name: "e", Model: smallModel, TPSize: 2, PageSize: 4, Order: layout.HND, Slots: 8})
			if err != nil || len(set.Ranks) != 2 || set.Device != nil {
				t.Fatalf("register on the host pool: %+v %v", set, err)
			}
			mu.Lock()
			text := logs.String()
			mu.Unlock()
			if n := strings.Count(text, "no GPU"); n != 1 || !strings.Contains(text, tc.reason) {
				t.Fatalf("%d lines say \"no GPU\" (want 1, with %q):\n%s", n, tc.reason, text)
			}
		})
	}
}

// A GPU index the driver does not have, or more memory than a GPU has
// free, is refused at start and named, as a SettingError about pools (so
// that kvfabric agent names --pool).
func TestDevicePoolRefusals(t *testing.T) {
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "2")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	for _, tc := range []struct {
		name  string
		pools []string
		want  string
	}{
		{"GPU past the last", []string{"device:2=8MiB"}, "device:2"},
		{"more than is free", []string{"device:1=65MiB"}, "free"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "n1")
			cfg.Pools = tc.pools
			cfg.CUDALibrary = lib
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := fabric.Start(ctx, cfg)
			if err == nil {
				a.Close()
				t.Fatalf("%v started", tc.pools)
			}
			var se *fabric.SettingError
			if !errors.As(err, &se) || se.Key != "pools" || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v (%T), want a SettingError about pools naming %q", err, err, tc.want)
			}
		})
	}
	// The second GPU alone, at the whole of its memory, is fine.
	cfg := testConfig(t, "n1")
	cfg.Pools = []string{"device:1=64MiB"}
	cfg.CUDALibrary = lib
	a := startAgent(t, cfg)
	c, err := client.Dial(context.Background(), a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := c.Status(context.Background())
	if err != nil || len(s.Pools) != 1 || s.Pools[0].Device != 1 || s.Pools[0].SizeBytes != 64<<20 {
		t.Fatalf("pools %v %v", s.GetPools(), err)
	}
}

// The device pool's RDMA registration: by dma-buf where the driver exports
// one; else by device pointer where a peer-memory module is loaded (which
// softverbs, like a NIC without one, cannot pin: the registration fails
// and says so); else none, logged, and with rdma=on refused at start.
// Either way the blocks still move, over QUIC through staging.
func TestDevicePoolRDMARegistrationFallbacks(t *testing.T) {
	for _, tc := range []struct {
		name    string
		module  bool
		rdma    string
		reg     string // status; "!" for a refused start
		logWant string
	}{
		{"no dma-buf, no peer memory", false, "auto", "", "no peer-memory module"},
		{"no dma-buf, peer memory", true, "auto", "", "device pointer"},
		{"no dma-buf, rdma on", false, "on", "!", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cudaLib, verbs := gpuLibs(t)
			t.Setenv("SOFTCUDA_DEVICES", "")
			t.Setenv("SOFTCUDA_MEMORY", "64M")
			t.Setenv("SOFTCUDA_DMABUF", "0")
			var paths []string
			if tc.module {
				p := filepath.Join(t.TempDir(), "version")
				os.WriteFile(p, []byte("1.0\n"), 0o644)
				paths = []string{p}
			}
			defer fabric.SetPeerMemoryPaths(paths)()
			var logs bytes.Buffer
			var mu sync.Mutex
			cfg := testConfig(t, "n1")
			cfg.Pools = []string{"device=8MiB"}
			cfg.CUDALibrary = cudaLib
			cfg.RDMA, cfg.RDMALibrary = tc.rdma, verbs
			cfg.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := fabric.Start(ctx, cfg)
			if tc.reg == "!" {
				if err == nil {
					a.Close()
					t.Fatal("started with rdma=on and no way to register the device pool")
				}
				if !strings.Contains(err.Error(), "dma-buf") || !strings.Contains(err.Error(), "rdma: on, and") {
					t.Fatalf("err = %v, want rdma on and the dma-buf failure named", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			c := newClient(t, a)
			s, err := c.Status(ctx)
			if err != nil || len(s.Pools) != 1 || s.Pools[0].Kind != "device" || s.Pools[0].RdmaRegistration != tc.reg {
				t.Fatalf("pools %v %v, want a device pool registered %q", s.GetPools(), err, tc.reg)
			}
			mu.Lock()
			text := logs.String()
			mu.Unlock()
			if !strings.Contains(text, "RDMA registration of the device pool failed") || !strings.Contains(text, tc.logWant) {
				t.Fatalf("log does not say the registration failed with %q:\n%s", tc.logWant, text)
			}
		})
	}
}

// A pinned pool is host memory registered with the CUDA driver where it
// loads (cuMemHostRegister), still shared with engines by descriptor.
func TestPinnedPoolThroughCUDA(t *testing.T) {
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg := testConfig(t, "n1")
	cfg.Pools = []string{"pinned=8MiB"}
	cfg.CUDALibrary = lib
	cfg.Logger = slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &mu}, nil))
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newClient(t, a)
	s, err := c.Status(ctx)
	if err != nil || len(s.Pools) != 1 || s.Pools[0].Kind != "pinned" || s.Pools[0].SizeBytes != 8<<20 {
		t.Fatalf("pools %v %v, want pinned 8 MiB", s.GetPools(), err)
	}
	set, err := c.Register(ctx, client.Engine{Name: "e", Model: smallModel, TPSize: 2, PageSize: 4, Order: layout.HND, Slots: 8})
	if err != nil || len(set.Ranks) != 2 || set.Layout.Regions[0].Kind != layout.Pinned {
		t.Fatalf("register on the pinned pool: %+v %v", set, err)
	}
	// The engine's mapping is the pool's memory: a second engine that maps
	// the same block set sees the bytes the first wrote.
	kvtest.Fill(set.Layout, set.Ranks, 0, 7)
	c2 := newClient(t, a)
	set2, err := c2.Register(ctx, client.Engine{Name: "e2", Model: smallModel, TPSize: 2, PageSize: 4, Order: layout.HND, Slots: 8})
	if err != nil || set2.ID != set.ID {
		t.Fatalf("second engine of the layout: %+v %v, want block set %d", set2, err, set.ID)
	}
	if err := kvtest.Check(set2.Layout, set2.Ranks, 0, 7); err != nil {
		t.Fatalf("a second mapping of the pinned pool: %v", err)
	}
	mu.Lock()
	text := logs.String()
	mu.Unlock()
	if !strings.Contains(text, "host pool pinned through the CUDA driver") {
		t.Fatalf("log does not say the pool was pinned by the driver:\n%s", text)
	}
}

// fakeTopology writes a sysfs tree with GPU 0000:02:00.0 and NIC sv1
// (0000:03:00.0) behind switch 0000:01:00.0, and GPU 0000:82:00.0 and NIC
// sv0 (0000:81:00.0) behind switch 0000:80:01.0, under another root
// complex; it returns its root.
func fakeTopology(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	paths := map[string]string{
		"0000:02:00.0": "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0",
		"0000:03:00.0": "devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0",
		"0000:81:00.0": "devices/pci0000:80/0000:80:01.0/0000:81:00.0",
		"0000:82:00.0": "devices/pci0000:80/0000:80:01.0/0000:82:00.0",
	}
	for addr, p := range paths {
		if err := os.MkdirAll(filepath.Join(root, p), 0o755); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(root, "bus/pci/devices", addr)
		os.MkdirAll(filepath.Dir(link), 0o755)
		if err := os.Symlink(filepath.Join(root, p), link); err != nil {
			t.Fatal(err)
		}
	}
	for dev, addr := range map[string]string{"sv0": "0000:81:00.0", "sv1": "0000:03:00.0"} {
		link := filepath.Join(root, "class/infiniband", dev, "device")
		os.MkdirAll(filepath.Dir(link), 0o755)
		if err := os.Symlink(filepath.Join(root, paths[addr]), link); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// An agent with a GPU pool uses the RDMA device nearest the GPU in PCI
// topology (behind the same PCIe switch), not the first one listed.
func TestDevicePoolPicksTheNearestNIC(t *testing.T) {
	cudaLib, verbs := gpuLibs(t)
	root := fakeTopology(t)
	for _, k := range []string{"SOFTCUDA_DEVICES", "SOFTCUDA_DMABUF", "SOFTCUDA_FAIL", "SOFTCUDA_COPY_DELAY_US"} {
		t.Setenv(k, "")
	}
	// Copies take time, as on a GPU: a missing synchronisation shows.
	t.Setenv("SOFTCUDA_COPY_DELAY_US", "200")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	t.Setenv("SOFTCUDA_PCI_BUS_IDS", "0000:02:00.0")
	t.Setenv("SOFTVERBS_DEVICES", "sv0,sv1")
	agents := clusterWith(t, 1, func(i int, c *fabric.Config) {
		c.Pools = []string{"device=16MiB"}
		c.CUDALibrary = cudaLib
		c.RDMA, c.RDMALibrary = "on", verbs
		fabric.SetSysfsRoot(c, root)
	})
	if got := fabric.RDMADeviceName(agents[0]); got != "sv1" {
		t.Fatalf("the GPU pool's agent uses RDMA device %q, want sv1, behind the GPU's switch", got)
	}
}

// A staged import into a device pool whose stream cannot be synchronised
// keeps the chunk's slots out of use: copies into them may still land, so
// none may be given to another block. The rest of the set stays usable;
// dropped by its engine, the set is kept past its grace period (freed, its
// memory would go to no other set), and the next engine of its layout,
// asking for the set's slot count, is not given it: it has fewer usable
// slots than that.
func TestDevicePoolImportUnsyncedKeepsItsSlots(t *testing.T) {
	// The process's first stream synchronisation fails: the holder's pool
	// is host memory, so it is the importer's staged upload.
	t.Setenv("SOFTCUDA_FAIL", "cuStreamSynchronize=1@1")
	agents, _ := devicePair(t, 1, func(i int, c *fabric.Config) {
		c.RDMA = "off"
		c.BlockSetGrace, c.NoOrphanCache = 100*time.Millisecond, true
	})
	hashes := produce(t, agents[0], 2, layout.NHD, gpuBlocks)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, set := consumerOf(t, agents[1], 4, hashes)
	const slots = 16
	resp, err := c.Import(ctx, set.ID, hashes)
	if err == nil && len(resp.Blocks) == len(hashes) {
		t.Fatalf("an import whose upload was not synchronised brought every block: %v", resp.Blocks)
	}
	kept := uint64(agents[1].Metrics().Pool.Retired)
	if kept == 0 || kept > uint64(len(hashes)) {
		t.Fatalf("%d slots kept out of use after an unsynchronised upload of %d blocks: want 1 to %d (%v, %v)", kept, len(hashes), len(hashes), err, resp)
	}
	got := uint64(len(resp.GetBlocks()))
	// The lease caps count the slots a block may be in, not those retired.
	if perPeer, total := fabric.LeaseCaps(agents[1]); perPeer != int(slots-kept)/2 || total != int(slots-kept)*3/4 {
		t.Fatalf("lease caps with %d of %d slots retired: %d per peer, %d in all; want %d and %d", kept, slots, perPeer, total, (slots-kept)/2, (slots-kept)*3/4)
	}
	if _, err := c.Allocate(ctx, set.ID, int(slots-got-kept+1)); err == nil {
		t.Fatalf("allocated %d slots with %d imported and %d kept of %d: a slot a copy may land in among them", slots-got-kept+1, got, kept, slots)
	}
	if s, err := c.Allocate(ctx, set.ID, int(slots-got-kept)); err != nil || uint64(len(s)) != slots-got-kept {
		t.Fatalf("every slot but those imported and kept: %v, %v", s, err)
	}
	if _, err := c.DropBlockSet(ctx, set.ID); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the dropped set's grace period over", func() error {
		if !fabric.IdleSetKept(agents[1], set.ID) {
			return fmt.Errorf("set %d not idle and kept", set.ID)
		}
		return nil
	})
	// Kept, not freed: the retired slots' memory is withheld, no more.
	perSlot := set.Layout.Strides().Region / slots * uint64(set.Layout.TPSize)
	if m := agents[1].Metrics().Pool; m.WithheldBytes != kept*perSlot || uint64(m.Retired) != kept {
		t.Fatalf("after the grace period: %d bytes withheld, %d slots retired; want %d and %d", m.WithheldBytes, m.Retired, kept*perSlot, kept)
	}
	// The kept set has fewer usable slots than the next engine of its
	// layout asks for: that engine is given a set of its own, every slot
	// of it usable.
	c2 := newClient(t, agents[1])
	again := register(t, c2, client.Engine{Name: "consumer", Model: testModel, TPSize: 4, PageSize: 16, Order: layout.HND, Slots: slots})
	if again.ID == set.ID {
		t.Fatalf("the next engine asking for %d slots was given the kept set %d, with %d of them retired", slots, set.ID, kept)
	}
	if s, err := c2.Allocate(ctx, again.ID, slots); err != nil || len(s) != slots {
		t.Fatalf("all %d slots of the next engine's set %d: %v, %v", slots, again.ID, s, err)
	}
}

// A local copy between two device sets (an Import of blocks another set of
// the node holds, in another layout) whose stream cannot be synchronised
// may still land: the destination slots are retired, never handed out
// again, so that no later block of the set is overwritten by it.
func TestLocalDeviceCopyUnsyncedRetiresItsSlots(t *testing.T) {
	lib, _ := gpuLibs(t)
	t.Setenv("SOFTCUDA_DEVICES", "")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	t.Setenv("SOFTCUDA_FAIL", "cuStreamSynchronize=1@1")
	cfg := testConfig(t, "gpu-local")
	cfg.RDMA = "off"
	cfg.Pools = []string{"device:0=16MiB"}
	cfg.CUDALibrary = lib
	a := startAgent(t, cfg)
	c := newClient(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := register(t, c, tierEngine) // HND
	const n, slots = 8, 16
	hashes := storeThroughSlots(t, c, src, nil, n)
	dst := register(t, c, client.Engine{Name: "other", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.NHD, Slots: slots})
	resp, err := c.Import(ctx, dst.ID, hashes)
	if err == nil && len(resp.Blocks) == n {
		t.Fatalf("an import whose local copy was not synchronised brought every block: %v", resp.Blocks)
	}
	if r := a.Metrics().Pool.Retired; r != n {
		t.Fatalf("%d slots retired after a local copy of %d blocks not synchronised (%v, %v); want %d", r, n, resp, err, n)
	}
	if _, err := c.Allocate(ctx, dst.ID, slots-n+1); err == nil {
		t.Fatalf("allocated %d slots with %d retired of %d: a slot the copy may land in among them", slots-n+1, n, slots)
	}
	if s, err := c.Allocate(ctx, dst.ID, slots-n); err != nil || len(s) != slots-n {
		t.Fatalf("every slot but those retired: %v, %v", s, err)
	}
}
