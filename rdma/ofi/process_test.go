//go:build cgo && linux

package ofi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfabric/kvfabric/internal/wait"
)

// The test binary runs as a second process when envChild names a role:
// "holder" registers memory and serves it until its standard input closes;
// "reader" reads a holder's region in a loop until killed.
const (
	envChild    = "KVFABRIC_OFI_CHILD"
	envProvider = "KVFABRIC_OFI_PROVIDER"
	envSize     = "KVFABRIC_OFI_SIZE"
	envSeed     = "KVFABRIC_OFI_SEED"
	envPeer     = "KVFABRIC_OFI_PEER" // reader: "name addr len key" as the holder prints
)

func childMain() int {
	prov := os.Getenv(envProvider)
	l, err := Load(Config{Provider: prov, Node: nodeFor(prov)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer l.Close()
	e, err := l.Open()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer e.Close()
	size, _ := strconv.Atoi(os.Getenv(envSize))
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_SHARED)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := e.Register(uintptr(unsafe.Pointer(&mem[0])), uint64(size))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	switch os.Getenv(envChild) {
	case "closed":
		// The region's description before and after its endpoint closed
		// (which frees the registration).
		before := r.Remote()
		e.Close()
		after := r.Remote()
		fmt.Printf("ready %d %d\n", before.Key, after.Key)
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "holder":
		seed, _ := strconv.Atoi(os.Getenv(envSeed))
		fill(mem, byte(seed))
		rem := r.Remote()
		defer e.Serve(time.Now().Add(time.Hour))()
		fmt.Printf("ready %s %d %d %d\n", hex.EncodeToString(e.Name()), rem.Addr, rem.Len, rem.Key)
		io.Copy(io.Discard, os.Stdin)
		return 0
	case "reader":
		name, rem, err := parsePeer(os.Getenv(envPeer))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		p, err := e.AddPeer(name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		fmt.Println("ready")
		for {
			seg := Segment{Len: min(uint64(size), rem.Len), Remote: rem}
			if err := e.Read(context.Background(), p, r, []Segment{seg}); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		}
	}
	return 2
}

func parsePeer(s string) ([]byte, Remote, error) {
	f := strings.Fields(s)
	if len(f) != 4 {
		return nil, Remote{}, fmt.Errorf("peer line %q: want name addr len key", s)
	}
	name, err := hex.DecodeString(f[0])
	if err != nil {
		return nil, Remote{}, err
	}
	var v [3]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
			return nil, Remote{}, err
		}
	}
	return name, Remote{Addr: v[0], Len: v[1], Key: v[2]}, nil
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	line  string
}

// startChild runs the test binary as role and waits for its "ready" line.
func startChild(t *testing.T, role, prov string, size int, seed byte, peer string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+role, envProvider+"="+prov,
		envSize+"="+strconv.Itoa(size), envSeed+"="+strconv.Itoa(int(seed)), envPeer+"="+peer)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
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
	c := &child{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
		// A child killed leaves its shm regions in /dev/shm.
		left, _ := filepath.Glob(fmt.Sprintf("/dev/shm/%s%d-*", ShmPrefix, cmd.Process.Pid))
		for _, f := range left {
			os.Remove(f)
		}
	})
	lines := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		lines <- strings.TrimSpace(line)
	}()
	select {
	case c.line = <-lines:
		if !strings.HasPrefix(c.line, "ready") {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%s child: %q; stderr: %s", role, c.line, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s child not ready in 60 s; stderr: %s", role, stderr.String())
	}
	return c
}

func (c *child) peer(t *testing.T) ([]byte, Remote) {
	t.Helper()
	name, rem, err := parsePeer(strings.TrimPrefix(c.line, "ready "))
	if err != nil {
		t.Fatal(err)
	}
	return name, rem
}

// TestReadAcrossProcesses: a holder in another process, every byte checked.
func TestReadAcrossProcesses(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			const size = 16 << 20
			h := startChild(t, "holder", prov, size, 0x77, "")
			name, rem := h.peer(t)
			l := loadLibrary(t, prov)
			e := openEndpoint(t, l)
			p, err := e.AddPeer(name)
			if err != nil {
				t.Fatal(err)
			}
			dst := mapped(t, size)
			dstReg := register(t, e, dst)
			// Two halves swapped, in pieces, so offsets matter.
			var segs []Segment
			for off := uint64(0); off < size/2; off += 1 << 20 {
				segs = append(segs, Segment{LocalOff: off, RemoteOff: size/2 + off, Len: 1 << 20, Remote: rem})
				segs = append(segs, Segment{LocalOff: size/2 + off, RemoteOff: off, Len: 1 << 20, Remote: rem})
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := e.Read(ctx, p, dstReg, segs); err != nil {
				t.Fatal(err)
			}
			want := make([]byte, size)
			fill(want, 0x77)
			if !bytes.Equal(dst[:size/2], want[size/2:]) || !bytes.Equal(dst[size/2:], want[:size/2]) {
				t.Fatal("bytes differ")
			}
		})
	}
}

// TestHolderKilledMidRead: a holder that dies during reads ends them in an
// error within the read's deadline; no read returns success with bytes
// other than the holder's.
func TestHolderKilledMidRead(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			const size = 64 << 20
			const grace = 2 * time.Second
			h := startChild(t, "holder", prov, size, 0x31, "")
			name, rem := h.peer(t)
			l, err := Load(Config{Provider: prov, Node: nodeFor(prov), FlushGrace: grace})
			if err != nil {
				t.Fatalf("libfabric is needed for these tests (make test-deps): %v", err)
			}
			t.Cleanup(func() { l.Close() })
			e := openEndpoint(t, l)
			p, err := e.AddPeer(name)
			if err != nil {
				t.Fatal(err)
			}
			dst := mapped(t, size)
			dstReg := register(t, e, dst)
			want := make([]byte, size)
			fill(want, 0x31)
			var segs []Segment
			for off := uint64(0); off < size; off += 256 << 10 {
				segs = append(segs, Segment{LocalOff: off, RemoteOff: off, Len: 256 << 10, Remote: rem})
			}
			killed := make(chan struct{})
			go func() {
				time.Sleep(100 * time.Millisecond)
				h.cmd.Process.Kill()
				close(killed)
			}()
			const deadline = 10 * time.Second
			for {
				clear(dst)
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				start := time.Now()
				err := e.Read(ctx, p, dstReg, segs)
				took := time.Since(start)
				cancel()
				if err == nil {
					// Reads until (and just after) the kill succeed whole.
					if !bytes.Equal(dst, want) {
						t.Fatal("a read that succeeded brought other bytes than the holder's")
					}
					continue
				}
				if took > deadline+grace+10*time.Second {
					t.Fatalf("the read failed after %v, past its deadline of %v and the flush grace", took, deadline)
				}
				select {
				case <-killed:
				default:
					t.Fatalf("a read failed before the holder was killed: %v", err)
				}
				t.Logf("after the kill: %v (in %v)", err, took.Round(time.Millisecond))
				return
			}
		})
	}
}

// TestReaderKilled: a reader that dies mid-read leaves the holder serving
// others.
func TestReaderKilled(t *testing.T) {
	for _, prov := range providers {
		t.Run(prov, func(t *testing.T) {
			const size = 32 << 20
			l := loadLibrary(t, prov)
			holder := openEndpoint(t, l)
			src := mapped(t, size)
			fill(src, 0x44)
			srcReg := register(t, holder, src)
			rem := srcReg.Remote()
			line := fmt.Sprintf("%s %d %d %d", hex.EncodeToString(holder.Name()), rem.Addr, rem.Len, rem.Key)
			r := startChild(t, "reader", prov, size, 0, line)
			time.Sleep(200 * time.Millisecond) // let it read a few times
			r.cmd.Process.Kill()
			r.cmd.Wait()

			reader := openEndpoint(t, l)
			dst := mapped(t, size)
			dstReg := register(t, reader, dst)
			p, err := reader.AddPeer(holder.Name())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := reader.Read(ctx, p, dstReg, []Segment{{Len: size, Remote: rem}}); err != nil {
				t.Fatalf("a read after another reader died: %v", err)
			}
			if !bytes.Equal(dst, src) {
				t.Fatal("bytes differ")
			}
		})
	}
}

// TestReadFromGonePeer: a read from a holder that died before the reader
// connected to it fails with ErrUnreachable after the connect timeout
// (tcp;ofi_rxm would keep trying to connect until the read's context
// ended), and the endpoint reads on: a live holder is read whole after it.
func TestReadFromGonePeer(t *testing.T) {
	const size = 1 << 20
	const timeout = 500 * time.Millisecond
	gone := startChild(t, "holder", "tcp", size, 0x21, "")
	name, rem := gone.peer(t)
	gone.cmd.Process.Kill()
	gone.cmd.Wait()
	l, err := Load(Config{Provider: "tcp", Node: nodeFor("tcp"), ConnectTimeout: timeout})
	if err != nil {
		t.Fatalf("libfabric is needed for these tests (make test-deps): %v", err)
	}
	t.Cleanup(func() { l.Close() })
	e := openEndpoint(t, l)
	p, err := e.AddPeer(name)
	if err != nil {
		t.Fatal(err)
	}
	dst := mapped(t, size)
	dstReg := register(t, e, dst)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	goneErr := e.Read(ctx, p, dstReg, []Segment{{Len: size, Remote: rem}})
	took := time.Since(start)
	if !errors.Is(goneErr, ErrUnreachable) {
		t.Fatalf("read from a holder that is gone: %v after %v, want ErrUnreachable", goneErr, took)
	}
	if took < timeout || took > timeout+10*time.Second {
		t.Errorf("the read failed after %v, want after the connect timeout of %v (and within 10 s of it)", took, timeout)
	}
	h := startChild(t, "holder", "tcp", size, 0x22, "")
	name, rem = h.peer(t)
	if p, err = e.AddPeer(name); err != nil {
		t.Fatal(err)
	}
	if err := e.Read(ctx, p, dstReg, []Segment{{Len: size, Remote: rem}}); err != nil {
		t.Fatalf("read from a live holder after: %v", err)
	}
	want := make([]byte, size)
	fill(want, 0x22)
	if !bytes.Equal(dst, want) {
		t.Fatal("bytes differ")
	}
	t.Logf("gone holder: %v after %v", goneErr, took.Round(time.Millisecond))
}

// A region describes itself the same after its endpoint closed, which
// frees the registration: its key is read once, at registration, never
// from freed memory (malloc told to fill what it frees).
func TestRegionRemoteAfterEndpointClosed(t *testing.T) {
	t.Setenv("MALLOC_PERTURB_", "170")
	t.Setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=0")
	for _, prov := range []string{"tcp", "shm"} {
		c := startChild(t, "closed", prov, 1<<16, 0, "")
		var before, after uint64
		if _, err := fmt.Sscanf(c.line, "ready %d %d", &before, &after); err != nil {
			t.Fatalf("%s: %q: %v", prov, c.line, err)
		}
		if before != after {
			t.Fatalf("%s: the region's key was %#x, %#x after its endpoint closed", prov, before, after)
		}
	}
}

// Reads waiting for a request slot end with ErrClosed when their endpoint
// closes, not at their deadline: Close returns no slot to them. The
// holder is stopped, so that a first read keeps every slot in flight.
func TestCloseEndsReadsWaitingForASlot(t *testing.T) {
	const size = 1 << 20
	h := startChild(t, "holder", "tcp", size, 0x52, "")
	name, rem := h.peer(t)
	l := loadLibrary(t, "tcp")
	e := openEndpoint(t, l)
	p, err := e.AddPeer(name)
	if err != nil {
		t.Fatal(err)
	}
	dst := mapped(t, size)
	reg := register(t, e, dst)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.Read(ctx, p, reg, []Segment{{Len: 4096, Remote: rem}}); err != nil {
		t.Fatal(err) // connected
	}
	if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.cmd.Process.Signal(syscall.SIGCONT) })
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// More requests than slots: 64 bytes every 128, none adjacent.
	var segs []Segment
	for i := range uint64(cap(e.free) + 100) {
		segs = append(segs, Segment{LocalOff: i * 128, RemoteOff: i * 128, Len: 64, Remote: rem})
	}
	errs := make(chan error, 2)
	go func() { errs <- e.Read(ctx, p, reg, segs) }()
	wait.For(t, 20*time.Second, "the first read holds every slot", func() error {
		if n := len(e.free); n > 0 {
			return fmt.Errorf("%d slots free", n)
		}
		return nil
	})
	go func() {
		errs <- e.Read(ctx, p, reg, []Segment{{LocalOff: size - 64, RemoteOff: size - 64, Len: 64, Remote: rem}})
	}()
	// Until both wait: two goroutines in read's selects.
	wait.For(t, 20*time.Second, "both reads wait", func() error {
		buf := make([]byte, 1<<20)
		n := 0
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, " [select]:\n") && strings.Contains(g, "ofi.(*Endpoint).read(") {
				n++
			}
		}
		if n < 2 {
			return fmt.Errorf("%d reads wait", n)
		}
		return nil
	})
	e.Close()
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrClosed) {
			t.Fatalf("a read when its endpoint closed: %v, want ErrClosed (not its deadline)", err)
		}
	}
}
