package transfer

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// widenSetup is a lane of two connections, both open and idle, and a
// strided plan over it with its expected destination.
func widenSetup(t *testing.T, plain bool) (reader *Node, p *Peer, segs []layout.Segment, want [][]byte, newDst func() [][]byte) {
	t.Helper()
	const size = 8 << 20
	_, reader, p, src := laneSetup(t, size, plain, withLaneConns(2))
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	segs, sizes := stridedPlan(rand.New(rand.NewPCG(seed, 0)), size)
	newDst = func() [][]byte { return [][]byte{make([]byte, sizes[0]), make([]byte, sizes[1])} }
	want = newDst()
	execLocal(segs, src, want)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A first read opens both connections (its parts outnumber them).
	if via, err := p.ReadVia(ctx, 5, 9, segs, newDst()); err != nil || via != TransportTCP {
		t.Fatalf("first read over %s: %v", via, err)
	}
	p.lane.mu.Lock()
	idle := len(p.lane.idle)
	p.lane.mu.Unlock()
	if idle != 2 {
		t.Fatalf("%d idle lane connections after the first read, want 2", idle)
	}
	return reader, p, segs, want, newDst
}

// checkDst fails t unless dst holds want.
func checkDst(t *testing.T, what string, dst, want [][]byte) {
	t.Helper()
	for r := range dst {
		if i := firstDiff(dst[r], want[r]); i >= 0 {
			t.Fatalf("%s: rank %d differs first at byte %d of %d", what, r, i, len(dst[r]))
		}
	}
}

// stallFirst is a Landed that holds its first call (and with it the
// connection that landed the part) until release, and counts the calls.
type stallFirst struct {
	calls   atomic.Int32
	stalled chan struct{} // closed when the first call holds
	release chan struct{}
	once    sync.Once
}

func newStallFirst() *stallFirst {
	return &stallFirst{stalled: make(chan struct{}), release: make(chan struct{})}
}

func (s *stallFirst) landed(part []layout.Segment) {
	if s.calls.Add(1) == 1 {
		close(s.stalled)
		<-s.release
	}
}

func (s *stallFirst) let() { s.once.Do(func() { close(s.release) }) }

type readResult struct {
	via Transport
	err error
}

// A read that started with one connection, the other busy, carries the
// rest of its parts also on the other once that one is given back: parts
// land on it while the read's first connection is held.
func TestLaneReadTakesConnectionsGivenBack(t *testing.T) {
	for _, plain := range []bool{false, true} {
		name := "tls"
		if plain {
			name = "plain"
		}
		t.Run(name, func(t *testing.T) {
			reader, p, segs, want, newDst := widenSetup(t, plain)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			held, err := p.laneConns(ctx, 1) // another read's, say
			if err != nil || len(held) != 1 {
				t.Fatalf("took %d connections: %v", len(held), err)
			}
			st := newStallFirst()
			defer st.let()
			dst := newDst()
			done := make(chan readResult, 1)
			go func() {
				via, err := p.ReadViaLanded(ctx, 5, 9, segs, dst, st.landed)
				done <- readResult{via, err}
			}()
			<-st.stalled
			p.putLaneConn(held[0], true)
			waitFor(t, 10*time.Second, "no part landed on the connection given back while the read's own was held", func() bool { return st.calls.Load() >= 2 })
			st.let()
			r := <-done
			if r.err != nil || r.via != TransportTCP {
				t.Fatalf("read over %s: %v", r.via, r.err)
			}
			checkDst(t, "read", dst, want)
			if w := reader.Metrics().LaneWidened; w != 1 {
				t.Errorf("LaneWidened %d, want 1", w)
			}
			if k := len(p.lane.slots); k != 0 {
				t.Errorf("%d lane slots taken after the read, want 0", k)
			}
		})
	}
}

// A connection given back goes to a read waiting for its first one
// before a read under way that could use it.
func TestLaneReadWaitingForAConnectionComesFirst(t *testing.T) {
	reader, p, segs, want, newDst := widenSetup(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held, err := p.laneConns(ctx, 1)
	if err != nil || len(held) != 1 {
		t.Fatalf("took %d connections: %v", len(held), err)
	}
	st := newStallFirst()
	defer st.let()
	dstA, dstB := newDst(), newDst()
	doneA, doneB := make(chan readResult, 1), make(chan readResult, 1)
	go func() {
		via, err := p.ReadViaLanded(ctx, 5, 9, segs, dstA, st.landed)
		doneA <- readResult{via, err}
	}()
	<-st.stalled
	go func() {
		via, err := p.ReadVia(ctx, 5, 9, segs, dstB)
		doneB <- readResult{via, err}
	}()
	waitFor(t, 10*time.Second, "the second read never waited for a connection", func() bool { return p.lane.starting.Load() == 1 })
	p.putLaneConn(held[0], true)
	// B gets the connection and finishes while A's first connection is
	// still held: A took nothing from B.
	select {
	case r := <-doneB:
		if r.err != nil || r.via != TransportTCP {
			t.Fatalf("second read over %s: %v", r.via, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the read waiting for a connection did not get the one given back")
	}
	checkDst(t, "second read", dstB, want)
	if n := st.calls.Load(); n < 1 {
		t.Fatalf("first read's landed called %d times", n)
	}
	st.let()
	r := <-doneA
	if r.err != nil || r.via != TransportTCP {
		t.Fatalf("first read over %s: %v", r.via, r.err)
	}
	checkDst(t, "first read", dstA, want)
	if k := len(p.lane.slots); k != 0 {
		t.Errorf("%d lane slots taken after the reads, want 0", k)
	}
	_ = reader
}

// A read whose ctx ends while it could take more connections returns
// with the error, takes none afterwards, and leaves every slot free.
func TestLaneReadCanceledWhileWidening(t *testing.T) {
	reader, p, segs, _, newDst := widenSetup(t, false)
	held, err := p.laneConns(context.Background(), 1)
	if err != nil || len(held) != 1 {
		t.Fatalf("took %d connections: %v", len(held), err)
	}
	st := newStallFirst()
	defer st.let()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan readResult, 1)
	go func() {
		via, err := p.ReadViaLanded(ctx, 5, 9, segs, newDst(), st.landed)
		done <- readResult{via, err}
	}()
	<-st.stalled
	cancel()
	st.let()
	select {
	case r := <-done:
		if r.err == nil {
			t.Fatalf("a canceled read succeeded over %s", r.via)
		}
		t.Logf("canceled read: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("a canceled read did not return")
	}
	p.putLaneConn(held[0], true)
	if w := reader.Metrics().LaneWidened; w != 0 {
		t.Errorf("LaneWidened %d after a read canceled before a connection was given back, want 0", w)
	}
	if k := len(p.lane.slots); k != 0 {
		t.Errorf("%d lane slots taken after the read, want 0", k)
	}
}
