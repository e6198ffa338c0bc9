package fabric

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/pool"
)

// ownedIndex is the owned-slices block index (index_mode owned): each
// block hash is indexed by the Config.IndexReplicas members that
// rendezvous hashing over the member list picks (index.Placement), and
// this node's index (Agent.index) holds only the hashes it owns, of every
// holder. Events of this node's blocks go to their hashes' owners over the
// peer connections (transfer index calls, not gossip); lookups ask the
// owners, and keep their answers for Config.IndexCacheTTL.
//
// The origin side keeps, per owner, an ordered stream of ops (store,
// remove, forget) numbered per origin run; the owner applies each op once,
// in order, and asks for a replace (the origin's whole holdings that it
// owns, sent afresh) when it cannot continue a stream: after a gap, its
// own restart, or having dropped the origin. When the member list changes,
// the origin sends each owner the hashes it gained (stores) and lost
// (forgets), and a member new to the list (a join, or a return after a
// failure or a partition) gets a replace: so every live node's blocks are
// findable again once the members agree on the list. A member that leaves
// or fails is dropped from every index by membership's sink, as in whole
// mode.
type ownedIndex struct {
	a        *Agent
	replicas int
	cache    *index.AnswerCache
	wake     chan struct{} // ops queued; capacity 1

	mu sync.Mutex
	// place is this node's view of the owners; nil until it has one.
	place *index.Placement
	// held is this node's own blocks, copies per hash, from the pool's
	// events; through is the last pool event a snapshot covered.
	held    map[uint64]uint32
	through uint64
	out     map[string]*outStream // per member of place

	// in is the owner side: per origin, the stream applied.
	inMu sync.Mutex
	in   map[string]*inStream

	stats ownedStats
}

// ownedStats counts the owned index's traffic, for metrics and tests.
type ownedStats struct {
	opsSent, opCalls, opBytes    atomic.Uint64
	opsApplied, replaces         atomic.Uint64
	lookupCalls, lookupBytes     atomic.Uint64
	cacheHits, cacheMisses       atomic.Uint64
	sendErrors, placementChanges atomic.Uint64
}

// outStream is what this node sends one owner.
type outStream struct {
	// ops are queued, numbered from base.
	base uint64
	ops  []ownedOp
	// replace says the stream restarts with this node's whole holdings
	// that the owner owns, built when it is sent; ops queue behind it
	// only once it is built. replaceAt numbers the op that carries the
	// replace flag once built (0: none pending in ops).
	replace   bool
	replaceAt uint64
	busy      bool // a call is in flight
	retryAt   time.Time
	failures  int
}

// reset drops the queued ops for a replace. Their numbers are not used
// again, so that the answer to a call in flight does not take ops that
// are queued after the reset for its own.
func (st *outStream) reset() {
	st.base += uint64(len(st.ops))
	st.ops, st.replace, st.replaceAt = nil, true, 0
}

// inStream is what an owner applied of one origin's stream.
type inStream struct {
	mu   sync.Mutex
	inc  uint64
	id   index.NodeID // the index id the stream's ops went to
	next uint64       // the number of the next op expected
}

// maxQueuedOps bounds the ops queued for one owner; past it the queue is
// dropped and the owner gets a replace instead.
const maxQueuedOps = 1 << 18

// ownedWatchInterval is how often the member list is compared with the
// placement's.
const ownedWatchInterval = 50 * time.Millisecond

func newOwnedIndex(a *Agent) *ownedIndex {
	return &ownedIndex{
		a: a, replicas: a.cfg.IndexReplicas,
		cache: index.NewAnswerCache(0, a.cfg.IndexCacheTTL),
		wake:  make(chan struct{}, 1),
		held:  map[uint64]uint32{},
		out:   map[string]*outStream{},
		in:    map[string]*inStream{},
	}
}

// start runs the loops that follow the member list and send queued ops;
// membership has started.
func (o *ownedIndex) start() {
	o.a.wg.Add(2)
	go o.watchLoop()
	go o.sendLoop()
}

func (o *ownedIndex) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// publish takes the local pool's events in place of gossip: it keeps
// this node's holdings and queues each event for its hash's owners. The
// pool calls it from its own goroutine.
func (o *ownedIndex) publish(b pool.EventBatch) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if b.Dropped > 0 {
		// The pool's registry is the truth: start every stream afresh
		// from it.
		o.a.stats.eventsLost.Add(b.Dropped)
		s := o.a.pool.Snapshot()
		clear(o.held)
		for _, blk := range s.Blocks {
			o.held[blk.Hash]++
		}
		o.through = s.Seq
		for _, st := range o.out {
			st.reset()
		}
		o.a.log.Warn("pool events lost; every owner gets this node's holdings afresh", "lost", b.Dropped, "held", len(o.held))
		o.poke()
		return
	}
	var owners [MaxIndexReplicas]string
	queued := false
	for _, e := range b.Events {
		if e.Seq <= o.through {
			continue
		}
		kind := uint8(opStore)
		if e.Kind == pool.EventRemove {
			if o.held[e.Hash] == 0 {
				continue
			}
			kind = opRemove
			if o.held[e.Hash]--; o.held[e.Hash] == 0 {
				delete(o.held, e.Hash)
			}
		} else {
			o.held[e.Hash]++
		}
		if o.place == nil {
			continue
		}
		for _, w := range o.place.AppendOwners(owners[:0], e.Hash) {
			o.queueLocked(w, ownedOp{kind: kind, hash: e.Hash})
			queued = true
		}
	}
	if queued {
		o.poke()
	}
}

// queueLocked queues op for owner w. o.mu is held.
func (o *ownedIndex) queueLocked(w string, op ownedOp) {
	st := o.out[w]
	if st == nil || st.replace {
		return // a replace pending covers it
	}
	if len(st.ops) >= maxQueuedOps {
		st.reset()
		return
	}
	st.ops = append(st.ops, op)
}

// watchLoop follows the member list: each change moves hashes between
// owners.
func (o *ownedIndex) watchLoop() {
	defer o.a.wg.Done()
	t := time.NewTicker(ownedWatchInterval)
	defer t.Stop()
	var last []string
	for {
		select {
		case <-o.a.done:
			return
		case <-t.C:
		}
		ms := o.a.members.Members()
		names := make([]string, len(ms))
		for i, m := range ms {
			names[i] = m.Name
		}
		slices.Sort(names)
		if slices.Equal(names, last) {
			continue
		}
		last = names
		o.setMembers(names)
	}
}

// setMembers moves this node's part of the index to the owners under
// members: each owner that gains a hash this node holds gets its copies,
// each that loses one is told to forget it, and a member new to the list
// gets a replace.
func (o *ownedIndex) setMembers(members []string) {
	o.stats.placementChanges.Add(1)
	next := index.NewPlacement(members, o.replicas)
	o.mu.Lock()
	old := o.place
	o.place = next
	for w := range o.out {
		if !slices.Contains(members, w) {
			delete(o.out, w) // gone: its slice went with it
		}
	}
	for _, w := range members {
		if o.out[w] == nil {
			o.out[w] = &outStream{base: 1, replace: true}
		}
	}
	if old != nil {
		var was, now [MaxIndexReplicas]string
		for h, copies := range o.held {
			before := old.AppendOwners(was[:0], h)
			after := next.AppendOwners(now[:0], h)
			for _, w := range after {
				if !slices.Contains(before, w) {
					for range copies {
						o.queueLocked(w, ownedOp{kind: opStore, hash: h})
					}
				}
			}
			for _, w := range before {
				if !slices.Contains(after, w) {
					o.queueLocked(w, ownedOp{kind: opForget, hash: h})
				}
			}
		}
	}
	o.mu.Unlock()
	o.cache.Clear()
	o.poke()
}

// sendLoop sends each owner its queued ops, one call in flight per owner,
// so that they arrive in order.
func (o *ownedIndex) sendLoop() {
	defer o.a.wg.Done()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var calls sync.WaitGroup
	defer calls.Wait()
	for {
		select {
		case <-o.a.done:
			return
		case <-o.wake:
		case <-t.C:
		}
		now := time.Now()
		o.mu.Lock()
		for w, st := range o.out {
			if st.busy || now.Before(st.retryAt) {
				continue
			}
			c, ok := o.nextCallLocked(w, st)
			if !ok {
				continue
			}
			st.busy = true
			calls.Go(func() { o.send(w, st, c) })
		}
		o.mu.Unlock()
	}
}

// nextCallLocked builds the next call of st, building a pending replace
// first. o.mu is held.
func (o *ownedIndex) nextCallLocked(w string, st *outStream) (opsCall, bool) {
	if st.replace {
		var owners [MaxIndexReplicas]string
		// No op queues behind a pending replace (queueLocked): it
		// starts the stream.
		st.replace, st.replaceAt = false, st.base
		for h, copies := range o.held {
			if slices.Contains(o.place.AppendOwners(owners[:0], h), w) {
				for range copies {
					st.ops = append(st.ops, ownedOp{kind: opStore, hash: h})
				}
			}
		}
		o.stats.replaces.Add(1)
	}
	if len(st.ops) == 0 && st.replaceAt != st.base {
		return opsCall{}, false
	}
	n := min(len(st.ops), maxOwnedOps)
	return opsCall{inc: o.a.members.Incarnation(), first: st.base, replace: st.replaceAt == st.base,
		ops: slices.Clone(st.ops[:n])}, true
}

// send makes one ops call and records its outcome.
func (o *ownedIndex) send(w string, st *outStream, c opsCall) {
	payload := appendOpsCall(nil, c)
	ans, err := o.call(w, payload)
	o.mu.Lock()
	defer o.mu.Unlock()
	st.busy = false
	if o.out[w] != st {
		return // the member left meanwhile
	}
	switch {
	case err != nil:
		o.stats.sendErrors.Add(1)
		st.failures++
		st.retryAt = time.Now().Add(min(time.Duration(st.failures)*50*time.Millisecond, time.Second))
		o.a.log.Debug("index ops not delivered", "peer", w, "ops", len(c.ops), "err", err)
		return
	case len(ans) == 1 && ans[0] == ansReplace:
		st.reset()
		st.failures = 0
	case len(ans) == 1 && ans[0] == ansApplied:
		o.stats.opsSent.Add(uint64(len(c.ops)))
		o.stats.opCalls.Add(1)
		o.stats.opBytes.Add(uint64(len(payload)))
		// Ops may have been dropped for a replace meanwhile.
		if st.base == c.first {
			st.ops = st.ops[len(c.ops):]
			st.base += uint64(len(c.ops))
		}
		if st.replaceAt == c.first {
			st.replaceAt = 0
		}
		st.failures = 0
	default:
		o.stats.sendErrors.Add(1)
		st.retryAt = time.Now().Add(time.Second)
		o.a.log.Warn("index ops: the owner's answer is malformed", "peer", w, "bytes", len(ans))
		return
	}
	if len(st.ops) > 0 || st.replace {
		o.poke()
	}
}

// call sends an index call to member w, or serves it here if w is this
// node.
func (o *ownedIndex) call(w string, payload []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(o.a.ctx, o.a.cfg.PeerTimeout)
	defer cancel()
	if w == o.a.cfg.NodeName {
		return o.serve(ctx, w, payload)
	}
	p, err := repairer{o.a}.peer(ctx, w)
	if err != nil {
		return nil, err
	}
	return p.IndexCall(ctx, payload)
}
