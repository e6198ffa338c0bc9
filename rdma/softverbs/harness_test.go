package softverbs_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

// Work completion statuses (enum ibv_wc_status) and errnos the tests expect.
const (
	wcSuccess     = 0
	wcLocLenErr   = 1
	wcLocQPOpErr  = 2
	wcLocProtErr  = 4
	wcFlushErr    = 5
	wcRemInvReq   = 9
	wcRemAccess   = 10
	wcRetryExc    = 12
	eInval        = 22
	eNoMem        = 12
	eNotSupported = 95

	qpsReset = 0
	qpsInit  = 1
	qpsRTR   = 2
	qpsRTS   = 3
	qpsErr   = 6

	accessLocalWrite = 1
	accessRemoteRead = 4
)

var (
	libPath, driverPath string
	setupErr            error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "softverbs-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	libPath, setupErr = softverbs.Build(dir)
	if setupErr == nil {
		driverPath = filepath.Join(dir, "svdriver")
		out, err := exec.Command("gcc", "-O1", "-Wall", "-I/usr/include", "testdata/svdriver.c", libPath,
			"-Wl,-rpath,"+dir, "-o", driverPath).CombinedOutput()
		if err != nil {
			setupErr = fmt.Errorf("gcc svdriver: %w\n%s", err, out)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needDriver(t testing.TB) {
	t.Helper()
	if errors.Is(setupErr, softverbs.ErrNoHeaders) {
		t.Skipf("needs rdma-core's headers (make test-deps installs them): %v", setupErr)
	}
	if setupErr != nil {
		t.Fatal(setupErr)
	}
}

// world is one machine's softverbs: a registry directory shared by the
// processes a test starts.
type world struct {
	t        testing.TB
	registry string
}

func newWorld(t testing.TB) *world {
	needDriver(t)
	// In /dev/shm, as softverbs' default: a registry on a disk file system
	// costs milliseconds per registration (renames are journalled).
	dir, err := os.MkdirTemp("/dev/shm", "softverbs-test-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	return &world{t: t, registry: dir}
}

// proc is a running svdriver.
type proc struct {
	t     testing.TB
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
	done  chan struct{}
}

func (w *world) start(name string, env ...string) *proc {
	t := w.t
	t.Helper()
	cmd := exec.Command(driverPath)
	cmd.Env = append(os.Environ(), "SOFTVERBS_REGISTRY="+w.registry, "SOFTVERBS_TIMEOUT_CAP_MS=3000")
	cmd.Env = append(cmd.Env, env...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &testWriter{t: t, prefix: name}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, cmd: cmd, in: in, lines: make(chan string, 16), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		in.Close()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

type testWriter struct {
	t      testing.TB
	prefix string
}

func (w *testWriter) Write(b []byte) (int, error) {
	w.t.Logf("%s stderr: %s", w.prefix, strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// do sends one command and returns its answer line.
func (p *proc) do(format string, args ...any) string {
	p.t.Helper()
	line := fmt.Sprintf(format, args...)
	if _, err := io.WriteString(p.in, line+"\n"); err != nil {
		p.t.Fatalf("%s: %s: %v", p.name, line, err)
	}
	select {
	case ans, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("%s: %s: process ended", p.name, line)
		}
		return ans
	case <-time.After(20 * time.Second):
		p.t.Fatalf("%s: %s: no answer in 20 s", p.name, line)
	}
	return ""
}

// ok runs a command that must succeed and returns its key=value fields.
func (p *proc) ok(format string, args ...any) map[string]string {
	p.t.Helper()
	ans := p.do(format, args...)
	if !strings.HasPrefix(ans, "ok") {
		p.t.Fatalf("%s: %s: %s", p.name, fmt.Sprintf(format, args...), ans)
	}
	return fields(ans)
}

func fields(ans string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(ans) {
		if k, v, ok := strings.Cut(f, "="); ok {
			m[k] = v
		}
	}
	return m
}

// exit asks the driver to return from main (so exit handlers run) and waits.
func (p *proc) exit() {
	p.t.Helper()
	io.WriteString(p.in, "exit\n")
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Fatalf("%s: not gone 10 s after exit", p.name)
	}
}

func (p *proc) kill() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Fatalf("%s: not gone 10 s after SIGKILL", p.name)
	}
}

// completion is one work completion as svdriver prints it.
type completion struct {
	wrID    uint64
	status  int
	byteLen uint32
}

// poll waits up to d for n completions and returns those that came and the
// driver's elapsed milliseconds; err is the driver's error line, if any.
func (p *proc) poll(n int, d time.Duration) (got []completion, ms int, errLine string) {
	p.t.Helper()
	ans := p.do("poll %d %d", n, d.Milliseconds())
	if strings.HasPrefix(ans, "err") {
		return nil, 0, ans
	}
	f := strings.Fields(ans)
	for _, x := range f[1:] {
		if k, v, ok := strings.Cut(x, "="); ok {
			if k == "ms" {
				ms, _ = strconv.Atoi(v)
			}
			continue
		}
		parts := strings.Split(x, ":")
		if len(parts) != 3 {
			p.t.Fatalf("poll answer %q", ans)
		}
		id, _ := strconv.ParseUint(parts[0], 10, 64)
		st, _ := strconv.Atoi(parts[1])
		bl, _ := strconv.ParseUint(parts[2], 10, 32)
		got = append(got, completion{id, st, uint32(bl)})
	}
	return got, ms, ""
}

// statuses polls for exactly len(want) completions and checks their wr_ids
// and statuses.
func (p *proc) expect(d time.Duration, want ...completion) []completion {
	p.t.Helper()
	got, _, errLine := p.poll(len(want), d)
	if errLine != "" {
		p.t.Fatalf("%s: poll: %s", p.name, errLine)
	}
	if len(got) != len(want) {
		p.t.Fatalf("%s: %d completions %v, want %v", p.name, len(got), got, want)
	}
	for i := range want {
		if got[i].wrID != want[i].wrID || got[i].status != want[i].status {
			p.t.Fatalf("%s: completion %d = %+v, want wr_id %d status %d (all: %v)", p.name, i, got[i], want[i].wrID, want[i].status, got)
		}
	}
	return got
}

// endpoint is an opened driver with its QP's address.
type endpoint struct {
	*proc
	qpn string
	gid string
	lid string
}

func (w *world) open(name, openArgs string, env ...string) *endpoint {
	p := w.start(name, env...)
	f := p.ok("open %s", openArgs)
	return &endpoint{proc: p, qpn: f["qpn"], gid: f["gid"], lid: f["lid"]}
}

func (e *endpoint) addr() string { return e.gid }

// connect connects a to b (a's QP to b's address) with extra connect args.
func connect(a, b *endpoint, args string) {
	a.t.Helper()
	a.ok("connect %s %s %s", b.qpn, b.addr(), args)
}

// pairOpts shapes a holder (which registers memory) and a reader (which
// issues READs) connected to each other.
type pairOpts struct {
	holderOpen, readerOpen string
	holderConn, readerConn string
	holderEnv, readerEnv   []string
}

func (w *world) pair(o pairOpts) (holder, reader *endpoint) {
	holder = w.open("holder", o.holderOpen, o.holderEnv...)
	reader = w.open("reader", o.readerOpen, o.readerEnv...)
	connect(holder, reader, o.holderConn)
	connect(reader, holder, o.readerConn)
	return holder, reader
}
