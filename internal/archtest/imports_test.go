package archtest

import (
	"encoding/json"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kvfabric/kvfabric"

// rules says, per top-level folder, which of our packages (by path
// prefix: "fabric" allows fabric/...) and which outside modules its
// packages may import directly. "*" allows everything; the standard
// library is always allowed.
var rules = map[string]struct{ ours, theirs []string }{
	"layout": {[]string{"layout"}, []string{"github.com/zeebo/xxh3", "google.golang.org/protobuf"}},
	"pool":   {[]string{"pool", "layout"}, []string{"golang.org/x/sys"}},
	// pool/cuda is pool's one cgo corner (docs/architecture.md): the driver binding,
	// and GPU discovery through go-nvml.
	"pool/cuda":  {[]string{"pool", "layout"}, []string{"C", "golang.org/x/sys", "github.com/NVIDIA/go-nvml"}},
	"rdma":       {[]string{"rdma"}, []string{"C"}},
	"transfer":   {[]string{"transfer", "layout", "rdma"}, []string{"github.com/quic-go/quic-go", "google.golang.org/protobuf", "golang.org/x/"}},
	"membership": {[]string{"membership"}, []string{"github.com/hashicorp/memberlist", "google.golang.org/protobuf"}},
	"fabric":     {[]string{"*"}, []string{"*"}},
	"cmd":        {[]string{"*"}, []string{"*"}},
	"internal":   {[]string{"*"}, []string{"*"}},
	// The testbed drives agents through the engine client (fabric/client
	// and its wire types, whose layouts are layout's) and checks blocks
	// with internal/kvtest; never the agent itself.
	"testbed": {[]string{"testbed", "fabric/client", "fabric/fabricpb", "layout", "internal/kvtest", "internal/netbench"}, []string{"*"}},
	// The control-plane simulation runs many nodes' membership and index
	// in one process, without agents.
	"testbed/sim": {[]string{"testbed", "membership", "fabric/index"}, []string{"*"}},
}

type pkg struct {
	ImportPath string
	Imports    []string
}

func TestForbiddenImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked := 0
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		top, _, _ := strings.Cut(rel, "/")
		if rel == "pool/cuda" || strings.HasPrefix(rel, "pool/cuda/") {
			top = "pool/cuda"
		}
		if rel == "testbed/sim" || strings.HasPrefix(rel, "testbed/sim/") {
			top = "testbed/sim"
		}
		rule, ok := rules[top]
		if !ok {
			t.Errorf("%s: folder %q has no import rule; add it here and to docs/architecture.md's package table", p.ImportPath, top)
			continue
		}
		checked++
		for _, imp := range p.Imports {
			if ours, ok := strings.CutPrefix(imp, module+"/"); ok {
				if !allowedPrefix(rule.ours, ours) {
					t.Errorf("%s imports %s: %s may import only %v of ours", p.ImportPath, imp, top, rule.ours)
				}
				continue
			}
			if isStd(imp) {
				continue
			}
			if !allowedPrefix(rule.theirs, imp) {
				t.Errorf("%s imports %s: not among %s's dependencies %v", p.ImportPath, imp, top, rule.theirs)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no package checked")
	}
}

func allowedPrefix(list []string, s string) bool {
	for _, a := range list {
		if a == "*" || s == a || strings.HasPrefix(s, strings.TrimSuffix(a, "/")+"/") {
			return true
		}
	}
	return false
}

// isStd reports whether an import path is in the standard library: its
// first element has no dot.
func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".") && path != "C"
}
