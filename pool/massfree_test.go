package pool

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// gatedSink passes batches to a recorder until closed, then blocks every
// call until opened, so that a test decides what is queued.
type gatedSink struct {
	rec     recorder
	mu      sync.Mutex
	gate    chan struct{} // nil: open
	entered chan struct{}
}

func newGatedSink() *gatedSink { return &gatedSink{entered: make(chan struct{}, 1)} }

func (g *gatedSink) sink(b EventBatch) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		select {
		case g.entered <- struct{}{}:
		default:
		}
		<-gate
	}
	g.rec.sink(b)
}

func (g *gatedSink) close() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gatedSink) open() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func (g *gatedSink) delivered() int {
	evs, _ := g.rec.events()
	return len(evs)
}

// registerAll registers n blocks (hashes from first) and releases them,
// waiting every so often for the sink to catch up so that none is dropped.
func registerAll(t *testing.T, g *gatedSink, b *BlockSet, first uint64, n, buffer int) {
	t.Helper()
	for i := range n {
		blks, err := b.Allocate(1)
		if err != nil {
			t.Fatal(err)
		}
		b.Commit(blks[0])
		blk, err := b.Register(blks[0], first+uint64(i), 0)
		if err != nil {
			t.Fatal(err)
		}
		b.Release(blk)
		if (i+1)%(buffer/2) == 0 || i == n-1 {
			wait.For(t, 30*time.Second, "the sink takes every event", func() error {
				if got, want := g.delivered(), b.p.events.lastSeq(); uint64(got) < want {
					return fmt.Errorf("%d of %d delivered", got, want)
				}
				return nil
			})
		}
	}
}

// stallSink closes the gate and makes the sink take one event and block
// on it, so that the queue is empty and nothing drains it.
func stallSink(t *testing.T, g *gatedSink, b *BlockSet, hash uint64) {
	t.Helper()
	g.close()
	blks, err := b.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	b.Commit(blks[0])
	blk, err := b.Register(blks[0], hash, 0)
	if err != nil {
		t.Fatal(err)
	}
	b.Release(blk)
	select {
	case <-g.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the sink was not called")
	}
}

// Freeing a block set of 20,000 registered blocks is one batch of remove
// events for the sink, however small the event buffer, not a loss that
// makes the sink resynchronise.
func TestMassFreeIsOneBatch(t *testing.T) {
	const blocks = 20000
	g := newGatedSink()
	cfg := testConfig(nil, g.sink)
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(blocks+1, 1, layout.FullyContiguous, 64))
	t.Cleanup(g.open) // before the pool's Close, which waits for the sink
	registerAll(t, g, b, 1, blocks, cfg.EventBuffer)
	stallSink(t, g, b, blocks+1)
	if err := p.FreeBlockSet(b.ID()); err != nil {
		t.Fatal(err)
	}
	if d := p.Metrics().EventsDropped; d != 0 {
		t.Fatalf("%d events dropped freeing %d blocks", d, blocks+1)
	}
	g.open()
	p.Close()
	evs, dropped := g.rec.events()
	removes := 0
	for _, e := range evs {
		if e.Kind == EventRemove {
			removes++
		}
	}
	if dropped != 0 || removes != blocks+1 {
		t.Fatalf("%d removes delivered, %d announced dropped; want %d and 0", removes, dropped, blocks+1)
	}
}

// One operation's events are admitted whole while the buffer is not full
// (at the limit: EventBuffer-1 queued), and dropped whole, counted, once it
// is (past it: EventBuffer queued).
func TestBatchAtAndPastEventBuffer(t *testing.T) {
	const buffer, setBlocks = 8, 64
	for _, tc := range []struct {
		desc        string
		queued      int
		wantDropped uint64
	}{
		{"buffer one short of full", buffer - 1, 0},
		{"buffer full", buffer, setBlocks},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			g := newGatedSink()
			cfg := testConfig(nil, g.sink)
			cfg.EventBuffer = buffer
			cfg.LowWatermark = -1
			p, b := newTestPool(t, cfg, testLayout(setBlocks, 1, layout.FullyContiguous, 64))
			t.Cleanup(g.open) // before the pool's Close, which waits for the sink
			registerAll(t, g, b, 1, setBlocks, buffer)
			// Another set takes the events that fill the queue.
			other, err := p.NewBlockSet(testLayout(64, 1, layout.FullyContiguous, 64))
			if err != nil {
				t.Fatal(err)
			}
			stallSink(t, g, other, 1000)
			for i := range tc.queued {
				blks, err := other.Allocate(1)
				if err != nil {
					t.Fatal(err)
				}
				other.Commit(blks[0])
				if _, err := other.Register(blks[0], 2000+uint64(i), 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := p.FreeBlockSet(b.ID()); err != nil {
				t.Fatal(err)
			}
			if d := p.Metrics().EventsDropped; d != tc.wantDropped {
				t.Fatalf("%d events dropped, want %d", d, tc.wantDropped)
			}
			g.open()
			p.Close()
			evs, dropped := g.rec.events()
			removes := 0
			for _, e := range evs {
				if e.Kind == EventRemove {
					removes++
				}
			}
			if want := setBlocks - int(tc.wantDropped); removes != want || dropped != tc.wantDropped {
				t.Fatalf("%d removes delivered and %d announced dropped, want %d and %d", removes, dropped, want, tc.wantDropped)
			}
			for i := 1; i < len(evs); i++ {
				if evs[i].Seq <= evs[i-1].Seq {
					t.Fatalf("events out of order: %d after %d", evs[i].Seq, evs[i-1].Seq)
				}
			}
		})
	}
}
