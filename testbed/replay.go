package testbed

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/netbench"
	"github.com/kvfabric/kvfabric/layout"
)

// Router policies.
const (
	PolicyRandom     = "random"
	PolicyRoundRobin = "round-robin"
	PolicyKVAware    = "kv-aware"
)

// ReplayModel is the default model config of a replay: small, so that a
// 512-token block is 128 KiB and a 1,500-request replay on 4 agents runs
// in a minute or two on two cores.
var ReplayModel = layout.ModelConfig{Layers: 2, KVHeads: 1, HeadDim: 32, DType: layout.DTypeBF16}

// ReplayOptions configure a replay.
type ReplayOptions struct {
	// Policy is the router policy: random, round-robin or kv-aware. If
	// empty, kv-aware.
	Policy string
	// PageSize is the engines' block size in tokens; it must divide 512 or
	// be a multiple of it. If zero, 512 (one trace block, one kvfabric
	// block).
	PageSize int
	// Model is the engines' model config. If zero, ReplayModel.
	Model layout.ModelConfig
	// CacheBlocks is each engine's local cache (its block set's slots). If
	// zero, 512.
	CacheBlocks int
	// Concurrency is how many requests run at once across the cluster. If
	// zero, 4.
	Concurrency int
	// LoadWeight is what one request in flight on an engine costs in
	// blocks of overlap, for kv-aware. If zero, 1; negative is refused.
	LoadWeight float64
	// PrefillRate is the engines' prefill speed in tokens per second, for
	// prefill_seconds_saved. If zero, 10,000.
	PrefillRate float64
	// Speedup replays arrivals at timestamp/Speedup; if zero, requests are
	// sent as fast as the cluster takes them.
	Speedup float64
	// Verify checks every byte of every imported and locally hit block
	// against what its computing engine wrote. If false, no check.
	Verify bool
	// Seed seeds the random policy and the token contents; zero is valid.
	Seed uint64
}

// ReplayResult is what a replay measured. Its JSON keys are the replay
// command's output.
type ReplayResult struct {
	Policy          string  `json:"policy"`
	Nodes           int     `json:"nodes"`
	Requests        int     `json:"requests"`
	BlocksRequested int     `json:"blocks_requested"`
	BlocksLocal     int     `json:"blocks_local"`
	BlocksImported  int     `json:"blocks_imported"`
	BlocksComputed  int     `json:"blocks_computed"`
	LocalHitRate    float64 `json:"local_hit_rate"`
	ClusterHitRate  float64 `json:"cluster_hit_rate"`
	BytesImported   uint64  `json:"bytes_imported"`
	Imports         int     `json:"imports"`
	ImportFailures  int     `json:"import_failures"`
	// ImportFailuresByReason counts the failed imports by why they
	// failed (see ImportFailReason).
	ImportFailuresByReason map[string]int `json:"import_failures_by_reason,omitempty"`
	// ReuseBound is the highest cluster hit rate the trace allows: the
	// share of its blocks that an earlier request also asked for.
	ReuseBound          float64                   `json:"reuse_bound"`
	Uncached            int                       `json:"blocks_uncached"`
	ImportP50Ms         float64                   `json:"import_p50_ms"`
	ImportP99Ms         float64                   `json:"import_p99_ms"`
	ByTransport         map[string]TransportBytes `json:"by_transport"`
	PrefillRate         float64                   `json:"prefill_rate_tokens_per_s"`
	PrefillSecondsSaved float64                   `json:"prefill_seconds_saved"`
	FetchSeconds        float64                   `json:"fetch_seconds"`
	BlocksVerified      int                       `json:"blocks_verified"`
	// BlocksMissed is the blocks the index named another node holding,
	// past what the engine held, that the import did not bring: the
	// holder had recycled them by the time of the lease.
	BlocksMissed    int            `json:"blocks_missed"`
	RequestsPerNode map[string]int `json:"requests_per_node"`
	ElapsedSeconds  float64        `json:"elapsed_seconds"`
	// Timeline holds one entry per request in completion order, for the
	// report's plots.
	Timeline []RequestRecord `json:"timeline"`
}

// TransportBytes is what one transport carried.
type TransportBytes struct {
	Blocks int    `json:"blocks"`
	Bytes  uint64 `json:"bytes"`
}

// RequestRecord is one replayed request.
type RequestRecord struct {
	AtMs     float64 `json:"at_ms"` // completion, from the replay's start
	Node     string  `json:"node"`
	Blocks   int     `json:"blocks"`
	Local    int     `json:"local"`
	Imported int     `json:"imported"`
	ImportMs float64 `json:"import_ms,omitempty"`
	// ImportFailed says an import was tried and brought nothing: the
	// holder evicted the blocks since the lookup, or failed.
	ImportFailed bool `json:"import_failed,omitempty"`
	// ImportFailReason is why, in a word (ImportFailReason), and
	// ImportError what the agent said.
	ImportFailReason string `json:"import_fail_reason,omitempty"`
	ImportError      string `json:"import_error,omitempty"`
	// Uncached counts blocks computed but not kept: the request's tail
	// past half the engine's cache, or every slot pinned by requests in
	// flight.
	Uncached int `json:"uncached,omitempty"`
	// Missed counts blocks the index named another node holding that the
	// import did not bring.
	Missed int `json:"missed,omitempty"`
}

func (o *ReplayOptions) defaults() error {
	switch o.Policy {
	case "":
		o.Policy = PolicyKVAware
	case PolicyRandom, PolicyRoundRobin, PolicyKVAware:
	default:
		return fmt.Errorf("testbed: replay: policy %q (want random, round-robin or kv-aware)", o.Policy)
	}
	if o.PageSize == 0 {
		o.PageSize = TraceBlockTokens
	}
	if o.PageSize < 0 || (TraceBlockTokens%o.PageSize != 0 && o.PageSize%TraceBlockTokens != 0) {
		return fmt.Errorf("testbed: replay: page size %d neither divides nor is a multiple of %d", o.PageSize, TraceBlockTokens)
	}
	if o.Model == (layout.ModelConfig{}) {
		o.Model = ReplayModel
	}
	if o.CacheBlocks < 0 || o.Concurrency < 0 || o.LoadWeight < 0 || o.PrefillRate < 0 || o.Speedup < 0 {
		return errors.New("testbed: replay: cache blocks, concurrency, load weight, prefill rate and speedup must not be negative")
	}
	if o.CacheBlocks == 0 {
		o.CacheBlocks = 512
	}
	if o.Concurrency == 0 {
		o.Concurrency = 4
	}
	if o.LoadWeight == 0 {
		o.LoadWeight = 1
	}
	if o.PrefillRate == 0 {
		o.PrefillRate = 10000
	}
	return nil
}

// replayEngine is one engine: a session with its node's agent and a block
// set bounded to the cache size.
type replayEngine struct {
	node     *Node
	c        *client.Client
	set      *client.BlockSet
	inflight int // guarded by replay.mu
}

type replay struct {
	opts    ReplayOptions
	engines []*replayEngine
	router  *client.Client
	hasher  layout.Hasher
	start   time.Time

	mu    sync.Mutex
	rng   *rand.Rand
	rr    int
	res   ReplayResult
	fetch time.Duration
}

// Replay replays reqs on the cluster, one engine per agent, and returns
// what it measured. Each request goes to an engine by the router policy,
// takes what that engine holds, imports the rest of its prefix that the
// cluster holds, and computes (allocates, writes, registers) what is left.
func Replay(ctx context.Context, c *Cluster, reqs []TraceRequest, opts ReplayOptions) (*ReplayResult, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrTrace)
	}
	h, err := layout.NewHasher(opts.PageSize, layout.HashOptions{})
	if err != nil {
		return nil, fmt.Errorf("testbed: replay: %w", err)
	}
	r := &replay{opts: opts, hasher: h, rng: rand.New(rand.NewPCG(opts.Seed, 0x9e9)),
		res: ReplayResult{Policy: opts.Policy, Nodes: len(c.Nodes), ByTransport: map[string]TransportBytes{},
			RequestsPerNode: map[string]int{}, PrefillRate: opts.PrefillRate}}
	defer r.close()
	for _, n := range c.Nodes {
		cl, err := n.Client(ctx)
		if err != nil {
			return nil, fmt.Errorf("testbed: replay: %s: %w", n.Name, err)
		}
		e := &replayEngine{node: n, c: cl}
		r.engines = append(r.engines, e)
		e.set, err = cl.Register(ctx, client.Engine{Name: "replay-" + n.Name, Model: opts.Model, TPSize: 1,
			PageSize: opts.PageSize, Order: layout.HND, Slots: opts.CacheBlocks})
		if err != nil {
			return nil, fmt.Errorf("testbed: replay: %s: register: %w", n.Name, err)
		}
	}
	r.router = r.engines[0].c
	r.res.ReuseBound = ReuseBound(reqs, opts.PageSize)

	r.start = time.Now()
	sem := make(chan struct{}, opts.Concurrency)
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i, req := range reqs {
		if opts.Speedup > 0 {
			due := r.start.Add(time.Duration(float64(req.Timestamp-reqs[0].Timestamp) / opts.Speedup * float64(time.Millisecond)))
			if d := time.Until(due); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		hashes := r.hashes(req)
		e, overlap, err := r.route(ctx, hashes)
		if err != nil {
			<-sem
			errOnce.Do(func() { firstErr = fmt.Errorf("testbed: replay: request %d: route: %w", i, err) })
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			err := r.serve(ctx, e, hashes, overlap)
			r.mu.Lock()
			e.inflight--
			r.mu.Unlock()
			if err != nil {
				errOnce.Do(func() { firstErr = fmt.Errorf("testbed: replay: request %d on %s: %w", i, e.node.Name, err); cancel() })
			}
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = fmt.Errorf("testbed: replay: %w", ctx.Err())
	}
	r.finish()
	return &r.res, firstErr
}

func (r *replay) close() {
	for _, e := range r.engines {
		e.c.Close()
	}
}

// hashes turns a request's ids into kvfabric block hashes: each id is a
// fixed run of 512 tokens (drawn from a generator seeded by the id), so
// equal leading ids give equal blocks. Only full pages are hashed.
func (r *replay) hashes(req TraceRequest) []uint64 {
	n := len(req.HashIDs) * TraceBlockTokens
	if req.InputLength > 0 {
		n = min(n, req.InputLength)
	}
	n -= n % r.opts.PageSize
	tokens := make([]uint32, 0, len(req.HashIDs)*TraceBlockTokens)
	for _, id := range req.HashIDs {
		if len(tokens) >= n {
			break
		}
		g := rand.New(rand.NewPCG(uint64(id), r.opts.Seed))
		for range TraceBlockTokens {
			tokens = append(tokens, g.Uint32N(128000))
		}
	}
	var out []uint64
	for _, b := range r.hasher.Sequence(tokens[:n]) {
		out = append(out, b.Sequence)
	}
	return out
}

// route picks the engine for a request and counts it in flight there. The
// kv-aware policy returns the overlaps it routed by (blocks of the prefix
// each node holds), nil under the others.
func (r *replay) route(ctx context.Context, hashes []uint64) (*replayEngine, map[string]uint32, error) {
	var overlap map[string]uint32
	if r.opts.Policy == PolicyKVAware && len(hashes) > 0 {
		ov, err := r.router.Lookup(ctx, hashes)
		if err != nil {
			return nil, nil, err
		}
		overlap = map[string]uint32{}
		for _, o := range ov {
			overlap[o.Node] = o.Blocks
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var e *replayEngine
	switch r.opts.Policy {
	case PolicyRandom:
		e = r.engines[r.rng.IntN(len(r.engines))]
	case PolicyRoundRobin:
		e = r.engines[r.rr%len(r.engines)]
		r.rr++
	default:
		// Overlap minus load; ties go to a random one of the best, so
		// that cold prefixes spread.
		best := math.Inf(-1)
		var ties []*replayEngine
		for _, c := range r.engines {
			s := float64(overlap[c.node.Name]) - r.opts.LoadWeight*float64(c.inflight)
			switch {
			case s > best:
				best, ties = s, []*replayEngine{c}
			case s == best:
				ties = append(ties, c)
			}
		}
		e = ties[r.rng.IntN(len(ties))]
	}
	e.inflight++
	return e, overlap, nil
}

// serve runs one request on engine e and accounts it; overlap is route's,
// when it looked the prefix up already.
func (r *replay) serve(ctx context.Context, e *replayEngine, hashes []uint64, overlap map[string]uint32) error {
	rec := RequestRecord{Node: e.node.Name, Blocks: len(hashes)}
	var held []uint32
	defer func() {
		if len(held) > 0 {
			// A release that fails leaves references behind, which the
			// engine's session end returns; the replay goes on.
			e.c.Release(context.WithoutCancel(ctx), e.set.ID, held)
		}
	}()
	// A request longer than half of what the cache retains has its tail
	// computed but not cached: it would evict its own head, and leave no
	// room for the requests beside it.
	if keep := e.set.Retains / 2; len(hashes) > keep {
		rec.Uncached = len(hashes) - keep
		hashes = hashes[:keep]
	}
	if len(hashes) == 0 {
		r.account(rec, nil, 0)
		return nil
	}
	refs, err := e.c.Acquire(ctx, e.set.ID, hashes)
	if err != nil {
		return fmt.Errorf("acquire: %w", err)
	}
	rec.Local = len(refs)
	for _, b := range refs {
		held = append(held, b.Slot)
	}
	if err := r.verify(e, refs, hashes, 0); err != nil {
		return err
	}
	var fetches []*fabricpb.Fetch
	var took time.Duration
	have := len(refs)
	holds := 0 // asked only when something is missing: a full local hit makes no Lookup
	if have < len(hashes) {
		holds = r.clusterHolds(ctx, e, hashes, overlap)
	}
	if holds > have {
		start := time.Now()
		resp, err := e.c.Import(ctx, e.set.ID, hashes)
		took = time.Since(start)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("import: %w", err)
			}
			// Nothing brought (the holder evicted the blocks since the
			// lookup, or failed): the rest is computed, as an engine would.
			rec.ImportFailed, rec.ImportFailReason, rec.ImportError = true, ImportFailReason(err), err.Error()
		} else if len(resp.Blocks) <= have {
			// Answered, with nothing past what was here.
			rec.ImportFailed, rec.ImportFailReason, rec.ImportError = true, "brought-nothing", resp.Error
			fetches = resp.Fetches
			for _, b := range resp.Blocks {
				held = append(held, b.Slot)
			}
		} else {
			fetches = resp.Fetches
			for _, b := range resp.Blocks {
				held = append(held, b.Slot)
			}
			if len(resp.Blocks) > have {
				// Blocks that arrived, past what was here already.
				if err := r.verify(e, resp.Blocks[have:], hashes[have:len(resp.Blocks)], have); err != nil {
					return err
				}
				for _, f := range fetches {
					rec.Imported += int(f.Blocks)
				}
				// What a concurrent request computed here meanwhile is a
				// local hit.
				rec.Local += len(resp.Blocks) - have - rec.Imported
				have = len(resp.Blocks)
			}
			rec.ImportMs = float64(took.Microseconds()) / 1000
		}
		rec.Missed = max(0, min(holds, len(hashes))-have)
	}
	if have < len(hashes) {
		rest := hashes[have:]
		slots, err := e.c.Allocate(ctx, e.set.ID, len(rest))
		if status.Code(err) == codes.ResourceExhausted {
			// Every slot pinned by requests in flight: computed, not cached.
			rec.Uncached += len(rest)
			r.account(rec, fetches, took)
			return nil
		}
		if err != nil {
			return fmt.Errorf("allocate %d slots: %w", len(rest), err)
		}
		for j, s := range slots {
			kvtest.Fill(e.set.Layout, e.set.Ranks, int(s), rest[j])
		}
		req := &fabricpb.RegisterBlocksRequest{BlockSet: e.set.ID, Slots: slots, Hashes: rest}
		if have > 0 {
			req.Parent, req.ParentSet = hashes[have-1], true
		}
		resp, err := e.c.API().RegisterBlocks(ctx, req)
		if err != nil {
			e.c.Free(context.WithoutCancel(ctx), e.set.ID, slots)
			return fmt.Errorf("register %d blocks: %w", len(rest), err)
		}
		for _, b := range resp.GetBlocks() {
			held = append(held, b.Slot)
		}
	}
	r.account(rec, fetches, took)
	return nil
}

// clusterHolds is the longest prefix of hashes any node but e's holds:
// from overlap when route looked it up, else asked of e's agent.
func (r *replay) clusterHolds(ctx context.Context, e *replayEngine, hashes []uint64, overlap map[string]uint32) int {
	if overlap == nil {
		ov, err := e.c.Lookup(ctx, hashes)
		if err != nil {
			return 0
		}
		overlap = map[string]uint32{}
		for _, o := range ov {
			overlap[o.Node] = o.Blocks
		}
	}
	best := 0
	for node, blocks := range overlap {
		if node != e.node.Name {
			best = max(best, int(blocks))
		}
	}
	return best
}

func (r *replay) verify(e *replayEngine, refs []*fabricpb.BlockRef, hashes []uint64, from int) error {
	if !r.opts.Verify {
		return nil
	}
	for i, b := range refs {
		if b.Hash != hashes[i] {
			return fmt.Errorf("block %d: got hash %d, want %d", from+i, b.Hash, hashes[i])
		}
		if err := kvtest.Check(e.set.Layout, e.set.Ranks, int(b.Slot), hashes[i]); err != nil {
			return fmt.Errorf("block %d: %w", from+i, err)
		}
	}
	r.mu.Lock()
	r.res.BlocksVerified += len(refs)
	r.mu.Unlock()
	return nil
}

func (r *replay) account(rec RequestRecord, fetches []*fabricpb.Fetch, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.AtMs = float64(time.Since(r.start).Microseconds()) / 1000
	res := &r.res
	res.Requests++
	res.RequestsPerNode[rec.Node]++
	res.BlocksRequested += rec.Blocks
	res.BlocksLocal += rec.Local
	res.BlocksImported += rec.Imported
	res.BlocksComputed += rec.Blocks - rec.Local - rec.Imported
	res.Uncached += rec.Uncached
	res.BlocksMissed += rec.Missed
	if rec.ImportFailed {
		res.ImportFailures++
		if res.ImportFailuresByReason == nil {
			res.ImportFailuresByReason = map[string]int{}
		}
		res.ImportFailuresByReason[rec.ImportFailReason]++
	}
	for _, f := range fetches {
		t := res.ByTransport[f.Transport]
		t.Blocks += int(f.Blocks)
		t.Bytes += f.Bytes
		res.ByTransport[f.Transport] = t
		res.BytesImported += f.Bytes
	}
	if len(fetches) > 0 {
		res.Imports++
		r.fetch += took
	}
	res.Timeline = append(res.Timeline, rec)
}

func (r *replay) finish() {
	res := &r.res
	res.ElapsedSeconds = time.Since(r.start).Seconds()
	if res.BlocksRequested > 0 {
		res.LocalHitRate = float64(res.BlocksLocal) / float64(res.BlocksRequested)
		res.ClusterHitRate = float64(res.BlocksLocal+res.BlocksImported) / float64(res.BlocksRequested)
	}
	// The percentiles of the latencies the report plots.
	var la []time.Duration
	for _, ms := range res.ImportLatencies() {
		la = append(la, time.Duration(ms*float64(time.Millisecond)))
	}
	if p, ok := netbench.Percentile(la, 50); ok {
		res.ImportP50Ms = float64(p.Microseconds()) / 1000
	}
	if p, ok := netbench.Percentile(la, 99); ok {
		res.ImportP99Ms = float64(p.Microseconds()) / 1000
	}
	res.FetchSeconds = r.fetch.Seconds()
	saved := float64((res.BlocksLocal+res.BlocksImported)*r.opts.PageSize) / r.opts.PrefillRate
	res.PrefillSecondsSaved = saved - res.FetchSeconds
	sort.SliceStable(res.Timeline, func(i, j int) bool { return res.Timeline[i].AtMs < res.Timeline[j].AtMs })
}

// ImportLatencies returns each import's latency in milliseconds, for
// plots.
func (res *ReplayResult) ImportLatencies() []float64 {
	var out []float64
	for _, t := range res.Timeline {
		if t.Imported > 0 {
			out = append(out, t.ImportMs)
		}
	}
	return out
}
