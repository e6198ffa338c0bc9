package transfer

import (
	"bytes"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// faultyListener wraps a listener: its Accept first waits for gate (if
// set), then returns fail's error for its nth call (from 1) where fail
// returns one, else accepts from the listener it wraps, and returns the
// connection through wrap (if set).
type faultyListener struct {
	net.Listener
	gate  <-chan struct{}
	fail  func(call int) error
	wrap  func(net.Conn) net.Conn
	calls atomic.Int64
}

func (l *faultyListener) Accept() (net.Conn, error) {
	if l.gate != nil {
		<-l.gate
	}
	if l.fail != nil {
		if err := l.fail(int(l.calls.Add(1))); err != nil {
			return nil, err
		}
	}
	c, err := l.Listener.Accept()
	if err == nil && l.wrap != nil {
		c = l.wrap(c)
	}
	return c, err
}

// brokenWrites is a connection whose writes fail once broken is set.
type brokenWrites struct {
	net.Conn
	broken *atomic.Bool
}

func (c brokenWrites) Write(p []byte) (int, error) {
	if c.broken.Load() {
		return 0, syscall.EPIPE
	}
	return c.Conn.Write(p)
}

// faultyLane is a listener on loopback wrapped as given, served by a second
// lane accept loop of n (the node's own keeps its listener); the channel
// closes when that loop returns. The listener closes at the test's end,
// before n does.
func faultyLane(t *testing.T, n *Node, ln *faultyListener) <-chan struct{} {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Listener = inner
	t.Cleanup(func() { inner.Close() })
	done := make(chan struct{})
	n.wg.Add(1)
	go func() {
		n.laneAcceptLoop(ln)
		close(done)
	}()
	return done
}

// lengthenLaneAcceptBackoff sets the accept loop's first wait after a
// failed accept and its cap for the test, which must set it before its
// nodes start.
func lengthenLaneAcceptBackoff(t *testing.T, first, ceiling time.Duration) {
	was, wasMax := laneAcceptBackoff, laneAcceptMaxBackoff
	laneAcceptBackoff, laneAcceptMaxBackoff = first, ceiling
	t.Cleanup(func() { laneAcceptBackoff, laneAcceptMaxBackoff = was, wasMax })
}

// errAcceptEMFILE is what accept returns when the process is out of
// descriptors.
var errAcceptEMFILE = &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}

// A failed accept (out of descriptors) does not stop the lane: the loop
// counts it, waits and accepts again, and the next connection is served.
func TestLaneAcceptErrorsRetried(t *testing.T) {
	const fails = 3
	holder, reader, p, _ := pendingSetup(t, 1<<20)
	ln := &faultyListener{fail: func(call int) error {
		if call <= fails {
			return errAcceptEMFILE
		}
		return nil
	}}
	done := faultyLane(t, holder, ln)
	r, err := laneTokens(t, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rawLaneAt(t, ln.Addr().String(), reader.laneClientTLS("holder"), &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]}); err != nil {
		t.Fatalf("a lane connection after %d failed accepts: %v", fails, err)
	}
	if got := holder.LaneConns()["reader"]; got != 1 {
		t.Errorf("holder has %d lane connections from reader, want 1", got)
	}
	if got := holder.Metrics().LaneAcceptErrors; got != fails {
		t.Errorf("%d lane accept errors counted, want %d", got, fails)
	}
	select {
	case <-done:
		t.Fatal("the accept loop returned")
	default:
	}
}

// lockedBuffer is a bytes.Buffer that a logger and a test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// The first failed accept after one that succeeded is logged, though the
// node's count of them (3 here) is not a power of two: a later run of
// failures is not silent.
func TestLaneAcceptErrorsLoggedEachRun(t *testing.T) {
	var logs lockedBuffer
	holder, _, _, _ := pendingSetup(t, 1<<20, func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	// Accepts 1 and 2 fail, 3 succeeds, 4 fails; the 5th call comes after
	// the 4th's wait, so after its log.
	fifth := make(chan struct{})
	ln := &faultyListener{fail: func(call int) error {
		switch call {
		case 1, 2, 4:
			return errAcceptEMFILE
		case 5:
			close(fifth)
		}
		return nil
	}}
	faultyLane(t, holder, ln)
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case <-fifth:
	case <-time.After(10 * time.Second):
		t.Fatal("the accept loop did not accept again after its 4th call failed")
	}
	const msg = "lane accept failed"
	if got := strings.Count(logs.String(), msg); got != 3 {
		t.Errorf("%d failed accepts logged, want 3 (the 1st, the 2nd and the 1st after an accept):\n%s", got, logs.String())
	}
}

// A closed listener ends the accept loop, uncounted; so does the node's
// close while accepts keep failing, during the wait between them (a
// minute here, past the test's 10 s).
func TestLaneAcceptLoopEnds(t *testing.T) {
	lengthenLaneAcceptBackoff(t, time.Minute, time.Minute)
	holder, _, _, _ := pendingSetup(t, 1<<20)
	closed := &faultyListener{fail: func(int) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}
	}}
	select {
	case <-faultyLane(t, holder, closed):
	case <-time.After(10 * time.Second):
		t.Fatal("the accept loop goes on after its listener closed")
	}
	if got := holder.Metrics().LaneAcceptErrors; got != 0 {
		t.Errorf("a closed listener counted as %d accept errors", got)
	}

	failing := &faultyListener{fail: func(int) error { return errAcceptEMFILE }}
	done := faultyLane(t, holder, failing)
	waitFor(t, 10*time.Second, "an accept failing", func() bool { return holder.Metrics().LaneAcceptErrors >= 1 })
	closing := make(chan struct{})
	go func() {
		holder.Close()
		close(closing)
	}()
	for _, c := range []<-chan struct{}{done, closing} {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Fatal("the node's Close does not end an accept loop whose accepts keep failing")
		}
	}
}

// A connection the accept loop took from the listener just before the lane
// closed, and tracks after closeLane closed the tracked ones, is closed at
// once, not served (which would hold Node.Close for up to
// LaneHelloTimeout), and the loop returns.
func TestLaneAcceptRacingClose(t *testing.T) {
	holder, _, _, _ := pendingSetup(t, 1<<20, withLanePending(4, 4, time.Minute))
	gate := make(chan struct{})
	ln := &faultyListener{gate: gate}
	done := faultyLane(t, holder, ln)
	c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	holder.closeLane()
	close(gate) // the loop's Accept returns c's connection only now
	closedBy(t, c)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the accept loop goes on after the lane closed")
	}
	if m := holder.Metrics(); m.LanePending != 0 {
		t.Errorf("%d lane connections pending after the lane closed", m.LanePending)
	}
}

// A TLS lane holder gathers an answer's records and writes them to the
// socket at the answer's end: an answer whose gathered records could not
// be written was not served, and is counted as a failed call only. (It was
// counted served too, in ReadsServed and BytesServed, once gathered.)
func TestLaneAnswerNotFlushedIsNotServed(t *testing.T) {
	const size = 64 << 10 // under laneGather: the answer's one socket write is its flush
	holder, reader, p, _ := pendingSetup(t, size)
	var broken atomic.Bool
	ln := &faultyListener{wrap: func(c net.Conn) net.Conn { return brokenWrites{Conn: c, broken: &broken} }}
	faultyLane(t, holder, ln)
	r, err := laneTokens(t, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rawLaneAt(t, ln.Addr().String(), reader.laneClientTLS("holder"), &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]})
	if err != nil {
		t.Fatal(err)
	}
	failed := holder.Metrics().CallsFailed
	broken.Store(true) // the hello is answered; the holder writes nothing more until asked
	req := &transferpb.ReadRequest{LeaseId: 5, BlockSet: 9, Segments: []*transferpb.ReadSegment{{Length: size, Count: 1}}}
	if err := writeFrame(c, byte(methodRead), req, 1<<20); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "the holder to fail the answer it could not write", func() bool { return holder.Metrics().CallsFailed > failed })
	if m := holder.Metrics(); m.ReadsServed != 0 || m.BytesServed != 0 || m.BytesServedLane != 0 {
		t.Errorf("holder: %d reads served, %d bytes, %d over the lane; want none: its answer never left", m.ReadsServed, m.BytesServed, m.BytesServedLane)
	}
}
