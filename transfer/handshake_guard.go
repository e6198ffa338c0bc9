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
	maxHS, maxHSPerSource, maxConns, maxConnsPerSource int
	log                                                *slog.Logger

	mu         sync.Mutex
	hs, conns  int
	hsBy       map[netip.Addr]int
	connsBy    map[netip.Addr]int
	peakHS     int
	refused    atomic.Uint64
	validation atomic.Uint64
}

func newHandshakeGuard(c Config, log *slog.Logger) *handshakeGuard {
	return &handshakeGuard{maxHS: c.MaxHandshakes, maxHSPerSource: c.MaxHandshakesPerSource, maxConns: c.MaxConns,
		maxConnsPerSource: c.MaxConnsPerSource, log: log, hsBy: map[netip.Addr]int{}, connsBy: map[netip.Addr]int{}}
}

func sourceOf(a net.Addr) netip.Addr {
	if ua, ok := a.(*net.UDPAddr); ok {
		ap := ua.AddrPort()
		return ap.Addr().Unmap()
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
	busy := g.hs >= max(1, g.maxHS/4)
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
	case g.hsBy[src] >= g.maxHSPerSource, g.hs >= g.maxHS, g.connsBy[src] >= g.maxConnsPerSource, g.conns >= g.maxConns:
		hs, conns := g.hsBy[src], g.connsBy[src]
		g.mu.Unlock()
		if n := g.refused.Add(1); n&(n-1) == 0 { // the 1st, 2nd, 4th, 8th...: a flood logs a few lines
			g.log.Warn("transfer: connection refused: too many handshakes or connections", "source", src.String(),
				"source_handshakes", hs, "source_conns", conns, "refused", n,
				"max_handshakes", g.maxHS, "max_handshakes_per_source", g.maxHSPerSource)
		}
		return nil, errHandshakeRefused
	}
	g.hs++
	g.hsBy[src]++
	g.conns++
	g.connsBy[src]++
	g.peakHS = max(g.peakHS, g.hs)
	g.mu.Unlock()
	var hsOnce, connOnce sync.Once
	endHS := func() {
		hsOnce.Do(func() {
			g.mu.Lock()
			g.hs--
			if g.hsBy[src]--; g.hsBy[src] <= 0 {
				delete(g.hsBy, src)
			}
			g.mu.Unlock()
		})
	}
	context.AfterFunc(ctx, func() {
		endHS()
		connOnce.Do(func() {
			g.mu.Lock()
			g.conns--
			if g.connsBy[src]--; g.connsBy[src] <= 0 {
				delete(g.connsBy, src)
			}
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
	return g.hs, g.peakHS, g.conns, g.refused.Load(), g.validation.Load()
}
