package membership

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps DESIGN.md's rule: membership imports memberlist and the
// standard library, never another package of kvfabric.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "github.com/kvfabric/kvfabric/") && p != "github.com/kvfabric/kvfabric/membership" {
			t.Errorf("membership depends on %s", p)
		}
	}
}
