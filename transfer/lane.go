package transfer

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// The TCP data lane. A holder with Config.LaneAddr listens on TCP for
// reads alone: control calls stay on QUIC. A reader asks the holder for
// one-time tokens over QUIC (lane-token, method 9), then opens up to
// Config.LaneConns connections to the holder's lane port, each speaking
// TLS 1.3 with the node's certificate and CAs (as QUIC does; ALPN
// LaneALPN), or plain TCP where the holder's Config.LanePlain says so. The
// first frame on a connection is a LaneHello with a token; the holder
// refuses a connection whose token it did not issue to that node (and,
// with TLS, to the node its certificate names), that was used before, or
// that is older than LaneTokenTTL. After it, a connection carries read
// requests, framed and answered as on QUIC (method 7); the holder answers
// them one at a time, in order, and a reader keeps one request ahead of
// the answer it is reading, so that the holder need not wait for it
// between parts.

// LaneALPN is the application protocol of TLS lane connections.
const LaneALPN = "kvfabric-lane/1"

// Limits of the lane.
const (
	// MaxLaneConns is the most lane connections a reader opens to one
	// holder (Config.LaneConns) and the most a holder keeps open from one
	// reader: a connection past it is refused.
	MaxLaneConns = 16
	// DefaultLaneConns is Config.LaneConns' default.
	DefaultLaneConns = 4
	// MaxLaneReadBytes is the most data bytes one read request on a lane
	// connection may ask for: MaxReadBytes, as on QUIC.
	MaxLaneReadBytes = MaxReadBytes
	// DefaultLaneIdleTimeout is Config.LaneIdleTimeout's default: a holder
	// closes a lane connection that brought no request for this long, and
	// a reader does not reuse one idle for half of it.
	DefaultLaneIdleTimeout = 60 * time.Second
	// DefaultLaneMaxPending and DefaultLaneMaxPendingPerSource are
	// Config.LaneMaxPending's and LaneMaxPendingPerSource's defaults: a
	// reader opens at most MaxLaneConns connections to a holder at once,
	// so one source needs a few more than that (redials) and the members
	// of a large cluster together a few hundred; anything near the bounds
	// is a flood.
	DefaultLaneMaxPending          = 256
	DefaultLaneMaxPendingPerSource = 2 * MaxLaneConns
	// DefaultLaneHelloTimeout is Config.LaneHelloTimeout's default: a TLS
	// handshake and a hello take a few round trips.
	DefaultLaneHelloTimeout = 3 * time.Second
	// LaneTokenTTL is how long a lane token stays good after it was
	// issued.
	LaneTokenTTL = 10 * time.Second
	// LaneRetryAfter is how long a reader reads a holder over QUIC after
	// its lane failed (could not connect, or a read on it failed) before
	// it tries the lane again.
	LaneRetryAfter = 10 * time.Second
	// laneTokenLen is a token's length in bytes.
	laneTokenLen = 32
	// laneHelloLimit caps a LaneHello frame.
	laneHelloLimit = 1 << 10
	// methodLaneHello is the kind byte of a LaneHello frame.
	methodLaneHello = 0x80
	// maxLaneTokensPerPeer caps the tokens outstanding for one peer: the
	// oldest go first.
	maxLaneTokensPerPeer = 2 * MaxLaneConns
)

// laneAcceptBackoff and laneAcceptMaxBackoff bound the wait after a failed
// accept (out of descriptors or memory), doubling from the first to the
// second while accepts keep failing, as net/http's server does. Variables
// only so that a test can lengthen them (set before its nodes start).
var (
	laneAcceptBackoff    = 5 * time.Millisecond
	laneAcceptMaxBackoff = time.Second
)

// TransportTCP is a read over the TCP lane.
const TransportTCP Transport = "tcp"

// Reasons a read that could have used the lane went over QUIC.
const (
	// LaneFallbackNoLane: the holder serves no lane (or refused tokens).
	LaneFallbackNoLane = "holder-has-no-lane"
	// LaneFallbackConnect: no lane connection could be made (dial,
	// handshake or token refused, or the holder closed it).
	LaneFallbackConnect = "connect-failed"
	// LaneFallbackHelloTimeout: no lane connection was made and admitted
	// within the reader's bound on its dial, TLS handshake and hello
	// (Config.laneDialBound): a dial not answered, or a holder that
	// accepts connections but does not answer them.
	LaneFallbackHelloTimeout = "hello-timeout"
	// LaneFallbackRead: a read on the lane failed before it completed.
	LaneFallbackRead = "read-failed"
	// LaneFallbackBackoff: the lane failed within LaneRetryAfter.
	LaneFallbackBackoff = "backoff"
)

// laneFallbackReasons is every reason, an array so that the node's
// counters of them (counters.laneFallbacks) are sized by it.
var laneFallbackReasons = [...]string{LaneFallbackNoLane, LaneFallbackConnect, LaneFallbackHelloTimeout, LaneFallbackRead, LaneFallbackBackoff}

// LaneFallbackReasons lists every reason, for metrics that show them all.
var LaneFallbackReasons = laneFallbackReasons[:]

// errLaneNotAdmitted is why a reader gave up a lane connection that the
// holder had not admitted (the answer to its hello) within
// Config.laneDialBound of the dial.
var errLaneNotAdmitted = errors.New("transfer: lane connection not admitted in time")

// ErrLaneToken is matched by the refusal of a lane connection whose token
// is missing, unknown, used, expired or issued to another node.
var ErrLaneToken = errors.New("transfer: lane token refused")

// laneToken is a token issued to peer.
type laneToken struct {
	peer    string
	expires time.Time
}

// laneServer is a holder's lane: its listener, the tokens it issued, its
// open connections by peer and those not yet admitted by source.
type laneServer struct {
	ln    net.Listener
	plain bool
	log   *slog.Logger

	mu     sync.Mutex
	tokens map[[laneTokenLen]byte]laneToken
	conns  map[net.Conn]laneConnOf
	byPeer map[string]int
	// pending counts the connections not yet admitted, by source IP.
	pending sourceCount
	// closed is set by closeLane: a connection accepted after it is not
	// tracked, but closed.
	closed         bool
	pendingRefused atomic.Uint64
	handshakeFails atomic.Uint64
	acceptErrors   atomic.Uint64
}

// laneConnOf is what the lane knows of one of its connections: its source
// and, once admitted, its peer.
type laneConnOf struct {
	src  netip.Addr
	peer string
}

// errLaneBusy is why a connection past the bounds on pending lane
// connections is closed.
var errLaneBusy = errors.New("transfer: too many lane connections not yet admitted")

// startLane opens the lane listener.
func (n *Node) startLane() error {
	ln, err := net.Listen("tcp", n.cfg.LaneAddr)
	if err != nil {
		return fmt.Errorf("transfer: lane listen on %s: %w", n.cfg.LaneAddr, err)
	}
	n.lane = &laneServer{ln: ln, plain: n.cfg.LanePlain, log: n.log, tokens: map[[laneTokenLen]byte]laneToken{},
		conns: map[net.Conn]laneConnOf{}, byPeer: map[string]int{},
		pending: newSourceCount(n.cfg.LaneMaxPending, n.cfg.LaneMaxPendingPerSource)}
	if n.cfg.LanePlain {
		n.log.Warn("PLAIN TCP LANE: block data to and from this node's lane crosses the network unencrypted; "+
			"lane connections are still authorized by tokens from the authenticated QUIC channel", "lane", ln.Addr().String())
	}
	n.wg.Add(1)
	go n.laneAcceptLoop(ln)
	return nil
}

// LaneAddr returns the address the lane listens on, or nil without one.
func (n *Node) LaneAddr() net.Addr {
	if n.lane == nil {
		return nil
	}
	return n.lane.ln.Addr()
}

// LanePlain says whether the node's lane is plain TCP.
func (n *Node) LanePlain() bool { return n.lane != nil && n.lane.plain }

// closeLane closes the lane's listener and its connections; a connection
// its accept loop took from the listener just before is closed by the
// loop (track refuses it), so that none is served past Close.
func (n *Node) closeLane() {
	if n.lane == nil {
		return
	}
	n.lane.ln.Close()
	n.lane.mu.Lock()
	n.lane.closed = true
	for c := range n.lane.conns {
		c.Close()
	}
	n.lane.mu.Unlock()
}

// issueLaneTokens answers a lane-token call.
func (n *Node) issueLaneTokens(peer string, count int) (*transferpb.LaneTokenResponse, error) {
	if n.lane == nil {
		return nil, fmt.Errorf("%w: node %s serves no TCP lane", ErrUnavailable, n.cfg.NodeName)
	}
	port := n.lane.ln.Addr().(*net.TCPAddr).Port
	resp := &transferpb.LaneTokenResponse{Port: uint32(port), Plain: n.lane.plain}
	l := n.lane
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	held := 0
	var oldest [laneTokenLen]byte
	var oldestAt time.Time
	for k, t := range l.tokens {
		switch {
		case now.After(t.expires):
			delete(l.tokens, k)
		case t.peer == peer:
			held++
			if oldestAt.IsZero() || t.expires.Before(oldestAt) {
				oldest, oldestAt = k, t.expires
			}
		}
	}
	for i := 0; i < count; i++ {
		if held >= maxLaneTokensPerPeer {
			delete(l.tokens, oldest)
			held--
			oldestAt = time.Time{}
			for k, t := range l.tokens {
				if t.peer == peer && (oldestAt.IsZero() || t.expires.Before(oldestAt)) {
					oldest, oldestAt = k, t.expires
				}
			}
		}
		var k [laneTokenLen]byte
		if _, err := rand.Read(k[:]); err != nil {
			return nil, fmt.Errorf("%w: lane token: %v", ErrInternal, err)
		}
		l.tokens[k] = laneToken{peer: peer, expires: now.Add(LaneTokenTTL)}
		held++
		resp.Tokens = append(resp.Tokens, k[:])
	}
	return resp, nil
}

// redeem takes a token for peer: it must exist, be unexpired and have been
// issued to peer. It is gone afterwards, whatever the outcome.
func (l *laneServer) redeem(token []byte, peer string) error {
	if len(token) != laneTokenLen {
		return fmt.Errorf("%w: token of %d bytes", ErrLaneToken, len(token))
	}
	k := [laneTokenLen]byte(token)
	l.mu.Lock()
	t, ok := l.tokens[k]
	delete(l.tokens, k)
	l.mu.Unlock()
	switch {
	case !ok:
		return fmt.Errorf("%w: unknown or already used", ErrLaneToken)
	case time.Now().After(t.expires):
		return fmt.Errorf("%w: expired", ErrLaneToken)
	case t.peer != peer:
		return fmt.Errorf("%w: issued to %q, presented by %q", ErrLaneToken, t.peer, peer)
	}
	return nil
}

// admit counts a connection of peer in, refusing one past MaxLaneConns;
// the connection leaves the pending ones.
func (l *laneServer) admit(c net.Conn, peer string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	of, ok := l.conns[c]
	if !ok {
		return ErrClosed
	}
	if l.byPeer[peer] >= MaxLaneConns {
		return fmt.Errorf("%w: %s already has %d lane connections (at most %d)", ErrUnavailable, peer, l.byPeer[peer], MaxLaneConns)
	}
	l.byPeer[peer]++
	l.pending.remove(of.src)
	l.conns[c] = laneConnOf{src: of.src, peer: peer}
	return nil
}

// track counts an accepted connection in as pending, or refuses it:
// ErrClosed once the lane is closed, errLaneBusy past the bounds on
// pending connections, in total or from its source. A refusal past the
// bounds is counted, and logged as floods are.
func (l *laneServer) track(c net.Conn) error {
	src := sourceOf(c.RemoteAddr())
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.pending.full(src) {
		fromSrc, all := l.pending.by[src], l.pending.n
		l.mu.Unlock()
		if n := l.pendingRefused.Add(1); floodLogged(n) {
			l.log.Warn("transfer: lane connection refused: too many not yet admitted", "source", src.String(),
				"source_pending", fromSrc, "pending", all, "refused", n,
				"max_pending", l.pending.max, "max_pending_per_source", l.pending.maxPerSource)
		}
		return errLaneBusy
	}
	l.pending.add(src)
	l.conns[c] = laneConnOf{src: src}
	l.mu.Unlock()
	return nil
}

// forget counts a closed connection out, of the pending ones or of its
// peer's.
func (l *laneServer) forget(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	of, ok := l.conns[c]
	if !ok {
		return
	}
	delete(l.conns, c)
	if of.peer == "" {
		l.pending.remove(of.src)
	} else if l.byPeer[of.peer]--; l.byPeer[of.peer] <= 0 {
		delete(l.byPeer, of.peer)
	}
}

// laneMetrics fills in m what the lane served by this node counts.
func (n *Node) laneMetrics(m *Metrics) {
	if n.lane == nil {
		return
	}
	n.lane.mu.Lock()
	m.LanePending = n.lane.pending.n
	n.lane.mu.Unlock()
	m.LanePendingRefused = n.lane.pendingRefused.Load()
	m.LaneHandshakeFailures = n.lane.handshakeFails.Load()
	m.LaneAcceptErrors = n.lane.acceptErrors.Load()
}

// LaneConns returns the lane connections open to this node, by peer.
func (n *Node) LaneConns() map[string]int {
	out := map[string]int{}
	if n.lane == nil {
		return out
	}
	n.lane.mu.Lock()
	defer n.lane.mu.Unlock()
	for p, k := range n.lane.byPeer {
		out[p] = k
	}
	return out
}

// laneAcceptLoop accepts the lane's connections from ln until the node
// closes or ln does. Any other error (out of descriptors, buffers or
// memory) is counted, and the loop waits and accepts again, from
// laneAcceptBackoff doubling to laneAcceptMaxBackoff while they keep
// failing: a lane that stopped accepting would leave its connections in
// the listen backlog and its readers on QUIC for the node's life. The
// first error of each run of them (after an accept that succeeded, or the
// loop's first) is logged, and those whose count over the node's life is
// a power of two, so that a later run is not silent.
func (n *Node) laneAcceptLoop(ln net.Listener) {
	defer n.wg.Done()
	var wait time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if n.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			first := wait == 0
			wait = min(max(2*wait, laneAcceptBackoff), laneAcceptMaxBackoff)
			if k := n.lane.acceptErrors.Add(1); first || floodLogged(k) {
				n.log.Warn("transfer: lane accept failed, accepting again after a wait", "err", err, "wait", wait, "errors", k)
			}
			t := time.NewTimer(wait)
			select {
			case <-n.ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		wait = 0
		// Counted (or refused) before a goroutine, a buffer or any TLS
		// work is spent on it.
		if err := n.lane.track(c); err != nil {
			c.Close()
			if errors.Is(err, ErrClosed) {
				return
			}
			continue
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			defer n.lane.forget(c)
			defer c.Close()
			n.serveLane(c)
		}()
	}
}

// laneServerTLS is serverTLS with the lane's ALPN.
func (n *Node) laneServerTLS() *tls.Config {
	c := n.serverTLS()
	c.NextProtos = []string{LaneALPN}
	return c
}

// serveLane runs one lane connection: handshake, hello, then reads.
func (n *Node) serveLane(raw net.Conn) {
	log := n.log.With("lane_addr", raw.RemoteAddr().String())
	// The handshake, the hello and the answer to it all within
	// LaneHelloTimeout: until admitted the connection holds a pending place.
	_ = raw.SetDeadline(time.Now().Add(n.cfg.LaneHelloTimeout))
	var c net.Conn = raw
	certName := ""
	var gc *gatherConn
	if !n.lane.plain {
		gc = newGatherConn(raw)
		tc := tls.Server(gc, n.laneServerTLS())
		if err := tc.Handshake(); err != nil {
			// Stalled and failed handshakes are what a flood makes: a few
			// lines at info, the rest at debug.
			level := slog.LevelDebug
			if k := n.lane.handshakeFails.Add(1); floodLogged(k) {
				level = slog.LevelInfo
			}
			log.Log(n.ctx, level, "transfer: lane handshake refused", "err", err)
			return
		}
		certName = peerName13(tc.ConnectionState())
		c = tc
	} else if tcp, ok := raw.(*net.TCPConn); ok {
		_ = tcp.SetNoDelay(true)
	}
	kind, payload, err := readFrame(c, laneHelloLimit)
	if err == nil && kind != methodLaneHello {
		err = fmt.Errorf("%w: first lane frame is of kind %d, not a hello", ErrFrame, kind)
	}
	var hello transferpb.LaneHello
	if err == nil {
		err = unmarshal(payload, &hello)
	}
	peer := hello.Node
	switch {
	case err != nil:
	case certName != "" && certName != peer:
		err = fmt.Errorf("%w: lane hello from %q, certificate names %q", ErrInvalidRequest, peer, certName)
	case !n.cfg.Members.IsMember(peer):
		err = fmt.Errorf("%w: %q", ErrNotMember, peer)
	default:
		err = n.lane.redeem(hello.Token, peer)
	}
	if err == nil {
		err = n.lane.admit(raw, peer)
	}
	if err != nil {
		level, k := slog.LevelDebug, n.stats.laneRefused.Add(1)
		if floodLogged(k) {
			level = slog.LevelInfo
		}
		log.Log(n.ctx, level, "transfer: lane connection refused", "claimed_peer", peer, "err", err, "refused", k)
		n.laneRefuse(c, err)
		return
	}
	if err := writeFrame(c, statusOK, &transferpb.LaneHello{Node: n.cfg.NodeName}, laneHelloLimit); err != nil {
		return
	}
	if gc != nil {
		gc.gather = true // an answer's records go out together, flushed at its end
	}
	flush := func() error {
		if gc == nil {
			return nil
		}
		return gc.Flush()
	}
	log = log.With("peer", peer)
	for {
		// The next request must arrive, whole, within the idle timeout.
		_ = c.SetDeadline(time.Now().Add(n.cfg.LaneIdleTimeout))
		kind, payload, err := readFrame(c, n.cfg.MaxMessageSize)
		if err != nil {
			return
		}
		if n.ctx.Err() != nil {
			return
		}
		n.stats.streams.Add(1)
		var req *request
		if method(kind) != methodRead {
			err = fmt.Errorf("%w: lane carries reads only, not %s", ErrInvalidRequest, method(kind))
		} else {
			req, err = decodeRequest(methodRead, payload, n.cfg.MaxSegments) // at most MaxLaneReadBytes
		}
		if err == nil && !n.cfg.Members.IsMember(peer) {
			err = fmt.Errorf("%w: %q", ErrNotMember, peer)
		}
		if err == nil && n.cfg.Handler == nil {
			err = fmt.Errorf("%w: node %s serves no calls", ErrUnavailable, n.cfg.NodeName)
		}
		var src readSource
		if err == nil {
			src, err = n.checkRead(peer, req)
		}
		_ = c.SetWriteDeadline(n.progressDeadline())
		if err != nil {
			n.stats.callsFailed.Add(1)
			log.Debug("transfer: lane read refused", "err", err)
			if n.laneRefuse(c, err) != nil || flush() != nil || errors.Is(err, ErrNotMember) {
				return
			}
			continue
		}
		err = n.writeRead(c, src, req)
		if err == nil {
			err = flush()
		}
		if err != nil {
			// Mid-answer: the connection cannot carry another.
			n.stats.callsFailed.Add(1)
			log.Debug("transfer: lane read failed", "lease", req.leaseID, "err", err)
			return
		}
		n.served(req, &n.stats.bytesServedLane)
	}
}

// laneRefuse answers a refused request (or hello) with an Error frame.
func (n *Node) laneRefuse(w deadlineWriter, err error) error {
	return writeFrame(w, statusError, &transferpb.Error{Code: uint32(codeOf(err)), Message: errorMessage(err.Error())}, n.cfg.MaxMessageSize)
}

// peerName13 is the common name of a TLS connection's verified peer.
func peerName13(cs tls.ConnectionState) string {
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return cs.PeerCertificates[0].Subject.CommonName
}

// laneClientTLS is clientTLS with the lane's ALPN.
func (n *Node) laneClientTLS(peer string) *tls.Config {
	c := n.clientTLS(peer)
	c.NextProtos = []string{LaneALPN}
	return c
}

// laneWatch ties a lane connection's deadlines to ctx: once ctx ends
// (cancelled, or past its deadline) both deadlines are in the past and stay
// there, so that a read or write blocked on the connection, or one started
// later, returns at once. Every deadline the read path sets while the
// watch runs goes through it, under its lock, so that none set from a
// check made before the cancel can land after the cancel's and undo it.
type laneWatch struct {
	c    net.Conn
	stop func() bool

	mu    sync.Mutex
	ended bool // ctx ended: the deadlines are in the past for good
}

// watchLane starts a watch of ctx over c.
func watchLane(ctx context.Context, c net.Conn) *laneWatch {
	w := &laneWatch{c: c}
	w.stop = context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.ended = true
		_ = c.SetDeadline(time.Unix(1, 0))
	})
	return w
}

// done ends the watch. false means ctx ended first: the connection's
// deadlines are in the past (or about to be), and it cannot be reused.
func (w *laneWatch) done() bool { return w.stop() }

// setDeadline, setReadDeadline and setWriteDeadline set c's deadlines
// unless ctx has ended.
func (w *laneWatch) setDeadline(t time.Time)      { w.set(t, w.c.SetDeadline) }
func (w *laneWatch) setReadDeadline(t time.Time)  { w.set(t, w.c.SetReadDeadline) }
func (w *laneWatch) setWriteDeadline(t time.Time) { w.set(t, w.c.SetWriteDeadline) }

func (w *laneWatch) set(t time.Time, f func(time.Time) error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.ended {
		_ = f(t)
	}
}

// laneGather is how many bytes of TLS records a holder's lane connection
// gathers into one write to the socket while it answers a read: a record
// carries at most 16 KiB, and crypto/tls writes each one with a system
// call of its own, which on the reader's side is a wake-up of its own.
const laneGather = 256 << 10

// gatherConn is a holder's TCP connection under TLS that, once gather is
// on (after the handshake, whose messages must go out as they are
// written), gathers the records written to it into laneGather-byte writes
// until Flush.
type gatherConn struct {
	net.Conn
	w      *bufio.Writer
	gather bool
}

func newGatherConn(c net.Conn) *gatherConn {
	return &gatherConn{Conn: c, w: bufio.NewWriterSize(c, laneGather)}
}

func (g *gatherConn) Write(p []byte) (int, error) {
	if !g.gather {
		return g.Conn.Write(p)
	}
	return g.w.Write(p)
}

// Flush writes what was gathered.
func (g *gatherConn) Flush() error { return g.w.Flush() }
