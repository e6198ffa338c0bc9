package fabric

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvfabric/kvfabric/transfer"
)

// peers keeps one transfer.Peer per member, so that imports and repairs
// reuse its connections (and its cap on streams in flight) instead of
// handshaking anew, and so that connections end when the member does.
type peers struct {
	mu sync.Mutex
	m  map[string]*peerEntry
	// report, if set, is told every dial's outcome; it must not block.
	report func(name string, err error)
}

type peerEntry struct {
	addr string
	mu   sync.Mutex // serializes the dial
	p    *transfer.Peer
	gone bool // closed: forgotten or replaced, never to be dialed again
}

// get returns the peer called name at addr, dialing it on first use or
// when its address changed. A dial error is not cached.
func (ps *peers) get(ctx context.Context, n *transfer.Node, name, addr string) (*transfer.Peer, error) {
	ps.mu.Lock()
	if ps.m == nil {
		ps.m = map[string]*peerEntry{}
	}
	e := ps.m[name]
	if e == nil || e.addr != addr {
		if e != nil {
			go closePeer(e)
		}
		e = &peerEntry{addr: addr}
		ps.m[name] = e
	}
	ps.mu.Unlock()

	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gone {
		// Forgotten between the look-up and now: a dial would leak.
		return nil, fmt.Errorf("fabric: peer %s left the cluster", name)
	}
	if e.p != nil {
		return e.p, nil
	}
	p, err := n.Peer(ctx, addr, name)
	if ps.report != nil {
		ps.report(name, err)
	}
	if err != nil {
		return nil, err
	}
	e.p = p
	return p, nil
}

// forget closes and drops the peer called name: it left or failed. It
// does not block (membership calls it).
func (ps *peers) forget(name string) {
	ps.mu.Lock()
	e := ps.m[name]
	delete(ps.m, name)
	ps.mu.Unlock()
	if e != nil {
		go closePeer(e)
	}
}

// closeAll closes every peer, for the agent's Close.
func (ps *peers) closeAll() {
	ps.mu.Lock()
	m := ps.m
	ps.m = nil
	ps.mu.Unlock()
	for _, e := range m {
		closePeer(e)
	}
}

func closePeer(e *peerEntry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gone = true
	if e.p != nil {
		e.p.Close()
		e.p = nil
	}
}
