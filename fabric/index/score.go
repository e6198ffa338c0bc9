package index

import (
	"cmp"
	"slices"
)

// Ranked is one node's routing score; see [Rank].
type Ranked struct {
	Node NodeID
	// Blocks is the node's overlap with the query, in blocks.
	Blocks int
	// Load is the load figure the caller gave for the node, normally in
	// [0, 1] (e.g. the fraction of its KV pool in use).
	Load float64
	// Score is Blocks/queryBlocks - loadWeight*Load.
	Score float64
}

// Rank scores candidate nodes for a query of queryBlocks blocks the way
// Dynamo's KV router does, overlap minus load: score = overlap fraction -
// loadWeight × load. Every node in loads is a candidate, with overlap zero if
// it is not in matches; a node in matches but not in loads has load zero. The
// result is best first; ties go to the longer overlap, then the lighter
// load, then the smaller id, so the order is deterministic.
//
// With loadWeight zero the ranking is pure cache affinity; large weights make
// it plain least-loaded routing.
func Rank(matches []Match, loads map[NodeID]float64, queryBlocks int, loadWeight float64) []Ranked {
	out := make([]Ranked, 0, max(len(matches), len(loads)))
	seen := make(map[NodeID]bool, len(matches))
	for _, m := range matches {
		seen[m.Node] = true
		out = append(out, Ranked{Node: m.Node, Blocks: m.Blocks, Load: loads[m.Node]})
	}
	for n, l := range loads {
		if !seen[n] {
			out = append(out, Ranked{Node: n, Load: l})
		}
	}
	for i := range out {
		frac := 0.0
		if queryBlocks > 0 {
			frac = float64(out[i].Blocks) / float64(queryBlocks)
		}
		out[i].Score = frac - loadWeight*out[i].Load
	}
	slices.SortFunc(out, func(a, b Ranked) int {
		if c := cmp.Compare(b.Score, a.Score); c != 0 {
			return c
		}
		if c := cmp.Compare(b.Blocks, a.Blocks); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Load, b.Load); c != 0 {
			return c
		}
		return cmp.Compare(a.Node, b.Node)
	})
	return out
}

// Copies is how many copies of hash node id holds in the index: stored and
// not yet removed; 0 if it holds none or id is not live. A caller that
// counts a kind of copies of its own (those on a disk tier) compares with
// it to tell whether any other copy is left.
func (ix *Index) Copies(hash uint64, id NodeID) int {
	s := ix.shardOf(hash)
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.get(hash)
	if !ok || !ix.isLive(id) || !s.sp.has(v, id.slot()) {
		return 0
	}
	return 1 + int(s.multi[holderKey{hash, id}])
}
