// Command scale runs the control-plane simulation (package testbed/sim) at
// each cluster size given, with production membership timings, and writes
// a record and an HTML report with every figure plotted against the
// number of nodes.
//
//	go run ./testbed/sim/scale -nodes 64,256 -rate 10 -max-applies 40000 -report out/
//
// At each size: start the nodes and wait until every index agrees; a quiet
// window (gossip without events); a load window (each node stores -rate
// blocks a second, each removed after -lifetime, the rate lowered so that
// the cluster applies at most -max-applies events a second in all, since
// every node applies every event and all run on this machine's cores);
// then one join, one crash and a partition into halves held past failure
// detection, each timed until every index agrees with the ground truth
// again, which is then checked block by block.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/testbed/report"
	"github.com/kvfabric/kvfabric/testbed/sim"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// Result is one cluster size's figures.
type Result struct {
	Mode           string  `json:"mode"` // sim.ModeWhole or sim.ModeOwned
	Replicas       int     `json:"replicas,omitempty"`
	Nodes          int     `json:"nodes"`
	Rate           float64 `json:"rate_per_node"` // blocks stored per node per second
	Idle           sim.Window
	Load           sim.Window
	OneP50Ms       float64 `json:"one_p50_ms"`
	OneP99Ms       float64 `json:"one_p99_ms"`
	AllP50Ms       float64 `json:"all_p50_ms"`
	AllP99Ms       float64 `json:"all_p99_ms"`
	Complete       int64   `json:"blocks_in_every_index"`
	IndexBytes     float64 `json:"index_bytes_per_node"`
	IndexPairs     float64 `json:"index_pairs_per_node"`
	StartS         float64 `json:"start_converged_s"`
	JoinS          float64 `json:"join_converged_s"`
	CrashS         float64 `json:"crash_converged_s"`
	HealS          float64 `json:"heal_converged_s"`
	GossipPerEvent float64 `json:"gossip_in_bytes_per_applied_event"`
	// DirectPerEvent is, for owned slices, the bytes of calls to owners
	// (and their answers) a node receives per op it applies.
	DirectPerEvent float64 `json:"direct_in_bytes_per_applied_event,omitempty"`
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodesFlag := fs.String("nodes", "64,256", "cluster sizes, comma-separated")
	rate := fs.Float64("rate", 10, "blocks stored per node per second")
	maxApplies := fs.Float64("max-applies", 40000, "cap on events applied per second in the whole cluster; the rate is lowered to fit")
	lifetime := fs.Duration("lifetime", 10*time.Second, "how long a block stays before its node removes it")
	idle := fs.Duration("idle", 5*time.Second, "quiet window")
	load := fs.Duration("load", 20*time.Second, "load window")
	partition := fs.Duration("partition", 20*time.Second, "how long the halves stay apart")
	converge := fs.Duration("converge", 90*time.Second, "longest wait for the indexes to agree")
	modelRate := fs.Float64("model-rate", 333, "events per node per second the extrapolation assumes (10^5 a second from 300 nodes)")
	modelBlocks := fs.Float64("model-blocks", 1e5, "blocks per node the extrapolation assumes")
	pairBytes := fs.Float64("pair-bytes", 15, "index bytes per (block, holder) pair, from BenchmarkMemory in fabric/index")
	churn := fs.Bool("churn", true, "after the load, time a join, a crash and a partition heal")
	modesFlag := fs.String("mode", "whole", "index designs to run at each size, comma-separated: whole (every node indexes every event, by gossip), owned (each hash indexed by -replicas owners, events sent to them)")
	replicas := fs.Int("replicas", 3, "owners of each hash with -mode owned")
	from := fs.String("from", "", "render the report from this file of results (the JSON lines a run prints) instead of running")
	out := fs.String("report", "", "directory for scale.json and scale.html (none if empty)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var sizes []int
	for _, f := range strings.Split(*nodesFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 2 {
			return fmt.Errorf("scale: -nodes: %q is not a size of at least 2", f)
		}
		sizes = append(sizes, n)
	}
	modes := strings.Split(*modesFlag, ",")
	for _, md := range modes {
		if md != sim.ModeWhole && md != sim.ModeOwned {
			return fmt.Errorf("scale: -mode: %q is not whole or owned", md)
		}
	}
	if *replicas < 1 || *replicas > 8 {
		return fmt.Errorf("scale: -replicas %d not in 1..8", *replicas)
	}
	if *rate <= 0 || *maxApplies <= 0 || *lifetime <= 0 || *modelRate <= 0 || *modelBlocks <= 0 || *pairBytes <= 0 {
		return fmt.Errorf("scale: -rate, -max-applies, -lifetime and the model's flags must be positive")
	}
	m := model{rate: *modelRate, blocks: *modelBlocks, pairBytes: *pairBytes, replicas: float64(*replicas)}
	if *from != "" {
		results, err := readResults(*from)
		if err != nil {
			return err
		}
		if *out == "" {
			return fmt.Errorf("scale: -from needs -report")
		}
		return report.WriteFiles(*out, "scale", record(results, m))
	}
	var results []Result
	for _, n := range sizes {
		for _, md := range modes {
			// Every event is applied by every node (whole) or by its owners.
			appliers := float64(n)
			if md == sim.ModeOwned {
				appliers = float64(min(n, *replicas))
			}
			r := min(*rate, *maxApplies/float64(n)/appliers)
			res, err := one(md, *replicas, n, r, *lifetime, *idle, *load, *partition, *converge, *churn, stdout)
			if err != nil {
				err = fmt.Errorf("scale: %d nodes, %s: %w", n, md, err)
				if *out != "" && len(results) > 0 { // the sizes that ran still get their report
					err = errors.Join(err, report.WriteFiles(*out, "scale", record(results, m)))
				}
				return err
			}
			results = append(results, res)
			b, _ := json.Marshal(res)
			fmt.Fprintf(stdout, "%s\n", b)
		}
	}
	if *out == "" {
		return nil
	}
	return report.WriteFiles(*out, "scale", record(results, m))
}

func one(mode string, replicas, n int, rate float64, lifetime, idle, load, partition, converge time.Duration, churn bool, log io.Writer) (Result, error) {
	res := Result{Mode: mode, Nodes: n, Rate: rate}
	if mode == sim.ModeOwned {
		res.Replicas = replicas
	}
	ctx, cancel := context.WithTimeout(context.Background(), converge)
	defer cancel()
	t0 := time.Now()
	c, err := sim.Start(ctx, sim.Config{Nodes: n, StoreRate: rate, Lifetime: lifetime, Membership: membership.DefaultConfig(),
		Mode: mode, Replicas: replicas})
	if err != nil {
		return res, err
	}
	defer c.Close()
	wait := func(what string) (float64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), converge)
		defer cancel()
		d, err := c.WaitConverged(ctx)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		if err := c.Check(); err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		fmt.Fprintf(log, "%d nodes, %s: %s: converged in %v\n", n, mode, what, d.Round(time.Millisecond))
		return d.Seconds(), nil
	}
	if _, err := wait("start"); err != nil {
		return res, err
	}
	res.StartS = time.Since(t0).Seconds()

	a := c.Counters()
	time.Sleep(idle)
	res.Idle = sim.Between(a, c.Counters())

	c.StartLoad()
	time.Sleep(lifetime) // to the steady state: blocks now come and go
	c.ResetDelays()
	a = c.Counters()
	time.Sleep(load)
	res.Load = sim.Between(a, c.Counters())
	res.IndexBytes, res.IndexPairs = c.IndexBytes()
	one50, one99, all50, all99, complete := c.Delays()
	res.OneP50Ms, res.OneP99Ms = ms(one50), ms(one99)
	res.AllP50Ms, res.AllP99Ms, res.Complete = ms(all50), ms(all99), complete
	if res.Load.AppliedPerNode > 0 {
		res.GossipPerEvent = res.Load.GossipInBps / res.Load.AppliedPerNode
		res.DirectPerEvent = res.Load.DirectInBps / res.Load.AppliedPerNode
	}
	c.StopLoad()
	if _, err := wait("after load"); err != nil {
		return res, err
	}

	if !churn {
		return res, nil
	}
	jctx, jcancel := context.WithTimeout(context.Background(), converge)
	defer jcancel()
	if _, err := c.Join(jctx, 1); err != nil {
		return res, err
	}
	if res.JoinS, err = wait("join"); err != nil {
		return res, err
	}
	live := c.Live()
	if err := c.Kill(live[len(live)/2]); err != nil {
		return res, err
	}
	if res.CrashS, err = wait("crash"); err != nil {
		return res, err
	}
	live = c.Live()
	c.Partition(live[:len(live)/2])
	time.Sleep(partition)
	c.Heal()
	if res.HealS, err = wait("partition heal"); err != nil {
		return res, err
	}
	return res, nil
}

// readResults reads the results a run printed: one JSON object a line,
// other lines skipped.
func readResults(path string) ([]Result, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scale: -from: %w", err)
	}
	var out []Result
	for i, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var r Result
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Nodes < 1 {
			return nil, fmt.Errorf("scale: -from: %s line %d is not a result", path, i+1)
		}
		if r.Mode == "" {
			r.Mode = sim.ModeWhole // printed before there were modes
		}
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("scale: -from: %s holds no results", path)
	}
	return out, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// model extrapolates both designs past what runs here (see
// docs/scale.md). Whole index, per node: memory N·B·b, inbound event bytes
// N·r·g with g the mean measured gossip bytes per applied event, and the
// cluster's event rate N·r against what gossip can carry, 112 KB/s ÷ g.
// Owned slices, per node: memory R·B·b, inbound R·r·d with d the mean
// measured bytes of calls to owners per applied op, plus the probes of
// silent streams, (N-1)/5 s of probeBytes each way.
type model struct {
	rate, blocks, pairBytes, replicas float64
}

// probeBytes is an empty call to an owner and its answer on the wire
// (the simulation's estimate, sim's callOverhead and the payload).
const probeBytes = 19 + 1 + 2*(5+3) + 2*50 + 1

// gossipCapacity is what memberlist's gossip can send per node per second
// with membership's timings: a 1,400-byte packet to each of 4 nodes every
// 50 ms.
const gossipCapacity = 4 * 1400 / 0.05

func (m model) curves(results []Result) []report.Curve {
	g, d := 0.0, 0.0
	var ng, nd float64
	for _, r := range results {
		if r.Mode == sim.ModeOwned {
			d += r.DirectPerEvent
			nd++
		} else {
			g += r.GossipPerEvent
			ng++
		}
	}
	if ng == 0 || g == 0 {
		return m.ownedCurves(d / max(1, nd))
	}
	g /= ng
	mem := report.Curve{Title: fmt.Sprintf("Model: whole index per node, %.0f blocks a node, %.0f B a pair", m.blocks, m.pairBytes),
		X: "nodes", Y: "GB", Series: map[string][]report.Point{}}
	bw := report.Curve{Title: fmt.Sprintf("Model: events received per node, %.0f events/s a node, %.0f B each (measured)", m.rate, g),
		X: "nodes", Y: "MB/s", Series: map[string][]report.Point{}}
	gc := report.Curve{Title: "Model: the cluster's event rate against what gossip carries",
		X: "nodes", Y: "events/s", Series: map[string][]report.Point{}}
	for _, n := range []float64{16, 64, 256, 1000, 2500, 5000, 10000} {
		mem.Series["index"] = append(mem.Series["index"], report.Point{X: n, Y: n * m.blocks * m.pairBytes / 1e9})
		mem.Series["1% of 1 TiB"] = append(mem.Series["1% of 1 TiB"], report.Point{X: n, Y: 0.01 * (1 << 40) / 1e9})
		bw.Series["events in"] = append(bw.Series["events in"], report.Point{X: n, Y: n * m.rate * g / 1e6})
		bw.Series["1% of 100 Gb/s"] = append(bw.Series["1% of 100 Gb/s"], report.Point{X: n, Y: 0.01 * 100e9 / 8 / 1e6})
		gc.Series["published"] = append(gc.Series["published"], report.Point{X: n, Y: n * m.rate})
		gc.Series["gossip capacity"] = append(gc.Series["gossip capacity"], report.Point{X: n, Y: gossipCapacity / g})
	}
	out := []report.Curve{mem, bw, gc}
	if nd > 0 {
		out = append(out, m.ownedCurves(d/nd)...)
	}
	return out
}

// ownedCurves is the owned slices' model with d bytes received per op
// applied.
func (m model) ownedCurves(d float64) []report.Curve {
	if d == 0 {
		return nil
	}
	mem := report.Curve{Title: fmt.Sprintf("Model: owned slice per node, %.0f blocks a node, %.0f owners, %.0f B a pair", m.blocks, m.replicas, m.pairBytes),
		X: "nodes", Y: "GB", Series: map[string][]report.Point{}}
	bw := report.Curve{Title: fmt.Sprintf("Model: calls to owners received per node, %.0f events/s a node, %.0f B an op (measured), probes every 5 s", m.rate, d),
		X: "nodes", Y: "MB/s", Series: map[string][]report.Point{}}
	for _, n := range []float64{16, 64, 256, 1000, 2500, 5000, 10000} {
		mem.Series["slice"] = append(mem.Series["slice"], report.Point{X: n, Y: min(n, m.replicas) * m.blocks * m.pairBytes / 1e9})
		bw.Series["ops and probes in"] = append(bw.Series["ops and probes in"], report.Point{X: n, Y: (min(n, m.replicas)*m.rate*d + (n-1)/5*probeBytes) / 1e6})
		bw.Series["1% of 100 Gb/s"] = append(bw.Series["1% of 100 Gb/s"], report.Point{X: n, Y: 0.01 * 100e9 / 8 / 1e6})
	}
	return []report.Curve{mem, bw}
}

func record(results []Result, m model) *report.Record {
	r := &report.Record{
		Title:   "Control plane at scale (simulation)",
		Kind:    "simulation",
		Created: time.Now().UTC(),
		Summary: map[string]any{},
	}
	curve := func(title, y string, series map[string]func(Result) float64) {
		cv := report.Curve{Title: title, X: "nodes", Y: y, Series: map[string][]report.Point{}}
		for name, f := range series {
			for _, res := range results {
				key := name + ", " + res.Mode
				cv.Series[key] = append(cv.Series[key], report.Point{X: float64(res.Nodes), Y: f(res)})
			}
		}
		r.Curves = append(r.Curves, cv)
	}
	curve("Index memory per node", "bytes per (block, holder) pair", map[string]func(Result) float64{
		"index bytes / pair": func(x Result) float64 { return x.IndexBytes / max(1, x.IndexPairs) },
	})
	curve("Gossip bytes per node", "bytes/s", map[string]func(Result) float64{
		"in, under load":  func(x Result) float64 { return x.Load.GossipInBps },
		"out, under load": func(x Result) float64 { return x.Load.GossipOutBps },
		"in, idle":        func(x Result) float64 { return x.Idle.GossipInBps },
	})
	curve("Gossip bytes received per applied event", "bytes", map[string]func(Result) float64{
		"gossip in / event applied": func(x Result) float64 { return x.GossipPerEvent },
	})
	curve("Calls to owners per node under load (owned slices)", "bytes/s", map[string]func(Result) float64{
		"in":  func(x Result) float64 { return x.Load.DirectInBps },
		"out": func(x Result) float64 { return x.Load.DirectOutBps },
	})
	curve("Control-plane bytes received per node under load (gossip, repair and calls to owners)", "bytes/s", map[string]func(Result) float64{
		"in": func(x Result) float64 { return x.Load.GossipInBps + x.Load.RepairInBps + x.Load.DirectInBps },
	})
	curve("Repair bytes per node under load", "bytes/s", map[string]func(Result) float64{
		"in":  func(x Result) float64 { return x.Load.RepairInBps },
		"out": func(x Result) float64 { return x.Load.RepairOutBps },
	})
	curve("CPU per applied event (all of the process's CPU charged to events)", "µs", map[string]func(Result) float64{
		"CPU / event": func(x Result) float64 { return x.Load.CPUPerEventUs },
	})
	curve("CPU per node while idle", "ms of CPU per second", map[string]func(Result) float64{
		"idle CPU / node": func(x Result) float64 { return x.Idle.CPU / float64(x.Nodes) * 1000 },
	})
	curve("Propagation delay", "ms", map[string]func(Result) float64{
		"to one index p50":   func(x Result) float64 { return x.OneP50Ms },
		"to one index p99":   func(x Result) float64 { return x.OneP99Ms },
		"to every index p50": func(x Result) float64 { return x.AllP50Ms },
		"to every index p99": func(x Result) float64 { return x.AllP99Ms },
	})
	curve("Convergence", "seconds until every index agrees", map[string]func(Result) float64{
		"one join":       func(x Result) float64 { return x.JoinS },
		"one crash":      func(x Result) float64 { return x.CrashS },
		"partition heal": func(x Result) float64 { return x.HealS },
	})
	curve("False suspicions under load", "per node per hour", map[string]func(Result) float64{
		"suspicions of live nodes":   func(x Result) float64 { return x.Load.SuspicionsPerNodeHour },
		"live nodes declared failed": func(x Result) float64 { return x.Load.FalseFailuresPerNodeHour },
	})
	r.Curves = append(r.Curves, m.curves(results)...)
	for _, res := range results {
		b, _ := json.Marshal(res)
		var m map[string]any
		json.Unmarshal(b, &m)
		r.Summary[fmt.Sprintf("n=%04d %s", res.Nodes, res.Mode)] = m
	}
	return r
}
