package fabric

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/transfer"
)

// repairer fetches what membership missed from the origin over QUIC.
type repairer struct{ a *Agent }

func (r repairer) peer(ctx context.Context, origin string) (*transfer.Peer, error) {
	m, ok := r.a.member(origin)
	if !ok || m.Meta.PeerAddr == "" {
		return nil, fmt.Errorf("fabric: %s is not a member with a peer address", origin)
	}
	return r.a.peers.get(ctx, r.a.transport, origin, m.Meta.PeerAddr)
}

func (r repairer) Events(ctx context.Context, origin string, inc, from, to uint64) ([]membership.Event, error) {
	p, err := r.peer(ctx, origin)
	if err != nil {
		return nil, err
	}
	er, err := p.EventRange(ctx, transfer.EventQuery{Origin: origin, Incarnation: inc, From: from, To: to + 1})
	if err != nil {
		return nil, err
	}
	if er.SnapshotNeeded {
		return nil, membership.ErrRangeGone
	}
	return decodeEvents(er.Events)
}

func (r repairer) Snapshot(ctx context.Context, origin string) (membership.Snapshot, error) {
	p, err := r.peer(ctx, origin)
	if err != nil {
		return membership.Snapshot{}, err
	}
	er, err := p.EventRange(ctx, transfer.EventQuery{Origin: origin, Snapshot: true})
	if err != nil {
		return membership.Snapshot{}, err
	}
	evs, err := decodeEvents(er.Events)
	if err != nil {
		return membership.Snapshot{}, err
	}
	s := membership.Snapshot{Origin: origin}
	if len(er.Events) > 0 {
		s.Seq = er.Events[0].Seq
	}
	for _, e := range evs {
		if e.Origin != origin {
			return membership.Snapshot{}, fmt.Errorf("fabric: snapshot of %s holds an event of %s", origin, e.Origin)
		}
		s.Incarnation = e.Incarnation
		s.Entries = append(s.Entries, membership.Entry{Hash: e.Hash, BlockSet: e.BlockSet})
	}
	return s, nil
}

func decodeEvents(wire []transfer.Event) ([]membership.Event, error) {
	var out []membership.Event
	for _, w := range wire {
		evs, err := membership.DecodeBatch(w.Payload)
		if err != nil {
			return nil, err
		}
		out = append(out, evs...)
	}
	return out, nil
}

// eventChunk bounds the events encoded in one payload of a repair answer.
const eventChunk = 4096

// eventRange serves a peer's repair from this node's own log.
func (a *Agent) eventRange(origin string, q transfer.EventQuery) (transfer.EventRange, error) {
	if origin != a.cfg.NodeName {
		return transfer.EventRange{}, fmt.Errorf("%w: this node serves only its own events, not %s's", transfer.ErrNotFound, origin)
	}
	m := a.joined.Load()
	if m == nil {
		return transfer.EventRange{}, fmt.Errorf("%w: not in the cluster", transfer.ErrUnavailable)
	}
	var evs []membership.Event
	var seq uint64
	if q.Snapshot {
		s := m.Snapshot()
		seq = s.Seq
		for _, e := range s.Entries {
			evs = append(evs, membership.Event{Origin: s.Origin, Incarnation: s.Incarnation, Seq: s.Seq,
				Kind: membership.EventStore, Hash: e.Hash, BlockSet: e.BlockSet})
		}
	} else {
		var err error
		evs, err = m.EventRange(q.Incarnation, q.From, q.To-1)
		if errors.Is(err, membership.ErrRangeGone) {
			return transfer.EventRange{SnapshotNeeded: true}, nil
		}
		if err != nil {
			return transfer.EventRange{}, err
		}
	}
	var out transfer.EventRange
	for len(evs) > 0 {
		n := min(len(evs), eventChunk)
		b, err := membership.AppendBatch(nil, evs[:n])
		if err != nil {
			return transfer.EventRange{}, err
		}
		// A chunk is numbered by its first event, so that the reader's
		// check of order holds; a snapshot's chunks all carry its Seq.
		s := evs[0].Seq
		if q.Snapshot {
			s = seq
		}
		out.Events = append(out.Events, transfer.Event{Seq: s, Payload: b})
		evs = evs[n:]
	}
	return out, nil
}
