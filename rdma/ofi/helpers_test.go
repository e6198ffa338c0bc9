//go:build cgo && linux

package ofi

import (
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// loadLibrary opens the system's libfabric, which make test-deps installs;
// its absence fails the test rather than passing it vacuously.
func loadLibrary(t testing.TB, provider string) *Library {
	t.Helper()
	l, err := Load(Config{Provider: provider, Node: nodeFor(provider)})
	if err != nil {
		t.Fatalf("libfabric is needed for these tests (apt-get install libfabric1, or make test-deps): %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func nodeFor(provider string) string {
	if provider == "tcp" {
		return "127.0.0.1"
	}
	return ""
}

// openEndpoint opens an endpoint that serves peers' reads (Serve) for the
// rest of the test: most tests read from it.
func openEndpoint(t testing.TB, l *Library) *Endpoint {
	t.Helper()
	e := openIdle(t, l)
	t.Cleanup(e.Serve(time.Now().Add(time.Hour)))
	return e
}

// openIdle opens an endpoint that does not serve.
func openIdle(t testing.TB, l *Library) *Endpoint {
	t.Helper()
	e, err := l.Open()
	if err != nil {
		t.Fatalf("open an endpoint: %v", err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// mapped returns n bytes of anonymous memory outside the Go heap, as pools
// are.
func mapped(t testing.TB, n int) []byte {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(b) })
	return b
}

func register(t testing.TB, e *Endpoint, b []byte) *Region {
	t.Helper()
	r, err := e.Register(uintptr(unsafe.Pointer(&b[0])), uint64(len(b)))
	if err != nil {
		t.Fatalf("register %d bytes: %v", len(b), err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// fill writes a pattern that differs at every byte offset and per seed.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = byte(i*7+i>>8) ^ seed
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		os.Exit(childMain())
	}
	os.Exit(m.Run())
}
