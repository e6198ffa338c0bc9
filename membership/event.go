package membership

import (
	"encoding/binary"
	"fmt"
)

// EventKind says whether an event adds or removes a holder.
type EventKind uint8

// Event kinds.
const (
	EventStore  EventKind = 1
	EventRemove EventKind = 2
)

func (k EventKind) String() string {
	switch k {
	case EventStore:
		return "store"
	case EventRemove:
		return "remove"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

func (k EventKind) valid() bool { return k == EventStore || k == EventRemove }

// Event is one change to an origin node's holdings: a block with the given
// sequence hash was registered in (store) or evicted from (remove) one of the
// origin's block sets. Events are numbered per origin and incarnation from 1
// without gaps, and every node applies them in that order.
type Event struct {
	// Origin is the name of the node whose holdings changed.
	Origin string
	// Incarnation identifies the origin's run; it changes on restart.
	Incarnation uint64
	// Seq is the event's number within the origin's incarnation, from 1.
	Seq uint64
	// Kind is store or remove.
	Kind EventKind
	// Hash is the block's sequence hash.
	Hash uint64
	// BlockSet is the origin's id of the block set holding the block.
	BlockSet uint32
}

// Entry is one block an origin holds, as listed in a snapshot.
type Entry struct {
	Hash     uint64
	BlockSet uint32
}

// HoldingsSnapshot is an origin's whole holdings as of event Seq, used to repair a
// node that missed events the origin no longer keeps.
type HoldingsSnapshot struct {
	Origin      string
	Incarnation uint64
	// Seq is the number of the last event the snapshot includes.
	Seq     uint64
	Entries []Entry
}

// MaxBatchEvents bounds the events of one decoded batch; a gossip packet
// holds far fewer, a repair response may hold more.
const MaxBatchEvents = 1 << 20

// A batch carries consecutive events of one origin and incarnation:
//
//	+---------+------+-------------+-------------+-----------+---------+
//	| version | type |   origin    | incarnation | first seq |  count  |
//	|   u8=1  | u8=1 | uvarint+str |   uvarint   |  uvarint  | uvarint |
//	+---------+------+-------------+-------------+-----------+---------+
//	then count times:
//	+------+-------------+-----------+
//	| kind |    hash     | block set |
//	|  u8  |   u64 LE    |  uvarint  |
//	+------+-------------+-----------+
//
// Event i has number first seq + i.

// batchHeaderMax is the most bytes a batch header takes.
const batchHeaderMax = 2 + binary.MaxVarintLen64 + MaxNameLen + 3*binary.MaxVarintLen64

// batchHeaderLen is the most bytes the header of a batch of origin's takes.
func batchHeaderLen(origin string) int {
	return batchHeaderMax - MaxNameLen + len(origin)
}

// eventMax is the most bytes one event takes in a batch.
const eventMax = 1 + 8 + binary.MaxVarintLen32

// MaxBatchLen is the most bytes that AppendBatch takes for n events of
// origin, so that a caller can size batches to a limit before encoding.
func MaxBatchLen(origin string, n int) int {
	return batchHeaderLen(origin) + n*eventMax
}

// AppendBatch appends the encoding of events, which must be consecutive
// events of one origin and incarnation, to dst.
func AppendBatch(dst []byte, events []Event) ([]byte, error) {
	if len(events) == 0 {
		return dst, fmt.Errorf("membership: empty batch")
	}
	first := events[0]
	if len(first.Origin) == 0 || len(first.Origin) > MaxNameLen {
		return dst, fmt.Errorf("membership: batch origin %q: length must be 1..%d", first.Origin, MaxNameLen)
	}
	dst = append(dst, wireVersion, msgBatch)
	dst = appendStr(dst, first.Origin)
	dst = binary.AppendUvarint(dst, first.Incarnation)
	dst = binary.AppendUvarint(dst, first.Seq)
	dst = binary.AppendUvarint(dst, uint64(len(events)))
	for i, e := range events {
		if e.Origin != first.Origin || e.Incarnation != first.Incarnation || e.Seq != first.Seq+uint64(i) {
			return dst, fmt.Errorf("membership: batch event %d (%s/%d #%d) does not follow %s/%d #%d",
				i, e.Origin, e.Incarnation, e.Seq, first.Origin, first.Incarnation, first.Seq+uint64(i))
		}
		if !e.Kind.valid() {
			return dst, fmt.Errorf("membership: batch event %d: invalid kind %d", i, e.Kind)
		}
		dst = append(dst, byte(e.Kind))
		dst = binary.LittleEndian.AppendUint64(dst, e.Hash)
		dst = binary.AppendUvarint(dst, uint64(e.BlockSet))
	}
	return dst, nil
}

// DecodeBatch decodes and validates a batch received from a peer.
func DecodeBatch(b []byte) ([]Event, error) {
	r := reader{b: b}
	r.header(msgBatch, "batch")
	origin := r.str("batch origin")
	inc := r.uvarint("batch incarnation")
	first := r.uvarint("batch first seq")
	n := r.uvarint("batch count")
	if r.err != nil {
		return nil, r.err
	}
	switch {
	case origin == "":
		return nil, malformed("batch: empty origin")
	case first == 0:
		return nil, malformed("batch: first seq is 0; events are numbered from 1")
	case n == 0:
		return nil, malformed("batch: no events")
	case n > MaxBatchEvents:
		return nil, malformed("batch: %d events, limit %d", n, MaxBatchEvents)
	case n > uint64(len(r.b))/10: // every event takes at least 10 bytes
		return nil, malformed("batch: %d events cannot fit in %d bytes", n, len(r.b))
	case first+n-1 < first:
		return nil, malformed("batch: seq %d + %d events overflows", first, n)
	}
	events := make([]Event, n)
	for i := range events {
		k := EventKind(r.byte("batch event kind"))
		h := r.u64le("batch event hash")
		bs := r.u32("batch event block set")
		if r.err != nil {
			return nil, r.err
		}
		if !k.valid() {
			return nil, malformed("batch: event %d: invalid kind %d", i, k)
		}
		events[i] = Event{Origin: origin, Incarnation: inc, Seq: first + uint64(i), Kind: k, Hash: h, BlockSet: bs}
	}
	r.end("batch")
	if r.err != nil {
		return nil, r.err
	}
	return events, nil
}

// originMark is one origin's position in push/pull state.
type originMark struct {
	Origin      string
	Incarnation uint64
	Seq         uint64
}

// MaxStateOrigins bounds the origins in one push/pull state message.
const MaxStateOrigins = 1 << 16

// Push/pull state lists, for each origin the sender knows, the latest event
// number it has (its own last published number for itself):
//
//	+---------+------+---------+---------------------------------------+
//	| version | type |  count  | count × (origin, incarnation, seq)    |
//	|   u8=1  | u8=2 | uvarint | uvarint+str, uvarint, uvarint         |
//	+---------+------+---------+---------------------------------------+

func appendState(dst []byte, marks []originMark) []byte {
	dst = append(dst, wireVersion, msgState)
	dst = binary.AppendUvarint(dst, uint64(len(marks)))
	for _, m := range marks {
		dst = appendStr(dst, m.Origin)
		dst = binary.AppendUvarint(dst, m.Incarnation)
		dst = binary.AppendUvarint(dst, m.Seq)
	}
	return dst
}

func decodeState(b []byte) ([]originMark, error) {
	r := reader{b: b}
	r.header(msgState, "state")
	n := r.uvarint("state count")
	if r.err != nil {
		return nil, r.err
	}
	if n > MaxStateOrigins || n > uint64(len(r.b))/4 { // ≥ 4 bytes per origin
		return nil, malformed("state: %d origins in %d bytes", n, len(r.b))
	}
	marks := make([]originMark, n)
	for i := range marks {
		marks[i] = originMark{r.str("state origin"), r.uvarint("state incarnation"), r.uvarint("state seq")}
		if r.err == nil && marks[i].Origin == "" {
			r.fail("state: origin %d has an empty name", i)
		}
	}
	r.end("state")
	if r.err != nil {
		return nil, r.err
	}
	return marks, nil
}
