package fabric

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// Read-ahead along sequences. An engine acquiring a long prefix from a
// tier asks for it a run at a time; between its calls the disk would sit
// idle. So after a restore of a run ending at hash X into an engine's
// block set (Acquire, Import's fromTier, Lookup's restoreNow), and after
// an Acquire or Import that takes blocks read ahead, the tiers start one
// background read (at most one per set at a time) of the blocks that
// follow X, as far as the tiers hold them: up to Config.TierReadAhead
// blocks and half the blocks the set keeps (as Prefetch), restored as
// Prefetch's are (registered after their parent, unreferenced, cached;
// the first detached from it in the set, pool.Registration.Detached, so
// that recycling takes the blocks already used, X among them, before the
// ones read ahead rather than hold them all as one sequence),
// into slots pool.BlockSet.AllocateSpare gives: free ones, or those of
// unused blocks the tiers hold a copy of; never a referenced block's, nor
// one whose only copy is the set's, nor those of the sequence it extends
// (X and the blocks before it, just used).
//
// Which block follows which is learnt from the copies down: the pool's
// Offload hook gives each block's parent, and a block placed in a tier
// links its parent to it. A link lives as long as its child's record in
// the tiers (moved with it from the host tier to a disk tier, dropped
// when it leaves them), so there is at most one per block held. Links are
// not journaled: after a restart the tiers hold their blocks again but no
// links until those blocks go down anew, and nothing is read ahead until
// then.
//
// A restore (Acquire's, Import's, Lookup's, Prefetch's) whose leading
// blocks include one being read ahead waits for the read-ahead (within its
// ctx), then takes from the set the leading blocks it holds, and restores
// the rest itself. So a block is registered once; it is read once where
// the read-ahead brings the head of what the restore asks for, but read
// again by the restore where the read-ahead brings only blocks after one
// it does not (a copy registered meanwhile is kept: the restore's is given
// back), where the read-ahead was ended first (an allocation that needed
// its slots, the set freed), or where its block was recycled before
// anything took it.

// DefaultTierReadAhead and MaxTierReadAhead bound Config.TierReadAhead:
// by default a restore's run (restoreReaders blocks read at once), at
// most a restore's batch.
const (
	DefaultTierReadAhead = restoreReaders
	MaxTierReadAhead     = maxRestoreBatch
)

// aheadRuns are the tiers' read-aheads under way, and their counts.
type aheadRuns struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
	// restored counts blocks read ahead and registered in their own slots;
	// hits those later taken from the set by an engine's Acquire or
	// Import, or by a restore that waited for the read-ahead (Acquire's,
	// Import's, Lookup's or Prefetch's; Prefetch reports them as
	// restored); unused those found recycled from
	// their set, or freed with it, before any was taken (counted when the
	// set's next read-ahead starts, when a take finds another block under
	// the hash, or when the set is freed).
	restored, hits, unused atomic.Uint64
	// started and ended count read-aheads; waits the restores that waited
	// for one (tests).
	started, ended, waits atomic.Uint64
	// allocated, if set, is called by each read-ahead once it holds its
	// slots, before it reads (tests: a read-ahead under way).
	allocated atomic.Pointer[func(ctx context.Context)]
}

// add counts a read-ahead in, unless the tiers are closing.
func (r *aheadRuns) add() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	return true
}

// close starts no more read-aheads and waits for those under way (their
// ctx, from the tiers', is cancelled first).
func (r *aheadRuns) close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.wg.Wait()
}

// setAhead is a block set's read-ahead: the one under way, and the blocks
// read ahead that nothing has taken yet.
type setAhead struct {
	mu     sync.Mutex
	run    *aheadRun
	blocks map[uint64]pool.Block // by hash, as registered
}

// aheadRun is one read-ahead under way: the hashes it brings up, and done,
// closed once they are registered and released (or given up).
type aheadRun struct {
	hashes map[uint64]struct{}
	done   chan struct{}
	cancel context.CancelFunc
}

// link records that k's block follows parent in its sequence, if the
// tiers hold k.
func (t *tiers) link(k disk.Key, parent uint64) {
	if parent == 0 || parent == k.Hash {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.pos[k]; ok {
		t.linkLocked(k, parent)
	}
}

// linkLocked records parent -> k. Every child entry's parentOf names its
// parent, so neither map outgrows the blocks held. t.mu is held.
func (t *tiers) linkLocked(k disk.Key, parent uint64) {
	if t.child == nil {
		t.child, t.parentOf = map[disk.Key]uint64{}, map[disk.Key]uint64{}
	}
	t.unlinkLocked(k)
	t.parentOf[k] = parent
	t.child[disk.Key{Hash: parent, Tag: k.Tag}] = k.Hash
}

// unlinkLocked forgets k's link to its parent. t.mu is held.
func (t *tiers) unlinkLocked(k disk.Key) {
	p, ok := t.parentOf[k]
	if !ok {
		return
	}
	delete(t.parentOf, k)
	if pk := (disk.Key{Hash: p, Tag: k.Tag}); t.child[pk] == k.Hash {
		delete(t.child, pk)
	}
}

// childOf is the block the tiers hold that follows k's, if they know one.
func (t *tiers) childOf(k disk.Key) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.child[k]
	if !ok {
		return 0, false
	}
	_, held := t.pos[disk.Key{Hash: c, Tag: k.Tag}]
	return c, held
}

// links is how many child links the tiers keep (tests).
func (t *tiers) links() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.child)
}

// aheadBound is how many blocks one read-ahead into set may bring up.
func (t *tiers) aheadBound(set *pool.BlockSet) int {
	return min(t.a.cfg.TierReadAhead, set.Retains()/2)
}

// readAheadAfter starts the read-ahead of the blocks that follow last into
// es, unless one is under way there, there is nothing to read, or it is
// off. It only starts it.
func (t *tiers) readAheadAfter(es *engineSet, last uint64) {
	if t.a.cfg.TierReadAhead <= 0 || last == 0 {
		return
	}
	set := es.set
	l := set.Layout()
	if !t.reachable(l) {
		return
	}
	bound := t.aheadBound(set)
	if bound <= 0 {
		return
	}
	sa := &es.ahead
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if sa.run != nil {
		return
	}
	t.pruneLocked(sa, set)
	parent, run := t.chain(set, disk.Key{Hash: last, Tag: shapeTag(l)}, bound)
	if len(run) == 0 || !t.ahead.add() {
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.a.cfg.ImportTimeout)
	r := &aheadRun{hashes: make(map[uint64]struct{}, len(run)), done: make(chan struct{}), cancel: cancel}
	for _, h := range run {
		r.hashes[h] = struct{}{}
	}
	// Marked before the call that started it returns, so that the
	// engine's next call waits for these blocks rather than read them too.
	sa.run = r
	t.ahead.started.Add(1)
	go func() {
		defer t.ahead.wg.Done()
		defer cancel()
		t.readAhead(ctx, es, r, run, parent)
	}()
}

// chain is the run of blocks to read ahead after k: along the links, past
// the blocks set holds already, the blocks the tiers hold and set does
// not, up to bound of them, and the hash of the block before the first.
func (t *tiers) chain(set *pool.BlockSet, k disk.Key, bound int) (uint64, []uint64) {
	var run []uint64
	parent := k.Hash
	for steps := 0; steps < 4*bound+8 && len(run) < bound; steps++ {
		c, held := t.childOf(k)
		if c == 0 || slices.Contains(run, c) {
			break
		}
		if _, ok := set.Lookup(c); ok {
			if len(run) > 0 {
				break // the run ends where the set holds the next
			}
			parent, k.Hash = c, c
			continue
		}
		if !held {
			break
		}
		run = append(run, c)
		k.Hash = c
	}
	return parent, run
}

// readAhead brings run up into es after parent: restored into spare
// slots, registered, recorded as read ahead, and released.
func (t *tiers) readAhead(ctx context.Context, es *engineSet, r *aheadRun, run []uint64, parent uint64) {
	sa := &es.ahead
	// Not the blocks the run follows: they are the ones just used.
	spare := func(ctx context.Context, set *pool.BlockSet, n int) ([]pool.Block, error) {
		if err := ctx.Err(); err != nil {
			return nil, err // ended before it began: push out no cached block for reads it will not make
		}
		blks, err := set.AllocateSpare(n, parent)
		if f := t.ahead.allocated.Load(); f != nil && len(blks) > 0 {
			(*f)(ctx)
		}
		return blks, err
	}
	// The blocks found corrupt or missing are forgotten only once the
	// read-ahead is over: forgetting takes a.mu (tiers.lostBelow), which
	// whoever frees es for room holds while it waits for the read-ahead
	// (Agent.freeIdleLocked). Until then a restore that finds them gone
	// forgets them itself.
	type lostBlock struct {
		d *diskTier
		k disk.Key
	}
	var lost []lostBlock
	collect := func(d *diskTier, k disk.Key) { lost = append(lost, lostBlock{d, k}) }
	blks, own, err := t.restoreRun(ctx, es, run, parent, func(_ context.Context, k disk.Key) *diskTier { return t.where(k) }, spare, collect, true)
	if err != nil {
		t.log.Debug("tier: read-ahead stopped short", "set", es.set.ID(), "restored", len(blks), "err", err)
	}
	sa.mu.Lock()
	for i, b := range blks {
		if own[i] {
			if sa.blocks == nil {
				sa.blocks = map[uint64]pool.Block{}
			}
			sa.blocks[run[i]] = b
			t.ahead.restored.Add(1)
		}
	}
	sa.mu.Unlock()
	for _, b := range blks {
		es.set.Release(b) // cached, unreferenced; a stale handle: freed meanwhile
	}
	// Over only once its blocks are released: whoever waits for it
	// (endAhead, awaitAhead) finds its slots registered and free to
	// recycle, or given back.
	sa.mu.Lock()
	sa.run = nil
	sa.mu.Unlock()
	close(r.done)
	t.ahead.ended.Add(1)
	for _, l := range lost {
		t.forget(l.d, l.k)
	}
}

// pruneLocked counts and forgets the blocks read ahead into set that were
// recycled before anything took them. sa.mu is held.
func (t *tiers) pruneLocked(sa *setAhead, set *pool.BlockSet) {
	for h, b := range sa.blocks {
		if si, err := set.Slot(b.Slot); err != nil || si.Generation != b.Generation || si.State != pool.Registered {
			delete(sa.blocks, h)
			t.ahead.unused.Add(1)
		}
	}
}

// aheadUsed says whether b, just taken from es under hash h, is a block
// read ahead that nothing had taken before, and counts it: a hit, or, if
// the block read ahead under h was recycled and h registered again since,
// a block unused.
func (t *tiers) aheadUsed(es *engineSet, h uint64, b pool.Block) bool {
	sa := &es.ahead
	sa.mu.Lock()
	defer sa.mu.Unlock()
	ab, ok := sa.blocks[h]
	if !ok {
		return false
	}
	delete(sa.blocks, h)
	if ab != b {
		t.ahead.unused.Add(1)
		return false
	}
	t.ahead.hits.Add(1)
	return true
}

// awaitAhead waits, if es's read-ahead under way brings up one of the
// leading blocks of hashes, until it ends (or ctx does), and says whether
// it waited.
func (t *tiers) awaitAhead(ctx context.Context, es *engineSet, hashes []uint64) bool {
	sa := &es.ahead
	sa.mu.Lock()
	r := sa.run
	found := false
	if r != nil {
		for _, h := range hashes[:min(len(hashes), maxRestoreBatch)] {
			if _, found = r.hashes[h]; found {
				break
			}
		}
	}
	sa.mu.Unlock()
	if !found {
		return false
	}
	t.ahead.waits.Add(1)
	select {
	case <-r.done:
	case <-ctx.Done():
	case <-t.done:
	}
	return true
}

// stopAhead cancels es's read-ahead under way, if any, for a set about to
// be freed: its slots are given back as soon as its reads end.
func (t *tiers) stopAhead(es *engineSet) {
	sa := &es.ahead
	sa.mu.Lock()
	if sa.run != nil {
		sa.run.cancel()
	}
	sa.mu.Unlock()
}

// endAhead cancels es's read-ahead under way, if any, and waits until it
// ends (its slots registered and released, or given back), ctx ends or
// the tiers close. It says whether one ended: false where none was under
// way, or ctx or the tiers' closing ended the wait first (so that a caller
// that tries again after each true cannot spin on a read-ahead that has
// not ended).
func (t *tiers) endAhead(ctx context.Context, es *engineSet) bool {
	sa := &es.ahead
	sa.mu.Lock()
	r := sa.run
	if r != nil {
		r.cancel()
	}
	sa.mu.Unlock()
	if r == nil {
		return false
	}
	select {
	case <-r.done:
	case <-ctx.Done():
	case <-t.done:
	}
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// aheadUnderWay says whether es has a read-ahead under way.
func (t *tiers) aheadUnderWay(es *engineSet) bool {
	sa := &es.ahead
	sa.mu.Lock()
	defer sa.mu.Unlock()
	return sa.run != nil
}

// aheadMayHold says whether an allocation that failed with ae may have
// failed for slots es's read-ahead held: it held spare slots
// (pool.AllocError.Spare), or one is under way (registered, it holds its
// blocks referenced until it releases them).
func (t *tiers) aheadMayHold(es *engineSet, ae *pool.AllocError) bool {
	return ae.Spare > 0 || t.aheadUnderWay(es)
}

// yieldAhead is what an allocation that failed with ae does about es's
// read-ahead: where it may hold the slots (aheadMayHold), ends it and says
// to try again; after each read-ahead that ended, and once more where none
// ended (it may have ended just before endAhead looked, its slots given
// back meanwhile; *retried records that try). False: the read-ahead is
// not why, or ctx ended.
func (t *tiers) yieldAhead(ctx context.Context, es *engineSet, ae *pool.AllocError, retried *bool) bool {
	if !t.aheadMayHold(es, ae) {
		return false
	}
	if t.endAhead(ctx, es) {
		return true
	}
	if *retried || ctx.Err() != nil {
		return false
	}
	*retried = true
	return true
}

// aheadFreed counts the blocks read ahead into es that nothing took before
// es was freed.
func (t *tiers) aheadFreed(es *engineSet) {
	sa := &es.ahead
	sa.mu.Lock()
	t.ahead.unused.Add(uint64(len(sa.blocks)))
	sa.blocks = nil
	sa.mu.Unlock()
}

// The Agent's side: no tiers, nothing read ahead.

// readAheadAfter starts the read-ahead after last into es (tiers'
// readAheadAfter).
func (a *Agent) readAheadAfter(es *engineSet, last uint64) {
	if a.tiers != nil {
		a.tiers.readAheadAfter(es, last)
	}
}

// aheadUsed counts b, taken from es under h, if it was read ahead (tiers'
// aheadUsed).
func (a *Agent) aheadUsed(es *engineSet, h uint64, b pool.Block) bool {
	return a.tiers != nil && a.tiers.aheadUsed(es, h, b)
}
