package fabric

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/membership"
)

// fullIndexSink returns a sink over an index with MaxNodes live names,
// n0..n4095, of which the sink has dropped n0..n(dropped-1): every slot is
// live or waiting for a sweep. Its sweeper does not run until started.
func fullIndexSink(t *testing.T, dropped int) (*indexSink, *index.Index, func()) {
	t.Helper()
	ix, err := index.New(index.Config{Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	for i := range index.MaxNodes {
		if _, err := ix.ID(fmt.Sprintf("n%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	a := &Agent{index: ix, log: slog.New(slog.NewTextHandler(io.Discard, nil)), done: make(chan struct{})}
	s := newIndexSink(a)
	for i := range dropped {
		s.Drop(fmt.Sprintf("n%d", i))
	}
	start := func() {
		a.wg.Add(1)
		go s.sweepLoop()
		t.Cleanup(func() {
			close(a.done)
			a.wg.Wait()
		})
	}
	return s, ix, start
}

func sinkEvents(origin string, inc uint64, kind membership.EventKind, hashes ...uint64) []membership.Event {
	out := make([]membership.Event, len(hashes))
	for i, h := range hashes {
		out[i] = membership.Event{Origin: origin, Incarnation: inc, Kind: kind, Hash: h}
	}
	return out
}

// With every slot live or waiting for a sweep, the events of a new node
// are held, in order, not lost: once the sweeper frees a slot the node is
// named and its events applied, and later events go straight to the index.
// Events held for a node that is dropped meanwhile go with it.
func TestSinkHoldsEventsUntilASlotFrees(t *testing.T) {
	s, ix, start := fullIndexSink(t, 2)
	s.Apply(sinkEvents("new", 3, membership.EventStore, 1, 2, 3))
	s.Apply(sinkEvents("new", 3, membership.EventRemove, 1))
	s.Apply(sinkEvents("new", 3, membership.EventStore, 4))
	s.Apply(sinkEvents("gone", 1, membership.EventStore, 9))
	if _, ok := ix.Lookup("new"); ok {
		t.Fatal("a node was named with every slot live or unswept: Node swept")
	}
	if n := s.heldEvents(); n != 6 {
		t.Fatalf("%d events held, want 6", n)
	}
	s.Drop("gone")
	if n := s.heldEvents(); n != 5 {
		t.Fatalf("%d events held after dropping an origin with 1, want 5", n)
	}
	start()
	var id index.NodeID
	wait.For(t, 10*time.Second, "the held events applied", func() error {
		var ok bool
		if id, ok = ix.Lookup("new"); !ok {
			return fmt.Errorf("not named; %d pending, %d held", ix.Pending(), s.heldEvents())
		}
		if n := s.heldEvents(); n != 0 {
			return fmt.Errorf("%d events still held", n)
		}
		return nil
	})
	if inc, _ := ix.Incarnation(id); inc != 3 {
		t.Fatalf("named with run %d, want 3", inc)
	}
	for h, want := range map[uint64]bool{1: false, 2: true, 3: true, 4: true, 9: false} {
		if got := slices.Contains(ix.Holders(h), id); got != want {
			t.Errorf("hash %d held: %v, want %v (events applied out of order or lost)", h, got, want)
		}
	}
	if _, ok := ix.Lookup("gone"); ok {
		t.Error("a dropped origin's held events named it")
	}
	s.Apply(sinkEvents("new", 3, membership.EventStore, 5))
	if !slices.Contains(ix.Holders(5), id) || s.heldEvents() != 0 {
		t.Errorf("a later event was not applied at once: holders %v, %d held", ix.Holders(5), s.heldEvents())
	}
}

// At maxHeldEvents the sink holds them all and resynchronises nobody; one
// past, the origin that overflows loses what was held for it, nothing more
// is held, and that origin (only it) is resynchronised by the sweeper.
func TestSinkHeldEventsLimit(t *testing.T) {
	s, ix, start := fullIndexSink(t, 1)
	var mu sync.Mutex
	var resynced []string
	s.resync = func(origin string) bool {
		mu.Lock()
		resynced = append(resynced, origin)
		mu.Unlock()
		return true
	}
	hashes := make([]uint64, maxHeldEvents)
	for i := range hashes {
		hashes[i] = uint64(i) + 1
	}
	s.Apply(sinkEvents("big", 1, membership.EventStore, hashes...))
	if n := s.heldEvents(); n != maxHeldEvents {
		t.Fatalf("at the limit: %d held, want %d", n, maxHeldEvents)
	}
	s.Apply(sinkEvents("big", 1, membership.EventStore, 0))
	if n := s.heldEvents(); n != 0 {
		t.Fatalf("one past the limit: %d held, want 0", n)
	}
	s.Apply(sinkEvents("small", 1, membership.EventStore, 7))
	start()
	wait.For(t, 10*time.Second, "the next origin named", func() error {
		if n := s.heldEvents(); n != 0 {
			return fmt.Errorf("%d held", n)
		}
		return nil
	})
	id, ok := ix.Lookup("small")
	if !ok || !slices.Contains(ix.Holders(7), id) {
		t.Fatalf("the origin after the overflow: named %v, holders of 7 %v", ok, ix.Holders(7))
	}
	if _, ok := ix.Lookup("big"); ok {
		t.Error("the overflowed origin's lost events were applied")
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(resynced, []string{"big"}) {
		t.Errorf("resynchronised %q, want only the origin that overflowed", resynced)
	}
}

// At the limit no origin is marked for resynchronising.
func TestSinkHeldEventsAtLimitNoResync(t *testing.T) {
	s, _, _ := fullIndexSink(t, 0)
	hashes := make([]uint64, maxHeldEvents)
	for i := range hashes {
		hashes[i] = uint64(i) + 1
	}
	s.Apply(sinkEvents("big", 1, membership.EventStore, hashes...))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held != maxHeldEvents || len(s.overflowed) != 0 {
		t.Fatalf("%d held, %v to resynchronise; want %d and none", s.held, s.overflowed, maxHeldEvents)
	}
}

// A call of events mixing stores and removes, of one hash and of several,
// leaves the index as the events one by one would: each run of one kind
// goes to the index in one call, in order.
func TestSinkStoresRunsInOrder(t *testing.T) {
	store, remove := membership.EventStore, membership.EventRemove
	for _, tc := range []struct {
		name   string
		events [][]any // kind, hashes...
		want   map[uint64]bool
	}{
		{"stores", [][]any{{store, 1, 2, 3}}, map[uint64]bool{1: true, 2: true, 3: true}},
		{"store then remove", [][]any{{store, 1, 2, 3}, {remove, 2}}, map[uint64]bool{1: true, 3: true}},
		{"remove then store again", [][]any{{store, 1}, {remove, 1}, {store, 1}}, map[uint64]bool{1: true}},
		{"two copies, one removed", [][]any{{store, 5, 5}, {remove, 5}, {store, 6}}, map[uint64]bool{5: true, 6: true}},
		{"remove of a hash not held", [][]any{{remove, 9}, {store, 8}}, map[uint64]bool{8: true}},
		{"one event", [][]any{{store, 4}}, map[uint64]bool{4: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := index.New(index.Config{Shards: 4})
			if err != nil {
				t.Fatal(err)
			}
			a := &Agent{index: ix, log: slog.New(slog.NewTextHandler(io.Discard, nil)), done: make(chan struct{})}
			s := newIndexSink(a)
			var events []membership.Event
			for _, run := range tc.events {
				for _, h := range run[1:] {
					events = append(events, sinkEvents("n", 1, run[0].(membership.EventKind), uint64(h.(int)))...)
				}
			}
			s.Apply(events)
			id, ok := ix.Lookup("n")
			if !ok {
				t.Fatal("node not named")
			}
			for h := uint64(1); h < 10; h++ {
				if got := slices.Contains(ix.Holders(h), id); got != tc.want[h] {
					t.Errorf("hash %d held: %v, want %v", h, got, tc.want[h])
				}
			}
		})
	}
}
