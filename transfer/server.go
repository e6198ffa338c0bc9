package transfer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// serveStream runs one call. Whatever goes wrong is answered on this
// stream (or the stream is reset); the connection is never closed here.
func (n *Node) serveStream(connCtx context.Context, s *quic.Stream, peer string, log *slog.Logger) {
	n.stats.streams.Add(1)
	// The request must arrive promptly, and an early refusal must not
	// wait on a reader that never reads: a peer that opens a stream and
	// sends nothing does not hold a goroutine for longer than this.
	deadline := n.progressDeadline()
	_ = s.SetDeadline(deadline)
	var m method
	fail := func(err error) {
		n.stats.callsFailed.Add(1)
		log.Debug("transfer: call refused", "method", m, "err", err)
		// The request's deadline may have passed (a silent or throttled
		// peer); the refusal gets its own.
		_ = s.SetWriteDeadline(n.progressDeadline())
		n.refuse(s, err)
	}
	// The request's announced length counts against the peer's budget,
	// taken in one step before its payload is read, until it is decoded or
	// fails: a peer's requests in flight together stay under
	// MaxPeerRequestBytes, and one that does not fit waits for the others,
	// which hold all they need, to finish. The buffer itself grows only
	// with the bytes that arrive.
	budget, doneBudget := n.budget(peer)
	kind, payload, charged, err := readFrameCharged(s, n.cfg.MaxMessageSize, func(k int) error {
		return budget.acquire(int64(k), deadline)
	})
	s.CancelRead(0) // one frame per call; anything after it is not ours
	var req *request
	if err != nil {
		err = fmt.Errorf("read request: %w", err)
	} else {
		m = method(kind)
		req, err = decodeRequest(m, payload, n.cfg.MaxSegments)
	}
	payload = nil
	budget.release(int64(charged)) // exactly once, whatever happened above
	doneBudget()
	if err != nil {
		fail(err)
		return
	}
	if n.cfg.Handler == nil {
		fail(fmt.Errorf("%w: node %s serves no calls", ErrUnavailable, n.cfg.NodeName))
		return
	}
	ctx, cancel := context.WithTimeout(connCtx, n.cfg.CallTimeout)
	defer cancel()
	_ = s.SetWriteDeadline(time.Now().Add(n.cfg.CallTimeout))
	if m == methodRead {
		if err := n.serveRead(s, peer, req); err != nil {
			n.stats.callsFailed.Add(1)
			log.Debug("transfer: read failed", "lease", req.leaseID, "err", err)
		}
		return
	}
	resp, err := n.dispatch(ctx, peer, req)
	if err != nil {
		fail(err)
		return
	}
	if err := writeFrame(s, statusOK, resp, n.cfg.MaxMessageSize); err != nil {
		n.stats.callsFailed.Add(1)
		if errors.Is(err, ErrTooLarge) {
			n.refuse(s, err)
			return
		}
		s.CancelWrite(streamErrCancelled)
		return
	}
	n.stats.callsServed.Add(1)
	s.Close()
}

// refuse answers a call with an Error frame and closes the stream.
func (n *Node) refuse(s *quic.Stream, err error) {
	msg := errorMessage(err.Error())
	if werr := writeFrame(s, statusError, &transferpb.Error{Code: uint32(codeOf(err)), Message: msg}, n.cfg.MaxMessageSize); werr != nil {
		s.CancelWrite(streamErrProtocol)
		return
	}
	s.Close()
}

// grantedTerm is the term a lease or renewal answers: what the handler
// granted, never more than asked, in whole milliseconds (what the wire
// carries), and zero only when nothing was granted.
func grantedTerm(asked, granted time.Duration) time.Duration {
	if granted <= 0 {
		return 0
	}
	return max(min(granted, asked).Truncate(time.Millisecond), time.Millisecond)
}

func (n *Node) dispatch(ctx context.Context, peer string, r *request) (proto.Message, error) {
	h := n.cfg.Handler
	switch r.method {
	case methodHello:
		if r.hello.Node != peer {
			return nil, fmt.Errorf("%w: hello from %q, certificate names %q", ErrInvalidRequest, r.hello.Node, peer)
		}
		if !slices.Contains(r.hello.Versions, ProtocolVersion) {
			return nil, fmt.Errorf("%w: hello offers versions %v, this node speaks %d", ErrInvalidRequest, r.hello.Versions, ProtocolVersion)
		}
		info, err := h.Hello(ctx, peer, r.hello)
		if err != nil {
			return nil, err
		}
		return &transferpb.HelloResponse{
			Node: n.cfg.NodeName, Versions: []uint32{ProtocolVersion},
			Features: info.Features, LayoutSetDigest: info.LayoutSetDigest,
		}, nil
	case methodLayouts:
		ls, err := h.Layouts(ctx, peer, r.digests)
		if err != nil {
			return nil, err
		}
		resp := &transferpb.LayoutsResponse{Layouts: make([]*transferpb.LayoutEntry, len(ls))}
		for i, l := range ls {
			resp.Layouts[i] = &transferpb.LayoutEntry{Digest: l.Digest, BlockSet: l.BlockSet, Layout: l.Layout}
		}
		return resp, nil
	case methodLease:
		l, err := h.Lease(ctx, peer, r.hashes, r.duration)
		if err != nil {
			return nil, err
		}
		l.Duration = grantedTerm(r.duration, l.Duration)
		if len(l.Blocks) != len(r.hashes) {
			return nil, fmt.Errorf("%w: handler leased %d entries for %d hashes", ErrInternal, len(l.Blocks), len(r.hashes))
		}
		resp := &transferpb.LeaseResponse{LeaseId: l.ID, DurationMs: uint64(l.Duration / time.Millisecond), Blocks: make([]*transferpb.LeasedBlock, len(l.Blocks)), LayoutDigests: l.LayoutDigests, Capped: l.Capped}
		for i, b := range l.Blocks {
			resp.Blocks[i] = &transferpb.LeasedBlock{Hash: b.Hash, Present: b.Present, BlockSet: b.BlockSet, Slot: b.Slot, Generation: b.Generation,
				Sum: b.Sum, HasSum: b.HasSum}
		}
		if r.rdma && n.rdma != nil && l.ID != 0 && r.rma == n.rdma.tp.kind() {
			done := n.rdma.tp.answering() // the keys and the name of one endpoint
			resp.RdmaRegions = n.rdmaRegions(l.LayoutDigests)
			if len(resp.RdmaRegions) > 0 {
				n.rdma.tp.answer(peer, r.inlineAt, resp)
			}
			done()
		}
		return resp, nil
	case methodRdmaConnect:
		return n.serveConnect(peer, nicPair{local: r.nic, remote: r.readerNIC}, r.queuePairs, r.endpoint)
	case methodLaneToken:
		return n.issueLaneTokens(peer, r.laneTokens)
	case methodIndex:
		return serveIndex(ctx, h, peer, r.index)
	case methodRenew:
		d, err := h.Renew(ctx, peer, r.leaseID, r.duration)
		if err != nil {
			return nil, err
		}
		// The term is the holder's, as a lease's is: its endpoint serves
		// for that and the reader renews again within it.
		d = grantedTerm(r.duration, d)
		if d > 0 && n.rdma != nil {
			n.rdma.tp.leaseRenewed(peer, r.leaseID, d, r.inlineAt)
		}
		return &transferpb.RenewResponse{Valid: d > 0, DurationMs: uint64(d / time.Millisecond)}, nil
	case methodRelease:
		if mr, ok := h.(MismatchReporter); ok && len(r.mismatched) > 0 {
			mr.Mismatched(ctx, peer, r.leaseID, r.mismatched)
		}
		ok, err := h.Release(ctx, peer, r.leaseID)
		if n.rdma != nil {
			n.rdma.tp.leaseEnded(peer, r.leaseID)
		}
		if err != nil {
			return nil, err
		}
		return &transferpb.ReleaseResponse{Valid: ok}, nil
	case methodEventRange:
		q := r.events
		q.MaxBytes = eventRangeBudget(n.cfg.MaxMessageSize)
		er, err := h.EventRange(ctx, peer, q)
		if err != nil {
			return nil, err
		}
		resp := &transferpb.EventRangeResponse{SnapshotNeeded: er.SnapshotNeeded, More: er.More,
			SnapshotSeq: er.SnapshotSeq, Incarnation: er.Incarnation, Events: make([]*transferpb.Event, len(er.Events))}
		for i, e := range er.Events {
			resp.Events[i] = &transferpb.Event{Seq: e.Seq, Payload: e.Payload}
		}
		return resp, nil
	}
	return nil, fmt.Errorf("%w: method %s", ErrInvalidRequest, r.method)
}

// smallPiece is the size under which pieces are gathered into one buffer
// before they go to the stream: a Write per 128-byte NHD row would cost
// more in locking than the copy does.
const smallPiece = 16 << 10

// serveRead checks the whole request before it sends a byte, then streams
// every piece straight from region memory.
func (n *Node) serveRead(s *quic.Stream, peer string, r *request) error {
	src, err := n.checkRead(peer, r)
	if err != nil {
		n.refuse(s, err)
		return err
	}
	if err := n.writeRead(s, src, r); err != nil {
		s.CancelWrite(streamErrCancelled)
		return err
	}
	n.served(r, &n.stats.bytesServedQUIC)
	return s.Close()
}

// served counts a read whose answer went out whole, over the transport
// whose count by is. The caller counts it once the answer's last byte is
// written where it cannot fail any more for that answer: after a TLS
// lane's gathered records are flushed, not when they are gathered.
func (n *Node) served(r *request, by *atomic.Uint64) {
	n.stats.readsServed.Add(1)
	n.stats.bytesServed.Add(r.totalBytes)
	by.Add(r.totalBytes)
}

// readSource is where a checked read's ranks come from: region memory,
// or a ReadStager for memory the node cannot read directly.
type readSource struct {
	regions map[int][]byte
	staged  map[int]uint64 // ranks served through ReadStager, by length
}

// checkRead checks every segment of a read against its region's bounds
// and the lease, and returns where its bytes come from.
func (n *Node) checkRead(peer string, r *request) (readSource, error) {
	h := n.cfg.Handler
	src := readSource{regions: map[int][]byte{}, staged: map[int]uint64{}}
	for i, seg := range r.segments {
		reg, ok := src.regions[seg.SrcRank]
		length, isStaged := src.staged[seg.SrcRank]
		if !ok && !isStaged {
			var err error
			reg, err = h.Region(r.blockSet, seg.SrcRank)
			if errors.Is(err, ErrNeedsRDMA) {
				length, isStaged, err = n.stagedLength(r.blockSet, seg.SrcRank, err)
			}
			if err != nil {
				return src, fmt.Errorf("segment %d: region of block set %d rank %d: %w", i, r.blockSet, seg.SrcRank, err)
			}
			if isStaged {
				src.staged[seg.SrcRank] = length
			} else {
				src.regions[seg.SrcRank] = reg
			}
		}
		if !isStaged {
			length = uint64(len(reg))
		}
		end, _ := segmentEnd(seg) // validated by decodeRequest
		if end > length {
			return src, fmt.Errorf("%w: segment %d ends at %d, past rank %d's region of %d bytes", ErrInvalidRequest, i, end, seg.SrcRank, length)
		}
		if err := h.CheckRead(peer, r.leaseID, r.blockSet, seg); err != nil {
			if !errors.Is(err, ErrLeaseRefused) && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrInvalidRequest) {
				err = fmt.Errorf("%w: %w", ErrLeaseRefused, err)
			}
			return src, fmt.Errorf("segment %d (rank %d, offset %d, %d×%d bytes) under lease %d: %w", i, seg.SrcRank, seg.SrcOffset, seg.Count, seg.Length, r.leaseID, err)
		}
	}
	return src, nil
}

// writeRead writes a checked read's response frame and data to s. An
// error leaves s mid-answer: the caller resets or closes it. It counts
// nothing: the caller counts the read served (served) once its answer is
// out.
func (n *Node) writeRead(s deadlineWriter, src readSource, r *request) error {
	if tc, ok := s.(*net.TCPConn); ok && len(src.staged) == 0 {
		return n.writeReadVec(tc, src, r)
	}
	h := n.cfg.Handler
	w := dataWriter{s: s, n: n}
	defer w.release()
	if err := writeFrame(s, statusOK, &transferpb.ReadResponse{TotalBytes: r.totalBytes}, n.cfg.MaxMessageSize); err != nil {
		return err
	}
	w.refresh()
	for k := 0; k < len(r.segments); k++ {
		seg := r.segments[k]
		if _, ok := src.staged[seg.SrcRank]; ok {
			// A run of staged segments goes in one call, so that staging
			// overlaps across them.
			end := k + 1
			for end < len(r.segments) {
				if _, ok := src.staged[r.segments[end].SrcRank]; !ok {
					break
				}
				end++
			}
			if err := h.(ReadStager).StageRead(r.blockSet, r.segments[k:end], w.write); err != nil {
				return err
			}
			k = end - 1
			continue
		}
		reg := src.regions[seg.SrcRank]
		if seg.Count == 1 || seg.SrcStride == seg.Length {
			if err := w.write(reg[seg.SrcOffset : seg.SrcOffset+seg.Bytes()]); err != nil {
				return err
			}
			continue
		}
		for i := uint64(0); i < seg.Count; i++ {
			off := seg.SrcOffset + i*seg.SrcStride
			if err := w.write(reg[off : off+seg.Length]); err != nil {
				return err
			}
		}
	}
	return w.flush()
}

// Bounds on one vectored write or read of a plain lane: the kernel takes
// at most 1024 iovecs a call (IOV_MAX), and a write's deadline is renewed
// between them.
const (
	maxVecPieces = 1024
	maxVecBytes  = 4 << 20
)

// writeReadVec is writeRead on a plain TCP lane: the pieces go from region
// memory to the socket in vectored writes, without a copy in between.
func (n *Node) writeReadVec(c *net.TCPConn, src readSource, r *request) error {
	if err := writeFrame(c, statusOK, &transferpb.ReadResponse{TotalBytes: r.totalBytes}, n.cfg.MaxMessageSize); err != nil {
		return err
	}
	vec := make(net.Buffers, 0, maxVecPieces)
	pending := 0
	flush := func() error {
		_ = c.SetWriteDeadline(n.progressDeadline())
		v := vec
		_, err := v.WriteTo(c)
		clear(vec)
		vec, pending = vec[:0], 0
		return err
	}
	add := func(p []byte) error {
		for len(p) > 0 {
			k := min(len(p), maxVecBytes-pending)
			vec = append(vec, p[:k])
			pending += k
			p = p[k:]
			if len(vec) == maxVecPieces || pending == maxVecBytes {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		return nil
	}
	for _, seg := range r.segments {
		reg := src.regions[seg.SrcRank]
		if seg.Count == 1 || seg.SrcStride == seg.Length {
			if err := add(reg[seg.SrcOffset : seg.SrcOffset+seg.Bytes()]); err != nil {
				return err
			}
			continue
		}
		for i := uint64(0); i < seg.Count; i++ {
			off := seg.SrcOffset + i*seg.SrcStride
			if err := add(reg[off : off+seg.Length]); err != nil {
				return err
			}
		}
	}
	if pending > 0 {
		return flush()
	}
	return nil
}

// deadlineWriter is a QUIC stream or a lane connection.
type deadlineWriter interface {
	io.Writer
	SetWriteDeadline(time.Time) error
}

// dataWriter sends region bytes: large pieces straight from the region
// (quic-go packs them into packets without an extra copy), small ones
// gathered first. It keeps pushing the write deadline forward while bytes
// move, so that only a reader that stops reading trips it.
type dataWriter struct {
	s    deadlineWriter
	n    *Node
	buf  []byte
	last time.Time
}

func (w *dataWriter) refresh() {
	now := time.Now()
	if now.Sub(w.last) > w.n.cfg.ProgressTimeout/4 {
		w.last = now
		_ = w.s.SetWriteDeadline(now.Add(w.n.cfg.ProgressTimeout))
	}
}

func (w *dataWriter) write(p []byte) error {
	if len(p) >= smallPiece {
		if err := w.flush(); err != nil {
			return err
		}
		return w.send(p)
	}
	if w.buf == nil {
		w.buf = (*writeBufs.Get().(*[]byte))[:0]
	}
	if len(w.buf)+len(p) > cap(w.buf) {
		if err := w.flush(); err != nil {
			return err
		}
	}
	w.buf = append(w.buf, p...)
	return nil
}

// send writes p in chunks so that the deadline moves with progress: small
// enough that even a slow link (a few Mbit/s) finishes one well within
// ProgressTimeout/4 of the last refresh.
func (w *dataWriter) send(p []byte) error {
	const chunk = 256 << 10
	for len(p) > 0 {
		k := min(len(p), chunk)
		w.refresh()
		if _, err := w.s.Write(p[:k]); err != nil {
			return err
		}
		p = p[k:]
	}
	return nil
}

// writeBufs holds the buffers that gather small pieces.
var writeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4*smallPiece); return &b }}

func (w *dataWriter) release() {
	if w.buf != nil {
		b := w.buf[:0]
		writeBufs.Put(&b)
		w.buf = nil
	}
}

func (w *dataWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	err := w.send(w.buf)
	w.buf = w.buf[:0]
	return err
}
