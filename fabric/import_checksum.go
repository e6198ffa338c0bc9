package fabric

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// Content checksums (Config.NoChecksums turns them off). A block an engine
// registers in host memory gets layout.BlockSum of its bytes; a lease
// carries it; the importer checks every block it read against it once the
// bytes are in its slots and before it registers them, whatever transport
// carried them (the check is here, not in a transport). A block that fails
// is not registered: the chunk fails over to another holder, the failure is
// counted and logged with both node names, and the release tells the
// holder, which checks the block again itself and withdraws it (its remove
// event takes it out of every index). Blocks whose sum cannot be taken
// (device memory) go unchecked.

// errChecksum says that bytes read from a holder did not match the
// checksums it gave: the holder is to blame, and another may serve them.
var errChecksum = errors.New("fabric: content checksum mismatch")

// blockSum is the checksum of tokens [first, first+count) of slot in set,
// or false when the set is not in host memory.
func blockSum(set *pool.BlockSet, slot, first, count int) (uint64, bool) {
	regions, err := set.RegionBytes()
	if err != nil {
		return 0, false
	}
	sum, err := layout.BlockSum(set.Layout(), regions, slot, first, count)
	return sum, err == nil
}

// replicasDiffer says whether slot's copies of some KV head differ between
// the ranks that hold it (layout.ReplicasMatch), where the set is in host
// memory and its layout holds a head on several ranks; BlockSum reads each
// head from one rank only.
func replicasDiffer(set *pool.BlockSet, slot int) bool {
	l := set.Layout()
	if !l.Replicated() {
		return false
	}
	regions, err := set.RegionBytes()
	if err != nil {
		return false
	}
	return errors.Is(layout.ReplicasMatch(l, regions, slot, 0, l.PageSize), layout.ErrReplicasDiffer)
}

// takeSum is the checksum of a whole block about to be registered, when
// checksums are on and the set is in host memory.
func (es *engineSet) takeSum(slot int) (uint64, bool) {
	if !es.sums {
		return 0, false
	}
	return blockSum(es.set, slot, 0, es.set.Layout().PageSize)
}

// verify checks the chunk's blocks, now in its slots, against the sums of
// the holder's pages that the lease gave, taking each block's sums now
// unless the read took them as the block landed (ch.early). It returns
// the holder's hashes that failed, how many pages it checked, and each
// engine block's sum where every page of it had one that matched (ok), to
// record on registration.
func (ch *arrivedChunk) verify() (mismatched []uint64, checked int, sums []uint64, ok []bool) {
	if ch.a.cfg.NoChecksums {
		return nil, 0, nil, nil
	}
	set := ch.s.set
	regions, err := set.RegionBytes()
	if err != nil {
		return nil, 0, nil, nil // device memory
	}
	k := max(ch.k, 1)
	taken, early := ch.blockSums(set.Layout(), regions, k)
	sums, ok = make([]uint64, len(ch.blocks)), make([]bool, len(ch.blocks))
	for i := range ok {
		ok[i] = true
	}
	for i, lb := range ch.leased {
		b := i / k
		if taken.replicas[b] {
			// Pages whose sums match can still differ on the ranks that
			// hold a head twice: refused as a mismatch (the holder, told,
			// checks its own copies).
			if i%k == 0 {
				ch.a.log.Error("import: a block's copies of a KV head differ between ranks; refused", "peer", ch.peer.Name(), "hash", lb.Hash)
			}
			mismatched = append(mismatched, lb.Hash)
			ok[b] = false
			continue
		}
		if !lb.HasSum {
			ok[b] = false
			continue
		}
		if !taken.pageOK[i] {
			// In host memory every page's sum can be taken: one that was
			// not is a fault here, and its block is refused as if it had
			// failed, never registered unchecked. (The holder, told,
			// checks its own bytes and keeps a block that matches.)
			ch.a.log.Error("import: a page's checksum could not be taken; its block is refused", "peer", ch.peer.Name(), "hash", lb.Hash)
			mismatched = append(mismatched, lb.Hash)
			ok[b] = false
			continue
		}
		if early[b] {
			ch.a.stats.checksumEarly.Add(1)
		}
		got := taken.pages[i]
		checked++
		if got != lb.Sum {
			mismatched = append(mismatched, lb.Hash)
			ok[b] = false
		}
		if k == 1 {
			sums[b] = got
		}
	}
	if k > 1 {
		for b := range sums {
			if ok[b] {
				sums[b], ok[b] = taken.whole[b], taken.wholeOK[b]
			}
		}
	}
	return mismatched, checked, sums, ok
}

// maxVerifyWorkers bounds the goroutines that take one chunk's sums.
const maxVerifyWorkers = 4

// blockSums returns the sums of the chunk's blocks, each taken by
// sumBlock: as the read landed it (early[b]) or now. Those taken now of a
// chunk verified alone (no read of the import runs meanwhile: the last
// chunk) are spread over up to GOMAXPROCS goroutines (at most
// maxVerifyWorkers), a block to each in turn, its whole-block sum with
// its pages': after an import's last read they are most of what it still
// waits on, and the cores that read are free. Those of any other chunk
// are taken on one, beside the next chunk's read, which more would slow.
// The comparison is the caller's.
func (ch *arrivedChunk) blockSums(l *layout.Layout, regions [][]byte, k int) (taken *chunkSums, early []bool) {
	n := len(ch.blocks)
	if ch.early != nil && !ch.early.broken() {
		// The read has returned: no goroutine of it writes these now. (A
		// read whose parts named bytes outside the chunk is summed anew.)
		taken, early = ch.early.chunkSums, ch.early.taken
	} else {
		taken, early = newChunkSums(n, len(ch.leased)), make([]bool, n)
	}
	var todo []int
	for b := range n {
		if !early[b] {
			todo = append(todo, b)
		}
	}
	page := l.PageSize / k
	sum := func(w, workers int) {
		for j := w; j < len(todo); j += workers {
			b := todo[j]
			taken.sumBlock(l, regions, ch.leased, b, ch.blocks[b].Slot, k, page)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), maxVerifyWorkers, len(todo))
	if workers <= 1 || !ch.alone {
		sum(0, 1)
		return taken, early
	}
	var wg sync.WaitGroup
	for w := 1; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sum(w, workers)
		}()
	}
	sum(0, workers)
	wg.Wait()
	return taken, early
}

// chunkSums are the sums taken of a chunk's blocks, k leased pages to a
// block.
type chunkSums struct {
	pages   []uint64 // sum of each leased page with a sum to check against
	pageOK  []bool
	whole   []uint64 // sum of each block, when k > 1 and its pages matched
	wholeOK []bool
	// replicas says, per block, that its ranks' copies of some KV head
	// differ (layout.ReplicasMatch): the sums read each head once.
	replicas []bool
}

func newChunkSums(blocks, pages int) *chunkSums {
	return &chunkSums{pages: make([]uint64, pages), pageOK: make([]bool, pages),
		whole: make([]uint64, blocks), wholeOK: make([]bool, blocks), replicas: make([]bool, blocks)}
}

// sumBlock takes the sums of block b of a chunk, at slot in l's regions
// and leased as leased[b*k : b*k+k], pages of page tokens: each page's
// that has a sum to check against and, when k > 1 and every page had one
// that matched, the whole block's. It is the one way a block's sums are
// taken, as a read lands it (earlySums.take) or after (verify). It writes
// only block b's entries: blocks may be summed on goroutines of their own.
func (cs *chunkSums) sumBlock(l *layout.Layout, regions [][]byte, leased []transfer.LeasedBlock, b, slot, k, page int) {
	all := true
	for j := range k {
		i := b*k + j
		if i >= len(leased) || !leased[i].HasSum {
			all = false
			continue
		}
		sum, err := layout.BlockSum(l, regions, slot, j*page, page)
		cs.pages[i], cs.pageOK[i] = sum, err == nil
		all = all && err == nil && sum == leased[i].Sum
	}
	if k > 1 && all {
		sum, err := layout.BlockSum(l, regions, slot, 0, l.PageSize)
		cs.whole[b], cs.wholeOK[b] = sum, err == nil
	}
	cs.replicas[b] = errors.Is(layout.ReplicasMatch(l, regions, slot, 0, l.PageSize), layout.ErrReplicasDiffer)
}

// pinnedSlots maps each of hashes a lease pinned to the slot it held, of
// slots (a hash in two, the last), built over the fewer of hashes and
// slots: a release that names one block of a large lease makes a map of
// one.
func pinnedSlots(hashes []uint64, slots []pool.LeasedSlot) map[uint64]int {
	if len(slots) <= len(hashes) {
		pinned := make(map[uint64]int, len(slots))
		for _, s := range slots {
			pinned[s.Hash] = s.Slot
		}
		return pinned
	}
	pinned := make(map[uint64]int, len(hashes))
	for _, x := range hashes {
		pinned[x] = -1 // named, not (yet) found pinned
	}
	for _, s := range slots {
		if _, named := pinned[s.Hash]; named {
			pinned[s.Hash] = s.Slot
		}
	}
	for h, slot := range pinned {
		if slot < 0 {
			delete(pinned, h)
		}
	}
	return pinned
}

// Mismatched checks the blocks a reader says failed their checksums
// against the sums taken at registration, and withdraws those whose bytes
// no longer match. A claim is never taken on trust: only the reader's own
// live lease may carry one, and only about blocks that lease pinned (the
// pool's record of its slots and the hash each held), each checked once; a
// block whose bytes still match stays, and one withdrawn since (another
// reader's claim) is done with. Only the first call under a lease checks
// claims (leaseBook.claim): a peer that sends the release of one lease
// many times, at once or one after another, costs this node at most one
// sum of each block the lease pinned in all, not one a call. Its sums are
// bounded by this node's PeerTimeout, not by ctx, even where ctx had
// ended before it began (the connection closing): the server releases the
// lease as soon as it returns (transfer's release method), so claims it
// left unchecked would never be checked. They stop once the lease has
// left the book (its peer gone: peerGone released its leases), so a peer
// cannot keep sums running past its lease cap by reconnecting. Past
// PeerTimeout the blocks left unchecked stay so.
//
// Claims under a lease this node's book no longer has (released, or
// dropped once past its deadline), or under another peer's, are ignored
// unchecked and uncounted. Under the peer's own lease, the hashes refused
// unchecked are counted (checksumClaimsRefused) and logged: each the lease
// did not pin or named a second time, or every one when the pool's lease
// has ended though the book still has it, or when an earlier call under
// the lease took its claims up. The agent's log folds the
// warning's repeats: a peer named and why, one line per repeatWindow
// however many releases; the lease and the counts go to debug.
func (h *peerService) Mismatched(ctx context.Context, peer string, id uint64, hashes []uint64) {
	if err := h.owned(peer, id); err != nil {
		return
	}
	a := h.a
	// Taken up even where ctx has ended already (the connection
	// closing): the server releases the lease once this returns, so no
	// later call could check them.
	mine, first := h.book.claim(pool.LeaseID(id), peer)
	if !mine {
		return // released meanwhile
	}
	refused, why := 0, "not blocks the lease holds, or named twice"
	defer func() {
		if refused == 0 {
			return
		}
		a.stats.checksumClaimsRefused.Add(uint64(refused))
		a.log.Warn("a peer's releases named blocks as failing their checksums: refused unchecked (kvfabric_checksum_claims_refused_total counts each)",
			"peer", peer, "why", why)
		a.log.Debug("a release's checksum claims refused unchecked",
			"peer", peer, "lease", id, "refused", refused, "named", len(hashes), "why", why)
	}()
	if !first {
		refused, why = len(hashes), "the lease's claims were taken up by an earlier release of it"
		return
	}
	// The lease's claims are this call's alone now, and the server
	// releases the lease as soon as it returns, whatever ctx says: its
	// sums are bounded by this node's PeerTimeout and its life, not by
	// the caller, and end once the lease has left the book (its peer gone,
	// or the lease expired), so that a peer that closes its connection
	// and leases again leaves no sums running for leases released.
	limit, stop := context.WithTimeout(a.ctx, a.cfg.PeerTimeout)
	defer stop()
	if f := a.cfg.hooks.claimsTaken; f != nil {
		f(peer, id, stop)
	}
	setID, slots, err := a.pool.LeasedSlots(pool.LeaseID(id))
	var es *engineSet
	if err == nil {
		es, _ = a.engineSet(uint64(setID))
	}
	if es == nil {
		refused, why = len(hashes), "the lease has ended"
		return
	}
	pinned := pinnedSlots(hashes, slots) // until checked
	for i, x := range hashes {
		if limit.Err() != nil {
			a.log.Debug("a release's checksum claims left unchecked: past the holder's peer timeout",
				"peer", peer, "lease", id, "unchecked", len(hashes)-i)
			return
		}
		if h.owned(peer, id) != nil {
			a.log.Debug("a release's checksum claims left unchecked: the lease has left the book (its peer gone)",
				"peer", peer, "lease", id, "unchecked", len(hashes)-i)
			return
		}
		slot, held := pinned[x]
		if !held {
			refused++
			continue
		}
		delete(pinned, x)
		b, ok := es.set.Lookup(x)
		if !ok || b.Slot != slot {
			continue // withdrawn since, by another reader's claim
		}
		want, ok := es.set.Sum(b)
		if !ok {
			continue
		}
		if f := a.cfg.hooks.claimSummed; f != nil {
			f(peer, id, x)
		}
		got, ok := blockSum(es.set, b.Slot, 0, es.set.Layout().PageSize)
		if !ok || (got == want && !replicasDiffer(es.set, b.Slot)) {
			continue
		}
		if err := es.set.Withdraw(b); err != nil {
			continue // withdrawn meanwhile, by another reader's claim
		}
		a.stats.checksumWithdrawn.Add(1)
		a.log.Error("block changed after it was registered: withdrawn (an engine wrote into it after registering it)",
			"peer", peer, "hash", x, "set", es.set.ID(), "slot", b.Slot, "engine", es.engine,
			"sum", fmt.Sprintf("%016x", want), "now", fmt.Sprintf("%016x", got))
	}
}

// checkCopies checks blocks copied from another block set of this node
// (from, into to) against the sums their engine's registration took, and
// returns how many leading ones match; the first that does not is
// withdrawn from its set. sums and summed receive the sums checked, for
// registration.
func (a *Agent) checkCopies(src, dst *pool.BlockSet, from, to []pool.Block, sums []uint64, summed []bool) int {
	if a.cfg.NoChecksums {
		return len(from)
	}
	for i := range from {
		want, ok := src.Sum(from[i])
		if !ok {
			continue
		}
		got, ok := blockSum(dst, to[i].Slot, 0, dst.Layout().PageSize)
		if !ok {
			continue
		}
		if got != want || replicasDiffer(dst, to[i].Slot) {
			a.stats.checksumFailed.Add(1)
			if src.Withdraw(from[i]) == nil {
				a.stats.checksumWithdrawn.Add(1)
			}
			a.log.Error("block changed after it was registered: not copied, withdrawn (an engine wrote into it after registering it)",
				"set", src.ID(), "slot", from[i].Slot, "to_set", dst.ID(), "sum", fmt.Sprintf("%016x", want), "now", fmt.Sprintf("%016x", got))
			return i
		}
		a.stats.checksumVerified.Add(1)
		sums[i], summed[i] = got, true
	}
	return len(from)
}

var _ transfer.MismatchReporter = (*peerService)(nil)

// earlySums takes the sums of a chunk's blocks while a lane read brings
// them in: the goroutine that lands the last byte of a block (told by
// transfer.Landed) sums it at once, while its bytes are likely still in
// the cache, rather than verify reading every block again from memory
// once the whole chunk is in. verify uses them only when the read went
// over the lane in one attempt (usable); the comparison with the holder's
// sums, and the refusal of a mismatch, stay verify's, before any block is
// registered.
type earlySums struct {
	l       *layout.Layout
	regions [][]byte
	slots   map[int]int    // destination slot → block of the chunk
	slotOf  []int          // block of the chunk → destination slot
	left    []atomic.Int64 // bytes of each block not yet landed
	leased  []transfer.LeasedBlock
	k, page int
	// Written for block b by the one goroutine that landed its last byte
	// (taken[b] says it did), read by verify after the read returned.
	*chunkSums
	taken []bool
	// bad is set when a part named bytes outside the chunk's blocks: no
	// early sum is used then.
	bad atomic.Bool
}

// newEarlySums prepares early sums for a chunk of blocks (k leased pages
// each) read into set by segs; nil when checksums are off or the set is
// not in host memory.
func (a *Agent) newEarlySums(set *pool.BlockSet, blocks []pool.Block, leased []transfer.LeasedBlock, k int, segs []layout.Segment) *earlySums {
	if a.cfg.NoChecksums {
		return nil
	}
	regions, err := set.RegionBytes()
	if err != nil {
		return nil
	}
	l := set.Layout()
	k = max(k, 1)
	e := &earlySums{l: l, regions: regions, slots: make(map[int]int, len(blocks)), slotOf: make([]int, len(blocks)),
		left: make([]atomic.Int64, len(blocks)), leased: leased, k: k, page: l.PageSize / k,
		chunkSums: newChunkSums(len(blocks), len(leased)), taken: make([]bool, len(blocks))}
	for i, b := range blocks {
		e.slots[b.Slot], e.slotOf[i] = i, b.Slot
	}
	e.walk(segs, func(b int, n uint64) { e.left[b].Add(int64(n)) })
	if e.bad.Load() {
		return nil
	}
	return e
}

// walk calls f with each block of the chunk that segs write and how many
// bytes of it, extent by extent.
func (e *earlySums) walk(segs []layout.Segment, f func(b int, n uint64)) {
	var (
		from, to uint64 // [from, to) of the last extent found is block b's
		b        int
		found    bool
	)
	for _, sg := range segs {
		for i := uint64(0); i < sg.Count; i++ {
			_, off := sg.Piece(i)
			end := off + sg.Length
			for off < end {
				if !found || off < from || off >= to {
					slot, extEnd, ok := e.l.Locate(off)
					if ok {
						b, ok = e.slots[slot]
					}
					if !ok {
						e.bad.Store(true)
						return
					}
					from, to, found = off, extEnd, true
				}
				n := min(end, to) - off
				f(b, n)
				off += n
			}
		}
	}
}

// landed is the read's transfer.Landed: it counts part's bytes off their
// blocks and sums each block whose last byte it landed.
func (e *earlySums) landed(part []layout.Segment) {
	e.walk(part, func(b int, n uint64) {
		if left := e.left[b].Add(-int64(n)); left == 0 {
			e.take(b)
		} else if left < 0 {
			e.bad.Store(true)
		}
	})
}

// take sums block b, whose every byte has landed.
func (e *earlySums) take(b int) {
	e.sumBlock(e.l, e.regions, e.leased, b, e.slotOf[b], e.k, e.page)
	e.taken[b] = true
}

// broken says whether e, if not nil, counted bytes it cannot place: then
// none of its sums is used.
func (e *earlySums) broken() bool { return e != nil && e.bad.Load() }
