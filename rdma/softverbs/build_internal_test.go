package softverbs

import (
	"errors"
	"os/exec"
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
