package buildinfo

import (
	"runtime"
	"testing"
)

// A test binary is a build of the work tree, by the running toolchain.
func TestVersions(t *testing.T) {
	if v := Version(); v == "" {
		t.Fatal("empty version")
	}
	if got := GoVersion(); got != runtime.Version() {
		t.Fatalf("GoVersion %q, want %q", got, runtime.Version())
	}
}
