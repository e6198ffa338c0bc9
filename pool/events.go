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

// eventQueue is a bounded ring between the pool's operations, which must
// never wait for the sink, and the pool's goroutine, which calls it.
type eventQueue struct {
	mu           sync.Mutex
	enabled      bool
	buf          []Event
	head, n      int
	seq          uint64
	dropped      uint64 // since the last batch
	droppedTotal uint64
	wake         chan struct{}
}

func (q *eventQueue) init(enabled bool, size int) {
	q.enabled = enabled
	if enabled {
		q.buf = make([]Event, size)
	}
	q.wake = make(chan struct{}, 1)
}

// push is called with the block set's lock held, which is what orders a
// block's store before its remove.
func (q *eventQueue) push(e Event) {
	q.mu.Lock()
	q.seq++
	e.Seq = q.seq
	if !q.enabled {
		q.mu.Unlock()
		return
	}
	if q.n == len(q.buf) {
		q.dropped++
		q.droppedTotal++
		q.mu.Unlock()
		return
	}
	q.buf[(q.head+q.n)%len(q.buf)] = e
	q.n++
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// take removes up to max events; ok is false when there is nothing to say.
func (q *eventQueue) take(limit int) (b EventBatch, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 && q.dropped == 0 {
		return EventBatch{}, false
	}
	k := min(q.n, limit)
	b.Events = make([]Event, k)
	for i := range k {
		b.Events[i] = q.buf[(q.head+i)%len(q.buf)]
	}
	q.head = (q.head + k) % max(len(q.buf), 1)
	q.n -= k
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
