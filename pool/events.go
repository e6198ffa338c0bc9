package pool

import "sync"

// EventKind says whether a block became visible or went away.
type EventKind uint8

const (
	// EventStore: a block was Registered (a new hash, not a duplicate).
	EventStore EventKind = iota + 1
	// EventRemove: a Registered block was recycled.
	EventRemove
)

func (k EventKind) String() string {
	switch k {
	case EventStore:
		return "store"
	case EventRemove:
		return "remove"
	}
	return "event_kind(?)"
}

// Event is one store or remove.
type Event struct {
	// Seq numbers the pool's events from 1 without gaps; an event dropped
	// for a full buffer still took its number, so a gap in what the sink
	// sees is a loss.
	Seq  uint64
	Kind EventKind
	// Set is the block set of the block.
	Set SetID
	// Slot is the block's slot in the set.
	Slot int
	// Hash is the block's sequence hash.
	Hash uint64
	// Parent is the sequence hash of the block before it, as given to
	// Register (0 for the first block of a sequence).
	Parent uint64
}

// EventBatch is what the sink receives.
type EventBatch struct {
	// Events are in Seq order.
	Events []Event
	// Dropped counts events lost since the previous batch; the gaps in Seq
	// say which. When it is not zero the sink should resynchronise from
	// Pool.Snapshot, and skip the events of this batch and later ones that
	// the snapshot covers (Seq up to Snapshot.Seq).
	Dropped uint64
}

// eventQueue is a bounded queue between the pool's operations, which must
// never wait for the sink, and the pool's goroutine, which calls it.
//
// One operation's events (a block set freed, the evictions of one
// allocation) are admitted whole while the queue is not full, even past its
// size: a mass free is one batch for the sink, not a loss that makes it
// resynchronise. So the queue holds at most size events plus one
// operation's, which is bounded by the largest block set's slots.
type eventQueue struct {
	mu      sync.Mutex
	enabled bool
	size    int
	// buf[head:] is queued; the consumed head is cut off when it is half
	// the slice, so the backing array stays within twice what is queued.
	buf          []Event
	head         int
	seq          uint64
	dropped      uint64 // since the last batch
	droppedTotal uint64
	wake         chan struct{}
}

func (q *eventQueue) init(enabled bool, size int) {
	q.enabled = enabled
	q.size = size
	if enabled {
		q.buf = make([]Event, 0, size)
	}
	q.wake = make(chan struct{}, 1)
}

// push queues one event. It is called with the block set's lock held,
// which is what orders a block's store before its remove.
func (q *eventQueue) push(e Event) {
	q.pushBatch([]Event{e})
}

// pushBatch queues one operation's events, numbering them in order: all of
// them if the queue is not full, else none (each counted as dropped). The
// block set's lock is held.
func (q *eventQueue) pushBatch(evs []Event) {
	if len(evs) == 0 {
		return
	}
	q.mu.Lock()
	for i := range evs {
		q.seq++
		evs[i].Seq = q.seq
	}
	if !q.enabled {
		q.mu.Unlock()
		return
	}
	if len(q.buf)-q.head >= q.size {
		q.dropped += uint64(len(evs))
		q.droppedTotal += uint64(len(evs))
		q.mu.Unlock()
		return
	}
	q.buf = append(q.buf, evs...)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take removes up to limit events; ok is false when there is nothing to
// say.
func (q *eventQueue) take(limit int) (b EventBatch, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.buf) - q.head
	if n == 0 && q.dropped == 0 {
		return EventBatch{}, false
	}
	k := min(n, limit)
	b.Events = make([]Event, k)
	copy(b.Events, q.buf[q.head:q.head+k])
	q.head += k
	switch {
	case q.head == len(q.buf):
		// Empty: back to a buffer of the configured size, letting go of
		// what a large batch grew.
		if cap(q.buf) > q.size {
			q.buf = make([]Event, 0, q.size)
		} else {
			q.buf = q.buf[:0]
		}
		q.head = 0
	case q.head >= len(q.buf)/2:
		q.buf = append(q.buf[:0:0], q.buf[q.head:]...)
		q.head = 0
	}
	b.Dropped = q.dropped
	q.dropped = 0
	return b, true
}

func (q *eventQueue) lastSeq() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.seq
}

func (q *eventQueue) droppedCount() uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.droppedTotal
}
