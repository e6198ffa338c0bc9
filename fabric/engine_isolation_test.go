package fabric_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// isolationHelperEnv makes the test binary the engine of the isolation
// tests (runIsolationHelper): the engine that keeps its mapping after its
// agent-side claim on the memory is gone, and writes through it.
const (
	isolationHelperEnv     = "KVFABRIC_TEST_ISOLATION_SOCKET"
	isolationHelperModeEnv = "KVFABRIC_TEST_ISOLATION_MODE" // "fd" or "file"
	// isolationHelperMapEnv makes the helper a process that only maps
	// memory it was told of ("token:T" over the descriptor socket, or
	// "file:PATH") and writes 0x55 over it (mapAndWrite).
	isolationHelperMapEnv = "KVFABRIC_TEST_ISOLATION_MAP"
)

// mapAndWrite maps the memory what names, never having registered
// anything, and writes 0x55 over all of it, printing "wrote"; or prints
// "refused" and the error.
func mapAndWrite(sock, what string) error {
	kind, arg, _ := strings.Cut(what, ":")
	var b []byte
	var err error
	if kind == "file" {
		b, err = client.MapFile(arg)
	} else {
		b, err = client.MapDescriptor(sock+fabric.FDSocketSuffix, arg)
	}
	if err != nil {
		fmt.Println("refused", err)
		io.Copy(io.Discard, os.Stdin) // alive until told to go
		return nil
	}
	for i := range b {
		b[i] = 0x55
	}
	syscall.Munmap(b)
	fmt.Println("wrote")
	io.Copy(io.Discard, os.Stdin) // alive until told to go
	return nil
}

// mapAs runs a process that maps the memory what names (mapAndWrite) and
// returns what it printed.
func mapAs(t *testing.T, a *fabric.Agent, what string) string {
	t.Helper()
	line, stop := startMapper(t, a, what)
	stop()
	return line
}

// startMapper starts a process that maps the memory what names
// (mapAndWrite) and returns the line it printed; it runs until stop.
func startMapper(t *testing.T, a *fabric.Agent, what string) (line string, stop func()) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), isolationHelperEnv+"="+a.EngineSocket(), isolationHelperMapEnv+"="+what)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() { in.Close(); cmd.Wait() }
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		stop()
		t.Fatalf("mapping process %s: no answer", what)
	}
	return strings.TrimSpace(sc.Text()), stop
}

// isolationEngine is the layout both engines of the isolation tests ask
// for, so that the agent could give one's memory to the other.
var isolationEngine = client.Engine{Name: "tenant", Model: smallModel, TPSize: 2, PageSize: 4, Order: layout.HND, Slots: 8}

// runIsolationHelper registers isolationEngine, maps the memory itself
// (a mapping of its own that outlives the client), fills every slot with
// 0x77 bytes and registers one block, then obeys lines on stdin:
//
//	drop   DropBlockSet: the session keeps running, the set is not its
//	close  end the session (the client closes, the own mapping stays)
//	write  write 0x77 over every byte it mapped
//	size   print the bytes it mapped
//	store  fill slots 1 to 3 with content ids 0xb1 to 0xb3 (kvtest.Fill)
//	       and register them as one sequence under those hashes
//	token  print "token " and the set's join token
//
// answering each with "ok" (or "error ..."); it exits at end of input.
func runIsolationHelper(sock string) error {
	if what := os.Getenv(isolationHelperMapEnv); what != "" {
		return mapAndWrite(sock, what)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, sock)
	if err != nil {
		return err
	}
	set, err := c.Register(ctx, isolationEngine)
	if err != nil {
		return err
	}
	var maps [][]byte
	seen := map[string]bool{}
	for _, m := range set.Memory {
		key := m.GetToken() + m.GetFile()
		if seen[key] {
			continue
		}
		seen[key] = true
		var b []byte
		if os.Getenv(isolationHelperModeEnv) == "file" {
			b, err = client.MapFile(m.GetFile())
		} else {
			b, err = client.MapDescriptor(m.GetFdSocket(), m.GetToken())
		}
		if err != nil {
			return err
		}
		maps = append(maps, b)
	}
	slots, err := c.Allocate(ctx, set.ID, isolationEngine.Slots)
	if err != nil {
		return err
	}
	for _, r := range set.Ranks {
		for i := range r {
			r[i] = 0x77
		}
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots[:1], []uint64{0xa1}); err != nil {
		return err
	}
	fmt.Printf("ready %d\n", set.ID)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "drop":
			_, err = c.DropBlockSet(ctx, set.ID)
		case "close":
			err = c.Close()
		case "write":
			for _, b := range maps {
				for i := range b {
					b[i] = 0x77
				}
			}
		case "store":
			hashes := []uint64{0xb1, 0xb2, 0xb3}
			for i, h := range hashes {
				kvtest.Fill(set.Layout, set.Ranks, int(slots[1+i]), h)
			}
			_, err = c.RegisterBlocks(ctx, set.ID, slots[1:4], hashes)
		case "token":
			fmt.Print("token " + set.JoinToken + " ")
		case "names":
			fmt.Printf("names %s %s ", set.Memory[0].GetToken(), set.Memory[0].GetFile())
		case "size":
			n, want := 0, uint64(0)
			for _, b := range maps {
				n += len(b)
			}
			for _, m := range set.Memory {
				want += m.GetSize()
			}
			fmt.Printf("size %d %d\n", n, want)
		}
		if err != nil {
			fmt.Printf("error %v\n", err)
		} else {
			fmt.Println("ok")
		}
	}
	for _, b := range maps {
		syscall.Munmap(b)
	}
	return nil
}

// isolationTenant is a running engine helper.
type isolationTenant struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
	set uint64
}

func startTenant(t *testing.T, a *fabric.Agent, mode string) *isolationTenant {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), isolationHelperEnv+"="+a.EngineSocket(), isolationHelperModeEnv+"="+mode)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tn := &isolationTenant{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Process.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line := tn.line()
	id, ok := strings.CutPrefix(line, "ready ")
	if !ok {
		t.Fatalf("engine helper: %q, want ready", line)
	}
	tn.set, _ = strconv.ParseUint(id, 10, 64)
	return tn
}

// line reads the helper's next answer, within a deadline.
func (tn *isolationTenant) line() string {
	tn.t.Helper()
	got := make(chan string, 1)
	go func() {
		if tn.out.Scan() {
			got <- tn.out.Text()
		} else {
			got <- "exited"
		}
	}()
	select {
	case l := <-got:
		return l
	case <-time.After(30 * time.Second):
		tn.t.Fatal("engine helper: no answer within 30s")
		return ""
	}
}

func (tn *isolationTenant) do(cmd string) string {
	tn.t.Helper()
	if _, err := fmt.Fprintln(tn.in, cmd); err != nil {
		tn.t.Fatal(err)
	}
	l := tn.line()
	if strings.HasPrefix(l, "error") || l == "exited" {
		tn.t.Fatalf("engine helper, %s: %s", cmd, l)
	}
	return l
}

// exit ends the helper (its stdin closed) and fails unless it exits
// cleanly within 30s.
func (tn *isolationTenant) exit(t *testing.T) {
	t.Helper()
	tn.in.Close()
	done := make(chan error, 1)
	go func() { done <- tn.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("engine helper: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("engine helper did not exit")
	}
}

// waitSetIdle waits until block set id on c's agent, whose engine has
// exited, is listed idle: no session uses it and every slot but the
// registered blocks' is free. The agent learns of the exit when the
// engine's session ends: until then the session still holds the slots it
// allocated.
func waitSetIdle(t *testing.T, ctx context.Context, c *client.Client, id uint64) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("the exited engine's set %d idle, its slots given back", id), func() error {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		for _, b := range st.BlockSets {
			if b.Id == id {
				if b.Sessions != 0 || b.Free != b.Slots-b.Registered {
					return fmt.Errorf("block set still held: %v", b)
				}
				return nil
			}
		}
		return fmt.Errorf("block set %d not listed", id)
	})
}

// checkFresh fails unless every byte of slots in set is zero: nothing
// another engine wrote reaches a fresh slot.
func checkFresh(t *testing.T, set *client.BlockSet, slots []uint32) {
	t.Helper()
	st := set.Layout.Strides()
	for r, rank := range set.Ranks {
		for _, s := range slots {
			b := rank[uint64(s)*st.Block : uint64(s+1)*st.Block]
			for i, v := range b {
				if v != 0 {
					t.Fatalf("rank %d slot %d byte %d is %#x in a fresh slot: another engine's bytes", r, s, i, v)
				}
			}
		}
	}
}

// isolationPools are the pools the isolation tests run on: host memory,
// and host memory pinned through the CUDA driver (softcuda), where each
// set's memory is registered with the driver when the set is made.
func isolationPools(t *testing.T) []struct {
	name      string
	configure func(t *testing.T, c *fabric.Config)
} {
	return []struct {
		name      string
		configure func(t *testing.T, c *fabric.Config)
	}{
		{"host", func(*testing.T, *fabric.Config) {}},
		{"pinned", func(t *testing.T, c *fabric.Config) {
			lib, _ := gpuLibs(t)
			t.Setenv("SOFTCUDA_DEVICES", "")
			c.Pools = []string{"pinned=16MiB"}
			c.CUDALibrary = lib
		}},
	}
}

// checkPinned fails unless a's pool is pinned through the CUDA driver set
// by set: every live set's memory registered, want bytes in all (nothing
// to check on a host pool).
func checkPinned(t *testing.T, a *fabric.Agent, pool string, want uint64) {
	t.Helper()
	if pool != "pinned" {
		return
	}
	if !fabric.SetsPinned(a) {
		t.Fatalf("a live block set's memory is not registered with the CUDA driver")
	}
	if got := fabric.PinnedBytes(a); got != want {
		t.Fatalf("%d bytes of the pool registered with the CUDA driver, want %d: the live block sets' memory", got, want)
	}
}

// memoryBytes is the memory an engine is given for set, each rank's once.
func memoryBytes(set *client.BlockSet) uint64 {
	var n uint64
	seen := map[string]bool{}
	for _, m := range set.Memory {
		if key := m.GetToken() + m.GetFile(); !seen[key] {
			seen[key] = true
			n += m.GetSize()
		}
	}
	return n
}

// An engine (a process of its own) that drops its block set, or whose
// session ends, while it keeps its mapping, can neither show its bytes to
// the engine the memory goes to next nor change that engine's blocks.
func TestEngineKeepsMappingAfterItsSetIsGone(t *testing.T) {
	for _, pool := range isolationPools(t) {
		t.Run(pool.name, func(t *testing.T) { testEngineKeepsMappingAfterItsSetIsGone(t, pool.name, pool.configure) })
	}
}

func testEngineKeepsMappingAfterItsSetIsGone(t *testing.T, pool string, configure func(*testing.T, *fabric.Config)) {
	for _, tc := range []struct {
		name, mode, end string
		// freed: wait for the agent to free the tenant's set before the
		// second engine registers.
		freed bool
	}{
		{"dropped set freed, fd", "fd", "drop", true},
		{"dropped set freed, named file", "file", "drop", true},
		{"ended session, set still cached", "fd", "close", false},
		{"ended session, set freed", "fd", "close", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, "n1")
			configure(t, &cfg)
			cfg.BlockSetGrace = 200 * time.Millisecond
			// The tenant's set holds a block: freed at the grace period
			// only without the orphan cache.
			cfg.NoOrphanCache = tc.freed
			if !tc.freed {
				cfg.BlockSetGrace = time.Minute
			}
			if tc.mode == "file" {
				cfg.MemoryDir = filepath.Join(cfg.DataDir, "shm")
			}
			a := startAgent(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tenant := startTenant(t, a, tc.mode)
			tenant.do(tc.end)
			c, err := client.Dial(ctx, a.EngineSocket())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if tc.freed {
				wait.For(t, 20*time.Second, "the tenant's set to be freed", func() error {
					st, err := c.Status(ctx)
					if err != nil {
						return err
					}
					if len(st.BlockSets) != 0 {
						return fmt.Errorf("block sets %v", st.BlockSets)
					}
					return nil
				})
			}
			set, err := c.Register(ctx, isolationEngine)
			if err != nil {
				t.Fatal(err)
			}
			if tc.freed {
				checkPinned(t, a, pool, memoryBytes(set))
			} else {
				checkPinned(t, a, pool, 2*memoryBytes(set)) // the tenant's and this one
			}
			slots, err := c.Allocate(ctx, set.ID, isolationEngine.Slots-1)
			if err != nil {
				t.Fatal(err)
			}
			checkFresh(t, set, slots)
			const hash = 0xb1
			kvtest.Fill(set.Layout, set.Ranks, int(slots[0]), hash)
			if _, err := c.RegisterBlocks(ctx, set.ID, slots[:1], []uint64{hash}); err != nil {
				t.Fatal(err)
			}
			tenant.do("write")
			if err := kvtest.Check(set.Layout, set.Ranks, int(slots[0]), hash); err != nil {
				t.Fatalf("the other engine wrote into this engine's registered block: %v", err)
			}
			checkFresh(t, set, slots[1:])
		})
	}
}

// An engine maps only its own block sets: what it receives for its set is
// that set's memory, not the pool, and writing all of it changes no block
// of another engine's set.
func TestEngineMapsOnlyItsOwnSets(t *testing.T) {
	for _, pool := range isolationPools(t) {
		t.Run(pool.name, func(t *testing.T) { testEngineMapsOnlyItsOwnSets(t, pool.configure) })
	}
}

func testEngineMapsOnlyItsOwnSets(t *testing.T, configure func(*testing.T, *fabric.Config)) {
	for _, mode := range []string{"fd", "file"} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig(t, "n1")
			configure(t, &cfg)
			if mode == "file" {
				cfg.MemoryDir = filepath.Join(cfg.DataDir, "shm")
			}
			a := startAgent(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := client.Dial(ctx, a.EngineSocket())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// Another layout, registered first, so that it sits below the
			// tenant's in the pool.
			mine := isolationEngine
			mine.Name, mine.TPSize = "neighbour", 1
			set, err := c.Register(ctx, mine)
			if err != nil {
				t.Fatal(err)
			}
			slots, err := c.Allocate(ctx, set.ID, 1)
			if err != nil {
				t.Fatal(err)
			}
			kvtest.Fill(set.Layout, set.Ranks, int(slots[0]), 0xc1)
			if _, err := c.RegisterBlocks(ctx, set.ID, slots, []uint64{0xc1}); err != nil {
				t.Fatal(err)
			}
			tenant := startTenant(t, a, mode)
			if tenant.set == set.ID {
				t.Fatalf("the tenant was given the neighbour's set %d", set.ID)
			}
			var got, want uint64
			if _, err := fmt.Sscanf(tenant.do("size"), "size %d %d", &got, &want); err != nil {
				t.Fatal(err)
			}
			tenant.line() // ok
			page := uint64(os.Getpagesize())
			if want == 0 || got < want || got > want+2*page*uint64(isolationEngine.TPSize) {
				t.Fatalf("the tenant mapped %d bytes for a set of %d: it must map its own set only", got, want)
			}
			tenant.do("write")
			if err := kvtest.Check(set.Layout, set.Ranks, int(slots[0]), 0xc1); err != nil {
				t.Fatalf("the tenant wrote into the neighbour's block: %v", err)
			}
			if mode == "file" {
				// The files are opened by the names engines are told: the
				// directory is not listable, and the pool's own file is the
				// agent's alone.
				if fi, err := os.Stat(cfg.MemoryDir); err != nil || fi.Mode().Perm() != 0o711 {
					t.Fatalf("memory dir: %v %v, want mode 0711", fi, err)
				}
				entries, _ := os.ReadDir(cfg.MemoryDir)
				pools := 0
				for _, e := range entries {
					if strings.HasPrefix(e.Name(), "kvfabric-set") {
						continue // a set's rank
					}
					pools++
					if fi, err := e.Info(); err != nil || fi.Mode().Perm() != 0o600 {
						t.Fatalf("the pool's file %s: %v %v, want mode 0600", e.Name(), fi, err)
					}
				}
				if pools != 1 {
					t.Fatalf("memory dir holds %d files besides the sets', want the pool's", pools)
				}
			}
		})
	}
}

// A set whose engine has exited is taken up by the next engine of its
// layout with its cached blocks, and the slots it allocates there come
// zeroed, not with the bytes the exited engine left.
func TestSetOfExitedEngineTakenOverZeroed(t *testing.T) {
	for _, pool := range isolationPools(t) {
		t.Run(pool.name, func(t *testing.T) { testSetOfExitedEngineTakenOverZeroed(t, pool.name, pool.configure) })
	}
}

func testSetOfExitedEngineTakenOverZeroed(t *testing.T, pool string, configure func(*testing.T, *fabric.Config)) {
	cfg := testConfig(t, "n1")
	configure(t, &cfg)
	cfg.BlockSetGrace = time.Minute
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenant := startTenant(t, a, "fd")
	tenant.exit(t)
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitSetIdle(t, ctx, c, tenant.set)
	set, err := c.Register(ctx, isolationEngine)
	if err != nil {
		t.Fatal(err)
	}
	if set.ID != tenant.set {
		t.Fatalf("set %d made, want the exited engine's set %d taken up", set.ID, tenant.set)
	}
	checkPinned(t, a, pool, memoryBytes(set))
	if got, err := c.Acquire(ctx, set.ID, []uint64{0xa1}); err != nil || len(got) != 1 {
		t.Fatalf("the cached block of the exited engine: %v %v", got, err)
	}
	slots, err := c.Allocate(ctx, set.ID, isolationEngine.Slots-1)
	if err != nil {
		t.Fatal(err)
	}
	checkFresh(t, set, slots)
}

// A process that names another running process's block set by its id in
// an engine call is refused, PERMISSION_DENIED naming the set, and changes
// nothing there: it would get no memory, but the slots it allocated would
// hold the other engine's bytes, and it could register them under any hash
// (0x77 bytes served as block 0xdead), take the set's free slots, or hold
// its blocks. Once that process has exited, the set is anyone's to take up.
func TestCallsOnAnotherProcesssSetRefused(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace = time.Minute
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenant := startTenant(t, a, "fd")
	// Its session ends (its 0x77 slots free again, block 0xa1 cached), the
	// process runs on.
	tenant.do("close")
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	setState := func() *fabricpb.BlockSet {
		t.Helper()
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range st.BlockSets {
			if b.Id == tenant.set {
				return b
			}
		}
		t.Fatalf("the tenant's block set %d is gone", tenant.set)
		return nil
	}
	wait.For(t, 30*time.Second, "the tenant's session to end", func() error {
		if b := setState(); b.Sessions != 0 || b.Free != b.Slots-1 || b.Registered != 1 {
			return fmt.Errorf("block set %v", b)
		}
		return nil
	})
	before := setState()
	// In this order, so that without the refusal RegisterBlocks registers
	// the slot Allocate took, 0x77 bytes, as block 0xdead.
	slot := uint32(1)
	calls := []struct {
		name string
		call func() error
	}{
		{"Allocate", func() error {
			got, err := c.Allocate(ctx, tenant.set, 1)
			if err == nil {
				slot = got[0]
			}
			return err
		}},
		{"RegisterBlocks", func() error {
			_, err := c.RegisterBlocks(ctx, tenant.set, []uint32{slot}, []uint64{0xdead})
			return err
		}},
		{"Free", func() error { return c.Free(ctx, tenant.set, []uint32{slot}) }},
		{"Acquire", func() error { _, err := c.Acquire(ctx, tenant.set, []uint64{0xa1}); return err }},
		{"Release", func() error { return c.Release(ctx, tenant.set, []uint32{0}) }},
		{"Import", func() error { _, err := c.Import(ctx, tenant.set, []uint64{0xa1}); return err }},
		{"Prefetch", func() error { _, err := c.Prefetch(ctx, tenant.set, []uint64{0xa1}); return err }},
		{"Lookup", func() error {
			_, err := c.API().Lookup(ctx, &fabricpb.LookupRequest{Hashes: []uint64{0xa1}, BlockSet: tenant.set})
			return err
		}},
		{"DropBlockSet", func() error { _, err := c.DropBlockSet(ctx, tenant.set); return err }},
	}
	for _, tc := range calls {
		err := tc.call()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), fmt.Sprintf("block set %d", tenant.set)) {
			t.Errorf("%s on another running process's block set: %v, want PermissionDenied naming the set", tc.name, err)
		}
	}
	if after := setState(); after.Free != before.Free || after.Registered != before.Registered || after.Sessions != 0 {
		t.Fatalf("the tenant's block set was %v before the calls, %v after: the refused calls changed it", before, after)
	}
	tenant.exit(t)
	if _, err := c.Allocate(ctx, tenant.set, 1); err != nil {
		t.Fatalf("Allocate in the block set of a process that has exited: %v", err)
	}
}

// A process cannot call under another process's session, whose id Status
// lists: PERMISSION_DENIED naming the session, and the session is not
// renamed by a Register made under it.
func TestCallsUnderAnotherProcesssSessionRefused(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenant := startTenant(t, a, "fd")
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tenantSession := func() *fabricpb.Session {
		t.Helper()
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st.Sessions {
			if int(s.Pid) == tenant.cmd.Process.Pid {
				return s
			}
		}
		t.Fatalf("no session of the tenant's process %d in %v", tenant.cmd.Process.Pid, st.Sessions)
		return nil
	}
	before := tenantSession()
	// A connection of this process that names the tenant's session only.
	conn, err := grpc.NewClient("unix:"+a.EngineSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := fabricpb.NewEngineClient(conn)
	theirs := metadata.AppendToOutgoingContext(ctx, fabricpb.SessionMetadata, strconv.FormatUint(before.Id, 10))
	calls := []struct {
		name string
		call func() error
	}{
		{"Lookup", func() error {
			_, err := api.Lookup(theirs, &fabricpb.LookupRequest{Hashes: []uint64{0xa1}})
			return err
		}},
		{"Register", func() error {
			_, err := api.Register(theirs, &fabricpb.RegisterRequest{Engine: "intruder", Model: smallModel.Proto(), TpSize: 1, PageSize: 4,
				KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 8})
			return err
		}},
		{"Status", func() error { _, err := api.Status(theirs, &fabricpb.StatusRequest{}); return err }},
	}
	for _, tc := range calls {
		err := tc.call()
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), fmt.Sprintf("session %d", before.Id)) {
			t.Errorf("%s under another process's session: %v, want PermissionDenied naming the session", tc.name, err)
		}
	}
	if after := tenantSession(); after.Engine != before.Engine || !slices.Equal(after.BlockSets, before.BlockSets) {
		t.Fatalf("the tenant's session was %v before the calls, %v after", before, after)
	}
}

// A process that takes up by its calls a block set whose receivers have
// all exited is recorded as a receiver, as a Register's process is: while
// it runs, another process's Register of the set's layout is not handed
// the set it uses (a new one is made), and its own calls naming the set
// go on.
func TestCallerOfAnExitedEnginesSetKeepsItFromOthers(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace = time.Minute
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := startTenant(t, a, "fd")
	first.exit(t)
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitSetIdle(t, ctx, c, first.set)
	// This process takes the set up by a call naming it, holding nothing
	// there (the block asked for is not held): the set is the one its
	// session uses, all its slots usable by the next Register.
	if _, err := c.API().Acquire(ctx, &fabricpb.AcquireRequest{BlockSet: first.set, Hashes: []uint64{0xbeef}}); err != nil {
		t.Fatalf("Acquire in the block set of a process that has exited: %v", err)
	}
	second := startTenant(t, a, "fd")
	if second.set == first.set {
		t.Fatalf("another process's Register was handed block set %d, which this process uses", first.set)
	}
	if _, err := c.Allocate(ctx, first.set, 1); err != nil {
		t.Fatalf("Allocate in the block set this process took up: %v", err)
	}
}

// The memory of an exited engine's set passes to the engine that takes the
// set up under new names: a process that learned the old engine's memory
// token, or its memory file's name (its logs, its plans), maps nothing,
// and one that learns the new owner's token cannot map the memory while
// the owner runs (the token alone is no credential). Nothing it does
// reaches the new owner's slots.
func TestSetMemoryPassesOnUnderNewNames(t *testing.T) {
	for _, mode := range []string{"fd", "file"} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig(t, "n1")
			if mode == "file" {
				cfg.MemoryDir = filepath.Join(cfg.DataDir, "shm")
			}
			cfg.BlockSetGrace = time.Minute
			a := startAgent(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tenant := startTenant(t, a, mode)
			f := strings.Fields(tenant.do("names"))
			if len(f) < 2 || f[0] != "names" || (mode == "file") != (len(f) == 4) {
				t.Fatalf("names: %q", f)
			}
			oldToken, oldFile := f[1], ""
			if mode == "file" {
				oldFile = f[2]
			}
			tenant.exit(t)
			c, err := client.Dial(ctx, a.EngineSocket())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			waitSetIdle(t, ctx, c, tenant.set)
			set, err := c.Register(ctx, isolationEngine)
			if err != nil {
				t.Fatal(err)
			}
			if set.ID != tenant.set {
				t.Fatalf("set %d made, want the exited engine's set %d taken up", set.ID, tenant.set)
			}
			if tok := set.Memory[0].GetToken(); tok == oldToken || (mode == "file" && set.Memory[0].GetFile() == oldFile) {
				t.Fatalf("the new owner's memory is named as the exited engine's: token %v, file %q", tok == oldToken, set.Memory[0].GetFile())
			}
			slots, err := c.Allocate(ctx, set.ID, 1)
			if err != nil {
				t.Fatal(err)
			}
			checkFresh(t, set, slots)
			tries := []string{"token:" + oldToken, "token:" + set.Memory[0].GetToken()}
			if mode == "file" {
				tries = append(tries, "file:"+oldFile)
			}
			for _, what := range tries {
				if got := mapAs(t, a, what); !strings.HasPrefix(got, "refused") {
					t.Errorf("a process never handed the set, mapping %s: %q, want refused", what, got)
				}
			}
			checkFresh(t, set, slots)
		})
	}
}

// A process refused the memory of an exited engine's set (its token stale:
// the set's names were renewed as it passed on) is not recorded as a
// process the set was handed to: while it runs, the next engine of the
// layout still takes the set up.
func TestRefusedMemoryCallerKeepsNoOneOff(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace = time.Minute
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenant := startTenant(t, a, "fd")
	f := strings.Fields(tenant.do("names"))
	if len(f) < 2 || f[0] != "names" {
		t.Fatalf("names: %q", f)
	}
	tenant.exit(t)
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitSetIdle(t, ctx, c, tenant.set)
	// A process that stays alive tries the exited engine's token.
	line, stop := startMapper(t, a, "token:"+f[1])
	defer stop()
	if !strings.HasPrefix(line, "refused") {
		t.Fatalf("a process mapping an exited engine's set by its old token: %q, want refused", line)
	}
	set, err := c.Register(ctx, isolationEngine)
	if err != nil {
		t.Fatal(err)
	}
	if set.ID != tenant.set {
		t.Fatalf("set %d made, want the exited engine's set %d taken up: the refused process kept it", set.ID, tenant.set)
	}
}
