package pool

import (
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// The event buffer holds EventBuffer events while the sink is busy: at the
// limit none is lost, one past it is dropped, counted, and announced to the
// sink with the next batch, whose snapshot covers it.
func TestEventBufferLimit(t *testing.T) {
	const buffer = 8
	var rec recorder
	gate := make(chan struct{})
	entered := make(chan struct{}, 1)
	var once sync.Once
	sink := func(b EventBatch) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-gate
		rec.sink(b)
	}
	cfg := testConfig(nil, sink)
	cfg.EventBuffer = buffer
	cfg.MaxEventBatch = buffer
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(64, 1, layout.FullyContiguous, 64))
	defer once.Do(func() { close(gate) })
	register := func(h uint64) {
		t.Helper()
		blks, err := b.Allocate(1)
		if err != nil {
			t.Fatal(err)
		}
		b.Commit(blks[0])
		blk, err := b.Register(blks[0], h, 0)
		if err != nil {
			t.Fatal(err)
		}
		b.Release(blk)
	}
	// The first event is taken and the sink blocks on it: the buffer is
	// empty and the sink busy.
	register(1)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the sink was not called")
	}
	for h := uint64(2); h <= 1+buffer; h++ {
		register(h)
	}
	if d := p.Metrics().EventsDropped; d != 0 {
		t.Fatalf("%d events dropped with %d queued, the buffer's size", d, buffer)
	}
	register(100)
	if d := p.Metrics().EventsDropped; d != 1 {
		t.Fatalf("%d events dropped one past the buffer, want 1", d)
	}
	snap := p.Snapshot()
	once.Do(func() { close(gate) })
	p.Close()
	got, dropped := rec.events()
	if len(got) != 1+buffer || dropped != 1 {
		t.Fatalf("delivered %d events and announced %d dropped, want %d and 1", len(got), dropped, 1+buffer)
	}
	if snap.Seq != 2+buffer || len(snap.Blocks) != 2+buffer {
		t.Fatalf("snapshot as of %d with %d blocks, want %d and %d", snap.Seq, len(snap.Blocks), 2+buffer, 2+buffer)
	}
}
