package softverbs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Without rdma-core's headers Build says to install libibverbs-dev.
func TestBuildWithoutHeaders(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not installed")
	}
	sysroot = t.TempDir() // an empty root: no /usr/include
	t.Cleanup(func() { sysroot = "" })
	_, err := Build(t.TempDir())
	if !errors.Is(err, ErrNoHeaders) || !strings.Contains(err.Error(), "libibverbs-dev") {
		t.Fatalf("Build with no headers: %v, want ErrNoHeaders naming libibverbs-dev", err)
	}
}

// The library every package's tests share is cached in the user's cache
// directory, not left among temporary files; with no cache directory it
// falls back to one under os.TempDir.
func TestSharedDirIsACache(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/cache-root")
	if got, want := sharedDir(), filepath.Join("/cache-root", "kvfabric", "softverbs"); got != want {
		t.Fatalf("sharedDir with XDG_CACHE_HOME=/cache-root: %s, want %s", got, want)
	}
	t.Setenv("XDG_CACHE_HOME", "")
	t.Setenv("HOME", "")
	if got, want := sharedDir(), filepath.Join(os.TempDir(), "kvfabric-softverbs"); got != want {
		t.Fatalf("sharedDir with no cache directory: %s, want %s", got, want)
	}
}
