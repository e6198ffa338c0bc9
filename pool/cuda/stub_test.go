//go:build !cgo || !linux

package cuda_test

import (
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/pool/cuda"
)

// Without cgo the binding cannot load a driver: Open says so with
// ErrNotSupported, whatever the path, and the caller runs on host memory.
func TestStubNotSupported(t *testing.T) {
	for _, path := range []string{"", "libcuda.so.1", "/nonexistent"} {
		d, err := cuda.Open(cuda.Config{Path: path})
		if d != nil || !errors.Is(err, cuda.ErrNotSupported) {
			t.Errorf("Open(%q) = %v, %v; want ErrNotSupported", path, d, err)
		}
	}
}
