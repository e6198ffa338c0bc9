package transfer

// The reading side of RDMA: the holder's keys a lease carried, queue pairs
// per pair of devices, and reads as RDMA READs in groups and lanes.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// remoteRegion is one rank's region of a holder's block set as its NIC
// addresses it.
type remoteRegion struct {
	addr, length uint64
	key          uint64
	nic          int // the holder's device it is registered with
	// scope is the holder's endpoint the key was issued on (libfabric's
	// endpoint name; none for verbs): a key read on another endpoint of
	// the holder's (one that replaced it) may name other memory there.
	scope []byte
}

// nicPair names queue pairs by the devices at their ends: this node's
// (where the read lands) and the holder's (where the region is
// registered).
type nicPair struct{ local, remote int }

// peerRDMA is a reader's RDMA state for one peer.
type peerRDMA struct {
	// tp is the binding's own state for the peer (its connections).
	tp     rmaPeer
	mu     sync.Mutex
	leases map[uint64]map[uint64][]remoteRegion // lease -> block set -> by rank
	// keyless are the leases taken without asking for keys, during a
	// backoff: reads under them count as the backoff's.
	keyless map[uint64]bool
	// failedUntil is when RDMA to the peer may be tried again, after
	// failures failures in a row; reason says why it stopped.
	failedUntil time.Time
	failures    int
	reason      string
	noRDMA      bool // the holder offers no RDMA; asked again after Backoff
}

// maxLeasesKept bounds the leases whose keys a peer handle remembers: a
// caller that never releases cannot make it grow without bound.
const maxLeasesKept = 4096

// wantRDMA says whether a lease should ask the holder for keys.
func (p *Peer) wantRDMA() bool {
	r := p.rdma
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return !time.Now().Before(r.failedUntil)
}

// maxLeaseRegionHoles bounds the ranks below a lease's RDMA regions that
// have none (memory the holder did not register), over all its block
// sets: a lease's keys are kept for each rank up to the highest given, and
// a holder's answer must not make the reader keep more than it sent.
const maxLeaseRegionHoles = maxRank

// keepRegions validates the keys a lease carried and remembers them, as
// issued on the holder's endpoint scope (LeaseResponse.ofi_name).
func (p *Peer) keepRegions(leaseID uint64, l *Lease, regions []*transferpb.RdmaRegion, scope []byte) error {
	r := p.rdma
	if r == nil || len(regions) == 0 {
		if r != nil && l.ID != 0 && len(l.LayoutDigests) > 0 {
			p.rdmaUnavailable(FallbackPeerHasNoRDMA)
		}
		return nil
	}
	if len(regions) > len(l.LayoutDigests)*maxRank {
		return fmt.Errorf("%w: lease from %s has %d RDMA regions for %d block sets", ErrFrame, p.name, len(regions), len(l.LayoutDigests))
	}
	// First the ranks each set's regions reach, so that what is kept is
	// sized by what the lease carried: a holder leaves out the ranks whose
	// memory is not registered, but a few regions of high ranks must not
	// make the reader keep every rank below them.
	ranks := make(map[uint64]int, len(l.LayoutDigests))
	for i, g := range regions {
		if _, ok := l.LayoutDigests[g.BlockSet]; !ok {
			return fmt.Errorf("%w: lease from %s: RDMA region %d names block set %d, which the lease does not", ErrFrame, p.name, i, g.BlockSet)
		}
		if g.Rank >= maxRank || g.Length == 0 || g.Addr+g.Length < g.Addr || g.Nic >= MaxNICs {
			return fmt.Errorf("%w: lease from %s: RDMA region %d (rank %d, %d bytes at %#x, nic %d) out of range", ErrFrame, p.name, i, g.Rank, g.Length, g.Addr, g.Nic)
		}
		ranks[g.BlockSet] = max(ranks[g.BlockSet], int(g.Rank)+1)
	}
	kept := 0
	for _, n := range ranks {
		kept += n
	}
	if kept > len(regions)+maxLeaseRegionHoles {
		return fmt.Errorf("%w: lease from %s: %d RDMA regions reach %d ranks of %d block sets (at most %d ranks without a region)",
			ErrFrame, p.name, len(regions), kept, len(ranks), maxLeaseRegionHoles)
	}
	scope = bytes.Clone(scope)
	sets := make(map[uint64][]remoteRegion, len(ranks))
	for set, n := range ranks {
		sets[set] = make([]remoteRegion, n)
	}
	for _, g := range regions {
		rs := sets[g.BlockSet]
		if rs[g.Rank].length != 0 {
			return fmt.Errorf("%w: lease from %s: two RDMA regions for block set %d rank %d", ErrFrame, p.name, g.BlockSet, g.Rank)
		}
		rs[g.Rank] = remoteRegion{addr: g.Addr, length: g.Length, key: r.tp.regionKey(g), nic: int(g.Nic), scope: scope}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.leases) >= maxLeasesKept {
		for id := range r.leases { // any: a full map means leases never released
			delete(r.leases, id)
			break
		}
	}
	r.leases[leaseID] = sets
	r.noRDMA = false
	return nil
}

// forgetLease drops a lease's keys (released or abandoned).
func (p *Peer) forgetLease(id uint64) {
	if r := p.rdma; r != nil {
		r.mu.Lock()
		delete(r.leases, id)
		delete(r.keyless, id)
		r.mu.Unlock()
	}
}

// keylessLease records a lease taken without asking for keys, during a
// backoff.
func (p *Peer) keylessLease(id uint64) {
	r := p.rdma
	if r == nil || id == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.keyless) >= maxLeasesKept {
		for k := range r.keyless { // any: a full map means leases never released
			delete(r.keyless, k)
			break
		}
	}
	r.keyless[id] = true
}

// rdmaUnavailable records that RDMA to the peer cannot be used now, for
// reason, and backs off: Backoff, doubling with failures in a row.
func (p *Peer) rdmaUnavailable(reason string) {
	r := p.rdma
	cfg := p.n.rdma.cfg
	r.mu.Lock()
	d := cfg.Backoff << min(r.failures, 16)
	d = min(d, cfg.MaxBackoff)
	r.failures++
	r.failedUntil = time.Now().Add(d)
	first := r.reason != reason
	r.reason = reason
	r.noRDMA = reason == FallbackPeerHasNoRDMA
	r.mu.Unlock()
	if first {
		p.n.log.Info("reads from peer go over QUIC", "peer", p.name, "reason", reason, "retry_in", d)
	}
}

// readRDMA moves segs over RDMA if the lease carried keys for blockSet and
// the peer's RDMA is healthy. done is false when RDMA was not tried (the
// reason is counted); an error means RDMA was tried and failed, and
// nothing of it is still writing into dst.
func (p *Peer) readRDMA(ctx context.Context, leaseID, blockSet uint64, segs []layout.Segment, dst []Span, total uint64) (done bool, err error) {
	r := p.rdma
	r.mu.Lock()
	sets, haveLease := r.leases[leaseID]
	regions := sets[blockSet]
	backoff := time.Now().Before(r.failedUntil) || r.keyless[leaseID]
	noRDMA := r.noRDMA
	r.mu.Unlock()
	switch {
	case noRDMA:
		p.n.countFallback(FallbackPeerHasNoRDMA)
		return false, nil
	case backoff:
		// Keys or not: a lease taken ahead, before the failure, carries
		// them, and trying it would cost another failure (a whole
		// queue-pair timeout against a stalled holder) per chunk.
		p.n.countFallback(FallbackBackoff)
		return false, nil
	case !haveLease || len(regions) == 0:
		p.n.countFallback(FallbackPeerHasNoRDMA)
		return false, nil
	}
	locals := make([]registration, len(dst))
	local := make([]int, len(dst))
	for i, d := range dst {
		if d.Len == 0 {
			continue
		}
		mr, ok := p.n.rdma.mem.findRange(d.Addr, d.Len)
		if !ok {
			p.n.countFallback(FallbackNotRegistered)
			return false, nil
		}
		locals[i], local[i] = mr, mr.nic
	}
	// The segments by the devices at both ends: each group goes on queue
	// pairs of its own, the groups at once (a NIC per GPU reads its ranks
	// in parallel with the others).
	// The caller validated the plan against dst (ranks, ends); what is
	// left is the holder's regions, checked before any queue pair is
	// taken: a holder whose regions are too short costs none.
	var pairs []nicPair
	groups := map[nicPair][]layout.Segment{}
	groupBytes := map[nicPair]uint64{}
	for si, s := range segs {
		end, _ := segmentEnd(s)
		if s.SrcRank >= len(regions) || end > regions[s.SrcRank].length {
			p.n.countFallback(FallbackBadKeys)
			p.n.log.Warn("holder's RDMA regions do not fit the read", "peer", p.name, "lease", leaseID,
				"err", fmt.Sprintf("segment %d of rank %d ends at %d, past the holder's region for it (%d ranks given)", si, s.SrcRank, end, len(regions)))
			return false, nil
		}
		k := nicPair{local[s.DstRank], regions[s.SrcRank].nic}
		if _, ok := groups[k]; !ok {
			pairs = append(pairs, k)
		}
		groups[k] = append(groups[k], s)
		groupBytes[k] += s.Bytes()
	}
	// A pair's group large enough is cut into lanes, each on a queue
	// pair of its own: several streams of READs keep a NIC busy (and
	// softverbs' copies on more than one core).
	type job struct {
		pair  nicPair
		segs  []layout.Segment
		bytes uint64
	}
	var jobs []job
	for _, k := range pairs {
		n := groupBytes[k]
		lanes := int(min(uint64(p.n.rdma.cfg.QPsPerPeer), n/minLaneBytes))
		if lanes < 2 {
			jobs = append(jobs, job{k, groups[k], n})
			continue
		}
		for _, part := range splitPlan(groups[k], n, lanes, minLaneBytes, math.MaxInt) {
			var b uint64
			for _, s := range part {
				b += s.Bytes()
			}
			jobs = append(jobs, job{k, part, b})
		}
	}
	res := make([]groupRead, len(jobs))
	// firstFailed is the group that failed first: the others' errors may
	// be only its cancellation of them.
	firstFailed := 0
	if len(jobs) == 1 {
		res[0] = r.tp.read(ctx, leaseID, jobs[0].pair, jobs[0].segs, jobs[0].bytes, regions, dst, locals)
	} else {
		// A group that fails stops the others: the chunk is read again
		// over QUIC.
		var first atomic.Int32
		first.Store(-1)
		gctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res[i] = r.tp.read(gctx, leaseID, j.pair, j.segs, j.bytes, regions, dst, locals)
				if res[i].err != nil {
					first.CompareAndSwap(-1, int32(i))
					cancel()
				}
			}()
		}
		wg.Wait()
		cancel()
		firstFailed = max(0, int(first.Load()))
	}
	// Every group has stopped writing into dst by now.
	var errs []error
	var fallback string
	var ops, sges uint64
	var cpu time.Duration
	for _, g := range res {
		switch {
		case g.err != nil:
			errs = append(errs, g.err)
		case g.fallback != "" && fallback == "":
			fallback = g.fallback
		}
		ops, sges, cpu = ops+g.ops, sges+g.sges, cpu+g.cpu
	}
	st := p.n.rdma
	switch {
	case len(errs) > 0 && p.isClosed():
		// Not the peer's RDMA to back off from: the handle was closed.
		// Whether the read failed is decided by why (CloseReason), and
		// by the group that failed first, not by a group it stopped.
		if p.closeReason() == ClosePeerFailed && !errors.Is(res[firstFailed].err, ErrClosed) {
			st.readFails.Add(1)
		}
		return true, fmt.Errorf("transfer: rdma read from %s: %w", p.name, errors.Join(errs...))
	case len(errs) > 0 && ctx.Err() != nil:
		// The caller gave up; the read failed, not the peer's RDMA.
		st.readFails.Add(1)
		return true, fmt.Errorf("transfer: rdma read from %s: %w", p.name, errors.Join(errs...))
	case len(errs) > 0:
		st.readFails.Add(1)
		p.n.countFallback(FallbackReadFailed)
		p.rdmaUnavailable(FallbackReadFailed)
		return true, fmt.Errorf("transfer: rdma read from %s: %w", p.name, errors.Join(errs...))
	case fallback != "":
		// RDMA was not tried for part of it: the whole read goes over
		// QUIC, which writes every byte again.
		p.n.countFallback(fallback)
		if fallback == FallbackConnectFailed {
			p.rdmaUnavailable(FallbackConnectFailed)
		}
		return false, nil
	}
	st.reads.Add(1)
	st.bytes.Add(total)
	st.ops.Add(ops)
	st.sges.Add(sges)
	st.readCPU.Add(int64(cpu))
	for i, j := range jobs {
		st.nicBytes[j.pair.local].Add(res[i].bytes)
	}
	r.mu.Lock()
	r.failures = 0
	r.mu.Unlock()
	return true, nil
}

// groupRead is what reading one device pair's segments came to: err when
// RDMA was tried and failed, fallback when it was not tried (and why).
type groupRead struct {
	err              error
	fallback         string
	ops, sges, bytes uint64
	cpu              time.Duration
}
