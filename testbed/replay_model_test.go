package testbed

import (
	"slices"
	"testing"
)

// Two engines of 4 blocks, round-robin, one block a request. Engine 1
// holds an old block of its own (2) and a copy of one engine 0 uses too
// (1). When engine 1 needs room, LRU evicts 2, the cluster's only copy;
// cluster-aware evicts its copy of 1, and request 10 still finds 2.
func TestModelClusterAwareKeepsTheLastCopy(t *testing.T) {
	ids := []int64{1, 2, 3, 1, 4, 5, 1, 6, 7, 8, 2}
	reqs := make([]TraceRequest, len(ids))
	for i, id := range ids {
		reqs[i] = TraceRequest{Timestamp: int64(i), InputLength: TraceBlockTokens, OutputLength: 1, HashIDs: []int64{id}}
	}
	res, err := ModelReplay(reqs, ModelOptions{Nodes: 2, CacheBlocks: 4, Policy: PolicyRoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	// The shared cache of 8 holds all 8 blocks: requests 3, 6 and 10 hit.
	want := map[string]struct{ local, imported int }{
		ModelLRU:          {1, 1},
		ModelClusterAware: {1, 2},
		ModelClusterAged:  {1, 2},
		ModelSharedLRU:    {3, 0},
	}
	if len(res) != len(ModelCaches) {
		t.Fatalf("%d results, want %d", len(res), len(ModelCaches))
	}
	for i, r := range res {
		w := want[r.Cache]
		if r.Cache != ModelCaches[i] || r.BlocksRequested != len(ids) || r.BlocksLocal != w.local || r.BlocksImported != w.imported {
			t.Errorf("%s: %d requested, %d local, %d imported; want %d, %d, %d", r.Cache, r.BlocksRequested, r.BlocksLocal, r.BlocksImported, len(ids), w.local, w.imported)
		}
	}
}

// One engine of 4 blocks. Block 1 is hit once, then three blocks never
// hit are stored after it: LRU evicts 1, its least recently used, for
// block 5, and misses it at the end; cluster-aged evicts 2, the oldest of
// the blocks not hit since they were stored, and hits 1.
func TestModelClusterAgedEvictsUnreusedFirst(t *testing.T) {
	ids := []int64{1, 1, 2, 3, 4, 5, 1}
	reqs := make([]TraceRequest, len(ids))
	for i, id := range ids {
		reqs[i] = TraceRequest{InputLength: TraceBlockTokens, HashIDs: []int64{id}}
	}
	res, err := ModelReplay(reqs, ModelOptions{Nodes: 1, CacheBlocks: 4, Policy: PolicyRoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		want := 1
		if r.Cache == ModelClusterAged {
			want = 2
		}
		if r.BlocksLocal != want || r.BlocksImported != 0 {
			t.Errorf("%s: %d local, %d imported; want %d, 0", r.Cache, r.BlocksLocal, r.BlocksImported, want)
		}
	}
	// With no age for a block not yet hit, cluster-aged is LRU.
	res, err = ModelReplay(reqs, ModelOptions{Nodes: 1, CacheBlocks: 4, Policy: PolicyRoundRobin, FreshAge: 1e-9})
	if err != nil {
		t.Fatal(err)
	}
	if r := res[2]; r.Cache != ModelClusterAged || r.BlocksLocal != 1 {
		t.Errorf("%s with no fresh age: %d local, want 1", r.Cache, r.BlocksLocal)
	}
}

// On the synthetic trace with caches that cannot hold its working set,
// cluster-aware eviction keeps more distinct blocks than per-engine LRU
// and hits more in the cluster, under the same routing.
func TestModelClusterAwareOnSyntheticTrace(t *testing.T) {
	reqs, err := TraceGen{Requests: 600, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	res, err := ModelReplay(reqs, ModelOptions{Nodes: 4, CacheBlocks: 64, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	lru, aware, shared := res[0], res[1], res[3]
	if aware.ClusterHitRate <= lru.ClusterHitRate || aware.Distinct <= lru.Distinct {
		t.Errorf("cluster-aware: hit rate %.3f, %d distinct; lru %.3f, %d distinct", aware.ClusterHitRate, aware.Distinct, lru.ClusterHitRate, lru.Distinct)
	}
	if shared.LocalHitRate != shared.ClusterHitRate || shared.ClusterHitRate > shared.ReuseBound {
		t.Errorf("shared: local %.3f, cluster %.3f, bound %.3f", shared.LocalHitRate, shared.ClusterHitRate, shared.ReuseBound)
	}
}

func TestModelOptionsRefused(t *testing.T) {
	reqs := []TraceRequest{{InputLength: TraceBlockTokens, HashIDs: []int64{1}}}
	for _, tc := range []struct {
		name string
		opts ModelOptions
		reqs []TraceRequest
	}{
		{"kv-aware routing", ModelOptions{Policy: PolicyKVAware}, reqs},
		{"negative nodes", ModelOptions{Nodes: -1}, reqs},
		{"cache of one block", ModelOptions{CacheBlocks: 1}, reqs},
		{"no requests", ModelOptions{}, nil},
		{"65 nodes", ModelOptions{Nodes: 65}, reqs},
		{"negative age", ModelOptions{SharedAge: -1}, reqs},
		{"age past the most", ModelOptions{FreshAge: 1<<20 + 1}, reqs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ModelReplay(tc.reqs, tc.opts); err == nil {
				t.Fatal("accepted")
			}
		})
	}
	if _, err := ModelReplay(reqs, ModelOptions{CacheBlocks: 2}); err != nil {
		t.Fatalf("a cache of 2 blocks (the least): %v", err)
	}
	if _, err := ModelReplay(reqs, ModelOptions{Nodes: 64, SharedAge: 1 << 20, FreshAge: 1 << 20}); err != nil {
		t.Fatalf("64 nodes and the longest ages (the most): %v", err)
	}
}

// Leaves first, as the pool does: engine 1 holds a copy of block 1 (engine
// 0 holds it too) and block 2, which extends it, then block 3. Storing 4
// in its cache of 3, cluster-aware eviction drops the copy of 1, unless
// leaves go first: then 2, the least recently used leaf, goes and 1 stays.
func TestModelLeavesFirst(t *testing.T) {
	for _, leaves := range []bool{false, true} {
		m := newCacheModel(ModelClusterAware, 2, 3, ModelSharedAge, ModelFreshAge)
		m.leaves, m.parent = leaves, map[uint64]uint64{}
		m.serve(0, []uint64{1}, 2)
		if local, imported := m.serve(1, []uint64{1, 2}, 2); local != 0 || imported != 1 {
			t.Fatalf("leaves %v: [1 2] on engine 1: %d local, %d imported; want 0, 1", leaves, local, imported)
		}
		m.serve(1, []uint64{3}, 2)
		m.serve(1, []uint64{4}, 2)
		want := []uint64{2, 3, 4}
		if leaves {
			want = []uint64{1, 3, 4}
		}
		var got []uint64
		for b := range m.caches[1] {
			got = append(got, b)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("leaves %v: engine 1 holds %v, want %v", leaves, got, want)
		}
	}
}
