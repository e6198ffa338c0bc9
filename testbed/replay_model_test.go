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
		{"unknown cache", ModelOptions{Caches: []string{ModelLRU, "fifo"}}, reqs},
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

// held returns the blocks engine node's cache holds, in order.
func held(m *cacheModel, node int) []uint64 {
	var got []uint64
	for b := range m.caches[node] {
		got = append(got, b)
	}
	slices.Sort(got)
	return got
}

// Two engines of 3 blocks. Engine 1 imports block 1, engine 0's oldest,
// and later drops its own copy; engine 0 then needs room. Without the
// import's read counting as a use, engine 0 evicts 1, just read by a
// peer; with it (aware-touch), 2, its least recently used.
func TestModelAwareTouchKeepsTheCopyRead(t *testing.T) {
	for _, tc := range []struct {
		cache string
		want  []uint64
	}{
		{ModelClusterAware, []uint64{2, 3, 7}},
		{ModelAwareTouch, []uint64{1, 3, 7}},
	} {
		m := newCacheModel(tc.cache, 2, 3, ModelSharedAge, ModelFreshAge)
		m.parent = map[uint64]uint64{}
		for _, b := range []uint64{1, 2, 3} {
			m.serve(0, []uint64{b}, 1)
		}
		if _, imported := m.serve(1, []uint64{1}, 1); imported != 1 {
			t.Fatalf("%s: engine 1 imported %d of [1], want 1", tc.cache, imported)
		}
		for _, b := range []uint64{4, 5, 6} {
			m.serve(1, []uint64{b}, 1) // the third drops engine 1's copy of 1, shared
		}
		if got := held(m, 1); !slices.Equal(got, []uint64{4, 5, 6}) {
			t.Fatalf("%s: engine 1 holds %v, want [4 5 6]", tc.cache, got)
		}
		m.serve(0, []uint64{7}, 1)
		if got := held(m, 0); !slices.Equal(got, tc.want) {
			t.Errorf("%s: engine 0 holds %v, want %v", tc.cache, got, tc.want)
		}
	}
}

// Which copy of a shared block is not demoted: keep-newest keeps the one
// used last, keep-ranked the holder ranked first; aware-touch demotes
// both.
func TestModelKeepOneCopy(t *testing.T) {
	ranked := 0
	if modelRank(1, 1) > modelRank(1, 0) {
		ranked = 1
	}
	for _, tc := range []struct {
		cache string
		keeps [2]bool
	}{
		{ModelAwareTouch, [2]bool{false, false}},
		{ModelKeepNewest, [2]bool{false, true}}, // engine 1 stored it last
		{ModelKeepRanked, [2]bool{ranked == 0, ranked == 1}},
	} {
		m := newCacheModel(tc.cache, 2, 4, ModelSharedAge, ModelFreshAge)
		m.parent = map[uint64]uint64{}
		m.serve(0, []uint64{1}, 1)
		m.serve(1, []uint64{1}, 1)
		for n := range 2 {
			demoted := m.key(n, 1, m.caches[n][1]) < modelBase
			if demoted == tc.keeps[n] {
				t.Errorf("%s: engine %d's copy demoted %v, want %v", tc.cache, n, demoted, !tc.keeps[n])
			}
		}
		// Engine 0 uses its copy: keep-newest moves the keep to it.
		m.serve(0, []uint64{1}, 1)
		if tc.cache == ModelKeepNewest && (m.key(0, 1, m.caches[0][1]) < modelBase || m.key(1, 1, m.caches[1][1]) >= modelBase) {
			t.Errorf("%s: after engine 0's use, engine 0's copy should be kept and engine 1's demoted", tc.cache)
		}
	}
}

// Engine 1 imports 5, hits it again here, then imports 1 and stores 2;
// storing 3 in its cache of 3 drops, under aware-touch, 5 (the shared
// copy used least recently), and under import-cold 1, imported and not
// used here since.
func TestModelImportCold(t *testing.T) {
	for _, tc := range []struct {
		cache string
		want  []uint64
	}{
		{ModelAwareTouch, []uint64{1, 2, 3}},
		{ModelImportCold, []uint64{2, 3, 5}},
	} {
		m := newCacheModel(tc.cache, 2, 3, ModelSharedAge, ModelFreshAge)
		m.parent = map[uint64]uint64{}
		m.serve(0, []uint64{5}, 1)
		m.serve(0, []uint64{1}, 1)
		for _, b := range []uint64{5, 5, 1, 2, 3} {
			m.serve(1, []uint64{b}, 1)
		}
		if got := held(m, 1); !slices.Equal(got, tc.want) {
			t.Errorf("%s: engine 1 holds %v, want %v", tc.cache, got, tc.want)
		}
	}
}

// no-admit: an importer keeps no imported block unless a block the
// request computed extends it (leaves first keeps a parent under its
// child), and then as import-cold does.
func TestModelNoAdmit(t *testing.T) {
	for _, leaves := range []bool{false, true} {
		m := newCacheModel(ModelNoAdmit, 2, 4, ModelSharedAge, ModelFreshAge)
		m.leaves, m.parent = leaves, map[uint64]uint64{}
		m.serve(0, []uint64{1, 2}, 2)
		if local, imported := m.serve(1, []uint64{1, 2}, 2); local != 0 || imported != 2 {
			t.Fatalf("leaves %v: [1 2] on engine 1: %d local, %d imported; want 0, 2", leaves, local, imported)
		}
		if got := held(m, 1); len(got) != 0 {
			t.Errorf("leaves %v: engine 1 keeps %v of a request it imported whole, want none", leaves, got)
		}
		m.serve(1, []uint64{1, 3}, 2)
		if got := held(m, 1); !slices.Equal(got, []uint64{1, 3}) {
			t.Errorf("leaves %v: engine 1 holds %v after [1 3], want [1 3]", leaves, got)
		}
		if !m.caches[1][1].cold {
			t.Errorf("leaves %v: engine 1's imported copy of 1 is not cold", leaves)
		}
	}
}

// aware-interior: engine 1 holds a copy of block 1 (engine 0 holds it
// too), block 2 extending it, and 3; storing 4 in its cache of 3 under
// leaves first, aware-touch drops 2, the least recently used leaf, and
// aware-interior the copy of 1 under it.
func TestModelInterior(t *testing.T) {
	for _, tc := range []struct {
		cache string
		want  []uint64
	}{
		{ModelAwareTouch, []uint64{1, 3, 4}},
		{ModelInterior, []uint64{2, 3, 4}},
	} {
		m := newCacheModel(tc.cache, 2, 3, ModelSharedAge, ModelFreshAge)
		m.leaves, m.parent = true, map[uint64]uint64{}
		m.serve(0, []uint64{1}, 2)
		m.serve(1, []uint64{1, 2}, 2)
		m.serve(1, []uint64{3}, 2)
		m.serve(1, []uint64{4}, 2)
		if got := held(m, 1); !slices.Equal(got, tc.want) {
			t.Errorf("%s: engine 1 holds %v, want %v", tc.cache, got, tc.want)
		}
	}
}

// aware-spill: two engines of 2 blocks. Engine 0's victim, held nowhere
// else, moves to engine 1 while it has room, then to engine 1 in place of
// its own victim when that is older; engine 0 then imports it.
func TestModelSpill(t *testing.T) {
	m := newCacheModel(ModelSpill, 2, 2, ModelSharedAge, ModelFreshAge)
	m.leaves, m.parent = true, map[uint64]uint64{}
	m.serve(0, []uint64{1}, 1)
	m.serve(0, []uint64{2}, 1)
	m.serve(1, []uint64{3}, 1)
	m.serve(0, []uint64{4}, 1) // 1 moves to engine 1's free slot
	if a, b := held(m, 0), held(m, 1); !slices.Equal(a, []uint64{2, 4}) || !slices.Equal(b, []uint64{1, 3}) {
		t.Fatalf("after storing 4: engines hold %v and %v, want [2 4] and [1 3]", a, b)
	}
	m.serve(0, []uint64{5}, 1) // 2 moves to engine 1, whose 1 is older and goes
	if a, b := held(m, 0), held(m, 1); !slices.Equal(a, []uint64{4, 5}) || !slices.Equal(b, []uint64{2, 3}) {
		t.Fatalf("after storing 5: engines hold %v and %v, want [4 5] and [2 3]", a, b)
	}
	if local, imported := m.serve(0, []uint64{2}, 1); local != 0 || imported != 1 {
		t.Errorf("[2] on engine 0: %d local, %d imported; want 0, 1", local, imported)
	}
	if m.holders[1] != 0 || m.holders[2] != 3 {
		t.Errorf("holders of 1 and 2: %b and %b, want none and both", m.holders[1], m.holders[2])
	}
}

// aged-import-hit: the importer's copy counts as hit; aged-touch's does
// not (only the copy read does).
func TestModelAgedImportHit(t *testing.T) {
	for _, tc := range []struct {
		cache string
		hit   bool
	}{
		{ModelAgedTouch, false},
		{ModelAgedImportHit, true},
	} {
		m := newCacheModel(tc.cache, 2, 4, ModelSharedAge, ModelFreshAge)
		m.leaves, m.parent = true, map[uint64]uint64{}
		m.serve(0, []uint64{1}, 1)
		m.serve(1, []uint64{1, 2}, 2)
		if !m.caches[0][1].reused || m.caches[1][1].reused != tc.hit || m.caches[1][2].reused {
			t.Errorf("%s: hit marks %v (copy read), %v (importer's), %v (computed); want true, %v, false",
				tc.cache, m.caches[0][1].reused, m.caches[1][1].reused, m.caches[1][2].reused, tc.hit)
		}
	}
}
