package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// withLane serves a lane on the node's own loopback address.
func withLane(plain bool) nodeOpt {
	return func(c *Config) {
		host, _, _ := net.SplitHostPort(c.ListenAddr)
		c.LaneAddr = net.JoinHostPort(host, "0")
		c.LanePlain = plain
	}
}

func withLaneConns(k int) nodeOpt { return func(c *Config) { c.LaneConns = k } }

// laneSetup is a holder with a lane over regions of set 9 leased under
// lease 5, and a reader's peer on it.
func laneSetup(t *testing.T, size uint64, plain bool, readerOpts ...nodeOpt) (holder, reader *Node, p *Peer, src [][]byte) {
	t.Helper()
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	src = [][]byte{make([]byte, size), make([]byte, size)}
	fill(src[0], 11)
	fill(src[1], 12)
	h.regions[9] = src
	leaseAll(h, 5, 2, size)
	holder = newTestNode(t, ca, "holder", members, h, withLane(plain))
	reader = newTestNode(t, ca, "reader", members, nil, readerOpts...)
	return holder, reader, dialPeer(t, reader, holder), src
}

func TestLaneRead(t *testing.T) {
	const size = 8 << 20
	for _, tc := range []struct {
		name  string
		plain bool
		conns int
	}{
		{"tls one connection", false, 1},
		{"tls defaults", false, 0},
		{"tls at MaxLaneConns", false, MaxLaneConns},
		{"plain one connection", true, 1},
		{"plain defaults", true, 0},
		{"plain at MaxLaneConns", true, MaxLaneConns},
	} {
		t.Run(tc.name, func(t *testing.T) {
			holder, reader, p, src := laneSetup(t, size, tc.plain, withLaneConns(tc.conns))
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for round := 0; round < 3; round++ {
				segs, sizes := stridedPlan(rng, size)
				dst := [][]byte{make([]byte, sizes[0]+4096), make([]byte, sizes[1]+4096)}
				want := [][]byte{make([]byte, len(dst[0])), make([]byte, len(dst[1]))}
				execLocal(segs, src, want)
				via, err := p.ReadVia(ctx, 5, 9, segs, dst)
				if err != nil {
					t.Fatal(err)
				}
				if via != TransportTCP {
					t.Fatalf("read went over %s, want %s", via, TransportTCP)
				}
				for r := range dst {
					if i := firstDiff(dst[r], want[r]); i >= 0 {
						t.Fatalf("round %d: rank %d differs first at byte %d of %d", round, r, i, len(dst[r]))
					}
				}
			}
			m := reader.Metrics()
			if m.BytesReadLane != m.BytesRead || m.BytesReadQUIC != 0 || m.Reads != 3 {
				t.Errorf("reader metrics: %d bytes over the lane, %d in all, %d over QUIC, %d reads", m.BytesReadLane, m.BytesRead, m.BytesReadQUIC, m.Reads)
			}
			limit := tc.conns
			if limit == 0 {
				limit = DefaultLaneConns
			}
			if m.LaneConnects == 0 || m.LaneConnects > uint64(limit) {
				t.Errorf("reader opened %d lane connections, want 1..%d", m.LaneConnects, limit)
			}
			if k := holder.LaneConns()["reader"]; k == 0 || k > limit {
				t.Errorf("holder has %d lane connections from reader, want 1..%d", k, limit)
			}
			if got := holder.Metrics().LanePlain; got != tc.plain {
				t.Errorf("holder metrics say plain %v, want %v", got, tc.plain)
			}
		})
	}
}

func TestLaneConfigLimits(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("n")
	for _, tc := range []struct {
		conns int
		plain bool
		addr  string
		ok    bool
	}{
		{MaxLaneConns, false, "", true},
		{MaxLaneConns + 1, false, "", false},
		{-1, false, "", false},
		{1, true, "", false}, // plain without a lane
		{1, true, "127.0.0.1:0", true},
	} {
		cfg := DefaultLocalConfig()
		cfg.NodeName, cfg.Certificate, cfg.CAs, cfg.Members, cfg.Logger = "n", ca.cert(t, "n"), ca.ca.Pool(), members, quietLogger()
		cfg.LaneConns, cfg.LanePlain, cfg.LaneAddr = tc.conns, tc.plain, tc.addr
		n, err := NewNode(cfg)
		if tc.ok != (err == nil) {
			t.Errorf("LaneConns %d plain %v addr %q: err %v, want ok %v", tc.conns, tc.plain, tc.addr, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrConfig) {
			t.Errorf("error %v does not match ErrConfig", err)
		}
		if n != nil {
			n.Close()
		}
	}
}

// laneTokens asks the holder for k tokens as p's node.
func laneTokens(t *testing.T, p *Peer, k int) (*transferpb.LaneTokenResponse, error) {
	t.Helper()
	var resp transferpb.LaneTokenResponse
	err := p.call(context.Background(), methodLaneToken, &transferpb.LaneTokenRequest{Count: uint32(k)}, &resp)
	return &resp, err
}

func TestLaneTokenLimits(t *testing.T) {
	_, _, p, _ := laneSetup(t, 1<<20, false)
	if r, err := laneTokens(t, p, MaxLaneConns); err != nil || len(r.Tokens) != MaxLaneConns {
		t.Fatalf("%d tokens: %v (%d tokens)", MaxLaneConns, err, len(r.Tokens))
	}
	for _, k := range []int{0, MaxLaneConns + 1} {
		if _, err := laneTokens(t, p, k); !errors.Is(err, ErrInvalidRequest) {
			t.Errorf("%d tokens: err %v, want ErrInvalidRequest", k, err)
		}
	}
}

func TestLaneNoLaneFallsBackToQUIC(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.regions[9] = [][]byte{make([]byte, 1<<20)}
	fill(h.regions[9][0], 3)
	leaseAll(h, 5, 1, 1<<20)
	holder := newTestNode(t, ca, "holder", members, h)
	reader := newTestNode(t, ca, "reader", members, nil)
	p := dialPeer(t, reader, holder)
	dst := [][]byte{make([]byte, 1<<20)}
	segs := []layout.Segment{{Length: 1 << 20, Count: 1}}
	for i := 0; i < 2; i++ {
		via, err := p.ReadVia(context.Background(), 5, 9, segs, dst)
		if err != nil || via != TransportQUIC {
			t.Fatalf("read %d: via %s, err %v; want quic", i, via, err)
		}
	}
	if firstDiff(dst[0], h.regions[9][0]) >= 0 {
		t.Fatal("bytes differ")
	}
	fb := reader.Metrics().LaneFallbacks
	if fb[LaneFallbackNoLane] != 1 || fb[LaneFallbackBackoff] != 1 {
		t.Errorf("fallbacks %v, want one %s then one %s", fb, LaneFallbackNoLane, LaneFallbackBackoff)
	}
	if why, until := p.LaneState(); why != LaneFallbackNoLane || until.IsZero() {
		t.Errorf("lane state %q until %v", why, until)
	}
}

func TestLaneUnreachableFallsBackToQUIC(t *testing.T) {
	holder, reader, p, src := laneSetup(t, 1<<20, false)
	holder.lane.ln.Close() // the port refuses connections from now on
	dst := [][]byte{make([]byte, 1<<20)}
	via, err := p.ReadVia(context.Background(), 5, 9, []layout.Segment{{Length: 1 << 20, Count: 1}}, dst)
	if err != nil || via != TransportQUIC {
		t.Fatalf("via %s, err %v; want quic", via, err)
	}
	if firstDiff(dst[0], src[0]) >= 0 {
		t.Fatal("bytes differ")
	}
	m := reader.Metrics()
	if m.LaneFallbacks[LaneFallbackConnect] != 1 || m.LaneConnectFailures == 0 {
		t.Errorf("fallbacks %v, connect failures %d", m.LaneFallbacks, m.LaneConnectFailures)
	}
}

// A holder whose lane port accepts connections but never answers them (a
// stalled process, a proxy holding them) is given up within the reader's
// bound on its dial, TLS handshake and hello, its LaneHelloTimeout where
// that is less than its HandshakeTimeout, and read over QUIC, the reason
// counted and shown in the peer's lane state.
func TestLaneHolderThatNeverAnswersFallsBackWithinTheHelloBound(t *testing.T) {
	const bound = 300 * time.Millisecond
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain %v", plain), func(t *testing.T) {
			holder, reader, p, src := laneSetup(t, 1<<20, plain, func(c *Config) {
				c.LaneHelloTimeout = bound
				c.HandshakeTimeout = 10 * time.Second
			})
			// The lane's port, taken over by a listener that accepts and
			// then says nothing.
			addr := holder.LaneAddr().String()
			holder.lane.ln.Close()
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			accepted := make(chan net.Conn, 4*MaxLaneConns)
			done := make(chan struct{})
			t.Cleanup(func() {
				ln.Close()
				<-done
				close(accepted)
				for c := range accepted {
					c.Close()
				}
			})
			go func() {
				defer close(done)
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					select {
					case accepted <- c:
					default:
						c.Close()
					}
				}
			}()
			dst := [][]byte{make([]byte, 1<<20)}
			start := time.Now()
			via, err := p.ReadVia(context.Background(), 5, 9, []layout.Segment{{Length: 1 << 20, Count: 1}}, dst)
			took := time.Since(start)
			if err != nil || via != TransportQUIC {
				t.Fatalf("via %s, err %v; want quic", via, err)
			}
			if firstDiff(dst[0], src[0]) >= 0 {
				t.Fatal("bytes differ")
			}
			// Within the bound and far short of the HandshakeTimeout of
			// 10 s, with room for a loaded machine.
			if took > 5*time.Second {
				t.Errorf("the read took %v, with a lane bound of %v", took, bound)
			}
			if len(accepted) == 0 {
				t.Error("the reader never dialled the lane")
			}
			m := reader.Metrics()
			if m.LaneFallbacks[LaneFallbackHelloTimeout] != 1 || m.LaneFallbacks[LaneFallbackConnect] != 0 || m.LaneConnectFailures == 0 {
				t.Errorf("fallbacks %v, connect failures %d; want one %s", m.LaneFallbacks, m.LaneConnectFailures, LaneFallbackHelloTimeout)
			}
			if why, until := p.LaneState(); why != LaneFallbackHelloTimeout || until.IsZero() {
				t.Errorf("lane state %q until %v, want %q", why, until, LaneFallbackHelloTimeout)
			}
		})
	}
}

// rawLane opens a connection to n's lane and sends a hello; it returns the
// connection and the holder's answer to the hello.
func rawLane(t *testing.T, n *Node, cfg *tls.Config, hello *transferpb.LaneHello) (net.Conn, error) {
	t.Helper()
	return rawLaneAt(t, n.LaneAddr().String(), cfg, hello)
}

// rawLaneAt is rawLane to the lane listener at addr.
func rawLaneAt(t *testing.T, addr string, cfg *tls.Config, hello *transferpb.LaneHello) (net.Conn, error) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if cfg != nil {
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			return nil, err
		}
		c = tc
	}
	if err := writeFrame(c, methodLaneHello, hello, laneHelloLimit); err != nil {
		return nil, err
	}
	kind, payload, err := readFrame(c, 1<<20)
	if err != nil {
		return nil, err
	}
	if kind != statusOK {
		var e transferpb.Error
		_ = unmarshal(payload, &e)
		return nil, &RemoteError{Method: "lane-hello", Code: Code(e.Code), Message: e.Message}
	}
	return c, nil
}

func TestLaneRefusesBadTokens(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run("plain="+strconv.FormatBool(plain), func(t *testing.T) {
			holder, reader, p, _ := laneSetup(t, 1<<20, plain)
			var cfg *tls.Config
			if !plain {
				cfg = reader.laneClientTLS("holder")
			}
			r, err := laneTokens(t, p, 3)
			if err != nil {
				t.Fatal(err)
			}
			good, other, used := r.Tokens[0], r.Tokens[1], r.Tokens[2]
			if _, err := rawLane(t, holder, cfg, &transferpb.LaneHello{Node: "reader", Token: used}); err != nil {
				t.Fatalf("first use of a token: %v", err)
			}
			for _, tc := range []struct {
				name  string
				hello *transferpb.LaneHello
			}{
				{"no token", &transferpb.LaneHello{Node: "reader"}},
				{"unknown token", &transferpb.LaneHello{Node: "reader", Token: make([]byte, laneTokenLen)}},
				{"short token", &transferpb.LaneHello{Node: "reader", Token: good[:16]}},
				{"used token", &transferpb.LaneHello{Node: "reader", Token: used}},
				{"token of another node", &transferpb.LaneHello{Node: "holder", Token: other}},
			} {
				_, err := rawLane(t, holder, cfg, tc.hello)
				var re *RemoteError
				if !errors.As(err, &re) {
					t.Errorf("%s: err %v, want a refusal", tc.name, err)
				}
			}
			if got := holder.Metrics().LaneRefused; got != 5 {
				t.Errorf("LaneRefused = %d, want 5", got)
			}
			// On plain TCP the token presented by another node was burnt
			// with it; with TLS the hello was refused on the certificate's
			// name before the token was looked at.
			if _, err := rawLane(t, holder, cfg, &transferpb.LaneHello{Node: "reader", Token: other}); plain == (err == nil) {
				t.Errorf("the token first presented under another name: err %v", err)
			}
			if _, err := rawLane(t, holder, cfg, &transferpb.LaneHello{Node: "reader", Token: good}); err != nil {
				t.Errorf("the good token: %v", err)
			}
		})
	}
}

func TestLaneRefusesOtherCA(t *testing.T) {
	holder, _, _, _ := laneSetup(t, 1<<20, false)
	other := newTestCA(t)
	intruder := newTestNode(t, other, "reader", newMembers("holder", "reader"), nil)
	_, err := rawLane(t, holder, intruder.laneClientTLS("holder"), &transferpb.LaneHello{Node: "reader", Token: make([]byte, laneTokenLen)})
	if err == nil {
		t.Fatal("a certificate from another CA was let in")
	}
	// A plain connection to a TLS lane fails too: its hello is no TLS.
	if _, err := rawLane(t, holder, nil, &transferpb.LaneHello{Node: "reader", Token: make([]byte, laneTokenLen)}); err == nil {
		t.Fatal("a plain connection to a TLS lane was let in")
	}
}

func TestLaneConnsPerPeerAtHolder(t *testing.T) {
	holder, _, p, _ := laneSetup(t, 1<<20, true)
	for i := 0; i < MaxLaneConns; i++ {
		r, err := laneTokens(t, p, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := rawLane(t, holder, nil, &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]}); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
	if got := holder.LaneConns()["reader"]; got != MaxLaneConns {
		t.Fatalf("holder has %d connections, want %d", got, MaxLaneConns)
	}
	r, err := laneTokens(t, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = rawLane(t, holder, nil, &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]})
	var re *RemoteError
	if !errors.As(err, &re) || re.Code != CodeUnavailable {
		t.Fatalf("connection %d: err %v, want unavailable", MaxLaneConns+1, err)
	}
}

func TestLaneReadBytesLimit(t *testing.T) {
	_, _, p, src := laneSetup(t, MaxLaneReadBytes+1, true)
	r, err := laneTokens(t, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := p.dialLane(context.Background(), int(r.Port), true, r.Tokens[0])
	if err != nil {
		t.Fatal(err)
	}
	defer lc.c.Close()
	dst := [][]byte{make([]byte, MaxLaneReadBytes+1)}
	ctx := context.Background()
	ok, err := p.readLanePart(ctx, lc, 5, 9, []layout.Segment{{Length: MaxLaneReadBytes + 1, Count: 1}}, dst)
	if !errors.Is(err, ErrTooLarge) || !ok {
		t.Fatalf("a read of MaxLaneReadBytes+1: ok %v, err %v; want ErrTooLarge on a connection still usable", ok, err)
	}
	ok, err = p.readLanePart(ctx, lc, 5, 9, []layout.Segment{{Length: MaxLaneReadBytes, Count: 1}}, dst)
	if err != nil || !ok {
		t.Fatalf("a read of MaxLaneReadBytes on the same connection: ok %v, err %v", ok, err)
	}
	if firstDiff(dst[0][:MaxLaneReadBytes], src[0][:MaxLaneReadBytes]) >= 0 {
		t.Fatal("bytes differ")
	}
	// A read of more goes through Read in requests under the cap.
	clear(dst[0])
	via, err := p.ReadVia(ctx, 5, 9, []layout.Segment{{Length: MaxLaneReadBytes + 1, Count: 1}}, dst)
	if err != nil || via != TransportTCP {
		t.Fatalf("via %s, err %v", via, err)
	}
	if firstDiff(dst[0], src[0][:MaxLaneReadBytes+1]) >= 0 {
		t.Fatal("bytes differ")
	}
}

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLaneIdleTimeout(t *testing.T) {
	const idle = 400 * time.Millisecond
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.regions[9] = [][]byte{make([]byte, 1<<20)}
	leaseAll(h, 5, 1, 1<<20)
	holder := newTestNode(t, ca, "holder", members, h, withLane(false), func(c *Config) { c.LaneIdleTimeout = idle })
	reader := newTestNode(t, ca, "reader", members, nil, withLaneConns(1), func(c *Config) { c.LaneIdleTimeout = idle })
	p := dialPeer(t, reader, holder)
	dst := [][]byte{make([]byte, 1<<20)}
	read := func() {
		t.Helper()
		via, err := p.ReadVia(context.Background(), 5, 9, []layout.Segment{{Length: 1 << 20, Count: 1}}, dst)
		if err != nil || via != TransportTCP {
			t.Fatalf("via %s, err %v", via, err)
		}
	}
	read()
	// Within the idle time the connection is reused.
	read()
	if got := reader.Metrics().LaneConnects; got != 1 {
		t.Fatalf("%d lane connections for two reads in a row, want 1", got)
	}
	// Past it the holder closes the connection, and the reader dials anew.
	waitFor(t, 20*idle, "the holder keeps an idle lane connection", func() bool { return holder.LaneConns()["reader"] == 0 })
	read()
	if got := reader.Metrics().LaneConnects; got != 2 {
		t.Fatalf("%d lane connections after the idle timeout, want 2", got)
	}
}

func TestLaneReaderThatStopsReadingIsDropped(t *testing.T) {
	holder, _, p, _ := laneSetup(t, 32<<20, true)
	r, err := laneTokens(t, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	c, err := rawLane(t, holder, nil, &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]})
	if err != nil {
		t.Fatal(err)
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4 << 10)
	}
	req := &transferpb.ReadRequest{LeaseId: 5, BlockSet: 9, Segments: []*transferpb.ReadSegment{{Length: 32 << 20, Count: 1}}}
	if err := writeFrame(c, byte(methodRead), req, 1<<20); err != nil {
		t.Fatal(err)
	}
	// Never read: the holder's write stalls, and ProgressTimeout (2 s in
	// the local config) drops the connection.
	start := time.Now()
	waitFor(t, 15*time.Second, "the holder keeps a connection whose reader stopped reading", func() bool { return holder.LaneConns()["reader"] == 0 })
	t.Logf("dropped after %v", time.Since(start))
}

func TestLaneHolderThatStallsMidStream(t *testing.T) {
	_, _, p, _ := laneSetup(t, 1<<20, true)
	// A lane whose holder sends the answer and half the data, then
	// nothing: the read fails within ProgressTimeout.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if _, _, err := readFrame(c, 1<<20); err != nil {
			return
		}
		_ = writeFrame(c, statusOK, &transferpb.ReadResponse{TotalBytes: 1 << 20}, 1<<20)
		_, _ = c.Write(make([]byte, 512<<10))
		<-done
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	lc := &laneConn{c: c, r: c}
	start := time.Now()
	ok, err := p.readLanePart(context.Background(), lc, 5, 9, []layout.Segment{{Length: 1 << 20, Count: 1}}, [][]byte{make([]byte, 1<<20)})
	took := time.Since(start)
	if ok || !errors.Is(err, ErrTimeout) {
		t.Fatalf("ok %v, err %v; want a timeout on a connection not to reuse", ok, err)
	}
	if pt := p.n.cfg.ProgressTimeout; took < pt/2 || took > 5*pt {
		t.Errorf("failed after %v, ProgressTimeout is %v", took, pt)
	}
	c.Close()
}

// The lane presents and checks the identity SetIdentity gives, on the
// connections made after it: a holder moved to a new CA refuses a lane
// connection certified by the old one and takes one certified by the new.
func TestLaneSetIdentity(t *testing.T) {
	holder, reader, p, _ := laneSetup(t, 1<<20, false)
	r, err := laneTokens(t, p, 2)
	if err != nil {
		t.Fatal(err)
	}
	other := newTestCA(t)
	renewed := other.cert(t, "holder")
	if err := holder.SetIdentity(renewed, other.ca.Pool()); err != nil {
		t.Fatal(err)
	}
	if _, err := rawLane(t, holder, reader.laneClientTLS("holder"), &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]}); err == nil {
		t.Fatal("a lane connection certified by the old CA was let in after the holder moved to a new one")
	}
	if err := reader.SetIdentity(other.cert(t, "reader"), other.ca.Pool()); err != nil {
		t.Fatal(err)
	}
	c, err := rawLane(t, holder, reader.laneClientTLS("holder"), &transferpb.LaneHello{Node: "reader", Token: r.Tokens[1]})
	if err != nil {
		t.Fatalf("a lane connection under the new CA: %v", err)
	}
	if got, want := c.(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber, renewed.Leaf.SerialNumber; got.Cmp(want) != 0 {
		t.Errorf("holder presents serial %v, want the new certificate's %v", got, want)
	}
}

// A lane connection must finish its handshake and hello within
// LaneHelloTimeout of its accept: one that says nothing is closed by then,
// and one that sends its hello halfway through it is let in.
func TestLaneHandshakeTimeout(t *testing.T) {
	holder, _, p, _ := laneSetup(t, 1<<20, true)
	hs := holder.cfg.LaneHelloTimeout
	silent, err := net.Dial("tcp", holder.LaneAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	_ = silent.SetReadDeadline(start.Add(10 * hs))
	// The holder answers with a refusal and closes.
	if _, err := io.Copy(io.Discard, silent); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a silent connection: %v; want it closed by the holder", err)
	}
	if took := time.Since(start); took < hs/2 || took > 5*hs {
		t.Errorf("a silent connection was closed after %v, LaneHelloTimeout is %v", took, hs)
	}
	r, err := laneTokens(t, p, 1)
	if err != nil {
		t.Fatal(err)
	}
	slow, err := net.Dial("tcp", holder.LaneAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	time.Sleep(hs / 2) // within the limit: what is timed here is the holder's patience
	if err := writeFrame(slow, methodLaneHello, &transferpb.LaneHello{Node: "reader", Token: r.Tokens[0]}, laneHelloLimit); err != nil {
		t.Fatal(err)
	}
	_ = slow.SetReadDeadline(time.Now().Add(10 * hs))
	if kind, _, err := readFrame(slow, 1<<20); err != nil || kind != statusOK {
		t.Fatalf("a hello halfway through LaneHelloTimeout: kind %d, err %v", kind, err)
	}
}

// A connection keeps one request ahead of the answer it reads
// (readLaneParts): all parts land, in any number; a part the holder refuses
// while the request after it is already sent fails the read with the
// holder's answer, and the connection, out of step, is not reused: the
// next read opens another and moves every byte.
func TestLanePartsAhead(t *testing.T) {
	const size = 8 << 20
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain %v", plain), func(t *testing.T) {
			_, reader, p, src := laneSetup(t, size, plain, withLaneConns(1))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			parts := func(lens ...uint64) chan []layout.Segment {
				ch := make(chan []layout.Segment, len(lens))
				var off uint64
				for _, n := range lens {
					ch <- []layout.Segment{{SrcRank: 0, SrcOffset: off, DstOffset: off, Length: n, Count: 1}}
					off += n
				}
				close(ch)
				return ch
			}
			r, err := laneTokens(t, p, 2)
			if err != nil {
				t.Fatal(err)
			}
			lc, err := p.dialLane(ctx, int(r.Port), r.Plain, r.Tokens[0])
			if err != nil {
				t.Fatal(err)
			}
			defer lc.c.Close()
			for _, lens := range [][]uint64{{size}, {1 << 20, 1 << 20}, {1 << 20, 3 << 20, 1, 4<<20 - 1}} {
				dst := [][]byte{make([]byte, size)}
				ok, err := p.readLaneParts(ctx, lc, 5, 9, parts(lens...), dst, nil)
				if err != nil || !ok {
					t.Fatalf("parts %v: ok %v, err %v", lens, ok, err)
				}
				var total uint64
				for _, n := range lens {
					total += n
				}
				if i := firstDiff(dst[0][:total], src[0][:total]); i >= 0 {
					t.Fatalf("parts %v: differs first at byte %d", lens, i)
				}
			}
			// The second of three parts reads past the lease: refused
			// with the third's request already on the wire.
			dst := [][]byte{make([]byte, 2*size)}
			ch := make(chan []layout.Segment, 3)
			ch <- []layout.Segment{{Length: 1 << 20, Count: 1}}
			ch <- []layout.Segment{{SrcOffset: size - 1<<20, DstOffset: 1 << 20, Length: 2 << 20, Count: 1}}
			ch <- []layout.Segment{{SrcOffset: 1 << 20, DstOffset: 3 << 20, Length: 1 << 20, Count: 1}}
			close(ch)
			ok, err := p.readLaneParts(ctx, lc, 5, 9, ch, dst, nil)
			var re *RemoteError
			if !errors.As(err, &re) || ok {
				t.Fatalf("a refused part with a request ahead: ok %v, err %v; want the holder's refusal and a connection not to reuse", ok, err)
			}
			// Through Read: the lane opens a new connection and every byte
			// arrives.
			clear(dst[0])
			via, err := p.ReadVia(ctx, 5, 9, []layout.Segment{{Length: size, Count: 1}}, dst)
			if err != nil || via != TransportTCP {
				t.Fatalf("via %s, err %v", via, err)
			}
			if i := firstDiff(dst[0][:size], src[0]); i >= 0 {
				t.Fatalf("differs first at byte %d", i)
			}
			if m := reader.Metrics(); m.LaneConnects != 1 {
				t.Errorf("%d lane connections made by Read, want 1", m.LaneConnects)
			}
		})
	}
}

// A QUIC read request asks for at most MaxReadBytes, as a lane's does: the
// holder refuses one more before it checks a segment against the lease,
// however its bytes are cut (many pieces of one byte cost the check one
// step each), and Read splits a larger read into requests under it.
func TestQUICReadBytesLimit(t *testing.T) {
	const size = MaxReadBytes + 1
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	src := [][]byte{make([]byte, size)}
	fill(src[0], 13)
	h.regions[9] = src
	leaseAll(h, 5, 1, size)
	holder := newTestNode(t, ca, "holder", members, h)
	reader := newTestNode(t, ca, "reader", members, nil)
	p := dialPeer(t, reader, holder)
	ctx := context.Background()
	dst := [][]byte{make([]byte, size)}
	for _, segs := range [][]layout.Segment{
		{{Length: size, Count: 1}},
		{{Length: MaxReadBytes, Count: 1}, {SrcOffset: MaxReadBytes, DstOffset: MaxReadBytes, Length: 1, Count: 1}},
		{{Length: 1, Count: size, SrcStride: 2, DstStride: 2}},
	} {
		if err := p.readPart(ctx, 5, 9, segs, dst); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("a QUIC read of %d bytes in %d segments: %v, want ErrTooLarge", size, len(segs), err)
		}
	}
	// At the cap: one piece (a read of as many one-byte pieces, served
	// whole, is minutes under the race detector).
	if err := p.readPart(ctx, 5, 9, []layout.Segment{{Length: MaxReadBytes, Count: 1}}, dst); err != nil {
		t.Fatalf("a QUIC read of MaxReadBytes: %v", err)
	}
	if firstDiff(dst[0][:MaxReadBytes], src[0][:MaxReadBytes]) >= 0 {
		t.Fatal("bytes differ")
	}
	clear(dst[0])
	via, err := p.ReadVia(ctx, 5, 9, []layout.Segment{{Length: size, Count: 1}}, dst)
	if err != nil || via != TransportQUIC {
		t.Fatalf("a read of %d bytes: via %s, err %v", size, via, err)
	}
	if firstDiff(dst[0], src[0]) >= 0 {
		t.Fatal("bytes differ")
	}
}
