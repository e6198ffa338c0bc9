package testbed

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/layout"
)

// A model small enough that writing and checking every element of every
// block stays quick under the race detector: 16 KiB per 512-token block.
var replayTestModel = layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 8, DType: layout.DTypeBF16}

// upperBound is the cluster hit rate of an unbounded cache: the blocks
// whose whole prefix an earlier request already had.
func upperBound(t *testing.T, reqs []TraceRequest) float64 {
	t.Helper()
	seen := map[string]bool{}
	hit, all := 0, 0
	for _, r := range reqs {
		n := min(len(r.HashIDs)*TraceBlockTokens, r.InputLength) / TraceBlockTokens
		for i := 1; i <= n; i++ {
			k := fmt.Sprint(r.HashIDs[:i])
			if seen[k] {
				hit++
			}
			seen[k] = true
			all++
		}
	}
	return float64(hit) / float64(all)
}

func replayOn(t *testing.T, nodes int, reqs []TraceRequest, opts ReplayOptions) *ReplayResult {
	t.Helper()
	c := startWithPool(t, nodes, "host=64MiB")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := Replay(ctx, c, reqs, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %d requests, %d blocks: local %.3f, cluster %.3f, %d imported (%d bytes), %d verified, p50 %.2f ms, p99 %.2f ms, saved %.2f s, %.1f s",
		res.Policy, res.Requests, res.BlocksRequested, res.LocalHitRate, res.ClusterHitRate, res.BlocksImported, res.BytesImported,
		res.BlocksVerified, res.ImportP50Ms, res.ImportP99Ms, res.PrefillSecondsSaved, res.ElapsedSeconds)
	return res
}

// On a trace built to share prefixes, with caches too small to hold it
// all, routing by overlap keeps each conversation on the engine that holds
// its history: kv-aware beats random on cluster hit rate (random spreads
// copies of the same prefixes over every cache, which then hold fewer
// distinct blocks), and on local hit rate by far. Every block hit or
// imported is checked byte by byte against what its computing engine
// wrote.
func TestReplayKVAwareBeatsRandom(t *testing.T) {
	reqs, err := TraceGen{Requests: 400, SystemPrompts: 6, SystemBlocks: 3, Active: 24, Seed: 3}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	bound := upperBound(t, reqs)
	t.Logf("an unbounded cache hits %.3f", bound)
	opts := ReplayOptions{Model: replayTestModel, CacheBlocks: 32, Concurrency: 2, Verify: true, Seed: 5}
	results := map[string]*ReplayResult{}
	for _, p := range []string{PolicyRandom, PolicyKVAware} {
		o := opts
		o.Policy = p
		res := replayOn(t, 3, reqs, o)
		results[p] = res
		blocks := 0
		for _, r := range reqs {
			blocks += min(len(r.HashIDs)*TraceBlockTokens, r.InputLength) / TraceBlockTokens
		}
		if res.Requests != len(reqs) || res.BlocksRequested != blocks {
			t.Fatalf("%s: %d requests, %d blocks; want %d, %d", p, res.Requests, res.BlocksRequested, len(reqs), blocks)
		}
		if res.BlocksLocal+res.BlocksImported+res.BlocksComputed != res.BlocksRequested {
			t.Fatalf("%s: local %d + imported %d + computed %d != %d", p, res.BlocksLocal, res.BlocksImported, res.BlocksComputed, res.BlocksRequested)
		}
		if res.BlocksVerified != res.BlocksLocal+res.BlocksImported {
			t.Fatalf("%s: %d blocks verified, want every hit and import (%d)", p, res.BlocksVerified, res.BlocksLocal+res.BlocksImported)
		}
		if res.ClusterHitRate > bound+1e-9 {
			t.Fatalf("%s: cluster hit rate %.3f above what an unbounded cache gets (%.3f)", p, res.ClusterHitRate, bound)
		}
		if res.ReuseBound != bound {
			t.Fatalf("%s: reuse bound %v, want the trace's %v", p, res.ReuseBound, bound)
		}
		failed := 0
		for why, n := range res.ImportFailuresByReason {
			failed += n
			if why == "" || n <= 0 {
				t.Fatalf("%s: failures by reason %v", p, res.ImportFailuresByReason)
			}
		}
		missed := 0
		for _, r := range res.Timeline {
			if r.ImportFailed && (r.ImportFailReason == "" || r.ImportError == "" && r.ImportFailReason != "brought-nothing") {
				t.Fatalf("%s: a failed import without its reason: %+v", p, r)
			}
			// An import is tried only for blocks the index names on
			// another node: one that brought nothing missed them.
			if r.ImportFailed && r.Missed == 0 || r.Missed < 0 || r.Missed > r.Blocks-r.Local-r.Imported {
				t.Fatalf("%s: %d blocks missed: %+v", p, r.Missed, r)
			}
			missed += r.Missed
		}
		if missed != res.BlocksMissed {
			t.Fatalf("%s: %d blocks missed by request, %d in all", p, missed, res.BlocksMissed)
		}
		if failed != res.ImportFailures {
			t.Fatalf("%s: %d failures by reason %v, %d in all", p, failed, res.ImportFailuresByReason, res.ImportFailures)
		}
		per := uint64(replayTestModel.Layers * 2 * replayTestModel.KVHeads * replayTestModel.HeadDim * 2 * TraceBlockTokens)
		if res.BytesImported != uint64(res.BlocksImported)*per || res.ByTransport["quic"].Blocks != res.BlocksImported {
			t.Fatalf("%s: %d bytes for %d blocks of %d, by transport %v", p, res.BytesImported, res.BlocksImported, per, res.ByTransport)
		}
		if res.BlocksImported > 0 && (res.ImportP50Ms <= 0 || res.ImportP99Ms < res.ImportP50Ms) {
			t.Fatalf("%s: import p50 %.3f ms, p99 %.3f ms", p, res.ImportP50Ms, res.ImportP99Ms)
		}
		saved := float64((res.BlocksLocal+res.BlocksImported)*TraceBlockTokens)/10000 - res.FetchSeconds
		if d := res.PrefillSecondsSaved - saved; d > 1e-6 || d < -1e-6 {
			t.Fatalf("%s: prefill_seconds_saved %.3f, want %.3f", p, res.PrefillSecondsSaved, saved)
		}
		if len(res.Timeline) != len(reqs) {
			t.Fatalf("%s: %d requests in the timeline", p, len(res.Timeline))
		}
	}
	r, k := results[PolicyRandom], results[PolicyKVAware]
	// Random must have moved blocks between nodes for the imports to be
	// checked at all.
	if r.BlocksImported == 0 {
		t.Fatal("random routing imported nothing")
	}
	// Measured here (an unbounded cache: 0.73): random local 0.35,
	// cluster 0.40 to 0.58 (the more gossip keeps up, the more it
	// imports; lower on a loaded machine); kv-aware local 0.52 to 0.57,
	// cluster the same. The cluster rates are asserted in order only,
	// the local ones with a margin under half the smallest gap seen.
	if k.ClusterHitRate <= r.ClusterHitRate {
		t.Fatalf("kv-aware cluster hit rate %.3f, random %.3f: want kv-aware ahead", k.ClusterHitRate, r.ClusterHitRate)
	}
	if k.LocalHitRate < r.LocalHitRate+0.08 {
		t.Fatalf("kv-aware local hit rate %.3f, random %.3f: want kv-aware ahead by 0.08", k.LocalHitRate, r.LocalHitRate)
	}
}

// Round robin sends every node the same share, and a replay's record
// renders with its plots.
func TestReplayRoundRobinAndRecord(t *testing.T) {
	reqs, err := TraceGen{Requests: 120, Seed: 9}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	res := replayOn(t, 3, reqs, ReplayOptions{Policy: PolicyRoundRobin, Model: replayTestModel, CacheBlocks: 64, Verify: true})
	for _, n := range []string{"node1", "node2", "node3"} {
		if res.RequestsPerNode[n] != 40 {
			t.Fatalf("requests per node %v, want 40 each", res.RequestsPerNode)
		}
	}
	if res.BlocksImported == 0 || res.BlocksVerified != res.BlocksLocal+res.BlocksImported {
		t.Fatalf("%d imported, %d verified of %d hits", res.BlocksImported, res.BlocksVerified, res.BlocksLocal+res.BlocksImported)
	}
	rec := ReplayRecord("round robin", res)
	if len(rec.LatencyMs) != 1 || len(rec.HitRate) != 2 {
		t.Fatalf("record has %d latency samples and %d hit-rate series", len(rec.LatencyMs), len(rec.HitRate))
	}
	// 120 requests in windows of 50: three points, the last at the end.
	if pts := rec.HitRate["cluster (round-robin)"]; len(pts) != 3 || pts[2].X != res.Timeline[119].AtMs/1000 {
		t.Fatalf("hit-rate points %v", pts)
	}
}

func TestReplayOptionsRefused(t *testing.T) {
	for _, c := range []struct {
		desc string
		o    ReplayOptions
		want string
	}{
		{"unknown policy", ReplayOptions{Policy: "fastest"}, "policy"},
		{"page neither divides nor multiplies 512", ReplayOptions{PageSize: 300}, "page size 300"},
		{"negative page", ReplayOptions{PageSize: -512}, "page size"},
		{"negative cache", ReplayOptions{CacheBlocks: -1}, "negative"},
		{"negative load weight", ReplayOptions{LoadWeight: -1}, "negative"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			_, err := Replay(context.Background(), &Cluster{}, []TraceRequest{{HashIDs: []int64{1}}}, c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	if _, err := Replay(context.Background(), &Cluster{}, nil, ReplayOptions{}); err == nil {
		t.Fatal("no requests: no error")
	}
}

// Pages of 1,024 tokens (two trace blocks each) and 256 (half of one)
// hash the same trace into half or twice the blocks.
func TestReplayHashesPerPage(t *testing.T) {
	req := TraceRequest{InputLength: 3 * TraceBlockTokens, HashIDs: []int64{4, 5, 6}}
	for _, c := range []struct{ page, want int }{{512, 3}, {256, 6}, {1024, 1}, {1536, 1}} {
		o := ReplayOptions{PageSize: c.page}
		if err := o.defaults(); err != nil {
			t.Fatal(err)
		}
		h, _ := layout.NewHasher(c.page, layout.HashOptions{})
		r := &replay{opts: o, hasher: h}
		if got := len(r.hashes(req)); got != c.want {
			t.Fatalf("page %d: %d blocks, want %d", c.page, got, c.want)
		}
	}
	// A shared leading id gives a shared leading block; a different one
	// does not.
	h, _ := layout.NewHasher(512, layout.HashOptions{})
	r := &replay{opts: ReplayOptions{PageSize: 512}, hasher: h}
	a := r.hashes(TraceRequest{HashIDs: []int64{1, 2}})
	b := r.hashes(TraceRequest{HashIDs: []int64{1, 3}})
	if a[0] != b[0] || a[1] == b[1] {
		t.Fatalf("hashes %v and %v", a, b)
	}
}

// A request longer than half of what its engine's cache retains has its
// tail computed and not kept: the same request again hits exactly the kept
// head, and the accounting still covers every block.
func TestReplayCutsRequestsPastHalfTheCache(t *testing.T) {
	ids := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	reqs := []TraceRequest{{HashIDs: ids}, {HashIDs: ids}}
	res := replayOn(t, 1, reqs, ReplayOptions{Policy: PolicyRoundRobin, Model: replayTestModel, CacheBlocks: 16, Concurrency: 1, Verify: true})
	first, second := res.Timeline[0], res.Timeline[1]
	kept := first.Blocks - first.Uncached
	if kept <= 0 || kept > 8 || first.Local != 0 {
		t.Fatalf("first request: %+v (a cache of 16 keeps at most 8 of its 12 blocks)", first)
	}
	if second.Local != kept || second.Uncached != first.Uncached {
		t.Fatalf("second request: %+v, want %d local hits and %d uncached", second, kept, first.Uncached)
	}
	if res.BlocksComputed != 24-kept || res.Uncached != 2*(12-kept) || res.BlocksVerified != kept {
		t.Fatalf("computed %d, uncached %d, verified %d; kept %d", res.BlocksComputed, res.Uncached, res.BlocksVerified, kept)
	}
}

// A throughput sweep: every run imports its blocks whole (Consume checks
// every byte) and reports a rate; the record draws both throughput plots.
func TestSweepThroughput(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	pts, err := Sweep(ctx, SweepOptions{Bin: bin, PageSizes: []int{16}, ChunkBytes: []int{1 << 20, 4 << 20}, Bytes: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 2 || pts[0].BlockBytes != 256<<10 || pts[1].ChunkBytes != 4<<20 {
		t.Fatalf("points %+v", pts)
	}
	for _, p := range pts {
		if p.GBps <= 0 {
			t.Fatalf("point %+v has no rate", p)
		}
		t.Logf("block %d KiB, chunk %d MiB: %.3f GB/s", p.BlockBytes>>10, p.ChunkBytes>>20, p.GBps)
	}
	if _, err := Sweep(ctx, SweepOptions{Bin: bin}); err == nil {
		t.Fatal("a sweep of nothing: no error")
	}
}

// ReuseBound counts a block as reusable when an earlier request asked for
// it: at the trace's page it is the share of repeated id prefixes (the
// brute-force count), and pages that split a trace block, or span two,
// are named by the ids up to the one that ends them.
func TestReuseBound(t *testing.T) {
	reqs, err := TraceGen{Requests: 300, SystemPrompts: 5, SystemBlocks: 3, Active: 16, Seed: 7}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ReuseBound(reqs, TraceBlockTokens), upperBound(t, reqs); got != want || got <= 0 || got >= 1 {
		t.Fatalf("ReuseBound at page %d = %v, brute force %v", TraceBlockTokens, got, want)
	}
	tr := func(ids ...int64) TraceRequest {
		return TraceRequest{HashIDs: ids, InputLength: len(ids) * TraceBlockTokens}
	}
	for _, c := range []struct {
		desc string
		reqs []TraceRequest
		page int
		want float64
	}{
		{"nothing repeats", []TraceRequest{tr(1, 2), tr(3, 4)}, 512, 0},
		{"the second repeats the first", []TraceRequest{tr(1, 2), tr(1, 2)}, 512, 2.0 / 4},
		{"a shared first id", []TraceRequest{tr(1, 2), tr(1, 3)}, 512, 1.0 / 4},
		{"same ids after another first", []TraceRequest{tr(1, 2), tr(3, 2)}, 512, 0},
		{"pages of 256: two per id", []TraceRequest{tr(1, 2), tr(1, 3)}, 256, 2.0 / 8},
		{"pages of 1024 span two ids", []TraceRequest{tr(1, 2), tr(1, 3), tr(1, 2)}, 1024, 1.0 / 3},
		{"a partial last page is not a block", []TraceRequest{{HashIDs: []int64{1, 2}, InputLength: 700}, tr(1, 2)}, 512, 1.0 / 3},
		{"no page", []TraceRequest{tr(1)}, 0, 0},
	} {
		if got := ReuseBound(c.reqs, c.page); got != c.want {
			t.Errorf("%s: ReuseBound = %v, want %v", c.desc, got, c.want)
		}
	}
}

// A failed import's reason in a word, from what the agent answered.
func TestImportFailReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.NotFound, "blocks 0..3 of 4 (from hash 7) not imported: no node holds them"), "no-holder"},
		{status.Error(codes.Unavailable, "blocks 0..3 of 4 (from hash 7) not imported: n2: lease: busy; every holder tried failed (8 tried)"), "holders-failed"},
		{status.Error(codes.DeadlineExceeded, "blocks 0..3 of 4 not imported: context deadline exceeded"), "timeout"},
		{context.DeadlineExceeded, "timeout"},
		{status.Error(codes.ResourceExhausted, "block set 1: 0 of 4 slots free"), "resource-exhausted"},
		{status.Error(codes.Unavailable, "n2: connection refused"), "unavailable"},
	} {
		if got := ImportFailReason(c.err); got != c.want {
			t.Errorf("ImportFailReason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
