package pool

import (
	"os/exec"
	"strings"
	"testing"
)

// The pool may import layout, the standard library and golang.org/x/sys
// (and what layout brings), never transfer, membership or fabric: see the
// import table in DESIGN.md.
func TestForbiddenImports(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go command is not on PATH; cannot list dependencies:", err)
	}
	out, err := exec.Command(gobin, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	allowed := []string{
		"github.com/kvfabric/kvfabric/pool",
		"github.com/kvfabric/kvfabric/layout",
		"golang.org/x/sys/",
		// layout's own dependencies.
		"github.com/zeebo/xxh3",
		"github.com/klauspost/cpuid/",
		"google.golang.org/protobuf/",
	}
	n := 0
	for _, dep := range strings.Fields(string(out)) {
		n++
		ok := false
		for _, a := range allowed {
			if dep == strings.TrimSuffix(a, "/") || strings.HasPrefix(dep, a) ||
				strings.HasPrefix(dep, a+"/") {
				ok = true
			}
		}
		if !ok {
			t.Errorf("pool depends on %s, which DESIGN.md does not allow", dep)
		}
	}
	if n == 0 {
		t.Fatal("go list found no dependencies at all, not even the package itself")
	}
}
