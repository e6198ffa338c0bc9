//go:build cgo && linux

package rdma_test

import (
	"bufio"
	"context"
	"encoding/json"
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
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

// A holder process is this test binary run again with roleEnv set: it
// registers holderBytes of patterned memory and serves RDMA READs from it,
// driven by lines on stdin.
const (
	roleEnv     = "KVFABRIC_RDMA_TEST_ROLE"
	holderBytes = 4 << 20
)

var (
	softLib  string
	setupErr error
	control  string // this process's SOFTVERBS_CONTROL file
)

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "holder" {
		os.Exit(holderMain())
	}
	dir, err := os.MkdirTemp("", "rdma-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	softLib, setupErr = softverbs.Build(filepath.Join(dir, "lib"))
	// One registry for this test process and the holders it starts.
	os.Setenv("SOFTVERBS_REGISTRY", filepath.Join(dir, "registry"))
	control = filepath.Join(dir, "control")
	os.WriteFile(control, nil, 0o644)
	os.Setenv("SOFTVERBS_CONTROL", control)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// readCtx bounds a read: a completion that never comes (an unsignalled
// last request, a timeout of 0) fails the test in seconds rather than at
// the package's timeout.
func readCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pattern is the byte the holder keeps at offset i.
func pattern(i int) byte { return byte(i*7 + i>>8 + 3) }

// holderMsg is what the holder says on stdout.
type holderMsg struct {
	Endpoint rdma.Endpoint `json:",omitempty"`
	Addr     uint64        `json:",omitempty"`
	RKey     uint32        `json:",omitempty"`
	Err      string        `json:",omitempty"`
}

func holderMain() int {
	out := json.NewEncoder(os.Stdout)
	fail := func(err error) int {
		out.Encode(holderMsg{Err: err.Error()})
		return 1
	}
	lib, err := rdma.Open(rdma.Config{})
	if err != nil {
		return fail(err)
	}
	dev, err := lib.OpenDevice("softverbs0", 1)
	if err != nil {
		return fail(err)
	}
	buf := make([]byte, holderBytes)
	for i := range buf {
		buf[i] = pattern(i)
	}
	mr, err := dev.RegisterMemory(buf)
	if err != nil {
		return fail(err)
	}
	// HOLDER_READ_DEPTH: the responder resources the holder offers.
	depth, _ := strconv.Atoi(os.Getenv("HOLDER_READ_DEPTH"))
	qp, err := dev.NewQueuePair(rdma.QPOptions{ReadDepth: depth})
	if err != nil {
		return fail(err)
	}
	out.Encode(holderMsg{Addr: mr.Addr(), RKey: mr.RKey()})
	in := json.NewDecoder(os.Stdin)
	for {
		// Each message is the reader's endpoint: reset, connect back, answer
		// with ours.
		var remote rdma.Endpoint
		if err := in.Decode(&remote); err != nil {
			lib.Close()
			if err == io.EOF {
				return 0
			}
			return fail(err)
		}
		if err := qp.Reset(); err != nil {
			return fail(err)
		}
		ep := qp.Endpoint()
		if err := qp.Connect(remote); err != nil {
			return fail(err)
		}
		out.Encode(holderMsg{Endpoint: ep})
	}
}

// holder is a running holder process.
type holder struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *json.Decoder
	addr uint64
	rkey uint32
}

func needSoftverbs(t *testing.T) {
	t.Helper()
	if setupErr != nil {
		t.Fatalf("softverbs: %v", setupErr)
	}
	t.Setenv(rdma.EnvLibrary, softLib)
}

func startHolder(t *testing.T, env ...string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"=holder", rdma.EnvLibrary+"="+softLib)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holder{cmd: cmd, in: in, out: json.NewDecoder(bufio.NewReader(stdout))}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	m := h.recv(t)
	h.addr, h.rkey = m.Addr, m.RKey
	return h
}

func (h *holder) recv(t *testing.T) holderMsg {
	t.Helper()
	var m holderMsg
	if err := h.out.Decode(&m); err != nil {
		t.Fatalf("holder: %v", err)
	}
	if m.Err != "" {
		t.Fatalf("holder: %s", m.Err)
	}
	return m
}

// connect exchanges endpoints with the holder and connects qp to it.
func (h *holder) connect(t *testing.T, qp *rdma.QueuePair) {
	t.Helper()
	if err := json.NewEncoder(h.in).Encode(qp.Endpoint()); err != nil {
		t.Fatal(err)
	}
	if err := qp.Connect(h.recv(t).Endpoint); err != nil {
		t.Fatalf("connect: %v", err)
	}
}

// reader is this process's side: a device, a destination region and a QP.
type reader struct {
	lib *rdma.Library
	dev *rdma.Device
	buf []byte
	mr  *rdma.MemoryRegion
	qp  *rdma.QueuePair
}

func newReader(t *testing.T, o rdma.QPOptions) *reader {
	t.Helper()
	needSoftverbs(t)
	lib, err := rdma.Open(rdma.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lib.Close() })
	dev, err := lib.OpenDevice("softverbs0", 1)
	if err != nil {
		t.Fatal(err)
	}
	r := &reader{lib: lib, dev: dev, buf: make([]byte, holderBytes)}
	if r.mr, err = dev.RegisterMemory(r.buf); err != nil {
		t.Fatal(err)
	}
	if r.qp, err = dev.NewQueuePair(o); err != nil {
		t.Fatal(err)
	}
	return r
}

// scatteredOps reads n pieces of size bytes from the holder, each piece
// landing in sges scatter entries spread over the local buffer in reverse
// order, so that a misplaced byte shows.
func (r *reader) scatteredOps(h *holder, n, size, sges int) []rdma.ReadOp {
	ops := make([]rdma.ReadOp, n)
	per := size / sges
	for i := range ops {
		ops[i] = rdma.ReadOp{RemoteAddr: h.addr + uint64(i*size), RKey: h.rkey}
		for j := range sges {
			local := len(r.buf) - (i*sges+j+1)*per
			ops[i].Local = append(ops[i].Local, rdma.SGE{Addr: r.mr.Addr() + uint64(local), Length: uint32(per), LKey: r.mr.LKey()})
		}
	}
	return ops
}

func (r *reader) verify(t *testing.T, n, size, sges int) {
	t.Helper()
	per := size / sges
	for i := range n {
		for j := range sges {
			local := len(r.buf) - (i*sges+j+1)*per
			remote := i*size + j*per
			for k := range per {
				if got, want := r.buf[local+k], pattern(remote+k); got != want {
					t.Fatalf("op %d sge %d byte %d: got %#x, want %#x", i, j, k, got, want)
				}
			}
		}
	}
}

func wantStatus(t *testing.T, err error, status int) *rdma.CompletionError {
	t.Helper()
	var ce *rdma.CompletionError
	if !errors.As(err, &ce) || !errors.Is(err, rdma.ErrCompletion) {
		t.Fatalf("error %v, want a completion error with status %d", err, status)
	}
	if ce.Status != status {
		t.Fatalf("completion status %d (%s), want %d", ce.Status, ce.StatusText, status)
	}
	if strings.Contains(err.Error(), "outstanding") {
		t.Fatalf("the flushed requests never drained: %v", err)
	}
	return ce
}

const (
	wcLocProtErr  = 4
	wcRemAccess   = 10
	wcRemOpErr    = 11
	wcRetryExc    = 12
	wcRemAccessTx = "remote access error"
)

// TestReadAcrossProcesses: the holder registers memory, this process reads
// it by RDMA READ with more ops than the send queue holds and scatter lists
// at the queue pair's limit, and every byte is checked.
func TestReadAcrossProcesses(t *testing.T) {
	r := newReader(t, rdma.QPOptions{SendDepth: 32, MaxSGE: 4, SignalEvery: 8})
	h := startHolder(t)
	h.connect(t, r.qp)
	if s, err := r.qp.State(); err != nil || s != "RTS" {
		t.Fatalf("state after Connect: %s, %v", s, err)
	}
	if c := r.qp.ReadCPU(); c != 0 {
		t.Fatalf("ReadCPU before any read: %v", c)
	}
	const n, size, sges = 1000, 4096, 4 // 1000 ops through a queue of 32
	t0 := time.Now()
	if err := r.qp.Read(readCtx(t), r.scatteredOps(h, n, size, sges)); err != nil {
		t.Fatalf("read: %v", err)
	}
	wall := time.Since(t0)
	r.verify(t, n, size, sges)
	// The posting and polling thread ran (and, on softverbs, copied): some
	// CPU, and no more than one thread can use in the read's time, give or
	// take the thread CPU clock's accounting against the wall clock's (a
	// few tens of microseconds apart in a read of milliseconds).
	cpu := r.qp.ReadCPU()
	if most := wall + wall/10 + time.Millisecond; cpu <= 0 || cpu > most {
		t.Fatalf("ReadCPU %v after a read of %v, want in (0, %v]", cpu, wall, most)
	}

	// A scatter list one past the queue pair's limit is refused before
	// anything is posted, and the queue pair stays usable.
	ops := r.scatteredOps(h, 1, 5*512, 5)
	if err := r.qp.Read(readCtx(t), ops); !errors.Is(err, rdma.ErrInvalidArgument) {
		t.Fatalf("5 scatter entries on a 4-entry queue pair: %v, want ErrInvalidArgument", err)
	}
	if c := r.qp.ReadCPU(); c != cpu {
		t.Fatalf("ReadCPU moved from %v to %v for a read refused before posting", cpu, c)
	}
	clear(r.buf)
	if err := r.qp.Read(readCtx(t), r.scatteredOps(h, 10, 4096, 4)); err != nil {
		t.Fatalf("read after a refused one: %v", err)
	}
	r.verify(t, 10, 4096, 4)
}

// TestReadErrorsThenResetAndReconnect: a bad rkey, a range past the region
// and a bad lkey each fail with the status a NIC gives and leave the queue
// pair in error; Reset and a new connection make it read again.
func TestReadErrorsThenResetAndReconnect(t *testing.T) {
	r := newReader(t, rdma.QPOptions{SendDepth: 16})
	h := startHolder(t)
	h.connect(t, r.qp)
	good := func() []rdma.ReadOp { return r.scatteredOps(h, 64, 4096, 2) }
	for _, tc := range []struct {
		desc   string
		mod    func(ops []rdma.ReadOp)
		status int
	}{
		{"bad rkey", func(ops []rdma.ReadOp) { ops[40].RKey ^= 0x5a5a }, wcRemAccess},
		{"past the region's end", func(ops []rdma.ReadOp) { ops[63].RemoteAddr = h.addr + holderBytes - 100 }, wcRemAccess},
		{"bad lkey", func(ops []rdma.ReadOp) { ops[7].Local[1].LKey ^= 0x5a5a }, wcLocProtErr},
	} {
		ops := good()
		tc.mod(ops)
		err := r.qp.Read(readCtx(t), ops)
		ce := wantStatus(t, err, tc.status)
		if tc.status == wcRemAccess && ce.StatusText != wcRemAccessTx {
			t.Errorf("%s: status text %q, want ibv_wc_status_str's %q", tc.desc, ce.StatusText, wcRemAccessTx)
		}
		if s, _ := r.qp.State(); s != "ERR" {
			t.Fatalf("%s: queue pair in %s after an error completion, want ERR", tc.desc, s)
		}
		if err := r.qp.Read(readCtx(t), good()); !errors.Is(err, rdma.ErrNotConnected) {
			t.Fatalf("%s: read on a failed queue pair: %v, want ErrNotConnected", tc.desc, err)
		}
		if err := r.qp.Connect(r.qp.Endpoint()); !errors.Is(err, rdma.ErrInvalidArgument) {
			t.Fatalf("%s: Connect without Reset: %v, want ErrInvalidArgument", tc.desc, err)
		}
		if err := r.qp.Reset(); err != nil {
			t.Fatalf("%s: reset: %v", tc.desc, err)
		}
		h.connect(t, r.qp)
		clear(r.buf)
		if err := r.qp.Read(readCtx(t), good()); err != nil {
			t.Fatalf("%s: read after reset and reconnect: %v", tc.desc, err)
		}
		r.verify(t, 64, 4096, 2)
	}
}

// TestPeerKilledMidRead: a holder killed with SIGKILL while a read is under
// way makes it fail with retry-exceeded within the queue pair's bound; the
// queue pair then resets and reads from another holder.
func TestPeerKilledMidRead(t *testing.T) {
	// timeout 12: 16.8 ms a try, 8 tries: about 134 ms.
	r := newReader(t, rdma.QPOptions{SendDepth: 4, Timeout: 12, RetryCount: 7})
	h := startHolder(t)
	h.connect(t, r.qp)
	// 1 ms a completion: 1000 reads take about 1 s, time to kill the holder
	// once the first ones have landed.
	setFaults(t, "delay_us=1000")
	const n = 1000
	errc := make(chan error, 1)
	var took time.Duration
	go func() {
		start := time.Now()
		err := r.qp.Read(readCtx(t), r.scatteredOps(h, n, 4096, 1))
		took = time.Since(start)
		errc <- err
	}()
	// The first op lands at the end of the buffer.
	first := r.buf[len(r.buf)-4096:]
	deadline := time.Now().Add(20 * time.Second)
	for first[0] != pattern(0) || first[4095] != pattern(4095) {
		if time.Now().After(deadline) {
			t.Fatal("the first read never landed")
		}
		time.Sleep(time.Millisecond)
	}
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	err := <-errc
	ce := wantStatus(t, err, wcRetryExc)
	if ce.Op == 0 || ce.Op >= n {
		t.Fatalf("failed at op %d: not mid-read", ce.Op)
	}
	if since := time.Since(killed); since > 15*time.Second {
		t.Fatalf("dead peer detected %v after the kill", since)
	}
	t.Logf("dead peer: %v, %v after the kill (read ran %v)", err, time.Since(killed), took)
	os.WriteFile(control, nil, 0o644)

	h2 := startHolder(t)
	if err := r.qp.Reset(); err != nil {
		t.Fatal(err)
	}
	h2.connect(t, r.qp)
	clear(r.buf)
	if err := r.qp.Read(readCtx(t), r.scatteredOps(h2, 100, 4096, 1)); err != nil {
		t.Fatalf("read from a new holder: %v", err)
	}
	r.verify(t, 100, 4096, 1)
}

func setFaults(t *testing.T, s string) {
	t.Helper()
	if err := os.WriteFile(control, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.WriteFile(control, nil, 0o644) })
}

// TestInjectedFaults: fail_read=N fails the Nth READ and the error names
// that op; fail_status picks the status; port_down=1 times requests out;
// cleared faults and a reset make the queue pair read again.
func TestInjectedFaults(t *testing.T) {
	r := newReader(t, rdma.QPOptions{SendDepth: 8})
	h := startHolder(t)
	h.connect(t, r.qp)
	setFaults(t, "fail_read=5")
	ce := wantStatus(t, r.qp.Read(readCtx(t), r.scatteredOps(h, 20, 4096, 1)), wcRemAccess)
	if ce.Op != 4 {
		t.Fatalf("failed op %d, want 4 (the 5th read)", ce.Op)
	}

	// A status named by fail_status.
	reconnect := func() {
		t.Helper()
		if err := r.qp.Reset(); err != nil {
			t.Fatal(err)
		}
		h.connect(t, r.qp)
	}
	reconnect()
	setFaults(t, "fail_read=1,fail_status=REM_OP_ERR")
	ce = wantStatus(t, r.qp.Read(readCtx(t), r.scatteredOps(h, 3, 4096, 1)), wcRemOpErr)
	if ce.Op != 0 {
		t.Fatalf("failed op %d, want 0", ce.Op)
	}

	// The port going down: requests time out.
	reconnect()
	setFaults(t, "port_down=1")
	wantStatus(t, r.qp.Read(readCtx(t), r.scatteredOps(h, 3, 4096, 1)), wcRetryExc)

	// Faults cleared: reads work again after a reset.
	setFaults(t, "")
	reconnect()
	clear(r.buf)
	if err := r.qp.Read(readCtx(t), r.scatteredOps(h, 20, 4096, 1)); err != nil {
		t.Fatalf("read after the faults cleared: %v", err)
	}
	r.verify(t, 20, 4096, 1)
}

// TestContextEndsStalledRead: with the peer stalled and a long transport
// timeout, the read returns when ctx ends, not when the device gives up.
func TestContextEndsStalledRead(t *testing.T) {
	t.Setenv("SOFTVERBS_TIMEOUT_CAP_MS", "600000")
	// timeout 22: 17 s a try, 8 tries.
	r := newReader(t, rdma.QPOptions{SendDepth: 8, Timeout: 22})
	h := startHolder(t)
	h.connect(t, r.qp)
	setFaults(t, "stall=1")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := r.qp.Read(ctx, r.scatteredOps(h, 20, 4096, 1))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled read: %v, want the context's deadline", err)
	}
	if took := time.Since(start); took > 60*time.Second {
		t.Fatalf("stalled read returned after %v", took)
	}
	os.WriteFile(control, nil, 0o644)
	if err := r.qp.Reset(); err != nil {
		t.Fatal(err)
	}
	h.connect(t, r.qp)
	if err := r.qp.Read(readCtx(t), r.scatteredOps(h, 20, 4096, 1)); err != nil {
		t.Fatalf("read after the stall cleared: %v", err)
	}
}

// TestDevicesOnSoftverbs: fake devices, ports and GIDs from the environment;
// the GID choice; a port that is down.
func TestDevicesOnSoftverbs(t *testing.T) {
	needSoftverbs(t)
	t.Setenv("SOFTVERBS_DEVICES", "sva,svb")
	t.Setenv("SOFTVERBS_GID_ADDR", "10.1.2.3")
	lib, err := rdma.Open(rdma.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	devs, err := lib.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 || devs[0].Name != "sva" || devs[1].Name != "svb" {
		t.Fatalf("devices %+v, want sva and svb", devs)
	}
	d := devs[0]
	if len(d.Ports) != 1 || !d.Ports[0].Active || d.Ports[0].LinkLayer != rdma.LinkLayerEthernet || d.Ports[0].MTU == 0 {
		t.Fatalf("port %+v, want one active ethernet port with an MTU", d.Ports)
	}
	if d.MaxQPWR != 4096 || d.MaxSGE != 30 || d.MaxCQE != 65536 || d.GUID == "" {
		t.Fatalf("device limits %+v", d)
	}
	var v2 *rdma.GID
	for i, g := range d.Ports[0].GIDs {
		if g.Index == 3 {
			v2 = &d.Ports[0].GIDs[i]
		}
	}
	// mlx5's layout: each address as RoCE v1, then v2.
	if v2 == nil || v2.Type != rdma.GIDTypeRoCEv2 || v2.String() != "0000:0000:0000:0000:0000:ffff:0a01:0203" {
		t.Fatalf("GIDs %+v, want index 3 ::ffff:10.1.2.3 RoCE v2", d.Ports[0].GIDs)
	}
	dev, err := lib.OpenDevice("svb", 0)
	if err != nil {
		t.Fatal(err)
	}
	if g := dev.GID(); g.Index != 3 || !g.IPv4Mapped() {
		t.Fatalf("chose GID %+v, want the IPv4-mapped RoCE v2 one", g)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	if err := dev.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := lib.OpenDevice("svc", 1); !errors.Is(err, rdma.ErrUnavailable) || !strings.Contains(err.Error(), "svc") {
		t.Fatalf("unknown device: %v", err)
	}
	if _, err := lib.OpenDevice("sva", 2); !errors.Is(err, rdma.ErrInvalidArgument) {
		t.Fatalf("port 2 of a one-port device: %v", err)
	}

	t.Setenv("SOFTVERBS_PORT_STATE", "down")
	if _, err := lib.OpenDevice("sva", 1); !errors.Is(err, rdma.ErrUnavailable) || !strings.Contains(err.Error(), "down") {
		t.Fatalf("port down: %v, want ErrUnavailable saying down", err)
	}
	t.Setenv("SOFTVERBS_PORT_STATE", "active")
	t.Setenv("SOFTVERBS_LINK_LAYER", "infiniband")
	ib, err := lib.OpenDevice("sva", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ib.Close()
	if p := ib.Port(); p.LinkLayer != rdma.LinkLayerInfiniBand || p.LID == 0 || len(p.GIDs) == 0 || p.GIDs[0].Type != rdma.GIDTypeIB {
		t.Fatalf("infiniband port %+v", p)
	}
	if e := mustQP(t, ib).Endpoint(); e.LID == 0 || e.GID != ([16]byte{}) || e.Validate() != nil {
		t.Fatalf("infiniband endpoint %+v: %v", e, e.Validate())
	}
}

func mustQP(t *testing.T, d *rdma.Device) *rdma.QueuePair {
	t.Helper()
	qp, err := d.NewQueuePair(rdma.QPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

// TestQueuePairLimits: depths and scatter lists at the device's limits are
// taken, past them clamped.
func TestQueuePairLimits(t *testing.T) {
	r := newReader(t, rdma.QPOptions{})
	for _, tc := range []struct {
		desc      string
		o         rdma.QPOptions
		depth, sg int
	}{
		{"at the device's limits", rdma.QPOptions{SendDepth: 4096, MaxSGE: 30}, 4096, 30},
		{"past them", rdma.QPOptions{SendDepth: 4097, MaxSGE: 31}, 4096, 30},
	} {
		qp, err := r.dev.NewQueuePair(tc.o)
		if err != nil {
			t.Fatalf("%s: %v", tc.desc, err)
		}
		if o := qp.Options(); o.SendDepth != tc.depth || o.MaxSGE != tc.sg {
			t.Fatalf("%s: options %+v, want depth %d sge %d", tc.desc, o, tc.depth, tc.sg)
		}
		qp.Close()
		if err := qp.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := qp.Read(readCtx(t), nil); !errors.Is(err, rdma.ErrClosed) {
			t.Fatalf("read after Close: %v", err)
		}
	}
}

// TestDmabufLoopback registers a memfd through the dma-buf path and reads it
// over a queue pair connected to another in the same process.
func TestDmabufLoopback(t *testing.T) {
	r := newReader(t, rdma.QPOptions{})
	fd, err := unix.MemfdCreate("kvfabric-rdma-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	const size = 1 << 20
	src := make([]byte, size)
	for i := range src {
		src[i] = pattern(i)
	}
	if _, err := unix.Pwrite(fd, src, 0); err != nil {
		t.Fatal(err)
	}
	const iova = 0x7000_0000_0000
	mr, err := r.dev.RegisterDmabuf(fd, 0, size, iova)
	if err != nil {
		t.Fatalf("register dma-buf: %v", err)
	}
	if mr.Addr() != iova || mr.Len() != size || mr.Stats().Bytes != size {
		t.Fatalf("dma-buf region at %#x len %d, want %#x len %d", mr.Addr(), mr.Len(), uint64(iova), size)
	}
	peer := mustQP(t, r.dev)
	a, b := r.qp.Endpoint(), peer.Endpoint()
	if err := r.qp.Connect(b); err != nil {
		t.Fatal(err)
	}
	if err := peer.Connect(a); err != nil {
		t.Fatal(err)
	}
	h := &holder{addr: iova, rkey: mr.RKey()}
	if err := r.qp.Read(readCtx(t), r.scatteredOps(h, 256, 4096, 2)); err != nil {
		t.Fatalf("read dma-buf: %v", err)
	}
	r.verify(t, 256, 4096, 2)
	if err := mr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := mr.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// A closed region is gone from the device: reading it is an access error.
	err = r.qp.Read(readCtx(t), r.scatteredOps(h, 1, 4096, 1))
	wantStatus(t, err, wcRemAccess)
}

// TestConcurrentUse registers regions from several goroutines at once and
// runs Reads on one queue pair from two goroutines (they take turns).
func TestConcurrentUse(t *testing.T) {
	r := newReader(t, rdma.QPOptions{SendDepth: 16})
	errc := make(chan error, 8)
	for range 8 {
		go func() {
			mr, err := r.dev.RegisterMemory(make([]byte, 1<<20))
			if err == nil {
				err = mr.Close()
			}
			errc <- err
		}()
	}
	for range 8 {
		if err := <-errc; err != nil {
			t.Fatalf("parallel registration: %v", err)
		}
	}
	h := startHolder(t)
	h.connect(t, r.qp)
	for g := range 2 {
		go func() {
			// Each goroutine reads its half of the ops' destinations.
			ops := r.scatteredOps(h, 200, 4096, 2)
			errc <- r.qp.Read(readCtx(t), ops[g*100:(g+1)*100])
		}()
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatalf("concurrent read: %v", err)
		}
	}
	r.verify(t, 200, 4096, 2)
}

// TestWithoutOptionalSymbols runs on a softverbs built without
// _ibv_query_gid_ex and ibv_reg_dmabuf_mr (an older libibverbs): GID types
// then come from the GIDs' form, and dma-buf registration says it is not
// supported.
func TestWithoutOptionalSymbols(t *testing.T) {
	needSoftverbs(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "softverbs.c")
	if err := os.WriteFile(src, softverbs.Source(), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(dir, "libsoftverbs-old.so")
	out, err := exec.Command("gcc", "-shared", "-fPIC", "-O2", "-pthread",
		"-D_ibv_query_gid_ex=softverbs_hidden_query_gid_ex", "-Dibv_reg_dmabuf_mr=softverbs_hidden_reg_dmabuf_mr",
		src, "-o", lib).CombinedOutput()
	if err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	l, err := rdma.Open(rdma.Config{Library: lib})
	if err != nil {
		t.Fatalf("open a library without the optional symbols: %v", err)
	}
	defer l.Close()
	dev, err := l.OpenDevice("softverbs0", 1)
	if err != nil {
		t.Fatal(err)
	}
	types := map[int]rdma.GIDType{}
	for _, g := range dev.Port().GIDs {
		types[g.Index] = g.Type
	}
	// The form alone would call index 2 (::ffff:a.b.c.d, RoCE v1 in mlx5's
	// layout) v2; the repeat of each address tells the versions apart.
	if types[0] != rdma.GIDTypeRoCEv1 || types[1] != rdma.GIDTypeRoCEv2 || types[2] != rdma.GIDTypeRoCEv1 || types[3] != rdma.GIDTypeRoCEv2 {
		t.Fatalf("GID types from the form: %v, want 0: RoCE v1, 1: RoCE v2, 2: RoCE v1, 3: RoCE v2", types)
	}
	if g := dev.GID(); g.Index != 3 {
		t.Fatalf("chose GID %d, want 3", g.Index)
	}
	if _, err := dev.RegisterDmabuf(0, 0, 4096, 0); !errors.Is(err, rdma.ErrNotSupported) || !strings.Contains(err.Error(), "ibv_reg_dmabuf_mr") {
		t.Fatalf("dma-buf without ibv_reg_dmabuf_mr: %v, want ErrNotSupported naming it", err)
	}
}

// RegisterAddr of memory the process cannot access (a GPU pointer with no
// peer-memory client: softcuda maps device memory PROT_NONE) fails with
// EFAULT, as pin_user_pages does, and leaves the device as it was; the same
// range made accessible registers, with its address as the region's.
func TestRegisterAddrOfInaccessibleMemory(t *testing.T) {
	r := newReader(t, rdma.QPOptions{})
	mem, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	addr := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(mem))))
	if mr, err := r.dev.RegisterAddr(addr, uint64(len(mem))); !errors.Is(err, syscall.EFAULT) {
		if mr != nil {
			mr.Close()
		}
		t.Fatalf("RegisterAddr of PROT_NONE memory: %v, want EFAULT", err)
	}
	if _, err := r.dev.RegisterAddr(0, 4096); !errors.Is(err, rdma.ErrInvalidArgument) {
		t.Fatalf("RegisterAddr of address 0: %v, want ErrInvalidArgument", err)
	}
	if err := unix.Mprotect(mem, unix.PROT_READ|unix.PROT_WRITE); err != nil {
		t.Fatal(err)
	}
	mr, err := r.dev.RegisterAddr(addr, uint64(len(mem)))
	if err != nil {
		t.Fatal(err)
	}
	if mr.Addr() != addr || mr.Len() != uint64(len(mem)) {
		t.Fatalf("region at %#x of %d bytes, want %#x and %d", mr.Addr(), mr.Len(), addr, len(mem))
	}
	if err := mr.Close(); err != nil {
		t.Fatal(err)
	}
}

// The reader's READs in flight are bounded by the holder's responder
// resources, not by its own depth: a holder offering 2 takes a reader of
// depth 16 reading 64 ops at once.
func TestReadDepthBoundByHolder(t *testing.T) {
	r := newReader(t, rdma.QPOptions{SendDepth: 64, ReadDepth: 16})
	h := startHolder(t, "HOLDER_READ_DEPTH=2")
	h.connect(t, r.qp)
	if err := r.qp.Read(readCtx(t), r.scatteredOps(h, 64, 4096, 1)); err != nil {
		t.Fatalf("read with depth 16 from a holder of depth 2: %v", err)
	}
	r.verify(t, 64, 4096, 1)
}

// After Read returns, nothing lands in its buffer: a read whose context
// ends while the holder is stalled returns only once the device has let go
// of the buffer, and the holder coming back later writes nothing into it.
func TestNothingLandsAfterReadReturns(t *testing.T) {
	t.Setenv("SOFTVERBS_TIMEOUT_CAP_MS", "600000")
	r := newReader(t, rdma.QPOptions{SendDepth: 8, Timeout: 22})
	h := startHolder(t)
	h.connect(t, r.qp)
	setFaults(t, "stall=1")
	clear(r.buf)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := r.qp.Read(ctx, r.scatteredOps(h, 20, 4096, 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled read: %v, want the context's deadline", err)
	}
	os.WriteFile(control, nil, 0o644)
	// The stall is over: a request still queued would now be answered.
	// Watch the buffer for a second (an assertion that nothing happens).
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for until := time.Now().Add(time.Second); time.Now().Before(until); <-tick.C {
		for i, b := range r.buf {
			if b != 0 {
				t.Fatalf("byte %d of the buffer became %#x after Read returned", i, b)
			}
		}
	}
}
