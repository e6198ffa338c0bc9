package fabric

import (
	"errors"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
)

// indexSink applies every node's replicated events to the index. Its Apply
// and Drop run on membership's goroutines, some inside memberlist's
// callbacks, and must not block: a drop only retires the node's index id,
// and sweepLoop removes the entries afterwards, on its own goroutine.
type indexSink struct {
	a     *Agent
	sweep chan struct{} // a drop happened; capacity 1
}

func newIndexSink(a *Agent) *indexSink {
	return &indexSink{a: a, sweep: make(chan struct{}, 1)}
}

func (s *indexSink) Apply(events []membership.Event) {
	if len(events) == 0 {
		return
	}
	// One origin and incarnation per call. The run is part of the id, so
	// that events of a stale instance never land on the live one's.
	origin, inc := events[0].Origin, events[0].Incarnation
	id, err := s.a.index.Node(origin, inc)
	if s.a.index.Pending() > 0 {
		s.poke() // a newer run retired the old one's id
	}
	switch {
	case errors.Is(err, index.ErrStaleIncarnation):
		s.a.log.Debug("index: events of an older run ignored", "peer", origin, "incarnation", inc, "err", err)
		return
	case err != nil:
		s.a.log.Error("index full: events of a node not indexed", "peer", origin, "err", err)
		return
	}
	for _, e := range events {
		if e.Kind == membership.EventStore {
			err = s.a.index.Store(id, e.Hash)
		} else {
			err = s.a.index.Remove(id, e.Hash)
		}
		if err != nil {
			s.a.log.Debug("index", "peer", e.Origin, "hash", e.Hash, "err", err)
		}
	}
}

func (s *indexSink) Drop(origin string) {
	// Drop also precedes a snapshot repair of a live origin: only its
	// index entries go (memberLoop handles members that leave).
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
// every drop since the last, and frees their ids for new nodes.
func (s *indexSink) sweepLoop() {
	defer s.a.wg.Done()
	for {
		select {
		case <-s.a.done:
			return
		case <-s.sweep:
			s.a.index.Sweep()
		}
	}
}
