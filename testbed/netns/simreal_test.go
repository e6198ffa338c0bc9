package netns

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/testbed"
	"github.com/kvfabric/kvfabric/testbed/sim"
)

var simRealNodes = flag.Int("kvfabric.simreal-nodes", 0, "nodes of TestSimulationAgreesWithAgents (0: 8, or with -kvfabric.long 4 a core, 16 to 64)")

// simRealLongNodes is the size -kvfabric.long runs on a machine of cpus
// cores: 4 agents a core, at least 16 and at most 64. More agents than
// that starve each other: 64 agents on 2 cores (load average 83-88) took
// 140 to 220 s to bring a store to every index where the simulation took
// under a second, and their index pairs fell 22-39 % short, a measure of
// the machine rather than of the design.
func simRealLongNodes(cpus int) int { return min(64, max(16, 4*cpus)) }

// simRealLight runs the agents of TestSimulationAgreesWithAgents lighter
// on CPU (simRealLightEnv), as it does past 32 nodes anyway.
var simRealLight = flag.Bool("kvfabric.simreal-light", false, "run TestSimulationAgreesWithAgents's agents with GOMAXPROCS=1, GOGC=400 and a session keepalive of 1m (always past 32 nodes)")

// simRealLightEnv is the agents' environment when they run light: one
// thread of Go code each and a quarter of the collections, so that N agents
// on 2 cores leave time for each other's probes. It changes no protocol
// timing and no byte on the wire.
var simRealLightEnv = []string{"GOMAXPROCS=1", "GOGC=400"}

// lateDelay parts the stores that reached every index by gossip from those
// some node missed and got by repair: a later batch of the origin shows
// the node the gap, which it asks the origin to fill after RepairDelay.
// The simulation at 64 nodes, 2 stores a node a second, puts 98-99 % of
// its stores under 0.52 s and the rest at 0.65 to 1 s. The p99 of such a
// distribution falls into the repaired tail in one run and short of it in
// the next (0.51 or 0.82 s, the simulation alone), so the test reports the
// share past lateDelay and the repairs beside it. The simulation counts by
// its histogram's 5 % buckets: from the first that starts past lateDelay
// (0.506 s), where the agents count every probe past it: they differ only
// on a delay between 0.500 and 0.506 s.
const lateDelay = 500 * time.Millisecond

// simRealLightArgs give the test's engine sessions a minute of silence
// (the default is 5 s; the client pings every third of it), so that an
// agent starved at a load average of 80 does not end the load's session
// for late keep-alives: that freed its block set (the blocks removed
// from every index) and stopped its node's stores. It is the engine
// API's timing, not the cluster's.
var simRealLightArgs = []string{"--session-keepalive", "1m"}

// simRealLoad is the event load both sides run: every node stores Rate
// blocks a second and removes each after Retains stores (its block set
// recycles the oldest), so a block lives Retains/Rate seconds.
type simRealLoad struct {
	Nodes   int
	Rate    float64
	Slots   int           // the block set's slots; the agent says how many it retains
	Settle  time.Duration // after the cluster formed, before the idle window
	Idle    time.Duration
	Warmup  time.Duration
	Window  time.Duration
	Poll    time.Duration // how often each node is asked whether probes arrived
	ProbeHz float64       // probes (stores followed to every index) a second in the cluster
	// ProbeWait is how long the last probes get, after the load, to
	// reach every index.
	ProbeWait time.Duration
}

// simRealFigures are the figures measured the same way on both sides.
type simRealFigures struct {
	StoresPerNode            float64 // per second, under load
	InIdle, OutIdle, In, Out float64 // bytes per second per node
	P50, P90, P99            time.Duration
	Complete, Probes         int
	// Late is how many of the Complete took longer than lateDelay to
	// reach every index: those some node missed on gossip and got by
	// repair. RangeRepairs is the gaps closed from origins' logs per node
	// per second under load.
	Late         int
	RangeRepairs float64

	Pairs float64 // index (hash, holder) pairs per node
	Err   error   // the first load or poll call that failed, if any

	// GossipInIdle, GossipIn and GossipOut are the part of the bytes that
	// memberlist carried (the agents count it in their transport, the
	// simulation in its network): like with like, without the agents'
	// peer connections and the simulation's repairs.
	GossipInIdle, GossipIn, GossipOut float64
}

// TestSimulationAgreesWithAgents runs the same event load on N agent
// processes (each in its own network namespace, production timings) and
// in the control-plane simulation (testbed/sim, N nodes in one process),
// measures the same figures on both and reports each figure's ratio
// simulation / agents against a 20 % criterion: propagation delay from a
// store to every other index (p50, p99), control-plane bytes in and out
// per node (idle and under load) and index pairs per node.
//
// The agents' bytes are their namespace's eth0 counters, less 42 bytes a
// packet (Ethernet, IP and UDP headers): gossip (encrypted, 29 bytes a
// packet more than the simulation's plain gossip) and the peer transport
// (QUIC: authentication dials, keepalives and repairs), where the
// simulation counts gossip and repair payloads. Propagation on the agents
// is sampled: about ProbeHz stores a second are followed by asking every
// node's engine API every Poll whether it indexes the block; a node's
// arrival is the midpoint between its last miss and its first hit. A
// probe's block stays stored until every node has indexed it (its engine
// uses it again every Retains/2 stores, so that the set recycles the next
// least recently used block in its place; the simulation runs with
// KeepInFlight, which removes the next oldest):
// without that, a store that took longer than a block's lifetime
// (Retains/Rate) to reach a starved agent was removed before, and could
// never be seen on every index. Probes that have not reached every index
// ProbeWait after the load are counted as such, not timed.
//
// Asserted: the agents stored Rate blocks a node a second within 20 %;
// index pairs per node agree within 20 % (the load ran the same; read
// on both sides after the probes' wait, once the indexes caught up); at
// least one probe reached every index on each side (otherwise no delay
// was measured, and the test fails saying so); the agents' load and
// pollers met no error. The other figures are logged with their ratio
// and verdict, not asserted, since on a loaded machine they measure the
// machine as much as the design.
// -kvfabric.long runs as many nodes as the machine carries
// (simRealLongNodes: 64 from 16 cores); -kvfabric.simreal-nodes sets any
// size.
// Past 30 nodes the kernel's neighbour table must be raised: the test
// raises it, and puts it back (raiseNeighbours). Past 32 nodes (or with
// -kvfabric.simreal-light) the agents run light (simRealLightEnv,
// simRealLightArgs).
//
// The eth0 bytes also carry what the simulation does not model (the peer
// transport's QUIC connections to every member), so the gossip rows
// compare like with like: the bytes memberlist carried, counted by each
// agent's transport (status's gossip_bytes_in and _out) and by the
// simulation's network.
func TestSimulationAgreesWithAgents(t *testing.T) {
	ld := simRealLoad{Nodes: 8, Rate: 2, Slots: 21, Settle: 10 * time.Second, Warmup: 12 * time.Second,
		Window: 15 * time.Second, Poll: 50 * time.Millisecond, ProbeHz: 4}
	if *long {
		ld.Nodes = simRealLongNodes(runtime.NumCPU())
	}
	if *simRealNodes > 0 {
		ld.Nodes = *simRealNodes
	}
	// The idle window holds one push/pull of each node: memberlist's nodes
	// exchange their state every PushPullPeriod, with phases set by when
	// each started, so that a shorter window holds as many of them as
	// fall in it. The simulation's nodes start together and then are all
	// quiet between their first exchange and their second: a 5 s window
	// 10 s after it formed held no push/pull at 64 nodes (probes alone,
	// 0.73 of the agents', whose starts spread over 40 s).
	ld.Idle = sim.PushPullPeriod(ld.Nodes)
	// Lookups of every pending probe on every node: fewer, and less often,
	// as the cluster grows (each node's arrival is known to half a Poll).
	ld.ProbeWait = ld.Window
	switch {
	case ld.Nodes > 32 && ld.Nodes > simRealLongNodes(runtime.NumCPU()):
		// 64 agents on 2 cores took 35 to 43 s to bring a store to
		// every index in one run, 143 to 218 s in two others (load
		// average 83 to 88), more than a window: their probes get
		// 90 s after the counters are read (which took minutes).
		ld.Poll, ld.ProbeHz, ld.ProbeWait = 500*time.Millisecond, 2, 90*time.Second
	case ld.Nodes > 16:
		// A machine that carries the agents (64 on 16 cores ran at a
		// load average of 2) polls finely enough to time a p50 of a few
		// hundred milliseconds: at 500 ms its median was off by a
		// quarter, half a Poll.
		ld.Poll, ld.ProbeHz = 100*time.Millisecond, 2
		if ld.Nodes <= simRealLongNodes(runtime.NumCPU()) {
			// With cores to spare, four times the probes: at 2 a
			// second the agents' p99 was the largest of 30 stores,
			// and moved by more than 20 % from run to run.
			ld.ProbeHz = 8
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// The simulation runs with the agents' block lifetime (Retains/Rate),
	// which their block sets give once registered, after their idle
	// window. In the short variant (8 nodes) it starts then, beside the
	// agents' load (8 agents at 2 stores a second leave it the CPU it
	// needs), and the test takes about one run's time instead of two;
	// with -kvfabric.long or -kvfabric.simreal-nodes it runs after the
	// agents have stopped, with the machine to itself.
	var lifetime time.Duration
	type simResult struct {
		f   simRealFigures
		err error
	}
	simDone := make(chan simResult, 1)
	started := false
	// A test that stops early (a t.Fatal in simRealAgents) ends the
	// simulation and waits for it, so that it does not run into the next
	// test (deferred after cancel, so it runs first).
	defer func() {
		if started {
			cancel()
			<-simDone
		}
	}()
	runSim := func(retains int) {
		lifetime = time.Duration(float64(retains) / ld.Rate * float64(time.Second))
		started = true
		go func() {
			f, err := simRealSim(ctx, ld, lifetime)
			simDone <- simResult{f, err}
		}()
	}
	beside := runSim
	if *long || *simRealNodes > 0 {
		beside = nil
	}
	real, retains := simRealAgents(ctx, t, ld, beside)
	if beside == nil {
		runSim(retains)
	}
	sr := <-simDone
	started = false
	if sr.err != nil {
		t.Fatalf("simulation: %v", sr.err)
	}
	simf := sr.f

	t.Logf("%d nodes, %.1f stores a node a second, block lifetime %v (%d retained), window %v, idle %v, probes polled every %v",
		ld.Nodes, ld.Rate, lifetime, retains, ld.Window, ld.Idle, ld.Poll)
	row := func(name string, s, r float64, unit string) {
		verdict := "within 20%"
		ratio := s / r
		switch {
		case s == 0 && r == 0:
			ratio, verdict = 1, "none on either side"
		case r == 0 || ratio < 0.8 || ratio > 1.2:
			verdict = "OUTSIDE 20%"
		}
		t.Logf("%-48s sim %10.1f %-4s agents %10.1f %-4s ratio %5.2f  %s", name, s, unit, r, unit, ratio, verdict)
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	row("stores per node per second", simf.StoresPerNode, real.StoresPerNode, "")
	row("propagation to every index, p50", ms(simf.P50), ms(real.P50), "ms")
	row("propagation to every index, p90", ms(simf.P90), ms(real.P90), "ms")
	row("propagation to every index, p99", ms(simf.P99), ms(real.P99), "ms")
	share := func(f simRealFigures) float64 { return 100 * float64(f.Late) / float64(max(f.Complete, 1)) }
	row(fmt.Sprintf("stores later than %v to every index", lateDelay), share(simf), share(real), "%")
	row("range repairs per node per minute, under load", 60*simf.RangeRepairs, 60*real.RangeRepairs, "")
	row("bytes in per node, idle", simf.InIdle, real.InIdle, "B/s")
	row("bytes out per node, idle", simf.OutIdle, real.OutIdle, "B/s")
	row("bytes in per node, under load", simf.In, real.In, "B/s")
	row("bytes out per node, under load", simf.Out, real.Out, "B/s")
	row("gossip bytes in per node, idle", simf.GossipInIdle, real.GossipInIdle, "B/s")
	row("gossip bytes in per node, under load", simf.GossipIn, real.GossipIn, "B/s")
	row("gossip bytes out per node, under load", simf.GossipOut, real.GossipOut, "B/s")
	row("index pairs per node", simf.Pairs, real.Pairs, "")
	t.Logf("probes to every index: sim %d of %d (all stores, %d later than %v), agents %d of %d (%d later)",
		simf.Complete, simf.Probes, simf.Late, lateDelay, real.Complete, real.Probes, real.Late)

	if real.Err != nil {
		t.Errorf("agents: %v", real.Err)
	}
	if real.Complete == 0 || simf.Complete == 0 {
		t.Fatalf("no store reached every index: sim %d, agents %d", simf.Complete, real.Complete)
	}
	if r := simf.Pairs / real.Pairs; r < 0.8 || r > 1.2 {
		t.Errorf("index pairs per node: sim %.0f, agents %.0f: ratio %.2f outside 20%%", simf.Pairs, real.Pairs, r)
	}
	if r := real.StoresPerNode / ld.Rate; r < 0.8 || r > 1.2 {
		t.Errorf("agents stored %.2f blocks a node a second, want %.1f", real.StoresPerNode, ld.Rate)
	}
}

// simRealSim runs the load in the simulation and measures it.
func simRealSim(ctx context.Context, ld simRealLoad, lifetime time.Duration) (simRealFigures, error) {
	c, err := sim.Start(ctx, sim.Config{Nodes: ld.Nodes, StoreRate: ld.Rate, Lifetime: lifetime,
		GossipKey: make([]byte, 32), ClusterName: "testbed", KeepInFlight: true})
	if err != nil {
		return simRealFigures{}, err
	}
	defer c.Close()
	if _, err := c.WaitConverged(ctx); err != nil {
		return simRealFigures{}, err
	}
	var f simRealFigures
	pause(ctx, ld.Settle)
	a := c.Counters()
	pause(ctx, ld.Idle)
	w := sim.Between(a, c.Counters())
	f.InIdle, f.OutIdle = w.GossipInBps+w.RepairInBps, w.GossipOutBps+w.RepairOutBps
	f.GossipInIdle = w.GossipInBps
	c.StartLoad()
	defer c.StopLoad()
	pause(ctx, ld.Warmup)
	c.ResetDelays()
	a = c.Counters()
	pause(ctx, ld.Window)
	w = sim.Between(a, c.Counters())
	f.In, f.Out = w.GossipInBps+w.RepairInBps, w.GossipOutBps+w.RepairOutBps
	f.GossipIn, f.GossipOut = w.GossipInBps, w.GossipOutBps
	f.RangeRepairs = w.RangeRepairsPerNode
	// The simulation's load publishes at its rate exactly.
	f.StoresPerNode = ld.Rate
	// The last stores get as long to arrive as on the agents, and the
	// index pairs are read after, as there.
	c.StopLoad()
	dctx, cancel := context.WithTimeout(ctx, ld.ProbeWait)
	c.WaitConverged(dctx)
	cancel()
	_, f.Pairs = c.IndexBytes()
	_, _, f.P50, f.P99, _ = c.Delays()
	f.P90 = c.DelayToEvery(0.9)
	late, complete := c.DelaysOver(lateDelay)
	f.Complete, f.Late, f.Probes = int(complete), int(late), int(float64(ld.Nodes)*ld.Rate*ld.Window.Seconds())
	return f, nil
}

// probe is a store followed to every index.
type probe struct {
	hash   uint64
	origin int
	at     time.Time
	mu     sync.Mutex
	seen   []time.Time // by node; zero until it indexes the block
	last   []time.Time // by node: its last miss
	left   int         // nodes still to see it
	done   chan struct{}
}

// simRealAgents runs the load on agent processes and measures it. It
// returns the figures and how many blocks a node's set retains; retained,
// if not nil, is told that as soon as the block sets are registered.
func simRealAgents(ctx context.Context, t *testing.T, ld simRealLoad, retained func(int)) (simRealFigures, int) {
	if err := Available(); err != nil {
		t.Skipf("namespace clusters cannot run here: %v", err)
	}
	n := ld.Nodes
	// Every namespace learns every other's address by ARP, and the
	// kernel's neighbour table is one for all namespaces: past gc_thresh3
	// entries in all, nodes cannot reach each other (34 nodes of a full
	// mesh pass the default 1,024).
	raiseNeighbours(t, n)
	opts := Options{Bin: bin, Nodes: n, Pool: "host=16MiB"}
	if *simRealLight || n > 32 {
		opts.Env, opts.ExtraArgs = simRealLightEnv, simRealLightArgs
		t.Logf("agents run light: %v %v", opts.Env, opts.ExtraArgs)
	}
	t.Logf("load average before the agents start: %s", loadAvg())
	sctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	began := time.Now()
	c, err := Start(sctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		for _, ns := range leftovers(t) {
			t.Errorf("namespace %s left behind", ns)
		}
	})
	// The agents stop on return: where the simulation runs after them,
	// before it starts, so that it has the CPU.
	defer c.Close()
	t.Logf("%d agents up and joined in %v", n, time.Since(began).Round(time.Millisecond))

	var f simRealFigures
	pause(ctx, ld.Settle)
	a, ga := nsCounters(t, c), gossipCounters(ctx, t, c)
	pause(ctx, ld.Idle)
	f.InIdle, f.OutIdle = nsRates(a, nsCounters(t, c))
	f.GossipInIdle, _ = gossipRates(ga, gossipCounters(ctx, t, c))

	// One engine and block set a node. Probes are stores like the others,
	// followed until every node indexes them, and kept the set's most
	// recently used blocks until then (refresh).
	type gen struct {
		cl      *client.Client
		set     uint64
		retains int
		stores  int
	}
	gens := make([]*gen, n)
	for i, node := range c.Nodes {
		cl, err := node.Client(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		bs, err := cl.Register(ctx, eng(fmt.Sprintf("load%d", i), ld.Slots))
		if err != nil {
			t.Fatal(err)
		}
		gens[i] = &gen{cl: cl, set: bs.ID, retains: bs.Retains}
	}
	if retained != nil {
		retained(gens[0].retains)
	}

	// refresh makes the probes' blocks the most recently used of g's set,
	// so that allocating recycles others first. A probe's block that is
	// gone already (recycled) is an error: that probe cannot complete.
	refresh := func(g *gen, ps []*probe) error {
		var slots []uint32
		defer func() {
			if len(slots) > 0 {
				g.cl.Release(ctx, g.set, slots)
			}
		}()
		for _, p := range ps {
			refs, err := g.cl.Acquire(ctx, g.set, []uint64{p.hash})
			if err != nil {
				return fmt.Errorf("probe %#x: acquire: %w", p.hash, err)
			}
			if len(refs) != 1 {
				return fmt.Errorf("probe %#x recycled before every node indexed it", p.hash)
			}
			slots = append(slots, refs[0].GetSlot())
		}
		if len(slots) == 0 {
			return nil
		}
		err := g.cl.Release(ctx, g.set, slots)
		slots = nil
		return err
	}

	var (
		pmu      sync.Mutex
		pending  []*probe
		all      []*probe
		counting bool
		probing  bool // within the window: stores become probes
	)
	probeEvery := max(1, int(float64(n)*ld.Rate/ld.ProbeHz+0.5))
	stop, stopLoad := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i, g := range gens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i)+1, 7))
			var held []*probe // this node's probes on their way
			since := 0        // stores since held were last used
			// Start the nodes' ticks spread over one period: the
			// ticker starts after the wait (made before it, every
			// node's ticked at the same instants, and their stores
			// came in a burst once a period).
			select {
			case <-time.After(time.Duration(rng.Int64N(int64(time.Second / time.Duration(ld.Rate))))):
			case <-stop:
				return
			}
			tick := time.NewTicker(time.Duration(float64(time.Second) / ld.Rate))
			defer tick.Stop()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				case <-stopLoad:
					return
				case <-tick.C:
				}
				h := rng.Uint64()
				set := g.set
				slots, err := g.cl.Allocate(ctx, set, 1)
				if err != nil {
					errs <- fmt.Errorf("node %d: allocate: %w", i, err)
					return
				}
				at := time.Now()
				refs, err := g.cl.RegisterBlocks(ctx, set, slots, []uint64{h})
				if err != nil || len(refs) != 1 {
					errs <- fmt.Errorf("node %d: register: %v (%d blocks)", i, err, len(refs))
					return
				}
				// Node i's probes are its stores k with k+i a multiple of
				// probeEvery, so that the cluster's come at ProbeHz
				// from the start, not all at once every probeEvery
				// stores (at 64 nodes, none in the window).
				var p *probe
				pmu.Lock()
				if counting {
					g.stores++
				}
				if probing && (k+i)%probeEvery == 0 {
					p = &probe{hash: h, origin: i, at: at, seen: make([]time.Time, n), last: make([]time.Time, n), left: n - 1, done: make(chan struct{})}
					for j := range p.last {
						p.last[j] = at
					}
					pending = append(pending, p)
					all = append(all, p)
				}
				pmu.Unlock()
				if err := g.cl.Release(ctx, set, slots); err != nil {
					errs <- err
					return
				}
				// A probe's block stays stored until every node has
				// indexed it: it is made the set's most recently used
				// block (Acquire, Release), so that the set recycles
				// others in its place and the removes keep their rate.
				// Without that, 64 starved agents took longer than a
				// block lives (Retains/Rate) to index some stores, whose
				// removes then came with them: never seen on every
				// index. (Holding the reference instead would count the
				// block in use, and the agents gossip their metadata when
				// their pool's use changes: at 8 nodes that doubled the
				// gossip under load.) After the load no block is
				// recycled: the last probes stay until the end.
				// Used again every Retains/2 stores: it never gets near
				// the least recently used (the set recycles at most
				// two at once), with a ninth of the engine API calls
				// that using it every store took.
				if p != nil {
					held = append(held, p)
				}
				held = slices.DeleteFunc(held, func(p *probe) bool {
					select {
					case <-p.done:
						return true
					default:
						return false
					}
				})
				if since++; since >= max(1, g.retains/2) && len(held) > 0 {
					if err := refresh(g, held); err != nil {
						errs <- fmt.Errorf("node %d: %w", i, err)
						return
					}
					since = 0
				}
			}
		}()
	}
	// One poller a node: asks its engine API whether each pending probe
	// of another node is indexed, on a client of its own. A loaded agent
	// may end a session whose keep-alives come late: the poller then
	// reports it and dials a new one, so that one node's ended session
	// does not keep every probe from completing.
	for j, node := range c.Nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl, err := node.Client(ctx)
			if err != nil {
				errs <- fmt.Errorf("%s: poller: %w", node.Name, err)
				return
			}
			defer func() {
				if cl != nil {
					cl.Close()
				}
			}()
			tick := time.NewTicker(ld.Poll)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				pmu.Lock()
				ps := slices.Clone(pending)
				pmu.Unlock()
				for _, p := range ps {
					if p.origin == j {
						continue
					}
					p.mu.Lock()
					seen := !p.seen[j].IsZero()
					p.mu.Unlock()
					if seen {
						continue
					}
					asked := time.Now()
					ov, err := cl.Lookup(ctx, []uint64{p.hash})
					if err != nil {
						select {
						case errs <- fmt.Errorf("%s: lookup: %w", node.Name, err):
						default:
						}
						cl.Close()
						if cl, err = node.Client(ctx); err != nil {
							cl = nil
							select {
							case errs <- fmt.Errorf("%s: poller: %w", node.Name, err):
							default:
							}
							return
						}
						break // the next tick asks again
					}
					hit := slices.ContainsFunc(ov, func(o *fabricpb.Overlap) bool { return o.Node == c.Nodes[p.origin].Name && o.Blocks == 1 })
					p.mu.Lock()
					if hit {
						p.seen[j] = p.last[j].Add(asked.Sub(p.last[j]) / 2)
						p.left--
						if p.left == 0 {
							close(p.done)
						}
					} else {
						p.last[j] = asked
					}
					p.mu.Unlock()
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	pause(ctx, ld.Warmup)
	pmu.Lock()
	counting = true
	pmu.Unlock()
	a, ga = nsCounters(t, c), gossipCounters(ctx, t, c)
	start := time.Now()
	pmu.Lock()
	probing = true
	pmu.Unlock()
	pause(ctx, ld.Window)
	// Reading 64 loaded agents' counters takes seconds: probes are only
	// the window's stores, so that the pollers' lookups do not grow with
	// how long the reads take.
	pmu.Lock()
	probing = false
	pmu.Unlock()
	b, gb := nsCounters(t, c), gossipCounters(ctx, t, c)
	secs := time.Since(start).Seconds()
	t.Logf("load average under load: %s", loadAvg())
	close(stopLoad) // the probes' pollers go on
	pmu.Lock()
	counting = false
	stores := 0
	for _, g := range gens {
		stores += g.stores
	}
	pmu.Unlock()
	f.In, f.Out = nsRates(a, b)
	f.GossipIn, f.GossipOut = gossipRates(ga, gb)
	f.RangeRepairs = repairRate(ga, gb)
	t.Logf("agents under load: %.1f packets in, %.1f out per node per second",
		float64(sum(b.rxPackets)-sum(a.rxPackets))/secs/float64(n), float64(sum(b.txPackets)-sum(a.txPackets))/secs/float64(n))
	f.StoresPerNode = float64(stores) / secs / float64(n)
	// The last probes get ProbeWait to arrive, all of them together (a
	// channel that stays closed: many may not arrive).
	dctx, dcancel := context.WithTimeout(ctx, ld.ProbeWait)
	defer dcancel()
	var delays []time.Duration
	pmu.Lock()
	probes := slices.Clone(all)
	pmu.Unlock()
	for _, p := range probes {
		select {
		case <-p.done:
		case <-dctx.Done():
		}
	}
	for _, p := range probes {
		p.mu.Lock()
		if p.left == 0 {
			last := slices.MaxFunc(p.seen, func(x, y time.Time) int { return x.Compare(y) })
			delays = append(delays, last.Sub(p.at))
		}
		p.mu.Unlock()
	}
	// Index pairs once the probes arrived (or their wait ended): 64
	// starved agents' indexes lag the load by minutes, and read at the
	// window's end they held the stores of its first seconds only
	// (873 pairs a node against a steady 1,216). The load stopped with
	// the window, so what they hold then is its steady state.
	for _, node := range c.Nodes {
		// A client of its own: a loaded machine may have ended the load's
		// session (its keep-alives late).
		f.Pairs += float64(nodeStatus(ctx, t, node).IndexEntries)
	}
	f.Pairs /= float64(n)
	select {
	case f.Err = <-errs:
	default:
	}
	f.Probes, f.Complete = len(probes), len(delays)
	f.P50, f.P90, f.P99 = quantile(delays, 0.5), quantile(delays, 0.9), quantile(delays, 0.99)
	for _, d := range delays {
		if d > lateDelay {
			f.Late++
		}
	}
	return f, gens[0].retains
}

// quantile returns the q-quantile of ds (nearest rank), 0 if none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// nsCounter is every node's eth0 counters, each read at its own time (a
// loaded machine takes seconds to read 64).
type nsCounter struct {
	at                           []time.Time
	rx, tx, rxPackets, txPackets []int64
}

// nsCounters reads every node's eth0 counters inside its namespace.
func nsCounters(t *testing.T, c *Cluster) nsCounter {
	var k nsCounter
	for i := range c.Nodes {
		k.at = append(k.at, time.Now())
		out, err := exec.Command("ip", "netns", "exec", c.Namespace(i), "cat",
			"/sys/class/net/eth0/statistics/rx_bytes", "/sys/class/net/eth0/statistics/tx_bytes",
			"/sys/class/net/eth0/statistics/rx_packets", "/sys/class/net/eth0/statistics/tx_packets").Output()
		if err != nil {
			t.Fatalf("counters of %s: %v", c.Namespace(i), err)
		}
		var v []int64
		for _, f := range strings.Fields(string(out)) {
			x, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				t.Fatalf("counters of %s: %q: %v", c.Namespace(i), out, err)
			}
			v = append(v, x)
		}
		if len(v) != 4 {
			t.Fatalf("counters of %s: %q", c.Namespace(i), out)
		}
		k.rx, k.tx, k.rxPackets, k.txPackets = append(k.rx, v[0]), append(k.tx, v[1]), append(k.rxPackets, v[2]), append(k.txPackets, v[3])
	}
	return k
}

// nsRates returns the payload bytes in and out per node per second from
// a to b: the counters less 42 bytes a packet (Ethernet, IP, UDP), each
// node's over the time between its own reads.
func nsRates(a, b nsCounter) (in, out float64) {
	n := float64(len(a.rx))
	for i := range a.rx {
		secs := b.at[i].Sub(a.at[i]).Seconds()
		in += float64((b.rx[i]-a.rx[i])-42*(b.rxPackets[i]-a.rxPackets[i])) / secs
		out += float64((b.tx[i]-a.tx[i])-42*(b.txPackets[i]-a.txPackets[i])) / secs
	}
	return in / n, out / n
}

// pause waits d, or until ctx ends: a measurement window.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

func sum(xs []int64) (s int64) {
	for _, x := range xs {
		s += x
	}
	return s
}

// gossipCounter is every node's memberlist bytes (status's
// gossip_bytes_in and _out), each with the time its status answered.
type gossipCounter struct {
	at      []time.Time
	in, out []uint64
	repairs []uint64 // gaps closed from origins' logs
}

// nodeStatus asks node for its status through a client of its own (status
// takes no session, so it answers whatever became of the load's).
func nodeStatus(ctx context.Context, t *testing.T, node *testbed.Node) *fabricpb.StatusResponse {
	t.Helper()
	cl, err := node.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err := cl.Status(ctx)
	if err != nil {
		t.Fatalf("%s: status: %v", node.Name, err)
	}
	return s
}

// gossipCounters reads every node's memberlist byte counts, each through
// a client of its own (status takes no session).
func gossipCounters(ctx context.Context, t *testing.T, c *Cluster) gossipCounter {
	var k gossipCounter
	for _, node := range c.Nodes {
		s := nodeStatus(ctx, t, node)
		k.at, k.in, k.out = append(k.at, time.Now()), append(k.in, s.GossipBytesIn), append(k.out, s.GossipBytesOut)
		k.repairs = append(k.repairs, s.GossipRangeRepairs)
	}
	return k
}

// gossipRates returns the memberlist bytes in and out per node per second
// from a to b, each node's over the time between its own reads.
func gossipRates(a, b gossipCounter) (in, out float64) {
	n := float64(len(a.in))
	for i := range a.in {
		secs := b.at[i].Sub(a.at[i]).Seconds()
		in += float64(b.in[i]-a.in[i]) / secs
		out += float64(b.out[i]-a.out[i]) / secs
	}
	return in / n, out / n
}

// repairRate returns the event gaps closed from origins' logs per node
// per second from a to b.
func repairRate(a, b gossipCounter) float64 {
	var r float64
	for i := range a.repairs {
		r += float64(b.repairs[i]-a.repairs[i]) / b.at[i].Sub(a.at[i]).Seconds()
	}
	return r / float64(len(a.repairs))
}

// raiseNeighbours makes room in the kernel's neighbour table for n nodes'
// full mesh: every namespace learns every other's address by ARP, and the
// table is one for all namespaces, so past gc_thresh3 entries in all (34
// nodes of a full mesh pass the default 1,024) nodes cannot reach each
// other. It raises gc_thresh2 and gc_thresh3 where they are short, and
// puts them back when the test ends.
func raiseNeighbours(t *testing.T, n int) {
	need := n * (n - 1)
	for _, knob := range []struct {
		name string
		want int
	}{{"gc_thresh2", need}, {"gc_thresh3", 2 * need}} {
		path := "/proc/sys/net/ipv4/neigh/default/" + knob.name
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("neighbour table: %v", err)
		}
		was, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("neighbour table: %s: %q", path, b)
		}
		if was >= knob.want {
			continue
		}
		if err := os.WriteFile(path, []byte(strconv.Itoa(knob.want)), 0o644); err != nil {
			t.Skipf("%d nodes need net.ipv4.neigh.default.%s of %d or more, have %d, and it cannot be raised: %v", n, knob.name, knob.want, was, err)
		}
		t.Logf("net.ipv4.neigh.default.%s raised from %d to %d for %d nodes (put back at the end)", knob.name, was, knob.want, n)
		t.Cleanup(func() {
			if err := os.WriteFile(path, []byte(strconv.Itoa(was)), 0o644); err != nil {
				t.Errorf("net.ipv4.neigh.default.%s not put back to %d: %v", knob.name, was, err)
			}
		})
	}
}

// loadAvg is the machine's load average, as uptime shows it.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown: " + err.Error()
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return string(b)
	}
	return strings.Join(f[:3], " ")
}
