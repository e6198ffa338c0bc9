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
	mu     sync.Mutex
	m      map[string]*peerEntry
	closed bool           // closeAll has run: nothing is dialed any more
	wg     sync.WaitGroup // closes in flight, waited for by closeAll
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
	if ps.closed {
		ps.mu.Unlock()
		return nil, fmt.Errorf("fabric: peer %s: the agent is closed", name)
	}
	if ps.m == nil {
		ps.m = map[string]*peerEntry{}
	}
	e := ps.m[name]
	if e == nil || e.addr != addr {
		if e != nil {
			// A new address is a new process: the old one is gone.
			ps.wg.Go(func() { closePeer(e, transfer.ClosePeerFailed) })
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

// forget closes and drops the peer called name, for why: it left or
// failed. It does not block (membership calls it).
func (ps *peers) forget(name string, why transfer.CloseReason) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	e := ps.m[name]
	delete(ps.m, name)
	if e != nil {
		// Under ps.mu, so that closeAll's Wait sees the Add.
		ps.wg.Go(func() { closePeer(e, why) })
	}
}

// closeAll closes every peer, for the agent's Close, and returns once the
// closes that forget and get started have finished too.
func (ps *peers) closeAll() {
	ps.mu.Lock()
	m := ps.m
	ps.m, ps.closed = nil, true
	ps.mu.Unlock()
	for _, e := range m {
		closePeer(e, transfer.CloseLocal)
	}
	ps.wg.Wait()
}

func closePeer(e *peerEntry, why transfer.CloseReason) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.gone = true
	if e.p != nil {
		e.p.CloseFor(why)
		e.p = nil
	}
}
