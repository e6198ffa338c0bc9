package index

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps the index embeddable: it depends on no other package of
// kvfabric (layout would be allowed) and on nothing outside the standard
// library.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/kvfabric/kvfabric/fabric/index" && p != "github.com/kvfabric/kvfabric/layout" {
			t.Errorf("index depends on %s", p)
		}
	}
}
