//go:build cgo && linux

package fabric_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// The device-session engine helpers: KVFABRIC_TEST_GPU_SESSION names the
// engine socket, KVFABRIC_TEST_GPU_SESSION_MODE what the engine does
// ("hold": take slots and references in the device pool and wait to be
// killed; "whole": carve the whole pool, allocate and write every slot).
const (
	gpuSessionEnv      = "KVFABRIC_TEST_GPU_SESSION"
	gpuSessionModeEnv  = "KVFABRIC_TEST_GPU_SESSION_MODE"
	gpuSessionSlotsEnv = "KVFABRIC_TEST_GPU_SESSION_SLOTS"
)

func init() {
	socket := os.Getenv(gpuSessionEnv)
	if socket == "" {
		return
	}
	var err error
	switch mode := os.Getenv(gpuSessionModeEnv); mode {
	case "hold":
		err = gpuHoldingEngine(socket)
	case "whole":
		err = gpuWholePoolEngine(socket)
	default:
		err = fmt.Errorf("unknown mode %q", mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpu session helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// gpuSessionEngine is the layout both helpers register: 4 KiB per block,
// so that a block set of the whole pool has one slot per page.
var gpuSessionEngine = client.Engine{Name: "gpu-doomed", Model: smallModel, TPSize: 1, PageSize: 4, Order: layout.HND, Slots: 64}

// gpuHoldingEngine opens the device pool by IPC handle, writes four blocks
// through it, registers them and takes them again with Acquire, leaves
// eight more slots allocated and a second block set (TP 2) with three,
// prints "ready SESSION" and waits to be killed.
func gpuHoldingEngine(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	drv, err := cuda.Open(cuda.Config{Path: os.Getenv(gpuHelperLibEnv)})
	if err != nil {
		return err
	}
	c, err := client.Dial(ctx, socket)
	if err != nil {
		return err
	}
	e := gpuSessionEngine
	e.CUDA = drv
	set, err := c.Register(ctx, e)
	if err != nil {
		return err
	}
	if len(set.Device) != 1 {
		return fmt.Errorf("block set with %d device regions, want 1 (host ones: %d)", len(set.Device), len(set.Ranks))
	}
	if _, err := c.Allocate(ctx, set.ID, 8); err != nil {
		return err
	}
	slots, err := c.Allocate(ctx, set.ID, 4)
	if err != nil {
		return err
	}
	st, err := drv.NewStream(set.Device[0].GPU)
	if err != nil {
		return err
	}
	l := set.Layout
	strides := l.Strides()
	host := [][]byte{make([]byte, strides.Region)}
	hashes := []uint64{0xd00d1, 0xd00d2, 0xd00d3, 0xd00d4}
	for i, s := range slots {
		kvtest.Fill(l, host, int(s), hashes[i])
		off := uint64(s) * strides.Block
		if err := st.CopyHtoD(set.Device[0].Ptr+off, host[0][off:off+strides.Shard]); err != nil {
			return err
		}
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
		return err
	}
	if _, err := c.Acquire(ctx, set.ID, hashes); err != nil {
		return err
	}
	e2 := e
	e2.TPSize = 2
	set2, err := c.Register(ctx, e2)
	if err != nil {
		return err
	}
	if _, err := c.Allocate(ctx, set2.ID, 3); err != nil {
		return err
	}
	fmt.Printf("ready %d\n", c.Session())
	select {}
}

// gpuWholePoolEngine registers a block set of KVFABRIC_TEST_GPU_SESSION_SLOTS
// slots (the whole pool), opens it by IPC handle, allocates every slot,
// writes each through the driver and checks every one copied back.
func gpuWholePoolEngine(socket string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := strconv.Atoi(os.Getenv(gpuSessionSlotsEnv))
	if err != nil {
		return err
	}
	drv, err := cuda.Open(cuda.Config{Path: os.Getenv(gpuHelperLibEnv)})
	if err != nil {
		return err
	}
	defer drv.Close()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer c.Close()
	e := gpuSessionEngine
	// The same engine restarted: its idle sets are its own to free (another
	// engine's cached sets within their share would not be).
	e.Order, e.Slots, e.CUDA = layout.NHD, n, drv
	set, err := c.Register(ctx, e)
	if err != nil {
		return fmt.Errorf("a block set of the whole pool (%d slots): %w", n, err)
	}
	if len(set.Device) != 1 || set.Layout.Strides().Block != 4096 {
		return fmt.Errorf("block set: %d device regions, block stride %d; want 1 and 4096", len(set.Device), set.Layout.Strides().Block)
	}
	slots, err := c.Allocate(ctx, set.ID, n)
	if err != nil || len(slots) != n {
		return fmt.Errorf("allocate all %d slots: got %d, %v", n, len(slots), err)
	}
	st, err := drv.NewStream(set.Device[0].GPU)
	if err != nil {
		return err
	}
	defer st.Close()
	l := set.Layout
	host := [][]byte{make([]byte, l.Strides().Region)}
	for _, s := range slots {
		kvtest.Fill(l, host, int(s), uint64(s)+100)
	}
	if err := st.CopyHtoD(set.Device[0].Ptr, host[0]); err != nil {
		return err
	}
	back := [][]byte{make([]byte, len(host[0]))}
	if err := st.CopyDtoH(back[0], set.Device[0].Ptr); err != nil {
		return err
	}
	for _, s := range slots {
		if err := kvtest.Check(l, back, int(s), uint64(s)+100); err != nil {
			return fmt.Errorf("slot %d copied back from the device: %w", s, err)
		}
	}
	fmt.Printf("wrote %d\n", len(slots))
	return nil
}

// An engine process that opened the device pool by IPC handle, holds
// slots, references and two block sets, and is SIGKILLed: within the
// keepalive bound the agent has freed what its session held, and a new
// engine process opens the handle again, carves a block set of the whole
// pool, allocates every slot and writes and reads back each one.
func TestDevicePoolSessionOfKilledEngine(t *testing.T) {
	lib, _ := gpuLibs(t)
	for _, k := range []string{"SOFTCUDA_DEVICES", "SOFTCUDA_FAIL", "SOFTCUDA_COPY_DELAY_US", "SOFTCUDA_PCI_BUS_IDS"} {
		t.Setenv(k, "")
	}
	// Copies take time, as on a GPU: a missing synchronisation shows.
	t.Setenv("SOFTCUDA_COPY_DELAY_US", "200")
	t.Setenv("SOFTCUDA_MEMORY", "64M")
	cfg := testConfig(t, "n1")
	cfg.Pools = []string{"device:0=8MiB"}
	cfg.CUDALibrary = lib
	cfg.SessionKeepalive = 5 * time.Second
	cfg.BlockSetGrace = time.Hour // only the new engine's Register frees the sets
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	helper := func(mode string, extra ...string) *exec.Cmd {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), gpuSessionEnv+"="+a.EngineSocket(), gpuSessionModeEnv+"="+mode, gpuHelperLibEnv+"="+lib)
		cmd.Env = append(cmd.Env, extra...)
		return cmd
	}
	cmd := helper("hold")
	id := startHeldEngine(t, cmd)

	watcher := newClient(t, a)
	st, err := watcher.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Pools) != 1 || st.Pools[0].Kind != "device" || st.Pools[0].SizeBytes != 8<<20 {
		t.Fatalf("pools %v, want a device pool of 8 MiB", st.Pools)
	}
	killHeldEngine(t, ctx, watcher, st, id, cmd, cfg.SessionKeepalive)

	// A new engine process: the whole pool in one set (both idle sets go),
	// opened by the same IPC handle, every slot allocated and written.
	whole := int(st.Pools[0].SizeBytes / fabric.DefaultAlignment)
	next := helper("whole", fmt.Sprintf("%s=%d", gpuSessionSlotsEnv, whole))
	got, err := next.CombinedOutput()
	if err != nil {
		t.Fatalf("the next engine: %v\n%s", err, got)
	}
	if want := fmt.Sprintf("wrote %d\n", whole); !strings.Contains(string(got), want) {
		t.Fatalf("the next engine said %q, want %q", got, want)
	}
	st, err = watcher.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.BlockSets) != 1 || st.BlockSets[0].Slots != uint32(whole) || st.Pools[0].CarvedBytes != st.Pools[0].SizeBytes {
		t.Fatalf("after the whole-pool set: %v, pool %v", st.BlockSets, st.Pools[0])
	}
}
