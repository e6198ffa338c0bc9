package transfer

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
)

// Defaults of the bounds on incoming connections (Config.MaxHandshakes and
// the rest). A peer dials ConnsPerPeer connections and redials one that
// drops, so a member needs a handful; anything near the bounds is a flood.
const (
	DefaultMaxHandshakes          = 256
	DefaultMaxHandshakesPerSource = 16
	DefaultMaxConns               = 4096
	DefaultMaxConnsPerSource      = 64
)

// errHandshakeRefused is what the guard answers a connection it refuses;
// quic-go closes it with CONNECTION_REFUSED.
var errHandshakeRefused = errors.New("transfer: too many handshakes or connections")

// handshakeGuard bounds incoming connections: those still handshaking and
// all of them, in total and per source address. Handshakes are cheap to
// start (one Initial packet) and costly to hold (TLS state, a connection's
// buffers until HandshakeTimeout), so an unauthenticated flood is refused
// at the first packet once over the bounds, and past a quarter of
// MaxHandshakes new sources must prove their address (a Retry round trip)
// before any state is kept for them.
type handshakeGuard struct {
	log *slog.Logger

	mu         sync.Mutex
	hs, conns  sourceCount
	peakHS     int
	refused    atomic.Uint64
	validation atomic.Uint64
}

func newHandshakeGuard(c Config, log *slog.Logger) *handshakeGuard {
	return &handshakeGuard{log: log, hs: newSourceCount(c.MaxHandshakes, c.MaxHandshakesPerSource),
		conns: newSourceCount(c.MaxConns, c.MaxConnsPerSource)}
}

// sourceCount counts things a source holds on this node (handshakes,
// connections) in total and by source address, against a bound on each;
// its owner's lock guards it. The handshake guard counts QUIC handshakes
// and connections with it, the lane its connections not yet admitted.
type sourceCount struct {
	max, maxPerSource int
	n                 int
	by                map[netip.Addr]int
}

func newSourceCount(max, maxPerSource int) sourceCount {
	return sourceCount{max: max, maxPerSource: maxPerSource, by: map[netip.Addr]int{}}
}

// full says whether one more from src would pass a bound.
func (s *sourceCount) full(src netip.Addr) bool {
	return s.by[src] >= s.maxPerSource || s.n >= s.max
}

func (s *sourceCount) add(src netip.Addr) {
	s.n++
	s.by[src]++
}

func (s *sourceCount) remove(src netip.Addr) {
	s.n--
	if s.by[src]--; s.by[src] <= 0 {
		delete(s.by, src)
	}
}

// floodLogged says whether the nth refusal of a flood is logged: the 1st,
// 2nd, 4th, 8th..., so that a flood writes a few lines.
func floodLogged(n uint64) bool { return n&(n-1) == 0 }

// sourceOf is the IP address of a UDP or TCP remote address.
func sourceOf(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// verifySource is quic-go's VerifySourceAddress: under load, ask for a
// Retry before keeping state for a handshake.
func (g *handshakeGuard) verifySource(net.Addr) bool {
	g.mu.Lock()
	busy := g.hs.n >= max(1, g.hs.max/4)
	g.mu.Unlock()
	if busy {
		g.validation.Add(1)
	}
	return busy
}

type guardKey struct{}

// connContext is quic-go's ConnContext: it admits a new connection or
// refuses it. What it admits is released when the connection ends; its
// handshake slot also when handshakeDone is called.
func (g *handshakeGuard) connContext(ctx context.Context, info *quic.ClientInfo) (context.Context, error) {
	src := sourceOf(info.RemoteAddr)
	g.mu.Lock()
	switch {
	case g.hs.full(src), g.conns.full(src):
		hs, conns := g.hs.by[src], g.conns.by[src]
		g.mu.Unlock()
		if n := g.refused.Add(1); floodLogged(n) {
			g.log.Warn("transfer: connection refused: too many handshakes or connections", "source", src.String(),
				"source_handshakes", hs, "source_conns", conns, "refused", n,
				"max_handshakes", g.hs.max, "max_handshakes_per_source", g.hs.maxPerSource)
		}
		return nil, errHandshakeRefused
	}
	g.hs.add(src)
	g.conns.add(src)
	g.peakHS = max(g.peakHS, g.hs.n)
	g.mu.Unlock()
	var hsOnce, connOnce sync.Once
	endHS := func() {
		hsOnce.Do(func() {
			g.mu.Lock()
			g.hs.remove(src)
			g.mu.Unlock()
		})
	}
	context.AfterFunc(ctx, func() {
		endHS()
		connOnce.Do(func() {
			g.mu.Lock()
			g.conns.remove(src)
			g.mu.Unlock()
		})
	})
	return context.WithValue(ctx, guardKey{}, endHS), nil
}

// handshakeDone releases an accepted connection's handshake slot.
func handshakeDone(ctx context.Context) {
	if f, ok := ctx.Value(guardKey{}).(func()); ok {
		f()
	}
}

// snapshot returns handshakes in progress, their peak, connections, and
// the connections refused and asked to validate their address.
func (g *handshakeGuard) snapshot() (hs, peak, conns int, refused, validations uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.hs.n, g.peakHS, g.conns.n, g.refused.Load(), g.validation.Load()
}
