package fabric

import (
	"context"
	"errors"
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
// follow X, as far as the tiers hold them, keeping up to restoreReaders
// reads in flight (deviceRestoreReaders into a device set) and at most
// Config.TierReadAhead blocks, and half the blocks the set keeps (as
// Prefetch), ahead of use: being read, or read and not yet taken, by it
// or by an earlier read-ahead whose blocks its chain steps over (left).
// Each read that completes frees its I/O slot for the next block along
// the chain, and each block taken makes room for another, so that while
// the engine takes one run the next is read, the disk kept busy
// (readAhead); a take after it last looked for room, as it ends (or once
// its ctx ended), has the next read-ahead start after the block taken as
// it ends, in the same hold of the set's lock (follow).
// The blocks are restored as Prefetch's are (registered after their
// parent, in batches as they land in order, each batch's first detached
// from the block before it in the set, pool.Registration.Detached, as is
// a block the chain reached past blocks the set holds, after the last of
// those, so that recycling takes the blocks already used, X among them,
// before the ones read ahead rather than hold them all as one sequence),
// and held referenced by the read-ahead until taken or until it ends,
// then cached unreferenced; into slots
// pool.BlockSet.AllocateSpare gives: free ones, or those of unused blocks
// the tiers hold a copy of; never a referenced block's, nor one whose only
// copy is the set's, nor those of the sequence it extends (X, or the last
// block taken from the read-ahead, and the blocks before it, just used).
// A read-ahead whose block to follow has left the set by the time it
// begins (a look-up's restore releases X at once, and allocations may
// recycle it) ends at once, claiming no slot.
//
// Which block follows which is learnt from the copies down: the pool's
// Offload hook gives each block's parent, and a block placed in a tier
// links its parent to it (the last linked wins). A link lives as long as
// its child's record in the tiers (moved with it from the host tier to a
// disk tier, dropped when it leaves them), so there is at most one per
// block held. The parent is kept with the block's copy too (parentItem:
// written beside it, and a disk store keeps it in the block's journal
// record), and a link made later for a block a tier holds (an offer that
// finds its block held, in copyDownBatch: linkHeld) is kept with its copy
// where it changes the link (SetParent: a disk store journals it with its
// next commit, or at Close; a crash before then loses it, the block
// linked as before after a restart). So is a copier's link of a block it
// placed that takes the parent's link from another block (copiers link
// after their commits, not in their order: link), and a move down from
// host memory puts a block below with its parent only where it is the
// parent's child, and journals the links that changed during the move
// (keepMovedLinkLocked): the block's own where it is the parent's child
// (linked anew, or taken back from another block), or the link of the
// block that took its parent's. So a restarted agent, recording each
// block its disk tiers hold again, links it to its parent under the same
// rules (relinkLocked), in the order each store's journal last named its
// blocks, and reads ahead at once: where a parent has two children in one
// disk tier, the one placed or linked last keeps the link, as it did
// while running. Children in two disk tiers differ from the running
// agent: the tier listed later wins (the tiers are relinked in turn). So
// does a parent whose child left the tiers, taking the link: it has none
// while running, where a restart links it to the block its disk tiers
// still hold whose record last named it as parent, if any. A block whose
// copy was put with no parent and never linked since (an offer with
// parent 0, such as a RegisterBlocks's first block given no parent; a
// copy journalled before parents were kept) has no link after a restart.
//
// A restore (Acquire's, Import's, Lookup's, Prefetch's) whose leading
// blocks include one being read ahead waits until those have landed (or
// the read-ahead ended, or its ctx did), then takes from the set the
// leading blocks it holds, and restores the rest itself. So a block is
// registered once; it is read once where the read-ahead brings the head of
// what the restore asks for, but read again by the restore where the
// read-ahead brings only blocks after one it does not (a copy registered
// meanwhile is kept: the restore's is given back, and a read-ahead's copy
// so kept counts as taken, as by Acquire), where the read-ahead was ended
// first (an allocation that needed its slots, the set freed), or where its
// block was recycled before anything took it. An engine that registers
// blocks a read-ahead brought up gets the read-ahead's copies back as
// duplicates, and those count as taken too.

// DefaultTierReadAhead and MaxTierReadAhead bound Config.TierReadAhead:
// by default two restores' runs (restoreReaders blocks read at once), so
// that the run after the one an engine waits for is read while it takes
// that one (with one run's room, the disk idles from the last read of a
// run until the engine takes it), at most a restore's batch.
const (
	DefaultTierReadAhead = 2 * restoreReaders
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
	// set's next read-ahead starts, when a take or a read-ahead finds
	// another block under the hash, or when the set is freed).
	restored, hits, unused atomic.Uint64
	// started and ended count read-aheads; waits the restores that waited
	// for one (tests).
	started, ended, waits atomic.Uint64
	// allocated, if set, is called by each read-ahead once it holds its
	// slots, before it reads (tests: a read-ahead under way).
	allocated atomic.Pointer[func(ctx context.Context)]
	// reading, if set, is called by each read-ahead before each block's
	// read, with its hash (tests: reads that do not end).
	reading atomic.Pointer[func(ctx context.Context, hash uint64)]
	// beforeYield, if set, is called by yieldAhead before it looks at the
	// set's read-ahead (tests: one that ends just before).
	beforeYield atomic.Pointer[func()]
	// registered, if set, is called by each read-ahead once it has
	// registered a batch of blocks, before it records them as its own,
	// under its set's setAhead.mu (tests: a take in between).
	registered atomic.Pointer[func()]
	// closing, if set, is called by each read-ahead once it has looked
	// for room for the last time, before it releases its blocks (tests: a
	// take as it ends).
	closing atomic.Pointer[func()]
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
	// ends counts the read-aheads into the set that ended (their slots
	// registered and released, or given back): an allocation that noted
	// it before it looked knows whether one ended since (yieldAhead).
	ends uint64
}

// aheadRun is one read-ahead under way. Under its set's setAhead.mu:
// hashes are the blocks it is reading (slots allocated, not yet
// registered nor given up); held those it registered and still
// references, which nothing has taken yet; keep the block its next spare
// slot may not recycle (the one it follows, then the last one taken from
// it); landed is closed and replaced each time blocks leave hashes. room
// (one buffered) wakes it when a block it held is taken; done is closed
// once it is over, its blocks registered and released (or given back).
// closing says it has looked for room for the last time (or its ctx
// ended): a take from then on makes room it will not fill, so
// readAheadAfter, which starts nothing while it is under way, leaves it
// follow, the block the next read-ahead is to follow, started as it ends
// (unless it was stopped: stopped, set with its cancel by stopAhead or
// endAhead, which its ctx's error alone does not tell once its deadline
// passed first). left are blocks read ahead before it (by an
// earlier read-ahead into the set) and not taken yet, which its chain
// stepped over: ahead of use as its own are, they count against its room
// until taken.
type aheadRun struct {
	hashes  map[uint64]struct{}
	held    map[uint64]pool.Block
	left    map[uint64]struct{}
	keep    uint64
	landed  chan struct{}
	room    chan struct{}
	done    chan struct{}
	cancel  context.CancelFunc
	ctx     context.Context
	closing bool
	stopped bool
	follow  uint64
}

// newAheadRun is a read-ahead that will read hashes first.
func newAheadRun(hashes []uint64, keep uint64, cancel context.CancelFunc) *aheadRun {
	r := &aheadRun{hashes: make(map[uint64]struct{}, len(hashes)), held: map[uint64]pool.Block{}, left: map[uint64]struct{}{}, keep: keep,
		landed: make(chan struct{}), room: make(chan struct{}, 1), done: make(chan struct{}), cancel: cancel}
	for _, h := range hashes {
		r.hashes[h] = struct{}{}
	}
	return r
}

// roomLocked is how many more blocks r may have ahead of use, queued
// being those it issued and has not registered. The set's setAhead.mu is
// held.
func (r *aheadRun) roomLocked(bound, queued int) int {
	return bound - len(r.held) - len(r.left) - queued
}

// leftLocked counts against r's room the blocks of past (stepped over
// along its chain) that an earlier read-ahead into the set brought up and
// nothing took yet. sa.mu is held.
func (r *aheadRun) leftLocked(sa *setAhead, past []uint64) {
	for _, h := range past {
		if _, ok := sa.blocks[h]; ok {
			if _, own := r.held[h]; !own {
				r.left[h] = struct{}{}
			}
		}
	}
}

// followable says whether a readAheadAfter while r is under way is to be
// followed once r ends: r looks for room no more (closing), or its ctx
// ended, and it will not; never once it was stopped. The set's
// setAhead.mu is held.
func (r *aheadRun) followable() bool {
	return !r.stopped && (r.closing || r.ctx != nil && r.ctx.Err() != nil)
}

// stopLocked cancels r, and it is followed by none. The set's
// setAhead.mu is held.
func (r *aheadRun) stopLocked() {
	r.stopped = true
	r.cancel()
}

// settledLocked wakes whoever waits for blocks of r to land. The set's
// setAhead.mu is held.
func (r *aheadRun) settledLocked() {
	close(r.landed)
	r.landed = make(chan struct{})
}

// link records that k's block follows parent in its sequence, if the
// tiers hold k: a block whose copy was just put with parent kept beside it
// (parentItem). Where the copy held has another parent kept (a copy down
// that found k placed in another tier meanwhile), its store keeps this
// one too (keepLinkLocked). Where the parent's child was another block,
// the store journals the link again, so that a restart finds k the last
// child named: copiers link their blocks after their commits and place,
// not in the order they committed, so another child of the parent,
// committed after k's put by another copier, may have been linked before
// k (a restart, by the puts' order alone, kept that one).
func (t *tiers) link(k disk.Key, parent uint64) { t.linkAs(k, parent, false) }

// linkHeld is link of a block a tier held before its copy down (an offer
// that found it held, in copyDownBatch): where the link changes (another
// parent, or the parent's child another block), the store holding the
// block keeps it too, so that a restart finds it, and finds it the last
// link to its parent where it is (keepLinkLocked).
func (t *tiers) linkHeld(k disk.Key, parent uint64) { t.linkAs(k, parent, true) }

// linkAs is link, or linkHeld where held.
func (t *tiers) linkAs(k disk.Key, parent uint64, held bool) {
	if !linkable(k, parent) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.pos[k]
	if !ok {
		return
	}
	p, had := t.parentOf[k]
	c, hadChild := t.child[disk.Key{Hash: parent, Tag: k.Tag}]
	changed := !had || p != parent || c != k.Hash
	// A block just put (not held) is journalled again only where it takes
	// the parent's link from another block: its put's record is the last
	// to name a child of the parent but where another copier's, committed
	// after it, was linked first.
	displaced := hadChild && c != k.Hash
	t.linkLocked(k, parent)
	t.keepLinkLocked(t.list[e.Value.(*tierEntry).tier], k, parent, displaced || held && changed)
}

// keepLinkLocked has d's store keep parent with k's copy where it keeps
// another (or none), or where always: SetParent, which a disk store
// journals with its next commit, its record then the last to name k (a
// restart relinks the blocks in that order: relinkLocked), and which a
// crash before that commit loses. t.mu is held.
func (t *tiers) keepLinkLocked(d *diskTier, k disk.Key, parent uint64, always bool) {
	st := d.store.Load()
	if st == nil {
		return
	}
	if kept, ok := st.Parent(k); always || !ok || kept != parent {
		st.SetParent(k, parent)
	}
}

// linkable says whether parent, given as k's, is one a link may name: a
// block's parent, never 0 (a sequence's first block) nor k's own hash.
func linkable(k disk.Key, parent uint64) bool { return parent != 0 && parent != k.Hash }

// parentItem is the put of k's block, its parent kept beside it in the
// store (disk.PutItem.Parent) where it is one a link may name, so that a
// restarted agent finds the link again (relinkLocked).
func parentItem(k disk.Key, data []byte, parent uint64) disk.PutItem {
	return disk.PutItem{Key: k, Data: data, Parent: parent, HasParent: linkable(k, parent)}
}

// keepParent keeps the parent of items' last, just added to batch (whose
// items are items' so far), with it.
func keepParent(batch tierPuts, items []disk.PutItem) {
	if it := items[len(items)-1]; it.HasParent {
		batch.SetParent(len(items)-1, it.Parent)
	}
}

// relinkLocked links k, recorded from st (a disk tier's store) as a
// restarted agent finds it, to the parent st kept with it, if any: the
// links of the blocks a disk tier holds outlive the agent, as the blocks
// do. Called for st's blocks in the order of disk.Store.Keys (the order
// their journal records last named them), so that of two children of one
// parent the one named last keeps the link. t.mu is held.
func (t *tiers) relinkLocked(st *disk.Store, k disk.Key) {
	if p, ok := st.Parent(k); ok && linkable(k, p) {
		t.linkLocked(k, p)
	}
}

// linkLocked records parent -> k, counting in relinks a link that takes
// the parent's from another block. Every child entry's parentOf names its
// parent, so neither map outgrows the blocks held. t.mu is held.
func (t *tiers) linkLocked(k disk.Key, parent uint64) {
	if t.child == nil {
		t.child, t.parentOf = map[disk.Key]uint64{}, map[disk.Key]uint64{}
	}
	t.unlinkLocked(k)
	t.parentOf[k] = parent
	pk := disk.Key{Hash: parent, Tag: k.Tag}
	if c, ok := t.child[pk]; ok && c != k.Hash {
		t.relinks++
	}
	t.child[pk] = k.Hash
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
	sa := &es.ahead
	sa.mu.Lock()
	defer sa.mu.Unlock()
	if r := sa.run; r != nil {
		if r.followable() {
			r.follow = last // started as it ends: it has no room left to look for
		}
		return
	}
	t.startAheadLocked(es, last)
}

// startAheadLocked is readAheadAfter with none under way in es: it starts
// the read-ahead after last, unless there is nothing to read. es.ahead.mu
// is held.
func (t *tiers) startAheadLocked(es *engineSet, last uint64) {
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
	t.pruneLocked(sa, set)
	parent, run, left := t.chain(sa, set, disk.Key{Hash: last, Tag: shapeTag(l)}, bound)
	if len(run) == 0 || !t.ahead.add() {
		return
	}
	ctx, cancel := context.WithTimeout(t.ctx, t.a.cfg.ImportTimeout)
	r := newAheadRun(run, parent, cancel)
	r.ctx = ctx
	for _, h := range left {
		r.left[h] = struct{}{}
	}
	// Marked before the call that started it returns, so that the
	// engine's next call waits for these blocks rather than read them too.
	sa.run = r
	t.ahead.started.Add(1)
	go func() {
		defer t.ahead.wg.Done()
		defer cancel()
		t.readAhead(ctx, es, r, run, parent, bound)
	}()
}

// chain is the run of blocks to read ahead after k: along the links, past
// the blocks set holds already, the blocks the tiers hold and set does
// not, and the hash of the block before the first; and the blocks it
// stepped over that an earlier read-ahead brought up and nothing took
// (sa.blocks), which count with the run against bound: together at most
// bound of them. sa.mu is held.
func (t *tiers) chain(sa *setAhead, set *pool.BlockSet, k disk.Key, bound int) (uint64, []uint64, []uint64) {
	var run, left []uint64
	parent := k.Hash
	for steps := 0; steps < 4*bound+8 && len(run)+len(left) < bound; steps++ {
		c, held := t.childOf(k)
		if c == 0 || slices.Contains(run, c) {
			break
		}
		if _, ok := set.Lookup(c); ok {
			if len(run) > 0 {
				break // the run ends where the set holds the next
			}
			if _, ahead := sa.blocks[c]; ahead {
				left = append(left, c)
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
	return parent, run, left
}

// readAhead brings run up into es after parent, then the blocks that
// follow it along the links: up to restoreReaders reads in flight at once
// (deviceRestoreReaders into a device set) and bound blocks ahead of use
// (being read, or registered and not yet taken). Each completed read frees
// its I/O slot for the next block along the chain; the blocks that land in
// order are registered at once (each batch of them, and each block past
// blocks the set holds, detached from the one before,
// pool.Registration.Detached) and held, referenced, until taken
// (aheadUsed) or until the read-ahead ends, so that a restore waiting for
// them goes on as they land, and each block taken makes room for the next.
// It goes no further where the chain ends or no spare slot is left, and
// reads every slot it holds; it gives back the slots it has not read into
// at a read that fails, a block gone from the tiers, or when ctx ends. It
// ends once nothing is in flight and it can go no further or its window
// is full; then it releases the blocks it still holds (cached,
// unreferenced).
func (t *tiers) readAhead(ctx context.Context, es *engineSet, r *aheadRun, run []uint64, parent uint64, bound int) {
	sa := &es.ahead
	set := es.set
	l := set.Layout()
	tag := shapeTag(l)
	readers := t.restoreReaders(l)
	var (
		queue    []*aheadRead // issued, in chain order, not yet registered
		landed   = make(chan *aheadRead, readers)
		inflight int
		last     = parent // the last block issued, along the chain
		stop     bool     // the chain is not extended past run (it ends, or slots ran short)
		abandon  bool     // nothing more is issued: ctx ended, a read failed, a block left the tiers
		broken   bool     // a read failed: nothing after it is registered
		slots    []pool.Block
	)
	sio, err := t.slotIO(set)
	if err != nil {
		stop = true
	}
	// The run's slots at once, before it reads. Not the blocks the run
	// follows: they are the ones just used. Ended before it began: it
	// pushes out no cached block for reads it will not make. Nor where the
	// block it follows left the set before it began (a look-up releases
	// the blocks it restores at once, and allocations since recycled
	// them): the engine reads elsewhere now, and the spare slots would
	// recycle cached blocks, a more recent restore's among them, for
	// blocks nothing will take. It ends at once, as one ended before it
	// began does.
	if !stop && ctx.Err() == nil {
		if _, held := set.Lookup(parent); parent != 0 && !held {
			t.log.Debug("tier: read-ahead's first block left its set before it began", "set", set.ID(), "hash", parent)
			stop = true
		} else {
			slots, err = set.AllocateSpare(len(run), parent)
			if f := t.ahead.allocated.Load(); f != nil && len(slots) > 0 {
				(*f)(ctx)
			}
		}
	}
	// unmark gives back the slots allocated for run that were not issued.
	unmark := func() {
		sa.mu.Lock()
		for _, h := range run[len(slots):] {
			delete(r.hashes, h)
		}
		for i, h := range run[:len(slots)] {
			delete(r.hashes, h)
			set.Abort(slots[i])
		}
		r.settledLocked()
		sa.mu.Unlock()
		run, slots = nil, nil
	}
	if len(slots) < len(run) {
		if err != nil {
			t.log.Debug("tier: read-ahead found no spare slots", "set", set.ID(), "err", err)
		}
		stop = true
		sa.mu.Lock()
		for _, h := range run[len(slots):] {
			delete(r.hashes, h)
		}
		r.settledLocked()
		sa.mu.Unlock()
		run = run[:len(slots)]
	}
	ctxDone := ctx.Done()
	for {
		for inflight < readers && !abandon && ctx.Err() == nil && (len(run) > 0 || !stop) {
			sa.mu.Lock()
			room := r.roomLocked(bound, len(queue))
			keep := r.keep
			sa.mu.Unlock()
			if room <= 0 {
				break
			}
			var h uint64
			var blk pool.Block
			after := last // the block h follows along the chain
			if len(run) > 0 {
				h, blk = run[0], slots[0]
				run, slots = run[1:], slots[1:]
			} else {
				c, p, ok, past := t.nextAhead(set, disk.Key{Hash: last, Tag: tag})
				sa.mu.Lock()
				_, reading := r.hashes[c]
				_, holding := r.held[c]
				r.leftLocked(sa, past)
				room = r.roomLocked(bound, len(queue))
				sa.mu.Unlock()
				if !ok || reading || holding {
					stop = true // the chain ends, or comes round
					break
				}
				if room <= 0 {
					break // blocks read ahead before it fill its room: a take makes room
				}
				blks, err := set.AllocateSpare(1, keep)
				if err != nil || len(blks) == 0 {
					stop = true
					break
				}
				h, blk, after = c, blks[0], p
				sa.mu.Lock()
				r.hashes[h] = struct{}{}
				sa.mu.Unlock()
			}
			k := disk.Key{Hash: h, Tag: tag}
			d := t.where(k)
			if d == nil {
				// Left the tiers meanwhile: the chain ends here.
				run, slots = append([]uint64{h}, run...), append([]pool.Block{blk}, slots...)
				unmark()
				stop, abandon = true, true
				break
			}
			last = h
			rd := &aheadRead{f: tierFound{d: d, k: k}, blk: blk, parent: after}
			queue = append(queue, rd)
			inflight++
			go func() {
				if f := t.ahead.reading.Load(); f != nil {
					(*f)(ctx, rd.f.k.Hash)
				}
				var buf []byte // for a block not read straight into its slot
				tr := t.trailerBuffer()
				rd.o = t.readBlock(ctx, set, sio, &rd.f, rd.blk, &buf, tr)
				t.trailers.Put(&tr)
				if buf != nil {
					t.putBuffer(buf)
				}
				landed <- rd
			}()
		}
		// Slots that ran short only end the chain: the run's slots are
		// all read. Abandoned, the rest of the run is given back unread.
		if ctx.Err() != nil || abandon {
			stop, abandon = true, true
			if len(run) > 0 {
				unmark()
			}
		}
		if len(queue) == 0 {
			if !t.aheadClosing(ctx, sa, r, bound, len(run) > 0 || !stop) {
				continue // a block taken since it looked made room
			}
			break // nothing in flight, and no room: over
		}
		select {
		case rd := <-landed:
			inflight--
			rd.done = true
		case <-r.room:
		case <-ctxDone:
			ctxDone = nil // its reads end at once; wait for them
		}
		n := 0
		for n < len(queue) && queue[n].done {
			n++
		}
		if n == 0 {
			continue
		}
		ready := queue[:n:n]
		queue = queue[n:]
		broken = t.registerAhead(es, r, ready, broken)
		if broken {
			stop, abandon = true, true
		}
	}
	// Over only once its blocks are released: whoever waits for it
	// (endAhead, awaitAhead) finds its slots registered and free to
	// recycle, or given back.
	sa.mu.Lock()
	held := r.held
	r.held = map[uint64]pool.Block{}
	sa.mu.Unlock()
	for _, b := range held {
		set.Release(b) // cached, unreferenced; a stale handle: freed meanwhile
	}
	sa.mu.Lock()
	sa.run = nil
	sa.ends++
	// The next one starts in the same hold, so that whoever ends or stops
	// the set's read-ahead (endAhead, stopAhead) finds one under way or
	// none: not one about to start. None once it was stopped (the set
	// freed, an allocation needs its slots) or the tiers close.
	if r.follow != 0 && !r.stopped && t.ctx.Err() == nil {
		t.startAheadLocked(es, r.follow)
	}
	r.settledLocked()
	sa.mu.Unlock()
	close(r.done)
	t.ahead.ended.Add(1)
}

// aheadClosing says whether r, with nothing in flight, is over: it may
// issue no more (more is false, or it was abandoned, or ctx ended), or it
// has no room, checked under sa.mu with closing set, so that a take from
// then on (aheadUsed, and the readAheadAfter of the call that took) finds
// it closing and leaves it a block to follow. False: a block taken since
// the issuing loop looked made room, and it goes on.
func (t *tiers) aheadClosing(ctx context.Context, sa *setAhead, r *aheadRun, bound int, more bool) bool {
	sa.mu.Lock()
	if more && ctx.Err() == nil && r.roomLocked(bound, 0) > 0 {
		sa.mu.Unlock()
		return false
	}
	r.closing = true
	sa.mu.Unlock()
	if f := t.ahead.closing.Load(); f != nil {
		(*f)()
	}
	return true
}

// aheadRead is one block of a read-ahead: where it is, its slot, the
// block it follows along the chain, and its read's outcome once done.
type aheadRead struct {
	f      tierFound
	blk    pool.Block
	parent uint64
	o      restoreOutcome
	done   bool
}

// registerAhead registers the blocks of ready (read, in chain order) that
// came up whole into es, each after the block it follows along the chain
// (aheadRead.parent), up to the first that did not (broken: one before did
// not, so none is registered), holds them for r (where a copy was
// registered meanwhile under a hash, that copy is released and the
// read-ahead's slot given back), gives back the slots of the others, and
// wakes whoever waits for them. Each batch of them, and each block that
// does not follow the one before it in ready (the chain stepped over
// blocks the set holds), starts a registration of its own, detached. It
// returns whether a read failed. The blocks found corrupt or missing,
// their records marked gone and their sets told as they were read
// (readBlock: dropFound, lostCopy), have those records forgotten and the
// loss announced here, as they land, before whoever waits for them is
// woken: not once the read-ahead is over, which may be as long as its
// blocks wait to be taken, while a record gone holds nothing and every
// copy down of the block meanwhile was written and deleted as a second
// copy, again and again. Forgetting takes announceMu, the tiers' mu and
// the pool's and the sets' locks, not a.mu nor es.mu, which whoever ends
// the read-ahead and waits for it may hold (Agent.freeIdleLocked); none
// of its locks is held here.
func (t *tiers) registerAhead(es *engineSet, r *aheadRun, ready []*aheadRead, broken bool) bool {
	set := es.set
	var regs []pool.Registration
	var regd []*aheadRead
	var lost []tierFound
	for _, rd := range ready {
		if err := rd.o.err; err != nil {
			if errors.Is(err, disk.ErrCorrupt) || errors.Is(err, disk.ErrNotFound) {
				if errors.Is(err, disk.ErrCorrupt) {
					t.corrupt.Add(1)
					t.log.Warn("tier: disk block failed its check: dropped, never served", "hash", rd.f.k.Hash, "tier", rd.f.d.n, "err", err)
				}
				lost = append(lost, rd.f)
			}
			if !broken {
				t.log.Debug("tier: read-ahead stopped short", "set", set.ID(), "hash", rd.f.k.Hash, "err", err)
			}
			broken = true
		}
		if broken {
			t.abortRead(set, rd)
			continue
		}
		regs = append(regs, pool.Registration{Block: rd.blk, Hash: rd.f.k.Hash, Sum: rd.o.sum, HasSum: rd.o.has && es.sums})
		regd = append(regd, rd)
	}
	// The losses are forgotten and announced before whoever waits for
	// them is woken (r.hashes cleared below).
	for _, f := range lost {
		t.forgetFound(f)
	}
	// The blocks are registered and recorded as read ahead in one hold of
	// sa.mu (taken before t.mu and the set's lock, as startAheadLocked
	// takes them): a take between the two (an engine's Acquire, Import or
	// RegisterBlocks, aheadUsed) would find the block in the set and not
	// among those read ahead, and count no hit for it.
	var out, dup []pool.Block
	sa := &es.ahead
	sa.mu.Lock()
	var err error
	if len(regs) > 0 {
		// Copied below only while a tier holds the copy still, checked
		// under t.mu with the registration, as restoreRun does.
		t.mu.Lock()
		for i, rd := range regd {
			regs[i].Below = t.heldLocked(rd.f.k)
		}
		for from := 0; from < len(regs) && err == nil; {
			to := from + 1
			for to < len(regs) && regd[to].parent == regs[to-1].Hash {
				to++
			}
			regs[from].Detached = true
			var got []pool.Block
			got, err = set.RegisterBatch(regs[from:to], regd[from].parent)
			out = append(out, got...)
			from = to
		}
		t.mu.Unlock()
	}
	if f := t.ahead.registered.Load(); f != nil && len(out) > 0 {
		(*f)() // tests: a take between the registration and the record
	}
	for i, b := range out {
		h := regs[i].Hash
		if b != regs[i].Block {
			dup = append(dup, b)
			continue
		}
		if sa.blocks == nil {
			sa.blocks = map[uint64]pool.Block{}
		}
		if ob, ok := sa.blocks[h]; ok && ob != b {
			// One read ahead before under h, untaken, left the set
			// since the read-ahead under way counted what had left.
			t.ahead.unused.Add(1)
		}
		sa.blocks[h] = b
		r.held[h] = b
		t.ahead.restored.Add(1)
	}
	for _, rd := range ready {
		delete(r.hashes, rd.f.k.Hash)
	}
	r.settledLocked()
	sa.mu.Unlock()
	for _, rg := range regs[len(out):] {
		set.Abort(rg.Block) // a stale handle: the set was freed
	}
	if err != nil {
		t.log.Debug("tier: read-ahead not registered", "set", set.ID(), "err", err)
		broken = true
	}
	for _, rd := range regd[:len(out)] {
		t.touch(rd.f.k)
		rd.f.d.restores.Add(1)
		rd.f.d.restoreTime.record(rd.o.took)
	}
	for _, b := range dup {
		set.Release(b)
	}
	return broken
}

// abortRead gives back the slot of a block read ahead and not registered;
// one whose upload may still land (a device set's) is retired instead,
// out of use for the set's life, as a restore's is.
func (t *tiers) abortRead(set *pool.BlockSet, rd *aheadRead) {
	if !errors.Is(rd.o.err, errSlotUnsynced) {
		set.Abort(rd.blk)
		return
	}
	if err := set.Retire(rd.blk); err != nil {
		t.log.Error("tier: device slot not retired", "set", set.ID(), "slot", rd.blk.Slot, "err", err)
	}
	t.log.Warn("tier: a device slot retired: its restore's copy may still land", "set", set.ID(), "slot", rd.blk.Slot, "hash", rd.f.k.Hash)
}

// nextAhead is the block to read ahead after k's along the links: past
// those set holds already (a restore brought them up meanwhile, or an
// earlier read-ahead did), the next one, if the tiers hold it, the block
// it follows (k's, or the last one stepped over), and the blocks stepped
// over; false where the chain ends.
func (t *tiers) nextAhead(set *pool.BlockSet, k disk.Key) (uint64, uint64, bool, []uint64) {
	var past []uint64
	for range maxRestoreBatch {
		c, held := t.childOf(k)
		if c == 0 || c == k.Hash {
			return 0, 0, false, past
		}
		if _, ok := set.Lookup(c); ok {
			past = append(past, c)
			k.Hash = c
			continue
		}
		return c, k.Hash, held, past
	}
	return 0, 0, false, past
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
	ab, ok := sa.blocks[h]
	if !ok {
		sa.mu.Unlock()
		return false
	}
	delete(sa.blocks, h)
	// Held by the read-ahead under way: its reference is dropped (the
	// taker holds its own), and it has room for the next block.
	held := false
	if r := sa.run; r != nil {
		room := false
		if hb, ok := r.held[h]; ok && hb == ab {
			delete(r.held, h)
			r.keep, held, room = h, true, true
		} else if _, ok := r.left[h]; ok {
			delete(r.left, h) // read ahead before it: room for one more too
			room = true
		}
		if room {
			select {
			case r.room <- struct{}{}:
			default:
			}
		}
	}
	used := ab == b
	if used {
		t.ahead.hits.Add(1)
	} else {
		t.ahead.unused.Add(1)
	}
	sa.mu.Unlock()
	if held {
		es.set.Release(ab)
	}
	return used
}

// awaitAhead waits while es's read-ahead under way is reading one of
// the leading blocks of hashes, until each of them has landed
// (registered, or given up), the read-ahead ends, or ctx does, and says
// whether it waited.
func (t *tiers) awaitAhead(ctx context.Context, es *engineSet, hashes []uint64) bool {
	sa := &es.ahead
	lead := hashes[:min(len(hashes), maxRestoreBatch)]
	waited := false
	for {
		sa.mu.Lock()
		r := sa.run
		reading := false
		if r != nil {
			for _, h := range lead {
				if _, reading = r.hashes[h]; reading {
					break
				}
			}
		}
		var landed chan struct{}
		if reading {
			landed = r.landed
		}
		sa.mu.Unlock()
		if !reading {
			return waited
		}
		if !waited {
			t.ahead.waits.Add(1)
			waited = true
		}
		select {
		case <-landed:
		case <-r.done:
		case <-ctx.Done():
			return true
		case <-t.done:
			return true
		}
	}
}

// stopAhead cancels es's read-ahead under way, if any, for a set about to
// be freed: its slots are given back as soon as its reads end.
func (t *tiers) stopAhead(es *engineSet) {
	sa := &es.ahead
	sa.mu.Lock()
	if sa.run != nil {
		sa.run.stopLocked()
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
		r.stopLocked()
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

// aheadEnds is how many read-aheads into es have ended; an allocation
// notes it before it looks, for yieldAhead.
func (t *tiers) aheadEnds(es *engineSet) uint64 {
	sa := &es.ahead
	sa.mu.Lock()
	defer sa.mu.Unlock()
	return sa.ends
}

// yieldAhead is what an allocation that failed with ae does about es's
// read-ahead, *seen being aheadEnds as it was before the allocation
// looked: where the read-ahead may hold the slots (aheadMayHold), it ends
// it and says to try again once it ended; and it says to try again where
// one ended since the allocation looked (just before it, or before
// endAhead did: its slots given back meanwhile). Each true moves *seen on,
// so that it says true again only after another ends. False: the
// read-ahead is not why, or ctx ended.
func (t *tiers) yieldAhead(ctx context.Context, es *engineSet, ae *pool.AllocError, seen *uint64) bool {
	if f := t.ahead.beforeYield.Load(); f != nil {
		(*f)()
	}
	if t.aheadMayHold(es, ae) && t.endAhead(ctx, es) {
		*seen = t.aheadEnds(es)
		return true
	}
	if ctx.Err() != nil {
		return false
	}
	n := t.aheadEnds(es)
	if n == *seen {
		return false
	}
	*seen = n
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
