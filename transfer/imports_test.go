package transfer

import (
	"os/exec"
	"strings"
	"testing"
)

// TestForbiddenImports keeps the direction of imports in DESIGN.md true:
// transfer reaches memory through Handler, never through pool, and knows
// nothing of membership or the agent.
func TestForbiddenImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".", "./certs", "./transferpb").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, bad := range []string{"/pool", "/membership", "/fabric", "/cmd/"} {
			if strings.HasPrefix(dep, "github.com/kvfabric/kvfabric") && strings.Contains(dep, bad) {
				t.Errorf("transfer depends on %s", dep)
			}
		}
	}
}
