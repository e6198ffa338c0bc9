package fabric

import (
	"errors"

	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
)

// publishState is onPoolEvents' memory; only the pool's goroutine, which
// makes every call, touches it.
type publishState struct {
	// through is the last pool event number that a reconciliation
	// covered: events up to it are already in what was published.
	through uint64
}

// onPoolEvents publishes the local pool's store and remove events to the
// cluster. The pool calls it from its own goroutine; Publish queues and
// does not wait for the network.
//
// When the pool dropped events (its buffer filled faster than this drains
// it), the cluster would miss those blocks for good; the pool's registry
// is the single source of truth for what this node holds, so the node
// reconciles what it has published with a snapshot of it instead, and
// skips the events that the snapshot already covers.
func (a *Agent) onPoolEvents(b pool.EventBatch) {
	a.stats.events.Add(uint64(len(b.Events)))
	if a.owned != nil {
		a.owned.publish(b) // to the hashes' owners, not gossip
		return
	}
	m := a.joined.Load()
	if b.Dropped > 0 {
		a.stats.eventsLost.Add(b.Dropped)
		if m != nil {
			a.reconcile(m, b.Dropped)
			return
		}
		a.log.Warn("pool events lost before the node joined", "lost", b.Dropped)
	}
	if m == nil {
		return
	}
	evs := b.Events
	for len(evs) > 0 && evs[0].Seq <= a.publish.through {
		evs = evs[1:]
	}
	for len(evs) > 0 {
		// Publish runs of one kind and block set together.
		n := 1
		for n < len(evs) && evs[n].Kind == evs[0].Kind && evs[n].Set == evs[0].Set {
			n++
		}
		kind := membership.EventStore
		if evs[0].Kind == pool.EventRemove {
			kind = membership.EventRemove
		}
		hashes := make([]uint64, n)
		for i := range n {
			hashes[i] = evs[i].Hash
		}
		if _, err := m.Publish(kind, uint32(evs[0].Set), hashes...); err != nil && !errors.Is(err, membership.ErrClosed) {
			a.log.Warn("events not published", "err", err)
		}
		evs = evs[n:]
	}
}

// reconcile republishes this node's holdings from the pool's registry.
// Every event of the batch at hand, and any still queued up to the
// snapshot's number, is covered by the snapshot. The tiers' blocks stay
// announced, as their records say with no change to them waiting for its
// announcement (tiers.announced).
func (a *Agent) reconcile(m *membership.Membership, lost uint64) {
	if a.tiers != nil {
		a.tiers.announced(func(tiers []membership.Entry) { a.reconcileWith(m, lost, tiers) })
		return
	}
	a.reconcileWith(m, lost, nil)
}

// reconcileWith is reconcile with the tiers' blocks.
func (a *Agent) reconcileWith(m *membership.Membership, lost uint64, tiers []membership.Entry) {
	s := a.pool.Snapshot()
	held := make([]membership.Entry, len(s.Blocks), len(s.Blocks)+len(tiers))
	for i, b := range s.Blocks {
		held[i] = membership.Entry{Hash: b.Hash, BlockSet: uint32(b.Set)}
	}
	held = append(held, tiers...)
	before := m.Metrics().EventsReconciled
	if _, err := m.Reconcile(held); err != nil {
		if !errors.Is(err, membership.ErrClosed) {
			a.log.Error("pool events lost and holdings not reconciled", "lost", lost, "err", err)
		}
		return
	}
	a.publish.through = s.Seq
	a.log.Warn("pool events lost; holdings republished from the pool's registry", "lost", lost,
		"held", len(held), "published", m.Metrics().EventsReconciled-before)
}
