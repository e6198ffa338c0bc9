package fabric

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/pool"
)

// The lease book's caps count reservations and leases; an entry past its
// deadline gives its room back when room is needed, not before.
func TestLeaseBookCapsAndExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newLeaseBook()
		const perPeer, total = 8, 12
		if k := b.reserve("a", 6, perPeer, total, time.Now()); k != 6 {
			t.Fatalf("first reservation: %d of 6", k)
		}
		b.add(1, "a", 6, 5, time.Now().Add(30*time.Second)) // one block not found: given back
		if a, all := b.leased("a"); a != 5 || all != 5 {
			t.Fatalf("after add: a %d, all %d; want 5, 5", a, all)
		}
		// a's cap leaves 3.
		if k := b.reserve("a", 10, perPeer, total, time.Now()); k != 3 {
			t.Fatalf("at a's cap: %d, want 3", k)
		}
		b.unreserve("a", 3)
		// The total cap leaves b 7 of its 8.
		if k := b.reserve("b", 8, perPeer, total, time.Now()); k != 7 {
			t.Fatalf("at the total cap: %d, want 7", k)
		}
		b.add(2, "b", 7, 7, time.Now().Add(10*time.Second))
		if k := b.reserve("c", 1, perPeer, total, time.Now()); k != 0 {
			t.Fatalf("no room: %d, want 0", k)
		}
		// At b's deadline its lease still counts; past it, its room is
		// given back to the next reservation that needs it.
		time.Sleep(10 * time.Second)
		if k := b.reserve("c", 1, perPeer, total, time.Now()); k != 0 {
			t.Fatalf("at the deadline: %d, want 0", k)
		}
		time.Sleep(time.Nanosecond)
		if k := b.reserve("c", 4, perPeer, total, time.Now()); k != 4 {
			t.Fatalf("past b's deadline: %d, want 4", k)
		}
		if _, ok := b.owner(2); ok {
			t.Error("b's expired lease is still in the book")
		}
		if owner, ok := b.owner(1); !ok || owner != "a" {
			t.Errorf("a's live lease: owner %q, %v", owner, ok)
		}
		// Extended, a's lease outlives its first deadline.
		b.extend(1, time.Now().Add(time.Minute))
		time.Sleep(30 * time.Second)
		b.reserve("c", 100, perPeer, total, time.Now())
		if _, ok := b.owner(1); !ok {
			t.Error("an extended lease expired at its old deadline")
		}
		granted, ok := b.remove(1)
		if !ok || granted.IsZero() {
			t.Errorf("remove: %v, %v", granted, ok)
		}
		if a, _ := b.leased("a"); a != 0 {
			t.Errorf("a holds %d after its lease was removed", a)
		}
		b.add(3, "d", 0, 2, time.Now().Add(time.Minute))
		b.add(4, "d", 0, 3, time.Now().Add(time.Minute))
		if ids, _ := b.removePeer("d"); len(ids) != 2 {
			t.Errorf("removePeer: %v, want both of d's leases", ids)
		}
		if d, _ := b.leased("d"); d != 0 {
			t.Errorf("d holds %d after it left", d)
		}
	})
}

// fakeRenewer answers renewals as told and records when they came.
type fakeRenewer struct {
	mu    sync.Mutex
	at    []time.Duration // since start
	start time.Time
	fail  map[uint64]error // a renewal of this lease fails so
	cap   time.Duration    // when set, the most a renewal grants
}

func (r *fakeRenewer) Renew(ctx context.Context, id uint64, d time.Duration) (time.Duration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.at = append(r.at, time.Since(r.start))
	if err := r.fail[id]; err != nil {
		return 0, err
	}
	if r.cap > 0 {
		d = min(d, r.cap)
	}
	return d, nil
}

func (r *fakeRenewer) times() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.at...)
}

// The keeper renews each lease at half its term, counted from when it was
// asked for, until dropped; a failed renewal ends the lease's context with
// errLeaseLost.
func TestLeaseKeeperRenewsAtHalfTerm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRenewer{start: time.Now(), fail: map[uint64]error{}}
		var renewals atomic.Uint64
		k := newLeaseKeeper(r, &renewals)
		defer k.close()
		asked := time.Now()
		time.Sleep(time.Second) // the answer took a second
		l := k.keep(context.Background(), 7, 10*time.Second, asked)
		time.Sleep(16 * time.Second)
		synctest.Wait()
		want := []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second}
		if got := r.times(); !equalDurations(got, want) {
			t.Fatalf("renewals at %v, want %v", got, want)
		}
		if renewals.Load() != 3 || l.ctx.Err() != nil {
			t.Fatalf("renewals counted %d, lease ctx %v", renewals.Load(), l.ctx.Err())
		}
		k.drop(7)
		if l.ctx.Err() == nil || errors.Is(context.Cause(l.ctx), errLeaseLost) {
			t.Errorf("dropped lease: ctx %v, cause %v; want plainly cancelled", l.ctx.Err(), context.Cause(l.ctx))
		}
		time.Sleep(time.Minute)
		synctest.Wait()
		if n := len(r.times()); n != 3 {
			t.Errorf("%d renewals after the drop, want none", n-3)
		}
		// A renewal the holder refuses loses the lease.
		r.fail[8] = errors.New("holder gone")
		l8 := k.keep(context.Background(), 8, 4*time.Second, time.Now())
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if !errors.Is(context.Cause(l8.ctx), errLeaseLost) {
			t.Errorf("refused renewal: cause %v, want errLeaseLost", context.Cause(l8.ctx))
		}
	})
}

// A holder whose cap grants a renewal less than the term asked (its lease
// duration was lowered since the lease) is renewed again half way through
// the term it granted, not the one asked: at the cap the lease's rhythm
// holds, past it the renewals come as often as the cap needs.
func TestLeaseKeeperRenewsWithinHolderCap(t *testing.T) {
	for _, tc := range []struct {
		name string
		cap  time.Duration
		want []time.Duration
	}{
		{"at the cap", 10 * time.Second, []time.Duration{5 * time.Second, 10 * time.Second, 15 * time.Second}},
		{"term past the cap", 4 * time.Second, []time.Duration{5 * time.Second, 7 * time.Second, 9 * time.Second, 11 * time.Second, 13 * time.Second, 15 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &fakeRenewer{start: time.Now(), cap: tc.cap}
				k := newLeaseKeeper(r, new(atomic.Uint64))
				defer k.close()
				l := k.keep(context.Background(), 7, 10*time.Second, time.Now())
				time.Sleep(16 * time.Second)
				synctest.Wait()
				if got := r.times(); !equalDurations(got, tc.want) {
					t.Fatalf("renewals at %v, want %v", got, tc.want)
				}
				if l.ctx.Err() != nil {
					t.Fatalf("lease ctx %v", l.ctx.Err())
				}
			})
		})
	}
}

// A lease kept after close is handed back ended: nothing will renew it.
func TestLeaseKeeperAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &fakeRenewer{start: time.Now()}
		k := newLeaseKeeper(r, new(atomic.Uint64))
		live := k.keep(context.Background(), 1, time.Minute, time.Now())
		k.close()
		k.close() // twice-safe
		if live.ctx.Err() == nil {
			t.Error("a kept lease's context outlived close")
		}
		late := k.keep(context.Background(), 2, time.Minute, time.Now())
		if late.ctx.Err() == nil {
			t.Error("a lease kept after close is live")
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if n := len(r.times()); n != 0 {
			t.Errorf("%d renewals after close", n)
		}
	})
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// fakeSessionStream is an engine's session stream: what the test puts in
// in arrives as SessionRequests; closing in ends the stream.
type fakeSessionStream struct {
	grpc.ServerStream
	ctx  context.Context
	in   chan *fabricpb.SessionRequest
	sent chan *fabricpb.SessionEvent
}

func (f *fakeSessionStream) Context() context.Context { return f.ctx }

func (f *fakeSessionStream) Recv() (*fabricpb.SessionRequest, error) {
	select {
	case r, ok := <-f.in:
		if !ok {
			return nil, io.EOF
		}
		return r, nil
	case <-f.ctx.Done():
		return nil, status.FromContextError(f.ctx.Err()).Err()
	}
}

func (f *fakeSessionStream) Send(e *fabricpb.SessionEvent) error {
	f.sent <- e
	return nil
}

// sessionAgent is the part of an agent that sessions need: a keepalive
// bound, the session table and the bounds on sessions.
func sessionAgent(keepalive time.Duration) *Agent {
	return &Agent{cfg: Config{SessionKeepalive: keepalive}, log: slog.New(slog.DiscardHandler),
		sessions: map[uint64]*session{}, done: make(chan struct{}), sets: map[pool.SetID]*engineSet{},
		sessCount: newSessionCount(DefaultEngineSessions, DefaultEngineSessionsPerProcess)}
}

func openFake(t *testing.T, a *Agent) (*fakeSessionStream, chan error, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	st := &fakeSessionStream{ctx: ctx, in: make(chan *fabricpb.SessionRequest), sent: make(chan *fabricpb.SessionEvent, 1)}
	done := make(chan error, 1)
	go func() { done <- (&engineServer{a: a}).OpenSession(st) }()
	return st, done, cancel
}

// A session lives while keepalives come within the bound, ends exactly one
// bound after the last, and is gone from the agent's table when it ends.
func TestSessionExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const bound = 5 * time.Second
		a := sessionAgent(bound)
		st, done, cancel := openFake(t, a)
		defer cancel()
		start := time.Now()
		st.in <- &fabricpb.SessionRequest{Engine: "vllm-0"}
		ev := <-st.sent
		if ev.Session == 0 || ev.KeepaliveMs != uint32(bound/time.Millisecond) {
			t.Fatalf("first event %v", ev)
		}
		// Keepalives a hair inside the bound, for a minute.
		for time.Since(start) < time.Minute {
			time.Sleep(bound - time.Millisecond)
			st.in <- &fabricpb.SessionRequest{}
		}
		a.sessMu.Lock()
		_, open := a.sessions[ev.Session]
		a.sessMu.Unlock()
		if !open {
			t.Fatal("a session with timely keepalives ended")
		}
		last := time.Now()
		err := <-done
		if took := time.Since(last); took != bound {
			t.Errorf("ended %v after the last keepalive, want %v", took, bound)
		}
		if status.Code(err) != codes.DeadlineExceeded {
			t.Errorf("silent session: %v, want DeadlineExceeded", err)
		}
		a.sessMu.Lock()
		n := len(a.sessions)
		a.sessMu.Unlock()
		if n != 0 {
			t.Errorf("%d sessions left in the table", n)
		}
	})
}

// Without a first request within the bound no session is made; an engine
// that closes its stream or an agent that stops ends the session at once.
func TestSessionEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const bound = 2 * time.Second
		a := sessionAgent(bound)
		_, done, cancel := openFake(t, a)
		start := time.Now()
		if err := <-done; status.Code(err) != codes.DeadlineExceeded || time.Since(start) != bound {
			t.Errorf("no first request: %v after %v, want DeadlineExceeded after %v", err, time.Since(start), bound)
		}
		cancel()

		st, done, cancel := openFake(t, a)
		st.in <- &fabricpb.SessionRequest{Engine: "e"}
		<-st.sent
		close(st.in)
		start = time.Now()
		if err := <-done; err != nil || time.Since(start) != 0 {
			t.Errorf("stream closed by the engine: %v after %v, want nil at once", err, time.Since(start))
		}
		cancel()

		st, done, cancel = openFake(t, a)
		defer cancel()
		st.in <- &fabricpb.SessionRequest{Engine: "e"}
		<-st.sent
		close(a.done)
		if err := <-done; status.Code(err) != codes.Unavailable {
			t.Errorf("agent stopping: %v, want Unavailable", err)
		}
		synctest.Wait()
		if len(a.sessions) != 0 {
			t.Errorf("%d sessions left in the table", len(a.sessions))
		}
	})
}
