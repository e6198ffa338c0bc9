package pool

import (
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

type recorder struct {
	mu      sync.Mutex
	batches []EventBatch
}

func (r *recorder) sink(b EventBatch) {
	r.mu.Lock()
	r.batches = append(r.batches, b)
	r.mu.Unlock()
}

func (r *recorder) events() (evs []Event, dropped uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.batches {
		evs = append(evs, b.Events...)
		dropped += b.Dropped
	}
	return evs, dropped
}

func TestEventsInOrderAndBatched(t *testing.T) {
	var rec recorder
	cfg := testConfig(nil, rec.sink)
	cfg.MaxEventBatch = 4
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(16, 1, layout.FullyContiguous, 64))
	var want []Event
	for h := range uint64(10) {
		blk := toState(t, b, Registered, 1000+h)
		want = append(want, Event{Kind: EventStore, Set: b.ID(), Slot: blk.Slot, Hash: 1000 + h})
		b.Release(blk)
	}
	for h := range uint64(5) {
		info, _ := b.Slot(want[h].Slot)
		want = append(want, Event{Kind: EventRemove, Set: b.ID(), Slot: want[h].Slot, Hash: info.Hash})
	}
	if n := b.Evict(5); n != 5 {
		t.Fatalf("evicted %d", n)
	}
	p.Close() // flushes
	got, dropped := rec.events()
	if dropped != 0 || len(got) != len(want) {
		t.Fatalf("got %d events (%d dropped), want %d", len(got), dropped, len(want))
	}
	for i := range want {
		want[i].Seq = uint64(i + 1)
		if got[i] != want[i] {
			t.Errorf("event %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	for _, batch := range rec.batches {
		if len(batch.Events) > 4 || len(batch.Events) == 0 {
			t.Errorf("batch of %d events, want 1..4", len(batch.Events))
		}
	}
}

// A sink that stops answering must not stall the pool: events beyond the
// buffer are dropped and counted, and a snapshot resynchronises.
func TestEventsSlowSinkDropsAndResyncs(t *testing.T) {
	var rec recorder
	gate := make(chan struct{})
	var once sync.Once
	sink := func(b EventBatch) {
		<-gate
		rec.sink(b)
	}
	cfg := testConfig(nil, sink)
	cfg.EventBuffer = 8
	cfg.MaxEventBatch = 8
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(64, 1, layout.FullyContiguous, 64))
	defer once.Do(func() { close(gate) })

	done := make(chan struct{})
	go func() {
		defer close(done)
		for h := range uint64(40) {
			blks, err := b.Allocate(1)
			if err != nil {
				t.Error(err)
				return
			}
			b.Commit(blks[0])
			blk, err := b.Register(blks[0], h, 0)
			if err != nil {
				t.Error(err)
				return
			}
			b.Release(blk)
		}
		b.Evict(10)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("pool operations stalled behind a blocked sink")
	}
	snap := p.Snapshot()
	if m := p.Metrics(); m.EventsDropped == 0 {
		t.Fatal("no events dropped with a blocked sink and a buffer of 8")
	}
	once.Do(func() { close(gate) })
	p.Close()
	got, dropped := rec.events()
	if uint64(len(got))+dropped != 50 {
		t.Fatalf("%d delivered + %d dropped, want 50 issued", len(got), dropped)
	}
	if dropped != p.Metrics().EventsDropped {
		t.Errorf("batches report %d dropped, metrics %d", dropped, p.Metrics().EventsDropped)
	}
	// Seq numbers increase; the gaps add up to the drops.
	var gaps uint64
	prev := uint64(0)
	for _, e := range got {
		if e.Seq <= prev {
			t.Fatalf("seq %d after %d", e.Seq, prev)
		}
		gaps += e.Seq - prev - 1
		prev = e.Seq
	}
	gaps += 50 - prev
	if gaps != dropped {
		t.Errorf("seq gaps %d, dropped %d", gaps, dropped)
	}
	// The snapshot was taken after everything: it is the registry.
	if snap.Seq != 50 || len(snap.Blocks) != 30 {
		t.Fatalf("snapshot at seq %d with %d blocks, want 50 and 30", snap.Seq, len(snap.Blocks))
	}
	for _, e := range snap.Blocks {
		blk, ok := b.Lookup(e.Hash)
		if !ok || blk.Slot != e.Slot || e.Set != b.ID() {
			t.Errorf("snapshot entry %+v not in the registry", e)
		}
	}
}

// Snapshot plus the events after its Seq rebuild the registry exactly.
func TestSnapshotPlusEvents(t *testing.T) {
	var rec recorder
	cfg := testConfig(nil, rec.sink)
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(16, 1, layout.FullyContiguous, 64))
	for h := range uint64(6) {
		b.Release(toState(t, b, Registered, h))
	}
	snap := p.Snapshot()
	b.Evict(3)
	for h := range uint64(4) {
		b.Release(toState(t, b, Registered, 100+h))
	}
	p.Close()
	index := map[uint64]int{}
	for _, e := range snap.Blocks {
		index[e.Hash] = e.Slot
	}
	evs, _ := rec.events()
	for _, e := range evs {
		if e.Seq <= snap.Seq {
			continue
		}
		switch e.Kind {
		case EventStore:
			index[e.Hash] = e.Slot
		case EventRemove:
			delete(index, e.Hash)
		}
	}
	if m := b.Metrics(); len(index) != m.Registered || m.Registered != 7 {
		t.Fatalf("rebuilt %d entries, registry has %d (want 7)", len(index), m.Registered)
	}
	for h, slot := range index {
		if blk, ok := b.Lookup(h); !ok || blk.Slot != slot {
			t.Errorf("hash %d at slot %d not in the registry", h, slot)
		}
	}
}
