package rdma

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// modelQueue is an RC send queue as the read engine sees it: requests
// complete in order, only signalled ones (and, in the error state, flushed
// signalled ones) produce completions, and posting beyond the depth fails as
// a driver does with ENOMEM.
type modelQueue struct {
	t        *testing.T
	depth    int
	rng      *rand.Rand
	queue    []sendWR // posted, not yet executed
	wcs      []workCompletion
	failAt   int // op id (1-based within the test's base) that errors; 0: none
	status   int
	errState bool
	stall    bool // nothing executes (a dead peer)

	posts, maxOutstanding, executed int
	outstanding                     int // posted, not yet seen complete by a polled completion
	lastSignaledPolled              uint64
}

func (m *modelQueue) post(wrs []sendWR) (int, error) {
	if m.errState {
		return 0, errors.New("post in error state")
	}
	// The send queue frees a slot only when a completion covering it was
	// polled: what the device still holds plus what completed unpolled.
	if m.outstanding+len(wrs) > m.depth {
		m.t.Errorf("post of %d with %d outstanding overflows depth %d", len(wrs), m.outstanding, m.depth)
		return 0, errors.New("ENOMEM")
	}
	if !wrs[len(wrs)-1].signaled {
		m.t.Errorf("last request of a post (id %d) is unsignalled", wrs[len(wrs)-1].id)
	}
	m.posts++
	m.queue = append(m.queue, wrs...)
	m.outstanding += len(wrs)
	m.maxOutstanding = max(m.maxOutstanding, m.outstanding)
	return len(wrs), nil
}

func (m *modelQueue) poll(out []workCompletion) (int, error) {
	// Execute a random number of queued requests.
	if !m.stall && !m.errState {
		k := min(len(m.queue), 1+m.rng.IntN(8))
		for _, w := range m.queue[:k] {
			m.executed++
			if m.failAt != 0 && int(w.id) == m.failAt {
				m.wcs = append(m.wcs, workCompletion{id: w.id, status: m.status, vendorErr: 0x42})
				m.queue = m.queue[slices.IndexFunc(m.queue, func(q sendWR) bool { return q.id == w.id })+1:]
				m.flush()
				goto deliver
			}
			if w.signaled {
				m.wcs = append(m.wcs, workCompletion{id: w.id})
			}
		}
		m.queue = m.queue[k:]
	}
deliver:
	n := copy(out, m.wcs)
	for _, wc := range m.wcs[:n] {
		if wc.id > m.lastSignaledPolled {
			m.outstanding -= int(wc.id - m.lastSignaledPolled)
			m.lastSignaledPolled = wc.id
		}
	}
	m.wcs = m.wcs[n:]
	return n, nil
}

func (m *modelQueue) flush() {
	for _, w := range m.queue {
		if w.signaled {
			m.wcs = append(m.wcs, workCompletion{id: w.id, status: 5})
		}
	}
	m.queue = nil
}

func (m *modelQueue) statusText(s int) string { return fmt.Sprintf("model status %d", s) }

func (m *modelQueue) fail() error {
	m.errState = true
	if !m.stall {
		m.flush()
	}
	return nil
}

func ops(n, sges int) []ReadOp {
	out := make([]ReadOp, n)
	for i := range out {
		out[i] = ReadOp{RemoteAddr: uint64(i) * 4096, RKey: 7}
		for j := range sges {
			out[i].Local = append(out[i].Local, SGE{Addr: uint64(i*sges+j) * 64, Length: 64, LKey: 3})
		}
	}
	return out
}

func TestReadAllKeepsSendQueueFullNeverOver(t *testing.T) {
	for _, tc := range []struct {
		desc               string
		n, depth, sigEvery int
	}{
		{"fewer ops than the depth", 5, 16, 4},
		{"ops exactly the depth", 16, 16, 4},
		{"one more op than the depth", 17, 16, 4},
		{"many times the depth", 1000, 16, 4},
		{"depth 1", 50, 1, 1},
		{"signal every op", 100, 8, 1},
		{"signal only the last of each post", 100, 8, 8},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			m := &modelQueue{t: t, depth: tc.depth, rng: rand.New(rand.NewPCG(1, uint64(tc.n)))}
			var seq uint64
			aborted, err := readAll(readCtx(t), m, ops(tc.n, 2), readParams{depth: tc.depth, signalEvery: tc.sigEvery, drain: time.Second}, &seq)
			if err != nil || aborted {
				t.Fatalf("readAll: aborted %v, %v", aborted, err)
			}
			if m.executed != tc.n {
				t.Fatalf("executed %d requests, want %d", m.executed, tc.n)
			}
			if m.maxOutstanding > tc.depth {
				t.Fatalf("%d outstanding at once, depth %d", m.maxOutstanding, tc.depth)
			}
			if tc.n >= tc.depth && m.maxOutstanding != tc.depth {
				t.Fatalf("send queue never filled: at most %d outstanding of %d", m.maxOutstanding, tc.depth)
			}
			if seq != uint64(tc.n) {
				t.Fatalf("sequence advanced to %d, want %d", seq, tc.n)
			}
		})
	}
}

func TestReadAllErrorCompletionNamesOpAndDrains(t *testing.T) {
	m := &modelQueue{t: t, depth: 8, rng: rand.New(rand.NewPCG(2, 2)), failAt: 37, status: 10}
	var seq uint64
	aborted, err := readAll(readCtx(t), m, ops(100, 1), readParams{depth: 8, signalEvery: 4, drain: time.Second}, &seq)
	if !aborted {
		t.Fatal("not aborted")
	}
	var ce *CompletionError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCompletion) {
		t.Fatalf("error %v is not a CompletionError", err)
	}
	if ce.Op != 36 || ce.Status != 10 || ce.StatusText != "model status 10" || ce.VendorErr != 0x42 {
		t.Fatalf("completion error %+v, want op 36 status 10", ce)
	}
	if !m.errState {
		t.Fatal("queue pair not moved to error")
	}
	if len(m.wcs) != 0 || len(m.queue) != 0 {
		t.Fatalf("returned with %d completions and %d requests still pending", len(m.wcs), len(m.queue))
	}
	if strings.Contains(err.Error(), "outstanding") {
		t.Fatalf("drain timed out although every request was flushed: %v", err)
	}
}

func TestReadAllContextEndsStalledRead(t *testing.T) {
	m := &modelQueue{t: t, depth: 4, rng: rand.New(rand.NewPCG(3, 3)), stall: true}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var seq uint64
	start := time.Now()
	aborted, err := readAll(ctx, m, ops(10, 1), readParams{depth: 4, signalEvery: 2, drain: 100 * time.Millisecond}, &seq)
	if !aborted || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("aborted %v, err %v; want a deadline error", aborted, err)
	}
	// The stalled device never flushes: the error must say the buffers may
	// still be written rather than pretend they are free.
	if want := "still outstanding"; !strings.Contains(err.Error(), want) {
		t.Fatalf("error %q does not say %q", err, want)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v", d)
	}
}

func TestReadAllIgnoresEarlierCallsCompletions(t *testing.T) {
	m := &modelQueue{t: t, depth: 4, rng: rand.New(rand.NewPCG(4, 4))}
	seq := uint64(100)
	m.lastSignaledPolled = 100
	m.wcs = []workCompletion{{id: 99, status: 5}, {id: 100, status: 5}}
	if _, err := readAll(readCtx(t), m, ops(10, 1), readParams{depth: 4, signalEvery: 2, drain: time.Second}, &seq); err != nil {
		t.Fatalf("stale completions of an earlier call broke this one: %v", err)
	}
}

func TestValidateOps(t *testing.T) {
	big := ReadOp{Local: []SGE{{Length: 1 << 31}, {Length: 1}}}
	for _, tc := range []struct {
		desc string
		ops  []ReadOp
		ok   bool
	}{
		{"scatter list at the limit", ops(1, 4), true},
		{"scatter list past the limit", ops(1, 5), false},
		{"empty scatter list", []ReadOp{{}}, false},
		{"zero-length entry", []ReadOp{{Local: []SGE{{Length: 0}}}}, false},
		{"message at 2^31", []ReadOp{{Local: []SGE{{Length: 1 << 31}}}}, true},
		{"message past 2^31", []ReadOp{big}, false},
		{"remote range wraps", []ReadOp{{Local: []SGE{{Length: 2}}, RemoteAddr: ^uint64(0)}}, false},
	} {
		err := validateOps(tc.ops, 4)
		if (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok=%v", tc.desc, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v does not match ErrInvalidArgument", tc.desc, err)
		}
	}
}

func TestReadAllCancelledBeforeAnythingPosted(t *testing.T) {
	m := &modelQueue{t: t, depth: 4, rng: rand.New(rand.NewPCG(5, 5))}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var seq uint64
	aborted, err := readAll(ctx, m, ops(10, 1), readParams{depth: 4, signalEvery: 2, drain: time.Second}, &seq)
	if !errors.Is(err, context.Canceled) || aborted || m.errState || m.posts != 0 {
		t.Fatalf("aborted %v, err %v, error state %v, %d posts; want a plain cancellation that leaves the queue pair alone", aborted, err, m.errState, m.posts)
	}
}

// partialQueue takes only the first request of every post after the first,
// then fails, as a driver that runs out of room mid-chain does.
type partialQueue struct{ *modelQueue }

func (p partialQueue) post(wrs []sendWR) (int, error) {
	if p.posts == 0 || len(wrs) == 1 {
		return p.modelQueue.post(wrs)
	}
	first := wrs[:1]
	first[0].signaled = true
	if _, err := p.modelQueue.post(first); err != nil {
		return 0, err
	}
	return 1, errors.New("ENOMEM")
}

func TestReadAllPartialPostDrainsWhatWentIn(t *testing.T) {
	m := &modelQueue{t: t, depth: 4, rng: rand.New(rand.NewPCG(6, 6))}
	var seq uint64
	aborted, err := readAll(readCtx(t), partialQueue{m}, ops(50, 1), readParams{depth: 4, signalEvery: 2, drain: time.Second}, &seq)
	if !aborted || err == nil || !strings.Contains(err.Error(), "1 went in") {
		t.Fatalf("aborted %v, err %v; want a failed post saying 1 went in", aborted, err)
	}
	if strings.Contains(err.Error(), "outstanding") || len(m.queue) != 0 || len(m.wcs) != 0 {
		t.Fatalf("returned before the request that went in completed: %v (%d queued, %d completions)", err, len(m.queue), len(m.wcs))
	}
}

// An empty completion queue is polled without sleeping for spinFor (a
// sleep takes a millisecond, in which a fast NIC drains its send queue),
// then with sleeps growing by 10 µs up to 1 ms; a completion starts over.
func TestBackoffYieldsForSpinForThenSleeps(t *testing.T) {
	clock := time.Unix(0, 0)
	var yields int
	var sleeps []time.Duration
	fresh := func() backoff {
		return backoff{
			now:   func() time.Time { return clock },
			yield: func() { yields++; clock = clock.Add(time.Microsecond) },
			sleep: func(d time.Duration) { sleeps = append(sleeps, d); clock = clock.Add(d) },
		}
	}
	b := fresh()
	for yields < 10_000 && len(sleeps) == 0 {
		b.wait()
	}
	// At the limit: 200 waits of 1 µs each yield; the next one sleeps.
	if yields != int(spinFor/time.Microsecond) || len(sleeps) != 1 || sleeps[0] != 10*time.Microsecond {
		t.Fatalf("%d yields, then sleeps %v; want %d yields, then one of 10µs", yields, sleeps, spinFor/time.Microsecond)
	}
	for range 200 {
		b.wait()
	}
	if yields != int(spinFor/time.Microsecond) {
		t.Fatalf("yielded again (%d) after sleeping began", yields)
	}
	if got := sleeps[99]; got != time.Millisecond {
		t.Fatalf("100th sleep %v, want 1ms", got)
	}
	if got := sleeps[len(sleeps)-1]; got != time.Millisecond {
		t.Fatalf("sleep past the cap %v, want 1ms", got)
	}
	// A completion resets it: yields first again.
	b, yields, sleeps = fresh(), 0, nil
	b.wait()
	if yields != 1 || len(sleeps) != 0 {
		t.Fatalf("after a reset: %d yields, sleeps %v; want one yield", yields, sleeps)
	}
}

// readCtx bounds a read: a completion that never comes fails the test in
// seconds rather than at the package's timeout.
func readCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}
