package fabric

import "github.com/kvfabric/kvfabric/membership"

// indexSink applies every node's replicated events to the index. It runs
// on membership's goroutine and must not block.
type indexSink struct{ a *Agent }

func (s indexSink) Apply(events []membership.Event) {
	if len(events) == 0 {
		return
	}
	id, err := s.a.index.ID(events[0].Origin)
	if err != nil {
		s.a.log.Error("index full: events of a node not indexed", "peer", events[0].Origin, "err", err)
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

func (s indexSink) Drop(origin string) {
	// Drop also precedes a snapshot repair of a live origin: only its
	// index entries go (memberLoop handles members that leave).
	if id, err := s.a.index.ID(origin); err == nil {
		s.a.index.DropNode(id)
	}
}
