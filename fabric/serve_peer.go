package fabric

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// peerService serves the calls peers make to read this node's blocks: it is the
// agent's transfer.Handler.
type peerService struct {
	a    *Agent
	book *leaseBook
}

func newPeerService(a *Agent) *peerService {
	return &peerService{a: a, book: newLeaseBook()}
}

// leaseCaps are the most blocks one peer, and all peers together, may
// hold leased on this node: the configured caps, else half and three
// quarters of the usable slots of this node's block sets (a retired slot
// holds no block to lease).
func (h *peerService) leaseCaps() (perPeer, total int) {
	slots := 0
	for _, s := range h.a.engineSets() {
		slots += s.set.Usable()
	}
	perPeer, total = h.a.cfg.MaxLeasedPerPeer, h.a.cfg.MaxLeased
	if perPeer == 0 {
		perPeer = max(1, slots/2)
	}
	if total == 0 {
		total = max(1, slots*3/4)
	}
	return perPeer, total
}

// peerGone ends every lease peer holds here at once, rather than at the
// end of its term: its connections closed, or membership says it left or
// failed. Its reads under them are refused from now on, and the pool's
// generations keep a read already under way from being trusted.
func (h *peerService) peerGone(peer, why string) {
	ids, granted := h.book.removePeer(peer)
	for i, id := range ids {
		h.a.pool.ReleaseLease(id)
		h.a.stats.leaseHold.record(time.Since(granted[i]))
	}
	if len(ids) > 0 {
		h.a.stats.leasesEndedEarly.Add(uint64(len(ids)))
		h.a.log.Info("leases of a departed peer released", "peer", peer, "leases", len(ids), "why", why)
	}
}

var _ transfer.Handler = (*peerService)(nil)

func (h *peerService) Hello(ctx context.Context, peer string, req transfer.HelloInfo) (transfer.HelloInfo, error) {
	return transfer.HelloInfo{Features: []string{"quic"}, LayoutSetDigest: h.a.layoutSetDigest()}, nil
}

func (h *peerService) Layouts(ctx context.Context, peer string, digests [][]byte) ([]transfer.LayoutEntry, error) {
	var out []transfer.LayoutEntry
	for _, s := range h.a.engineSets() {
		l := s.set.Layout()
		d := l.Digest()
		if len(digests) > 0 && !containsDigest(digests, d[:]) {
			continue
		}
		out = append(out, transfer.LayoutEntry{Digest: d[:], BlockSet: uint64(s.set.ID()), Layout: l.Marshal()})
	}
	return out, nil
}

func containsDigest(list [][]byte, d []byte) bool {
	for _, x := range list {
		if bytes.Equal(x, d) {
			return true
		}
	}
	return false
}

// grant is the term this node grants for a lease or renewal asked for d:
// the holder decides how long its memory is pinned, and never pins it
// longer than its own LeaseDuration whatever a peer asks.
func (h *peerService) grant(d time.Duration) time.Duration {
	return min(d, h.a.cfg.LeaseDuration)
}

// Lease pins the leading blocks of hashes in the block set that holds the
// longest prefix of them, for at most this node's LeaseDuration.
func (h *peerService) Lease(ctx context.Context, peer string, hashes []uint64, d time.Duration) (transfer.Lease, error) {
	d = h.grant(d)
	out := transfer.Lease{Duration: d, Blocks: make([]transfer.LeasedBlock, len(hashes))}
	for i, x := range hashes {
		out.Blocks[i].Hash = x
	}
	release := h.a.stageForPeer(ctx, hashes) // disk-held blocks into host slots
	defer release()
	var best *pool.BlockSet
	bestN := 0
	for _, s := range h.a.engineSets() {
		n := 0
		for _, x := range hashes {
			if _, ok := s.set.Lookup(x); !ok {
				break
			}
			n++
		}
		if n > bestN {
			best, bestN = s.set, n
		}
	}
	if best == nil {
		return out, nil
	}
	perPeer, total := h.leaseCaps()
	now := time.Now()
	n := h.book.reserve(peer, bestN, perPeer, total, now)
	if n == 0 {
		mine, all := h.book.leased(peer)
		return out, fmt.Errorf("%w: lease cap reached: %s holds %d leased blocks here (cap %d per peer), all peers %d (cap %d); retry as leases end",
			transfer.ErrUnavailable, peer, mine, perPeer, all, total)
	}
	id, blocks, err := best.Lease(hashes[:n], d)
	if err != nil || id == 0 {
		h.book.unreserve(peer, n)
		if err != nil {
			return out, leaseError(err)
		}
		return out, nil // recycled between the look-up and the lease
	}
	found := 0
	for _, b := range blocks {
		if b.Found {
			found++
		}
	}
	// The book's deadline is taken after the pool's, so that the book never
	// forgets a lease the pool still holds.
	h.book.add(id, peer, n, found, time.Now().Add(d))
	out.ID = uint64(id)
	out.Capped = n < bestN
	digest := best.Layout().Digest()
	out.LayoutDigests = map[uint64][]byte{uint64(best.ID()): digest[:]}
	for i, b := range blocks {
		if !b.Found {
			break
		}
		out.Blocks[i] = transfer.LeasedBlock{Hash: b.Hash, Present: true, BlockSet: uint64(best.ID()), Slot: uint64(b.Slot), Generation: b.Generation,
			Sum: b.Sum, HasSum: b.HasSum}
	}
	h.a.stats.leasesServed.Add(1)
	return out, nil
}

func leaseError(err error) error {
	switch {
	case errors.Is(err, pool.ErrTooManyLeases):
		return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
	case errors.Is(err, pool.ErrInvalidArgument), errors.Is(err, pool.ErrBadLease):
		return fmt.Errorf("%w: %v", transfer.ErrInvalidRequest, err)
	case errors.Is(err, pool.ErrClosed):
		return fmt.Errorf("%w: %v", transfer.ErrUnavailable, err)
	}
	return err
}

// owned checks that peer took the lease: lease ids are unguessable, but a
// member must not ride on another member's lease either.
func (h *peerService) owned(peer string, id uint64) error {
	owner, ok := h.book.owner(pool.LeaseID(id))
	if !ok || owner != peer {
		return fmt.Errorf("%w: lease %d is not %s's", transfer.ErrLeaseRefused, id, peer)
	}
	return nil
}

// Renew extends a lease for at most this node's LeaseDuration, as Lease
// grants it, and returns the term granted. A lease older than MaxLeaseAge
// is not renewed: it ends with the term it has, and the error names the
// limit. Renewals exist for reads that outlive a term, not to keep blocks
// pinned for good (pinned, they are never recycled); the importer fails a
// read whose lease it could not renew over to another holder.
func (h *peerService) Renew(ctx context.Context, peer string, id uint64, d time.Duration) (time.Duration, error) {
	return h.renew(peer, id, d, time.Now())
}

// renew is Renew asked for at now. A lease past MaxLeaseAge is refused
// before the pool's lease is touched, and counted and logged once: the
// first time it is refused while the pool still holds it. Asked again, it
// is refused as before, uncounted; once the pool's lease has ended it is
// answered as any ended lease is.
func (h *peerService) renew(peer string, id uint64, d time.Duration, now time.Time) (time.Duration, error) {
	if err := h.owned(peer, id); err != nil {
		return 0, nil
	}
	age, ok := h.book.age(pool.LeaseID(id), now)
	if !ok {
		return 0, nil
	}
	if limit := h.a.cfg.MaxLeaseAge; age > limit {
		if _, err := h.a.pool.LeaseDeadline(pool.LeaseID(id)); err != nil {
			return 0, nil // ended: as the pool's Renew would say
		}
		if h.book.refuse(pool.LeaseID(id)) {
			h.a.stats.leaseRenewalsRefused.Add(1)
			h.a.log.Warn("lease renewal refused: the lease is older than this node's max lease age (--max-lease-age); it ends with its term",
				"peer", peer, "lease", id, "max_lease_age", limit)
		}
		return 0, fmt.Errorf("%w: lease %d was granted %v ago, past this node's max lease age of %v (--max-lease-age): not renewed, it ends with its term",
			transfer.ErrLeaseRefused, id, age.Round(time.Millisecond), Duration(limit))
	}
	d = h.grant(d)
	if err := h.a.pool.Renew(pool.LeaseID(id), d); err != nil {
		if errors.Is(err, pool.ErrLeaseExpired) || errors.Is(err, pool.ErrUnknownLease) {
			return 0, nil
		}
		return 0, leaseError(err)
	}
	h.book.extend(pool.LeaseID(id), time.Now().Add(d)) // after the pool's, as in Lease
	return d, nil
}

func (h *peerService) Release(ctx context.Context, peer string, id uint64) (bool, error) {
	if err := h.owned(peer, id); err != nil {
		return false, nil
	}
	if f := h.a.cfg.hooks.beforeServeRelease; f != nil && !f(peer, id) {
		return false, nil
	}
	if granted, ok := h.book.remove(pool.LeaseID(id)); ok {
		h.a.stats.leaseHold.record(time.Since(granted))
	}
	valid, err := h.a.pool.ReleaseLease(pool.LeaseID(id))
	if errors.Is(err, pool.ErrUnknownLease) || errors.Is(err, pool.ErrLeaseExpired) {
		return false, nil
	}
	return valid, leaseError(err)
}

func (h *peerService) EventRange(ctx context.Context, peer string, q transfer.EventQuery) (transfer.EventRange, error) {
	return h.a.eventRange(q.Origin, q)
}

// CheckRead lets a read through only inside slots the peer's lease holds.
// Pieces of a segment mostly fall one after another in one contiguous
// extent of one slot's shard (per token rows of an NHD head slice), so a
// piece inside the extent of a piece already checked is not checked again.
func (h *peerService) CheckRead(peer string, id, blockSet uint64, seg layout.Segment) error {
	if f := h.a.cfg.hooks.beforeServeRead; f != nil {
		f(peer, id)
	}
	if err := h.owned(peer, id); err != nil {
		return err
	}
	set, err := h.a.pool.BlockSet(pool.SetID(blockSet))
	if err != nil {
		return fmt.Errorf("%w: block set %d", transfer.ErrNotFound, blockSet)
	}
	l := set.Layout()
	var from, to uint64 // [from, to) lies in one leased slot's extent
	return transfer.ForEachPiece(seg, func(off, n uint64) error {
		if off >= from && off+n <= to && off+n > off {
			return nil
		}
		if err := h.a.pool.CheckRead(pool.LeaseID(id), pool.SetID(blockSet), seg.SrcRank, off, n); err != nil {
			return fmt.Errorf("%w: %v", transfer.ErrLeaseRefused, err)
		}
		if _, end, ok := l.Locate(off); ok {
			from, to = off, end
		}
		return nil
	})
}

func (h *peerService) Region(blockSet uint64, rank int) ([]byte, error) {
	set, err := h.a.pool.BlockSet(pool.SetID(blockSet))
	if err != nil {
		return nil, fmt.Errorf("%w: block set %d", transfer.ErrNotFound, blockSet)
	}
	b, err := set.RankBytes(rank)
	if errors.Is(err, pool.ErrNotHostMemory) {
		return nil, fmt.Errorf("%w: block set %d is in GPU memory", transfer.ErrNeedsRDMA, blockSet)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: block set %d rank %d: %v", transfer.ErrNotFound, blockSet, rank, err)
	}
	return b, nil
}

// RegionSpan is where rank's region of blockSet lies, host memory or GPU
// memory (transfer.RegionSpanner).
func (h *peerService) RegionSpan(blockSet uint64, rank int) (transfer.Span, error) {
	set, err := h.a.pool.BlockSet(pool.SetID(blockSet))
	if err != nil {
		return transfer.Span{}, fmt.Errorf("%w: block set %d", transfer.ErrNotFound, blockSet)
	}
	l := set.Layout()
	if rank < 0 || rank >= len(l.Regions) {
		return transfer.Span{}, fmt.Errorf("%w: block set %d rank %d of %d", transfer.ErrNotFound, blockSet, rank, len(l.Regions))
	}
	return transfer.Span{Addr: l.Regions[rank].Base, Len: l.Regions[rank].Size}, nil
}

// engineSets returns the block sets in id order.
func (a *Agent) engineSets() []*engineSet {
	a.mu.Lock()
	out := make([]*engineSet, 0, len(a.sets))
	for _, s := range a.sets {
		out = append(out, s)
	}
	a.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].set.ID() < out[j].set.ID() })
	return out
}

// layoutSetDigest identifies the set of layouts this node serves; peers
// refetch layouts when it changes.
func (a *Agent) layoutSetDigest() []byte {
	h := sha256.New()
	for _, s := range a.engineSets() {
		d := s.set.Layout().Digest()
		fmt.Fprintf(h, "%d:", s.set.ID())
		h.Write(d[:])
	}
	return h.Sum(nil)[:16]
}
