package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// Peer is this node's handle on one other node: up to ConnsPerPeer QUIC
// connections, dialed on first use and redialed when they die. Its methods
// are the calls of the protocol; they are safe for concurrent use.
type Peer struct {
	n    *Node
	name string
	addr *net.UDPAddr

	slots []connSlot
	// why is the CloseReason the handle was first closed for, plus one;
	// zero while it is open (isClosed).
	why  atomic.Int32
	next atomic.Uint32
	// streams caps the read streams in flight to this peer across all
	// concurrent reads at ConnsPerPeer × StreamsPerConn: more streams than
	// that only share the same connections' bandwidth and make every read
	// end with its slowest part.
	streams chan struct{}
	// rdma is the peer's RDMA state; nil when this node has no RDMA.
	rdma *peerRDMA
	// lane is the peer's TCP lane state.
	lane *peerLane
}

// connSlot is one connection of a peer. Each has its own lock, so that
// redialing one does not hold up calls on the others.
type connSlot struct {
	mu     sync.Mutex
	c      *quic.Conn
	active atomic.Int32 // calls in flight
}

// Peer dials the node called name at addr ("host:port") and returns a
// handle on it. It returns once one connection is up; the holder's
// certificate must name name and name must be a current member. The
// holder checks us the same way; if it refuses, the first call fails.
func (n *Node) Peer(ctx context.Context, addr, name string) (*Peer, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("transfer: peer %s address %q: %w", name, addr, err)
	}
	p := &Peer{n: n, name: name, addr: ua, slots: make([]connSlot, n.cfg.ConnsPerPeer),
		streams: make(chan struct{}, n.cfg.ConnsPerPeer*n.cfg.StreamsPerConn)}
	if n.rdma != nil {
		p.rdma = &peerRDMA{leases: map[uint64]map[uint64][]remoteRegion{}, keyless: map[uint64]bool{}}
		p.rdma.tp = n.rdma.tp.newPeer(p)
	}
	p.lane = newPeerLane(n.cfg.LaneConns)
	if _, err := p.conn(ctx, 0); err != nil {
		return nil, err
	}
	return p, nil
}

// Name returns the peer's node name.
func (p *Peer) Name() string { return p.name }

// CloseReason says why a peer handle is closed. It decides whether an RDMA
// read that fails while the handle closes counts in
// RDMAMetrics.ReadFailures: only one from a peer that failed does.
type CloseReason int32

const (
	// CloseLocal: this node lets go of the peer (it is closing). Close's
	// reason. A read that fails meanwhile is not counted.
	CloseLocal CloseReason = iota
	// ClosePeerLeft: the peer left the cluster gracefully. It closes its
	// endpoint after it leaves, so a read in flight may fail with the
	// provider's error after the handle closed; it is not counted.
	ClosePeerLeft
	// ClosePeerFailed: the peer failed (failure detection, or it restarted
	// before that noticed). A read that failed on its own meanwhile is
	// counted (a holder that died mid-read: the member's failure closes the
	// handle before the read's timeout ends it); one stopped by the closing
	// (ErrClosed) is not.
	ClosePeerFailed
)

// Close closes the peer's connections, for CloseLocal. It is safe to call
// twice; calls in flight fail.
func (p *Peer) Close() error { return p.CloseFor(CloseLocal) }

// isClosed says whether the handle is closed (CloseFor).
func (p *Peer) isClosed() bool { return p.why.Load() != 0 }

// closeReason is why the handle was first closed, once isClosed.
func (p *Peer) closeReason() CloseReason { return CloseReason(p.why.Load() - 1) }

// CloseFor closes the peer's connections as Close does, for why; a handle
// closed twice keeps its first reason.
func (p *Peer) CloseFor(why CloseReason) error {
	p.why.CompareAndSwap(0, int32(why)+1)
	if p.rdma != nil {
		p.rdma.tp.close()
	}
	p.lane.close()
	for i := range p.slots {
		sl := &p.slots[i]
		sl.mu.Lock()
		if sl.c != nil {
			sl.c.CloseWithError(connErrClosing, "peer handle closed")
			sl.c = nil
		}
		sl.mu.Unlock()
	}
	return nil
}

// conn returns connection slot i, dialing it if it is missing or dead.
// Dials of one slot are serialized; a dial is bounded by the handshake
// timeout and ctx.
func (p *Peer) conn(ctx context.Context, i int) (*quic.Conn, error) {
	if p.isClosed() {
		return nil, fmt.Errorf("transfer: peer %s: %w", p.name, ErrClosed)
	}
	sl := &p.slots[i]
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.c != nil {
		if sl.c.Context().Err() == nil {
			return sl.c, nil
		}
		sl.c = nil
	}
	if p.n.ctx.Err() != nil {
		return nil, ErrClosed
	}
	dctx, cancel := context.WithTimeout(ctx, 2*p.n.cfg.HandshakeTimeout)
	defer cancel()
	c, err := p.n.dialTrs[i].Dial(dctx, p.addr, p.n.clientTLS(p.name), p.n.qcfg)
	if err != nil {
		return nil, fmt.Errorf("transfer: dial %s at %s: %w", p.name, p.addr, wrapNetErr(ctx, err))
	}
	if p.isClosed() || !p.n.track(c) {
		c.CloseWithError(connErrClosing, "closing")
		return nil, ErrClosed
	}
	sl.c = c
	return c, nil
}

// wrapNetErr makes timeouts match ErrTimeout and a refused handshake match
// ErrNotMember where the text says so, keeping the cause.
func wrapNetErr(ctx context.Context, err error) error {
	var idle *quic.IdleTimeoutError
	var hs *quic.HandshakeTimeoutError
	var app *quic.ApplicationError
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return fmt.Errorf("%w: %w (%w)", ErrTimeout, ctx.Err(), err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &idle), errors.As(err, &hs),
		// Another call on the same connection timed out and dropped it
		// (dropSilent): this one met the same silent peer.
		errors.As(err, &app) && !app.Remote && app.ErrorCode == connErrTimedOut:
		return fmt.Errorf("%w: %w", ErrTimeout, err)
	case ctx.Err() != nil:
		return fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	return err
}

// callCtx bounds a control call by CallTimeout, or by the caller's
// deadline when that comes first. A caller's long deadline (an import's,
// covering several holders) must not let one silent peer hold the call.
func (n *Node) callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, n.cfg.CallTimeout)
}

// pickSlot returns the connection slot with the fewest calls in flight,
// starting the scan at a rotating slot so that ties spread out. Balancing
// by load rather than by turn keeps one connection from carrying most of
// the streams while another idles, which shows in the tail latency.
func (p *Peer) pickSlot() int {
	n := len(p.slots)
	start := int(p.next.Add(1) % uint32(n))
	best, bestLoad := start, p.slots[start].active.Load()
	for k := 1; k < n && bestLoad > 0; k++ {
		i := (start + k) % n
		if l := p.slots[i].active.Load(); l < bestLoad {
			best, bestLoad = i, l
		}
	}
	return best
}

// openStream opens a stream on the least busy connection; its reads and
// writes abort when ctx ends. done must be called when the call is over,
// with the call's error: a call that timed out on one of this package's
// own bounds drops its connection (see dropSilent). caller is the
// caller's own context, which ctx may narrow by CallTimeout: a call that
// ended because the caller's deadline passed says nothing about the
// connection, which other calls share.
func (p *Peer) openStream(ctx, caller context.Context) (s *quic.Stream, done func(error), err error) {
	i := p.pickSlot()
	sl := &p.slots[i]
	sl.active.Add(1)
	c, err := p.conn(ctx, i)
	if err != nil {
		sl.active.Add(-1)
		return nil, nil, err
	}
	s, err = c.OpenStreamSync(ctx)
	if err != nil {
		sl.active.Add(-1)
		err = wrapNetErr(ctx, err)
		p.dropSilent(caller, i, c, err)
		return nil, nil, fmt.Errorf("transfer: open stream to %s: %w", p.name, err)
	}
	stop := context.AfterFunc(ctx, func() {
		s.CancelRead(streamErrCancelled)
		s.CancelWrite(streamErrCancelled)
	})
	return s, func(err error) {
		stop()
		sl.active.Add(-1)
		p.dropSilent(caller, i, c, err)
	}, nil
}

// dropSilent closes connection c of slot i after a call on it timed out,
// so that the next call dials afresh. A holder that was killed and
// restarted at the same address never answers on its old connections
// (the new process has other keys, so not even a stateless reset comes
// back), and they would otherwise stall every call until the idle
// timeout. A live but slow peer costs a handshake. A call whose caller's
// context ended (its own deadline, or a cancel) drops nothing; its
// deadline counts as passed once the clock is past it, before the
// context's timer has fired (the stream's deadline, the same instant,
// may fire first).
func (p *Peer) dropSilent(caller context.Context, i int, c *quic.Conn, err error) {
	if err == nil || !errors.Is(err, ErrTimeout) || caller.Err() != nil {
		return
	}
	if dl, ok := caller.Deadline(); ok && !time.Now().Before(dl) {
		return
	}
	sl := &p.slots[i]
	sl.mu.Lock()
	if sl.c == c {
		sl.c = nil
	}
	sl.mu.Unlock()
	c.CloseWithError(connErrTimedOut, "call timed out")
}

// call runs one control call: a request frame out, a response frame back.
func (p *Peer) call(caller context.Context, m method, req, resp proto.Message) (err error) {
	ctx, cancel := p.n.callCtx(caller)
	defer cancel()
	s, stop, err := p.openStream(ctx, caller)
	if err != nil {
		return err
	}
	defer func() { stop(err) }()
	if dl, ok := ctx.Deadline(); ok {
		_ = s.SetDeadline(dl)
	}
	if err = writeFrame(s, byte(m), req, p.n.cfg.MaxMessageSize); err != nil {
		s.CancelWrite(streamErrCancelled)
		err = fmt.Errorf("transfer: %s to %s: %w", m, p.name, wrapNetErr(ctx, err))
		return err
	}
	s.Close()
	err = p.readResponse(ctx, s, s, m, resp)
	return err
}

// readResponse reads a response frame into resp, or the peer's error.
func (p *Peer) readResponse(ctx context.Context, s *quic.Stream, r io.Reader, m method, resp proto.Message) error {
	kind, payload, err := readFrame(r, p.n.cfg.MaxMessageSize)
	if err != nil {
		s.CancelRead(streamErrProtocol)
		return fmt.Errorf("transfer: %s from %s: %w", m, p.name, wrapNetErr(ctx, err))
	}
	switch kind {
	case statusOK:
		if err := proto.Unmarshal(payload, resp); err != nil {
			s.CancelRead(streamErrProtocol)
			return fmt.Errorf("%w: %s response from %s: %v", ErrFrame, m, p.name, err)
		}
		if m == methodRead {
			return nil // the data follows
		}
		return p.expectEnd(ctx, s, r, m)
	case statusError:
		s.CancelRead(0) // the answer is complete; retire the stream
		var e transferpb.Error
		if err := proto.Unmarshal(payload, &e); err != nil {
			return fmt.Errorf("%w: %s error from %s: %v", ErrFrame, m, p.name, err)
		}
		return &RemoteError{Peer: p.name, Method: m.String(), Code: Code(e.Code), Message: errorMessage(e.Message)}
	}
	s.CancelRead(streamErrProtocol)
	return fmt.Errorf("%w: %s from %s: status %d", ErrFrame, m, p.name, kind)
}

// expectEnd reads the end of a stream after the last byte we expect.
// Reading the FIN is what lets quic-go retire the stream (an unread one
// would hold its state and its slot in the holder's stream limit); a
// byte instead of the end is a holder that does not follow the protocol.
func (p *Peer) expectEnd(ctx context.Context, s *quic.Stream, r io.Reader, m method) error {
	var b [1]byte
	n, err := r.Read(b[:])
	if n == 0 && err == nil {
		n, err = io.ReadFull(r, b[:]) // a reader may return (0, nil)
	}
	switch {
	case errors.Is(err, io.EOF) && n == 0:
		return nil
	case n > 0:
		s.CancelRead(streamErrProtocol)
		return fmt.Errorf("%w: %s from %s: bytes after the end of the answer", ErrFrame, m, p.name)
	}
	s.CancelRead(streamErrProtocol)
	return fmt.Errorf("transfer: %s from %s: %w", m, p.name, wrapNetErr(ctx, err))
}

// Hello exchanges versions and features. The answer's Versions are the
// holder's; the call fails unless they include ProtocolVersion.
func (p *Peer) Hello(ctx context.Context, features []string) (HelloInfo, error) {
	var resp transferpb.HelloResponse
	req := &transferpb.HelloRequest{Node: p.n.cfg.NodeName, Versions: []uint32{ProtocolVersion}, Features: features}
	if err := p.call(ctx, methodHello, req, &resp); err != nil {
		return HelloInfo{}, err
	}
	info := HelloInfo{Node: resp.Node, Versions: resp.Versions, Features: resp.Features, LayoutSetDigest: resp.LayoutSetDigest}
	for _, v := range resp.Versions {
		if v == ProtocolVersion {
			return info, nil
		}
	}
	return info, fmt.Errorf("%w: %s speaks versions %v, not %d", ErrInvalidRequest, p.name, resp.Versions, ProtocolVersion)
}

// Layouts fetches serialized layouts by digest, or every layout the holder
// serves when digests is empty; digests the holder does
// not know are absent from the answer. The bytes are untrusted: decode
// and validate them with the layout package.
func (p *Peer) Layouts(ctx context.Context, digests [][]byte) ([]LayoutEntry, error) {
	var resp transferpb.LayoutsResponse
	if err := p.call(ctx, methodLayouts, &transferpb.LayoutsRequest{Digests: digests}, &resp); err != nil {
		return nil, err
	}
	out := make([]LayoutEntry, len(resp.Layouts))
	for i, l := range resp.Layouts {
		out[i] = LayoutEntry{Digest: l.Digest, BlockSet: l.BlockSet, Layout: l.Layout}
	}
	return out, nil
}

// Lease asks the holder to pin blocks for d (rounded to milliseconds).
// The answer has one entry per hash, in order.
func (p *Peer) Lease(ctx context.Context, hashes []uint64, d time.Duration) (Lease, error) {
	var resp transferpb.LeaseResponse
	asked := p.wantRDMA()
	req := &transferpb.LeaseRequest{Hashes: hashes, DurationMs: uint64(d / time.Millisecond), Rdma: asked}
	if asked {
		req.Rma = p.n.rdma.tp.kind()
		req.ReadsInlineAt = p.rdma.tp.readsInline()
	}
	if err := p.call(ctx, methodLease, req, &resp); err != nil {
		return Lease{}, err
	}
	if len(resp.Blocks) != len(hashes) {
		return Lease{}, fmt.Errorf("%w: lease from %s has %d entries for %d hashes", ErrFrame, p.name, len(resp.Blocks), len(hashes))
	}
	term, err := grantedByHolder("lease", p.name, resp.DurationMs, d)
	if err != nil {
		return Lease{}, err
	}
	l := Lease{ID: resp.LeaseId, Duration: term, Blocks: make([]LeasedBlock, len(resp.Blocks))}
	for i, b := range resp.Blocks {
		if b.Hash != hashes[i] {
			return Lease{}, fmt.Errorf("%w: lease from %s: entry %d is for hash %d, asked %d", ErrFrame, p.name, i, b.Hash, hashes[i])
		}
		l.Blocks[i] = LeasedBlock{Hash: b.Hash, Present: b.Present, BlockSet: b.BlockSet, Slot: b.Slot, Generation: b.Generation,
			Sum: b.Sum, HasSum: b.HasSum}
		if b.Present {
			if d := resp.LayoutDigests[b.BlockSet]; len(d) != layoutDigestLen {
				return Lease{}, fmt.Errorf("%w: lease from %s: block set %d of entry %d has a layout digest of %d bytes, want %d", ErrFrame, p.name, b.BlockSet, i, len(d), layoutDigestLen)
			}
		}
	}
	if len(resp.LayoutDigests) > len(hashes) {
		return Lease{}, fmt.Errorf("%w: lease from %s names %d layout digests for %d hashes", ErrFrame, p.name, len(resp.LayoutDigests), len(hashes))
	}
	l.LayoutDigests = resp.LayoutDigests
	l.Capped = resp.Capped
	if len(resp.RdmaRegions) > 0 && !asked {
		return Lease{}, fmt.Errorf("%w: lease from %s carries RDMA regions it was not asked for", ErrFrame, p.name)
	}
	if asked {
		if err := p.keepRegions(l.ID, &l, resp.RdmaRegions, resp.OfiName); err != nil {
			return Lease{}, err
		}
		if len(resp.RdmaRegions) > 0 {
			switch err := p.rdma.tp.answered(&resp); {
			case errors.Is(err, errNoEndpointName):
				// Regions of another binding: not ours to read.
				p.forgetLease(l.ID)
				p.rdmaUnavailable(FallbackPeerHasNoRDMA)
			case err != nil:
				p.forgetLease(l.ID)
				return Lease{}, fmt.Errorf("%w: lease from %s: %w", ErrFrame, p.name, err)
			}
		}
	} else {
		p.keylessLease(l.ID)
	}
	return l, nil
}

// layoutDigestLen is the length of a layout digest.
const layoutDigestLen = len(layout.Digest{})

// Renew asks for lease leaseID to be extended by d and returns the term the
// holder granted from when it answered (at most d: it may cap it, as it
// caps a lease); zero means the lease was no longer live.
func (p *Peer) Renew(ctx context.Context, leaseID uint64, d time.Duration) (time.Duration, error) {
	var resp transferpb.RenewResponse
	req := &transferpb.RenewRequest{LeaseId: leaseID, DurationMs: uint64(d / time.Millisecond)}
	if p.rdma != nil {
		// Said again: reads that stopped completing inline withdraw it.
		req.ReadsInlineAt = p.rdma.tp.readsInline()
	}
	if err := p.call(ctx, methodRenew, req, &resp); err != nil {
		return 0, err
	}
	switch {
	case !resp.Valid:
		return 0, nil
	case resp.DurationMs == 0:
		return d, nil // a holder that does not say: the term asked
	default:
		return grantedByHolder("renewal", p.name, resp.DurationMs, d)
	}
}

// grantedByHolder checks the term a holder granted, in milliseconds,
// against the term asked: a holder may cap a term, never lengthen it. The
// count is compared before it becomes a Duration, which a count past
// about 292 years would overflow into a negative or short term.
func grantedByHolder(what, holder string, grantedMS uint64, asked time.Duration) (time.Duration, error) {
	if askedMS := uint64(asked / time.Millisecond); grantedMS > askedMS {
		return 0, fmt.Errorf("%w: %s from %s grants %d ms, more than the %d ms asked", ErrFrame, what, holder, grantedMS, askedMS)
	}
	return time.Duration(grantedMS) * time.Millisecond, nil
}

// Release ends a lease; false means it expired before the release and
// what was read under it must be thrown away.
//
// mismatched names leased blocks whose bytes, as read, failed their
// checksums, for the holder to check and withdraw.
func (p *Peer) Release(ctx context.Context, leaseID uint64, mismatched ...uint64) (bool, error) {
	p.forgetLease(leaseID)
	var resp transferpb.ReleaseResponse
	if err := p.call(ctx, methodRelease, &transferpb.ReleaseRequest{LeaseId: leaseID, Mismatched: mismatched}, &resp); err != nil {
		return false, err
	}
	return resp.Valid, nil
}

// EventRange fetches part of a node's own event log: q.Origin's events of
// q.Incarnation numbered [q.From, q.To), or with q.Snapshot one page of its
// holdings. q.To - q.From is at most MaxEventRange. An answer with More
// stopped short for the frame's sake: ask again from after what arrived.
func (p *Peer) EventRange(ctx context.Context, q EventQuery) (EventRange, error) {
	var resp transferpb.EventRangeResponse
	req := &transferpb.EventRangeRequest{Origin: q.Origin, Incarnation: q.Incarnation, From: q.From, To: q.To,
		Snapshot: q.Snapshot, SnapshotSeq: q.SnapshotSeq, Offset: q.Offset}
	if err := p.call(ctx, methodEventRange, req, &resp); err != nil {
		return EventRange{}, err
	}
	er := EventRange{SnapshotNeeded: resp.SnapshotNeeded, More: resp.More, SnapshotSeq: resp.SnapshotSeq,
		Incarnation: resp.Incarnation, Events: make([]LogEntry, len(resp.Events))}
	if er.SnapshotNeeded && (len(resp.Events) > 0 || er.More) {
		return EventRange{}, fmt.Errorf("%w: event range from %s says snapshot needed yet carries events", ErrFrame, p.name)
	}
	if er.More && len(resp.Events) == 0 {
		// More with nothing would have the caller ask the same forever.
		return EventRange{}, fmt.Errorf("%w: event range from %s says more but carries nothing", ErrFrame, p.name)
	}
	from, to := q.From, q.To
	prev := from
	for i, e := range resp.Events {
		if q.Snapshot {
			if e.Seq != resp.SnapshotSeq {
				return EventRange{}, fmt.Errorf("%w: snapshot page from %s: event %d numbered %d, the snapshot %d", ErrFrame, p.name, i, e.Seq, resp.SnapshotSeq)
			}
			er.Events[i] = LogEntry{Seq: e.Seq, Payload: e.Payload}
			continue
		}
		// The index applies these in order: refuse what it would
		// misapply rather than trust the holder's arithmetic.
		if e.Seq < from || e.Seq >= to || (i > 0 && e.Seq <= prev) {
			return EventRange{}, fmt.Errorf("%w: event range from %s: event %d has sequence %d, outside [%d, %d) or out of order", ErrFrame, p.name, i, e.Seq, from, to)
		}
		prev = e.Seq
		er.Events[i] = LogEntry{Seq: e.Seq, Payload: e.Payload}
	}
	return er, nil
}
