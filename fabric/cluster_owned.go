package fabric

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
)

// ownedIndex is the owned-slices block index (index_mode owned): each
// block hash is indexed by the Config.IndexReplicas members that
// rendezvous hashing over the member list picks (index.Placement), and
// this node's index (Agent.index) holds only the hashes it owns, of every
// holder. Events of this node's blocks go to their hashes' owners over the
// peer connections (transfer index calls, not gossip) in the ordered
// streams of index.Publisher and index.Slice; lookups ask the owners, and
// keep their answers for Config.IndexCacheTTL. When the member list
// changes the publisher moves hashes between owners; a member that leaves
// or fails is dropped from every index by membership's sink, as in whole
// mode.
type ownedIndex struct {
	a     *Agent
	pub   *index.Publisher
	slice atomic.Pointer[index.Slice] // from start on: peers may call before
	cache *index.AnswerCache
	wake  chan struct{} // ops queued; capacity 1

	mu      sync.Mutex // serializes publish and publishHeld: through
	through uint64     // the last pool event a snapshot covered

	legacy legacyOwners // owners that predate lookups with tiers and disk copies
	stats  ownedStats
}

// ownedStats counts the owned index's traffic (the answer cache and the
// publisher count the rest: see metrics).
type ownedStats struct {
	opsSent, opCalls atomic.Uint64 // in calls the owner applied
	lookupCalls      atomic.Uint64 // asked of owners
	sendErrors       atomic.Uint64 // ops calls not delivered
	opsReceived      atomic.Uint64 // applied as an owner
	lookupsAnswered  atomic.Uint64 // as an owner
}

// OwnedIndexMetrics counts what the owned-slices index did since start.
type OwnedIndexMetrics struct {
	// OpsSent are the block events sent to owners in calls they applied,
	// OpCalls those calls; OpsReceived the events this node applied as an
	// owner.
	OpsSent, OpCalls, OpsReceived uint64
	// LookupsAsked are the lookup calls sent to owners, LookupsAnswered
	// those this node answered as an owner.
	LookupsAsked, LookupsAnswered uint64
	// Cache counts the lookups of hashes in the cache of recent answers.
	Cache index.AnswerCacheStats
	// Handoffs are the member list changes that moved this node's hashes
	// between owners, HandoffOps the events they queued (stores to new
	// owners, forgets to old ones).
	Handoffs, HandoffOps uint64
	// StreamErrors are the ops calls that failed (retried later);
	// StreamReplaces the streams started afresh (an owner asked for its
	// slice again, or a new member got its slice).
	StreamErrors, StreamReplaces uint64
}

// metrics returns the owned index's counts.
func (o *ownedIndex) metrics() OwnedIndexMetrics {
	ps := o.pub.Stats()
	return OwnedIndexMetrics{
		OpsSent: o.stats.opsSent.Load(), OpCalls: o.stats.opCalls.Load(), OpsReceived: o.stats.opsReceived.Load(),
		LookupsAsked: o.stats.lookupCalls.Load(), LookupsAnswered: o.stats.lookupsAnswered.Load(),
		Cache:    o.cache.Stats(),
		Handoffs: uint64(ps.Handoffs), HandoffOps: uint64(ps.Moved),
		StreamErrors: o.stats.sendErrors.Load(), StreamReplaces: uint64(ps.Replaces),
	}
}

// ownedWatchInterval is how often the member list is compared with the
// placement's.
const ownedWatchInterval = 50 * time.Millisecond

func newOwnedIndex(a *Agent) *ownedIndex {
	return &ownedIndex{
		a:     a,
		pub:   index.NewPublisher(a.cfg.NodeName, a.cfg.IndexReplicas, 0),
		cache: index.NewAnswerCache(0, a.cfg.IndexCacheTTL),
		wake:  make(chan struct{}, 1),
	}
}

// start runs the loops that follow the member list and send queued ops;
// the index and membership have started.
func (o *ownedIndex) start() {
	o.slice.Store(index.NewSlice(o.a.index, o.a.sink.Drop))
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

// publish takes the local pool's events in place of gossip. The pool calls
// it from its own goroutine.
func (o *ownedIndex) publish(b pool.EventBatch) {
	if b.Dropped > 0 {
		o.a.stats.eventsLost.Add(b.Dropped)
		if t := o.a.tiers; t != nil {
			t.announced(func(held []membership.Entry) { o.resync(b.Dropped, held) })
		} else {
			o.resync(b.Dropped, nil)
		}
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	queued := false
	for _, e := range b.Events {
		if e.Seq <= o.through {
			continue
		}
		if e.Kind == pool.EventRemove {
			queued = o.pub.Remove(e.Hash) || queued
		} else {
			queued = o.pub.Store(e.Hash) || queued
		}
	}
	if queued {
		o.poke()
	}
}

// resync gives every owner this node's holdings afresh, after lost pool
// events: the pool's registry, which is the truth, and the tiers' blocks
// (tiers, under their block set numbers), which stay announced. Those are
// the tiers' records, read and given to the owners with no change to them
// recorded and not yet announced, nor announced meanwhile
// (tiers.announced): a block recorded and announced after the read would
// be counted twice, and one whose removal the records say nothing of any
// more would be held for good.
func (o *ownedIndex) resync(lost uint64, tiers []membership.Entry) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := o.a.pool.Snapshot()
	hashes := make([]uint64, len(s.Blocks), len(s.Blocks)+len(tiers))
	for i, blk := range s.Blocks {
		hashes[i] = blk.Hash
	}
	var disk []uint64
	for _, e := range tiers {
		if e.BlockSet < tierSetBase {
			hashes = append(hashes, e.Hash) // the host tier's: in memory
		} else {
			disk = append(disk, e.Hash)
		}
	}
	o.pub.ResetTiers(hashes, disk)
	o.through = s.Seq
	o.a.log.Warn("pool events lost; every owner gets this node's holdings afresh", "lost", lost, "held", o.pub.Held())
	o.poke()
}

// publishHeld takes a change to what this node holds outside its pool's
// events (the tiers' blocks), as publish takes the pool's: the owners keep
// the disk tiers' as copies on disk, so that importers prefer a holder
// with the block in memory, and the host tier's (inMemory) as copies in
// memory, as the pool's.
func (o *ownedIndex) publishHeld(store, inMemory bool, hashes []uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	queued := false
	switch {
	case store && inMemory:
		queued = o.pub.Store(hashes...)
	case inMemory:
		queued = o.pub.Remove(hashes...)
	case store:
		queued = o.pub.StoreDisk(hashes...)
	default:
		queued = o.pub.RemoveDisk(hashes...)
	}
	if queued {
		o.poke()
	}
}

// watchLoop follows the member list: each change moves hashes between
// owners.
func (o *ownedIndex) watchLoop() {
	defer o.a.wg.Done()
	t := time.NewTicker(ownedWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-o.a.done:
			return
		case <-t.C:
		}
		ms := o.a.members.Members()
		names := make([]string, 0, len(ms))
		for _, m := range ms {
			if !o.a.indexMismatch(m) { // not an index peer: cluster_index_mode.go
				names = append(names, m.Name)
			}
		}
		if o.pub.SetMembers(names) {
			o.cache.Clear()
			o.poke()
		}
	}
}

// sendLoop sends each owner its queued ops, one call out per owner, so
// that they arrive in order.
func (o *ownedIndex) sendLoop() {
	defer o.a.wg.Done()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	var calls sync.WaitGroup
	defer calls.Wait()
	inc := o.a.members.Incarnation()
	for {
		select {
		case <-o.a.done:
			return
		case <-o.wake:
		case <-t.C:
		}
		for _, c := range o.pub.Next(time.Now(), inc) {
			calls.Go(func() { o.send(c) })
		}
	}
}

// send makes one ops call and records its outcome.
func (o *ownedIndex) send(c index.Outgoing) {
	ans, err := o.sendOps(c)
	outcome := index.Applied
	switch {
	case err != nil:
		o.stats.sendErrors.Add(1)
		o.a.log.Debug("index ops not delivered", "peer", c.Owner, "ops", len(c.Call.Ops), "err", err)
		outcome = index.Failed
	case len(ans) == 1 && ans[0] == ansReplace:
		outcome = index.Replace
	case len(ans) == 1 && ans[0] == ansApplied:
		o.stats.opsSent.Add(uint64(len(c.Call.Ops)))
		o.stats.opCalls.Add(1)
	default:
		o.stats.sendErrors.Add(1)
		o.a.log.Warn("index ops: the owner's answer is malformed", "peer", c.Owner, "bytes", len(ans))
		outcome = index.Failed
	}
	if o.pub.Done(c, outcome, time.Now()) {
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

// owners returns the owners of hash under this node's view, nil before it
// has one.
func (o *ownedIndex) owners(hash uint64) []string {
	p := o.pub.Placement()
	if p == nil {
		return nil
	}
	return p.AppendOwners(nil, hash)
}

// members returns the members of this node's placement.
func (o *ownedIndex) members() []string {
	p := o.pub.Placement()
	if p == nil {
		return nil
	}
	return slices.Clone(p.Members())
}
