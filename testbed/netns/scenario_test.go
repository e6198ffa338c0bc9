package netns

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/testbed"
)

// reader is one engine session on a node that imports and checks every
// byte of what it gets.
type reader struct {
	n   *testbed.Node
	cl  *client.Client
	set *client.BlockSet
}

func newReader(ctx context.Context, n *testbed.Node, e client.Engine) (*reader, error) {
	cl, err := n.Client(ctx)
	if err != nil {
		return nil, err
	}
	set, err := cl.Register(ctx, e)
	if err != nil {
		cl.Close()
		return nil, fmt.Errorf("%s: register: %w", n.Name, err)
	}
	return &reader{n: n, cl: cl, set: set}, nil
}

func (r *reader) Close() { r.cl.Close() }

// errCorrupt marks an import that returned a block whose bytes are wrong:
// never allowed, whatever the faults.
var errCorrupt = errors.New("corrupt block")

// imp imports hashes, checks every block, and records the call. remote
// says whether bytes crossed the network.
func (r *reader) imp(ctx context.Context, rec *testbed.ScenarioRecord, hashes []uint64) (remote bool, err error) {
	start := time.Now()
	resp, err := r.cl.Import(ctx, r.set.ID, hashes)
	var bytes uint64
	blocks := 0
	if err == nil {
		blocks = len(resp.Blocks)
		for _, f := range resp.Fetches {
			bytes += f.Bytes
			if f.Transport != "local" && f.Blocks > 0 {
				remote = true
			}
		}
		if len(resp.Blocks) != len(hashes) {
			err = fmt.Errorf("%d of %d blocks: %s", len(resp.Blocks), len(hashes), resp.Error)
		}
		for j, b := range resp.Blocks {
			if b.Hash != hashes[j] {
				err = fmt.Errorf("%w: block %d has hash %d, want %d", errCorrupt, j, b.Hash, hashes[j])
				break
			}
			if cerr := kvtest.Check(r.set.Layout, r.set.Ranks, int(b.Slot), hashes[j]); cerr != nil {
				err = fmt.Errorf("%w: block %d: %w", errCorrupt, j, cerr)
				break
			}
		}
	}
	rec.Import(start, r.n.Name, blocks, bytes, err)
	return remote, err
}

// sample records every node's view every interval until stop is closed.
func sample(c *Cluster, rec *testbed.ScenarioRecord, interval time.Duration, stop chan struct{}) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			for _, n := range c.Nodes {
				if v, err := look(n); err == nil {
					rec.Member(n.Name, len(v.alive), v.total())
				}
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return &wg
}

func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// hold waits d while checking, every second, that cond still holds: a
// fault held for a period, not a wait for something to happen.
func hold(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if err := cond(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(min(time.Second, time.Until(end)))
	}
}

// 8 nodes (4 in the short variant) each hold blocks; the cluster splits
// in two halves for 120 s (15 s), then heals with no operator action.
// Measured: how long each side takes to see the other gone, and how long
// after the heal every node sees every member alive and every block
// again (goal: under 60 s).
func TestPartitionHeal(t *testing.T) {
	nodes, held := 4, 15*time.Second
	if *long {
		nodes, held = 8, 120*time.Second
	}
	const per = 8 // blocks each node holds
	c := start(t, Options{Nodes: nodes})
	rec := testbed.NewScenarioRecord("partition-heal", variant(), nodes)
	defer save(t, rec)
	rec.Param("partition_s", held.Seconds())
	rec.Param("blocks_per_node", per)
	ctx := ctxFor(t, 10*time.Minute)
	for i, n := range c.Nodes {
		w := testbed.Workload{Sequences: 1, Blocks: per, PageSize: 16, Seed: uint64(100 + i)}
		p, err := testbed.Produce(ctx, n, eng("producer", 32), w.Hashes())
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
	}
	sees := func(members int, blocks uint64, of []int) func() error {
		return func() error {
			for _, i := range of {
				v, err := look(c.Nodes[i])
				if err != nil {
					return fmt.Errorf("%s: %w", c.Nodes[i].Name, err)
				}
				if len(v.alive) != members || v.total() != blocks {
					return fmt.Errorf("%s sees %d alive (%v) and %d blocks, want %d and %d",
						c.Nodes[i].Name, len(v.alive), v.alive, v.total(), members, blocks)
				}
			}
			return nil
		}
	}
	all := indexes(nodes)
	wait.For(t, 60*time.Second, "every node sees every block", sees(nodes, uint64(nodes*per), all))
	stop := make(chan struct{})
	sampler := sample(c, rec, 500*time.Millisecond, stop)
	defer func() { close(stop); sampler.Wait() }()

	a, b := all[:nodes/2], all[nodes/2:]
	rec.Step("partition", a, fmt.Sprintf("from %v", b))
	if err := c.Partition(a, b); err != nil {
		t.Fatal(err)
	}
	half := nodes / 2
	detect := wait.For(t, 90*time.Second, "each side sees only itself", func() error {
		if err := sees(half, uint64(half*per), a)(); err != nil {
			return err
		}
		return sees(half, uint64(half*per), b)()
	})
	rec.Figure("detect_s", detect.Seconds())
	t.Logf("partition seen by both sides after %v", detect)
	hold(t, held-detect, "the partition holds", func() error {
		return sees(half, uint64(half*per), all)()
	})

	rec.Step("heal", all, "")
	if err := c.HealAll(); err != nil {
		t.Fatal(err)
	}
	heal := wait.For(t, 3*time.Minute, "every node sees every member and block after the heal", sees(nodes, uint64(nodes*per), all))
	rec.Figure("heal_s", heal.Seconds())
	t.Logf("healed: every node sees %d members and %d blocks %v after the heal", nodes, nodes*per, heal)
	if heal > 60*time.Second {
		t.Errorf("heal took %v, over the 60 s goal", heal)
	}
}

// Holders killed (SIGKILL) while a reader imports one sequence after
// another: every import either brings every byte right or fails with an
// error, never a wrong block; imports fail over to the surviving holder,
// and the killed one rejoins when restarted.
func TestHolderKilledDuringImports(t *testing.T) {
	seqs, rounds := 12, 1
	if *long {
		seqs, rounds = 16, 4
	}
	c := start(t, Options{Nodes: 3, Pool: "host=512MiB"})
	rec := testbed.NewScenarioRecord("holder-killed", variant(), 3)
	defer save(t, rec)
	ctx := ctxFor(t, 10*time.Minute)
	rec.Param("sequences", float64(seqs))
	rec.Param("blocks_per_import", 16)
	var failed, served, afterKill int
	for round := range rounds {
		// New blocks each round: the reader holds the last round's.
		w := testbed.Workload{Sequences: seqs, Blocks: 16, PageSize: 16, Seed: uint64(3 + round)}
		hashes := w.Hashes()
		// Two full holders, gpu-01 and gpu-02.
		// A TP size per round and role: a block set per round, since an
		// agent reuses the block set of an engine of the same shape.
		tp := func(role int) int { return 1 << ((round + role) % 4) }
		p, err := testbed.Produce(ctx, c.Nodes[0], engTP("producer", tp(0), seqs*16), hashes)
		if err != nil {
			t.Fatal(err)
		}
		waitHolds(t, c, 1, hashes, c.Nodes[0].Name)
		if _, err := testbed.Consume(ctx, c.Nodes[1], engTP("copy", tp(1), seqs*16), hashes); err != nil {
			t.Fatal(err)
		}
		waitHolds(t, c, 2, hashes, c.Nodes[0].Name, c.Nodes[1].Name)
		r, err := newReader(ctx, c.Nodes[2], engTP("reader", tp(2), seqs*16))
		if err != nil {
			t.Fatal(err)
		}
		type outcome struct {
			at  time.Time
			err error
		}
		results := make(chan outcome, seqs)
		go func() {
			for _, h := range hashes {
				start := time.Now()
				_, err := r.imp(ctx, rec, h)
				results <- outcome{start, err}
			}
			close(results)
		}()
		// Kill whichever holder a lease shows serving.
		victim := waitLeased(t, c, []int{0, 1})
		killed := time.Now()
		rec.Step("kill", []int{victim}, "holder serving an import")
		if err := c.Kill(victim); err != nil {
			t.Fatal(err)
		}
		p.Close()
		for o := range results {
			switch {
			case errors.Is(o.err, errCorrupt):
				t.Fatalf("round %d: %v", round, o.err)
			case o.err != nil:
				failed++
				t.Logf("round %d: import failed: %v", round, o.err)
			default:
				served++
				if o.at.After(killed) {
					afterKill++
				}
			}
		}
		r.Close()
		rec.Step("restart", []int{victim}, "")
		if err := c.Restart(ctx, victim); err != nil {
			t.Fatal(err)
		}
		wait.For(t, 60*time.Second, "the killed holder is back", func() error {
			v, err := look(c.Nodes[2])
			if err != nil {
				return err
			}
			if !v.alive[c.Nodes[victim].Name] {
				return fmt.Errorf("%s not alive", c.Nodes[victim].Name)
			}
			return nil
		})
		// And sees the others: a restarted seed (gpu-01 has no seed of its
		// own) refuses a peer's calls until that peer is its member again,
		// and the next round's copy reads from it at once.
		back, cancel := context.WithTimeout(ctx, 60*time.Second)
		if err := c.WaitMembers(back, c.Nodes, len(c.Nodes)); err != nil {
			cancel()
			t.Fatal(err)
		}
		cancel()
	}
	rec.Figure("imports_ok", float64(served))
	rec.Figure("imports_failed", float64(failed))
	rec.Figure("imports_ok_after_kill", float64(afterKill))
	t.Logf("%d imports whole and checked (%d started after a kill), %d failed with an error", served, afterKill, failed)
	// The surviving holder has everything: imports fail over to it.
	if failed > 0 {
		t.Errorf("%d imports failed though another holder had every block", failed)
	}
}

// waitHolds waits until node i's index has every sequence of seqs whole
// on each of holders.
func waitHolds(t *testing.T, c *Cluster, i int, seqs [][]uint64, holders ...string) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("%s indexes the workload on %v", c.Nodes[i].Name, holders), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		cl, err := c.Nodes[i].Client(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		for k, h := range seqs {
			ov, err := cl.Lookup(ctx, h)
			if err != nil {
				return err
			}
			got := map[string]uint32{}
			for _, o := range ov {
				got[o.Node] = o.Blocks
			}
			for _, n := range holders {
				if got[n] != uint32(len(h)) {
					return fmt.Errorf("sequence %d: %s holds %d of %d", k, n, got[n], len(h))
				}
			}
		}
		return nil
	})
}

// waitLeased returns the first of nodes that holds a lease (serves an
// import).
func waitLeased(t *testing.T, c *Cluster, nodes []int) int {
	t.Helper()
	victim := -1
	wait.For(t, 60*time.Second, "a holder serving", func() error {
		for _, i := range nodes {
			if v, err := look(c.Nodes[i]); err == nil && v.leases > 0 {
				victim = i
				return nil
			}
		}
		return errors.New("no lease held")
	})
	return victim
}

// A reader killed (SIGKILL) while it imports, over many loops: the
// holder's leases are all released within the lease duration plus the
// expiry sweep, each time, and the reader comes back.
func TestReaderKilledDuringImports(t *testing.T) {
	loops := 3
	if *long {
		loops = 20
	}
	const (
		ttl   = 2 * time.Second // --lease-duration
		sweep = time.Second     // the pool's lease expiry interval
		// slack for two loaded cores: polling, process exit, the status call.
		slack = 3 * time.Second
	)
	// A slow link, so that every import is still moving when its reader
	// dies; a 10 s peer timeout so that the slow link alone does not fail
	// reads (see TestShapeLink).
	c := start(t, Options{Nodes: 2, Pool: "host=512MiB",
		ExtraArgs: []string{"--lease-duration", ttl.String(), "--peer-timeout", "10s"}})
	rec := testbed.NewScenarioRecord("reader-killed", variant(), 2)
	defer save(t, rec)
	rec.Param("loops", float64(loops))
	rec.Param("lease_duration_s", ttl.Seconds())
	rec.Param("expiry_interval_s", sweep.Seconds())
	ctx := ctxFor(t, 10*time.Minute)
	w := testbed.Workload{Sequences: 1, Blocks: 400, PageSize: 16, Seed: 4}
	hashes := w.Hashes()
	p, err := testbed.Produce(ctx, c.Nodes[0], eng("producer", 512), hashes)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := c.Shape(0, Link{RateBitsPerSec: 200_000_000}); err != nil {
		t.Fatal(err)
	}
	rec.Step("shape", []int{0}, "200 Mbit/s")
	var worst time.Duration
	for loop := range loops {
		waitBlocks(t, c, 1, c.Nodes[0].Name, uint64(w.Unique()))
		r, err := newReader(ctx, c.Nodes[1], eng("reader", 512))
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { _, err := r.imp(ctx, rec, hashes[0]); done <- err }()
		waitLeased(t, c, []int{0})
		rec.Step("kill", []int{1}, "reader importing")
		if err := c.Kill(1); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		wait.For(t, 30*time.Second, "the holder's leases released", func() error {
			v, err := look(c.Nodes[0])
			if err != nil {
				return err
			}
			if v.leases != 0 {
				return fmt.Errorf("%d leases held", v.leases)
			}
			return nil
		})
		released := time.Since(killed)
		worst = max(worst, released)
		rec.Figure(fmt.Sprintf("release_s_loop%02d", loop), released.Seconds())
		if released > ttl+sweep+slack {
			t.Errorf("loop %d: leases released %v after the reader died, over TTL %v + sweep %v (+%v slack)", loop, released, ttl, sweep, slack)
		}
		select {
		case err := <-done:
			if errors.Is(err, errCorrupt) {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the dead reader's import call did not return")
		}
		r.Close()
		rec.Step("restart", []int{1}, "")
		if err := c.Restart(ctx, 1); err != nil {
			t.Fatal(err)
		}
	}
	rec.Figure("release_s_max", worst.Seconds())
	t.Logf("%d loops: leases released at most %v after the reader was killed (TTL %v, sweep %v)", loops, worst, ttl, sweep)
}

// Every node restarted in turn (SIGTERM, start again) while readers on
// every node import: no import returns a wrong block; an import on a node
// that is up succeeds, since another holder always has every block; the
// cluster ends whole.
func TestRollingRestart(t *testing.T) {
	nodes, seqs := 3, 16
	if *long {
		nodes, seqs = 6, 96
	}
	c := start(t, Options{Nodes: nodes, Pool: "host=512MiB"})
	rec := testbed.NewScenarioRecord("rolling-restart", variant(), nodes)
	defer save(t, rec)
	ctx := ctxFor(t, 10*time.Minute)
	w := testbed.Workload{Sequences: seqs, Blocks: 8, SharedPrefix: 2, PageSize: 16, Seed: 5}
	hashes := w.Hashes()
	slots := seqs * 8
	// gpu-01 produces; gpu-02 copies: two full holders before the roll.
	p, err := testbed.Produce(ctx, c.Nodes[0], eng("producer", slots), hashes)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { p.Close() }()
	if _, err := testbed.Consume(ctx, c.Nodes[1], eng("cache", slots), hashes); err != nil {
		t.Fatal(err)
	}
	for i := range nodes {
		waitBlocks(t, c, i, c.Nodes[1].Name, uint64(w.Unique()))
	}

	var (
		mu       sync.Mutex
		down     = map[int]bool{}
		ok, fail int
		errsUp   []error
	)
	stop := make(chan struct{})
	var readers sync.WaitGroup
	for i := range nodes {
		readers.Add(1)
		go func() {
			defer readers.Done()
			k := 0
			for round := 0; ; round++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := newReader(ctx, c.Nodes[i], eng(fmt.Sprintf("reader%d", round), slots))
				if err != nil {
					time.Sleep(100 * time.Millisecond) // its agent is restarting
					continue
				}
				for ; ; k = (k + 1) % seqs {
					select {
					case <-stop:
						r.Close()
						return
					default:
					}
					wasDown := func() bool { mu.Lock(); defer mu.Unlock(); return down[i] }()
					_, err := r.imp(ctx, rec, hashes[k])
					mu.Lock()
					switch {
					case err == nil:
						ok++
					case errors.Is(err, errCorrupt):
						errsUp = append(errsUp, err)
					case wasDown || down[i]:
						fail++ // its own agent restarting
					default:
						errsUp = append(errsUp, fmt.Errorf("%s: %w", c.Nodes[i].Name, err))
					}
					mu.Unlock()
					if err != nil {
						break // a new session, as an engine reconnecting would
					}
					time.Sleep(20 * time.Millisecond) // an engine's pace, not a wait: leaves the cores to the restarts
				}
				r.Close()
			}
		}()
	}
	// Restart in turn; the restarted node takes a full copy back before
	// the next goes, so two holders always have every block.
	for i := range nodes {
		mu.Lock()
		down[i] = true
		mu.Unlock()
		rec.Step("stop", []int{i}, "SIGTERM")
		if err := c.Nodes[i].Stop(syscall.SIGTERM, 20*time.Second); err != nil {
			t.Fatal(err)
		}
		rec.Step("restart", []int{i}, "")
		if err := c.Restart(ctx, i); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			p.Close()
		}
		// A restarted agent serves before its index has the cluster's
		// blocks (it answers "no node holds them" until then): count that
		// time as part of its restart, and measure it.
		full := i - 1 // a full holder: gpu-02 at first, then the node restarted before
		if i == 0 {
			full = 1
		}
		fill := waitBlocks(t, c, i, c.Nodes[full].Name, uint64(w.Unique()))
		rec.Figure(fmt.Sprintf("index_fill_s_%s", c.Nodes[i].Name), fill.Seconds())
		t.Logf("%s restarted: its index had a full holder's blocks %v after it served", c.Nodes[i].Name, fill)
		mu.Lock()
		down[i] = false
		mu.Unlock()
		cp, err := newReader(ctx, c.Nodes[i], eng("cache", slots))
		if err != nil {
			t.Fatal(err)
		}
		defer cp.Close()
		for _, h := range hashes {
			if _, err := cp.imp(ctx, rec, h); err != nil {
				t.Fatalf("%s copying the workload back: %v", c.Nodes[i].Name, err)
			}
		}
		// Every node indexes the new full copy before the next one goes.
		for j := range nodes {
			waitBlocksAtLeast(t, c, j, c.Nodes[i].Name, uint64(w.Unique()))
		}
	}
	close(stop)
	readers.Wait()
	rec.Figure("imports_ok", float64(ok))
	rec.Figure("imports_failed_own_agent_down", float64(fail))
	rec.Figure("imports_failed_agent_up", float64(len(errsUp)))
	t.Logf("%d imports whole and checked, %d failed while their own agent restarted, %d failed otherwise", ok, fail, len(errsUp))
	for _, err := range errsUp {
		t.Errorf("import on an agent that was up: %v", err)
	}
	all := indexes(nodes)
	wait.For(t, 60*time.Second, "every node sees every member", func() error {
		for _, i := range all {
			v, err := look(c.Nodes[i])
			if err != nil {
				return err
			}
			if len(v.alive) != nodes {
				return fmt.Errorf("%s sees %d alive", c.Nodes[i].Name, len(v.alive))
			}
		}
		return nil
	})
}

// tiny is an engine of 4 KiB blocks, for many small imports.
func tiny(name string, slots int) client.Engine {
	return client.Engine{Name: name, Model: layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 64, DType: layout.DTypeBF16},
		TPSize: 1, PageSize: 16, Order: layout.HND, Slots: slots}
}

// QUIC (the peer port, UDP) blackholed on the reader 5 s, open 2 s, over
// and over while it imports: gossip stays up, no import returns a wrong
// block or brings bytes while the path is closed, every import returns
// within the import timeout, and imports succeed again once it opens.
func TestQUICBlackholeFlaps(t *testing.T) {
	cycles := 2
	if *long {
		cycles = 10
	}
	const (
		on, off  = 5 * time.Second, 2 * time.Second
		importTO = 30 * time.Second // the agents' default --import-timeout
		pace     = 100 * time.Millisecond
	)
	c := start(t, Options{Nodes: 2})
	rec := testbed.NewScenarioRecord("quic-blackhole", variant(), 2)
	defer save(t, rec)
	rec.Param("on_s", on.Seconds())
	rec.Param("off_s", off.Seconds())
	rec.Param("cycles", float64(cycles))
	ctx := ctxFor(t, 10*time.Minute)
	seqs := int((on+off)*time.Duration(cycles)/pace) + 100
	w := testbed.Workload{Sequences: seqs, Blocks: 4, PageSize: 16, Seed: 6}
	hashes := w.Hashes()
	p, err := testbed.Produce(ctx, c.Nodes[0], tiny("producer", seqs*4), hashes)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitBlocks(t, c, 1, c.Nodes[0].Name, uint64(w.Unique()))
	r, err := newReader(ctx, c.Nodes[1], tiny("reader", seqs*4))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	type window struct{ from, to time.Time }
	var (
		mu     sync.Mutex
		closed []window
	)
	flapDone := make(chan error, 1)
	go func() {
		for range cycles {
			if err := c.BlackholeUDP(1, 7947); err != nil {
				flapDone <- err
				return
			}
			// Closed from when the rules are in (ip takes a while to
			// start on loaded cores).
			from := time.Now()
			rec.Step("blackhole-udp", []int{1}, "port 7947")
			time.Sleep(on)
			if err := c.RestoreUDP(1); err != nil {
				flapDone <- err
				return
			}
			rec.Step("restore-udp", []int{1}, "")
			mu.Lock()
			closed = append(closed, window{from, time.Now()})
			mu.Unlock()
			time.Sleep(off)
		}
		flapDone <- nil
	}()
	var ok, failed, slowest = 0, 0, time.Duration(0)
	type done struct {
		from, to time.Time
		remote   bool
	}
	var oks []done
	k := 0
	for flapping := true; flapping; k++ {
		select {
		case err := <-flapDone:
			if err != nil {
				t.Fatal(err)
			}
			flapping = false
		default:
		}
		if k >= seqs {
			t.Fatalf("ran out of sequences after %d imports", k)
		}
		start := time.Now()
		remote, err := r.imp(ctx, rec, hashes[k])
		took := time.Since(start)
		slowest = max(slowest, took)
		switch {
		case errors.Is(err, errCorrupt):
			t.Fatal(err)
		case err != nil:
			failed++
		default:
			ok++
			oks = append(oks, done{start, time.Now(), remote})
		}
		if took > importTO+5*time.Second {
			t.Errorf("import %d took %v, past the import timeout %v", k, took, importTO)
		}
		time.Sleep(pace)
	}
	// Open again: the next import succeeds.
	wait.For(t, importTO+10*time.Second, "an import after the last flap", func() error {
		k++
		_, err := r.imp(ctx, rec, hashes[k])
		return err
	})
	// No bytes crossed while the path was closed.
	for _, d := range oks {
		for _, w := range closed {
			if d.remote && d.from.After(w.from.Add(100*time.Millisecond)) && d.to.Before(w.to) {
				t.Errorf("an import moved bytes from %v to %v, inside a blackhole from %v to %v",
					d.from.Sub(rec.Started), d.to.Sub(rec.Started), w.from.Sub(rec.Started), w.to.Sub(rec.Started))
			}
		}
	}
	// How long after each opening the first import succeeded.
	var recovery time.Duration
	for _, w := range closed {
		for _, d := range oks {
			if d.from.After(w.to) {
				recovery = max(recovery, d.to.Sub(w.to))
				break
			}
		}
	}
	rec.Figure("recovery_s_max", recovery.Seconds())
	// Gossip (7946) was left alone: the holder never left the reader's view.
	v, err := look(c.Nodes[1])
	if err != nil {
		t.Fatal(err)
	}
	if !v.alive[c.Nodes[0].Name] {
		t.Errorf("the holder is not alive for the reader: %v", v.alive)
	}
	rec.Figure("imports_ok", float64(ok))
	rec.Figure("imports_failed", float64(failed))
	rec.Figure("import_slowest_s", slowest.Seconds())
	t.Logf("%d cycles: %d imports whole and checked, %d failed with an error, slowest %v; first success at most %v after an opening",
		cycles, ok, failed, slowest, recovery)
	if failed == 0 && ok > 0 {
		// Each blackhole outlasts the peer timeout: some import must have
		// met one, or the blackhole did nothing.
		t.Errorf("no import failed across %d blackholes of %v", cycles, on)
	}
}
