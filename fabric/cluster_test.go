package fabric_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// cluster starts n agents on 127.0.0.(i+1), sharing one development CA.
func cluster(t *testing.T, n int) []*fabric.Agent {
	t.Helper()
	return clusterWith(t, n, nil)
}

// clusterWith starts n agents as cluster does, letting configure change
// node i's configuration (i from 0) before it starts.
func clusterWith(t *testing.T, n int, configure func(i int, c *fabric.Config)) []*fabric.Agent {
	t.Helper()
	root, err := os.MkdirTemp("", "kvfc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	var agents []*fabric.Agent
	for i := range n {
		c := fabric.DefaultLocalConfig()
		c.NodeName = fmt.Sprintf("n%d", i+1)
		c.DataDir = filepath.Join(root, c.NodeName)
		c.DevCADir = filepath.Join(root, "ca")
		ip := fmt.Sprintf("127.0.0.%d", i+1)
		c.GossipAddr, c.PeerAddr, c.MetricsAddr = ip+":0", ip+":0", "off"
		c.Pools = []string{"host=64MiB"}
		c.PeerTimeout = time.Second
		c.Dumpable = true // softverbs and softcuda read agents' memory from other processes
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		if testing.Verbose() {
			c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
		if i > 0 {
			c.Join = []string{agents[0].GossipAddr()}
		}
		if configure != nil {
			configure(i, &c)
		}
		agents = append(agents, startAgent(t, c))
	}
	wait.For(t, 10*time.Second, "every agent sees every other", func() error {
		for _, a := range agents {
			if got := len(agentStatus(t, a).Members); got != n {
				return fmt.Errorf("%s sees %d members", a.NodeName(), got)
			}
		}
		return nil
	})
	return agents
}

func agentStatus(t *testing.T, a *fabric.Agent) *statusView {
	c := dial(t, a)
	s, err := c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	v := &statusView{Members: map[string]uint64{}}
	for _, m := range s.Members {
		if m.State == "alive" { // status also lists members gone lately
			v.Members[m.Node] = m.Blocks
		}
	}
	return v
}

type statusView struct{ Members map[string]uint64 }

var testModel = layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 16, DType: layout.DTypeBF16}

// produce registers blocks with content ids 1..n on a under TP tp, and
// returns their sequence hashes.
func produce(t *testing.T, a *fabric.Agent, tp int, order layout.KVOrder, n int) []uint64 {
	ctx := context.Background()
	c := dial(t, a)
	set, err := c.Register(ctx, client.Engine{Name: "producer", Model: testModel, TPSize: tp, PageSize: 16, Order: order, Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	slots, err := c.Allocate(ctx, set.ID, n)
	if err != nil {
		t.Fatal(err)
	}
	tokens := make([]uint32, 16*n)
	for i := range tokens {
		tokens[i] = uint32(i*7 + 3)
	}
	h, _ := layout.NewHasher(16, layout.HashOptions{})
	var hashes []uint64
	for i, b := range h.Sequence(tokens) {
		kvtest.Fill(set.Layout, set.Ranks, int(slots[i]), uint64(i+1))
		hashes = append(hashes, b.Sequence)
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
		t.Fatal(err)
	}
	return hashes
}

func TestClusterImport(t *testing.T) {
	agents := cluster(t, 3)
	n1, n2, n3 := agents[0], agents[1], agents[2]
	hashes := produce(t, n1, 4, layout.HND, 20)
	wait.For(t, 5*time.Second, "n2 and n3 index n1's blocks", func() error {
		for _, a := range []*fabric.Agent{n2, n3} {
			if got := agentStatus(t, a).Members["n1"]; got != 20 {
				return fmt.Errorf("%s indexes %d blocks of n1", a.NodeName(), got)
			}
		}
		return nil
	})
	ov, err := dial(t, n3).Lookup(context.Background(), hashes)
	// Every member is ranked (a router weighs load for all); the holder
	// of the whole prefix comes first.
	if err != nil || len(ov) != 3 || ov[0].Node != "n1" || ov[0].Blocks != 20 || ov[1].Blocks != 0 || ov[0].Score <= ov[1].Score {
		t.Fatalf("lookup: %v %v", ov, err)
	}

	// TP 4 HND -> TP 2 NHD, byte for byte.
	if from := consume(t, n2, 2, layout.NHD, hashes); len(from) != 1 || from[0] != "n1" {
		t.Fatalf("n2 imported from %v, want n1", from)
	}
	// n2 holds them now too.
	wait.For(t, 5*time.Second, "n3 indexes n2's imported blocks", func() error {
		if got := agentStatus(t, n3).Members["n2"]; got != 20 {
			return fmt.Errorf("n3 indexes %d blocks of n2", got)
		}
		return nil
	})
	// n1 leaves: n3 imports from n2 instead, under TP 8.
	if err := n1.Close(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 5*time.Second, "n3 drops n1", func() error {
		if _, ok := agentStatus(t, n3).Members["n1"]; ok {
			return fmt.Errorf("n1 still a member")
		}
		return nil
	})
	if from := consume(t, n3, 8, layout.HND, hashes); len(from) != 1 || from[0] != "n2" {
		t.Fatalf("n3 imported from %v, want n2", from)
	}
}

// Concurrent imports of the same blocks on one node move them once.
func TestConcurrentImportsShareTransfers(t *testing.T) {
	agents := cluster(t, 2)
	n1, n2 := agents[0], agents[1]
	hashes := produce(t, n1, 2, layout.HND, 24)
	wait.For(t, 5*time.Second, "n2 indexes n1's blocks", func() error {
		if got := agentStatus(t, n2).Members["n1"]; got != 24 {
			return fmt.Errorf("n2 indexes %d blocks of n1", got)
		}
		return nil
	})
	ctx := context.Background()
	c := dial(t, n2)
	set, err := c.Register(ctx, client.Engine{Name: "many", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	const importers = 6
	errs := make(chan error, importers)
	for range importers {
		go func() {
			resp, err := c.Import(ctx, set.ID, hashes)
			if err == nil && len(resp.Blocks) != len(hashes) {
				err = fmt.Errorf("%d of %d blocks: %s", len(resp.Blocks), len(hashes), resp.Error)
			}
			if err == nil {
				for i, b := range resp.Blocks {
					if err = kvtest.Check(set.Layout, set.Ranks, int(b.Slot), uint64(i+1)); err != nil {
						break
					}
				}
			}
			errs <- err
		}()
	}
	for range importers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	s, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	blockBytes := uint64(testModel.Layers * 2 * testModel.KVHeads * testModel.HeadDim * 2 * 16)
	if want := uint64(len(hashes)) * blockBytes; s.ImportBytes != want {
		t.Fatalf("%d importers moved %d bytes; the blocks are %d bytes once", importers, s.ImportBytes, want)
	}
}

// An import that brings nothing says why in its code: nobody holds the
// blocks, or this node has no room for them (which is not the holder's
// fault: it is not tried less after).
func TestImportErrorCodes(t *testing.T) {
	agents := cluster(t, 2)
	n1, n2 := agents[0], agents[1]
	hashes := produce(t, n1, 1, layout.HND, 8)
	wait.For(t, 5*time.Second, "n2 indexes n1's blocks", func() error {
		if got := agentStatus(t, n2).Members["n1"]; got != 8 {
			return fmt.Errorf("n2 indexes %d blocks of n1", got)
		}
		return nil
	})
	ctx := context.Background()
	c := dial(t, n2)
	small, err := c.Register(ctx, client.Engine{Name: "small", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.HND, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Import(ctx, small.ID, []uint64{42, 43}); code(err) != codes.NotFound {
		t.Errorf("import of blocks nobody holds: %v, want NotFound", err)
	}
	if _, err := c.Import(ctx, small.ID, hashes); code(err) != codes.ResourceExhausted {
		t.Errorf("import of 8 blocks into 4 slots: %v, want ResourceExhausted", err)
	}
	big, err := c.Register(ctx, client.Engine{Name: "big", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 16})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Import(ctx, big.ID, hashes)
	if err != nil || len(resp.Blocks) != 8 || len(resp.Fetches) != 1 || resp.Fetches[0].Node != "n1" {
		t.Fatalf("import after a local failure: %v %v", resp, err)
	}
}

// lockedWriter is a log destination that tests read while the agent
// writes: each write under mu.
type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
