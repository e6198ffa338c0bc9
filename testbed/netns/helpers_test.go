package netns

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/testbed"
)

var (
	long   = flag.Bool("kvfabric.long", false, "run the long scenarios (8-node partition held 120 s, many loops)")
	outDir = flag.String("testbed.out", "", "directory for the scenarios' JSON records (default: the test's temporary directory)")
	bin    string
)

// TestMain builds the agent binary the clusters run.
func TestMain(m *testing.M) {
	testbed.MainWithBinary(&bin, m.Run)
}

var model = layout.ModelConfig{Layers: 8, KVHeads: 8, HeadDim: 64, DType: layout.DTypeBF16}

// eng is an engine whose blocks are 256 KiB (16 tokens).
func eng(name string, slots int) client.Engine { return engTP(name, 1, slots) }

// engTP is eng at TP size tp.
func engTP(name string, tp, slots int) client.Engine {
	return client.Engine{Name: name, Model: model, TPSize: tp, PageSize: 16, Order: layout.HND, Slots: slots}
}

const blockBytes = 8 * 8 * 64 * 2 * 2 * 16

// start starts a namespace cluster that t's cleanup removes, or skips t
// where namespaces cannot be made here.
func start(t *testing.T, opts Options) *Cluster {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("namespace clusters cannot run here: %v", err)
	}
	opts.Bin = bin
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("%s log:\n%s", n.Name, n.Log())
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		for _, ns := range leftovers(t) {
			t.Errorf("namespace %s left behind", ns)
		}
	})
	return c
}

// leftovers lists the namespaces this process still has.
func leftovers(t *testing.T) []string {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Errorf("ip netns list: %v", err)
		return nil
	}
	var ns []string
	for _, l := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(l), " ")
		// The tests do not run in parallel: after a Close, any namespace
		// of this process is left over.
		if strings.HasPrefix(name, fmt.Sprintf("%s%d-", nsPrefix, os.Getpid())) {
			ns = append(ns, name)
		}
	}
	return ns
}

// view is what node n sees: alive members and blocks indexed per member.
type view struct {
	alive  map[string]bool
	blocks map[string]uint64
	leases uint64
}

func look(n *testbed.Node) (view, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	cl, err := n.Client(ctx)
	if err != nil {
		return view{}, err
	}
	defer cl.Close()
	s, err := cl.Status(ctx)
	if err != nil {
		return view{}, err
	}
	v := view{alive: map[string]bool{}, blocks: map[string]uint64{}, leases: s.Leases}
	for _, m := range s.Members {
		if m.State == "alive" {
			v.alive[m.Node] = true
			v.blocks[m.Node] = m.Blocks
		}
	}
	return v, nil
}

func (v view) total() uint64 {
	var s uint64
	for _, b := range v.blocks {
		s += b
	}
	return s
}

// variant names the run for its record.
func variant() string {
	if *long {
		return "long"
	}
	return "short"
}

// save writes r where -testbed.out says, or into t's temporary
// directory, and logs the path.
func save(t *testing.T, r *testbed.ScenarioRecord) {
	t.Helper()
	dir := *outDir
	if dir == "" {
		dir = t.TempDir()
	}
	r.Passed = !t.Failed()
	p, err := r.WriteFile(dir)
	if err != nil {
		t.Error(err)
		return
	}
	t.Logf("record: %s", p)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
