package transfer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/kvfabric/kvfabric/transfer/certs"
)

// ALPN is the application protocol every kvfabric peer connection speaks.
const ALPN = "kvfabric/1"

// ProtocolVersion is the version of the call set this package speaks.
const ProtocolVersion = 1

// Config configures a [Node]. The zero value of every field but NodeName,
// TLS and Members (and Handler, for a node that serves) means the default
// that its comment names.
type Config struct {
	// NodeName is this node's name; its certificate must name it.
	NodeName string
	// ListenAddr is the UDP address to listen on ("127.0.0.1:0" picks a
	// port). If empty, the node only dials.
	ListenAddr string

	// Certificate is this node's certificate and key, signed by the CA.
	Certificate tls.Certificate
	// CAs verifies peers' certificates; usually the one cluster CA.
	CAs *x509.CertPool
	// Members says which node names are current members. Required: a node
	// that trusts every holder of a CA-signed certificate would keep
	// serving nodes that left the cluster.
	Members Members
	// Handler serves calls from peers. If nil, the node refuses every
	// call with CodeUnavailable (a dial-only node).
	Handler Handler
	// PeerGone, if set, is called with a peer's node name when the last
	// connection that peer opened to this node has closed (the peer
	// closed it, went silent past IdleTimeout, or was refused as no longer
	// a member), so that what the peer held here can end at once. Called
	// from the connection's goroutine: it must not block.
	PeerGone func(peer string)
	// RDMA, if set, moves reads over RDMA to peers that offer it (see
	// RDMAConfig); nil: every read goes over QUIC. The config is copied.
	RDMA *RDMAConfig
	// Logger receives warnings (UDP buffers) and per-connection errors.
	// If nil, slog.Default().
	Logger *slog.Logger

	// ConnsPerPeer is the number of QUIC connections opened to each peer;
	// reads spread their streams over them. If zero, 4: on loopback one
	// connection is bound by one core's packet processing.
	ConnsPerPeer int
	// StreamsPerConn is the number of concurrent streams a read uses on
	// each connection. If zero, 2.
	StreamsPerConn int
	// MinStreamBytes is the smallest part a read is split into: a read of
	// fewer bytes uses one stream. A stream costs a round trip and a
	// flow-control ramp, so parts much smaller than a few MiB gain nothing
	// from their own. If zero, 4 MiB.
	MinStreamBytes uint64

	// StreamReceiveWindow is the largest per-stream flow-control window
	// (quic-go starts at a quarter of it and grows it). If zero, 16 MiB.
	StreamReceiveWindow uint64
	// ConnReceiveWindow is the largest per-connection flow-control window.
	// If zero, 4 × StreamReceiveWindow.
	ConnReceiveWindow uint64

	// HandshakeTimeout bounds connection setup. If zero, 5 s.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection that received nothing for this long.
	// Keep-alives go out every IdleTimeout/3. If zero, 15 s.
	IdleTimeout time.Duration
	// CallTimeout bounds every control call; the caller's context may end
	// it sooner. If zero, 10 s.
	CallTimeout time.Duration
	// ProgressTimeout fails a read stream on which no byte moved for this
	// long, and a holder's write to a reader that stopped reading. If
	// zero, 5 s.
	ProgressTimeout time.Duration

	// MaxMessageSize caps a request or response frame's payload. If zero,
	// 4 MiB.
	MaxMessageSize uint32
	// MaxPeerRequestBytes caps the request bytes one peer may have in
	// flight to this node, across its connections and streams: each
	// request frame counts its announced length, from its header until it
	// is decoded (the buffer itself grows only with the bytes that
	// arrive). A request that would pass it waits, before its payload is
	// read, for the peer's others to finish, and is refused with
	// CodeUnavailable if it is not let in within ProgressTimeout of its
	// stream opening (its whole frame must arrive within that time too).
	// Any request up to MaxMessageSize fits alone, so concurrent ones are
	// let in in turn, in arrival order. At least MaxMessageSize. If zero,
	// 4 × MaxMessageSize.
	MaxPeerRequestBytes uint64
	// MaxSegments caps the segments in one read request. If zero, 65536.
	MaxSegments int
	// MaxStreamsPerConn is how many concurrent calls a peer may run on one
	// connection to this node. If zero, 256.
	MaxStreamsPerConn int64

	// Bounds on incoming connections, against handshake floods from
	// sources that never authenticate: handshakes in progress at once, in
	// total and per source IP, and connections (handshaking or
	// established), in total and per source IP. A connection past one is
	// refused at its first packet (counted in Metrics.ConnsRefused);
	// with more than a quarter of MaxHandshakes in progress, new sources
	// must validate their address with a Retry first. If zero,
	// DefaultMaxHandshakes (256), DefaultMaxHandshakesPerSource (16),
	// DefaultMaxConns (4096) and DefaultMaxConnsPerSource (64).
	MaxHandshakes, MaxHandshakesPerSource int
	MaxConns, MaxConnsPerSource           int
	// LaneAddr is the TCP address this node serves reads on besides QUIC
	// (the lane: see lane.go); its port is given to readers with their
	// lane tokens. If empty, the node serves no lane and readers read it
	// over QUIC.
	LaneAddr string
	// LanePlain makes the lane plain TCP instead of TLS 1.3: for networks
	// that are private already. Connections are still authorized by
	// one-time tokens from the QUIC channel, but block data crosses the
	// network unencrypted; the node warns at start. Off by default.
	LanePlain bool
	// LaneConns is the most lane connections this node opens to one
	// holder; a read's parts are spread over them. 1..MaxLaneConns; if
	// zero, DefaultLaneConns.
	LaneConns int
	// NoLaneReads makes this node read every holder over QUIC (or RDMA)
	// even where the holder serves a lane.
	NoLaneReads bool
	// LaneIdleTimeout closes a served lane connection that brought no
	// request for this long. If zero, DefaultLaneIdleTimeout.
	LaneIdleTimeout time.Duration
	// LaneMaxPending and LaneMaxPendingPerSource bound the served lane
	// connections not yet admitted (TLS handshake and hello under way), in
	// total and per source IP, against floods of connections that never
	// authenticate: a connection past one is closed as soon as it is
	// accepted, before any TLS work (counted in
	// Metrics.LanePendingRefused). A connection leaves the count when its
	// hello is accepted or when it closes. A source is an IP address
	// alone (an IPv6 one in full): nodes behind one address (a NAT, SNAT)
	// share its bound. If zero,
	// DefaultLaneMaxPending and DefaultLaneMaxPendingPerSource.
	LaneMaxPending, LaneMaxPendingPerSource int
	// LaneHelloTimeout bounds a served lane connection's TLS handshake and
	// hello, and the answer to it, from its accept: one that has not sent
	// a good hello by then is closed. A reader bounds its own lane
	// connections by it too, from the dial to the holder's answer to its
	// hello, where it is less than HandshakeTimeout (laneDialBound), and
	// reads over QUIC past it. If zero, DefaultLaneHelloTimeout.
	LaneHelloTimeout time.Duration
}

// laneDialBound is how long a reader gives a lane connection from its dial
// to the holder's answer to its hello: the lesser of HandshakeTimeout and
// LaneHelloTimeout. The holder closes a connection that its own
// LaneHelloTimeout passed on since the accept, and the reader cannot know
// the holder's setting: it takes its own, which the nodes of a cluster
// share (DefaultLaneHelloTimeout where none is given), so that it gives up
// no later than the holder would close the connection, its clock having
// started before the holder's accept. A holder with a shorter setting
// closes the connection first, and the reader sees it closed
// (LaneFallbackConnect); one with a longer setting sees the reader close
// it first (LaneFallbackHelloTimeout on the reader).
func (c *Config) laneDialBound() time.Duration {
	return min(c.HandshakeTimeout, c.LaneHelloTimeout)
}

// DefaultConfig returns the defaults for a node on a real network. The
// caller fills NodeName, ListenAddr, Certificate, CAs, Members and Handler.
func DefaultConfig() Config {
	return Config{
		ConnsPerPeer:        4,
		StreamsPerConn:      2,
		MinStreamBytes:      4 << 20,
		StreamReceiveWindow: 16 << 20,
		ConnReceiveWindow:   64 << 20,
		HandshakeTimeout:    5 * time.Second,
		IdleTimeout:         15 * time.Second,
		CallTimeout:         10 * time.Second,
		ProgressTimeout:     5 * time.Second,
		MaxMessageSize:      4 << 20,
		MaxSegments:         1 << 16,
		MaxStreamsPerConn:   256,
	}
}

// DefaultLocalConfig returns defaults for nodes on one machine (tests,
// development clusters): shorter timeouts, so that failures show quickly.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.ListenAddr = "127.0.0.1:0"
	c.HandshakeTimeout = 2 * time.Second
	c.IdleTimeout = 5 * time.Second
	c.CallTimeout = 5 * time.Second
	c.ProgressTimeout = 2 * time.Second
	return c
}

// ErrConfig is matched by errors about an unusable Config.
var ErrConfig = errors.New("transfer: invalid config")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// populate fills defaults and validates; it returns a copy.
// QUICConfig returns the quic-go configuration a Node made from c uses:
// windows, timeouts, keep-alives and stream limits, zero fields taking
// their defaults. Benchmarks give it to bare quic-go baselines so that
// they run with the same settings.
func (c Config) QUICConfig() *quic.Config { return c.withDefaults().quicConfig() }

// quicConfig derives the quic-go configuration from a populated Config.
func (c Config) quicConfig() *quic.Config {
	return &quic.Config{
		HandshakeIdleTimeout:           c.HandshakeTimeout,
		MaxIdleTimeout:                 c.IdleTimeout,
		KeepAlivePeriod:                c.IdleTimeout / 3,
		InitialStreamReceiveWindow:     c.StreamReceiveWindow / 4,
		MaxStreamReceiveWindow:         c.StreamReceiveWindow,
		InitialConnectionReceiveWindow: c.ConnReceiveWindow / 4,
		MaxConnectionReceiveWindow:     c.ConnReceiveWindow,
		MaxIncomingStreams:             c.MaxStreamsPerConn,
		MaxIncomingUniStreams:          -1,
	}
}

// populate fills zero fields with defaults and validates.
func (c Config) populate() (Config, error) {
	c = c.withDefaults()
	if c.RDMA != nil {
		r := *c.RDMA
		if err := r.populate(); err != nil {
			return c, err
		}
		c.RDMA = &r
	}
	return c, c.validate()
}

// withDefaults fills the zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setInt(&c.ConnsPerPeer, d.ConnsPerPeer)
	setInt(&c.StreamsPerConn, d.StreamsPerConn)
	setInt(&c.MaxSegments, d.MaxSegments)
	setInt(&c.MaxHandshakes, DefaultMaxHandshakes)
	setInt(&c.MaxHandshakesPerSource, DefaultMaxHandshakesPerSource)
	setInt(&c.MaxConns, DefaultMaxConns)
	setInt(&c.MaxConnsPerSource, DefaultMaxConnsPerSource)
	if c.MinStreamBytes == 0 {
		c.MinStreamBytes = d.MinStreamBytes
	}
	if c.StreamReceiveWindow == 0 {
		c.StreamReceiveWindow = d.StreamReceiveWindow
	}
	if c.ConnReceiveWindow == 0 {
		c.ConnReceiveWindow = 4 * c.StreamReceiveWindow
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.HandshakeTimeout, d.HandshakeTimeout)
	setDur(&c.IdleTimeout, d.IdleTimeout)
	setDur(&c.CallTimeout, d.CallTimeout)
	setDur(&c.ProgressTimeout, d.ProgressTimeout)
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = d.MaxMessageSize
	}
	if c.MaxStreamsPerConn == 0 {
		c.MaxStreamsPerConn = d.MaxStreamsPerConn
	}
	setInt(&c.LaneConns, DefaultLaneConns)
	setDur(&c.LaneIdleTimeout, DefaultLaneIdleTimeout)
	setInt(&c.LaneMaxPending, DefaultLaneMaxPending)
	setInt(&c.LaneMaxPendingPerSource, DefaultLaneMaxPendingPerSource)
	setDur(&c.LaneHelloTimeout, DefaultLaneHelloTimeout)
	if c.MaxPeerRequestBytes == 0 {
		c.MaxPeerRequestBytes = 4 * uint64(c.MaxMessageSize)
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.NodeName == "":
		return configErr("NodeName is empty")
	case c.Certificate.Certificate == nil:
		return configErr("Certificate is empty")
	case c.CAs == nil:
		return configErr("CAs is nil")
	case c.Members == nil:
		return configErr("Members is nil")
	case c.ConnsPerPeer < 0 || c.ConnsPerPeer > 64:
		return configErr("ConnsPerPeer %d not in [1, 64]", c.ConnsPerPeer)
	case c.StreamsPerConn < 0 || int64(c.StreamsPerConn) > c.MaxStreamsPerConn:
		return configErr("StreamsPerConn %d not in [1, MaxStreamsPerConn]", c.StreamsPerConn)
	case c.MaxSegments < 0:
		return configErr("MaxSegments %d is negative", c.MaxSegments)
	case c.MaxStreamsPerConn < 0:
		return configErr("MaxStreamsPerConn %d is negative", c.MaxStreamsPerConn)
	case c.MaxMessageSize < 1<<10 || c.MaxMessageSize > 1<<30:
		return configErr("MaxMessageSize %d not in [1 KiB, 1 GiB]", c.MaxMessageSize)
	case c.MaxPeerRequestBytes < uint64(c.MaxMessageSize) || c.MaxPeerRequestBytes > 1<<40:
		return configErr("MaxPeerRequestBytes %d not in [MaxMessageSize %d, 1 TiB]", c.MaxPeerRequestBytes, c.MaxMessageSize)
	case c.LaneConns < 0 || c.LaneConns > MaxLaneConns:
		return configErr("LaneConns %d not in [1, %d]", c.LaneConns, MaxLaneConns)
	case c.LaneIdleTimeout < 0:
		return configErr("LaneIdleTimeout %v is negative", c.LaneIdleTimeout)
	case c.LaneMaxPending < 0 || c.LaneMaxPendingPerSource < 0:
		return configErr("negative bound on pending lane connections")
	case c.LaneHelloTimeout < 0:
		return configErr("LaneHelloTimeout %v is negative", c.LaneHelloTimeout)
	case c.LanePlain && c.LaneAddr == "":
		return configErr("LanePlain without LaneAddr")
	case c.HandshakeTimeout < 0 || c.IdleTimeout < 0 || c.CallTimeout < 0 || c.ProgressTimeout < 0:
		return configErr("negative timeout")
	case c.MaxHandshakes < 0 || c.MaxHandshakesPerSource < 0 || c.MaxConns < 0 || c.MaxConnsPerSource < 0:
		return configErr("negative connection bound")
	}
	return checkCertificate(c.Certificate, c.NodeName)
}

// checkCertificate refuses a certificate that does not name node: peers
// check that our certificate names the node they dialed and that hellos
// come from the name on it, so a certificate for another name would fail
// every call; refuse it where the cause is plain.
func checkCertificate(cert tls.Certificate, node string) error {
	if len(cert.Certificate) == 0 {
		return configErr("Certificate is empty")
	}
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return configErr("Certificate: %v", err)
		}
	}
	name, err := certs.NodeName(leaf)
	if err != nil {
		return configErr("Certificate: %v", err)
	}
	if name != node {
		return configErr("Certificate names %q, NodeName is %q", name, node)
	}
	return nil
}
