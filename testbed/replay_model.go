package testbed

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"

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
//
// More policies, run only when ModelOptions.Caches names them (-caches):
//
//	lru-touch      lru, and an import's read counts as a use of the copy it reads
//	aware-touch    cluster-aware, and an import's read counts as a use of the copy it
//	               reads (the pool's lease of a block for a peer makes it its newest)
//	aged-touch     cluster-aged, and an import's read counts as a use of the copy it
//	               reads
//	aged-import-hit
//	               aged-touch, where the importer's copy counts as hit too (the
//	               agents' import acquires the blocks it brought)
//	aware-global   cluster-aware, every copy ordered by its block's latest use on any
//	               engine (use announced to every holder)
//	keep-newest    only the copies other than the block's most recently used one go
//	               first; every copy ordered by the block's latest use on any engine:
//	               one shared LRU spread over the engines, as near as each engine's own
//	               room allows
//	keep-ranked    only the copies other than one, the holder ranked first for the
//	               block (a hash of block and engine, known from the holders alone),
//	               go first; otherwise aware-touch
//	import-cold    aware-touch, and an importer files the blocks it imported (held
//	               elsewhere) as used before any other while another engine still
//	               holds them: its copy goes first, the copy it read stays
//	aware-interior aware-touch, and a copy another engine holds may go before the
//	               blocks that extend it here (-leaves-first then holds only for
//	               blocks no other engine holds; a block stored again under a child
//	               kept here does not count that child)
//	aware-spill    aware-touch, and a block only this engine holds, when it is the
//	               victim, moves to the engine with room or whose next victim is
//	               older (which goes instead): not an order but a copy between
//	               engines per eviction, to show what each engine's own room costs
//	no-admit       import-cold, and an importer keeps no imported block that no block
//	               the request computed extends (the pool keeps a parent under its
//	               child)

// Cache policies of the replay model.
const (
	ModelLRU          = "lru"
	ModelClusterAware = "cluster-aware"
	ModelSharedLRU    = "shared-lru"
	ModelClusterAged  = "cluster-aged"

	ModelLRUTouch      = "lru-touch"
	ModelAwareTouch    = "aware-touch"
	ModelAgedTouch     = "aged-touch"
	ModelAgedImportHit = "aged-import-hit"
	ModelAwareGlobal   = "aware-global"
	ModelKeepNewest    = "keep-newest"
	ModelKeepRanked    = "keep-ranked"
	ModelImportCold    = "import-cold"
	ModelNoAdmit       = "no-admit"
	ModelInterior      = "aware-interior"
	ModelSpill         = "aware-spill"
)

// ModelMoreCaches are the policies ModelReplay runs only when
// ModelOptions.Caches names them.
var ModelMoreCaches = []string{ModelLRUTouch, ModelAwareTouch, ModelAgedTouch, ModelAgedImportHit, ModelAwareGlobal, ModelKeepNewest, ModelKeepRanked, ModelImportCold, ModelNoAdmit, ModelInterior, ModelSpill}

// modelPolicy is what a cache policy of the model does, beyond LRU.
type modelPolicy struct {
	demote bool // a copy another engine holds goes first
	keep   int  // which one copy of a shared block is not demoted (keepNone: none)
	touch  bool // an import's read is a use of the copy read
	global bool // a copy is ordered by its block's latest use anywhere
	cold   bool // imported copies are filed as used before any other
	admit  bool // imported copies no computed block extends are not kept
	aged   bool // cluster-aged's ages instead of demote
	// hitImport: an importer's copy counts as hit (as the agents' import,
	// which acquires the blocks it brought)
	hitImport bool
	inner     bool // a demoted copy may go before the blocks extending it
	spill     bool // a sole copy evicted moves to an engine with an older victim
}

const (
	keepNone = iota
	keepNewest
	keepRanked
)

var modelPolicies = map[string]modelPolicy{
	ModelLRUTouch:      {touch: true},
	ModelAwareTouch:    {demote: true, touch: true},
	ModelAgedTouch:     {aged: true, touch: true},
	ModelAgedImportHit: {aged: true, touch: true, hitImport: true},
	ModelAwareGlobal:   {demote: true, touch: true, global: true},
	ModelKeepNewest:    {demote: true, keep: keepNewest, touch: true, global: true},
	ModelKeepRanked:    {demote: true, keep: keepRanked, touch: true},
	ModelImportCold:    {demote: true, touch: true, cold: true},
	ModelNoAdmit:       {demote: true, touch: true, cold: true, admit: true},
	ModelInterior:      {demote: true, touch: true, inner: true},
	ModelSpill:         {demote: true, touch: true, spill: true},
}

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
	// Caches are the cache policies to run, of ModelCaches and
	// ModelMoreCaches, in this order. If empty, ModelCaches.
	Caches []string
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

// ModelReplay runs reqs through each cache policy of opts.Caches (if
// empty, ModelCaches) under one routing and returns their results in that
// order.
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
	caches := opts.Caches
	if len(caches) == 0 {
		caches = ModelCaches
	}
	for _, c := range caches {
		if _, ok := modelPolicies[c]; !ok && !slices.Contains(ModelCaches, c) {
			return nil, fmt.Errorf("testbed: model: cache %q: want one of %v or %v", c, ModelCaches, ModelMoreCaches)
		}
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
	for _, cache := range caches {
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
	// spilling: an eviction for a spilled block, which does not spill.
	spilling bool
	// The policies of ModelMoreCaches: what they do, and each block's
	// latest use on any engine.
	more   bool
	pol    modelPolicy
	latest map[uint64]uint64
}

// modelEntry is a block in one cache: its last use, whether it was hit
// (here or by an import) since it was stored, and the stamp of its live
// heap entry.
type modelEntry struct {
	used     uint64
	reused   bool
	stamp    uint64
	children int  // blocks of the cache that extend it (leaves first)
	cold     bool // import-cold: imported, not used here since
}

type modelHeapEntry struct {
	key, stamp uint64
	block      uint64
}

type modelHeap []modelHeapEntry

func (h modelHeap) Len() int { return len(h) }
func (h modelHeap) Less(i, j int) bool {
	// Of equal keys, the entry pushed first: the order never depends on
	// a map's.
	return h[i].key < h[j].key || h[i].key == h[j].key && h[i].stamp < h[j].stamp
}
func (h modelHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *modelHeap) Push(x any)   { *h = append(*h, x.(modelHeapEntry)) }
func (h *modelHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

// modelBase keeps keys positive: a key is a last use less an age.
const modelBase = 1 << 62

// modelCold puts import-cold's copies held elsewhere too, keyed by when
// they were filed, before every other.
const modelCold = 1 << 52

func newCacheModel(policy string, nodes, size int, sharedAge, freshAge float64) *cacheModel {
	m := &cacheModel{policy: policy, size: size, holders: map[uint64]uint64{},
		sharedAge: uint64(sharedAge * float64(size)), freshAge: uint64(freshAge * float64(size))}
	if policy == ModelSharedLRU {
		nodes, m.size = 1, nodes*size
	}
	m.pol, m.more = modelPolicies[policy]
	m.latest = map[uint64]uint64{}
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
	if m.more {
		return m.moreKey(node, b, e)
	}
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

// moreKey is key for the policies of ModelMoreCaches.
func (m *cacheModel) moreKey(node int, b uint64, e *modelEntry) uint64 {
	if e.cold && m.shared(node, b) {
		return e.used // before every copy not cold, in the order filed
	}
	used := e.used
	if m.pol.global {
		used = m.latest[b]
	}
	k := modelBase + modelCold + used
	if m.pol.demote && m.shared(node, b) && !m.keeps(node, b) {
		k -= modelBase
	}
	if m.pol.aged {
		if m.shared(node, b) {
			k -= m.sharedAge
		}
		if !e.reused {
			k -= m.freshAge
		}
	}
	return k
}

// keeps reports whether node's copy of b is the one copy the policy keeps
// among the holders (not demoted).
func (m *cacheModel) keeps(node int, b uint64) bool {
	switch m.pol.keep {
	case keepNewest:
		// The most recently used copy; of equals, the lowest engine's.
		mine := m.caches[node][b].used
		for n, h := 0, m.holders[b]; h != 0; n, h = n+1, h>>1 {
			if h&1 != 0 && n != node {
				u := m.caches[n][b].used
				if u > mine || u == mine && n < node {
					return false
				}
			}
		}
		return true
	case keepRanked:
		best, bestRank := -1, uint64(0)
		for n, h := 0, m.holders[b]; h != 0; n, h = n+1, h>>1 {
			if h&1 != 0 {
				if r := modelRank(b, n); best < 0 || r > bestRank {
					best, bestRank = n, r
				}
			}
		}
		return best == node
	}
	return false
}

// modelRank ranks engine n for block b (highest keeps).
func modelRank(b uint64, n int) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], b)
	binary.LittleEndian.PutUint64(buf[8:], uint64(n))
	return xxh3.Hash(buf[:])
}

// coupled reports whether a copy's key follows the other copies' uses
// (aware-global, keep-newest, keep-ranked), not only whether another
// engine holds the block.
func (m *cacheModel) coupled() bool {
	return m.pol.global || m.pol.keep != keepNone
}

// refresh pushes node's copy of b again after its use changed, and every
// other copy where their keys follow it.
func (m *cacheModel) refresh(node int, b uint64, e *modelEntry) {
	if m.coupled() {
		m.refileAll(b)
		return
	}
	m.push(node, b, e)
}

// refileAll pushes every copy of b again.
func (m *cacheModel) refileAll(b uint64) {
	for n, h := 0, m.holders[b]; h != 0; n, h = n+1, h>>1 {
		if h&1 != 0 {
			m.push(n, b, m.caches[n][b])
		}
	}
}

// use records a use of node's copy of b now.
func (m *cacheModel) use(node int, b uint64, e *modelEntry) {
	m.tick++
	e.used = m.tick
	if !m.more {
		m.push(node, b, e)
		return
	}
	e.cold = false
	m.latest[b] = m.tick
	m.refresh(node, b, e)
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
	switch {
	case m.more && m.coupled():
		m.refileAll(b)
		return
	case m.more && !m.pol.demote && !m.pol.aged:
		return // lru-touch
	case !m.more && m.policy != ModelClusterAware && m.policy != ModelClusterAged:
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
	var cold map[uint64]bool // import-cold, aged-import-hit: imported copies new here
	for _, b := range blocks[local:] {
		h := m.holders[b]
		if h == 0 {
			break
		}
		// The importer reads the copy of the lowest-numbered holder.
		n := bits.TrailingZeros64(h)
		e := m.caches[n][b]
		switch {
		case m.more:
			e.reused = true
			if m.pol.touch {
				m.use(n, b, e)
			}
			if _, here := c[b]; (m.pol.cold || m.pol.hitImport) && !here {
				if cold == nil {
					cold = map[uint64]bool{}
				}
				cold[b] = true
			}
		case !e.reused:
			e.reused = true
			m.push(n, b, e)
		}
		imported++
	}
	blocks = blocks[:min(len(blocks), keep)]
	if m.pol.admit {
		// No imported block that no computed block extends.
		end := len(blocks)
		for end > 0 && cold[blocks[end-1]] {
			end--
		}
		blocks = blocks[:end]
	}
	// The request's blocks are in use while it runs: none is a victim.
	inUse := make(map[uint64]bool, len(blocks))
	for _, b := range blocks {
		inUse[b] = true
	}
	if m.leaves {
		m.store(node, blocks, inUse, cold)
		return local, imported
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		e, ok := c[b]
		if !ok {
			if len(c) >= m.size {
				m.evict(node, inUse)
			}
			e = &modelEntry{reused: m.pol.hitImport && cold[b]}
			c[b] = e
			was := m.holders[b]
			m.holders[b] = was | 1<<node
			m.refile(b, was)
		}
		m.touch(node, b, e, m.pol.cold && cold[b])
	}
	return local, imported
}

// touch files node's copy of b, stored or hit by a request, as used now,
// or (an imported copy new here, import-cold) as used before any other
// while another engine holds it too.
func (m *cacheModel) touch(node int, b uint64, e *modelEntry, cold bool) {
	if !cold {
		m.use(node, b, e)
		return
	}
	m.tick++
	e.cold, e.used = true, m.tick
	m.refresh(node, b, e)
}

// store caches blocks on node under the leaves-first rule: each block
// first, head to tail, so that a block's parent is there before it (and
// counts it), then touched from tail to head.
func (m *cacheModel) store(node int, blocks []uint64, inUse, cold map[uint64]bool) {
	c := m.caches[node]
	for i, b := range blocks {
		if _, ok := c[b]; ok {
			continue
		}
		if len(c) >= m.size {
			m.evict(node, inUse)
		}
		c[b] = &modelEntry{reused: m.pol.hitImport && cold[b]}
		if i > 0 {
			m.parent[b] = blocks[i-1]
			c[blocks[i-1]].children++
		}
		was := m.holders[b]
		m.holders[b] = was | 1<<node
		m.refile(b, was)
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		m.touch(node, blocks[i], c[blocks[i]], m.pol.cold && cold[blocks[i]])
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
		if m.blocked(e, x) {
			continue // pushed again when its last child goes
		}
		if m.pol.spill && !m.spilling && m.holders[x.block] == 1<<node {
			m.spill(node, x, e)
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
			delete(m.latest, x.block)
		} else {
			m.holders[x.block] = now
			m.refile(x.block, was)
		}
		return
	}
	// Every block in use: the cache grows by one for now.
}

// blocked reports whether leaves first keeps e, filed as x, from going.
func (m *cacheModel) blocked(e *modelEntry, x modelHeapEntry) bool {
	return e.children > 0 && !(m.pol.inner && x.key < modelBase)
}

// spill copies node's victim e, filed as x and held nowhere else, to the
// engine with room or whose next victim is older than it (that victim
// goes), if there is one. evict then drops node's copy.
func (m *cacheModel) spill(node int, x modelHeapEntry, e *modelEntry) {
	to, toKey := -1, x.key
	for n := range m.caches {
		if n == node {
			continue
		}
		if len(m.caches[n]) < m.size {
			to, toKey = n, 0
			break
		}
		if k, ok := m.peek(n); ok && k < toKey {
			to, toKey = n, k
		}
	}
	if to < 0 {
		return
	}
	if len(m.caches[to]) >= m.size {
		m.spilling = true
		m.evict(to, nil)
		m.spilling = false
	}
	moved := &modelEntry{used: e.used, reused: e.reused}
	m.caches[to][x.block] = moved
	if p, ok := m.parent[x.block]; ok && m.leaves {
		if pe, ok := m.caches[to][p]; ok {
			pe.children++
		}
	}
	m.holders[x.block] |= 1 << to
	m.push(to, x.block, moved)
}

// peek returns the key of node's next victim (no engine but the one
// serving has blocks in use), dropping stale entries.
func (m *cacheModel) peek(node int) (uint64, bool) {
	c, h := m.caches[node], &m.heaps[node]
	for h.Len() > 0 {
		x := (*h)[0]
		if e, ok := c[x.block]; ok && e.stamp == x.stamp && !m.blocked(e, x) {
			return x.key, true
		}
		heap.Pop(h)
	}
	return 0, false
}
