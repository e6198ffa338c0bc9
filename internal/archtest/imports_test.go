package archtest

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/kvfabric/kvfabric"

// rule says which of our packages (by path prefix: "fabric" allows
// fabric/...) and which outside modules a package may import directly.
// "*" allows everything; the standard library is always allowed. tests
// lists what the package's tests may import besides.
type rule struct{ ours, theirs, tests []string }

// testHelpers are the packages any package's tests may use.
var testHelpers = []string{"internal/wait", "internal/kvtest", "internal/netbench", "internal/abitest"}

// rules holds the rule of each package, keyed by package path relative to
// the module. A package without a key of its own takes the rule of its
// nearest parent with one.
var rules = map[string]rule{
	"layout": {ours: []string{"layout"}, theirs: []string{"github.com/zeebo/xxh3", "google.golang.org/protobuf"}},
	"pool":   {ours: []string{"pool", "layout"}, theirs: []string{"golang.org/x/sys"}},
	// The disk tier checks every block it reads back against its xxh3.
	"pool/disk": {ours: []string{"pool", "layout"}, theirs: []string{"golang.org/x/sys", "github.com/zeebo/xxh3"}},
	// pool/cuda is pool's one cgo corner: the driver binding and its
	// stand-in.
	"pool/cuda": {ours: []string{"pool", "layout", "internal/pcitopo"}, theirs: []string{"C", "golang.org/x/sys"}},
	// GPU discovery through go-nvml, tested on its DGX H100 mock.
	"pool/cuda/discover": {ours: []string{"pool", "layout", "internal/pcitopo"}, theirs: []string{"github.com/NVIDIA/go-nvml"}},
	"rdma":               {ours: []string{"rdma", "internal/pcitopo"}, theirs: []string{"C"}, tests: []string{"golang.org/x/sys/unix"}},
	"transfer":           {ours: []string{"transfer", "layout", "rdma"}, theirs: []string{"github.com/quic-go/quic-go", "google.golang.org/protobuf", "golang.org/x/"}},
	"membership":         {ours: []string{"membership"}, theirs: []string{"github.com/hashicorp/memberlist", "google.golang.org/protobuf"}},
	"fabric":             {ours: []string{"*"}, theirs: []string{"*"}},
	"cmd":                {ours: []string{"*"}, theirs: []string{"*"}},
	"internal":           {ours: []string{"*"}, theirs: []string{"*"}},
	// PCI topology is read by rdma and pool/cuda, which import nothing
	// else of ours: it stays a leaf.
	"internal/pcitopo": {ours: []string{"internal/pcitopo"}},
	// The testbed drives agents through the engine client (fabric/client
	// and its wire types, whose layouts are layout's) and checks blocks
	// with internal/kvtest; never the agent itself. Its tests build the
	// stand-ins and, as an engine would, write GPU memory through the CUDA
	// binding.
	"testbed": {ours: []string{"testbed", "fabric/client", "fabric/fabricpb", "layout", "internal/kvtest", "internal/netbench"}, theirs: []string{"*"},
		tests: []string{"rdma/softverbs", "pool/cuda"}},
	// The control-plane simulation runs many nodes' membership and index
	// in one process, without agents.
	"testbed/sim": {ours: []string{"testbed", "membership", "fabric/index"}, theirs: []string{"*"}},
}

type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
}

// ruleFor returns the rule for a package path relative to the module and
// the key it came from.
func ruleFor(rel string) (rule, string, bool) {
	for key := rel; ; {
		if r, ok := rules[key]; ok {
			return r, key, true
		}
		i := strings.LastIndexByte(key, '/')
		if i < 0 {
			return rule{}, "", false
		}
		key = key[:i]
	}
}

// check returns every import of p its rule forbids, test imports
// included.
func check(p pkg) []string {
	rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
	r, key, ok := ruleFor(rel)
	if !ok {
		return []string{fmt.Sprintf("%s: no import rule covers it; add one here", p.ImportPath)}
	}
	var bad []string
	try := func(imp string, test bool) {
		if imp == p.ImportPath {
			return // an external test package importing the package it tests
		}
		what := "imports"
		if test {
			what = "tests import"
		}
		if ours, ok := strings.CutPrefix(imp, module+"/"); ok {
			if allowedPrefix(r.ours, ours) || test && (allowedPrefix(r.tests, ours) || allowedPrefix(testHelpers, ours)) {
				return
			}
			bad = append(bad, fmt.Sprintf("%s %s %s: %s may import only %v of ours", p.ImportPath, what, imp, key, r.ours))
			return
		}
		if isStd(imp) || allowedPrefix(r.theirs, imp) || test && allowedPrefix(r.tests, imp) {
			return
		}
		bad = append(bad, fmt.Sprintf("%s %s %s: not among %s's dependencies %v", p.ImportPath, what, imp, key, r.theirs))
	}
	for _, imp := range p.Imports {
		try(imp, false)
	}
	for _, imp := range append(append([]string(nil), p.TestImports...), p.XTestImports...) {
		try(imp, true)
	}
	return bad
}

func TestForbiddenImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", module+"/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	checked := 0
	used := map[string]bool{}
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		checked++
		if _, key, ok := ruleFor(strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")); ok {
			used[key] = true
		}
		for _, b := range check(p) {
			t.Error(b)
		}
	}
	if checked == 0 {
		t.Fatal("no package checked")
	}
	for key := range rules {
		if !used[key] {
			t.Errorf("rule %q covers no package: remove it", key)
		}
	}
}

// The checker itself finds each kind of forbidden edge.
func TestCheckFindsForbiddenEdges(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    pkg
		bad  bool
	}{
		{"allowed", pkg{ImportPath: module + "/pool", Imports: []string{"fmt", module + "/layout", "golang.org/x/sys/unix"}}, false},
		{"ours forbidden", pkg{ImportPath: module + "/pool", Imports: []string{module + "/fabric"}}, true},
		{"theirs forbidden", pkg{ImportPath: module + "/layout", Imports: []string{"github.com/quic-go/quic-go"}}, true},
		{"test import forbidden", pkg{ImportPath: module + "/pool", TestImports: []string{module + "/transfer"}}, true},
		{"external test import forbidden", pkg{ImportPath: module + "/rdma", XTestImports: []string{module + "/pool"}}, true},
		{"test helper allowed in tests", pkg{ImportPath: module + "/pool", TestImports: []string{module + "/internal/wait"}}, false},
		{"test helper not in production", pkg{ImportPath: module + "/pool", Imports: []string{module + "/internal/wait"}}, true},
		{"test-only dependency in production", pkg{ImportPath: module + "/rdma", Imports: []string{"golang.org/x/sys/unix"}}, true},
		{"nested package takes its own rule", pkg{ImportPath: module + "/pool/cuda", Imports: []string{"github.com/NVIDIA/go-nvml/pkg/nvml"}}, true},
		{"nested package takes its parent's rule", pkg{ImportPath: module + "/pool/cuda/softcuda", Imports: []string{"C"}}, false},
		{"leaf stays a leaf", pkg{ImportPath: module + "/internal/pcitopo", Imports: []string{module + "/rdma"}}, true},
		{"no rule", pkg{ImportPath: module + "/newfolder"}, true},
	} {
		if got := check(tc.p); (len(got) > 0) != tc.bad {
			t.Errorf("%s: check = %q, want forbidden %v", tc.name, got, tc.bad)
		}
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
