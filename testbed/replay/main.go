// Command replay replays a request trace (Mooncake FAST'25 JSONL: timestamp,
// input_length, output_length, hash_ids of 512-token blocks) on a local
// kvfabric cluster, one engine per agent, and reports how much of the
// prompts the cluster served: local and cluster hit rates, blocks and bytes
// imported per transport, import latency and the prefill time saved.
//
//	go run ./testbed/replay -trace mooncake.jsonl -nodes 4 -requests 1500 -json
//	go run ./testbed/replay -generate synth.jsonl -requests 1500   # write a synthetic trace
//	go run ./testbed/replay -nodes 4                               # replay a synthetic trace
//	go run ./testbed/replay -model -trace testbed/replay/traces/conversation_trace.jsonl.gz -requests 0 -policy random -cache-blocks 2048
//	go run ./testbed/replay -model -leaves-first -caches cluster-aware,aware-touch,shared-lru -requests 0 -trace testbed/replay/traces/conversation_trace.jsonl.gz
//
// A trace whose name ends in .gz is read through gzip. traces/ holds two
// of Mooncake's published traces (see traces/README.md).
//
// It writes its record and report, DIR/replay.json and DIR/replay.html, in
// the folder -report names (by default a new one in the temporary
// directory, named on standard error).
package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/testbed"
	"github.com/kvfabric/kvfabric/testbed/report"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "replay: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	trace := fs.String("trace", "", "JSONL trace to replay; if empty, a synthetic one (see -seed)")
	generate := fs.String("generate", "", "write a synthetic trace of -requests requests to this file and exit")
	nodes := fs.Int("nodes", 4, "agents (one engine each)")
	requests := fs.Int("requests", 1500, "requests to replay (0: the whole trace)")
	policy := fs.String("policy", testbed.PolicyKVAware, "router policy: random, round-robin or kv-aware; several, comma-separated, run one after another on fresh clusters")
	page := fs.Int("page", testbed.TraceBlockTokens, "engine page size in tokens (divides 512 or a multiple of it)")
	layers := fs.Int("layers", testbed.ReplayModel.Layers, "model layers")
	heads := fs.Int("kv-heads", testbed.ReplayModel.KVHeads, "model KV heads")
	headDim := fs.Int("head-dim", testbed.ReplayModel.HeadDim, "model head dim")
	dtype := fs.String("dtype", testbed.ReplayModel.DType.String(), "model dtype")
	cache := fs.Int("cache-blocks", 512, "each engine's local cache in blocks")
	pool := fs.String("pool", "", "each agent's --pool (if empty, room for the cache and imports)")
	concurrency := fs.Int("concurrency", 4, "requests in flight across the cluster")
	loadWeight := fs.Float64("load-weight", 1, "kv-aware: blocks of overlap one request in flight costs")
	rate := fs.Float64("prefill-rate", 10000, "prefill speed in tokens/s, for prefill_seconds_saved")
	speedup := fs.Float64("speedup", 0, "replay arrivals at timestamp/speedup (0: as fast as possible)")
	verify := fs.Bool("verify", true, "check every byte of every block hit or imported")
	seed := fs.Uint64("seed", 1, "seed of the synthetic trace, the random policy and token contents")
	bin := fs.String("bin", "", "kvfabric binary (if empty, built from ./cmd/kvfabric)")
	asJSON := fs.Bool("json", false, "print one JSON object on stdout")
	reportDir := fs.String("report", "", "write replay.json and replay.html (with plots) in this folder (if empty, a new folder in the temporary directory, named on standard error; - for none)")
	timeout := fs.Duration("timeout", 10*time.Minute, "bound on the whole replay")
	agentArgs := fs.String("agent-args", "", "more flags for every agent, space-separated (e.g. --no-cluster-eviction)")
	modelRun := fs.Bool("model", false, "run the cache model instead of agents: each -policy (random or round-robin) through per-engine LRU, cluster-aware eviction, cluster-aged eviction and one shared LRU of every engine's blocks, on one routing (see testbed.ModelReplay)")
	sharedAge := fs.Float64("shared-age", testbed.ModelSharedAge, "-model: how many caches' worth of stores older cluster-aged and aged-touch count a block another engine holds (1e-9: none)")
	freshAge := fs.Float64("fresh-age", testbed.ModelFreshAge, "-model: how many caches' worth of stores older cluster-aged and aged-touch count a block not hit since it was stored (1e-9: none)")
	leavesFirst := fs.Bool("leaves-first", false, "-model: no cache evicts a block while it holds one that extends it, as the pool does")
	caches := fs.String("caches", "", "-model: the cache policies to run, comma-separated, of "+strings.Join(testbed.ModelCaches, ", ")+" and "+strings.Join(testbed.ModelMoreCaches, ", ")+" (see testbed.ModelReplay; if empty, the first four)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *nodes < 1 || *requests < 0 {
		return fmt.Errorf("-nodes %d / -requests %d: want at least 1 node and requests >= 0", *nodes, *requests)
	}
	for _, p := range strings.Split(*policy, ",") {
		switch strings.TrimSpace(p) {
		case testbed.PolicyRandom, testbed.PolicyRoundRobin, testbed.PolicyKVAware:
		default:
			return fmt.Errorf("-policy: %q is not random, round-robin or kv-aware", p)
		}
	}
	dt, err := layout.ParseDType(*dtype)
	if err != nil {
		return fmt.Errorf("-dtype: %w", err)
	}
	model := layout.ModelConfig{Layers: *layers, KVHeads: *heads, HeadDim: *headDim, DType: dt}

	if *generate != "" {
		reqs, err := testbed.TraceGen{Requests: *requests, Seed: *seed}.Generate()
		if err != nil {
			return err
		}
		f, err := os.Create(*generate)
		if err != nil {
			return err
		}
		if err := testbed.WriteTrace(f, reqs); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}

	var reqs []testbed.TraceRequest
	if *trace == "" {
		reqs, err = testbed.TraceGen{Requests: *requests, Seed: *seed}.Generate() // 0: the generator's default
	} else {
		if reqs, err = readTrace(*trace, *requests); err != nil {
			err = fmt.Errorf("%s: %w", *trace, err)
		}
	}
	if err != nil {
		return err
	}
	if *modelRun {
		opts := testbed.ModelOptions{Nodes: *nodes, CacheBlocks: *cache, Seed: *seed, SharedAge: *sharedAge, FreshAge: *freshAge, LeavesFirst: *leavesFirst}
		if *caches != "" {
			for _, c := range strings.Split(*caches, ",") {
				opts.Caches = append(opts.Caches, strings.TrimSpace(c))
			}
		}
		return runModel(stdout, reqs, opts, *policy, *asJSON)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	if *bin == "" {
		b, remove, err := testbed.BuildBinary(ctx)
		if err != nil {
			return err
		}
		defer remove()
		*bin = b
	}
	if *pool == "" {
		// The engine's block set, room for a second, and the pool's own.
		per := model.BlockBytes(*page)
		*pool = fmt.Sprintf("host=%dMiB", (2*uint64(*cache)*per)>>20+64)
	}
	var results []*testbed.ReplayResult
	for _, p := range strings.Split(*policy, ",") {
		// A fresh cluster per policy, so that none starts with another's
		// blocks.
		c, err := testbed.Start(ctx, testbed.Options{Bin: *bin, Nodes: *nodes, Pool: *pool, ExtraArgs: strings.Fields(*agentArgs)})
		if err != nil {
			return err
		}
		res, err := testbed.Replay(ctx, c, reqs, testbed.ReplayOptions{Policy: strings.TrimSpace(p), PageSize: *page, Model: model,
			CacheBlocks: *cache, Concurrency: *concurrency, LoadWeight: *loadWeight, PrefillRate: *rate,
			Speedup: *speedup, Verify: *verify, Seed: *seed})
		if err := errors.Join(err, c.Close()); err != nil {
			return err
		}
		results = append(results, res)
	}
	if *reportDir == "" {
		if *reportDir, err = os.MkdirTemp("", "kvfabric-replay-"); err != nil {
			return err
		}
	}
	if *reportDir != "-" {
		name := "synthetic"
		if *trace != "" {
			name = filepath.Base(*trace)
		}
		rec := testbed.ReplayRecord(fmt.Sprintf("replay of %s (%d requests) on %d nodes: %s", name, len(reqs), *nodes, *policy), results...)
		if err := report.WriteFiles(*reportDir, "replay", rec); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "replay: report in %s\n", filepath.Join(*reportDir, "replay.html"))
	}
	if *asJSON {
		// One object: the result, or with several policies, the results
		// by policy.
		enc := json.NewEncoder(stdout)
		if len(results) == 1 {
			return enc.Encode(summary(results[0]))
		}
		by := map[string]any{}
		for _, r := range results {
			by[r.Policy] = summary(r)
		}
		return enc.Encode(by)
	}
	for _, r := range results {
		printText(stdout, r)
	}
	return nil
}

// summary is the result without the per-request timeline (the report
// has it).
func summary(res *testbed.ReplayResult) any {
	type noTimeline struct {
		*testbed.ReplayResult
		Timeline []testbed.RequestRecord `json:"timeline,omitempty"`
	}
	return noTimeline{ReplayResult: res}
}

func printText(w io.Writer, res *testbed.ReplayResult) {
	fmt.Fprintf(w, "policy %s on %d nodes: %d requests, %d blocks in %.1f s\n", res.Policy, res.Nodes, res.Requests, res.BlocksRequested, res.ElapsedSeconds)
	fmt.Fprintf(w, "  local hit rate    %.3f  (%d blocks)\n", res.LocalHitRate, res.BlocksLocal)
	fmt.Fprintf(w, "  cluster hit rate  %.3f  (%d imported, %d computed)\n", res.ClusterHitRate, res.BlocksImported, res.BlocksComputed)
	fmt.Fprintf(w, "  bytes imported    %d in %d imports, p50 %.2f ms, p99 %.2f ms; %d imports brought nothing\n", res.BytesImported, res.Imports, res.ImportP50Ms, res.ImportP99Ms, res.ImportFailures)
	fmt.Fprintf(w, "  missed            %d blocks the index named on another node that imports did not bring\n", res.BlocksMissed)
	for _, why := range sortedReasons(res.ImportFailuresByReason) {
		fmt.Fprintf(w, "    brought nothing: %-15s %d\n", why, res.ImportFailuresByReason[why])
	}
	fmt.Fprintf(w, "  reuse bound       %.3f  (the cluster hit rate of an unbounded cache every request reaches)\n", res.ReuseBound)
	fmt.Fprintf(w, "  not cached        %d blocks (request tails past half a cache, or caches full of blocks in use)\n", res.Uncached)
	var ts []string
	for t := range res.ByTransport {
		ts = append(ts, t)
	}
	sort.Strings(ts)
	for _, t := range ts {
		fmt.Fprintf(w, "  by %-14s %d blocks, %d bytes\n", t, res.ByTransport[t].Blocks, res.ByTransport[t].Bytes)
	}
	fmt.Fprintf(w, "  prefill saved     %.2f s at %.0f tokens/s (net of %.2f s fetching)\n", res.PrefillSecondsSaved, res.PrefillRate, res.FetchSeconds)
	fmt.Fprintf(w, "  blocks verified   %d\n", res.BlocksVerified)
}

// sortedReasons returns the reasons of m in order.
func sortedReasons(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readTrace reads up to limit requests (0: all) of the trace at path,
// gunzipped if its name ends in .gz.
func readTrace(path string, limit int) ([]testbed.TraceRequest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return nil, err
		}
		defer z.Close()
		r = z
	}
	return testbed.ReadTrace(r, limit)
}

// runModel prints ModelReplay's results for each routing policy.
func runModel(w io.Writer, reqs []testbed.TraceRequest, opts testbed.ModelOptions, policies string, asJSON bool) error {
	var all []testbed.ModelResult
	nodes, cache := opts.Nodes, opts.CacheBlocks
	for _, p := range strings.Split(policies, ",") {
		opts.Policy = strings.TrimSpace(p)
		res, err := testbed.ModelReplay(reqs, opts)
		if err != nil {
			return err
		}
		all = append(all, res...)
	}
	if asJSON {
		return json.NewEncoder(w).Encode(all)
	}
	fmt.Fprintf(w, "model: %d requests, %d engines of %d blocks (shared: %d)\n", len(reqs), nodes, cache, nodes*cache)
	for _, r := range all {
		fmt.Fprintf(w, "  %-11s %-13s local %.3f  cluster %.3f  (distinct %d of %d held; reuse bound %.3f)\n",
			r.Policy, r.Cache, r.LocalHitRate, r.ClusterHitRate, r.Distinct, r.Held, r.ReuseBound)
	}
	return nil
}
