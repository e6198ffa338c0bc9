package netns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/testbed"
)

// The cluster runs, each agent named by its namespace's host name, over
// the bridge with its certificate and the gossip key; every fault step
// takes effect and its undo restores the cluster.
func TestClusterAndFaultSteps(t *testing.T) {
	c := start(t, Options{Nodes: 3})
	for i, n := range c.Nodes {
		if want := fmt.Sprintf("gpu-%02d", i+1); n.Name != want {
			t.Errorf("node %d named %q, want %q", i, n.Name, want)
		}
	}
	seesAlive := func(i int, want int) func() error {
		return func() error {
			v, err := look(c.Nodes[i])
			if err != nil {
				return err
			}
			if len(v.alive) != want {
				return fmt.Errorf("%s sees %d alive: %v", c.Nodes[i].Name, len(v.alive), v.alive)
			}
			return nil
		}
	}
	// Partition {0} from {1,2}: node 0 sees itself only, 1 and 2 see
	// each other; healing brings all three back, with nobody's help.
	if err := c.Partition([]int{0}, []int{1, 2}); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "gpu-01 alone", seesAlive(0, 1))
	wait.For(t, 60*time.Second, "gpu-02 without gpu-01", seesAlive(1, 2))
	if err := c.HealAll(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		wait.For(t, 60*time.Second, "healed", seesAlive(i, 3))
	}

	// SIGSTOP: the others declare it dead; SIGCONT: it comes back.
	if err := c.Pause(2); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "gpu-03 paused", seesAlive(0, 2))
	if err := c.Resume(2); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "gpu-03 resumed", seesAlive(0, 3))

	// SIGKILL and restart under the same name and certificate.
	if err := c.Kill(1); err != nil {
		t.Fatal(err)
	}
	if c.Nodes[1].Running() {
		t.Fatal("gpu-02 still running after Kill")
	}
	wait.For(t, 60*time.Second, "gpu-02 killed", seesAlive(0, 2))
	if err := c.Restart(ctxFor(t, 60*time.Second), 1); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 60*time.Second, "gpu-02 restarted", seesAlive(0, 3))

	// Bad steps are refused with what is wrong.
	if err := c.Partition([]int{0}, []int{0}); err == nil || !strings.Contains(err.Error(), "both sides") {
		t.Errorf("node on both sides: %v", err)
	}
	if err := c.Kill(3); err == nil || !strings.Contains(err.Error(), "index 3") {
		t.Errorf("kill of node 3 of 3: %v", err)
	}
	if err := c.Shape(0, Link{Loss: 1.5}); err == nil {
		t.Error("loss 1.5 accepted")
	}
}

// A rate limit caps what leaves the node (tbf); delay and loss need netem
// and are refused with the reason where the kernel has none, never
// ignored.
func TestShapeLink(t *testing.T) {
	// A peer timeout of 10 s: the holder moves its write deadline (half
	// the peer timeout) once per 4 MiB written to a stream, so with the
	// default 2 s a stream slower than 4 MiB/s fails while bytes still move.
	c := start(t, Options{Nodes: 2, ExtraArgs: []string{"--peer-timeout", "10s"}})
	err := c.Shape(0, Link{Delay: 20 * time.Millisecond, Loss: 0.01})
	switch {
	case errors.Is(err, ErrNotSupported):
		if !strings.Contains(err.Error(), "netem") {
			t.Errorf("refusal does not name netem: %v", err)
		}
		q, qerr := c.Qdiscs(0)
		if qerr != nil || strings.Contains(q, "netem") || strings.Contains(q, "tbf") {
			t.Errorf("refused step left a qdisc: %q %v", q, qerr)
		}
		t.Logf("delay/loss refused: %v", err)
	case err != nil:
		t.Fatal(err)
	default:
		q, _ := c.Qdiscs(0)
		if !strings.Contains(q, "netem") || !strings.Contains(q, "delay 20") {
			t.Errorf("netem applied but tc shows %q", q)
		}
	}

	// 200 blocks of 256 KiB (52 MB) at 100 Mbit/s take at least 4.2 s;
	// unshaped they take a tenth of that.
	const rate = 100_000_000
	if err := c.Shape(0, Link{RateBitsPerSec: rate}); err != nil {
		t.Fatal(err)
	}
	if q, _ := c.Qdiscs(0); !strings.Contains(q, "tbf") {
		t.Fatalf("no tbf on the link: %q", q)
	}
	w := testbed.Workload{Sequences: 1, Blocks: 200, PageSize: 16, Seed: 7}
	seqs := w.Hashes()
	ctx := ctxFor(t, 60*time.Second)
	p, err := testbed.Produce(ctx, c.Nodes[0], eng("producer", 256), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitBlocks(t, c, 1, "gpu-01", uint64(w.Unique()))
	start := time.Now()
	r, err := testbed.Consume(ctx, c.Nodes[1], eng("consumer", 256), seqs)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	floor := time.Duration(float64(w.Unique()*blockBytes*8) / rate * float64(time.Second) * 0.8)
	t.Logf("%d blocks (%d bytes) through a %d bit/s link in %v (floor %v)", r.Blocks, r.Bytes, rate, took, floor)
	if took < floor {
		t.Errorf("import took %v, under the link's floor %v: the rate limit is not applied", took, floor)
	}
	if err := c.ClearShape(0); err != nil {
		t.Fatal(err)
	}
	if q, _ := c.Qdiscs(0); strings.Contains(q, "tbf") {
		t.Errorf("tbf still there after ClearShape: %q", q)
	}
}

// waitBlocks waits until node i indexes want blocks of holder, and
// returns how long that took.
func waitBlocks(t *testing.T, c *Cluster, i int, holder string, want uint64) time.Duration {
	t.Helper()
	return waitIndexed(t, c, i, holder, want, false)
}

// waitBlocksAtLeast is waitBlocks for at least want blocks.
func waitBlocksAtLeast(t *testing.T, c *Cluster, i int, holder string, want uint64) time.Duration {
	t.Helper()
	return waitIndexed(t, c, i, holder, want, true)
}

func waitIndexed(t *testing.T, c *Cluster, i int, holder string, want uint64, atLeast bool) time.Duration {
	t.Helper()
	return wait.For(t, 30*time.Second, fmt.Sprintf("%s indexes %d blocks of %s", c.Nodes[i].Name, want, holder), func() error {
		v, err := look(c.Nodes[i])
		if err != nil {
			return err
		}
		if got := v.blocks[holder]; got != want && !(atLeast && got > want) {
			return fmt.Errorf("%d", got)
		}
		return nil
	})
}

// What a killed run left (its PID gone) is removed at the next start;
// what a running process owns (this one) is not.
func TestCleanStale(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("namespace clusters cannot run here: %v", err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	pid := dead.Process.Pid
	if alive(pid) {
		t.Skipf("pid %d was reused at once; cannot stand for a dead run", pid)
	}
	stale := fmt.Sprintf("%s%d-1-1", nsPrefix, pid)
	staleBridge := fmt.Sprintf("kvb%d.1", pid)
	mine := fmt.Sprintf("%s%d-999-1", nsPrefix, os.Getpid())
	t.Cleanup(func() {
		for _, ns := range []string{stale, mine} {
			exec.Command("ip", "netns", "del", ns).Run()
		}
		exec.Command("ip", "link", "del", staleBridge).Run()
	})
	for _, argv := range [][]string{
		{"ip", "netns", "add", stale}, {"ip", "netns", "add", mine},
		{"ip", "link", "add", staleBridge, "type", "bridge"},
	} {
		if err := run(argv...); err != nil {
			t.Fatal(err)
		}
	}
	if err := CleanStale(); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), stale) {
		t.Errorf("stale namespace %s still there", stale)
	}
	if !strings.Contains(string(out), mine) {
		t.Errorf("namespace %s of a running process removed", mine)
	}
	if err := exec.Command("ip", "link", "show", staleBridge).Run(); err == nil {
		t.Errorf("stale bridge %s still there", staleBridge)
	}
}

// Bad options and steps are refused with what is wrong, before anything
// is made.
func TestBadInputRefused(t *testing.T) {
	for _, tc := range []struct {
		desc string
		opts Options
		want string
	}{
		{"no binary", Options{Nodes: 2}, "Bin is required"},
		{"too many nodes", Options{Bin: "x", Nodes: 251}, "251 nodes: want 1..250"},
		{"negative nodes", Options{Bin: "x", Nodes: -1}, "-1 nodes"},
	} {
		_, err := Start(context.Background(), tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.desc, err, tc.want)
		}
	}
	atLimit := Options{Bin: "x", Nodes: MaxNodes}
	if err := atLimit.fill(); err != nil {
		t.Errorf("%d nodes (the limit) refused: %v", MaxNodes, err)
	}
	// Steps on a cluster of two (no agents needed to check arguments).
	c := &Cluster{ns: []string{"a", "b"}, faults: map[string]bool{}}
	for _, tc := range []struct {
		desc string
		err  error
		want string
	}{
		{"node past the end", c.Pause(2), "index 2: the cluster has 2 nodes"},
		{"negative node", c.Partition([]int{-1}, []int{0}), "index -1"},
		{"both sides", c.Partition([]int{0, 1}, []int{1}), "node 1 is on both sides"},
		{"loss past 1", c.Shape(0, Link{Loss: 1.01}), "loss must be 0..1"},
		{"negative delay", c.Shape(0, Link{Delay: -time.Millisecond}), "not negative"},
		{"jitter alone", c.Shape(0, Link{Jitter: time.Millisecond}), "jitter without a delay"},
		{"port past 65535", c.BlackholeUDP(0, 65536), "port 65536"},
		// At the limits the arguments pass; the made-up namespace fails.
		{"port 65535", c.BlackholeUDP(0, 65535), "ip -n a -batch"},
		{"loss 1", c.Shape(0, Link{Loss: 1}), "tc qdisc del on"},
		{"negative port", c.BlackholeUDP(0, -1), "port -1"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an error with %q", tc.desc, tc.err, tc.want)
		}
	}
}
