package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// laneMinPart is the smallest part a lane read is split into: below it a
// part's request and answer cost more than a connection of its own gains.
const laneMinPart = 1 << 20

// lanePartsPerConn is how many parts a lane read is cut into per
// connection, so that a connection that runs behind takes fewer of them and
// the read does not end waiting on one large part.
const lanePartsPerConn = 8

// laneFrameBuf is the buffer a plain lane connection reads answers'
// frames through. Their data does not go through it: on Linux it is read
// straight into the destinations, many pieces per readv (readPiecesVec),
// after the few bytes the buffer read ahead with the frame. A TLS
// connection reads everything straight from its decrypted records.
const laneFrameBuf = 16 << 10

// peerLane is a reader's lane to one holder: its idle connections, a
// slot per connection it may have, and until when it is off.
type peerLane struct {
	slots chan struct{} // one per connection open or being opened

	mu        sync.Mutex
	idle      []*laneConn
	downUntil time.Time
	downWhy   string
	closed    bool
}

// laneConn is one open lane connection.
type laneConn struct {
	c        net.Conn
	r        io.Reader // c, or a buffer over it for plain TCP
	lastUsed time.Time
}

func newPeerLane(conns int) *peerLane {
	return &peerLane{slots: make(chan struct{}, conns)}
}

func (l *peerLane) close() {
	l.mu.Lock()
	idle := l.idle
	l.idle, l.closed = nil, true
	l.mu.Unlock()
	for _, lc := range idle {
		lc.c.Close()
	}
}

// LaneState says whether reads from this peer use its lane: "" if they do
// (or will try), else why not until when.
func (p *Peer) LaneState() (reason string, until time.Time) {
	if p.n.noLaneReads.Load() {
		return "off", time.Time{}
	}
	p.lane.mu.Lock()
	defer p.lane.mu.Unlock()
	if time.Now().Before(p.lane.downUntil) {
		return p.lane.downWhy, p.lane.downUntil
	}
	return "", time.Time{}
}

// laneDown turns the lane off for LaneRetryAfter and counts why.
func (p *Peer) laneDown(reason string, err error) {
	p.lane.mu.Lock()
	p.lane.downUntil = time.Now().Add(LaneRetryAfter)
	p.lane.downWhy = reason
	p.lane.mu.Unlock()
	p.n.laneFallback(reason)
	if reason != LaneFallbackNoLane {
		p.n.log.Warn("transfer: lane to peer failed; reading over QUIC", "peer", p.name, "reason", reason, "retry_after", LaneRetryAfter, "err", err)
	}
}

// readLane reads a plan over the lane. used false means the lane was not
// tried (off, or no connection could be made), and the caller reads over
// QUIC; used with an error that is not the holder's answer means it failed
// on the way, and the caller may read the same over QUIC.
func (p *Peer) readLane(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst [][]byte, total uint64, landed Landed) (used bool, err error) {
	l := p.lane
	l.mu.Lock()
	down := time.Now().Before(l.downUntil)
	l.mu.Unlock()
	if down {
		p.n.laneFallback(LaneFallbackBackoff)
		return false, nil
	}
	cfg := &p.n.cfg
	maxSegs := min(cfg.MaxSegments, max(1, int(cfg.MaxMessageSize/maxSegmentWire)-1))
	parallel := max(cap(l.slots)*lanePartsPerConn, int((total+MaxLaneReadBytes-1)/MaxLaneReadBytes))
	parts := splitPlan(segs, total, parallel, laneMinPart, maxSegs)
	conns, err := p.laneConns(ctx, min(cap(l.slots), len(parts)))
	if len(conns) == 0 {
		if ctx.Err() != nil {
			return true, fmt.Errorf("transfer: lane to %s: %w", p.name, wrapNetErr(ctx, ctx.Err()))
		}
		var re *RemoteError
		switch {
		// Any answer to lane-token but tokens: no lane there, or a holder
		// of a version without lanes (which does not know the call).
		case errors.As(err, &re) && re.Method == methodLaneToken.String():
			p.laneDown(LaneFallbackNoLane, err)
		case errors.Is(err, errLaneNotAdmitted):
			p.laneDown(LaneFallbackHelloTimeout, err)
		default:
			p.laneDown(LaneFallbackConnect, err)
		}
		return false, nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
		next     = make(chan []layout.Segment, len(parts))
	)
	for _, pt := range parts {
		next <- pt
	}
	close(next)
	for _, lc := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := p.readLaneParts(ctx, lc, leaseID, blockSet, next, dst, landed)
			if err != nil {
				errOnce.Do(func() { firstErr = err })
				cancel()
			}
			p.putLaneConn(lc, ok)
		}()
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		firstErr = fmt.Errorf("transfer: lane read from %s: %w", p.name, wrapNetErr(ctx, ctx.Err()))
	}
	return true, firstErr
}

// laneConns takes up to want lane connections, at least one: idle ones
// first, then new ones (tokens from the holder over QUIC, then dials), as
// long as the peer's connections stay within Config.LaneConns. It waits
// for the first slot when every connection is busy with other reads.
func (p *Peer) laneConns(ctx context.Context, want int) ([]*laneConn, error) {
	l := p.lane
	select {
	case l.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	got := 1
	for got < want {
		select {
		case l.slots <- struct{}{}:
			got++
			continue
		default:
		}
		break
	}
	var out []*laneConn
	stale := time.Now().Add(-p.n.cfg.LaneIdleTimeout / 2)
	l.mu.Lock()
	for len(out) < got && len(l.idle) > 0 {
		lc := l.idle[len(l.idle)-1]
		l.idle = l.idle[:len(l.idle)-1]
		if lc.lastUsed.Before(stale) {
			lc.c.Close() // the holder may be closing it
			continue
		}
		out = append(out, lc)
	}
	l.mu.Unlock()
	missing := got - len(out)
	if missing == 0 {
		return out, nil
	}
	var resp transferpb.LaneTokenResponse
	err := p.call(ctx, methodLaneToken, &transferpb.LaneTokenRequest{Count: uint32(missing)}, &resp)
	if err == nil && (resp.Port == 0 || resp.Port > 65535 || len(resp.Tokens) != missing) {
		err = fmt.Errorf("%w: lane-token from %s: port %d, %d tokens for %d asked", ErrFrame, p.name, resp.Port, len(resp.Tokens), missing)
	}
	if err != nil {
		for range missing {
			<-l.slots
		}
		return out, err
	}
	type dialed struct {
		lc  *laneConn
		err error
	}
	ch := make(chan dialed, missing)
	for _, tok := range resp.Tokens {
		go func() {
			lc, err := p.dialLane(ctx, int(resp.Port), resp.Plain, tok)
			ch <- dialed{lc, err}
		}()
	}
	var firstErr error
	for range missing {
		d := <-ch
		if d.err != nil {
			<-l.slots
			firstErr = cmpErr(firstErr, d.err)
			continue
		}
		p.n.stats.laneConnects.Add(1)
		out = append(out, d.lc)
	}
	return out, firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// putLaneConn gives a connection back: to the idle list if ok, closed
// otherwise.
func (p *Peer) putLaneConn(lc *laneConn, ok bool) {
	l := p.lane
	l.mu.Lock()
	if ok && !l.closed && !p.isClosed() {
		lc.lastUsed = time.Now()
		l.idle = append(l.idle, lc)
		lc = nil
	}
	l.mu.Unlock()
	if lc != nil {
		lc.c.Close()
	}
	<-l.slots
}

// dialLane opens one lane connection with token, within ctx and
// Config.laneDialBound of the dial, which the holder's LaneHelloTimeout
// matches from its accept: past it the connection is given up, with an
// error that matches errLaneNotAdmitted (no answer to its hello in time,
// whether the holder's port took the connection or not).
func (p *Peer) dialLane(ctx context.Context, port int, plain bool, token []byte) (*laneConn, error) {
	n := p.n
	addr := net.JoinHostPort(p.addr.IP.String(), strconv.Itoa(port))
	bound := n.cfg.laneDialBound()
	deadline := time.Now().Add(bound)
	d := net.Dialer{Deadline: deadline}
	if n.listener != nil {
		if ip := n.listener.Addr().(*net.UDPAddr).IP; !ip.IsUnspecified() {
			d.LocalAddr = &net.TCPAddr{IP: ip}
		}
	}
	fail := func(c net.Conn, err error) (*laneConn, error) {
		if c != nil {
			c.Close()
		}
		n.stats.laneConnectFails.Add(1)
		err = wrapNetErr(ctx, err)
		if ctx.Err() == nil && errors.Is(err, ErrTimeout) {
			// Past the bound: ctx has not ended, the deadline has.
			err = fmt.Errorf("%w within %v: %w", errLaneNotAdmitted, bound, err)
		}
		return nil, fmt.Errorf("transfer: lane to %s at %s: %w", p.name, addr, err)
	}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fail(nil, err)
	}
	w := watchLane(ctx, raw)
	defer w.done()
	w.setDeadline(deadline)
	var c net.Conn = raw
	if !plain {
		tc := tls.Client(raw, n.laneClientTLS(p.name))
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(raw, err)
		}
		c = tc
	}
	if err := writeFrame(c, methodLaneHello, &transferpb.LaneHello{Node: n.cfg.NodeName, Token: token}, laneHelloLimit); err != nil {
		return fail(c, err)
	}
	kind, payload, err := readFrame(c, n.cfg.MaxMessageSize)
	if err != nil {
		return fail(c, err)
	}
	if kind != statusOK {
		var e transferpb.Error
		if err := unmarshal(payload, &e); err != nil {
			return fail(c, err)
		}
		return fail(c, &RemoteError{Peer: p.name, Method: "lane-hello", Code: Code(e.Code), Message: errorMessage(e.Message)})
	}
	if !w.done() {
		return fail(c, ctx.Err())
	}
	_ = raw.SetDeadline(time.Time{}) // the watch is over: nothing else sets it
	lc := &laneConn{c: c, r: c}
	if plain {
		lc.r = bufio.NewReaderSize(c, laneFrameBuf)
	}
	return lc, nil
}

// laneProgress pushes a connection's read deadline forward while bytes
// arrive (see progressReader), through the connection's watch: once the
// read's ctx ended, the deadline it moved to the past stays there.
type laneProgress struct {
	w       *laneWatch
	r       io.Reader
	timeout time.Duration
	last    time.Time
}

func (r *laneProgress) Read(b []byte) (int, error) {
	r.refresh()
	return r.r.Read(b)
}

// refresh pushes the read deadline forward if it was last pushed more
// than a quarter of the timeout ago.
func (r *laneProgress) refresh() {
	if now := time.Now(); now.Sub(r.last) > r.timeout/4 {
		r.last = now
		r.w.setReadDeadline(now.Add(r.timeout))
	}
}

// readLaneParts reads parts from next on lc until none is left, keeping
// one request ahead: the request for the next part is written while the
// answer to the current one arrives, so that the holder starts on it as
// soon as it has sent the current one instead of idling for a round trip
// and the reader's turn-around; landed (if not nil) is told of each part
// that arrived whole, while the holder sends the next. ok says whether lc
// can carry another request afterwards.
func (p *Peer) readLaneParts(ctx context.Context, lc *laneConn, leaseID, blockSet uint64, next <-chan []layout.Segment, dst [][]byte, landed Landed) (ok bool, err error) {
	w := watchLane(ctx, lc.c)
	defer func() {
		if !w.done() {
			ok = false // the deadline was moved to the past
		}
	}()
	cur, more := <-next
	if !more || ctx.Err() != nil {
		return true, nil
	}
	if err := p.laneRequest(w, leaseID, blockSet, cur); err != nil {
		return false, p.laneErr(ctx, err)
	}
	for cur != nil {
		var ahead []layout.Segment
		var sent chan error
		if ctx.Err() == nil {
			if ahead = <-next; ahead != nil {
				sent = make(chan error, 1)
				go func() { sent <- p.laneRequest(w, leaseID, blockSet, ahead) }()
			}
		}
		ok, err = p.laneAnswer(ctx, w, lc, cur, dst)
		if sent != nil {
			if werr := <-sent; err == nil && werr != nil {
				ok, err = false, p.laneErr(ctx, werr)
			}
			// An answer to the request ahead is on its way: lc is out of
			// step once this one failed.
			ok = ok && err == nil
		}
		if err != nil {
			return ok, err
		}
		if landed != nil {
			landed(cur)
		}
		cur = ahead
	}
	return true, nil
}

// readLanePart runs one request on lc. ok says whether lc can carry
// another: false after anything but a complete answer or a refusal.
func (p *Peer) readLanePart(ctx context.Context, lc *laneConn, leaseID, blockSet uint64, segs []layout.Segment, dst [][]byte) (ok bool, err error) {
	w := watchLane(ctx, lc.c)
	defer func() {
		if !w.done() {
			ok = false // the deadline was moved to the past
		}
	}()
	if err := p.laneRequest(w, leaseID, blockSet, segs); err != nil {
		return false, p.laneErr(ctx, err)
	}
	return p.laneAnswer(ctx, w, lc, segs, dst)
}

// laneErr is err of a lane read, as the caller sees it.
func (p *Peer) laneErr(ctx context.Context, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		err = fmt.Errorf("%w: lane connection ended early", ErrFrame)
	}
	return fmt.Errorf("transfer: lane read from %s: %w", p.name, wrapNetErr(ctx, err))
}

// laneRequest writes the read request of segs on w's connection.
func (p *Peer) laneRequest(w *laneWatch, leaseID, blockSet uint64, segs []layout.Segment) error {
	req := &transferpb.ReadRequest{LeaseId: leaseID, BlockSet: blockSet, Segments: make([]*transferpb.ReadSegment, len(segs))}
	for i, sg := range segs {
		req.Segments[i] = &transferpb.ReadSegment{SrcRank: uint32(sg.SrcRank), SrcOffset: sg.SrcOffset, Length: sg.Length, Count: sg.Count, SrcStride: sg.SrcStride}
	}
	w.setWriteDeadline(time.Now().Add(p.n.cfg.ProgressTimeout))
	return writeFrame(w.c, byte(methodRead), req, p.n.cfg.MaxMessageSize)
}

// laneAnswer reads the answer to the request of segs on lc, watched by w,
// into dst. ok says whether lc can carry another request: false after
// anything but a complete answer or a refusal.
func (p *Peer) laneAnswer(ctx context.Context, w *laneWatch, lc *laneConn, segs []layout.Segment, dst [][]byte) (ok bool, err error) {
	fail := func(err error) (bool, error) { return false, p.laneErr(ctx, err) }
	var want uint64
	for _, sg := range segs {
		want += sg.Bytes()
	}
	timeout := p.n.cfg.ProgressTimeout
	pr := &laneProgress{w: w, r: lc.r, timeout: timeout}
	kind, payload, err := readFrame(pr, p.n.cfg.MaxMessageSize)
	if err != nil {
		return fail(err)
	}
	switch kind {
	case statusOK:
	case statusError:
		var e transferpb.Error
		if err := unmarshal(payload, &e); err != nil {
			return fail(err)
		}
		return true, &RemoteError{Peer: p.name, Method: methodRead.String(), Code: Code(e.Code), Message: errorMessage(e.Message)}
	default:
		return fail(fmt.Errorf("%w: status %d", ErrFrame, kind))
	}
	var resp transferpb.ReadResponse
	if err := unmarshal(payload, &resp); err != nil {
		return fail(err)
	}
	if resp.TotalBytes != want {
		return fail(fmt.Errorf("%w: announces %d bytes, asked %d", ErrFrame, resp.TotalBytes, want))
	}
	// The pieces' places are the reader's own plan's, checked against
	// dst before the read began (validateReadPlan); the holder's bytes
	// decide what lands in them, never where or how much.
	if tc, ok := lc.c.(*net.TCPConn); ok {
		err = readPiecesVec(tc, pr, segs, dst)
	} else {
		err = readPieces(pr, segs, dst)
	}
	if err != nil {
		return fail(err)
	}
	w.setReadDeadline(time.Time{})
	return true, nil
}

// readPieces reads the pieces of segs from pr into dst, one read each.
func readPieces(pr *laneProgress, segs []layout.Segment, dst [][]byte) error {
	for _, sg := range segs {
		d := dst[sg.DstRank]
		if sg.Count == 1 || sg.DstStride == sg.Length {
			if _, err := io.ReadFull(pr, d[sg.DstOffset:sg.DstOffset+sg.Bytes()]); err != nil {
				return err
			}
			continue
		}
		for i := uint64(0); i < sg.Count; i++ {
			off := sg.DstOffset + i*sg.DstStride
			if _, err := io.ReadFull(pr, d[off:off+sg.Length]); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetLaneReads turns reading over holders' lanes on or off for reads that
// start from now on (Config.NoLaneReads is the setting at start):
// benchmarks compare the lane with QUIC on the same nodes.
func (n *Node) SetLaneReads(on bool) { n.noLaneReads.Store(!on) }
