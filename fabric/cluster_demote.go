package fabric

import (
	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
)

// Cluster-aware eviction. A block this node holds that other live nodes
// hold too costs the cluster nothing when this node recycles it, so the
// local pool recycles such blocks first (pool.BlockSet.Demote). The index
// sink marks them as it applies events: this node's store of a block
// others hold, or another node's store of a block this node holds,
// demotes it; another node's remove that leaves this node the only holder
// undoes it. A holder that fails or leaves is dropped from the index
// without a remove per block: the blocks it shared stay demoted here until
// they are recycled or used and stored elsewhere again (a demoted block
// still goes only after the blocks in use, and leaves first).
//
// The pool is marked on a goroutine of its own (demoteLoop), since the
// sink runs inside membership's callbacks and must not wait for a block
// set's lock; marks past demoteQueue batches are dropped and counted.

// demoteQueue bounds the batches of marks waiting for demoteLoop.
const demoteQueue = 1024

// demotion is a run of hashes to mark (shared) or unmark in the pool.
type demotion struct {
	hashes []uint64
	shared bool
}

// demotions collects the marks of one call of the sink, in event order.
type demotions struct {
	runs []demotion
}

func (d *demotions) add(h uint64, shared bool) {
	if n := len(d.runs); n > 0 && d.runs[n-1].shared == shared {
		d.runs[n-1].hashes = append(d.runs[n-1].hashes, h)
		return
	}
	d.runs = append(d.runs, demotion{hashes: []uint64{h}, shared: shared})
}

// note decides what event e, just applied to the index, changes in the
// local pool's eviction order. self is this node's index id; mine says
// the event is this node's.
func (s *indexSink) note(d *demotions, self index.NodeID, mine bool, e membership.Event) {
	switch {
	case e.Kind == membership.EventStore && mine:
		if _, others := s.a.index.HolderCount(e.Hash, self); others > 0 {
			d.add(e.Hash, true)
		}
	case e.Kind == membership.EventStore:
		if holds, _ := s.a.index.HolderCount(e.Hash, self); holds {
			d.add(e.Hash, true)
		}
	case !mine:
		if holds, others := s.a.index.HolderCount(e.Hash, self); holds && others == 0 {
			d.add(e.Hash, false)
		}
	}
}

// queue hands d's marks to demoteLoop without waiting.
func (s *indexSink) queue(d *demotions) {
	for _, r := range d.runs {
		select {
		case s.demote <- r:
		default:
			s.a.stats.demotionsDropped.Add(uint64(len(r.hashes)))
		}
	}
}

// demoteLoop marks the pool's blocks as the sink found them shared or
// not.
func (s *indexSink) demoteLoop() {
	defer s.a.wg.Done()
	for {
		select {
		case <-s.a.done:
			return
		case r := <-s.demote:
			if r.shared {
				s.a.pool.Demote(r.hashes...)
			} else {
				s.a.pool.Undemote(r.hashes...)
			}
		}
	}
}
