//go:build linux

package fabric

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
)

// The test binary is also the holder and the prober of the dumpable
// tests, run as an unprivileged user: root may open any process's /proc
// entries, dumpable or not.
const (
	dumpableHelperEnv = "KVFABRIC_TEST_DUMPABLE_HELPER" // memfd, agent, probe or engine
	dumpableOnEnv     = "KVFABRIC_TEST_DUMPABLE"        // "1": the holder stays dumpable
	dumpableDirEnv    = "KVFABRIC_TEST_DUMPABLE_DIR"    // the agent holder's data directory
	dumpablePathEnv   = "KVFABRIC_TEST_DUMPABLE_PATH"   // what the prober opens, the engine's socket
)

func init() {
	mode := os.Getenv(dumpableHelperEnv)
	if mode == "" {
		return
	}
	if err := runDumpableHelper(mode); err != nil {
		fmt.Fprintln(os.Stderr, "dumpable helper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runDumpableHelper is one side of the dumpable tests.
//
//	memfd  hold a memory file (a memfd with a secret in it, as the agent
//	       holds its block sets' memory), dumpable as dumpableOnEnv says
//	       (setDumpable, as Start does), and print
//	       "ready /proc/<pid>/fd/<n> <size> <secret> -"
//	agent  start an agent with a 16 MiB host pool, Dumpable as
//	       dumpableOnEnv says, and print "ready <its pool's /proc path>
//	       <size> - <engine socket>"
//	probe  open dumpablePathEnv and print "opened <uid> <size> <first
//	       bytes, hex>" or "refused <uid> <permission|other>: <error>"
//	engine register a block set with the agent at dumpablePathEnv, as an
//	       engine does (its memory by descriptor), write and read back its
//	       first bytes and print "mapped <uid> <bytes of rank 0>"
//
// The holders then wait for the end of their input.
func runDumpableHelper(mode string) error {
	on := os.Getenv(dumpableOnEnv) == "1"
	switch mode {
	case "memfd":
		fd, err := unix.MemfdCreate("kvfabric-dumpable-probe", unix.MFD_CLOEXEC)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), "memfd")
		defer f.Close()
		secret := make([]byte, 16)
		rand.Read(secret)
		if _, err := f.Write(secret); err != nil {
			return err
		}
		if err := setDumpable(on); err != nil {
			return err
		}
		fmt.Printf("ready /proc/%d/fd/%d %d %s -\n", os.Getpid(), fd, len(secret), hex.EncodeToString(secret))
	case "agent":
		dir := os.Getenv(dumpableDirEnv)
		c := DefaultLocalConfig()
		c.NodeName, c.DataDir, c.DevCADir = "dumpable", filepath.Join(dir, "d"), filepath.Join(dir, "ca")
		c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "off"
		c.Pools = []string{"host=16MiB"}
		c.Dumpable = on
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		a, err := Start(ctx, c)
		if err != nil {
			return err
		}
		defer a.Close()
		fmt.Printf("ready %s %d - %s\n", a.host.Path(), a.host.Size(), a.cfg.EngineSocket)
	case "probe":
		uid := os.Geteuid()
		f, err := os.OpenFile(os.Getenv(dumpablePathEnv), os.O_RDWR, 0)
		if err != nil {
			kind := "other"
			if errors.Is(err, fs.ErrPermission) {
				kind = "permission"
			}
			fmt.Printf("refused %d %s: %v\n", uid, kind, err)
			return nil
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return err
		}
		b := make([]byte, 16)
		n, err := io.ReadFull(f, b)
		if err != nil {
			return err
		}
		fmt.Printf("opened %d %d %s\n", uid, st.Size(), hex.EncodeToString(b[:n]))
		return nil
	case "engine":
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		c, err := client.Dial(ctx, os.Getenv(dumpablePathEnv))
		if err != nil {
			return err
		}
		defer c.Close()
		model := layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16}
		set, err := c.Register(ctx, client.Engine{Name: "dumpable", Model: model, TPSize: 1, PageSize: 4, Order: layout.HND, Slots: 4})
		if err != nil {
			return err
		}
		mem := set.Ranks[0]
		for i := range 16 {
			mem[i] = 0xa5
		}
		if mem[0] != 0xa5 || mem[15] != 0xa5 {
			return fmt.Errorf("rank 0's memory does not keep what was written")
		}
		fmt.Printf("mapped %d %d\n", os.Geteuid(), len(mem))
		return nil
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	_, err := io.Copy(io.Discard, os.Stdin)
	return err
}

// dumpableUnprivileged returns the test binary where any user may run it, and the
// credentials its helpers take: those of nobody when the tests run as
// root (nil when they run unprivileged already). It skips, saying why,
// where this process cannot switch users.
func dumpableUnprivileged(t *testing.T) (bin string, cred *syscall.Credential) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "kvfdump")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The build directory of a test binary is its user's alone: a link (or
	// a copy) of it where nobody can reach it.
	bin = filepath.Join(dir, "fabric.test")
	if err := os.Link(exe, bin); err != nil {
		if err := dumpableCopy(exe, bin); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		return bin, nil
	}
	uid, gid := uint32(65534), uint32(65534)
	if u, err := user.Lookup("nobody"); err == nil {
		if n, err := strconv.ParseUint(u.Uid, 10, 32); err == nil {
			uid = uint32(n)
		}
		if n, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			gid = uint32(n)
		}
	}
	cred = &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}
	out, err := dumpableCmd(context.Background(), bin, cred, "probe", dumpablePathEnv+"=/").Output()
	if errors.Is(err, syscall.EPERM) {
		t.Skipf("these tests run as root and cannot switch to uid %d to probe unprivileged (root opens any process's /proc entries): %v", uid, err)
	}
	if err != nil || !strings.Contains(string(out), fmt.Sprint(uid)) {
		t.Fatalf("the prober as uid %d: %v: %q", uid, err, out)
	}
	return bin, cred
}

func dumpableCopy(from, to string) error {
	src, err := os.Open(from)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

func dumpableCmd(ctx context.Context, bin string, cred *syscall.Credential, mode string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin)
	cmd.Dir = filepath.Dir(bin)
	cmd.Env = append(append(os.Environ(), dumpableHelperEnv+"="+mode), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	return cmd
}

// dumpableHolder is a helper that holds memory, started by startDumpableHolder.
type dumpableHolder struct {
	path, secret, socket string
	size                 int64
}

// startDumpableHolder starts the holder helper of mode as cred's user, waits (60 s
// at most) for it to say what it holds, and stops it when the test ends.
func startDumpableHolder(t *testing.T, bin string, cred *syscall.Credential, mode string, dumpable bool) dumpableHolder {
	t.Helper()
	env := []string{dumpableOnEnv + "=0"}
	if dumpable {
		env[0] = dumpableOnEnv + "=1"
	}
	if mode == "agent" {
		dir, err := os.MkdirTemp("", "kvfdump")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		if cred != nil {
			if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
		env = append(env, dumpableDirEnv+"="+dir)
	}
	cmd := dumpableCmd(context.Background(), bin, cred, mode, env...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr dumpableLog
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- line
		io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	var line string
	select {
	case line = <-lines:
	case <-time.After(60 * time.Second):
		t.Fatalf("the %s holder said nothing in 60 s: %s", mode, stderr.String())
	}
	var h dumpableHolder
	if _, err := fmt.Sscanf(line, "ready %s %d %s %s", &h.path, &h.size, &h.secret, &h.socket); err != nil {
		t.Fatalf("the %s holder: %q (%v): %s", mode, line, err, stderr.String())
	}
	return h
}

// dumpableProbe runs the helper of mode (probe or engine) on path as
// cred's user in a process of its own and returns what it said.
func dumpableProbe(t *testing.T, bin string, cred *syscall.Credential, mode, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stderr dumpableLog
	cmd := dumpableCmd(ctx, bin, cred, mode, dumpablePathEnv+"="+path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v: %s%s", mode, path, err, out, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// A process of the holder's own user, not root, opens the memory the
// holder keeps open through /proc/<pid>/fd/<n> while the holder is
// dumpable, and is refused once it is not: the memory file of a bare
// holder made non-dumpable as Start makes the agent, and the whole pool
// of a real agent started with and without Dumpable, whose engines of the
// same user still map their own sets either way.
func TestNonDumpableMemoryRefusedToSameUser(t *testing.T) {
	bin, cred := dumpableUnprivileged(t)
	uid := os.Geteuid()
	if cred != nil {
		uid = int(cred.Uid)
	}
	for _, mode := range []string{"memfd", "agent"} {
		for _, dumpable := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/dumpable=%v", mode, dumpable), func(t *testing.T) {
				h := startDumpableHolder(t, bin, cred, mode, dumpable)
				if h.socket != "-" {
					// An engine of the same user maps its own set, by
					// descriptor, either way.
					got := dumpableProbe(t, bin, cred, "engine", h.socket)
					if want := fmt.Sprintf("mapped %d ", uid); !strings.HasPrefix(got, want) {
						t.Fatalf("an engine as uid %d: %q, want %q", uid, got, want)
					}
				}
				got := dumpableProbe(t, bin, cred, "probe", h.path)
				if dumpable {
					want := fmt.Sprintf("opened %d %d ", uid, h.size)
					if !strings.HasPrefix(got, want) || (h.secret != "-" && !strings.HasSuffix(got, " "+h.secret)) {
						t.Fatalf("uid %d opening %s of a dumpable holder: %q, want %q and the secret %s", uid, h.path, got, want, h.secret)
					}
					return
				}
				if want := fmt.Sprintf("refused %d permission: ", uid); !strings.HasPrefix(got, want) {
					t.Fatalf("uid %d opening %s of a non-dumpable holder: %q, want %q", uid, h.path, got, want)
				}
				if cred == nil {
					return
				}
				// The memory is there: root, which ptrace checks let by,
				// opens it.
				f, err := os.Open(h.path)
				if err != nil {
					t.Fatalf("root opening %s: %v", h.path, err)
				}
				defer f.Close()
				if st, err := f.Stat(); err != nil || st.Size() != h.size {
					t.Fatalf("root's view of %s: %v, size %v, want %d", h.path, err, st, h.size)
				}
			})
		}
	}
}

// dumpableLog collects a logger's or a helper's output.
type dumpableLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *dumpableLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *dumpableLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Start makes the process non-dumpable unless Dumpable, and a dumpable
// agent says so once. Not parallel: the flag is the process's, and it is
// put back as it was.
func TestStartSetsDumpable(t *testing.T) {
	was, err := isDumpable()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { setDumpable(was) })
	dir := t.TempDir()
	for i, dumpable := range []bool{false, true, false} {
		var log dumpableLog
		c := DefaultLocalConfig()
		c.NodeName = fmt.Sprintf("d%d", i)
		c.DataDir, c.DevCADir = filepath.Join(dir, c.NodeName), filepath.Join(dir, "ca")
		c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "off"
		c.Pools = []string{"host=16MiB"}
		c.Dumpable = dumpable
		c.Logger = slog.New(slog.NewTextHandler(&log, nil))
		a, err := Start(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		got, err := isDumpable()
		a.Close()
		if err != nil || got != dumpable {
			t.Fatalf("agent %d started with Dumpable %v: the process is dumpable: %v (%v)", i, dumpable, got, err)
		}
		if n := strings.Count(log.String(), "the agent is dumpable"); n != map[bool]int{true: 1}[dumpable] {
			t.Fatalf("agent %d with Dumpable %v said it is dumpable %d times:\n%s", i, dumpable, n, log.String())
		}
	}
}
