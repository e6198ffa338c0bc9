//go:build cgo && linux

package cuda_test

import (
	"os/exec"
	"strings"
	"testing"
)

// The !cgo stubs are what CGO_ENABLED=0 builds get; make test runs with
// cgo, so this runs their tests in a build without it.
func TestStubsWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the packages again without cgo; skipped with -short")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command to build without cgo: %v", err)
	}
	cmd := exec.Command(goBin, "test", "-count=1", "-run", "Stub", ".", "./discover")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("CGO_ENABLED=0 go test: %v\n%s", err, out)
	}
	if strings.Count(string(out), "ok ") != 2 || strings.Contains(string(out), "no tests to run") {
		t.Errorf("stub tests did not both run:\n%s", out)
	}
	t.Logf("%s", out)
}
