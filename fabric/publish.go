package fabric

import (
	"errors"

	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
)

// onPoolEvents publishes the local pool's store and remove events to the
// cluster. The pool calls it from its own goroutine; Publish queues and
// does not wait for the network.
func (a *Agent) onPoolEvents(b pool.EventBatch) {
	a.stats.events.Add(uint64(len(b.Events)))
	if b.Dropped > 0 {
		a.stats.eventsLost.Add(b.Dropped)
		a.log.Warn("pool events lost: the cluster's index misses some of this node's blocks until they are stored again", "lost", b.Dropped)
	}
	m := a.joined.Load()
	if m == nil {
		return
	}
	evs := b.Events
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
