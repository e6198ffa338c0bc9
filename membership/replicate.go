package membership

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/memberlist"
)

// Sink consumes the replicated block events of every origin, this node's own
// included. Membership makes one call at a time, in each origin's order, and
// never while another call is running; a Sink must not block and must not
// call back into Membership. The events slice is the Sink's to keep.
type Sink interface {
	// Apply delivers consecutive events of one origin and incarnation.
	// Events rebuilt from a snapshot all carry the snapshot's Seq.
	Apply(events []Event)
	// Drop forgets every entry of origin: it died, left, or restarted with a
	// new incarnation (whose events or snapshot follow).
	Drop(origin string)
}

// Repairer fetches what a node missed from the origin itself; the peer
// transport implements it by calling [Membership.EventRange] and
// [Membership.SnapshotPage] on the origin. Calls come from one goroutine at
// a time and must honour ctx. Everything returned is validated before use.
type Repairer interface {
	// Events returns origin's events from from..to (inclusive) of
	// incarnation, or a prefix of them: fewer when the origin has
	// published fewer, or when one call cannot carry them all (the
	// caller asks again from the next). An error matching ErrRangeGone
	// means the origin no longer keeps them or runs another incarnation;
	// one matching ErrRangeTooLarge that the origin refused the range for
	// its size. Either way the caller falls back to a snapshot.
	Events(ctx context.Context, origin string, incarnation, from, to uint64) ([]Event, error)
	// Snapshot returns origin's holdings as of a recent event (the
	// snapshot's Seq; the caller fetches what follows by range), fetched
	// in as many pages as they take, all of one snapshot.
	Snapshot(ctx context.Context, origin string) (HoldingsSnapshot, error)
}

// ErrRangeGone is returned by [Membership.EventRange] (and a Repairer) when
// the requested events are no longer kept, and by
// [Membership.SnapshotPage] when the snapshot being paged is no longer
// kept; the caller asks for a new snapshot.
var ErrRangeGone = errors.New("membership: event range no longer kept")

// ErrRangeTooLarge is returned by a Repairer whose origin refused a range
// for its size; the caller asks for a snapshot, as for ErrRangeGone.
var ErrRangeTooLarge = errors.New("membership: event range too large for the origin")

// MaxSnapshotEntries bounds the entries of one snapshot that a node
// accepts from an origin (16 bytes each once decoded): a snapshot is
// assembled page by page, and an origin that never stops paging must not
// exhaust memory.
const MaxSnapshotEntries = 1 << 26

// originState is what a node knows of another origin's event stream.
type originState struct {
	inc     uint64
	applied uint64 // every event up to here has been applied
	known   uint64 // the highest number heard of, by batch or push/pull
	pending map[uint64]Event
	// gapSince is when applied < known was first seen; zero without a gap.
	gapSince  time.Time
	repairing bool
}

// batchBroadcast is one encoded batch in memberlist's broadcast queue.
type batchBroadcast []byte

func (b batchBroadcast) Invalidates(memberlist.Broadcast) bool { return false }
func (b batchBroadcast) Message() []byte                       { return b }
func (b batchBroadcast) Finished()                             {}

// Publish numbers events for this node's blocks of block set blockSet, one
// per hash, applies them to the Sink and queues them for gossip. It returns
// the number of the last one.
func (m *Membership) Publish(kind EventKind, blockSet uint32, hashes ...uint64) (uint64, error) {
	if !kind.valid() {
		return 0, fmt.Errorf("membership: publish: invalid event kind %d", kind)
	}
	if m.closed.Load() {
		return 0, ErrClosed
	}
	events := make([]Event, len(hashes))
	m.mu.Lock()
	for i, h := range hashes {
		events[i] = m.numberLocked(kind, Entry{Hash: h, BlockSet: blockSet})
	}
	m.publishLocked(events)
	last := m.seq
	m.mu.Unlock()
	return last, nil
}

// numberLocked numbers one event of this node's, logs it and counts it in
// the holdings that snapshots serve.
func (m *Membership) numberLocked(kind EventKind, k Entry) Event {
	m.seq++
	e := Event{Origin: m.cfg.Name, Incarnation: m.cfg.Incarnation, Seq: m.seq, Kind: kind, Hash: k.Hash, BlockSet: k.BlockSet}
	m.ownLog[(e.Seq-1)%uint64(len(m.ownLog))] = e
	switch {
	case kind == EventStore:
		m.own[k]++
	case m.own[k] > 1:
		m.own[k]--
	default:
		delete(m.own, k)
	}
	return e
}

// publishLocked queues numbered events for gossip and applies them.
func (m *Membership) publishLocked(events []Event) {
	if len(events) == 0 {
		return
	}
	m.unflushed = append(m.unflushed, events...)
	if m.cfg.Sink != nil {
		m.cfg.Sink.Apply(events)
	}
	m.metrics.published.Add(uint64(len(events)))
}

// Reconcile makes this node's published holdings equal holdings, the
// authoritative list of what it holds (the pool's registry): it publishes a
// store for each entry the cluster has not been told of and a remove for
// each it was told of that is no longer held, and returns the number of the
// last event. A node calls it when events of its own were lost before they
// were published. Each entry of holdings counts once however often it is
// listed.
func (m *Membership) Reconcile(holdings []Entry) (uint64, error) {
	if m.closed.Load() {
		return 0, ErrClosed
	}
	want := make(map[Entry]struct{}, len(holdings))
	for _, k := range holdings {
		want[k] = struct{}{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var events []Event
	for k, n := range m.own {
		drop := n - 1 // extra copies: the registry holds one per entry
		if _, ok := want[k]; !ok {
			drop = n
		}
		for range drop {
			events = append(events, Event{Kind: EventRemove, Hash: k.Hash, BlockSet: k.BlockSet})
		}
	}
	for k := range want {
		if m.own[k] == 0 {
			events = append(events, Event{Kind: EventStore, Hash: k.Hash, BlockSet: k.BlockSet})
		}
	}
	for i, e := range events {
		events[i] = m.numberLocked(e.Kind, Entry{Hash: e.Hash, BlockSet: e.BlockSet})
	}
	m.publishLocked(events)
	m.metrics.reconciled.Add(uint64(len(events)))
	return m.seq, nil
}

// EventRange returns this node's events from..to (inclusive) of incarnation
// inc, clamped to the last published; it serves a peer's range repair. It
// fails with ErrRangeGone when the events have left the log or inc is not
// this run's.
func (m *Membership) EventRange(inc, from, to uint64) ([]Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if inc != m.cfg.Incarnation {
		return nil, fmt.Errorf("%w: incarnation %d, this node runs %d", ErrRangeGone, inc, m.cfg.Incarnation)
	}
	if from == 0 || from > to {
		return nil, fmt.Errorf("membership: event range %d..%d is empty or starts at 0", from, to)
	}
	to = min(to, m.seq)
	oldest := uint64(1)
	if m.seq > uint64(len(m.ownLog)) {
		oldest = m.seq - uint64(len(m.ownLog)) + 1
	}
	if from < oldest {
		return nil, fmt.Errorf("%w: asked from %d, oldest kept is %d", ErrRangeGone, from, oldest)
	}
	if from > to {
		return nil, nil
	}
	out := make([]Event, 0, to-from+1)
	for s := from; s <= to; s++ {
		out = append(out, m.ownLog[(s-1)%uint64(len(m.ownLog))])
	}
	return out, nil
}

// Snapshot returns this node's current holdings; it serves a peer's repair
// when a range is gone.
func (m *Membership) Snapshot() HoldingsSnapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := HoldingsSnapshot{Origin: m.cfg.Name, Incarnation: m.cfg.Incarnation, Seq: m.seq, Entries: make([]Entry, 0, len(m.own))}
	for k, n := range m.own {
		for range n {
			s.Entries = append(s.Entries, k)
		}
	}
	return s
}

// flush batches the unflushed events and queues them for gossip.
func (m *Membership) flush() {
	m.mu.Lock()
	events := m.unflushed
	m.unflushed = nil
	m.mu.Unlock()
	if len(events) == 0 {
		return
	}
	header := batchHeaderLen(m.cfg.Name)
	per := max(1, (m.cfg.MaxBatchBytes-header)/eventMax)
	for len(events) > 0 {
		n := min(per, len(events))
		b, err := AppendBatch(nil, events[:n])
		if err != nil { // our own events: a bug, not bad input
			m.log.Error("membership: encoding own batch", "err", err)
			return
		}
		if drop := m.dropBatch.Load(); drop == nil || !(*drop)(events[0].Seq) {
			m.queue.QueueBroadcast(batchBroadcast(b))
			m.metrics.batchesSent.Add(1)
		}
		events = events[n:]
	}
	if m.queue.NumQueued() > m.cfg.MaxQueuedBatches {
		m.queue.Prune(m.cfg.MaxQueuedBatches)
	}
}

// receiveBatch handles a batch gossiped by a peer.
func (m *Membership) receiveBatch(raw []byte) {
	events, err := DecodeBatch(raw)
	if err != nil {
		m.metrics.badMessages.Add(1)
		m.log.Debug("membership: dropping bad batch", "err", err)
		return
	}
	m.metrics.batchesReceived.Add(1)
	if m.apply(events, true) {
		// Relay what was news to us, once: memberlist does not forward user
		// broadcasts, and an origin's own retransmits reach only a few nodes.
		m.queue.QueueBroadcast(batchBroadcast(append([]byte(nil), raw...)))
		m.metrics.batchesRelayed.Add(1)
	}
}

// apply applies consecutive events of one origin, buffering those past a
// gap, and reports whether any of them was news here (neither applied nor
// already waiting), which is what a receiver relays.
func (m *Membership) apply(events []Event, fromGossip bool) (news bool) {
	origin := events[0].Origin
	if origin == m.cfg.Name {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.alive[origin] {
		return false // not (or no longer) a member; push/pull catches up later
	}
	st := m.originLocked(origin, events[0].Incarnation)
	if st == nil {
		return false
	}
	last := events[len(events)-1].Seq
	st.known = max(st.known, last)
	// events are consecutive (DecodeBatch and repairRange check it): skip
	// what was applied, then either they continue the stream or they wait
	// behind a gap.
	var ready []Event
	if last > st.applied {
		rest := events
		if first := events[0].Seq; st.applied >= first {
			rest = events[st.applied-first+1:]
		}
		if rest[0].Seq == st.applied+1 {
			ready = rest
			st.applied = last
			news = true
		} else {
			for _, e := range rest {
				if _, held := st.pending[e.Seq]; held {
					continue
				}
				if len(st.pending) >= m.cfg.MaxPending {
					break // dropped; repair fetches them
				}
				if st.pending == nil {
					st.pending = make(map[uint64]Event)
				}
				st.pending[e.Seq] = e
				news = true
			}
		}
	}
	ready = m.drainLocked(st, ready)
	m.applyLocked(ready)
	m.noteGapLocked(st)
	// Relay what was news here, whatever order batches arrive in:
	// memberlist sends equal batches newest first, so an older batch often
	// comes after a newer one has raised known.
	return news && fromGossip
}

// originLocked returns the state of origin, replacing it when inc is a new
// incarnation; nil if inc is older than the one known, or not the run
// memberlist accepted for the name (see runAccepted).
func (m *Membership) originLocked(origin string, inc uint64) *originState {
	if !m.runAccepted(origin, inc) {
		return nil
	}
	st := m.origins[origin]
	switch {
	case st == nil:
		st = &originState{inc: inc}
		m.origins[origin] = st
	case inc < st.inc:
		return nil
	case inc > st.inc:
		// A restart: the old run's blocks are gone with its memory.
		if m.cfg.Sink != nil {
			m.cfg.Sink.Drop(origin)
		}
		*st = originState{inc: inc}
		m.metrics.restarts.Add(1)
	}
	return st
}

func (m *Membership) drainLocked(st *originState, ready []Event) []Event {
	for {
		e, ok := st.pending[st.applied+1]
		if !ok {
			break
		}
		delete(st.pending, e.Seq)
		ready = append(ready, e)
		st.applied = e.Seq
	}
	for s := range st.pending {
		if s <= st.applied {
			delete(st.pending, s)
		}
	}
	return ready
}

func (m *Membership) applyLocked(events []Event) {
	if len(events) == 0 {
		return
	}
	if m.cfg.Sink != nil {
		m.cfg.Sink.Apply(events)
	}
	m.metrics.applied.Add(uint64(len(events)))
}

func (m *Membership) noteGapLocked(st *originState) {
	if st.known < st.applied {
		st.known = st.applied
	}
	if st.applied == st.known {
		st.gapSince = time.Time{}
	} else if st.gapSince.IsZero() {
		st.gapSince = time.Now()
	}
}

// mergeMarks takes push/pull state: the latest number of each origin a peer
// knows. A number past ours opens a gap that the repair loop closes.
func (m *Membership) mergeMarks(marks []originMark) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.merged.Store(true)
	for _, mk := range marks {
		if mk.Origin == m.cfg.Name || !m.alive[mk.Origin] {
			continue
		}
		st := m.originLocked(mk.Origin, mk.Incarnation)
		if st == nil || st.inc != mk.Incarnation {
			continue
		}
		if mk.Seq > st.known {
			st.known = mk.Seq
		}
		m.noteGapLocked(st)
	}
}

func (m *Membership) localMarks() []originMark {
	m.mu.Lock()
	defer m.mu.Unlock()
	marks := make([]originMark, 0, 1+len(m.origins))
	marks = append(marks, originMark{m.cfg.Name, m.cfg.Incarnation, m.seq})
	for name, st := range m.origins {
		if st.applied > 0 {
			marks = append(marks, originMark{name, st.inc, st.applied})
		}
	}
	return marks
}

// clampKnown lowers the highest known number of j's origin to last, unless
// news arrived since the repair started.
func (m *Membership) clampKnown(j repairJob, last uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.origins[j.origin]; st != nil && st.inc == j.inc && st.known == j.to {
		st.known = max(last, st.applied)
		m.noteGapLocked(st)
	}
}

type repairJob struct {
	origin   string
	inc      uint64
	from, to uint64
}

// repairGaps repairs every gap older than RepairDelay, one origin at a time.
func (m *Membership) repairGaps(ctx context.Context) {
	if m.cfg.Repairer == nil {
		return
	}
	now := time.Now()
	var jobs []repairJob
	m.mu.Lock()
	for name, st := range m.origins {
		if !st.gapSince.IsZero() && !st.repairing && now.Sub(st.gapSince) >= m.cfg.RepairDelay {
			st.repairing = true
			jobs = append(jobs, repairJob{name, st.inc, st.applied + 1, st.known})
		}
	}
	m.mu.Unlock()
	for _, j := range jobs {
		if ctx.Err() != nil {
			return
		}
		m.repair(ctx, j)
	}
}

func (m *Membership) repair(ctx context.Context, j repairJob) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RepairTimeout)
	defer cancel()
	// Only a range the origin no longer keeps, or will not serve for its
	// size, calls for its whole holdings; a timeout or an unreachable
	// origin is tried again later.
	err := m.repairRange(ctx, j)
	if errors.Is(err, ErrRangeGone) || errors.Is(err, ErrRangeTooLarge) {
		err = m.repairSnapshot(ctx, j, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if st := m.origins[j.origin]; st != nil {
		st.repairing = false
		if err != nil && !st.gapSince.IsZero() {
			st.gapSince = time.Now() // wait RepairDelay before trying again
		}
	}
	if err != nil {
		m.metrics.repairFailures.Add(1)
		m.log.Warn("membership: repair failed", "peer", j.origin, "from", j.from, "to", j.to, "err", err)
	}
}

// repairRange fetches j's range page by page, as the Repairer's answers
// allow, applying each page as it comes: a repair cut short keeps what it
// applied, and the next one starts after it.
func (m *Membership) repairRange(ctx context.Context, j repairJob) error {
	from := j.from
	for from <= j.to {
		events, err := m.cfg.Repairer.Events(ctx, j.origin, j.inc, from, j.to)
		if err != nil {
			return err
		}
		if len(events) == 0 {
			break // the origin has published no more (clamped below)
		}
		if uint64(len(events)) > j.to-from+1 {
			return fmt.Errorf("%w: repair answered %d events for %d..%d", ErrMalformed, len(events), from, j.to)
		}
		for i, e := range events {
			if e.Origin != j.origin || e.Incarnation != j.inc || e.Seq != from+uint64(i) || !e.Kind.valid() {
				return fmt.Errorf("%w: repair event %d is %s/%d #%d kind %d, want %s/%d #%d",
					ErrMalformed, i, e.Origin, e.Incarnation, e.Seq, e.Kind, j.origin, j.inc, from+uint64(i))
			}
		}
		m.metrics.rangeRepairs.Add(1) // before the sink sees the events, as for snapshots
		m.apply(events, false)
		from = events[len(events)-1].Seq + 1
	}
	if last := from - 1; last < j.to {
		// The origin has published less than we were told (by a peer's
		// push/pull state): it is the authority on its own numbers.
		m.clampKnown(j, last)
	}
	return nil
}

func (m *Membership) repairSnapshot(ctx context.Context, j repairJob, cause error) error {
	snap, err := m.cfg.Repairer.Snapshot(ctx, j.origin)
	if err != nil {
		return fmt.Errorf("range: %v; snapshot: %w", cause, err)
	}
	if snap.Origin != j.origin {
		return fmt.Errorf("%w: snapshot of %q, asked for %q", ErrMalformed, snap.Origin, j.origin)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.alive[j.origin] {
		return nil
	}
	st := m.originLocked(j.origin, snap.Incarnation)
	if st == nil || snap.Seq < st.applied {
		return nil // stale: we already know more
	}
	// The snapshot may be a few seconds old (the origin shares a young
	// one among the nodes that ask together), so its Seq does not say the
	// origin published no more: known stays, and the range repair that
	// follows fetches the rest or learns the origin's last number.

	// Counted before the sink sees it, so that whoever watches the sink
	// for the snapshot's blocks also finds the repair counted.
	m.metrics.snapshotRepairs.Add(1)
	if m.cfg.Sink != nil {
		m.cfg.Sink.Drop(j.origin)
	}
	events := make([]Event, len(snap.Entries))
	for i, e := range snap.Entries {
		events[i] = Event{Origin: snap.Origin, Incarnation: snap.Incarnation, Seq: snap.Seq, Kind: EventStore, Hash: e.Hash, BlockSet: e.BlockSet}
	}
	m.applyLocked(events)
	st.applied = snap.Seq
	m.applyLocked(m.drainLocked(st, nil))
	m.noteGapLocked(st)
	return nil
}
