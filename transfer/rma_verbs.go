package transfer

// The verbs binding: RC queue pairs per pair of devices, connected over the
// control channel (rdma-connect), reads as RDMA READs with scatter lists.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// verbsTransport reads and serves over libibverbs: RDMAConfig.Devices.
type verbsTransport struct {
	n      *Node
	mu     sync.Mutex
	served map[string][]servedQP // by peer, oldest first
}

func newVerbsTransport(n *Node) *verbsTransport {
	return &verbsTransport{n: n, served: map[string][]servedQP{}}
}

// servedQP is a queue pair a peer reads on, between this node's device
// pair.local and the reader's pair.remote.
type servedQP struct {
	*rdma.QueuePair
	pair nicPair
}

func (t *verbsTransport) newPeer(p *Peer) rmaPeer {
	return &verbsPeer{p: p, wait: make(chan struct{}), qps: map[nicPair]*qpPool{}}
}

func (t *verbsTransport) kind() string { return "" }

func (t *verbsTransport) region(reg registration, addr uint64, g *transferpb.RdmaRegion) {
	g.Addr = addr
	if mr, ok := reg.memRegion.(*rdma.MemoryRegion); ok {
		g.Rkey = mr.RKey()
	}
}

func (t *verbsTransport) answer(string, []byte, *transferpb.LeaseResponse) {}

func (t *verbsTransport) answering() func() { return func() {} }

// A NIC serves reads by itself: leases need nothing of the binding.
func (t *verbsTransport) leaseRenewed(string, uint64, time.Duration, []byte) {}
func (t *verbsTransport) leaseEnded(string, uint64)                          {}

func (v *verbsPeer) regionKey(g *transferpb.RdmaRegion) uint64 { return uint64(g.Rkey) }

func (v *verbsPeer) answered(*transferpb.LeaseResponse) error { return nil }

// readsInline is nil: a verbs holder's NIC serves reads with no progress
// of its own, and it asks nothing of readers.
func (v *verbsPeer) readsInline() []byte { return nil }

func (t *verbsTransport) servedConns() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, qps := range t.served {
		n += len(qps)
	}
	return n
}

// dropServed destroys the queue pairs served to peer.
func (t *verbsTransport) dropServed(peer string) {
	t.mu.Lock()
	qps := t.served[peer]
	delete(t.served, peer)
	t.mu.Unlock()
	for _, q := range qps {
		q.Close()
	}
}

// close destroys the queue pairs served.
func (t *verbsTransport) close() {
	t.mu.Lock()
	for peer, qps := range t.served {
		for _, q := range qps {
			q.Close()
		}
		delete(t.served, peer)
	}
	t.mu.Unlock()
}

// verbsPeer is the queue pairs a reader keeps to one peer.
type verbsPeer struct {
	p        *Peer
	mu       sync.Mutex
	qps      map[nicPair]*qpPool
	wait     chan struct{}
	connects []time.Time
}

// qpPool is the queue pairs between one pair of devices.
type qpPool struct {
	idle []*rdma.QueuePair
	open int // connected queue pairs, idle or reading
}

// read moves segs, n bytes all between the devices of k, on a queue pair
// of k.
func (v *verbsPeer) read(ctx context.Context, leaseID uint64, k nicPair, segs []layout.Segment, n uint64, regions []remoteRegion, dst []Span, locals []registration) groupRead {
	p := v.p
	lkeys := make([]uint32, len(locals))
	for i, reg := range locals {
		if mr, ok := reg.memRegion.(*rdma.MemoryRegion); ok {
			lkeys[i] = mr.LKey()
		}
	}
	qp, err := v.takeQP(ctx, k)
	if err != nil {
		switch {
		case errors.Is(err, errConnectLimited):
			return groupRead{fallback: FallbackConnectLimited}
		case ctx.Err() != nil, errors.Is(err, ErrClosed):
			return groupRead{err: err}
		}
		return groupRead{fallback: FallbackConnectFailed}
	}
	ops, sges, err := readOps(segs, regions, dst, lkeys, qp.Options().MaxSGE)
	if err != nil {
		v.putQP(k, qp, true)
		p.n.log.Warn("holder's RDMA regions do not fit the read", "peer", p.name, "lease", leaseID, "err", err)
		return groupRead{fallback: FallbackBadKeys}
	}
	cpu0 := qp.ReadCPU()
	err = qp.Read(ctx, ops)
	g := groupRead{ops: uint64(len(ops)), sges: uint64(sges), bytes: n, cpu: qp.ReadCPU() - cpu0}
	v.putQP(k, qp, err != nil)
	if err != nil {
		g.err = err
	}
	return g
}

var errConnectLimited = errors.New("transfer: rdma connects to the peer at their cap for this minute")

// takeQP returns an idle connected queue pair between the devices of k,
// connecting a new one while fewer than QPsPerPeer are open, or waits for
// one to be given back.
func (v *verbsPeer) takeQP(ctx context.Context, k nicPair) (*rdma.QueuePair, error) {
	p := v.p
	r := v
	cfg := p.n.rdma.cfg
	for {
		r.mu.Lock()
		// Under the lock that close's wake-up takes: a close is seen
		// here, or wakes the wait below.
		if p.isClosed() {
			r.mu.Unlock()
			return nil, fmt.Errorf("transfer: peer %s: %w", p.name, ErrClosed)
		}
		pool := r.qps[k]
		if pool == nil {
			pool = &qpPool{}
			r.qps[k] = pool
		}
		if n := len(pool.idle); n > 0 {
			q := pool.idle[n-1]
			pool.idle = pool.idle[:n-1]
			r.mu.Unlock()
			return q, nil
		}
		if pool.open < cfg.QPsPerPeer {
			now := time.Now()
			for len(r.connects) > 0 && now.Sub(r.connects[0]) > time.Minute {
				r.connects = r.connects[1:]
			}
			if len(r.connects) >= cfg.MaxConnectsPerMinute*len(cfg.Devices) {
				r.mu.Unlock()
				return nil, errConnectLimited
			}
			r.connects = append(r.connects, now)
			pool.open++
			r.mu.Unlock()
			q, err := v.connectQP(ctx, k)
			if err != nil {
				r.mu.Lock()
				pool.open--
				v.signalQPLocked()
				r.mu.Unlock()
				return nil, err
			}
			return q, nil
		}
		wait := r.wait
		r.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// putQP gives a queue pair of k back after a read; a failed one is
// destroyed (the next read connects a fresh one, within
// MaxConnectsPerMinute).
func (v *verbsPeer) putQP(k nicPair, q *rdma.QueuePair, failed bool) {
	p := v.p
	r := v
	r.mu.Lock()
	pool := r.qps[k]
	drop := failed || p.isClosed()
	if drop {
		pool.open--
	} else {
		pool.idle = append(pool.idle, q)
	}
	v.signalQPLocked()
	r.mu.Unlock()
	if drop {
		q.Close()
	}
}

// signalQPLocked wakes the reads waiting for a queue pair of the peer. The
// verbsPeer's mu must be held.
func (v *verbsPeer) signalQPLocked() {
	close(v.wait)
	v.wait = make(chan struct{})
}

// connectQP makes a queue pair on this node's device k.local, has the
// holder make one on its device k.remote connected to it, and connects
// ours to the holder's.
func (v *verbsPeer) connectQP(ctx context.Context, k nicPair) (*rdma.QueuePair, error) {
	p := v.p
	st := p.n.rdma
	fail := func(err error) (*rdma.QueuePair, error) {
		if ctx.Err() != nil {
			return nil, err // given up (another lane failed, or the caller), not failed
		}
		st.connectFails.Add(1)
		p.n.log.Warn("rdma connect failed", "peer", p.name, "nic", k.local, "peer_nic", k.remote, "err", err)
		return nil, err
	}
	q, err := st.cfg.Devices[k.local].NewQueuePair(st.cfg.QP)
	if err != nil {
		return fail(fmt.Errorf("transfer: rdma queue pair: %w", err))
	}
	var resp transferpb.RdmaConnectResponse
	req := &transferpb.RdmaConnectRequest{Endpoint: endpointProto(q.Endpoint()), Nic: uint32(k.remote), ReaderNic: uint32(k.local),
		QueuePairs: uint32(st.cfg.QPsPerPeer)}
	if err := p.call(ctx, methodRdmaConnect, req, &resp); err != nil {
		q.Close()
		return fail(err)
	}
	remote, err := endpointFrom(resp.Endpoint)
	if err != nil {
		q.Close()
		return fail(fmt.Errorf("transfer: rdma connect answer from %s: %w", p.name, err))
	}
	if err := q.Connect(remote); err != nil {
		q.Close()
		return fail(fmt.Errorf("transfer: connect queue pair to %s's %d: %w", p.name, remote.QPN, err))
	}
	st.connects.Add(1)
	return q, nil
}

// close destroys the peer handle's idle queue pairs (the busy ones
// when they are given back).
func (v *verbsPeer) close() {
	r := v
	r.mu.Lock()
	var idle []*rdma.QueuePair
	for _, pool := range r.qps {
		idle = append(idle, pool.idle...)
		pool.open -= len(pool.idle)
		pool.idle = nil
	}
	// Reads waiting for a queue pair see the handle closed.
	v.signalQPLocked()
	r.mu.Unlock()
	for _, q := range idle {
		q.Close()
	}
}

// readOps turns a plan's segments into RDMA READs (rdma.Coalesce merges
// pieces contiguous in the holder's memory into one work request with a
// scatter list, and pieces contiguous on both sides into one entry). It
// first checks every segment against the holder's region (its announced
// length). It returns the ops and the scatter entries they hold.
func readOps(segs []layout.Segment, regions []remoteRegion, dst []Span, lkeys []uint32, maxSGE int) ([]rdma.ReadOp, int, error) {
	n := uint64(0)
	for _, s := range segs {
		n += s.Count
	}
	pieces := make([]rdma.Piece, 0, n)
	for si, s := range segs {
		if s.SrcRank < 0 || s.SrcRank >= len(regions) || regions[s.SrcRank].length == 0 {
			return nil, 0, fmt.Errorf("segment %d reads rank %d, which the holder gave no RDMA region for", si, s.SrcRank)
		}
		reg := regions[s.SrcRank]
		end, err := segmentEnd(s)
		if err != nil {
			return nil, 0, fmt.Errorf("segment %d: %w", si, err)
		}
		if end > reg.length {
			return nil, 0, fmt.Errorf("segment %d ends at %d, past rank %d's region of %d bytes", si, end, s.SrcRank, reg.length)
		}
		base := dst[s.DstRank].Addr
		for i := uint64(0); i < s.Count; i++ {
			src, d := s.Piece(i)
			pieces = append(pieces, rdma.Piece{RemoteAddr: reg.addr + src, RKey: uint32(reg.key), LocalAddr: base + d, LKey: lkeys[s.DstRank], Length: s.Length})
		}
	}
	ops, err := rdma.Coalesce(pieces, maxSGE)
	if err != nil {
		return nil, 0, err
	}
	sges := 0
	for _, op := range ops {
		sges += len(op.Local)
	}
	return ops, sges, nil
}

// endpointProto and endpointFrom convert endpoints to and from the wire.
func endpointProto(e rdma.Endpoint) *transferpb.RdmaEndpoint {
	return &transferpb.RdmaEndpoint{Qpn: e.QPN, Psn: e.PSN, Gid: append([]byte(nil), e.GID[:]...), Lid: uint32(e.LID),
		Mtu: uint32(e.MTU), LinkLayer: uint32(e.LinkLayer), ReadDepth: uint32(e.ReadDepth)}
}

func endpointFrom(pb *transferpb.RdmaEndpoint) (rdma.Endpoint, error) {
	if pb == nil {
		return rdma.Endpoint{}, invalid("rdma connect: no endpoint")
	}
	if len(pb.Gid) != 0 && len(pb.Gid) != 16 {
		return rdma.Endpoint{}, invalid("rdma connect: gid of %d bytes, want 16", len(pb.Gid))
	}
	if pb.Lid > 0xffff || pb.Mtu > 4096 || pb.LinkLayer > 255 || pb.ReadDepth > 255 {
		return rdma.Endpoint{}, invalid("rdma connect: lid %d, mtu %d, link layer %d or read depth %d out of range", pb.Lid, pb.Mtu, pb.LinkLayer, pb.ReadDepth)
	}
	e := rdma.Endpoint{QPN: pb.Qpn, PSN: pb.Psn, LID: uint16(pb.Lid), MTU: int(pb.Mtu),
		LinkLayer: rdma.LinkLayer(pb.LinkLayer), ReadDepth: int(pb.ReadDepth)}
	copy(e.GID[:], pb.Gid)
	if err := e.Validate(); err != nil {
		return rdma.Endpoint{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return e, nil
}

// serveConnect makes a queue pair on this node's device k.local connected
// to the reader's endpoint on its device k.remote, and answers with its
// own. A peer keeps at most twice the queue pairs it reads on per pair of
// devices (qps, as it says, at least this node's QPsPerPeer), and
// 2×MaxQPsPerPeer×MaxNICs in all: a new one replaces the oldest of its
// pair, or the peer's oldest (a reader reconnects after a failure, and its
// old queue pair is dead).
func (n *Node) serveConnect(peer string, k nicPair, qps int, remote rdma.Endpoint) (*transferpb.RdmaConnectResponse, error) {
	r := n.rdma
	if r == nil {
		return nil, fmt.Errorf("%w: this node has no RDMA", ErrUnavailable)
	}
	vt, ok := r.tp.(*verbsTransport)
	if !ok {
		return nil, fmt.Errorf("%w: this node does not read over libibverbs", ErrUnavailable)
	}
	if k.local < 0 || k.local >= len(r.cfg.Devices) {
		return nil, invalid("rdma connect: nic %d: this node has %d RDMA devices", k.local, len(r.cfg.Devices))
	}
	qp, err := r.cfg.Devices[k.local].NewQueuePair(r.cfg.QP)
	if err != nil {
		return nil, fmt.Errorf("%w: queue pair: %w", ErrUnavailable, err)
	}
	if err := qp.Connect(remote); err != nil {
		qp.Close()
		return nil, fmt.Errorf("%w: connect queue pair to %s's %d: %w", ErrUnavailable, peer, remote.QPN, err)
	}
	vt.mu.Lock()
	served := append(vt.served[peer], servedQP{qp, k})
	var old []servedQP
	perPair, all := 2*max(r.cfg.QPsPerPeer, min(qps, MaxQPsPerPeer)), 2*MaxQPsPerPeer*MaxNICs
	on := 0
	for _, q := range served {
		if q.pair == k {
			on++
		}
	}
	keep := served[:0:0]
	for _, q := range served { // oldest first
		switch {
		case q.pair == k && on > perPair:
			on--
		case q.pair != k && len(served)-len(old) > all:
		default:
			keep = append(keep, q)
			continue
		}
		old = append(old, q)
	}
	vt.served[peer] = keep
	vt.mu.Unlock()
	for _, q := range old {
		q.Close()
	}
	return &transferpb.RdmaConnectResponse{Endpoint: endpointProto(qp.Endpoint())}, nil
}
