package fabric

import (
	"io"
	"log/slog"
	"testing"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
)

// The sink queues a mark for each block another node stores that this
// node holds, and one for each this node is left the only holder of; up
// to demoteQueue batches wait for the pool, and past that the marks are
// dropped and counted, never waited for.
func TestDemoteQueueLimit(t *testing.T) {
	ix, err := index.New(index.Config{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{index: ix, cfg: Config{NodeName: "self"}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), done: make(chan struct{})}
	s := newIndexSink(a)
	mine := make([]uint64, demoteQueue+2)
	for i := range mine {
		mine[i] = uint64(i + 1)
	}
	s.Apply(sinkEvents("self", 1, membership.EventStore, mine...))
	if len(s.demote) != 0 {
		t.Fatalf("%d marks queued for blocks only this node holds", len(s.demote))
	}
	// A block this node does not hold is no business of its pool.
	s.Apply(sinkEvents("peer", 1, membership.EventStore, 1<<40))
	if len(s.demote) != 0 {
		t.Fatalf("%d marks queued for a block this node does not hold", len(s.demote))
	}
	for _, h := range mine[:demoteQueue] {
		s.Apply(sinkEvents("peer", 1, membership.EventStore, h))
	}
	if len(s.demote) != demoteQueue || a.stats.demotionsDropped.Load() != 0 {
		t.Fatalf("at the limit: %d queued, %d dropped; want %d, 0", len(s.demote), a.stats.demotionsDropped.Load(), demoteQueue)
	}
	if r := <-s.demote; !r.shared || len(r.hashes) != 1 || r.hashes[0] != 1 {
		t.Fatalf("first mark %+v, want block 1 shared", r)
	}
	// Room for one: the peer's remove of block 1 leaves this node alone
	// with it, and one more store is past the limit.
	s.Apply(sinkEvents("peer", 1, membership.EventRemove, 1))
	s.Apply(sinkEvents("peer", 1, membership.EventStore, mine[demoteQueue]))
	if len(s.demote) != demoteQueue || a.stats.demotionsDropped.Load() != 1 {
		t.Fatalf("past the limit: %d queued, %d dropped; want %d, 1", len(s.demote), a.stats.demotionsDropped.Load(), demoteQueue)
	}
	var last demotion
	for len(s.demote) > 0 {
		last = <-s.demote
	}
	if last.shared || len(last.hashes) != 1 || last.hashes[0] != 1 {
		t.Fatalf("last mark %+v, want block 1 no longer shared", last)
	}
}
