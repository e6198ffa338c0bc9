package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// binaryPackage is the agent's command, by import path, so that it builds
// from any directory of the module.
const binaryPackage = "github.com/kvfabric/kvfabric/cmd/kvfabric"

// BuildBinary builds the kvfabric binary with the go command into a new
// temporary directory and returns its path; remove deletes the directory.
// It must run inside the module (a test of it, or the repository).
func BuildBinary(ctx context.Context) (bin string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "kvfabric-bin")
	if err != nil {
		return "", nil, fmt.Errorf("testbed: %w", err)
	}
	remove = func() { os.RemoveAll(dir) }
	bin = filepath.Join(dir, "kvfabric")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, binaryPackage).CombinedOutput(); err != nil {
		remove()
		return "", nil, fmt.Errorf("testbed: build kvfabric (inside the repository, or give a binary): %v\n%s", err, out)
	}
	return bin, remove, nil
}

// MainWithBinary is a TestMain that builds the binary into *bin, then runs
// the tests (run, testing.M's Run), removes the binary and exits with
// their code: testbed.MainWithBinary(&bin, m.Run).
//
// KVF_TEST_BIN names a binary built beforehand instead (a machine
// without Go: make gpu-check-build). Not KVFABRIC_*: the agents inherit the
// environment and refuse variables of that prefix they do not know.
func MainWithBinary(bin *string, run func() int) {
	if prebuilt := os.Getenv("KVF_TEST_BIN"); prebuilt != "" {
		*bin = prebuilt
		os.Exit(run())
	}
	b, remove, err := BuildBinary(context.Background())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*bin = b
	code := run()
	remove()
	os.Exit(code)
}
