//go:build cgo && linux

package cuda_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/pool/cuda/softcuda"
)

// childEnv names what a re-executed test binary does instead of testing.
const childEnv = "KVFABRIC_CUDA_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode))
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildDir  string
	buildLib  string
	buildErr  error
)

// softLib returns a fresh copy of softcuda: each copy is a separate file,
// so the dynamic loader loads it apart from the others, with its own
// devices, allocations and SOFTCUDA_* settings (read at its cuInit).
func softLib(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "softcuda-")
		if buildErr == nil {
			buildLib, buildErr = softcuda.Build(buildDir)
		}
	})
	if buildErr != nil {
		t.Fatalf("build softcuda: %v", buildErr)
	}
	src, err := os.ReadFile(buildLib)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "libsoftcuda.so")
	if err := os.WriteFile(path, src, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// openSoft opens a fresh softcuda with the given SOFTCUDA_* settings.
func openSoft(t *testing.T, env ...string) (*cuda.Driver, string) {
	t.Helper()
	for _, name := range []string{"SOFTCUDA_DEVICES", "SOFTCUDA_MEMORY", "SOFTCUDA_PCI_BUS_IDS", "SOFTCUDA_DMABUF", "SOFTCUDA_COPY_DELAY_US", "SOFTCUDA_FAIL", "SOFTCUDA_IPC_OPEN"} {
		t.Setenv(name, "")
	}
	// Copies take time, as on a GPU, so that a missing synchronisation
	// shows; a test that measures ordering sets its own delay.
	t.Setenv("SOFTCUDA_COPY_DELAY_US", "200")
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	path := softLib(t)
	d, err := cuda.Open(cuda.Config{Path: path})
	if err != nil {
		t.Fatalf("open softcuda: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close driver: %v", err)
		}
	})
	return d, path
}

func closeT(t *testing.T, c io.Closer) {
	t.Helper()
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) ^ seed
	}
	return b
}

// child runs in a re-executed test binary; its exit code and stdout are
// what the parent checks.
func child(mode string) int {
	d, err := cuda.Open(cuda.Config{Path: os.Getenv("CHILD_LIB")})
	if err != nil {
		fmt.Println("open:", err)
		return 2
	}
	switch mode {
	case "ipc":
		// Open the parent's device memory, check the bytes it wrote, and
		// write our own after them.
		raw, err := hex.DecodeString(os.Getenv("CHILD_HANDLE"))
		var h cuda.IPCHandle
		if err != nil || len(raw) != len(h) {
			fmt.Println("bad handle")
			return 2
		}
		copy(h[:], raw)
		m, err := d.OpenIPCHandle(0, h)
		if err != nil {
			fmt.Println("open handle:", err)
			return 3
		}
		s, err := d.NewStream(0)
		if err != nil {
			fmt.Println(err)
			return 2
		}
		n, _ := strconv.Atoi(os.Getenv("CHILD_N"))
		got := make([]byte, n)
		if err := s.CopyDtoH(got, m.Addr()); err != nil {
			fmt.Println(err)
			return 2
		}
		if !bytes.Equal(got, pattern(n, 1)) {
			fmt.Println("child saw other bytes")
			return 4
		}
		if err := s.CopyHtoD(m.Addr()+uint64(n), pattern(n, 2)); err != nil {
			fmt.Println(err)
			return 2
		}
		fmt.Printf("child at %#x saw %d bytes\n", m.Addr(), n)
		if err := errors.Join(s.Close(), m.Close(), d.Close()); err != nil {
			fmt.Println(err)
			return 2
		}
		return 0
	case "fault":
		m, err := d.AllocDevice(0, 4096)
		if err != nil {
			fmt.Println(err)
			return 2
		}
		debug.SetPanicOnFault(true)
		addr := uintptr(m.Addr())
		defer func() {
			r := recover()
			if e, ok := r.(interface{ Addr() uintptr }); ok && e.Addr() == addr {
				fmt.Printf("fault at %#x\n", e.Addr())
				os.Exit(0)
			}
			fmt.Println("no fault:", r)
			os.Exit(5)
		}()
		p := *(**byte)(unsafe.Pointer(&addr))
		fmt.Println("read", *p)
		return 6
	}
	return 2
}

func runChild(t *testing.T, mode, lib string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "CHILD_LIB="+lib)
	cmd.Env = append(cmd.Env, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

type exitError struct{ code int }

func asExit(err error, out **exitError) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	*out = &exitError{code: ee.ExitCode()}
	return true
}

func addr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
