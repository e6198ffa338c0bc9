package transfer

// The binding a node's remote memory reads run on. readRDMA (the leases'
// keys, backoff, the destination's registration, the holder's regions
// checked against the plan, groups by device pair and lanes, fallback and
// counters) is the same whatever moves the bytes; an rmaTransport moves one
// group's bytes and keeps what it needs for it (connections per peer,
// connections served).

import (
	"context"

	"github.com/kvfabric/kvfabric/layout"
)

// rmaTransport is a binding for remote memory reads: libibverbs' RC queue
// pairs (verbsTransport), or another.
type rmaTransport interface {
	// newPeer returns the state reads from one peer keep (their
	// connections to it).
	newPeer(p *Peer) rmaPeer
	// remote returns what a reader puts in its reads to reach addr, inside
	// the registration reg: the address the holder's NIC knows it by, and
	// the region's key.
	remote(reg registration, addr uint64) (raddr, key uint64)
	// servedConns counts the connections peers read from this node on.
	servedConns() int
	// dropServed releases what this node serves peer (its connections
	// closed, or it left).
	dropServed(peer string)
	// close releases everything served; the node is closing.
	close()
}

// rmaPeer is an rmaTransport's state for reads from one peer.
type rmaPeer interface {
	// read moves segs, n bytes all between this node's device k.local and
	// the holder's k.remote, from the holder's regions into dst; locals[r]
	// is the registration that holds dst[r] (unset where dst[r] is empty).
	// The caller checked every segment against dst and regions. An error
	// in the result means the read was tried and failed, and nothing of it
	// writes into dst any more; a fallback, that it was not tried.
	read(ctx context.Context, leaseID uint64, k nicPair, segs []layout.Segment, n uint64, regions []remoteRegion, dst []Span, locals []registration) groupRead
	// close releases the connections to the peer (those in use when their
	// read ends); reads waiting for one end with ErrClosed.
	close()
}

// memRegion is memory registered with a binding.
type memRegion interface {
	// Addr is where the memory starts in this process.
	Addr() uint64
	// Len is its length in bytes.
	Len() uint64
	// Close ends the registration.
	Close() error
}
