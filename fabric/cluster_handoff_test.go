package fabric_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// The engine helper: the test binary re-executed (under unshare) with
// these variables set acts as an engine in another PID namespace.
const (
	helperEnv       = "KVFABRIC_TEST_ENGINE_HELPER" // "fd" or "file"
	helperSocketEnv = "KVFABRIC_TEST_ENGINE_SOCKET"
	helperHashEnv   = "KVFABRIC_TEST_ENGINE_HASH"
	helperNSEnv     = "KVFABRIC_TEST_PARENT_PIDNS"
)

// TestMain runs the test binary as one of the tests' engine processes when
// asked to by the environment: the session tests' engine that is killed,
// or the handoff tests' engine in another PID namespace.
func TestMain(m *testing.M) {
	if sock := os.Getenv(engineHelperEnv); sock != "" {
		if err := runEngineHelper(sock); err != nil {
			fmt.Fprintln(os.Stderr, "engine helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if sock := os.Getenv(isolationHelperEnv); sock != "" {
		if err := runIsolationHelper(sock); err != nil {
			fmt.Fprintln(os.Stderr, "engine helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if mode := os.Getenv(helperEnv); mode != "" {
		if err := engineHelper(mode); err != nil {
			fmt.Fprintln(os.Stderr, "engine helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	code := m.Run()
	removeGPULibs()
	os.Exit(code)
}

// handoffEngine is the engine of the handoff tests: one block set, TP 2.
var handoffEngine = client.Engine{Name: "ns-engine", Model: smallModel, TPSize: 2, PageSize: 4, Order: layout.HND, Slots: 8}

// engineHelper registers (a set of its own: the test's process holds the
// first), imports the block the test stored (by its hash), checks every
// element, and writes block hash+1 into a slot of its own, which the test
// imports and checks from the other side. It maps each rank's memory
// through the descriptor socket (mode "fd") or the named file ("file").
func engineHelper(mode string) error {
	if ns, _ := os.Readlink("/proc/self/ns/pid"); ns == os.Getenv(helperNSEnv) {
		return fmt.Errorf("still in the parent's PID namespace %s", ns)
	}
	hash, err := strconv.ParseUint(os.Getenv(helperHashEnv), 10, 64)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, os.Getenv(helperSocketEnv))
	if err != nil {
		return err
	}
	defer c.Close()
	e := handoffEngine
	resp, err := c.API().Register(ctx, &fabricpb.RegisterRequest{Engine: "helper", Model: e.Model.Proto(), TpSize: uint32(e.TPSize),
		PageSize: uint32(e.PageSize), KvOrder: 2, Slots: uint32(e.Slots)})
	if err != nil {
		return err
	}
	m := resp.GetMemory()[0]
	// The older /proc path names the agent's PID namespace, not ours.
	if pid := procPID(m.GetPath()); pid > 1000 {
		if f, err := os.Open(m.GetPath()); err == nil {
			f.Close()
			return fmt.Errorf("%s opened from another PID namespace", m.GetPath())
		}
	}
	l, err := layout.FromProto(resp.GetLayout())
	if err != nil {
		return err
	}
	ranks := make([][]byte, l.TPSize)
	for r, m := range resp.GetMemory() {
		var mem []byte
		switch mode {
		case "fd":
			mem, err = client.MapDescriptor(m.GetFdSocket(), m.GetToken())
		case "file":
			if m.GetFile() == "" {
				return errors.New("the agent names no memory file")
			}
			mem, err = client.MapFile(m.GetFile())
		}
		if err != nil {
			return err
		}
		defer syscall.Munmap(mem)
		ranks[r] = mem[m.GetOffset() : m.GetOffset()+m.GetSize()]
	}
	got, err := c.Import(ctx, resp.GetBlockSet(), []uint64{hash})
	if err != nil || len(got.GetBlocks()) != 1 {
		return fmt.Errorf("import %d: %v %v", hash, got, err)
	}
	if err := kvtest.Check(l, ranks, int(got.GetBlocks()[0].GetSlot()), hash); err != nil {
		return fmt.Errorf("the agent's bytes, seen through %s: %w", mode, err)
	}
	slots, err := c.Allocate(ctx, resp.GetBlockSet(), 1)
	if err != nil {
		return err
	}
	kvtest.Fill(l, ranks, int(slots[0]), hash+1)
	if _, err := c.RegisterBlocks(ctx, resp.GetBlockSet(), slots, []uint64{hash + 1}); err != nil {
		return err
	}
	return nil
}

func procPID(path string) int {
	rest, ok := strings.CutPrefix(path, "/proc/")
	if !ok {
		return 0
	}
	pid, _ := strconv.Atoi(strings.Split(rest, "/")[0])
	return pid
}

// An engine in another PID namespace maps the pool through the descriptor
// socket, and through the named file when the agent has a memory dir: it
// sees the bytes the agent holds and the agent sees the bytes it writes.
func TestEngineInAnotherPIDNamespace(t *testing.T) {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skipf("cannot create a PID namespace: %v", err)
	}
	if out, err := exec.Command(unshare, "-p", "-f", "--mount-proc", "true").CombinedOutput(); err != nil {
		t.Skipf("cannot create a PID namespace here: unshare -p -f --mount-proc: %v: %s", err, out)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"fd", "file"} {
		t.Run(mode, func(t *testing.T) {
			cfg := testConfig(t, "n1")
			if mode == "file" {
				cfg.MemoryDir = filepath.Join(cfg.DataDir, "shm")
			}
			a := startAgent(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c := newClient(t, a)
			set := register(t, c, handoffEngine)
			const hash = 0xfeed
			slots, err := c.Allocate(ctx, set.ID, 1)
			if err != nil {
				t.Fatal(err)
			}
			kvtest.Fill(set.Layout, set.Ranks, int(slots[0]), hash)
			if _, err := c.RegisterBlocks(ctx, set.ID, slots, []uint64{hash}); err != nil {
				t.Fatal(err)
			}
			cmd := exec.CommandContext(ctx, unshare, "-p", "-f", "--mount-proc", self, "-test.run=^$")
			cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperSocketEnv+"="+a.EngineSocket(),
				helperHashEnv+"="+strconv.FormatUint(hash, 10), helperNSEnv+"="+ns)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("engine in another PID namespace: %v\n%s", err, out)
			}
			got, err := c.Import(ctx, set.ID, []uint64{hash, hash + 1})
			if err != nil || len(got.GetBlocks()) != 2 {
				t.Fatalf("import both blocks: %v %v", got, err)
			}
			if err := kvtest.Check(set.Layout, set.Ranks, int(got.GetBlocks()[1].GetSlot()), hash+1); err != nil {
				t.Fatalf("bytes the other namespace wrote: %v", err)
			}
			if mode == "file" {
				file := filepath.Join(cfg.MemoryDir)
				entries, _ := os.ReadDir(file)
				// The pool's, and one per rank of the two sets.
				if len(entries) != 1+2*handoffEngine.TPSize {
					t.Fatalf("memory dir holds %d files, want the pool's and one per rank of two sets", len(entries))
				}
				a.Close()
				if entries, _ := os.ReadDir(file); len(entries) != 0 {
					t.Fatalf("memory file left after shutdown: %v", entries[0].Name())
				}
			}
		})
	}
}

// The descriptor socket answers a wrong token with an error line (and
// keeps the connection), refuses a line past its limit, and hands a
// descriptor for the right token.
func TestDescriptorSocketProtocol(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newClient(t, a)
	resp, err := c.API().Register(ctx, &fabricpb.RegisterRequest{Engine: "e", Model: smallModel.Proto(), TpSize: 1, PageSize: 4, KvOrder: 2, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	m := resp.GetMemory()[0]
	if m.GetFdSocket() != a.EngineSocket()+fabric.FDSocketSuffix || m.GetToken() == "" || m.GetFile() != "" || m.GetFileSize() == 0 {
		t.Fatalf("memory description: %v", m)
	}
	if _, err := client.MapDescriptor(m.GetFdSocket(), "mem-wrong"); err == nil || !strings.Contains(err.Error(), "unknown memory token") {
		t.Fatalf("wrong token: %v", err)
	}
	conn, err := net.Dial("unix", m.GetFdSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	// At the limit: 255 bytes and the newline, a wrong token, answered.
	fmt.Fprintf(conn, "%s\n", strings.Repeat("x", 255))
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "error unknown memory token") {
		t.Fatalf("line at the limit: %q %v", line, err)
	}
	// A wrong token closes the connection: past the limit on a new one,
	// refused, and the connection closed.
	conn, err = net.Dial("unix", m.GetFdSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	r = bufio.NewReader(conn)
	fmt.Fprintf(conn, "%s\n", strings.Repeat("x", 256))
	if line, err := r.ReadString('\n'); err != nil || !strings.Contains(line, "longer than 256") {
		t.Fatalf("line past the limit: %q %v", line, err)
	}
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("connection open after a line past the limit")
	}
	f, off, size, err := client.ReceiveDescriptor(m.GetFdSocket(), m.GetToken())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || off != 0 || size != m.GetFileSize() || uint64(fi.Size()) != size {
		t.Fatalf("descriptor: offset %d size %d, file %v %v, want size %d", off, size, fi, err, m.GetFileSize())
	}
	a.Close()
	if _, err := os.Lstat(m.GetFdSocket()); !os.IsNotExist(err) {
		t.Fatalf("descriptor socket left after Close: %v", err)
	}
}

// One process may hold maxFDConnsPerProcess (8) connections to the
// descriptor socket: at the bound the 8th is served, the 9th is told it is
// busy, naming the process. A wrong token is answered and the connection
// closed; a connection that sends nothing is closed after the first-line
// timeout.
func TestDescriptorSocketConnectionLimit(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, _, ev := rawSession(t, ctx, a.EngineSocket())
	reg, err := api.Register(inSession(ctx, ev.Session), &fabricpb.RegisterRequest{Engine: "e", Model: smallModel.Proto(), TpSize: 1, PageSize: 4,
		KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16})
	if err != nil {
		t.Fatal(err)
	}
	token := reg.Memory[0].GetToken()
	path := a.EngineSocket() + fabric.FDSocketSuffix
	exchange := func(c net.Conn, tok string) (string, error) {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c, "%s\n", tok); err != nil {
			return "", err
		}
		return bufio.NewReader(c).ReadString('\n')
	}
	const perProcess = 8
	var conns []net.Conn
	for range perProcess {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || !strings.HasPrefix(line, "error busy: process") {
		t.Fatalf("connection %d of one process: %q %v, want busy naming the process", perProcess+1, line, err)
	}
	// The one at the bound is served.
	if line, err := exchange(conns[perProcess-1], token); err != nil || !strings.HasPrefix(line, "ok ") {
		t.Fatalf("connection %d of one process: %q %v", perProcess, line, err)
	}
	// A wrong token: answered, then closed.
	r := bufio.NewReader(conns[0])
	conns[0].SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conns[0], "wrong\n")
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "error unknown memory token") {
		t.Fatalf("wrong token: %q %v", line, err)
	}
	if _, err := r.ReadString('\n'); err != io.EOF {
		t.Fatalf("after a wrong token the connection stays open: %v", err)
	}
	// Silent: closed after the first-line timeout (2 s), well within 10.
	conns[1].SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := bufio.NewReader(conns[1]).ReadString('\n'); err != io.EOF {
		t.Fatalf("a silent connection: %v, want closed by the agent", err)
	}
	if d := time.Since(start); d > 9*time.Second {
		t.Fatalf("a silent connection closed after %v", d)
	}
}

// The engine socket's mode and group apply to its descriptor companion
// and to the named memory files of block sets (the pool's own file is the
// agent's alone); modes outside the allowed set and groups that do not
// exist are configuration errors naming the setting.
func TestEngineSocketAccess(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want os.FileMode
		ok   bool
	}{
		{"", 0o600, true},
		{"0600", 0o600, true},
		{"0660", 0o660, true}, // the most the option allows
		{"0640", 0o640, true},
		{"0666", 0, false}, // past it: others get access
		{"0670", 0, false}, // execute bits
		{"0400", 0, false}, // the owner cannot write
		{"rw", 0, false},
	} {
		t.Run("mode="+tc.mode, func(t *testing.T) {
			cfg := testConfig(t, "n1")
			cfg.EngineSocketMode = tc.mode
			cfg.MemoryDir = filepath.Join(cfg.DataDir, "shm")
			if !tc.ok {
				_, err := fabric.Start(context.Background(), cfg)
				if !errors.Is(err, fabric.ErrConfig) || !strings.Contains(err.Error(), "engine_socket_mode") {
					t.Fatalf("mode %q: %v, want a configuration error naming engine_socket_mode", tc.mode, err)
				}
				return
			}
			a := startAgent(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := client.Dial(ctx, a.EngineSocket())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			set, err := c.Register(ctx, handoffEngine)
			if err != nil {
				t.Fatal(err)
			}
			paths := []string{a.EngineSocket(), a.EngineSocket() + fabric.FDSocketSuffix}
			entries, err := os.ReadDir(cfg.MemoryDir)
			if err != nil || len(entries) != 1+len(set.Memory) {
				t.Fatalf("memory dir: %v %v, want the pool's file and one per rank", entries, err)
			}
			for _, m := range set.Memory {
				paths = append(paths, m.GetFile())
			}
			for _, e := range entries {
				if p := filepath.Join(cfg.MemoryDir, e.Name()); !slices.Contains(paths, p) {
					if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
						t.Errorf("the pool's file %s: %v %v, want mode 0600", p, fi, err)
					}
				}
			}
			for _, p := range paths {
				fi, err := os.Stat(p)
				if err != nil || fi.Mode().Perm() != tc.want {
					t.Errorf("%s: mode %v %v, want %v", p, fi.Mode().Perm(), err, tc.want)
				}
			}
		})
	}

	t.Run("group", func(t *testing.T) {
		other := otherGroup(t)
		for _, name := range []string{other.Name, other.Gid} {
			cfg := testConfig(t, "n1")
			cfg.EngineSocketGroup = name
			cfg.EngineSocketMode = "0660"
			a, err := fabric.Start(context.Background(), cfg)
			if err != nil {
				if os.Geteuid() != 0 {
					t.Skipf("cannot give files to group %s as a user that is not in it: %v", name, err)
				}
				t.Fatal(err)
			}
			for _, p := range []string{a.EngineSocket(), a.EngineSocket() + fabric.FDSocketSuffix} {
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if gid := fi.Sys().(*syscall.Stat_t).Gid; strconv.Itoa(int(gid)) != other.Gid {
					t.Errorf("%s: group %d, want %s (%s)", p, gid, other.Gid, name)
				}
			}
			a.Close()
		}
	})
	t.Run("bad group", func(t *testing.T) {
		for _, name := range []string{"kvfabric-no-such-group", "4294967294"} {
			cfg := testConfig(t, "n1")
			cfg.EngineSocketGroup = name
			_, err := fabric.Start(context.Background(), cfg)
			if !errors.Is(err, fabric.ErrConfig) || !strings.Contains(err.Error(), "engine_socket_group") || !strings.Contains(err.Error(), name) {
				t.Fatalf("group %q: %v, want a configuration error naming it", name, err)
			}
		}
	})
}

// otherGroup returns a group that exists and is not the process's.
func otherGroup(t *testing.T) *user.Group {
	t.Helper()
	b, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Skipf("no /etc/group to find a second group in: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Split(line, ":")
		if len(f) < 3 || f[2] == strconv.Itoa(os.Getegid()) {
			continue
		}
		if g, err := user.LookupGroup(f[0]); err == nil {
			return g
		}
	}
	t.Skip("no second group in /etc/group")
	return nil
}

// Alignment is a request field: the default is 4096, a power of two up to
// 2^30 is accepted (at the limit a block set of one slot needs 1 GiB per
// rank, more than the test pool: resource exhausted), and past the limit
// or not a power of two it is an invalid argument naming the field.
func TestRegisterAlignment(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := newClient(t, a)
	req := func(align uint64) *fabricpb.RegisterRequest {
		return &fabricpb.RegisterRequest{Engine: "e", Model: smallModel.Proto(), TpSize: 1, PageSize: 4, KvOrder: 2, Slots: 1, Alignment: align}
	}
	for _, tc := range []struct {
		align uint64
		want  uint64
	}{{0, 4096}, {1, 1}, {64, 64}, {1 << 20, 1 << 20}} {
		resp, err := c.API().Register(ctx, req(tc.align))
		if err != nil {
			t.Fatalf("alignment %d: %v", tc.align, err)
		}
		if resp.GetLayout().GetAlignment() != tc.want || resp.GetRanks()[0].GetBlockStride()%tc.want != 0 {
			t.Fatalf("alignment %d: layout says %d, block stride %d", tc.align, resp.GetLayout().GetAlignment(), resp.GetRanks()[0].GetBlockStride())
		}
	}
	if _, err := c.API().Register(ctx, req(layout.MaxAlignment)); code(err) != codes.ResourceExhausted {
		t.Fatalf("alignment at the limit: %v, want ResourceExhausted on a 16 MiB pool", err)
	}
	for _, bad := range []uint64{layout.MaxAlignment * 2, 3, 4097} {
		_, err := c.API().Register(ctx, req(bad))
		if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "alignment") {
			t.Fatalf("alignment %d: %v, want InvalidArgument naming alignment", bad, err)
		}
	}
}

// A test engine places every element of a block using only the per-rank
// description in RegisterResponse (no layout package), and the layout
// package's reading of the same memory finds every element where it
// belongs: HND, NHD, layer-separate, MLA and TP larger than the KV heads.
func TestRankLayoutPlacesBytes(t *testing.T) {
	mla := layout.ModelConfig{Layers: 3, KVHeads: 1, HeadDim: 16, DType: layout.DTypeF16, MLA: true}
	for _, tc := range []struct {
		name  string
		req   *fabricpb.RegisterRequest
		heads [][]uint32 // per rank
		repl  uint32
	}{
		{"HND tp2", &fabricpb.RegisterRequest{Model: smallModel.Proto(), TpSize: 2, PageSize: 4, KvOrder: 2}, [][]uint32{{0, 1}, {2, 3}}, 1},
		{"NHD tp4", &fabricpb.RegisterRequest{Model: smallModel.Proto(), TpSize: 4, PageSize: 4, KvOrder: 1}, [][]uint32{{0}, {1}, {2}, {3}}, 1},
		{"NHD layer-separate", &fabricpb.RegisterRequest{Model: smallModel.Proto(), TpSize: 1, PageSize: 8, KvOrder: 1, Arrangement: 2, Alignment: 256},
			[][]uint32{{0, 1, 2, 3}}, 1},
		{"MLA tp2", &fabricpb.RegisterRequest{Model: mla.Proto(), TpSize: 2, PageSize: 4, KvOrder: 2}, [][]uint32{{0}, {0}}, 2},
		{"TP 8 over 4 heads", &fabricpb.RegisterRequest{Model: smallModel.Proto(), TpSize: 8, PageSize: 4, KvOrder: 1},
			[][]uint32{{0}, {0}, {1}, {1}, {2}, {2}, {3}, {3}}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := startAgent(t, testConfig(t, "n1"))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := newClient(t, a)
			tc.req.Engine, tc.req.Slots = "e", 4
			resp, err := c.API().Register(ctx, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			// Each rank's memory is mapped through its own token.
			mems := make([][]byte, len(resp.GetMemory()))
			for r, m := range resp.GetMemory() {
				mem, err := client.MapDescriptor(m.GetFdSocket(), m.GetToken())
				if err != nil {
					t.Fatal(err)
				}
				defer syscall.Munmap(mem)
				mems[r] = mem
			}
			model := tc.req.GetModel()
			const slot, id = 2, 77
			for r, rl := range resp.GetRanks() {
				if got := fmt.Sprint(rl.GetHeadIds()); got != fmt.Sprint(tc.heads[r]) || rl.GetReplicas() != tc.repl {
					t.Fatalf("rank %d: heads %s replicas %d, want %v and %d", r, got, rl.GetReplicas(), tc.heads[r], tc.repl)
				}
				if rl.GetOffset() != resp.GetMemory()[r].GetOffset() {
					t.Fatalf("rank %d: offset %d, memory says %d", r, rl.GetOffset(), resp.GetMemory()[r].GetOffset())
				}
				placeFromDescription(mems[r], rl, tc.req.GetKvOrder() == 1, int(model.GetLayers()), slot, id)
			}
			l, err := layout.FromProto(resp.GetLayout())
			if err != nil {
				t.Fatal(err)
			}
			ranks := make([][]byte, l.TPSize)
			for r, m := range resp.GetMemory() {
				ranks[r] = mems[r][m.GetOffset() : m.GetOffset()+m.GetSize()]
			}
			if err := kvtest.Check(l, ranks, slot, id); err != nil {
				t.Fatalf("placed by the description, read by the layout package: %v", err)
			}
		})
	}
}

// placeFromDescription writes logical block id into slot using nothing but
// RankLayout's documented formula.
func placeFromDescription(mem []byte, rl *fabricpb.RankLayout, nhd bool, layers, slot int, id uint64) {
	shape := rl.GetChunkShape()
	var tokens, heads, dim uint64
	if nhd {
		tokens, heads, dim = uint64(shape[0]), uint64(shape[1]), uint64(shape[2])
	} else {
		heads, tokens, dim = uint64(shape[0]), uint64(shape[1]), uint64(shape[2])
	}
	es := uint64(rl.GetElementBytes())
	var v [8]byte
	for l := range uint64(layers) {
		for p := range uint64(rl.GetPlanes()) {
			base := rl.GetOffset() + uint64(slot)*rl.GetBlockStride() + l*rl.GetLayerStride() + p*rl.GetKvStride()
			for t := range tokens {
				for h := range heads {
					for d := range dim {
						idx := (h*tokens+t)*dim + d
						if nhd {
							idx = (t*heads+h)*dim + d
						}
						binary.LittleEndian.PutUint64(v[:], kvtest.Value(id, int(l), int(p), int(t), int(rl.GetHeadIds()[h]), int(d)))
						off := base + idx*es
						copy(mem[off:off+es], v[:es])
					}
				}
			}
		}
	}
}
