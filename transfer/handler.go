package transfer

import (
	"context"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// Members says which node names are current cluster members. The agent
// implements it over its membership view. IsMember is called on every
// handshake and every incoming stream, concurrently, and must not block.
type Members interface {
	IsMember(name string) bool
}

// MemberFunc adapts a function to [Members].
type MemberFunc func(name string) bool

// IsMember calls f.
func (f MemberFunc) IsMember(name string) bool { return f(name) }

// HelloInfo is what each side says about itself in a hello.
type HelloInfo struct {
	// Node is the speaker's name; transfer fills it.
	Node string
	// Versions lists the protocol versions the speaker understands;
	// transfer fills it.
	Versions []uint32
	// Features names optional capabilities (for example "rdma").
	Features []string
	// LayoutSetDigest identifies the holder's current set of layouts.
	LayoutSetDigest []byte
}

// LayoutEntry is one serialized layout; Layout holds layoutpb bytes that
// the agent decodes and validates with the layout package.
type LayoutEntry struct {
	Digest   []byte
	BlockSet uint64
	Layout   []byte
}

// LeasedBlock is a lease's answer for one sequence hash.
type LeasedBlock struct {
	Hash uint64
	// Present is false when the holder does not have the block; the
	// other fields are then zero.
	Present    bool
	BlockSet   uint64
	Slot       uint64
	Generation uint64
	// Sum is the block's content checksum (layout.BlockSum), where the
	// holder took one (HasSum).
	Sum    uint64
	HasSum bool
}

// MismatchReporter is implemented by a Handler that takes readers' reports
// of leased blocks whose bytes did not match their checksums, carried by a
// release and passed on before the lease is released (the blocks are
// still pinned). hashes are at most MaxLeaseBlocks, unchecked: the handler
// checks them itself and acts only on blocks the lease holds (a peer names
// any hashes it likes). It may run past ctx, bounded by a limit of its own
// (fabric: the node's peer timeout, and the lease's leaving its book), since
// the server releases the lease as soon as it returns. Called
// concurrently.
type MismatchReporter interface {
	Mismatched(ctx context.Context, peer string, leaseID uint64, hashes []uint64)
}

// MaxLeaseBlocks is the most hashes one lease may ask for. It is the one
// definition of this limit: the wire refuses more, the agent's pools are
// configured with it, and importers split their work into chunks that fit.
const MaxLeaseBlocks = 4096

// Lease is a holder's promise to keep the present blocks in their slots
// until the lease is released or Duration passes.
type Lease struct {
	ID uint64
	// Duration is the term granted, which may be shorter than asked.
	Duration time.Duration
	// Blocks has one entry per requested hash, in request order.
	Blocks []LeasedBlock
	// LayoutDigests holds, by block set, the digest of the layout of
	// every block set a present block is in.
	LayoutDigests map[uint64][]byte
	// Capped says the holder cut the lease short of the blocks it holds,
	// for its caps on leased blocks: blocks past the last present one may
	// still be there.
	Capped bool
}

// LogEntry is one entry of an origin's event log; Payload is opaque here.
type LogEntry struct {
	Seq     uint64
	Payload []byte
}

// EventQuery asks a node for part of its own event log: the events of
// incarnation numbered [From, To), or with Snapshot its whole holdings,
// served in pages: the first page asks with SnapshotSeq and Offset zero, the
// next ones name the SnapshotSeq of the first answer and how many entries
// have arrived.
type EventQuery struct {
	Origin      string
	Incarnation uint64
	From, To    uint64
	Snapshot    bool
	SnapshotSeq uint64
	Offset      uint64
	// MaxBytes, set by the holder's transport, is what the answer's
	// events may take so that it fits one frame, counting each as
	// len(Payload) + EventOverhead; a handler answers less than asked,
	// with More, rather than exceed it.
	MaxBytes int
}

// EventRange is an answer to an event-log range request.
type EventRange struct {
	Events []LogEntry
	// SnapshotNeeded says the range (or the snapshot being paged) is no
	// longer kept and the caller must start a snapshot afresh.
	SnapshotNeeded bool
	// More says the answer stops short of what was asked because one frame
	// cannot carry more; ask again from after what arrived.
	More bool
	// SnapshotSeq and Incarnation number a snapshot page.
	SnapshotSeq uint64
	Incarnation uint64
}

// Handler serves the calls that peers make to this node. The agent
// implements it over its pools, leases, layouts and event logs. Methods are
// called concurrently from many streams; peer is the caller's verified node
// name. Returned slices are owned by transfer until the response is
// written; errors should wrap a sentinel of this package (ErrNotFound,
// ErrInvalidRequest, ErrLeaseRefused, ErrUnavailable) so that the caller
// sees the right code, and their text is sent to the peer.
type Handler interface {
	// Hello returns this node's features and layout-set digest.
	Hello(ctx context.Context, peer string, req HelloInfo) (HelloInfo, error)
	// Layouts returns the serialized layouts named by digests; unknown
	// digests are left out. No digests asks for every layout served.
	Layouts(ctx context.Context, peer string, digests [][]byte) ([]LayoutEntry, error)
	// Lease pins the blocks named by hashes for duration.
	Lease(ctx context.Context, peer string, hashes []uint64, duration time.Duration) (Lease, error)
	// Renew extends a lease and returns the term it granted from now, at
	// most duration and the holder's own cap, as Lease does; zero means
	// it had already expired or been released. A term over duration is
	// cut to duration.
	Renew(ctx context.Context, peer string, leaseID uint64, duration time.Duration) (time.Duration, error)
	// Release ends a lease; false means it had expired before the release,
	// and the bytes read under it must not be trusted.
	Release(ctx context.Context, peer string, leaseID uint64) (bool, error)
	// EventRange returns the events q asks for: origin's events of
	// incarnation with sequence numbers in [From, To), or, with Snapshot,
	// its holdings (payloads and sequence numbers are the handler's to
	// define).
	EventRange(ctx context.Context, peer string, q EventQuery) (EventRange, error)
	// CheckRead returns nil only if every piece of seg (Count pieces of
	// Length bytes at SrcOffset + i×SrcStride in rank SrcRank's region of
	// blockSet) lies in slots that leaseID holds a live lease on. seg is
	// validated (no overflow, inside the region) before the call; the
	// handler may check it slot by slot rather than piece by piece. Use
	// [ForEachPiece] for the simple form. It must not block.
	CheckRead(peer string, leaseID, blockSet uint64, seg layout.Segment) error
	// Region returns the memory of rank's region of blockSet. The slice
	// must stay valid while leases on it are live; transfer reads it, never
	// writes it.
	Region(blockSet uint64, rank int) ([]byte, error)
}

// ForEachPiece calls fn for each piece of seg in order, merging pieces that
// touch (SrcStride == Length) into one call, and stops at the first error.
func ForEachPiece(seg layout.Segment, fn func(offset, length uint64) error) error {
	if seg.Count == 0 {
		return nil
	}
	if seg.SrcStride == seg.Length || seg.Count == 1 {
		return fn(seg.SrcOffset, seg.Length*seg.Count)
	}
	for i := uint64(0); i < seg.Count; i++ {
		if err := fn(seg.SrcOffset+i*seg.SrcStride, seg.Length); err != nil {
			return err
		}
	}
	return nil
}
