package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// Flood sources: loopback addresses newTestNode's nodes never take.
const (
	floodA = "127.0.0.250"
	floodB = "127.0.0.251"
	floodC = "127.0.0.252"
)

// withLanePending sets the bounds on pending lane connections and their
// deadline.
func withLanePending(total, perSource int, hello time.Duration) nodeOpt {
	return func(c *Config) {
		c.LaneMaxPending, c.LaneMaxPendingPerSource, c.LaneHelloTimeout = total, perSource, hello
	}
}

// pendingSetup is laneSetup with options for the holder.
func pendingSetup(t *testing.T, size uint64, holderOpts ...nodeOpt) (holder, reader *Node, p *Peer, src [][]byte) {
	t.Helper()
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	src = [][]byte{make([]byte, size)}
	fill(src[0], 21)
	h.regions[9] = src
	leaseAll(h, 5, 1, size)
	holder = newTestNode(t, ca, "holder", members, h, append([]nodeOpt{withLane(false)}, holderOpts...)...)
	reader = newTestNode(t, ca, "reader", members, nil)
	return holder, reader, dialPeer(t, reader, holder), src
}

// bareLane opens a TCP connection to n's lane from the loopback address
// from, and sends nothing.
func bareLane(t *testing.T, n *Node, from string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", n.LaneAddr().String())
	if err != nil {
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" && !errors.Is(err, context.DeadlineExceeded) {
			t.Skipf("cannot dial from %s (loopback addresses besides 127.0.0.1 are Linux's): %v", from, err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedBy says how the holder ended c: within 20 s, it must close it
// (io.EOF or a reset); it returns how long it took.
func closedBy(t *testing.T, c net.Conn) time.Duration {
	t.Helper()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(20 * time.Second))
	var b [1]byte
	_, err := c.Read(b[:])
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection from %s still open after %v (read: %v)", c.LocalAddr(), time.Since(start).Round(time.Millisecond), err)
	}
	return time.Since(start)
}

// waitPending waits until the holder counts pending lane connections and
// refusals of them as given.
func waitPending(t *testing.T, n *Node, pending int, refused uint64) {
	t.Helper()
	waitFor(t, 20*time.Second, fmt.Sprintf("want %d pending lane connections and %d refused", pending, refused), func() bool {
		m := n.Metrics()
		return m.LanePending == pending && m.LanePendingRefused == refused
	})
}

// The bounds on lane connections not yet admitted: up to the per-source
// bound from one source, and the total from all, are held (a handshake
// under way); one past either is closed at once; a closed one frees its
// place, and so does one admitted by its hello.
func TestLanePendingBounds(t *testing.T) {
	// The deadline is far off: nothing here is closed by it.
	holder, reader, p, _ := pendingSetup(t, 1<<20, withLanePending(4, 2, time.Minute))
	a1 := bareLane(t, holder, floodA)
	bareLane(t, holder, floodA)
	waitPending(t, holder, 2, 0)
	closedBy(t, bareLane(t, holder, floodA))
	waitPending(t, holder, 2, 1)
	bareLane(t, holder, floodB)
	bareLane(t, holder, floodB)
	waitPending(t, holder, 4, 1)
	closedBy(t, bareLane(t, holder, floodC)) // a new source, past the total
	waitPending(t, holder, 4, 2)

	// A place frees when its connection closes: the reader's connection
	// takes it, and once admitted gives it back.
	a1.Close()
	waitPending(t, holder, 3, 2)
	r, err := laneTokens(t, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rawLane(t, holder, reader.laneClientTLS("holder"), &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]}); err != nil {
		t.Fatalf("a lane connection with a good token, one place free: %v", err)
	}
	if got := holder.LaneConns()["reader"]; got != 1 {
		t.Fatalf("holder has %d lane connections from reader, want 1", got)
	}
	waitPending(t, holder, 3, 2)
	bareLane(t, holder, floodC)
	waitPending(t, holder, 4, 2)
	closedBy(t, bareLane(t, holder, floodC))
	waitPending(t, holder, 4, 3)
}

// A connection that stalls in its TLS handshake (part of a ClientHello,
// then nothing) is closed at LaneHelloTimeout, however long
// HandshakeTimeout is, counted as a failed handshake, and its place frees.
// (That the place refuses another connection from its source while held
// is TestLanePendingBounds': here it would race the deadline.)
func TestLanePendingHelloTimeout(t *testing.T) {
	const hello = time.Second
	holder, _, _, _ := pendingSetup(t, 1<<20, withLanePending(4, 1, hello), func(c *Config) { c.HandshakeTimeout = time.Minute })
	start := time.Now()
	c := bareLane(t, holder, floodA)
	// A TLS record header announcing a 512-byte handshake record.
	if _, err := c.Write([]byte{0x16, 0x03, 0x01, 0x02, 0x00}); err != nil {
		t.Fatal(err)
	}
	closedBy(t, c)
	if took := time.Since(start); took < hello/2 {
		t.Fatalf("the stalled handshake was closed after %v, before its deadline %v", took, hello)
	}
	waitPending(t, holder, 0, 0)
	if got := holder.Metrics().LaneHandshakeFailures; got != 1 {
		t.Errorf("%d lane handshake failures counted, want 1", got)
	}
	bareLane(t, holder, floodA)
	waitPending(t, holder, 1, 0)
}

// An admitted connection is past LaneHelloTimeout: it still reads after
// the deadline its hello had. (Plain, so that a short deadline is not a
// race with a TLS handshake under -race on loaded cores.)
func TestLaneAdmittedOutlivesHelloTimeout(t *testing.T) {
	const hello = 500 * time.Millisecond
	holder, _, p, src := pendingSetup(t, 1<<20, withLane(true), withLanePending(4, 2, hello))
	r, err := laneTokens(t, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rawLane(t, holder, nil, &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]})
	if err != nil {
		t.Fatal(err)
	}
	waitPending(t, holder, 0, 0)
	time.Sleep(hello + time.Second) // what is timed here is the holder's deadline, past by then
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	const length = 4096
	req := &transferpb.ReadRequest{LeaseId: 5, BlockSet: 9, Segments: []*transferpb.ReadSegment{{Length: length, Count: 1}}}
	if err := writeFrame(c, byte(methodRead), req, 1<<20); err != nil {
		t.Fatalf("a request past LaneHelloTimeout: %v", err)
	}
	kind, payload, err := readFrame(c, 1<<20)
	if err != nil || kind != statusOK {
		t.Fatalf("a read past LaneHelloTimeout: kind %d, err %v (%q)", kind, err, payload)
	}
	got := make([]byte, length)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("a read past LaneHelloTimeout: %v", err)
	}
	if firstDiff(got, src[0][:length]) >= 0 {
		t.Fatal("bytes differ")
	}
}

// While one source holds all the pending places it may, and more of its
// connections are refused, a reader from another source still reads over
// the lane.
func TestLaneReadUnderFlood(t *testing.T) {
	const perSource, flood = 4, 12
	holder, reader, p, src := pendingSetup(t, 4<<20, withLanePending(64, perSource, time.Minute))
	for _, from := range []string{floodA, floodB} {
		for i := 0; i < flood; i++ {
			bareLane(t, holder, from)
		}
	}
	waitPending(t, holder, 2*perSource, 2*(flood-perSource))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dst := [][]byte{make([]byte, len(src[0]))}
	via, err := p.ReadVia(ctx, 5, 9, []layout.Segment{{Length: uint64(len(src[0])), Count: 1}}, dst)
	if err != nil || via != TransportTCP {
		t.Fatalf("read under a flood: via %s, err %v; want tcp", via, err)
	}
	if firstDiff(dst[0], src[0]) >= 0 {
		t.Fatal("bytes differ")
	}
	if m := reader.Metrics(); m.LaneConnectFailures != 0 {
		t.Errorf("%d lane connections failed", m.LaneConnectFailures)
	}
	waitPending(t, holder, 2*perSource, 2*(flood-perSource))
}

func TestLanePendingConfig(t *testing.T) {
	ca := newTestCA(t)
	for _, tc := range []struct {
		total, perSource int
		hello            time.Duration
		ok               bool
	}{
		{0, 0, 0, true},
		{1, 1, time.Millisecond, true},
		{-1, 0, 0, false},
		{0, -1, 0, false},
		{0, 0, -time.Second, false},
	} {
		cfg := DefaultLocalConfig()
		cfg.NodeName, cfg.Certificate, cfg.CAs, cfg.Members, cfg.Logger = "n", ca.cert(t, "n"), ca.ca.Pool(), newMembers("n"), quietLogger()
		cfg.LaneAddr = "127.0.0.1:0"
		cfg.LaneMaxPending, cfg.LaneMaxPendingPerSource, cfg.LaneHelloTimeout = tc.total, tc.perSource, tc.hello
		n, err := NewNode(cfg)
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, ErrConfig) {
			t.Errorf("LaneMaxPending %d, per source %d, hello %v: err %v, want ok %v", tc.total, tc.perSource, tc.hello, err, tc.ok)
		}
		if n != nil {
			n.Close()
		}
	}
}
