package fabric

import (
	"errors"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
)

// maxHeldEvents bounds the events the sink holds for origins that the
// index had no slot for (about 60 bytes each): past it, the origin whose
// events overflow loses what was held for it, and is resynchronised
// (membership.Resync) from its log or snapshot once the sweeper runs.
const maxHeldEvents = 1 << 18

// indexSink applies every node's replicated events to the index. Its Apply
// and Drop run on membership's goroutines, some inside memberlist's
// callbacks, and must not block: a drop only retires the node's index id,
// and sweepLoop removes the entries afterwards, on its own goroutine.
//
// When the index has no free slot for an origin (every slot live, or
// dropped and waiting for a sweep), Apply holds its events, in order, and
// wakes the sweeper, which applies them once a slot is free. Membership
// counts events as applied when it hands them over, so its repair never
// fetches them again: what the sink holds is the only copy.
type indexSink struct {
	a     *Agent
	sweep chan struct{} // a drop happened; capacity 1

	mu      sync.Mutex
	waiting map[string][][]membership.Event // per origin, the calls of Apply held, oldest first
	held    int                             // events in waiting
	// overflowed are the origins that lost held events, to resynchronise
	// on the sweeper's goroutine (Apply runs under membership's lock).
	overflowed map[string]bool
	// resync repairs an origin from scratch; membership.Resync, or a
	// test's recorder.
	resync func(origin string) bool
	// demote carries marks for the pool's eviction order to demoteLoop
	// (cluster_demote.go).
	demote chan demotion

	// fullLog spaces the log lines of refusals of a holder's stores past
	// Config.IndexMaxNodeBlocks: at most one per indexFullLogEvery, the
	// calls not logged counted in the next line.
	fullLog logSpacing
}

// indexFullLogEvery is how often, at most, the index's refusals of a
// holder's stores past its bound are logged; index.Metrics.Refused counts
// every one.
const indexFullLogEvery = time.Minute

// refused logs err, a store of origin's that the index refused
// (index.ErrNodeFull), unless it logged one less than indexFullLogEvery
// ago. A holder that sends stores of made-up hashes must not flood the
// log as it fills the index.
func (s *indexSink) refused(origin string, err error) {
	log, quiet := s.fullLog.due(time.Now(), indexFullLogEvery)
	if !log {
		return
	}
	s.a.log.Error("index: a holder announced more blocks than the index keeps for one node (--index-max-node-blocks, index_max_node_blocks); the rest are not indexed",
		"peer", origin, "limit", s.a.cfg.IndexMaxNodeBlocks, "err", err, "not_logged", quiet)
}

// warnIndexBound warns, once for each smaller block size, where this
// node's pools and tiers hold more blocks of blockBytes than
// Config.IndexMaxNodeBlocks: a peer's index, bound by the peer's setting,
// keeps at most that many of this node's hashes, so this node's blocks
// past it would be found by no peer. This node's own index is not bound
// by it (index.Config.Self). of says whose block size it is.
func (a *Agent) warnIndexBound(blockBytes uint64, of string) {
	if blockBytes == 0 {
		return
	}
	blocks := a.blockRoom(blockBytes)
	if blocks <= uint64(a.cfg.IndexMaxNodeBlocks) {
		return
	}
	for {
		w := a.indexBoundWarned.Load()
		if w != 0 && w <= blockBytes {
			return
		}
		if a.indexBoundWarned.CompareAndSwap(w, blockBytes) {
			break
		}
	}
	a.log.Warn("index: this node's pools and tiers hold more blocks than a peer's index keeps for one node; "+
		"raise --index-max-node-blocks (index_max_node_blocks) above that on every node, or the peers find only part of them",
		"blocks", blocks, "block_bytes", blockBytes, "of", of, "limit", a.cfg.IndexMaxNodeBlocks)
}

// blockRoom is how many blocks of blockBytes this node's pools and tiers
// hold: the pools' bytes over blockBytes, and the tiers' over their slot
// (the tiers' block size, or blockBytes rounded up as a first block
// would size them).
func (a *Agent) blockRoom(blockBytes uint64) uint64 {
	var bytes uint64
	for _, s := range a.storages {
		bytes += s.Size()
	}
	n := bytes / blockBytes
	if a.tiers != nil {
		slot := uint64(a.tiers.room.Load())
		if slot == 0 {
			slot = uint64(roundUp4K(int(blockBytes)))
		}
		for _, s := range a.cfg.tierSpecs() {
			n += s.Size / slot
		}
	}
	return n
}

func newIndexSink(a *Agent) *indexSink {
	s := &indexSink{a: a, sweep: make(chan struct{}, 1), waiting: make(map[string][][]membership.Event), overflowed: map[string]bool{},
		demote: make(chan demotion, demoteQueue)}
	s.resync = func(origin string) bool {
		m := a.joined.Load()
		return m != nil && m.Resync(origin)
	}
	return s
}

func (s *indexSink) Apply(events []membership.Event) {
	if len(events) == 0 {
		return
	}
	if s.a.owned != nil {
		// Only whole-mode nodes gossip events, and an owned slice takes
		// events from its origins' streams alone (cluster_index_mode.go).
		s.a.stats.indexEventsRefused.Add(uint64(len(events)))
		return
	}
	origin := events[0].Origin
	s.mu.Lock()
	if _, ok := s.waiting[origin]; ok {
		// Behind the events held already: keep the order.
		s.holdLocked(events)
		s.mu.Unlock()
		s.poke()
		return
	}
	s.mu.Unlock()
	if !s.apply(events) {
		s.mu.Lock()
		s.holdLocked(events)
		s.mu.Unlock()
		s.a.log.Warn("index: no free slot for a node; holding its events until the sweep frees one", "peer", origin,
			"nodes", index.MaxNodes, "pending", s.a.index.Pending())
		s.poke()
	}
}

// apply applies consecutive events of one origin and incarnation, and
// reports false, having applied none, if the index has no slot for it.
func (s *indexSink) apply(events []membership.Event) bool {
	// One origin and incarnation per call. The run is part of the id, so
	// that events of a stale instance never land on the live one's.
	origin, inc := events[0].Origin, events[0].Incarnation
	id, err := s.a.index.Node(origin, inc)
	if s.a.index.Pending() > 0 {
		s.poke() // a newer run retired the old one's id, or slots wait for a sweep
	}
	switch {
	case errors.Is(err, index.ErrStaleIncarnation):
		s.a.log.Debug("index: events of an older run ignored", "peer", origin, "incarnation", inc, "err", err)
		return true
	case errors.Is(err, index.ErrTooManyNodes):
		return false
	case err != nil:
		s.a.log.Error("index: events of a node not indexed", "peer", origin, "err", err)
		return true
	}
	s.store(id, events)
	return true
}

// store applies events to id, each run of one kind in one call (an
// import's chunk registers up to thousands of blocks at once); a Drop of
// the origin meanwhile retires id, and the rest fail harmlessly. A run
// that fails otherwise (index.ErrFull: a shard's spill arena out of entry
// numbers) stops at the hash that failed, and the rest of it is not
// indexed. The events of runs applied whole are noted for cluster-aware
// eviction and for the count of holders' disk-held copies.
func (s *indexSink) store(id index.NodeID, events []membership.Event) {
	// Another node's events matter to the eviction order only while this
	// node holds blocks.
	mine := events[0].Origin == s.a.cfg.NodeName
	self, marks := s.a.index.Lookup(s.a.cfg.NodeName)
	marks = marks && !s.a.cfg.NoClusterEviction && (mine || s.a.index.NodeBlocks(self) > 0)
	var d demotions
	hashes := make([]uint64, 0, len(events))
	for len(events) > 0 {
		n := 1
		for n < len(events) && events[n].Kind == events[0].Kind {
			n++
		}
		hashes = hashes[:0]
		for _, e := range events[:n] {
			hashes = append(hashes, e.Hash)
		}
		var err error
		if events[0].Kind == membership.EventStore {
			err = s.a.index.Store(id, hashes...)
		} else {
			err = s.a.index.Remove(id, hashes...)
		}
		full := errors.Is(err, index.ErrNodeFull)
		if full {
			// The rest of the run is stored; the hashes refused stay
			// unindexed, and are not noted below.
			s.refused(events[0].Origin, err)
			err = nil
		}
		switch {
		case errors.Is(err, index.ErrUnknownNode):
			s.a.log.Debug("index", "peer", events[0].Origin, "events", n, "err", err)
		case err != nil:
			s.a.log.Warn("index: events not applied", "peer", events[0].Origin, "events", n, "err", err)
		default:
			for _, e := range events[:n] {
				if full && s.a.index.Copies(e.Hash, id) == 0 {
					continue
				}
				noteTierEvent(&s.a.tierHeld, s.a.index, id, e)
				if marks {
					s.note(&d, self, mine, e)
				}
			}
		}
		events = events[n:]
	}
	s.queue(&d)
}

// holdLocked queues events behind those held for their origin; past
// maxHeldEvents, the origin's held events are lost. s.mu is held.
func (s *indexSink) holdLocked(events []membership.Event) {
	origin := events[0].Origin
	if s.held+len(events) > maxHeldEvents {
		lost := len(events)
		for _, b := range s.waiting[origin] {
			lost += len(b)
		}
		s.held -= lost - len(events)
		delete(s.waiting, origin)
		s.overflowed[origin] = true
		s.a.stats.indexEventsLost.Add(uint64(lost))
		s.a.log.Error("index: too many events held for nodes without a slot; resynchronising that node's blocks",
			"peer", origin, "events", lost, "held", s.held, "limit", maxHeldEvents)
		s.poke()
		return
	}
	s.waiting[origin] = append(s.waiting[origin], events)
	s.held += len(events)
}

// flush applies the events held for origins that had no slot, for as long
// as the index finds them one. Only sweepLoop calls it, so the held
// events of an origin are applied by one goroutine, in order; Apply adds
// to an origin's backlog while it is flushed, and goes to the index
// directly only once it is empty.
func (s *indexSink) flush() {
	s.mu.Lock()
	origins := make([]string, 0, len(s.waiting))
	for o := range s.waiting {
		origins = append(origins, o)
	}
	s.mu.Unlock()
	for _, o := range origins {
		for {
			s.mu.Lock()
			q, ok := s.waiting[o]
			if ok && len(q) == 0 {
				delete(s.waiting, o)
				ok = false
			}
			if !ok {
				s.mu.Unlock()
				break // applied, or dropped meanwhile
			}
			// Named under s.mu: a Drop of the origin either comes first
			// and takes the backlog with it, or retires the id we get, and
			// the stores fail harmlessly; they never name the origin again.
			events := q[0]
			id, err := s.a.index.Node(o, events[0].Incarnation)
			if errors.Is(err, index.ErrTooManyNodes) {
				s.mu.Unlock()
				break // still no slot: the next sweep tries again
			}
			s.waiting[o] = q[1:]
			s.held -= len(events)
			s.mu.Unlock()
			switch {
			case errors.Is(err, index.ErrStaleIncarnation):
				s.a.log.Debug("index: events of an older run ignored", "peer", o, "incarnation", events[0].Incarnation, "err", err)
			case err != nil:
				s.a.log.Error("index: events of a node not indexed", "peer", o, "err", err)
			default:
				s.store(id, events)
			}
		}
	}
}

// heldEvents returns how many events wait for a slot.
func (s *indexSink) heldEvents() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

func (s *indexSink) Drop(origin string) {
	// Drop also precedes a snapshot repair of a live origin: only its
	// index entries go (memberLoop handles members that leave). Events
	// held for it go too: they are of the holdings being forgotten.
	s.mu.Lock()
	for _, b := range s.waiting[origin] {
		s.held -= len(b)
	}
	delete(s.waiting, origin)
	s.mu.Unlock()
	if s.a.index.DropName(origin) {
		s.poke()
	}
}

func (s *indexSink) poke() {
	select {
	case s.sweep <- struct{}{}:
	default:
	}
}

// sweepLoop removes dropped nodes' entries from the index, one pass for
// every drop since the last, frees their ids for new nodes, and applies
// the events held for nodes that had no slot.
func (s *indexSink) sweepLoop() {
	defer s.a.wg.Done()
	for {
		select {
		case <-s.a.done:
			return
		case <-s.sweep:
			s.a.index.Sweep()
			s.flush()
			s.resyncOverflowed()
		}
	}
}

// resyncOverflowed has membership repair every origin that lost held
// events from scratch: its events come again, in order, from its log or
// its snapshot, instead of its blocks staying missing until it restarts.
func (s *indexSink) resyncOverflowed() {
	s.mu.Lock()
	var origins []string
	for o := range s.overflowed {
		origins = append(origins, o)
	}
	clear(s.overflowed)
	s.mu.Unlock()
	for _, o := range origins {
		if s.resync(o) {
			s.a.log.Warn("index: resynchronising a node that lost held events", "peer", o)
		}
	}
}
