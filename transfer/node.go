package transfer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// Node is one kvfabric peer endpoint: a QUIC listener that serves the
// Handler to other members, and a dialer that makes [Peer]s. It is safe for
// concurrent use.
type Node struct {
	cfg  Config
	log  *slog.Logger
	qcfg *quic.Config

	listenTr *quic.Transport // nil for a dial-only node
	listener *quic.Listener
	dialTrs  []*quic.Transport // one per connection slot

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[*quic.Conn]struct{} // accepted and dialed, to close on Close
	// accepted counts each peer's open accepted connections, for
	// Config.PeerGone.
	accepted map[string]int
	budgets  map[string]*requestBudget
	ident    atomic.Pointer[identity] // the certificate and CAs of new handshakes
	stats    counters
	closeMu  sync.Once
	// rdma is the node's RDMA side; nil when Config.RDMA is.
	rdma *rdmaNode
	// guard bounds incoming handshakes and connections (handshake_guard.go).
	guard *handshakeGuard
	// lane is the TCP lane served; nil without Config.LaneAddr.
	lane *laneServer
	// noLaneReads is Config.NoLaneReads, changed by SetLaneReads.
	noLaneReads atomic.Bool
}

// NewNode validates cfg, opens its sockets and starts serving.
func NewNode(cfg Config) (*Node, error) {
	cfg, err := cfg.populate()
	if err != nil {
		return nil, err
	}
	n := &Node{cfg: cfg, log: cfg.Logger.With("node", cfg.NodeName), conns: map[*quic.Conn]struct{}{},
		accepted: map[string]int{}, budgets: map[string]*requestBudget{}}
	n.ident.Store(&identity{cert: cfg.Certificate, cas: cfg.CAs})
	n.noLaneReads.Store(cfg.NoLaneReads)
	if cfg.RDMA != nil {
		n.rdma = &rdmaNode{cfg: *cfg.RDMA, fallback: map[string]uint64{},
			nicBytes: make([]atomic.Uint64, max(len(cfg.RDMA.Devices), 1))}
		if cfg.RDMA.OFI != nil {
			n.rdma.tp = newOFITransport(n, cfg.RDMA.OFI)
		} else {
			n.rdma.tp = newVerbsTransport(n)
		}
	}
	n.ctx, n.cancel = context.WithCancel(context.Background())
	n.qcfg = cfg.quicConfig()
	fail := func(err error) (*Node, error) {
		n.Close()
		return nil, err
	}
	if cfg.ListenAddr != "" {
		ua, err := net.ResolveUDPAddr("udp", cfg.ListenAddr)
		if err != nil {
			return fail(fmt.Errorf("transfer: listen address %q: %w", cfg.ListenAddr, err))
		}
		uc, err := net.ListenUDP("udp", ua)
		if err != nil {
			return fail(fmt.Errorf("transfer: listen on %s: %w", cfg.ListenAddr, err))
		}
		tuneUDPBuffers(uc, n.log)
		n.guard = newHandshakeGuard(cfg, n.log)
		n.listenTr = &quic.Transport{Conn: uc, ConnContext: n.guard.connContext, VerifySourceAddress: n.guard.verifySource}
		ln, err := n.listenTr.Listen(n.serverTLS(), n.qcfg)
		if err != nil {
			uc.Close()
			n.listenTr = nil
			return fail(fmt.Errorf("transfer: listen on %s: %w", cfg.ListenAddr, err))
		}
		n.listener = ln
		n.wg.Add(1)
		go n.acceptLoop()
	}
	if cfg.LaneAddr != "" {
		if err := n.startLane(); err != nil {
			return fail(err)
		}
	}
	// Dial sockets bind the listener's IP, so that peers see connections
	// come from the address this node is known by (loopback tests give
	// each node its own 127.0.0.x).
	var bindIP net.IP // unspecified: dual-stack, any address
	if n.listener != nil {
		if ip := n.listener.Addr().(*net.UDPAddr).IP; !ip.IsUnspecified() {
			bindIP = ip
		}
	}
	for i := 0; i < cfg.ConnsPerPeer; i++ {
		uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: bindIP})
		if err != nil {
			return fail(fmt.Errorf("transfer: open dial socket: %w", err))
		}
		tuneUDPBuffers(uc, n.log)
		n.dialTrs = append(n.dialTrs, &quic.Transport{Conn: uc})
	}
	return n, nil
}

// Addr returns the address the node listens on, or nil for a dial-only
// node.
func (n *Node) Addr() net.Addr {
	if n.listener == nil {
		return nil
	}
	return n.listener.Addr()
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.NodeName }

// Close stops serving, closes every connection and socket, and returns
// after the node's goroutines have exited. It is safe to call twice.
func (n *Node) Close() error {
	n.closeMu.Do(func() {
		n.mu.Lock()
		n.closed = true
		conns := n.conns
		n.conns = nil
		n.mu.Unlock()
		n.cancel()
		if n.listener != nil {
			n.listener.Close()
		}
		for c := range conns {
			c.CloseWithError(connErrClosing, "node closing")
		}
		if n.listenTr != nil {
			n.listenTr.Close()
		}
		n.closeLane()
		for _, t := range n.dialTrs {
			t.Close()
		}
		n.wg.Wait()
		n.closeRDMA()
	})
	return nil
}

// track registers a connection to close on Close; false means the node
// is already closed and the caller must close c.
func (n *Node) track(c *quic.Conn) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return false
	}
	n.conns[c] = struct{}{}
	// Forget a connection once it is gone, whoever closed it.
	context.AfterFunc(c.Context(), func() { n.untrack(c) })
	return true
}

func (n *Node) untrack(c *quic.Conn) {
	n.mu.Lock()
	if n.conns != nil {
		delete(n.conns, c)
	}
	n.mu.Unlock()
}

func (n *Node) acceptLoop() {
	defer n.wg.Done()
	for {
		c, err := n.listener.Accept(n.ctx)
		if err != nil {
			if n.ctx.Err() == nil && !errors.Is(err, quic.ErrServerClosed) {
				n.log.Warn("transfer: accept", "err", err)
			}
			return
		}
		handshakeDone(c.Context())
		if !n.track(c) {
			c.CloseWithError(connErrClosing, "node closing")
			return
		}
		n.wg.Add(1)
		go n.serveConn(c)
	}
}

// peerName is the verified node name of a connection's peer.
func peerName(c *quic.Conn) string {
	cs := c.ConnectionState().TLS
	if len(cs.PeerCertificates) == 0 {
		return ""
	}
	return cs.PeerCertificates[0].Subject.CommonName
}

func (n *Node) serveConn(c *quic.Conn) {
	defer n.wg.Done()
	defer n.untrack(c)
	peer := peerName(c)
	n.peerConnOpened(peer)
	defer n.peerConnClosed(peer)
	log := n.log.With("peer", peer, "addr", c.RemoteAddr().String())
	for {
		s, err := c.AcceptStream(n.ctx)
		if err != nil {
			return
		}
		// Membership can end while a connection lives: check on every
		// call, and drop the connection of a node that left.
		if !n.cfg.Members.IsMember(peer) {
			log.Info("transfer: closing connection of a node that is no longer a member")
			s.CancelRead(streamErrCancelled)
			s.CancelWrite(streamErrCancelled)
			c.CloseWithError(connErrNotMember, "not a current member")
			return
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			n.serveStream(c.Context(), s, peer, log)
		}()
	}
}

func (n *Node) peerConnOpened(peer string) {
	n.mu.Lock()
	n.accepted[peer]++
	n.mu.Unlock()
}

// peerConnClosed counts an accepted connection of peer out, and tells
// Config.PeerGone when it was the peer's last. A node that is closing
// tells nobody: everything it served ends with it.
func (n *Node) peerConnClosed(peer string) {
	n.mu.Lock()
	n.accepted[peer]--
	last := n.accepted[peer] == 0
	if last {
		delete(n.accepted, peer)
	}
	closing := n.closed
	n.mu.Unlock()
	if last && !closing {
		// Its queue pairs serve nothing now: a reader that comes back
		// connects new ones.
		n.dropServed(peer)
	}
	if last && !closing && n.cfg.PeerGone != nil {
		n.cfg.PeerGone(peer)
	}
}

// progressDeadline returns a deadline ProgressTimeout from now.
func (n *Node) progressDeadline() time.Time { return time.Now().Add(n.cfg.ProgressTimeout) }
