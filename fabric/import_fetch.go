package fabric

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// requestError marks a holder's refusal that the import itself caused: a
// request the holder cannot serve (too large, another page size, another
// model). Another holder may serve it, and this one is not to blame.
type requestError struct{ err error }

func (e requestError) Error() string { return e.err.Error() }
func (e requestError) Unwrap() error { return e.err }

// chunkBlocks is how many blocks of layout l one chunk of an import moves
// when each is made of k of the holder's pages: ImportChunkBytes worth, at
// least one, and never more than a lease may ask for.
func (a *Agent) chunkBlocks(l *layout.Layout, k int) int {
	st := l.Strides()
	perBlock := max(st.Shard*uint64(l.TPSize), 1)
	n := uint64(a.cfg.ImportChunkBytes) / perBlock
	return int(min(max(n, 1), uint64(transfer.MaxLeaseBlocks/k)))
}

// evenChunks is the size of the next chunk when n blocks are left to cut
// into chunks of at most per: cut each time from what is left, they are
// as few as per allows and differ in size by at most one block. A short
// last chunk would read in a moment and leave the import waiting, after
// its last read, on the sums of the whole chunk before it; a last chunk
// as long as the others is read while those are taken.
func evenChunks(n, per int) int {
	if per < 1 || n <= per {
		return per
	}
	chunks := (n + per - 1) / per
	return (n + chunks - 1) / chunks
}

// leasedChunk is one chunk of an import: the hashes asked for and the
// holder's lease on them.
type leasedChunk struct {
	asked   []uint64
	askedAt time.Time // when the lease was asked for
	lease   transfer.Lease
	kept    *keptLease // nil when no lease was granted
	err     error
}

// present is how many leading blocks of the chunk the lease holds, all in
// one block set.
func (c *leasedChunk) present() int {
	b := c.lease.Blocks
	k := 0
	for k < len(b) && k < len(c.asked) && b[k].Present && b[k].Hash == c.asked[k] && b[k].BlockSet == b[0].BlockSet {
		k++
	}
	return k
}

// fetch imports the leading blocks of want that holder still has into
// new slots of s, a chunk at a time, pipelined: while a chunk is read, the
// next one's lease is being taken and the previous one is being released
// and registered. A read that outlives the holder's term renews its lease.
// The holder is asked for its own pages (want.src); the engine's blocks
// (want.dst) are made of want.k of them each.
//
// A chunk's slots are registered only when every byte of its plan arrived
// and the holder confirmed that its lease never expired, and only after
// the chunk before it registered (its parent): a chunk read while the one
// before fails to release is discarded. When a chunk fails, the chunks
// registered before it are returned with the error: they arrived whole
// under confirmed leases and are the engine's.
func (a *Agent) fetch(ctx context.Context, holder membership.Member, s *sessionSet, want pages, parent uint64) ([]*fabricpb.BlockRef, uint64, string, error) {
	peer, err := a.peers.get(ctx, a.transport, holder.Name, holder.Meta.PeerAddr)
	if err != nil {
		return nil, 0, "", err
	}
	keeper := newLeaseKeeper(peer, &a.stats.leaseRenewals)
	defer keeper.close()
	n := want.blocks()
	per := a.chunkBlocks(s.set.Layout(), want.k)
	// chunkFrom is the chunk of blocks [from, ...) to lease next.
	chunkFrom := func(from int) pages { return want.slice(from, min(from+evenChunks(n-from, per), n)) }
	var (
		refs  []*fabricpb.BlockRef
		moved uint64
		via   transports
		// finishing is the previous chunk's release and registration,
		// under way while this one reads; nil when there is none.
		finishing <-chan finishedChunk
	)
	// settle waits for the previous chunk's release and registration.
	settle := func() error {
		if finishing == nil {
			return nil
		}
		f := <-finishing
		finishing = nil
		refs = append(refs, f.refs...)
		moved += f.bytes
		if f.err == nil && a.cfg.hooks.chunkRegistered != nil {
			a.cfg.hooks.chunkRegistered(holder.Name, len(refs))
		}
		return f.err
	}
	fail := func(err error, next <-chan *leasedChunk) ([]*fabricpb.BlockRef, uint64, string, error) {
		a.abandon(peer, next)
		if len(refs) > 0 {
			err = fmt.Errorf("after %d blocks: %w", len(refs), err)
		}
		return refs, moved, via.String(), err
	}
	next := a.leaseChunk(ctx, peer, keeper, chunkFrom(0).src)
	for off := 0; off < n; {
		c := <-next
		next = nil
		if c.err != nil {
			if err := settle(); err != nil {
				return fail(err, nil)
			}
			return refs, moved, via.String(), c.err
		}
		// Whole engine blocks only: the holder's pages of a block it
		// holds in part are of no use.
		k := c.present() / want.k
		end := off + k
		whole := k*want.k == len(c.asked)
		// A chunk leased whole, or cut short by the holder's lease caps,
		// may be followed by more of the holder's prefix; any other
		// short lease ends it.
		more := whole || (k > 0 && c.lease.Capped)
		if whole && end < n {
			next = a.leaseChunk(ctx, peer, keeper, chunkFrom(end).src)
		}
		got, err := a.readChunk(ctx, peer, keeper, s, c, want.slice(off, end), &via)
		if serr := settle(); serr != nil {
			if err == nil {
				got.discard()
			}
			return fail(serr, next)
		}
		if err != nil {
			return fail(err, next)
		}
		// No read overlaps this chunk's sums when no lease was asked
		// ahead: they may take every core.
		got.alone = next == nil
		finishing = got.finish(ctx, parent)
		if !more {
			break
		}
		off, parent = end, want.dst[end-1]
		if next == nil && off < n {
			// Cut short by a cap: ask for the rest once this chunk's lease
			// is released and its room free again.
			if err := settle(); err != nil {
				return fail(err, nil)
			}
			next = a.leaseChunk(ctx, peer, keeper, chunkFrom(off).src)
		}
	}
	if err := settle(); err != nil {
		return fail(err, nil)
	}
	return refs, moved, via.String(), nil
}

// transports records which transports moved an import's chunks.
type transports struct{ quic, rdma, tcp bool }

func (t *transports) add(via transfer.Transport) {
	switch via {
	case transfer.TransportRDMA:
		t.rdma = true
	case transfer.TransportTCP:
		t.tcp = true
	default:
		t.quic = true
	}
}

// String names them as Fetch.transport does: "rdma", "tcp" (the lane),
// "quic", or those used joined by "+" in that order.
func (t transports) String() string {
	var names []string
	if t.rdma {
		names = append(names, "rdma")
	}
	if t.tcp {
		names = append(names, "tcp")
	}
	if t.quic || len(names) == 0 {
		names = append(names, "quic")
	}
	return strings.Join(names, "+")
}

// leaseChunk asks peer for a lease on hashes without waiting for the
// answer; a granted lease is renewed by keeper from the moment it is
// asked for.
func (a *Agent) leaseChunk(ctx context.Context, peer *transfer.Peer, keeper *leaseKeeper, hashes []uint64) <-chan *leasedChunk {
	ch := make(chan *leasedChunk, 1)
	go func() {
		asked := time.Now()
		c := &leasedChunk{asked: hashes, askedAt: asked}
		c.lease, c.err = a.leaseWhenRoom(ctx, peer, hashes)
		switch {
		case errors.Is(c.err, transfer.ErrInvalidRequest), errors.Is(c.err, transfer.ErrTooLarge):
			c.err = requestError{fmt.Errorf("lease of %d blocks: %w", len(hashes), c.err)}
		case errors.Is(c.err, transfer.ErrUnavailable):
			// Busy past PeerTimeout: at a lease cap (often filled by this
			// node's own imports) or out of leases; load, not ill health.
			c.err = requestError{fmt.Errorf("lease: %w", c.err)}
		case c.err != nil:
			c.err = fmt.Errorf("lease: %w", c.err)
		case c.lease.ID != 0 && c.lease.Duration <= 0:
			c.err = fmt.Errorf("lease %d granted for %v: no time to read under it", c.lease.ID, c.lease.Duration)
			a.releaseLater(peer, c.lease.ID)
		case c.lease.ID != 0:
			c.kept = keeper.keep(ctx, c.lease.ID, c.lease.Duration, asked)
		}
		ch <- c
	}()
	return ch
}

// leaseBusyPause bounds the pause between two asks of a holder that said
// it is busy: short, because the room a waiting import needs frees as
// soon as another's read ends, and every pause past that is link idle.
const leaseBusyPause = 20 * time.Millisecond

// leaseWhenRoom asks peer for a lease on hashes, asking again for up to
// PeerTimeout while the holder answers that it is busy (at its cap of
// blocks leased to this node or to all, or out of leases): leases end as
// the reads under them finish, often this node's own concurrent imports'.
func (a *Agent) leaseWhenRoom(ctx context.Context, peer *transfer.Peer, hashes []uint64) (transfer.Lease, error) {
	start, pause := time.Now(), 5*time.Millisecond
	for {
		l, err := peer.Lease(ctx, hashes, a.cfg.LeaseDuration)
		if !errors.Is(err, transfer.ErrUnavailable) || time.Since(start)+pause > a.cfg.PeerTimeout {
			return l, err
		}
		a.stats.leaseWaits.Add(1)
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return l, err
		}
		pause = min(2*pause, leaseBusyPause)
	}
}

// abandon gives back a chunk leased ahead that will not be read.
func (a *Agent) abandon(peer *transfer.Peer, next <-chan *leasedChunk) {
	if next == nil {
		return
	}
	a.background(func() {
		if c := <-next; c.err == nil && c.lease.ID != 0 {
			a.releaseLater(peer, c.lease.ID)
		}
	})
}

// releaseLater gives a lease back without making the import wait: the
// holder may be the reason the import is failing. A holder that does not
// answer (hung, or its link down for a while) is asked again until it
// does or the lease's term has passed, so that a holder that resumes ends
// the lease at once instead of keeping its blocks pinned for the term.
func (a *Agent) releaseLater(peer *transfer.Peer, id uint64) {
	a.background(func() {
		releaseUntil(a.done, a.cfg.LeaseDuration, a.cfg.PeerTimeout, func(ctx context.Context) error {
			_, err := peer.Release(ctx, id)
			return err
		})
	})
}

// releasePause bounds the pause between two tries of a release.
const releasePause = time.Second

// releaseUntil calls release, each try bounded by try, until one returns
// nil (the holder answered), done closes or term has passed since the
// first; it returns the tries made and whether one succeeded.
func releaseUntil(done <-chan struct{}, term, try time.Duration, release func(context.Context) error) (int, bool) {
	start, pause := time.Now(), 50*time.Millisecond
	for n := 1; ; n++ {
		ctx, cancel := context.WithTimeout(context.Background(), try)
		err := release(ctx)
		cancel()
		if err == nil {
			return n, true
		}
		if errors.Is(err, transfer.ErrClosed) || time.Since(start)+pause >= term {
			return n, false
		}
		select {
		case <-done:
			return n, false
		case <-time.After(pause):
		}
		pause = min(2*pause, releasePause)
	}
}

// arrivedChunk is a chunk whose every byte arrived, under a lease not yet
// released, in slots not yet registered.
type arrivedChunk struct {
	a       *Agent
	peer    *transfer.Peer
	keeper  *leaseKeeper
	s       *sessionSet
	id      uint64 // the lease
	askedAt time.Time
	blocks  []pool.Block
	hashes  []uint64 // the engine's, one per block
	bytes   uint64
	via     transfer.Transport
	read    time.Duration
	// leased are the lease's entries of the holder's pages read, k of
	// them to an engine block: their checksums are checked before the
	// blocks are registered.
	leased []transfer.LeasedBlock
	k      int
	// early are the blocks' sums taken as a lane read landed them, nil
	// unless the read went over the lane in one attempt.
	early *earlySums
	// alone says that no read of the import runs while the chunk is
	// verified (the last chunk): verify spreads over the cores.
	alone bool
}

// finishedChunk is what finishing a chunk registered.
type finishedChunk struct {
	refs  []*fabricpb.BlockRef
	bytes uint64
	err   error
}

// readChunk reads part, the engine blocks of a leased chunk that the
// lease holds whole, into new slots of s. On failure the lease is given
// back and the slots freed; on success both are the caller's, to finish
// or discard.
func (a *Agent) readChunk(ctx context.Context, peer *transfer.Peer, keeper *leaseKeeper, s *sessionSet, c *leasedChunk, part pages, moved *transports) (*arrivedChunk, error) {
	id := c.lease.ID
	kept := false
	defer func() {
		if !kept && id != 0 {
			keeper.drop(id)
			a.releaseLater(peer, id)
		}
	}()
	k := part.blocks()
	if k == 0 || id == 0 {
		return nil, errors.New("holder no longer has the blocks")
	}
	set := c.lease.Blocks[0].BlockSet
	src, err := a.layouts.get(ctx, peer, c.lease.LayoutDigests[set])
	if err != nil {
		return nil, err
	}
	dst := s.set.Layout()
	if src.PageSize*part.k != dst.PageSize {
		if part.k == 1 {
			return nil, requestError{fmt.Errorf("holder's page size %d differs from ours (%d): its blocks are named by other hashes", src.PageSize, dst.PageSize)}
		}
		return nil, requestError{fmt.Errorf("holder's page size %d is not 1/%d of ours (%d)", src.PageSize, part.k, dst.PageSize)}
	}
	// Engine block i is filled from the holder's pages i*k..i*k+k-1, in
	// token order.
	pairs := make([]layout.SlotPair, len(part.src))
	for i := range pairs {
		slot := c.lease.Blocks[i].Slot
		if slot >= uint64(src.Slots) {
			return nil, fmt.Errorf("lease names slot %d of a block set of %d", slot, src.Slots)
		}
		pairs[i].Src = int(slot)
	}
	blocks, err := a.allocateNow(ctx, s.engineSet, k)
	if err != nil {
		return nil, localError{fmt.Errorf("local slots: %w", err)}
	}
	unsynced := false
	defer func() {
		switch {
		case kept:
		case unsynced:
			// A staged copy into them may still land: the slots are
			// retired, as a restore's are (tier_restore.go).
			for _, b := range blocks {
				if err := s.set.Retire(b); err != nil {
					a.log.Error("import: device slot not retired", "set", s.set.ID(), "slot", b.Slot, "err", err)
				}
			}
			a.log.Warn("import: device slots retired: a staged copy into them may still land", "set", s.set.ID(), "slots", len(blocks))
		default:
			for _, b := range blocks {
				s.set.Abort(b)
			}
		}
	}()
	for i := range pairs {
		pairs[i].Dst = blocks[i/part.k].Slot
	}
	plan, err := layout.NewPlan(src, dst, pairs)
	if err != nil {
		return nil, requestError{err}
	}
	var segs []layout.Segment
	for _, r := range plan.Ranks {
		segs = append(segs, r...)
	}
	leased := c.lease.Blocks[:len(part.src)]
	early := a.newEarlySums(s.set, blocks, leased, part.k, segs)
	var landed transfer.Landed
	if early != nil {
		landed = early.landed
	}
	readStart := time.Now()
	via, err := a.readInto(c.kept.ctx, peer, id, set, segs, s.set, landed)
	if err != nil {
		unsynced = errors.Is(err, errSlotUnsynced)
		if cause := context.Cause(c.kept.ctx); errors.Is(cause, errLeaseLost) {
			err = cause
		}
		return nil, fmt.Errorf("read: %w", err)
	}
	moved.add(via)
	kept = true
	// Sums taken during a read that did not write every byte once, part
	// by part as landed was told (one that fell back to QUIC, say), are
	// not used.
	if via != transfer.TransportTCP || early.broken() {
		early = nil
	}
	return &arrivedChunk{a: a, peer: peer, keeper: keeper, s: s, id: id, askedAt: c.askedAt, blocks: blocks,
		hashes: part.dst, bytes: plan.Bytes(), via: via, read: time.Since(readStart), leased: leased, k: part.k, early: early}, nil
}

// finish releases the chunk's lease and, once the holder confirms that it
// never expired, registers the blocks after parent, on a goroutine of its
// own: the next chunk's read need not wait for the round trip. On failure
// nothing of the chunk is registered and its slots are freed.
func (ch *arrivedChunk) finish(ctx context.Context, parent uint64) <-chan finishedChunk {
	out := make(chan finishedChunk, 1)
	go func() {
		refs, bytes, err := ch.releaseAndRegister(ctx, parent)
		out <- finishedChunk{refs: refs, bytes: bytes, err: err}
	}()
	return out
}

// releaseAndRegister is finish's work; it returns what it registered and
// the bytes of the chunk when it registered any.
func (ch *arrivedChunk) releaseAndRegister(ctx context.Context, parent uint64) ([]*fabricpb.BlockRef, uint64, error) {
	a, s := ch.a, ch.s
	ch.keeper.drop(ch.id)
	// Checked before the release, so that the holder, told of a
	// mismatch, finds the block still pinned under the lease.
	mismatched, checked, sums, summed := ch.verify()
	relStart := time.Now()
	valid, err := ch.peer.Release(ctx, ch.id, mismatched...)
	if err == nil {
		a.links.observe(ch.peer.Name(), string(ch.via), time.Since(relStart), ch.bytes, ch.read)
	} else {
		// Not released (no answer within the import's time, say): tried
		// again in the background, so that the holder neither keeps the
		// blocks pinned nor counts the lease against this node until its
		// term ends. The retry names no block: the first try may have
		// reached the holder, which refuses and counts a claim made
		// twice, and a bad block not withdrawn is refused again by the
		// next importer's check.
		a.releaseLater(ch.peer, ch.id)
	}
	switch {
	case len(mismatched) > 0:
		a.stats.checksumFailed.Add(uint64(len(mismatched)))
		a.stats.checksumVerified.Add(uint64(checked - len(mismatched)))
		a.log.Error("imported blocks do not match their checksums: refused, the holder told to withdraw them",
			"peer", ch.peer.Name(), "blocks", len(mismatched), "of", checked, "hash", mismatched[0], "set", s.set.ID())
		err = fmt.Errorf("%w: %d of %d blocks read from %s (first hash %d); none registered", errChecksum, len(mismatched), checked, ch.peer.Name(), mismatched[0])
	case err == nil && !valid:
		err = errors.New("lease expired before release: the bytes are not trusted")
	case err != nil:
		err = fmt.Errorf("release: %w", err)
	default:
		a.stats.checksumVerified.Add(uint64(checked))
	}
	if err != nil {
		for _, b := range ch.blocks {
			s.set.Abort(b)
		}
		return nil, 0, err
	}
	refs, err := s.registerFilled(ch.blocks, ch.hashes, parent, sums, summed)
	a.stats.importBytes.Add(ch.bytes)
	a.stats.importBlocks.Add(uint64(len(refs)))
	a.stats.importChunks.Add(1)
	switch ch.via {
	case transfer.TransportRDMA:
		a.stats.importBytesRDMA.Add(ch.bytes)
		a.stats.chunkTimeRDMA.record(time.Since(ch.askedAt))
	case transfer.TransportTCP:
		a.stats.chunkTimeLane.record(time.Since(ch.askedAt))
	default:
		a.stats.chunkTime.record(time.Since(ch.askedAt))
	}
	if err != nil {
		return refs, ch.bytes, localError{err}
	}
	return refs, ch.bytes, nil
}

// discard gives a chunk that will not be registered back: its lease to
// the holder, its slots to the pool.
func (ch *arrivedChunk) discard() {
	ch.keeper.drop(ch.id)
	ch.a.releaseLater(ch.peer, ch.id)
	for _, b := range ch.blocks {
		ch.s.set.Abort(b)
	}
}
