package testbed

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"

	"github.com/zeebo/xxh3"
)

// The replay model: the trace's requests through caches that are only
// bookkeeping (no agents, no bytes), to compare eviction policies on one
// routing of the same trace, fast and deterministic. A block is one trace
// id (512 tokens) named by its prefix, as in ReuseBound.
//
// Every cache policy sees the same routing and the same requests. A
// request's blocks are hit, in order, while its engine's cache holds them
// (local), then while any cache holds them (imported, a cluster hit); the
// rest is computed. Afterwards the engine's cache holds the whole request
// (at most half the cache, as Replay keeps it), touched from its last
// block to its first, so that a sequence loses its tail before its head
// (the pool's leaves first); with LeavesFirst no cache evicts a block
// while it holds one that extends it, as the pool, which matters once
// eviction goes by more than last use.
//
//	lru            each engine evicts its least recently used block (the pool before
//	               cluster-aware eviction)
//	cluster-aware  each engine evicts, least recently used first, a block some other
//	               engine also holds, and only when it has none such its least recently
//	               used (the pool's Demote, as fabric drives it from the index)
//	cluster-aged   each engine evicts its block of oldest age, where a block's age is
//	               the blocks stored since its last use, plus SharedAge caches' worth
//	               while another engine holds it too, plus FreshAge caches' worth while
//	               it has not been hit (here or by an import) since it was stored: a
//	               copy costs the cluster only an import, and a block never reused
//	               is likely never to be, but neither goes while it is hot
//	shared-lru     one cache of every engine's blocks together, least recently used
//	               first: what a single cache of the cluster's memory would keep

// Cache policies of the replay model.
const (
	ModelLRU          = "lru"
	ModelClusterAware = "cluster-aware"
	ModelSharedLRU    = "shared-lru"
	ModelClusterAged  = "cluster-aged"
)

// ModelCaches are the model's cache policies, in the order ModelReplay
// reports them.
var ModelCaches = []string{ModelLRU, ModelClusterAware, ModelClusterAged, ModelSharedLRU}

// ModelOptions configure ModelReplay.
type ModelOptions struct {
	// Nodes is the engines. If zero, 4.
	Nodes int
	// CacheBlocks is each engine's cache in blocks (the shared cache holds
	// Nodes times as many). If zero, 2,048.
	CacheBlocks int
	// Policy is the routing: random or round-robin (kv-aware routes by
	// what the agents hold, which the model does not run). If empty,
	// random.
	Policy string
	// Seed seeds the random routing; zero is valid.
	Seed uint64
	// SharedAge and FreshAge are how much older than its last use
	// cluster-aged counts a copy another engine holds, and a block not hit
	// (here or by an import) since it was stored, in blocks stored, as a
	// multiple of CacheBlocks. If zero, ModelSharedAge and ModelFreshAge
	// (an age under one block, such as 1e-9, is none).
	SharedAge, FreshAge float64
	// LeavesFirst: a cache does not evict a block while it holds a block
	// that extends it, as the pool does.
	LeavesFirst bool
}

// The ages cluster-aged uses by default, in caches' worth of blocks
// stored (see ModelOptions).
const (
	ModelSharedAge = 6
	ModelFreshAge  = 8
)

// ModelResult is one cache policy's outcome in ModelReplay.
type ModelResult struct {
	Cache           string  `json:"cache"`
	Policy          string  `json:"policy"`
	Nodes           int     `json:"nodes"`
	CacheBlocks     int     `json:"cache_blocks"`
	Requests        int     `json:"requests"`
	BlocksRequested int     `json:"blocks_requested"`
	BlocksLocal     int     `json:"blocks_local"`
	BlocksImported  int     `json:"blocks_imported"`
	LocalHitRate    float64 `json:"local_hit_rate"`
	ClusterHitRate  float64 `json:"cluster_hit_rate"`
	// Distinct is the distinct blocks the caches held at the end, over
	// the blocks they held.
	Distinct   int     `json:"distinct_blocks"`
	Held       int     `json:"held_blocks"`
	ReuseBound float64 `json:"reuse_bound"`
}

// ModelReplay runs reqs through each of ModelCaches under one routing and
// returns their results in that order.
func ModelReplay(reqs []TraceRequest, opts ModelOptions) ([]ModelResult, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 4
	}
	if opts.CacheBlocks == 0 {
		opts.CacheBlocks = 2048
	}
	if opts.Policy == "" {
		opts.Policy = PolicyRandom
	}
	if opts.SharedAge == 0 {
		opts.SharedAge = ModelSharedAge
	}
	if opts.FreshAge == 0 {
		opts.FreshAge = ModelFreshAge
	}
	switch {
	case opts.Nodes < 1 || opts.Nodes > 64:
		return nil, fmt.Errorf("testbed: model: nodes %d: want 1 to 64", opts.Nodes)
	case !(opts.SharedAge >= 0 && opts.SharedAge <= 1<<20) || !(opts.FreshAge >= 0 && opts.FreshAge <= 1<<20):
		return nil, fmt.Errorf("testbed: model: ages %g and %g: want 0 to %d caches", opts.SharedAge, opts.FreshAge, 1<<20)
	case opts.CacheBlocks < 2:
		return nil, fmt.Errorf("testbed: model: cache blocks %d: want at least 2", opts.CacheBlocks)
	case opts.Policy != PolicyRandom && opts.Policy != PolicyRoundRobin:
		return nil, fmt.Errorf("testbed: model: policy %q: want %s or %s", opts.Policy, PolicyRandom, PolicyRoundRobin)
	case len(reqs) == 0:
		return nil, fmt.Errorf("%w: no requests", ErrTrace)
	}
	blocks := make([][]uint64, len(reqs))
	for i, r := range reqs {
		blocks[i] = modelBlocks(r)
	}
	route := make([]int, len(reqs))
	rng := rand.New(rand.NewPCG(opts.Seed, 0x9e9))
	for i := range route {
		if opts.Policy == PolicyRandom {
			route[i] = rng.IntN(opts.Nodes)
		} else {
			route[i] = i % opts.Nodes
		}
	}
	bound := ReuseBound(reqs, TraceBlockTokens)
	var out []ModelResult
	for _, cache := range ModelCaches {
		m := newCacheModel(cache, opts.Nodes, opts.CacheBlocks, opts.SharedAge, opts.FreshAge)
		m.leaves, m.parent = opts.LeavesFirst, map[uint64]uint64{}
		res := ModelResult{Cache: cache, Policy: opts.Policy, Nodes: opts.Nodes, CacheBlocks: opts.CacheBlocks,
			Requests: len(reqs), ReuseBound: bound}
		for i, bs := range blocks {
			local, imported := m.serve(route[i], bs, opts.CacheBlocks/2)
			res.BlocksRequested += len(bs)
			res.BlocksLocal += local
			res.BlocksImported += imported
		}
		if res.BlocksRequested > 0 {
			res.LocalHitRate = float64(res.BlocksLocal) / float64(res.BlocksRequested)
			res.ClusterHitRate = float64(res.BlocksLocal+res.BlocksImported) / float64(res.BlocksRequested)
		}
		res.Distinct, res.Held = len(m.holders), 0
		for _, c := range m.caches {
			res.Held += len(c)
		}
		out = append(out, res)
	}
	return out, nil
}

// modelBlocks names a request's full 512-token blocks by their prefix.
func modelBlocks(r TraceRequest) []uint64 {
	n := len(r.HashIDs) * TraceBlockTokens
	if r.InputLength > 0 {
		n = min(n, r.InputLength)
	}
	out := make([]uint64, 0, n/TraceBlockTokens)
	var buf [16]byte
	h := uint64(0)
	for _, id := range r.HashIDs[:n/TraceBlockTokens] {
		binary.LittleEndian.PutUint64(buf[:8], h)
		binary.LittleEndian.PutUint64(buf[8:], uint64(id))
		h = xxh3.Hash(buf[:])
		out = append(out, h)
	}
	return out
}

// cacheModel is the caches of one policy: each engine's blocks with their
// last use (one cache for shared-lru), and which caches hold each block.
// Each cache orders its blocks for eviction in a heap by key (see key);
// a block whose key changes is pushed again and its old entry, stale,
// skipped when it comes up.
type cacheModel struct {
	policy string
	size   int
	// cluster-aged: how much older than their last use a copy another
	// cache holds, and a block not hit since stored, count, in ticks.
	sharedAge, freshAge uint64
	caches              []map[uint64]*modelEntry
	heaps               []modelHeap
	holders             map[uint64]uint64 // bit n: cache n holds it
	tick                uint64
	stamps              uint64
	// leaves: a block is not evicted while a block that extends it is
	// cached (the pool's rule); parent is each block's parent.
	leaves bool
	parent map[uint64]uint64
}

// modelEntry is a block in one cache: its last use, whether it was hit
// (here or by an import) since it was stored, and the stamp of its live
// heap entry.
type modelEntry struct {
	used     uint64
	reused   bool
	stamp    uint64
	children int // blocks of the cache that extend it (leaves first)
}

type modelHeapEntry struct {
	key, stamp uint64
	block      uint64
}

type modelHeap []modelHeapEntry

func (h modelHeap) Len() int           { return len(h) }
func (h modelHeap) Less(i, j int) bool { return h[i].key < h[j].key }
func (h modelHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *modelHeap) Push(x any)        { *h = append(*h, x.(modelHeapEntry)) }
func (h *modelHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// modelBase keeps keys positive: a key is a last use less an age.
const modelBase = 1 << 62

func newCacheModel(policy string, nodes, size int, sharedAge, freshAge float64) *cacheModel {
	m := &cacheModel{policy: policy, size: size, holders: map[uint64]uint64{},
		sharedAge: uint64(sharedAge * float64(size)), freshAge: uint64(freshAge * float64(size))}
	if policy == ModelSharedLRU {
		nodes, m.size = 1, nodes*size
	}
	m.caches = make([]map[uint64]*modelEntry, nodes)
	m.heaps = make([]modelHeap, nodes)
	for i := range m.caches {
		m.caches[i] = map[uint64]*modelEntry{}
	}
	return m
}

// shared reports whether a cache other than node's holds b.
func (m *cacheModel) shared(node int, b uint64) bool {
	return m.holders[b]&^(1<<node) != 0
}

// key orders node's copy of b for eviction, lowest first.
func (m *cacheModel) key(node int, b uint64, e *modelEntry) uint64 {
	k := modelBase + e.used
	switch m.policy {
	case ModelClusterAware:
		if m.shared(node, b) {
			k -= modelBase // before every block only this node holds
		}
	case ModelClusterAged:
		if m.shared(node, b) {
			k -= m.sharedAge
		}
		if !e.reused {
			k -= m.freshAge
		}
	}
	return k
}

// push (re)files node's copy of b in its heap under its current key.
func (m *cacheModel) push(node int, b uint64, e *modelEntry) {
	m.stamps++ // unique across entries: a block stored again has new ones
	e.stamp = m.stamps
	h := &m.heaps[node]
	heap.Push(h, modelHeapEntry{key: m.key(node, b, e), stamp: e.stamp, block: b})
	if len(*h) > 4*m.size+64 {
		m.rebuild(node)
	}
}

// rebuild drops node's stale heap entries.
func (m *cacheModel) rebuild(node int) {
	h := m.heaps[node][:0]
	for b, e := range m.caches[node] {
		h = append(h, modelHeapEntry{key: m.key(node, b, e), stamp: e.stamp, block: b})
	}
	heap.Init(&h)
	m.heaps[node] = h
}

// refile pushes the copies of b whose key depends on who else holds it,
// after holders of b changed from was.
func (m *cacheModel) refile(b uint64, was uint64) {
	if m.policy != ModelClusterAware && m.policy != ModelClusterAged {
		return
	}
	now := m.holders[b]
	// Only a change between one holder and more moves a key.
	if (bits.OnesCount64(was) > 1) == (bits.OnesCount64(now) > 1) {
		return
	}
	for n := 0; now != 0; n, now = n+1, now>>1 {
		if now&1 != 0 {
			m.push(n, b, m.caches[n][b])
		}
	}
}

// serve runs one request of blocks on engine node and returns its local
// and imported hits; keep is how many of its blocks are cached.
func (m *cacheModel) serve(node int, blocks []uint64, keep int) (local, imported int) {
	if m.policy == ModelSharedLRU {
		node = 0
	}
	c := m.caches[node]
	for _, b := range blocks {
		e, ok := c[b]
		if !ok {
			break
		}
		e.reused = true
		local++
	}
	for _, b := range blocks[local:] {
		h := m.holders[b]
		if h == 0 {
			break
		}
		// The importer reads the copy of the lowest-numbered holder.
		n := bits.TrailingZeros64(h)
		e := m.caches[n][b]
		if !e.reused {
			e.reused = true
			m.push(n, b, e)
		}
		imported++
	}
	blocks = blocks[:min(len(blocks), keep)]
	// The request's blocks are in use while it runs: none is a victim.
	inUse := make(map[uint64]bool, len(blocks))
	for _, b := range blocks {
		inUse[b] = true
	}
	if m.leaves {
		m.store(node, blocks, inUse)
		return local, imported
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		m.tick++
		e, ok := c[b]
		if !ok {
			if len(c) >= m.size {
				m.evict(node, inUse)
			}
			e = &modelEntry{}
			c[b] = e
			was := m.holders[b]
			m.holders[b] = was | 1<<node
			m.refile(b, was)
		}
		e.used = m.tick
		m.push(node, b, e)
	}
	return local, imported
}

// store caches blocks on node under the leaves-first rule: each block
// first, head to tail, so that a block's parent is there before it (and
// counts it), then touched from tail to head.
func (m *cacheModel) store(node int, blocks []uint64, inUse map[uint64]bool) {
	c := m.caches[node]
	for i, b := range blocks {
		if _, ok := c[b]; ok {
			continue
		}
		if len(c) >= m.size {
			m.evict(node, inUse)
		}
		c[b] = &modelEntry{}
		if i > 0 {
			m.parent[b] = blocks[i-1]
			c[blocks[i-1]].children++
		}
		was := m.holders[b]
		m.holders[b] = was | 1<<node
		m.refile(b, was)
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		m.tick++
		e := c[blocks[i]]
		e.used = m.tick
		m.push(node, blocks[i], e)
	}
}

// evict drops node's victim: its block of lowest key not in use (and,
// under the leaves-first rule, that no block of the cache extends).
func (m *cacheModel) evict(node int, inUse map[uint64]bool) {
	c, h := m.caches[node], &m.heaps[node]
	var aside []modelHeapEntry
	defer func() {
		for _, x := range aside {
			heap.Push(h, x)
		}
	}()
	for h.Len() > 0 {
		x := heap.Pop(h).(modelHeapEntry)
		e, ok := c[x.block]
		if !ok || e.stamp != x.stamp {
			continue // stale
		}
		if inUse[x.block] {
			aside = append(aside, x)
			continue
		}
		if e.children > 0 {
			continue // pushed again when its last child goes
		}
		delete(c, x.block)
		if p, ok := m.parent[x.block]; ok && m.leaves {
			if pe, ok := c[p]; ok {
				if pe.children--; pe.children == 0 {
					m.push(node, p, pe)
				}
			}
		}
		was := m.holders[x.block]
		if now := was &^ (1 << node); now == 0 {
			delete(m.holders, x.block)
		} else {
			m.holders[x.block] = now
			m.refile(x.block, was)
		}
		return
	}
	// Every block in use: the cache grows by one for now.
}
