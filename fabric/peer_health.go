package fabric

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/kvfabric/kvfabric/transfer"
)

// How the agent checks that it can reach and authenticate to its members
// over the peer transport, so that a node whose certificate comes from
// another CA (or whose peer port is blocked) says so in status, metrics
// and readiness instead of joining gossip and never importing anything.
const (
	// peerCheckInterval is how often members not yet dialed are dialed.
	peerCheckInterval = 500 * time.Millisecond
	// peerRecheck is how long after a failed dial a member is dialed again
	// by the check (imports and repairs dial it whenever they need it).
	peerRecheck = 5 * time.Second
)

// peerLink is what this node knows of its peer connection to one member.
type peerLink struct {
	// Reachable: the member answered a handshake (authenticated or not).
	Reachable bool
	// Authenticated: the last dial completed the mutual TLS handshake.
	Authenticated bool
	// LastError is the last dial's error, "" after a success.
	LastError string
	// At is when the last dial ended.
	At time.Time

	checking bool
}

// peerHealth records every dial's outcome per member. Safe for concurrent
// use.
type peerHealth struct {
	mu    sync.Mutex
	links map[string]*peerLink

	authFailures, dialFailures atomic.Uint64
}

// isAuthError says whether a dial failed authentication: a certificate
// that does not verify (another CA, expired, another name), a TLS alert
// from the other side, or a valid certificate of a node that is not a
// member.
func isAuthError(err error) bool {
	var cv *tls.CertificateVerificationError
	var te *quic.TransportError
	return errors.As(err, &cv) || (errors.As(err, &te) && te.ErrorCode.IsCryptoError()) || errors.Is(err, transfer.ErrNotMember)
}

// record notes a dial of name that ended with err.
func (h *peerHealth) record(name string, err error) {
	auth := err != nil && isAuthError(err)
	if err != nil && !errors.Is(err, context.Canceled) {
		h.dialFailures.Add(1)
		if auth {
			h.authFailures.Add(1)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.links == nil {
		h.links = map[string]*peerLink{}
	}
	l := h.links[name]
	if l == nil {
		l = &peerLink{}
		h.links[name] = l
	}
	l.At = time.Now()
	switch {
	case err == nil:
		l.Reachable, l.Authenticated, l.LastError = true, true, ""
	case errors.Is(err, context.Canceled):
		// The caller gave up: says nothing of the peer.
	default:
		l.Reachable, l.Authenticated, l.LastError = auth, false, err.Error()
	}
}

func (h *peerHealth) forget(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.links, name)
}

// link returns a copy of what is known of name.
func (h *peerHealth) link(name string) (peerLink, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l, ok := h.links[name]
	if !ok {
		return peerLink{}, false
	}
	return *l, true
}

// startCheck marks name as being dialed by the check, if it is due: never
// dialed, or failed more than peerRecheck ago.
func (h *peerHealth) startCheck(name string, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.links == nil {
		h.links = map[string]*peerLink{}
	}
	l := h.links[name]
	if l == nil {
		l = &peerLink{}
		h.links[name] = l
	}
	if l.checking || l.Authenticated || (!l.At.IsZero() && now.Sub(l.At) < peerRecheck) {
		return false
	}
	l.checking = true
	return true
}

func (h *peerHealth) endCheck(name string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.links[name]; l != nil {
		l.checking = false
	}
}

// peerCheckLoop dials every member this node has not authenticated to,
// so that an authentication failure shows before any import needs the
// member.
func (a *Agent) peerCheckLoop() {
	defer a.wg.Done()
	t := time.NewTicker(peerCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-a.done:
			return
		case <-t.C:
		}
		now := time.Now()
		for _, m := range a.members.Members() {
			if m.Name == a.cfg.NodeName || m.Meta.PeerAddr == "" || !a.health.startCheck(m.Name, now) {
				continue
			}
			a.background(func() {
				defer a.health.endCheck(m.Name)
				ctx, cancel := context.WithTimeout(context.Background(), 2*a.cfg.PeerTimeout)
				defer cancel()
				go func() {
					select {
					case <-a.done:
						cancel()
					case <-ctx.Done():
					}
				}()
				if _, err := a.peers.get(ctx, a.transport, m.Name, m.Meta.PeerAddr); err != nil && isAuthError(err) {
					a.log.Warn("peer authentication failed: this node cannot import from it or serve it", "peer", m.Name,
						"peer_addr", m.Meta.PeerAddr, "err", err)
				}
			})
		}
	}
}

// peersNotReady says why the node cannot serve engines as a member of its
// cluster, "" if it can: other members exist but it has authenticated to
// none of them.
func (a *Agent) peersNotReady() string {
	others, authed := 0, 0
	var lastErr string
	for _, m := range a.members.Members() {
		if m.Name == a.cfg.NodeName || m.Meta.PeerAddr == "" {
			continue
		}
		others++
		if l, ok := a.health.link(m.Name); ok {
			if l.Authenticated {
				authed++
			} else if l.LastError != "" {
				lastErr = l.LastError
			}
		}
	}
	switch {
	case others == 0 || authed > 0:
		return ""
	case lastErr != "":
		return fmt.Sprintf("cannot authenticate to or reach any peer (%d members); last error: %s", others, lastErr)
	}
	return fmt.Sprintf("no peer authenticated yet (%d members)", others)
}
