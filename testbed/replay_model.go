package testbed

import (
	"encoding/binary"
	"fmt"
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
// (the pool's leaves first).
//
//	lru            each engine evicts its least recently used block (the pool before
//	               cluster-aware eviction)
//	cluster-aware  each engine evicts, least recently used first, a block some other
//	               engine also holds, and only when it has none such its least recently
//	               used (the pool's Demote, as fabric drives it from the index)
//	shared-lru     one cache of every engine's blocks together, least recently used
//	               first: what a single cache of the cluster's memory would keep

// Cache policies of the replay model.
const (
	ModelLRU          = "lru"
	ModelClusterAware = "cluster-aware"
	ModelSharedLRU    = "shared-lru"
)

// ModelCaches are the model's cache policies, in the order ModelReplay
// reports them.
var ModelCaches = []string{ModelLRU, ModelClusterAware, ModelSharedLRU}

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
}

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
	switch {
	case opts.Nodes < 1:
		return nil, fmt.Errorf("testbed: model: nodes %d: want at least 1", opts.Nodes)
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
		m := newCacheModel(cache, opts.Nodes, opts.CacheBlocks)
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
// last use (one cache for shared-lru), and how many caches hold each
// block. Eviction scans a cache for its victim: the model is for traces
// of thousands of requests, not for speed.
type cacheModel struct {
	policy  string
	size    int
	caches  []map[uint64]uint64 // block to last use
	holders map[uint64]int
	tick    uint64
}

func newCacheModel(policy string, nodes, size int) *cacheModel {
	m := &cacheModel{policy: policy, size: size, holders: map[uint64]int{}}
	if policy == ModelSharedLRU {
		nodes, m.size = 1, nodes*size
	}
	m.caches = make([]map[uint64]uint64, nodes)
	for i := range m.caches {
		m.caches[i] = map[uint64]uint64{}
	}
	return m
}

// serve runs one request of blocks on engine node and returns its local
// and imported hits; keep is how many of its blocks are cached.
func (m *cacheModel) serve(node int, blocks []uint64, keep int) (local, imported int) {
	if m.policy == ModelSharedLRU {
		node = 0
	}
	c := m.caches[node]
	for _, b := range blocks {
		if _, ok := c[b]; !ok {
			break
		}
		local++
	}
	for _, b := range blocks[local:] {
		if m.holders[b] == 0 {
			break
		}
		imported++
	}
	blocks = blocks[:min(len(blocks), keep)]
	// The request's blocks are in use while it runs: none is a victim.
	inUse := make(map[uint64]bool, len(blocks))
	for _, b := range blocks {
		inUse[b] = true
	}
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		m.tick++
		if _, ok := c[b]; !ok {
			if len(c) >= m.size {
				m.evict(c, inUse)
			}
			m.holders[b]++
		}
		c[b] = m.tick
	}
	return local, imported
}

// evict drops c's victim: its least recently used block not in use,
// preferring one another cache holds under cluster-aware.
func (m *cacheModel) evict(c map[uint64]uint64, inUse map[uint64]bool) {
	var victim, shared uint64
	var vUse, sUse uint64 = ^uint64(0), ^uint64(0)
	for b, used := range c {
		if inUse[b] {
			continue
		}
		if used < vUse {
			victim, vUse = b, used
		}
		if m.policy == ModelClusterAware && m.holders[b] > 1 && used < sUse {
			shared, sUse = b, used
		}
	}
	if sUse != ^uint64(0) {
		victim, vUse = shared, sUse
	}
	if vUse == ^uint64(0) {
		return // every block in use: the cache grows by one for now
	}
	delete(c, victim)
	if m.holders[victim]--; m.holders[victim] == 0 {
		delete(m.holders, victim)
	}
}
