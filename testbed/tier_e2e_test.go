package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// runBin runs the kvfabric binary with args and returns its output.
func runBin(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errb strings.Builder
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.String(), errb.String(), err
}

// getAll imports hashes on node n with kvfabric get, 200 at a time into a
// block set of 256 slots, checking every element against put's pattern,
// and returns the holders the fetches name.
func getAll(t *testing.T, n *Node, hashes []string) string {
	t.Helper()
	var from strings.Builder
	for i := 0; i < len(hashes); i += 200 {
		run := hashes[i:min(i+200, len(hashes))]
		_, errs, err := runBin(t, "get", "--socket", n.Socket, "--slots", "256", "--verify", "--out", os.DevNull,
			"--hashes", strings.Join(run, ","))
		if err != nil || !strings.Contains(errs, fmt.Sprintf("verified %d blocks", len(run))) {
			t.Fatalf("get of blocks %d..%d on %s: %v: %s", i, i+len(run)-1, n.Name, err, errs)
		}
		from.WriteString(errs)
	}
	return from.String()
}

// tierBlocks is node n's disk tier: blocks held, and whether it has block
// sets left in memory.
func tierBlocks(n *Node) (blocks uint64, sets int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := n.Client(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	st, err := cl.Status(ctx)
	if err != nil {
		return 0, 0, err
	}
	if len(st.Tiers) != 1 {
		return 0, 0, fmt.Errorf("status shows %d tiers", len(st.Tiers))
	}
	for _, s := range st.BlockSets {
		if s.Engine == "kvfabric-put" {
			sets++
		}
	}
	return st.Tiers[0].Blocks, sets, nil
}

// An engine that stores far more than the host pool through a block set
// that fits leaves every block on its node, most on disk: a peer imports
// all of them byte for byte after the engine exited; the agent, killed
// with SIGKILL and restarted, finds them again, announces them, and a
// third node imports all of them from it alone.
//
// The figures of the design (put --generate 1600 --slots 256 on --pool
// host=128MiB --tier disk=DIR:2GiB: 400 MB of 256 KiB blocks, three times
// the pool) are used as they are, with --tier-in-flight 1: by default a
// put faster than the disk has blocks dropped rather than copied down (so
// that an engine never waits for the disk), and whether any is then
// depends on the machine's load, not on the tier.
func TestTierKeepsTheCacheAcrossRestart(t *testing.T) {
	const blocks = 1600
	tier, err := os.MkdirTemp("", "kvfabric-tier-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tier) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Options{Bin: bin, Nodes: 3, Pool: "host=128MiB", NodeArgs: func(i int) []string {
		if i == 0 {
			return []string{"--tier", "disk=" + tier + ":2GiB", "--block-set-grace", "1s", "--tier-in-flight", "1"}
		}
		return nil
	}})
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
	})
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]

	start := time.Now()
	out, errs, err := runBin(t, "put", "--socket", n1.Socket, "--generate", fmt.Sprint(blocks), "--slots", "256", "--json")
	if err != nil {
		t.Fatalf("put: %v: %s", err, errs)
	}
	var put struct{ Hashes []string }
	if err := json.Unmarshal([]byte(out), &put); err != nil || len(put.Hashes) != blocks {
		t.Fatalf("put --json: %d hashes (%v)", len(put.Hashes), err)
	}
	t.Logf("put of %d blocks through 256 slots: %v", blocks, time.Since(start).Round(time.Millisecond))
	// The engine has exited: once its set's grace ends, the set is kept
	// as a cache and every block it left in memory is copied down too.
	wait.For(t, 60*time.Second, "node1 keeps every block on disk once the engine's set is kept as a cache", func() error {
		b, sets, err := tierBlocks(n1)
		if err != nil || b != blocks {
			return fmt.Errorf("%d blocks on disk, %d sets of the engine left (%v)", b, sets, err)
		}
		return nil
	})
	waitIndexed(t, n2, "node1", blocks)
	start = time.Now()
	if got := getAll(t, n2, put.Hashes); !strings.Contains(got, "node1") {
		t.Fatalf("node2's imports name no fetch from node1: %s", got)
	}
	t.Logf("node2 imported and verified %d disk-held blocks: %v", blocks, time.Since(start).Round(time.Millisecond))

	// node2 leaves, so that node1 is the only holder; node1 crashes.
	if err := n2.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := n1.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	n1.Args = append(n1.Args, "--join", n3.Gossip)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel2()
	if err := c.StartNode(ctx2, 0); err != nil {
		t.Fatal(err)
	}
	if b, _, err := tierBlocks(n1); err != nil || b != blocks {
		t.Fatalf("after SIGKILL and a restart node1's tier holds %d blocks (%v), want %d", b, err, blocks)
	}
	waitIndexed(t, n3, "node1", blocks)
	start = time.Now()
	if got := getAll(t, n3, put.Hashes); !strings.Contains(got, "node1") || strings.Contains(got, "node2") {
		t.Fatalf("node3's imports: %s; want every fetch from node1", got)
	}
	t.Logf("node3 imported and verified %d blocks from the restarted node1: %v", blocks, time.Since(start).Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join(tier, "tier.json")); err != nil {
		t.Fatal(err)
	}
}

// An agent SIGKILLed while it copies blocks down restarts with every block
// whose copy completed, each byte-exact when restored; a copy cut short is
// never served.
func TestTierKilledWhileOffloading(t *testing.T) {
	tier, err := os.MkdirTemp("", "kvfabric-tier-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tier) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Options{Bin: bin, Nodes: 1, Pool: "host=128MiB",
		ExtraArgs: []string{"--tier", "disk=" + tier + ":2GiB"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", c.Nodes[0].Log())
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	n1 := c.Nodes[0]
	const blocks = 1600
	put := exec.Command(bin, "put", "--socket", n1.Socket, "--generate", fmt.Sprint(blocks), "--slots", "256", "--json")
	var out strings.Builder
	put.Stdout = &out
	if err := put.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- put.Wait() }()
	// Kill once a few hundred blocks are on disk, while more are copied.
	wait.For(t, 60*time.Second, "blocks copied down", func() error {
		b, _, err := tierBlocks(n1)
		if err != nil || b < 300 {
			return fmt.Errorf("%d on disk (%v)", b, err)
		}
		return nil
	})
	if err := n1.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	<-done // the put fails with its agent gone, or finished just before
	ctx2, cancel2 := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel2()
	if err := c.StartNode(ctx2, 0); err != nil {
		t.Fatal(err)
	}
	held, _, err := tierBlocks(n1)
	if err != nil || held < 300 {
		t.Fatalf("after SIGKILL mid-offload the tier holds %d blocks (%v), want the 300 or more seen before", held, err)
	}
	// Every block put generated, by hash: those on disk restore
	// byte-exact (put's pattern is keyed by the hash).
	tokens := putTokens(blocks, 1)
	h, _ := layout.NewHasher(16, layout.HashOptions{})
	cl, err := n1.Client(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	set, err := cl.Register(ctx2, client.Engine{Name: "reader", Model: layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16},
		TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	restored := 0
	for _, b := range h.Sequence(tokens) {
		refs, err := cl.Acquire(ctx2, set.ID, []uint64{b.Sequence})
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) == 0 {
			continue
		}
		if err := kvtest.Check(set.Layout, set.Ranks, int(refs[0].Slot), b.Sequence); err != nil {
			t.Fatalf("block %016x restored after SIGKILL: %v", b.Sequence, err)
		}
		restored++
		cl.Release(ctx2, set.ID, []uint32{refs[0].Slot})
	}
	if uint64(restored) != held {
		t.Fatalf("restored %d blocks byte-exact, the tier held %d", restored, held)
	}
	t.Logf("killed mid-offload: %d blocks on disk after the restart, all byte-exact", restored)
}

// putTokens are the tokens kvfabric put --generate n --seed seed makes.
func putTokens(n int, seed uint64) []uint32 {
	rng := rand.New(rand.NewPCG(seed, 0))
	tokens := make([]uint32, n*16)
	for i := range tokens {
		tokens[i] = rng.Uint32N(128000)
	}
	return tokens
}

// A byte flipped in a block's file on disk while the agent is down: the
// restarted agent finds the block, and the first read of it fails its
// checksum: the block is dropped with a log line and counted, never
// served; every other block restores byte-exact.
func TestTierCorruptBlockDropped(t *testing.T) {
	tier, err := os.MkdirTemp("", "kvfabric-tier-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tier) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := Start(ctx, Options{Bin: bin, Nodes: 1, Pool: "host=128MiB",
		ExtraArgs: []string{"--tier", "disk=" + tier + ":256MiB", "--block-set-grace", "1s"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", c.Nodes[0].Log())
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	n1 := c.Nodes[0]
	const blocks = 200
	if _, errs, err := runBin(t, "put", "--socket", n1.Socket, "--generate", fmt.Sprint(blocks), "--slots", "64", "--seed", "7"); err != nil {
		t.Fatalf("put: %v: %s", err, errs)
	}
	// The set is kept as a cache after put exits, its blocks copied down.
	wait.For(t, 60*time.Second, "every block on disk once put has exited", func() error {
		b, sets, err := tierBlocks(n1)
		if err != nil || b != blocks {
			return fmt.Errorf("%d blocks on disk, %d sets (%v)", b, sets, err)
		}
		return nil
	})
	if err := n1.Stop(syscall.SIGKILL, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// Slot 0 of the first data file holds the first block copied down.
	f, err := os.OpenFile(filepath.Join(tier, "blocks.000"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := f.ReadAt(b[:], 4000); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x01
	if _, err := f.WriteAt(b[:], 4000); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := c.StartNode(ctx, 0); err != nil {
		t.Fatal(err)
	}
	cl, err := n1.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	set, err := cl.Register(ctx, client.Engine{Name: "reader", Model: layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16},
		TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	h, _ := layout.NewHasher(16, layout.HashOptions{})
	restored := 0
	for _, blk := range h.Sequence(putTokens(blocks, 7)) {
		refs, err := cl.Acquire(ctx, set.ID, []uint64{blk.Sequence})
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) == 1 {
			if err := kvtest.Check(set.Layout, set.Ranks, int(refs[0].Slot), blk.Sequence); err != nil {
				t.Fatalf("block %016x served after a byte of the tier was flipped: %v", blk.Sequence, err)
			}
			restored++
			cl.Release(ctx, set.ID, []uint32{refs[0].Slot})
		}
	}
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if restored != blocks-1 || st.Tiers[0].ChecksumFailures != 1 || st.Tiers[0].Blocks != blocks-1 {
		t.Fatalf("after flipping a byte: %d of %d restored, tier %v; want all but one, one checksum failure", restored, blocks, st.Tiers[0])
	}
	if !strings.Contains(n1.FullLog(), "failed its checksum: dropped") {
		t.Fatal("no log line says the corrupt block was dropped")
	}
}
