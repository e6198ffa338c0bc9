package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

func udpAddr(s string) *net.UDPAddr {
	a, err := net.ResolveUDPAddr("udp", s)
	if err != nil {
		panic(err)
	}
	return a
}

// The guard admits handshakes up to each bound and refuses one past it,
// per source and in total, for handshakes and for connections; a finished
// handshake frees its handshake slot and a closed connection both.
func TestHandshakeGuardBounds(t *testing.T) {
	c := Config{MaxHandshakes: 4, MaxHandshakesPerSource: 2, MaxConns: 6, MaxConnsPerSource: 3}
	g := newHandshakeGuard(c, quietLogger())
	type conn struct {
		ctx    context.Context
		cancel context.CancelFunc
	}
	admit := func(src string) (conn, error) {
		base, cancel := context.WithCancel(context.Background())
		ctx, err := g.connContext(base, &quic.ClientInfo{RemoteAddr: udpAddr(src)})
		if err != nil {
			cancel()
			return conn{}, err
		}
		return conn{ctx, cancel}, nil
	}
	must := func(what, src string) conn {
		t.Helper()
		c, err := admit(src)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return c
	}
	refused := func(what, src string) {
		t.Helper()
		if _, err := admit(src); !errors.Is(err, errHandshakeRefused) {
			t.Fatalf("%s: %v, want refused", what, err)
		}
	}
	a1 := must("source A, 1st handshake", "127.0.0.1:1")
	must("source A at the per-source handshake bound", "127.0.0.1:2")
	refused("source A past the per-source handshake bound", "127.0.0.1:3")
	must("source B, 1st", "127.0.0.2:1")
	b2 := must("source B, at the total handshake bound", "127.0.0.2:2")
	refused("source C past the total handshake bound", "127.0.0.3:1")
	// A's first handshake completes: its slot frees, its connection stays.
	handshakeDone(a1.ctx)
	handshakeDone(a1.ctx) // twice is harmless
	must("source A, 3rd connection, at the per-source connection bound", "127.0.0.1:4")
	handshakeDone(b2.ctx)
	refused("source A past the per-source connection bound", "127.0.0.1:5")
	// B's second connection closes: everything it held frees.
	b2.cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if hs, _, conns, _, _ := g.snapshot(); hs == 3 && conns == 4 {
			break
		}
		if time.Now().After(deadline) {
			hs, _, conns, _, _ := g.snapshot()
			t.Fatalf("after a close: %d handshakes, %d conns; want 3 and 4", hs, conns)
		}
		time.Sleep(time.Millisecond)
	}
	must("source C after B's close", "127.0.0.3:1")
	if _, peak, _, n, _ := g.snapshot(); n != 3 || peak != 4 {
		t.Fatalf("refused %d, peak %d; want 3 and 4", n, peak)
	}
}

// firstPacketConn forwards each connection's first datagram only and never
// delivers an answer: a client on it abandons every handshake after its
// Initial, as a flood of half-open handshakes does.
type firstPacketConn struct {
	net.PacketConn
	mu   sync.Mutex
	seen map[string]bool
}

func (c *firstPacketConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	// Long header: flags, version (4), DCID length, DCID.
	if len(b) < 7 || b[0]&0x80 == 0 || len(b) < 6+int(b[5]) {
		return len(b), nil
	}
	dcid := string(b[6 : 6+int(b[5])])
	c.mu.Lock()
	first := !c.seen[dcid]
	c.seen[dcid] = true
	c.mu.Unlock()
	if !first {
		return len(b), nil
	}
	return c.PacketConn.WriteTo(b, addr)
}

// ReadFrom drops every answer, so that the client never completes.
func (c *firstPacketConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		if _, _, err := c.PacketConn.ReadFrom(b); err != nil {
			return 0, nil, err
		}
	}
}

// A bounded flood of abandoned handshakes from several loopback sources
// (far more than the bounds) never makes the node hold more handshakes
// than MaxHandshakes, makes it ask for address validation, and a member's
// calls are served all the while.
func TestHandshakeFloodKeepsCallsServed(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	holder := newTestNode(t, ca, "holder", members, h, func(c *Config) {
		c.ListenAddr = "127.0.0.1:0"
		c.MaxHandshakes, c.MaxHandshakesPerSource = 32, 8
	})
	// Generous handshake bounds for the member: the flood's clients run
	// in this process too, on the same few cores.
	reader := newTestNode(t, ca, "reader", members, newMemHandler(), func(c *Config) { c.HandshakeTimeout = 10 * time.Second })
	const sources, perSource = 4, 200
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	floodDone := make(chan struct{})
	var wg sync.WaitGroup
	for s := range sources {
		uc, err := net.ListenUDP("udp", udpAddr(fmt.Sprintf("127.0.0.%d:0", 100+s)))
		if err != nil {
			t.Fatal(err)
		}
		tr := &quic.Transport{Conn: &firstPacketConn{PacketConn: uc, seen: map[string]bool{}}}
		defer tr.Close()
		defer uc.Close()
		tlsConf := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{ALPN}}
		for range 10 { // 10 dialers per source
			wg.Go(func() {
				for range perSource / 10 {
					dctx, dcancel := context.WithTimeout(ctx, 30*time.Millisecond)
					tr.Dial(dctx, holder.Addr(), tlsConf, &quic.Config{HandshakeIdleTimeout: time.Second})
					dcancel()
				}
			})
		}
	}
	go func() { wg.Wait(); close(floodDone) }()
	// A member's calls during the flood: each on a new peer, so each
	// handshakes under load.
	calls := 0
	for done := false; !done; {
		select {
		case <-floodDone:
			done = true
		default:
		}
		p := dialPeer(t, reader, holder)
		cctx, ccancel := context.WithTimeout(ctx, 20*time.Second)
		if _, err := p.Hello(cctx, nil); err != nil {
			ccancel()
			t.Fatalf("call %d during the flood: %v", calls, err)
		}
		ccancel()
		p.Close()
		calls++
	}
	m := holder.Metrics()
	t.Logf("%d calls served during a flood of %d abandoned handshakes from %d sources: peak %d handshakes, %d refused, %d asked to validate",
		calls, sources*perSource, sources, m.HandshakesPeak, m.ConnsRefused, m.AddressValidations)
	if m.HandshakesPeak > 32 {
		t.Errorf("%d handshakes at once, bound 32", m.HandshakesPeak)
	}
	if m.AddressValidations == 0 && m.ConnsRefused == 0 {
		t.Errorf("a flood of %d handshakes was neither refused nor asked to validate", sources*perSource)
	}
}

// A sourceCount counts by source against both bounds; taking back what was
// counted leaves it empty, with no entry left for any source, and an IPv4
// address mapped into IPv6 (a dual-stack socket's) counts as the address.
func TestSourceCount(t *testing.T) {
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("2001:db8::1")
	s := newSourceCount(3, 2)
	for _, src := range []netip.Addr{a, a, b} {
		if s.full(src) {
			t.Fatalf("full before %s's place: %d in all, %v", src, s.n, s.by)
		}
		s.add(src)
	}
	if !s.full(a) {
		t.Errorf("%s holds %d, its bound: one more is not refused", a, s.by[a])
	}
	if !s.full(netip.MustParseAddr("10.0.0.2")) {
		t.Errorf("%d held, the total's bound: one more from a new source is not refused", s.n)
	}
	s.remove(a)
	if s.full(netip.MustParseAddr("10.0.0.2")) || s.full(a) {
		t.Errorf("one freed, %d held, %v: a new source or %s refused", s.n, s.by, a)
	}
	s.remove(b)
	s.remove(a)
	if s.n != 0 || len(s.by) != 0 {
		t.Errorf("everything taken back: %d held, %v left", s.n, s.by)
	}
	tcp := &net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.1"), Port: 7}
	if got := sourceOf(tcp); got != a {
		t.Errorf("sourceOf(%v) = %v, want %v", tcp, got, a)
	}
}
