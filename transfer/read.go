package transfer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// Read copies the bytes of segs from the holder's block set into dst,
// dst[r] being the memory of local rank r: each segment reads rank
// SrcRank's region of blockSet under leaseID and writes DstRank's slice.
// The plan is split over several streams and connections (see the package
// documentation) and every piece lands straight in dst.
//
// The holder checks each stream's segments against the lease before it
// sends any byte of them. If Read fails, dst holds nothing outside the
// destination ranges of segs, but inside them parts of the plan may have
// landed: the caller must not use them (the importer frees the slots).
// Segments are validated first: a segment outside dst is an error before
// anything is sent.
//
// With RDMA on (Config.RDMA), a read under a lease that carried the
// holder's keys moves as RDMA READs; if RDMA fails, the same read goes
// over QUIC (the lease is still the caller's), and the peer is read over
// QUIC until its backoff ends.
func (p *Peer) Read(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst [][]byte) error {
	_, err := p.ReadVia(ctx, leaseID, blockSet, segs, dst)
	return err
}

// ReadVia is Read that also says which transport moved the bytes (or was
// moving them when it failed).
func (p *Peer) ReadVia(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst [][]byte) (Transport, error) {
	return p.ReadViaLanded(ctx, leaseID, blockSet, segs, dst, nil)
}

// Landed is told the segments of a part of a lane read once every byte of
// them is in dst, on the goroutine that read them, while they are likely
// still in the cache: a caller that checks what arrived can do it then
// instead of reading the memory again afterwards. Calls run concurrently,
// one per lane connection, and all of them return before the read does.
// The segments are a part of the plan as the read split it: pieces may be
// cut where the plan's were not.
type Landed func(part []layout.Segment)

// ReadViaLanded is ReadVia that calls landed (if not nil) for each part of
// the plan that a lane read brought in whole. Only a read that returns
// TransportTCP and no error wrote dst once, part by part as landed was
// told: after any other outcome (RDMA or QUIC, or a lane read that failed
// and was read again over QUIC) what landed was told may have been
// written again since, and the caller must not rely on it.
func (p *Peer) ReadViaLanded(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst [][]byte, landed Landed) (Transport, error) {
	total, err := validateReadPlan(segs, dst)
	if err != nil {
		return TransportQUIC, err
	}
	if total == 0 {
		return TransportQUIC, nil
	}
	if p.rdma != nil {
		done, err := p.readRDMA(ctx, leaseID, blockSet, segs, spansOf(dst), total)
		switch {
		case done && err == nil:
			p.n.stats.reads.Add(1)
			p.n.stats.bytesRead.Add(total)
			return TransportRDMA, nil
		case done && ctx.Err() != nil:
			p.n.stats.readsFailed.Add(1)
			return TransportRDMA, err
		case done:
			p.n.log.Warn("rdma read failed; reading over QUIC", "peer", p.name, "lease", leaseID, "err", err)
		}
	}
	if !p.n.noLaneReads.Load() {
		used, err := p.readLane(ctx, leaseID, blockSet, segs, dst, total, landed)
		var re *RemoteError
		switch {
		case used && err == nil:
			p.n.stats.reads.Add(1)
			p.n.stats.bytesRead.Add(total)
			p.n.stats.bytesReadLane.Add(total)
			return TransportTCP, nil
		case used && (ctx.Err() != nil || errors.As(err, &re)):
			// The caller's deadline, or the holder's own answer (a
			// refused lease), which QUIC would get again.
			p.n.stats.readsFailed.Add(1)
			return TransportTCP, err
		case used:
			p.laneDown(LaneFallbackRead, err)
		}
	}
	return TransportQUIC, p.readQUIC(ctx, leaseID, blockSet, segs, dst, total)
}

// readQUIC is Read over QUIC streams.
func (p *Peer) readQUIC(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst [][]byte, total uint64) error {
	cfg := &p.n.cfg
	parallel := cfg.ConnsPerPeer * cfg.StreamsPerConn
	// A segment costs at most maxSegmentWire bytes in a request frame;
	// keep every part's frame under the cap.
	maxSegs := min(cfg.MaxSegments, max(1, int(cfg.MaxMessageSize/maxSegmentWire)-1))
	// Each part is one request: at most MaxReadBytes.
	n := max(parallel*partsPerWorker, int((total+MaxReadBytes-1)/MaxReadBytes))
	parts := splitPlan(segs, total, n, min(cfg.MinStreamBytes, MaxReadBytes), maxSegs)

	if len(parts) == 1 {
		// The common case of a small read: no workers to start.
		if err := p.readLimited(ctx, leaseID, blockSet, parts[0], dst); err != nil {
			p.n.stats.readsFailed.Add(1)
			return err
		}
		p.n.stats.reads.Add(1)
		p.n.stats.bytesRead.Add(total)
		p.n.stats.bytesReadQUIC.Add(total)
		return nil
	}
	// The first part to fail cancels the others; its error is the one
	// returned, not the cancellations it caused.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		done     = make([]bool, len(parts))
	)
	work := make(chan int)
	workers := min(parallel, len(parts))
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := p.readLimited(ctx, leaseID, blockSet, parts[i], dst); err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					continue
				}
				done[i] = true
			}
		}()
	}
feed:
	for i := range parts {
		select {
		case work <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(work)
	wg.Wait()
	if firstErr == nil {
		for _, ok := range done {
			if !ok { // parts never started: the caller's context ended
				firstErr = fmt.Errorf("transfer: read from %s: %w", p.name, wrapNetErr(ctx, ctx.Err()))
				break
			}
		}
	}
	if firstErr != nil {
		p.n.stats.readsFailed.Add(1)
		return firstErr
	}
	p.n.stats.reads.Add(1)
	p.n.stats.bytesRead.Add(total)
	p.n.stats.bytesReadQUIC.Add(total)
	return nil
}

// readLimited reads one part once the peer has a stream to spare.
func (p *Peer) readLimited(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst [][]byte) error {
	select {
	case p.streams <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("transfer: read from %s: %w", p.name, wrapNetErr(ctx, ctx.Err()))
	}
	defer func() { <-p.streams }()
	return p.readPart(ctx, leaseID, blockSet, segs, dst)
}

// partsPerWorker is how many parts a read is cut into per worker: with
// more parts than workers, a worker whose stream is slow takes fewer, so
// that the read does not end with one stream still carrying a large part.
const partsPerWorker = 2

// maxSegmentWire bounds a ReadSegment's encoding: a tag, a length and
// five varints of at most 10 bytes.
const maxSegmentWire = 64

// validateReadPlan checks every segment's arithmetic and destination
// bounds and returns the bytes the plan moves.
func validateReadPlan(segs []layout.Segment, dst [][]byte) (uint64, error) {
	lens := make([]uint64, len(dst))
	for i, d := range dst {
		lens[i] = uint64(len(d))
	}
	return validateReadLens(segs, lens)
}

// validateReadLens is validateReadPlan against destinations of lens bytes.
func validateReadLens(segs []layout.Segment, lens []uint64) (uint64, error) {
	var total uint64
	for i, s := range segs {
		if s.SrcRank < 0 || s.SrcRank >= maxRank {
			return 0, invalid("read: segment %d: source rank %d not in [0, %d)", i, s.SrcRank, maxRank)
		}
		if s.DstRank < 0 || s.DstRank >= len(lens) {
			return 0, invalid("read: segment %d: destination rank %d not in [0, %d)", i, s.DstRank, len(lens))
		}
		if _, err := segmentEnd(s); err != nil {
			return 0, invalid("read: segment %d source: %v", i, err)
		}
		end, err := dstEnd(s)
		if err != nil {
			return 0, invalid("read: segment %d destination: %v", i, err)
		}
		if end > lens[s.DstRank] {
			return 0, invalid("read: segment %d ends at %d, past rank %d's destination of %d bytes", i, end, s.DstRank, lens[s.DstRank])
		}
		if total+s.Bytes() < total {
			return 0, invalid("read: total bytes overflow at segment %d", i)
		}
		total += s.Bytes()
	}
	return total, nil
}

// splitPlan cuts segs into parts of about total/parallel bytes (at least
// minBytes, at most maxSegs segments each), keeping the pieces' order.
// A strided segment is split between pieces; a piece longer than what is
// left of a part is split by bytes.
func splitPlan(segs []layout.Segment, total uint64, parallel int, minBytes uint64, maxSegs int) [][]layout.Segment {
	target := max((total+uint64(parallel)-1)/uint64(parallel), minBytes, 1)
	var parts [][]layout.Segment
	var cur []layout.Segment
	var curBytes uint64
	flush := func() {
		if len(cur) > 0 {
			parts = append(parts, cur)
		}
		cur, curBytes = nil, 0
	}
	for _, s := range segs {
		var i, off uint64 // next piece, and offset in it
		for i < s.Count {
			rem := target - curBytes
			src, dstOff := s.Piece(i)
			if off == 0 && s.Length <= rem {
				k := min(rem/s.Length, s.Count-i)
				cur = append(cur, layout.Segment{
					SrcRank: s.SrcRank, DstRank: s.DstRank, SrcOffset: src, DstOffset: dstOff,
					Length: s.Length, Count: k, SrcStride: s.SrcStride, DstStride: s.DstStride,
				})
				i += k
				curBytes += k * s.Length
			} else {
				k := min(s.Length-off, rem)
				cur = append(cur, layout.Segment{
					SrcRank: s.SrcRank, DstRank: s.DstRank, SrcOffset: src + off, DstOffset: dstOff + off,
					Length: k, Count: 1,
				})
				off += k
				curBytes += k
				if off == s.Length {
					i, off = i+1, 0
				}
			}
			if curBytes >= target || len(cur) >= maxSegs {
				flush()
			}
		}
	}
	flush()
	return parts
}

// bufReaders holds the readers that gather small pieces off a stream;
// pieces of directPiece bytes and more bypass the buffer (readPiece).
var bufReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

// directPiece is the size from which a piece is read off a QUIC stream
// straight into the destination instead of through the reader's buffer:
// below it a stream read of its own (a lock and a frame look-up) costs
// more than copying the piece out of the buffer; above it the buffer
// would cost a second copy of every byte (8 KiB pieces, the heads of one
// rank in an HND re-shard, went through it).
const directPiece = 4 << 10

// readPiece fills p: what br holds already first, then the rest straight
// from r, the reader under br, if it is at least directPiece bytes.
func readPiece(br *bufio.Reader, r io.Reader, p []byte) error {
	if len(p) >= directPiece {
		if k := br.Buffered(); k > 0 {
			n, _ := br.Read(p[:min(k, len(p))]) // from the buffer alone: no error
			p = p[n:]
		}
		if len(p) >= directPiece {
			_, err := io.ReadFull(r, p)
			return err
		}
	}
	_, err := io.ReadFull(br, p)
	return err
}

// progressReader pushes a stream's read deadline forward while bytes
// arrive, so that a read of any size fails only when the holder goes
// quiet for ProgressTimeout.
type progressReader struct {
	s       *quic.Stream
	timeout time.Duration
	last    time.Time
}

func (r *progressReader) Read(p []byte) (int, error) {
	if now := time.Now(); now.Sub(r.last) > r.timeout/4 {
		r.last = now
		_ = r.s.SetReadDeadline(now.Add(r.timeout))
	}
	return r.s.Read(p)
}

// readPart runs one stream of a read.
func (p *Peer) readPart(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst [][]byte) (err error) {
	s, stop, err := p.openStream(ctx, ctx)
	if err != nil {
		return err
	}
	defer func() { stop(err) }()
	req := &transferpb.ReadRequest{LeaseId: leaseID, BlockSet: blockSet, Segments: make([]*transferpb.ReadSegment, len(segs))}
	var want uint64
	for i, sg := range segs {
		req.Segments[i] = &transferpb.ReadSegment{SrcRank: uint32(sg.SrcRank), SrcOffset: sg.SrcOffset, Length: sg.Length, Count: sg.Count, SrcStride: sg.SrcStride}
		want += sg.Bytes()
	}
	_ = s.SetWriteDeadline(time.Now().Add(p.n.cfg.ProgressTimeout))
	if err := writeFrame(s, byte(methodRead), req, p.n.cfg.MaxMessageSize); err != nil {
		s.CancelWrite(streamErrCancelled)
		return fmt.Errorf("transfer: read from %s: %w", p.name, wrapNetErr(ctx, err))
	}
	s.Close()
	pr := &progressReader{s: s, timeout: p.n.cfg.ProgressTimeout}
	var resp transferpb.ReadResponse
	if err := p.readResponse(ctx, s, pr, methodRead, &resp); err != nil {
		return err
	}
	if resp.TotalBytes != want {
		s.CancelRead(streamErrProtocol)
		return fmt.Errorf("%w: read from %s announces %d bytes, asked %d", ErrFrame, p.name, resp.TotalBytes, want)
	}
	br := bufReaders.Get().(*bufio.Reader)
	br.Reset(pr)
	defer func() {
		br.Reset(nil)
		bufReaders.Put(br)
	}()
	for _, sg := range segs {
		d := dst[sg.DstRank]
		if sg.Count == 1 || sg.DstStride == sg.Length {
			if err := readPiece(br, pr, d[sg.DstOffset:sg.DstOffset+sg.Bytes()]); err != nil {
				return p.dataErr(ctx, s, err)
			}
			continue
		}
		for i := uint64(0); i < sg.Count; i++ {
			off := sg.DstOffset + i*sg.DstStride
			if err := readPiece(br, pr, d[off:off+sg.Length]); err != nil {
				return p.dataErr(ctx, s, err)
			}
		}
	}
	// Every byte is in; retire the stream now rather than wait for the
	// holder's FIN, which can trail the data by a packet and showed as a
	// third of the throughput in BenchmarkTransfer.
	s.CancelRead(0)
	return nil
}

func (p *Peer) dataErr(ctx context.Context, s *quic.Stream, err error) error {
	s.CancelRead(streamErrCancelled)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("%w: stream ended early", ErrFrame)
	}
	return fmt.Errorf("transfer: read data from %s: %w", p.name, wrapNetErr(ctx, err))
}
