package transfer

// The binding a node's remote memory reads run on. readRDMA (the leases'
// keys, backoff, the destination's registration, the holder's regions
// checked against the plan, groups by device pair and lanes, fallback and
// counters) is the same whatever moves the bytes; an rmaTransport moves one
// group's bytes and keeps what it needs for it (connections per peer,
// connections served).

import (
	"context"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// rmaTransport is a binding for remote memory reads: libibverbs' RC queue
// pairs (verbsTransport), or another.
type rmaTransport interface {
	// newPeer returns the state reads from one peer keep (their
	// connections to it).
	newPeer(p *Peer) rmaPeer
	// kind names the binding on the wire (LeaseRequest.rma): empty for
	// libibverbs. A holder hands its regions only to readers of its kind.
	kind() string
	// region fills g's address and key for the span at addr inside the
	// registration reg, as a reader's reads name them.
	region(reg registration, addr uint64, g *transferpb.RdmaRegion)
	// answering holds off what would change the keys region gives (a
	// replacement of the binding's endpoint) until done is called: a
	// lease answer's regions and what answer adds are of one endpoint.
	answering() (done func())
	// answer adds what else a reader needs to a lease answer to peer that
	// carries regions: the lease is then served until it ends
	// (leaseEnded, dropServed) or its term passes. inlineAt is the lease
	// request's reads_inline_at: the endpoint name of this node's that the
	// reader's reads completed without this node's progress against.
	answer(peer string, inlineAt []byte, resp *transferpb.LeaseResponse)
	// leaseRenewed says a lease answer served to peer was renewed for d,
	// with the renewal's reads_inline_at.
	leaseRenewed(peer string, leaseID uint64, d time.Duration, inlineAt []byte)
	// leaseEnded says peer released a lease.
	leaseEnded(peer string, leaseID uint64)
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
	// regionKey is the key of a region a lease answer carried.
	regionKey(g *transferpb.RdmaRegion) uint64
	// answered takes what else a lease answer with regions carried; an
	// error means the answer is malformed.
	answered(resp *transferpb.LeaseResponse) error
	// readsInline is the holder's endpoint name that the last reads from
	// the peer completed within this node's own calls against, needing none
	// of the holder's progress (LeaseRequest.reads_inline_at); nil if they
	// did not, or not on the endpoint in use now.
	readsInline() []byte
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

// maxRMAKind bounds the binding name a lease request carries.
const maxRMAKind = 64
