package transfer

// The libfabric binding: one RDM endpoint per node, memory registered with
// it, the holder's endpoint name in lease answers, reads as fi_read through
// ofi.Endpoint.Read. RDM endpoints are connectionless: nothing is served
// per peer, and a reader's only setup is the holder's address in its
// address vector.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// ofiTransport reads and serves over RDMAConfig.OFI. An endpoint that
// closes itself (a read given up with requests still in flight past
// ofi.Config.FlushGrace) is replaced: a new one is opened on the same
// provider, every registration made again on it, and its name handed to
// readers in lease answers from then on; until then reads and serves go
// over QUIC. Opening is retried after RDMAConfig.Backoff, doubling up to
// MaxBackoff.
type ofiTransport struct {
	n *Node
	// open opens the replacement of a broken endpoint; a test's hook, else
	// the endpoint's Reopen.
	open func(broken *ofi.Endpoint) (*ofi.Endpoint, error)

	mu     sync.Mutex
	ep     *ofi.Endpoint // the endpoint reads and serves use
	gen    uint64        // bumped with each replacement of ep
	regs   map[*ofiRegion]struct{}
	served map[leaseKey]servedLease // leases answered with ep, until they end
	// answers is read-held by each lease answer from its regions' keys to
	// its endpoint's name, and held by a replacement of the endpoint, so
	// that no answer names one endpoint with another's keys (requested
	// keys start again at 1 on each, and may name other memory there).
	answers   sync.RWMutex
	own       []*ofi.Endpoint // the replacements opened, closed with the node
	reopening bool
	closed    bool
	stop      chan struct{}
	loops     sync.WaitGroup

	reopens, reopenFails atomic.Uint64
}

func newOFITransport(n *Node, ep *ofi.Endpoint) *ofiTransport {
	return &ofiTransport{n: n, ep: ep, regs: map[*ofiRegion]struct{}{}, served: map[leaseKey]servedLease{}, stop: make(chan struct{}),
		open: func(b *ofi.Endpoint) (*ofi.Endpoint, error) { return b.Reopen() }}
}

// endpoint returns the endpoint in use and its generation.
func (t *ofiTransport) endpoint() (*ofi.Endpoint, uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ep, t.gen
}

// ofiRegion is memory registered with the endpoint, with where it lies in
// this process; its registration is made again on a replacement endpoint.
type ofiRegion struct {
	t         *ofiTransport
	addr, len uint64
	// cuda is the CUDA device the memory is on (registered by device
	// pointer, FI_HMEM_CUDA), or -1 for host memory.
	cuda int
	// r is the registration on the endpoint of generation gen, under t.mu;
	// nil once closed.
	r   *ofi.Region
	gen uint64
}

func (r *ofiRegion) Addr() uint64 { return r.addr }
func (r *ofiRegion) Len() uint64  { return r.len }

// on returns the region's registration on the endpoint of generation gen,
// or nil.
func (r *ofiRegion) on(gen uint64) *ofi.Region {
	r.t.mu.Lock()
	defer r.t.mu.Unlock()
	if r.gen != gen {
		return nil
	}
	return r.r
}

func (r *ofiRegion) Close() error {
	t := r.t
	t.mu.Lock()
	delete(t.regs, r)
	reg := r.r
	r.r = nil
	t.mu.Unlock()
	if reg == nil {
		return nil
	}
	return reg.Close()
}

func (t *ofiTransport) kind() string {
	ep, _ := t.endpoint()
	return "ofi:" + ep.Info().Provider
}

func (t *ofiTransport) region(reg registration, addr uint64, g *transferpb.RdmaRegion) {
	r, ok := reg.memRegion.(*ofiRegion)
	if !ok {
		return
	}
	t.mu.Lock()
	cur := r.r
	if r.gen != t.gen {
		cur = nil
	}
	t.mu.Unlock()
	if cur == nil {
		return // no key: answer leaves the endpoint name out too
	}
	rem := cur.Remote()
	// Without FI_MR_VIRT_ADDR the provider addresses a region by offset
	// (Remote().Addr is 0), with it by virtual address: either way the
	// span's start is the region's plus the span's offset in it.
	g.Addr, g.Key = rem.Addr+(addr-r.addr), rem.Key
}

// answer names the endpoint, unless it is broken: a reader then reads
// over QUIC (as from a holder without RDMA) until it is replaced. The
// endpoint serves (ofi.Endpoint.Serve: its progress loop polls often, as
// shm and tcp need of a holder) until the lease ends or its term passes;
// for a reader that says its reads complete inline, with
// ofi.Endpoint.ServeInline, which polls every millisecond or so while no
// other lease needs more. The claim is the reader's to make: a wrong one
// slows only its own reads under the lease (shm without cross-memory
// attach: about one request per poll), since any lease served with Serve
// sets the pace for all; and it is honoured only where it can be true:
// it names this node's endpoint of now (not one before a restart or a
// replacement), over shm (the one provider that completes reads within
// the reader's calls).
func (t *ofiTransport) answering() func() {
	t.answers.RLock()
	return t.answers.RUnlock
}

func (t *ofiTransport) answer(peer string, inlineAt []byte, resp *transferpb.LeaseResponse) {
	ep, _ := t.endpoint()
	if ep.Broken() != nil {
		return
	}
	resp.OfiName = ep.Name()
	t.serve(leaseKey{peer, resp.LeaseId}, time.Duration(resp.DurationMs)*time.Millisecond, false, inlineAt)
}

// inlineClaim says whether a reader's claim of inline reads against the
// endpoint named inlineAt holds for ep.
func inlineClaim(ep *ofi.Endpoint, inlineAt []byte) bool {
	return len(inlineAt) > 0 && ep.Info().Provider == "shm" && bytes.Equal(inlineAt, ep.Name())
}

// leaseRenewed serves a renewed lease on, inline only if the renewal says
// so again: a reader whose reads stopped completing inline withdraws it.
func (t *ofiTransport) leaseRenewed(peer string, id uint64, d time.Duration, inlineAt []byte) {
	t.serve(leaseKey{peer, id}, d, true, inlineAt)
}

func (t *ofiTransport) leaseEnded(peer string, id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, ok := t.served[leaseKey{peer, id}]; ok {
		l.done()
		delete(t.served, leaseKey{peer, id})
	}
}

// leaseKey names a lease this node answered with its endpoint.
type leaseKey struct {
	peer string
	id   uint64
}

// servedLease is a lease the endpoint serves until; inline, for a reader
// whose reads complete without the endpoint's progress (ServeInline).
type servedLease struct {
	until  time.Time
	inline bool
	done   func() // ends the endpoint's Serve
}

// serveOn makes ep serve until until, as a lease whose reader reads inline
// or not needs.
func serveOn(ep *ofi.Endpoint, until time.Time, inline bool) func() {
	if inline {
		return ep.ServeInline(until)
	}
	return ep.Serve(until)
}

// serve makes the endpoint serve lease k for d from now: a lease answered
// with the endpoint, or, with renew, one renewed that it serves; inline if
// its reader's claim (inlineAt) holds for the endpoint it is served on.
func (t *ofiTransport) serve(k leaseKey, d time.Duration, renew bool, inlineAt []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	for o, l := range t.served {
		if !l.until.After(now) {
			l.done()
			delete(t.served, o)
		}
	}
	old, ok := t.served[k]
	if t.closed || (renew && !ok) {
		return
	}
	if ok {
		old.done()
	}
	inline := inlineClaim(t.ep, inlineAt)
	until := now.Add(d)
	t.served[k] = servedLease{until: until, inline: inline, done: serveOn(t.ep, until, inline)}
}

func (t *ofiTransport) servedConns() int { return 0 }

// dropServed ends the serving of peer's leases: it left, or its
// connections closed.
func (t *ofiTransport) dropServed(peer string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, l := range t.served {
		if k.peer == peer {
			l.done()
			delete(t.served, k)
		}
	}
}

// close stops a replacement under way and closes the replacements made.
func (t *ofiTransport) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	close(t.stop)
	for k, l := range t.served {
		l.done()
		delete(t.served, k)
	}
	t.mu.Unlock()
	t.loops.Wait()
	t.mu.Lock()
	own := t.own
	t.own = nil
	t.mu.Unlock()
	for _, ep := range own {
		ep.Close()
	}
}

func (t *ofiTransport) newPeer(p *Peer) rmaPeer { return &ofiPeer{t: t, p: p} }

// register registers [addr, addr+length) with the endpoint: host memory,
// or with cuda >= 0 memory of that CUDA device.
func (t *ofiTransport) register(addr, length uint64, cuda int) (memRegion, rdma.RegistrationStats, error) {
	start := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	r, err := registerOn(t.ep, addr, length, cuda)
	if err != nil {
		return nil, rdma.RegistrationStats{}, err
	}
	mr := &ofiRegion{t: t, addr: addr, len: length, cuda: cuda, r: r, gen: t.gen}
	t.regs[mr] = struct{}{}
	return mr, rdma.RegistrationStats{Bytes: length, Duration: time.Since(start)}, nil
}

func registerOn(ep *ofi.Endpoint, addr, length uint64, cuda int) (*ofi.Region, error) {
	if cuda >= 0 {
		return ep.RegisterCUDA(uintptr(addr), length, cuda)
	}
	return ep.Register(uintptr(addr), length)
}

// RegisterCUDA registers length bytes at addr, a device pointer of CUDA
// device dev, with the node's libfabric endpoint (fi_mr_regattr with
// FI_HMEM_CUDA), for a provider that offers FI_HMEM
// (ofi.ProviderInfo.DevicePlan): peers read it and this node's reads land
// in it with no host copy. nic must be 0. Over libibverbs, or a provider
// without FI_HMEM, it returns an error wrapping rdma.ErrNotSupported or
// ofi.ErrNotSupported.
func (n *Node) RegisterCUDA(nic, dev int, addr, length uint64) (rdma.RegistrationStats, error) {
	if err := n.checkNewSpan(nic, addr, length); err != nil {
		return rdma.RegistrationStats{}, err
	}
	t, ok := n.rdma.tp.(*ofiTransport)
	if !ok {
		return rdma.RegistrationStats{}, fmt.Errorf("transfer: register CUDA memory of %d bytes at %#x: %w: by device ordinal only over libfabric",
			length, addr, rdma.ErrNotSupported)
	}
	if dev < 0 {
		return rdma.RegistrationStats{}, fmt.Errorf("transfer: register CUDA memory: %w: device %d", ErrInvalidRequest, dev)
	}
	mr, stats, err := t.register(addr, length, dev)
	if err != nil {
		return rdma.RegistrationStats{}, fmt.Errorf("transfer: register CUDA memory of device %d, %d bytes at %#x: %w", dev, length, addr, err)
	}
	return stats, n.rdma.mem.add(mr, nic)
}

// broke starts replacing ep, which closed itself because of why, unless
// it is already replaced or being replaced.
func (t *ofiTransport) broke(ep *ofi.Endpoint, why error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.reopening || ep != t.ep {
		return
	}
	t.reopening = true
	t.n.log.Warn("libfabric endpoint closed: reads go over QUIC until it is reopened", "provider", ep.Info().Provider, "err", why)
	t.loops.Add(1)
	go t.reopen(ep)
}

// reopen opens a replacement for broken until one opens, with backoff.
func (t *ofiTransport) reopen(broken *ofi.Endpoint) {
	defer t.loops.Done()
	cfg := &t.n.rdma.cfg
	wait, start := cfg.Backoff, time.Now()
	for attempt := 1; ; attempt++ {
		err := t.replace(broken)
		if err == nil {
			t.reopens.Add(1)
			ep, _ := t.endpoint()
			t.n.log.Info("libfabric endpoint reopened", "provider", ep.Info().Provider, "attempts", attempt,
				"took", time.Since(start).Round(time.Millisecond))
			return
		}
		t.reopenFails.Add(1)
		t.n.log.Warn("libfabric endpoint reopen failed", "attempt", attempt, "retry_in", wait, "err", err)
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-t.stop:
			timer.Stop()
			return
		}
		wait = min(2*wait, cfg.MaxBackoff)
	}
}

// replace opens a new endpoint, registers every region on it, and puts it
// in broken's place.
func (t *ofiTransport) replace(broken *ofi.Endpoint) error {
	ep, err := t.open(broken)
	if err != nil {
		return err
	}
	t.answers.Lock() // no lease answer half on the old endpoint, half on this
	defer t.answers.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		ep.Close()
		return fmt.Errorf("transfer: libfabric endpoint: %w", ErrClosed)
	}
	made := make(map[*ofiRegion]*ofi.Region, len(t.regs))
	for r := range t.regs {
		nr, err := registerOn(ep, r.addr, r.len, r.cuda)
		if err != nil {
			ep.Close() // and the registrations made on it
			return fmt.Errorf("register %d bytes at %#x again: %w", r.len, r.addr, err)
		}
		made[r] = nr
	}
	t.gen++
	for r, nr := range made {
		r.r, r.gen = nr, t.gen
	}
	t.ep, t.reopening = ep, false
	t.own = append(t.own, ep)
	// Leases answered before go on being served, by the new endpoint,
	// with its full progress: a claim of inline reads named the endpoint
	// replaced (a renewal may make it again of this one).
	for k, l := range t.served {
		l.done()
		t.served[k] = servedLease{until: l.until, done: ep.Serve(l.until)}
	}
	return nil
}

// ofiPeer is a reader's libfabric state for one holder: its endpoint name
// as the last lease answer gave it, and its address once inserted.
type ofiPeer struct {
	t *ofiTransport
	p *Peer

	mu     sync.Mutex
	name   []byte        // the holder's endpoint name
	ep     *ofi.Endpoint // the endpoint addr is inserted in
	addr   ofi.Peer      // name's address, when inserted
	added  bool
	closed bool
	// reading counts the reads posting to an address of the peer; an
	// address they may use leaves the address vector only once none does
	// (stale), since a provider frees the peer's connection with it.
	reading int
	stale   []staleAddr
	// inline: the last read from the holder that said either way
	// (ofi.ReadResult) completed inline, on endpoint inlineOn against the
	// holder's endpoint named inlineAt; the next leases and renewals say
	// so, naming it.
	inline   bool
	inlineOn *ofi.Endpoint
	inlineAt []byte
}

type staleAddr struct {
	ep   *ofi.Endpoint
	addr ofi.Peer
}

func (v *ofiPeer) regionKey(g *transferpb.RdmaRegion) uint64 { return g.Key }

// errNoEndpointName: a lease answer carried regions but no endpoint name,
// as a holder does that predates LeaseRequest.rma and answers every reader
// with its verbs regions.
var errNoEndpointName = errors.New("regions without a libfabric endpoint name")

func (v *ofiPeer) answered(resp *transferpb.LeaseResponse) error {
	if len(resp.OfiName) == 0 {
		return errNoEndpointName
	}
	if len(resp.OfiName) > ofi.MaxNameLen {
		return fmt.Errorf("libfabric endpoint name of %d bytes, at most %d", len(resp.OfiName), ofi.MaxNameLen)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if bytes.Equal(v.name, resp.OfiName) {
		return nil
	}
	// A holder that restarted has a new endpoint: reads under its earlier
	// leases fail and fall back, and how reads from it complete is not
	// known yet.
	v.forgetLocked()
	v.name = bytes.Clone(resp.OfiName)
	v.inline = false
	return nil
}

// readsInline is the holder's endpoint name that the last read from the
// holder that showed either way completed inline against, if it did, on
// the endpoint in use now.
func (v *ofiPeer) readsInline() []byte {
	ep, _ := v.t.endpoint()
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.inline || v.inlineOn != ep {
		return nil
	}
	return v.inlineAt
}

// readWas records how a read on ep from the holder's endpoint named name
// completed: a read that waited for progress, or failed, ends the claim;
// one that completed inline makes it; one of a single request leaves it as
// it was.
func (v *ofiPeer) readWas(ep *ofi.Endpoint, name []byte, res ofi.ReadResult, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case err != nil || res.Pending:
		v.inline = false
	case res.Inline:
		v.inline, v.inlineOn, v.inlineAt = true, ep, name
	}
}

// forgetLocked takes the peer's address out of the address vector, at
// once or when the last read using it ends.
func (v *ofiPeer) forgetLocked() {
	if !v.added {
		return
	}
	v.added = false
	if v.reading > 0 {
		v.stale = append(v.stale, staleAddr{v.ep, v.addr})
		return
	}
	v.ep.RemovePeer(v.addr)
}

// done ends a read that peerAddr began.
func (v *ofiPeer) done() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.reading--
	if v.reading == 0 {
		for _, a := range v.stale {
			a.ep.RemovePeer(a.addr)
		}
		v.stale = nil
	}
}

// peerAddr inserts the holder's endpoint name into the address vector,
// once, and begins a read to it: the caller calls done when the read has
// ended. It returns the address and the name it is of, or
// errKeysOfAnotherEndpoint when the holder's name is not scope, the one
// the read's keys were issued on.
func (v *ofiPeer) peerAddr(ep *ofi.Endpoint, scope []byte) (ofi.Peer, []byte, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.closed && !bytes.Equal(v.name, scope) {
		return ofi.Peer{}, nil, errKeysOfAnotherEndpoint
	}
	if v.added && v.ep != ep {
		// Inserted in an endpoint since replaced.
		v.forgetLocked()
	}
	switch {
	case v.closed:
		return ofi.Peer{}, nil, fmt.Errorf("transfer: peer %s: %w", v.p.name, ErrClosed)
	case v.added:
		v.reading++
		return v.addr, v.name, nil
	case len(v.name) == 0:
		return ofi.Peer{}, nil, fmt.Errorf("transfer: peer %s gave no libfabric endpoint name", v.p.name)
	}
	a, err := ep.AddPeer(v.name)
	if err != nil {
		return ofi.Peer{}, nil, err
	}
	v.ep, v.addr, v.added = ep, a, true
	v.reading++
	return a, v.name, nil
}

func (v *ofiPeer) read(ctx context.Context, leaseID uint64, k nicPair, segs []layout.Segment, n uint64, regions []remoteRegion, dst []Span, locals []registration) groupRead {
	p, st := v.p, v.p.n.rdma
	ep, gen := v.t.endpoint()
	if ep.Broken() != nil {
		// Being replaced: the reads that broke it started that.
		return groupRead{fallback: FallbackConnectFailed}
	}
	// Keys are read only on the endpoint they were issued on: one that
	// replaced it (the holder restarted, or replaced a broken one) may
	// have issued the same key for other memory. A lease answered before
	// the holder's newest name falls back.
	var scope []byte
	for i, s := range segs {
		if rs := regions[s.SrcRank].scope; i == 0 {
			scope = rs
		} else if !bytes.Equal(rs, scope) {
			return groupRead{fallback: FallbackBadKeys}
		}
	}
	addr, name, err := v.peerAddr(ep, scope)
	if err != nil {
		if errors.Is(err, ErrClosed) {
			return groupRead{err: err}
		}
		if errors.Is(err, errKeysOfAnotherEndpoint) {
			p.n.log.Info("libfabric keys of a lease are of another endpoint of the holder's; reading over QUIC", "peer", p.name, "lease", leaseID)
			return groupRead{fallback: FallbackBadKeys}
		}
		st.connectFails.Add(1)
		p.n.log.Warn("libfabric peer address failed", "peer", p.name, "err", err)
		return groupRead{fallback: FallbackConnectFailed}
	}
	defer v.done()
	// ofi reads land in one registered region each: the pieces by the
	// destination registration they write into.
	var order []*ofi.Region
	byReg := map[*ofi.Region][]ofi.Segment{}
	current := map[*ofiRegion]*ofi.Region{}
	for _, s := range segs {
		loc, ok := locals[s.DstRank].memRegion.(*ofiRegion)
		if !ok || s.Length == 0 {
			continue
		}
		lr, seen := current[loc]
		if !seen {
			lr = loc.on(gen)
			current[loc] = lr
		}
		if lr == nil {
			// Registered again on another endpoint since, or closed.
			return groupRead{fallback: FallbackNotRegistered}
		}
		reg := regions[s.SrcRank]
		base := dst[s.DstRank].Addr - loc.addr
		if _, seen := byReg[lr]; !seen {
			order = append(order, lr)
		}
		for i := uint64(0); i < s.Count; i++ {
			src, d := s.Piece(i)
			byReg[lr] = append(byReg[lr], ofi.Segment{LocalOff: base + d, RemoteOff: src, Len: s.Length,
				Remote: ofi.Remote{Addr: reg.addr, Len: reg.length, Key: reg.key}})
		}
	}
	g := groupRead{bytes: n}
	rctx, cancel := context.WithTimeout(ctx, st.cfg.OFIReadTimeout)
	defer cancel()
	for _, lr := range order {
		ss := byReg[lr]
		res, err := ep.ReadDetailed(rctx, addr, lr, ss)
		v.readWas(ep, name, res, err)
		if err != nil {
			if why := ep.Broken(); why != nil {
				v.t.broke(ep, why)
			}
			g.err = err
			return g
		}
		g.ops++
		g.sges += uint64(len(ss))
	}
	return g
}

// errKeysOfAnotherEndpoint refuses a read whose keys a lease carried from
// an endpoint of the holder's that another has replaced since.
var errKeysOfAnotherEndpoint = errors.New("transfer: the lease's keys are of another endpoint of the holder's")

func (v *ofiPeer) close() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.closed = true
	v.forgetLocked()
}
