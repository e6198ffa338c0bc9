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

// Events asks for at most transfer.MaxEventRange events, and answers the
// prefix that came back; membership asks again for the rest.
func (r repairer) Events(ctx context.Context, origin string, inc, from, to uint64) ([]membership.Event, error) {
	p, err := r.peer(ctx, origin)
	if err != nil {
		return nil, err
	}
	end := to + 1 // exclusive on the wire
	if end-from > transfer.MaxEventRange || end < from {
		end = from + transfer.MaxEventRange
	}
	er, err := p.EventRange(ctx, transfer.EventQuery{Origin: origin, Incarnation: inc, From: from, To: end})
	var re *transfer.RemoteError
	if errors.As(err, &re) && (re.Code == transfer.CodeTooLarge || re.Code == transfer.CodeInvalidRequest) {
		// A holder with a smaller cap refuses the range; its snapshot
		// still brings us up to date.
		return nil, fmt.Errorf("fabric: %w: %w", membership.ErrRangeTooLarge, err)
	}
	if err != nil {
		return nil, err
	}
	if er.SnapshotNeeded {
		return nil, membership.ErrRangeGone
	}
	return decodeEvents(er.Events)
}

// Snapshot fetches origin's holdings page by page, every page of the one
// snapshot that the first answer numbered.
func (r repairer) Snapshot(ctx context.Context, origin string) (membership.HoldingsSnapshot, error) {
	return r.snapshot(ctx, origin, membership.MaxSnapshotEntries)
}

// snapshot is Snapshot refusing more than limit entries.
func (r repairer) snapshot(ctx context.Context, origin string, limit int) (membership.HoldingsSnapshot, error) {
	p, err := r.peer(ctx, origin)
	if err != nil {
		return membership.HoldingsSnapshot{}, err
	}
	s := membership.HoldingsSnapshot{Origin: origin}
	q := transfer.EventQuery{Origin: origin, Snapshot: true}
	for page := 0; ; page++ {
		er, err := p.EventRange(ctx, q)
		if err != nil {
			return membership.HoldingsSnapshot{}, err
		}
		if er.SnapshotNeeded {
			// The origin dropped the snapshot being paged (it went
			// unread too long); the next repair starts a new one.
			return membership.HoldingsSnapshot{}, fmt.Errorf("fabric: snapshot of %s as of %d: %w", origin, q.SnapshotSeq, membership.ErrRangeGone)
		}
		if page == 0 {
			s.Seq, s.Incarnation = er.SnapshotSeq, er.Incarnation
		} else if er.SnapshotSeq != s.Seq || er.Incarnation != s.Incarnation {
			return membership.HoldingsSnapshot{}, fmt.Errorf("%w: snapshot page of %s is of %d/%d, earlier pages of %d/%d",
				membership.ErrMalformed, origin, er.Incarnation, er.SnapshotSeq, s.Incarnation, s.Seq)
		}
		evs, err := decodeEvents(er.Events)
		if err != nil {
			return membership.HoldingsSnapshot{}, err
		}
		if len(s.Entries)+len(evs) > limit {
			return membership.HoldingsSnapshot{}, fmt.Errorf("%w: snapshot of %s passes %d entries", membership.ErrMalformed, origin, limit)
		}
		for _, e := range evs {
			// Entries are numbered by their place in the snapshot.
			if e.Origin != origin || e.Incarnation != s.Incarnation || e.Kind != membership.EventStore || e.Seq != uint64(len(s.Entries))+1 {
				return membership.HoldingsSnapshot{}, fmt.Errorf("%w: snapshot entry %d of %s is %s/%d #%d kind %v",
					membership.ErrMalformed, len(s.Entries), origin, e.Origin, e.Incarnation, e.Seq, e.Kind)
			}
			s.Entries = append(s.Entries, membership.Entry{Hash: e.Hash, BlockSet: e.BlockSet})
		}
		if !er.More {
			return s, nil
		}
		q.SnapshotSeq, q.Offset = s.Seq, uint64(len(s.Entries))
	}
}

func decodeEvents(wire []transfer.LogEntry) ([]membership.Event, error) {
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

// eventsFitting is how many of origin's events, encoded in payloads of
// eventChunk, an answer of budget bytes carries (transfer.EventQuery's
// MaxBytes); a budget of zero or less means no limit.
func eventsFitting(origin string, budget int) int {
	if budget <= 0 {
		return membership.MaxBatchEvents
	}
	full := membership.MaxBatchLen(origin, eventChunk) + transfer.EventOverhead
	n := budget / full * eventChunk
	rest := budget % full
	if extra := (rest - transfer.EventOverhead - membership.MaxBatchLen(origin, 0)) / (membership.MaxBatchLen(origin, 1) - membership.MaxBatchLen(origin, 0)); extra > 0 {
		n += extra
	}
	return n
}

// eventRange serves a peer's repair from this node's own log, or a page of
// its holdings, as much as one answer carries.
func (a *Agent) eventRange(origin string, q transfer.EventQuery) (transfer.EventRange, error) {
	if origin != a.cfg.NodeName {
		return transfer.EventRange{}, fmt.Errorf("%w: this node serves only its own events, not %s's", transfer.ErrNotFound, origin)
	}
	m := a.joined.Load()
	if m == nil {
		return transfer.EventRange{}, fmt.Errorf("%w: not in the cluster", transfer.ErrUnavailable)
	}
	fit := eventsFitting(origin, q.MaxBytes)
	if fit < 1 {
		return transfer.EventRange{}, fmt.Errorf("%w: an answer of %d bytes carries no event", transfer.ErrInternal, q.MaxBytes)
	}
	var out transfer.EventRange
	var evs []membership.Event
	if q.Snapshot {
		page, err := m.SnapshotPage(q.SnapshotSeq, q.Offset, fit)
		if errors.Is(err, membership.ErrRangeGone) {
			return transfer.EventRange{SnapshotNeeded: true}, nil
		}
		if errors.Is(err, membership.ErrSnapshotBusy) {
			// Other nodes are reading every snapshot kept; the
			// reader's next repair asks again.
			return transfer.EventRange{}, fmt.Errorf("%w: %w", transfer.ErrUnavailable, err)
		}
		if err != nil {
			return transfer.EventRange{}, fmt.Errorf("%w: %w", transfer.ErrInvalidRequest, err)
		}
		out.SnapshotSeq, out.Incarnation, out.More = page.Seq, page.Incarnation, page.More
		// A batch numbers its events consecutively: the entries are
		// numbered by their place in the snapshot (from 1), and each
		// payload by the snapshot's event number.
		evs = make([]membership.Event, len(page.Entries))
		for i, e := range page.Entries {
			evs[i] = membership.Event{Origin: page.Origin, Incarnation: page.Incarnation, Seq: page.Offset + uint64(i) + 1,
				Kind: membership.EventStore, Hash: e.Hash, BlockSet: e.BlockSet}
		}
	} else {
		// Take one more than fits, to learn whether the answer stops
		// short of what the log holds.
		last := q.To - 1
		if q.To-q.From > uint64(fit) {
			last = q.From + uint64(fit)
		}
		var err error
		evs, err = m.EventRange(q.Incarnation, q.From, last)
		if errors.Is(err, membership.ErrRangeGone) {
			return transfer.EventRange{SnapshotNeeded: true}, nil
		}
		if err != nil {
			return transfer.EventRange{}, fmt.Errorf("%w: %w", transfer.ErrInvalidRequest, err)
		}
		if len(evs) > fit {
			evs, out.More = evs[:fit], true
		}
	}
	for len(evs) > 0 {
		n := min(len(evs), eventChunk)
		b, err := membership.AppendBatch(nil, evs[:n])
		if err != nil {
			return transfer.EventRange{}, err
		}
		// A range's payload is numbered by its first event, so that the
		// reader's check of order holds; a snapshot's by its Seq.
		s := evs[0].Seq
		if q.Snapshot {
			s = out.SnapshotSeq
		}
		out.Events = append(out.Events, transfer.LogEntry{Seq: s, Payload: b})
		evs = evs[n:]
	}
	return out, nil
}
