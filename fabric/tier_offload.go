package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
	"golang.org/x/sys/unix"
)

// offloadJob is a block the pool offered to the disk tiers.
type offloadJob struct {
	set  *pool.BlockSet
	blk  pool.Block
	hash uint64
	// parent is the hash of the block before it in its sequence (0 for
	// none): the link read-ahead follows (tier_readahead.go).
	parent uint64
	// held: the caller keeps the slot as it is for the copy's length (not
	// an offer of the pool's), so there is no BeginCopy and EndCopy.
	held bool
	// taken is the block's bytes (canonical order, trailer included),
	// copied out of its slot by an allocation that took the slot before
	// the copy began (take); nil until then.
	taken atomic.Pointer[[]byte]
}

// jobKey names a queued copy by its slot.
type jobKey struct {
	set *pool.BlockSet
	blk pool.Block
}

// offer is the pool's Offload hook: it queues the block for a worker, or
// refuses when the queue is full or the block cannot go to disk (device
// memory without the driver's staging; tier_device.go). Called with the set's lock held: it only queues.
func (t *tiers) offer(set *pool.BlockSet, blk pool.Block, hash, parent uint64) bool {
	if t.refuses(set.Layout()) {
		return false
	}
	if t.readBackoff.refuse(set.ID(), hash, time.Now) {
		return false // its slot read failed lately: recycled as it is
	}
	select {
	case <-t.done:
		return false
	default:
	}
	j := &offloadJob{set: set, blk: blk, hash: hash, parent: parent}
	t.jobsMu.Lock()
	t.jobs[jobKey{set, blk}] = j // before a worker can see it
	p := t.pending[hash]
	if p == nil {
		p = &pendingCopy{done: make(chan struct{})}
		t.pending[hash] = p
	}
	p.n++
	t.jobsMu.Unlock()
	select {
	case t.queue <- j:
		return true
	default:
		t.forgetJob(j)
		t.queueFull.Add(1)
		return false
	}
}

// refuses says whether no tier takes blocks of l: the tiers cannot copy
// them (reachable), or they are larger than the tiers' slots (once the
// stores are open). It is the pool's OffloadSkips too: a set of such a
// layout is given no low watermark and recycles only on need (an
// allocation's), since none of its blocks is kept for a copy below, and
// its Retains (an engine's restore batches and prefetch budget) is every
// slot not retired. A set made before the stores open is judged by
// reachable alone.
func (t *tiers) refuses(l *layout.Layout) bool {
	if !t.reachable(l) {
		return true
	}
	room := t.room.Load()
	return room > 0 && int64(tierBlockBytes(l)) > room // recycled as it is
}

// pendingCopy is a hash's copies down queued or under way.
type pendingCopy struct {
	n    int
	done chan struct{}
}

// whereWait is where, after waiting (until ctx ends) for the copies down
// of k's hash under way if it is not on disk already: for a block not in
// memory, whose slot an allocation may have taken while its copy was
// being written. A block on disk is found at once, whatever copies of
// its hash (from another set) are queued.
func (t *tiers) whereWait(ctx context.Context, k disk.Key) *diskTier {
	if d := t.where(k); d != nil {
		return d
	}
	t.jobsMu.Lock()
	p := t.pending[k.Hash]
	t.jobsMu.Unlock()
	if p != nil {
		if f := t.pendingWait.Load(); f != nil {
			(*f)()
		}
		select {
		case <-p.done:
		case <-ctx.Done():
		case <-t.done:
		}
	}
	return t.where(k)
}

// takeCopyTimeout bounds take's copy out of a device slot, which runs
// under the set's lock: a copy engine that stalls costs the allocation
// that much and the block, not the set.
const takeCopyTimeout = time.Second

// take is the pool's OffloadTake hook: an allocation takes the slot of a
// queued block whose copy has not begun, so its bytes are copied out
// now, in memory, for the copy to write later (from a device set, a
// download through a stager the tiers keep, within takeCopyTimeout: the
// copy engine's time, never the disk's, and no stream or pinned memory
// made or freed). Called with the set's lock held; false (the block is
// dropped) when the job is not found, the block is larger than the
// tiers' slots, or it could not be copied out (no stager kept free).
func (t *tiers) take(set *pool.BlockSet, blk pool.Block, sum uint64, has bool) bool {
	t.jobsMu.Lock()
	j := t.jobs[jobKey{set, blk}]
	t.jobsMu.Unlock()
	l := set.Layout()
	room := t.room.Load()
	if j == nil || (room > 0 && int64(tierBlockBytes(l)) > room) {
		return false
	}
	sio, err := t.slotIO(set)
	if err != nil {
		return false
	}
	if d, ok := sio.(*deviceSlots); ok {
		d.underLock = true // a kept stager or none: the block is dropped
	}
	if room == 0 {
		room = int64(roundUp4K(tierBlockBytes(l))) // the stores' slot once the first block opens them
	}
	buf := t.bufferOf(int(room)) // room >= the block's bytes, checked above
	n := tierBlockBytes(l) - tierTrailer
	ctx, cancel := context.WithTimeout(t.ctx, takeCopyTimeout)
	defer cancel()
	if err := sio.read(ctx, blk.Slot, buf); err != nil {
		t.log.Debug("tier: block not copied out of a slot an allocation took", "hash", j.hash, "err", err)
		t.putBuffer(buf)
		return false
	}
	putTrailer(buf, n, sum, has)
	j.taken.Store(&buf)
	t.taken.Add(1)
	return true
}

// dropTaken gives back the buffer j's bytes were copied out into when an
// allocation took its slot (take), where the copy does not write them.
func (t *tiers) dropTaken(j *offloadJob) {
	if p := j.taken.Load(); p != nil {
		t.putBuffer(*p)
	}
}

// forgetJob drops j from the queued copies, its copy ended.
func (t *tiers) forgetJob(j *offloadJob) {
	t.jobsMu.Lock()
	if t.jobs[jobKey{j.set, j.blk}] == j {
		delete(t.jobs, jobKey{j.set, j.blk})
	}
	if p := t.pending[j.hash]; p != nil {
		if p.n--; p.n == 0 {
			close(p.done)
			delete(t.pending, j.hash)
		}
	}
	t.jobsMu.Unlock()
}

func (t *tiers) worker() {
	defer t.wg.Done()
	batch := make([]*offloadJob, 0, tierBatch)
	for {
		select {
		case <-t.done:
			// Blocks still queued keep their slots: the pool goes with
			// the agent.
			return
		case j := <-t.queue:
			batch = append(batch[:0], j)
		}
		// The copier starts a moment after the block that woke it was
		// queued: that block was offered by an engine's call (Allocate),
		// which ends first instead of sharing a core with the copy, and
		// the blocks queued meanwhile join the batch.
		select {
		case <-time.After(tierBatchDelay):
		case <-t.done:
			return
		}
		// The blocks queued by now go down with it, in one batch.
		for n := t.batchLen(); len(batch) < n; {
			select {
			case j := <-t.queue:
				batch = append(batch, j)
				continue
			default:
			}
			break
		}
		out := t.copyDownBatch(batch)
		for i, j := range batch {
			t.forgetJob(j)
			if out[i].skipped {
				// An allocation took the slot before the copy began: the
				// block is dropped as it would be without a tier.
				t.skipped(j.hash)
				continue
			}
			if out[i].ended {
				continue // ended in copyDownBatch (Offloaded false)
			}
			if err := t.offloaded(j, out[i]); err != nil {
				t.log.Debug("tier: block copied down but its slot moved on", "hash", j.hash, "err", err)
			}
		}
		clear(batch)
	}
}

// batchLen is how many queued blocks a copier takes at once: tierBatch,
// fewer where their buffers would pass tierBatchBytes, one until the
// tiers' block size is known.
func (t *tiers) batchLen() int {
	room := t.room.Load()
	if room <= 0 {
		return 1
	}
	return int(max(1, min(tierBatch, tierBatchBytes/room)))
}

// skipped logs a block not copied down because an allocation took its
// slot first, at most every tierSkipLogEvery. The pool counted it when it
// gave the slot up (pool.Metrics.OffloadsGivenUp, the one count of them).
func (t *tiers) skipped(hash uint64) {
	if log, _ := t.skipLog.due(time.Now(), tierSkipLogEvery); !log {
		return
	}
	t.log.Info("tier: blocks dropped instead of copied down, their slots needed by allocations first", "hash", hash,
		"total", t.a.pool.Metrics().OffloadsGivenUp)
}

// tierSkipLogEvery spaces the log lines of blocks dropped for allocations.
const tierSkipLogEvery = 10 * time.Second

// offloaded ends j's copy down as c says, as copied below only where a
// tier holds the copy still (heldLocked): checked under t.mu with the
// set's Offloaded, so that a copy dropped meanwhile (dropCopy: marked
// gone, then the sets told, then deleted) either is not taken as below or
// has its mark cleared by the drop, before it goes.
func (t *tiers) offloaded(j *offloadJob, c copied) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return j.set.Offloaded(j.blk, c.ok && t.heldLocked(c.key))
}

// copied is how a copy down of one block ended: ok, it is on disk;
// skipped, an allocation took its slot before the copy began
// (pool.Config.OffloadGiveUp); ended, its slot could not be read or its
// write straight from the slot failed, and copyDownBatch ended the
// offload already (Offloaded false). key is the block's key on disk, set
// once its shape is known.
type copied struct {
	ok, skipped, ended bool
	key                disk.Key
}

// copyDownBatch writes the blocks of jobs to a disk tier and reports how
// each copy ended. A block whose slot's memory O_DIRECT takes as it is
// (slotPieces) is written straight from the slot, with no copy: an
// allocation may take the slot under the write (StartCopy direct), and
// then the bytes written are replaced by the ones the allocation copied
// out (take) or the block is dropped, never committed as it was written.
// Any other block is read between BeginCopy and EndCopy into a buffer of
// the copy's own (gathered into canonical order), so that an allocation
// that takes the slot after EndCopy does not change what the tier
// commits. Each block's write starts as soon as it is read, while the next
// is read, and the blocks are committed together (a disk.Batch: one data
// sync and one journal sync for all of them). A full tier makes room by
// dropping its least recently used blocks.
func (t *tiers) copyDownBatch(jobs []*offloadJob) []copied {
	out := make([]copied, len(jobs))
	var items []disk.PutItem // Data nil: written straight from the slot
	var at []int             // items[i] is jobs[at[i]]'s
	var direct []int         // items written straight from slots not held
	var bufs, trailers [][]byte
	defer func() {
		for _, b := range bufs {
			t.putBuffer(b)
		}
		for _, b := range trailers {
			t.trailers.Put(&b)
		}
	}()
	// Close cancels copies under way: the pool's memory goes next.
	ctx, cancel := context.WithTimeout(t.ctx, time.Minute)
	defer cancel()
	var d *diskTier
	var batch tierPuts
	for i, j := range jobs {
		l := j.set.Layout()
		tag, err := t.ensureShape(l)
		if err != nil {
			t.log.Warn("tier: block not copied down", "hash", j.hash, "err", err)
			t.failedAt(d)
			t.dropTaken(j)
			continue
		}
		k := disk.Key{Hash: j.hash, Tag: tag}
		out[i].key = k
		if d := t.where(k); d != nil {
			t.touch(k)
			t.linkHeld(k, j.parent)
			out[i].ok = true
			t.dropTaken(j)
			continue
		}
		if batch == nil {
			if d = t.pick(); d == nil {
				t.log.Warn("tier: block not copied down", "hash", j.hash, "err", "no disk tier is open")
				t.failedAt(d)
				t.dropTaken(j)
				continue
			}
			if d.isHost() {
				// Room for the batch made before its first slot is read,
				// in one move down, not a block at a time while slots
				// are held.
				t.roomFor(d, len(jobs)-i)
			}
			batch = newBatch(d.store.Load())
		}
		src, err := t.readSlot(j, l)
		if errors.Is(err, errSlotRead) {
			// Ended now, not after the batch's commit: the slot, being
			// read until then, is one an allocation may be waiting for.
			now := time.Now()
			delay := t.readBackoff.failed(j.set.ID(), j.hash, now)
			if log, suppressed := t.readBackoff.log.due(now, tierSkipLogEvery); log {
				t.log.Warn("tier: block not copied down", "hash", j.hash, "err", err, "not offered for", delay,
					"failures not logged before", suppressed)
			}
			t.failedAt(d)
			t.dropTaken(j)
			if err := j.set.Offloaded(j.blk, false); err != nil {
				t.log.Debug("tier: block not copied down and its slot moved on", "hash", j.hash, "err", err)
			}
			out[i].ended = true
			t.signal()
			continue
		}
		if err != nil {
			p := j.taken.Load()
			if p == nil {
				out[i].skipped = true
				continue
			}
			src = slotCopy{buf: *p} // copied out when its slot was taken
		} else {
			t.readBackoff.succeeded(j.set.ID(), j.hash)
		}
		if f := t.beforePut.Load(); f != nil {
			(*f)()
		}
		t.roomFor(d, 1) // a block written straight from its slot is not kept for a second try
		at = append(at, i)
		if src.pieces != nil {
			trailers = append(trailers, src.trailer)
			items = append(items, parentItem(k, nil, j.parent))
			if !j.held {
				direct = append(direct, len(items)-1)
			}
			batch.AddPieces(ctx, k, src.pieces...)
			keepParent(batch, items)
			continue
		}
		bufs = append(bufs, src.buf)
		items = append(items, parentItem(k, src.buf[:tierBlockBytes(l)], j.parent))
		batch.Add(ctx, k, items[len(items)-1].Data)
		keepParent(batch, items)
	}
	if batch == nil {
		return out
	}
	// A block written straight from a slot is committed only if the slot
	// was not taken before its write ended.
	// One whose write failed or was never sent (the tier full, ctx ended)
	// ends its copy at once, the block in memory as before its offer, to
	// be offered again: never marked copied (EndCopy), which would let an
	// allocation take its slot as if nothing were lost.
	for _, n := range direct {
		j := jobs[at[n]]
		werr := batch.Wait(n)
		if werr != nil && directRefused(werr) {
			t.directFailed(werr)
		}
		if werr != nil {
			if err := j.set.Offloaded(j.blk, false); err == nil {
				out[at[n]].ended = true
				continue // Commit reports werr for it
			}
			// The slot was taken under the write: what was copied out
			// goes down instead, below.
		} else if err := j.set.EndCopy(j.blk); err == nil {
			continue
		}
		if p := j.taken.Load(); p != nil {
			items[n].Data = (*p)[:tierBlockBytes(j.set.Layout())]
			bufs = append(bufs, *p)
			if batch.Replace(ctx, n, items[n].Data) {
				t.rewritten.Add(1)
			} // else never sent: Commit says why, and a full tier is retried with Data below
			continue
		}
		batch.Drop(n)
		out[at[n]].skipped = true
	}
	if f := t.beforeCommit.Load(); f != nil {
		(*f)()
	}
	errs := batch.Commit()
	var lastErr error
	for try := 0; ; try++ {
		keep, keepAt := items[:0], at[:0]
		var placing []disk.Key
		var lengths []int
		var placingAt []int
		for n, err := range errs {
			switch {
			case err == nil:
				if items[n].Data == nil {
					t.direct.Add(1) // committed as written straight from its slot
				}
				placing = append(placing, items[n].Key)
				lengths = append(lengths, tierBlockBytes(jobs[at[n]].set.Layout()))
				placingAt = append(placingAt, at[n])
			case errors.Is(err, disk.ErrDropped):
			case errors.Is(err, disk.ErrFull) && items[n].Data != nil:
				keep, keepAt = append(keep, items[n]), append(keepAt, at[n])
				lastErr = err
			case errors.Is(err, disk.ErrFull):
				// Its slot was not kept for a second try: it stays in
				// memory, to be offered again.
			default:
				if items[n].Data == nil && directRefused(err) {
					t.directFailed(err) // written straight from a slot its caller holds
				}
				t.log.Warn("tier: block not copied down", "hash", items[n].Key.Hash, "err", err)
				t.failedAt(d)
			}
		}
		second := t.placeAll(d, placing, lengths)
		for i, k := range placing {
			t.link(k, jobs[placingAt[i]].parent)
			out[placingAt[i]].ok = true // kept below, here or in the tier that had it
		}
		t.dropSecond(d, second)
		items, at = keep, keepAt
		if len(items) == 0 || try == 8 {
			break
		}
		if free, made := t.roomFor(d, len(items)); free == 0 && made == 0 {
			break // nothing left to make room with
		}
		if d = t.pick(); d == nil {
			lastErr = errors.New("fabric: no disk tier is open")
			break
		}
		errs = d.store.Load().PutBatch(ctx, items)
	}
	for _, n := range at {
		t.log.Warn("tier: block not copied down", "hash", jobs[n].hash, "err", lastErr)
		t.failedAt(d)
	}
	return out
}

// failedAt counts a copy down that failed on d, the tier it was written
// to; before one was picked, on the tier pick gives (the first with none
// open).
func (t *tiers) failedAt(d *diskTier) {
	if d == nil {
		d = t.pick()
	}
	if d == nil {
		d = t.list[0]
	}
	d.failed.Add(1)
}

// directFailed turns reads and writes straight from and into pool memory
// off after O_DIRECT refused one (directRefused): copies down gather into
// buffers from then on, and restores read into buffers. A block whose
// write failed stays in memory, to be offered again; a read is tried
// again through a buffer.
func (t *tiers) directFailed(err error) {
	if t.noDirect.CompareAndSwap(false, true) {
		t.log.Warn("tier: O_DIRECT refused pool memory: blocks go through buffers from now on", "err", err)
	}
}

// directRefused says whether err is O_DIRECT refusing the memory it was
// given (its alignment, or memory it cannot pin), not the disk failing.
func directRefused(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EFAULT)
}

// placeAll records the copies of ks (lengths[i] bytes each) just committed
// to tier d, as placed says, announces those it recorded, and returns the
// ones to delete as second copies (dropSecond's: the caller's, with no lock
// held). A copy committed while a delete of its block in d is under way
// (dropCopy: a second copy there, or an eviction) may or may not be taken
// by it: placeAll waits for those deletes to end first (waitDeleted), with
// no lock held, then records each under announceMu as placed says, the
// store asked whether it holds the copy; one whose delete began since is
// waited for again, after announceMu is let go of. So announceMu is never
// held across a delete (a disk store's delete may wait for a commit's
// lock, and a corrupt copy's syncs the journal), which would stall every
// announcement, forget and resync behind it.
func (t *tiers) placeAll(d *diskTier, ks []disk.Key, lengths []int) (second []disk.Key) {
	left := make([]int, len(ks))
	for i := range left {
		left[i] = i
	}
	for len(left) > 0 {
		wait := make([]disk.Key, len(left))
		for i, n := range left {
			wait[i] = ks[n]
		}
		t.waitDeleted(d, wait...)
		var put []uint64
		busy := left[:0]
		t.order() // until the records are announced
		for _, n := range left {
			announce, dup, ok := t.placed(d, ks[n], lengths[n])
			switch {
			case !ok:
				busy = append(busy, n)
			case announce:
				put = append(put, ks[n].Hash)
			case dup:
				second = append(second, ks[n])
			}
		}
		d.offloads.Add(uint64(len(put)))
		t.announce(true, d.n, put...)
		t.announceMu.Unlock()
		left = busy
	}
	return second
}

// placed records that tier d now holds k, length bytes, just committed
// there, and says whether to announce it: false if k had a record already.
// Another copy of the same block got there first: in d, the store replaced
// it (the record stays, touched); in another tier, that tier's copy and
// record stay (touched) and the copy just committed to d, recorded
// nowhere, is to be deleted (second): by the caller, with neither t.mu nor
// announceMu held (dropSecond), since a disk store's delete may wait for a
// commit's lock (its record goes with the next commit). A copy a record
// names is never deleted: that would leave the record naming a tier
// without the block. Where the record is gone (its copy being dropped, or
// dropped and the record not yet forgotten: dropCopy), in d or elsewhere,
// the copy just committed is not its copy: its dropper deletes that and
// forgets the record, so this one, recorded nowhere, is a second copy too,
// deleted rather than left in the store with no record. Where a delete of
// k in d is under way, nothing is decided and ok is false: the caller
// waits for it to end and calls again (placeAll). With none under way, the
// copy is recorded only if the store holds it (a delete that ended since
// the commit may have taken it), so that a block whose other copy went
// meanwhile is not lost from the node, nor a record made naming a tier
// without the block. The store's lock is taken under t.mu (Has).
// announceMu is held.
func (t *tiers) placed(d *diskTier, k disk.Key, length int) (announce, second, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.deleting[tierKey{d.n, k}] > 0 {
		return false, false, false
	}
	if e, ok := t.pos[k]; ok {
		old := e.Value.(*tierEntry)
		if old.gone {
			return false, true, true
		}
		if old.tier != d.n {
			t.lru(old.tier).MoveToBack(e)
			return false, true, true
		}
		// Replaced in d by the copy just committed: still one copy, one
		// record, already announced (two sets' copies of one block in a
		// batch, or two copiers at once); announcing it again would count
		// a copy the node does not have once the one is gone.
		t.lru(d.n).MoveToBack(e)
		return false, false, true
	}
	if st := d.store.Load(); st != nil && !st.Has(k) {
		return false, false, true // a delete ended since the commit took it
	}
	t.recordLocked(d, k, length)
	return true, false, true
}

// dropSecond deletes the copies of ks in tier d that placed found recorded
// in another tier, each unless d holds it as its record by now (a copy
// placed there again since, or the block moved there): called with neither
// t.mu nor announceMu held.
func (t *tiers) dropSecond(d *diskTier, ks []disk.Key) {
	for _, k := range ks {
		if err := t.dropCopy(d, k, false); err != nil && !errors.Is(err, disk.ErrNotFound) {
			t.log.Warn("tier: free a second copy", "hash", k.Hash, "tier", d.n, "err", err)
		}
	}
}

// slotCopy is what a copy down writes: pieces of the slot itself and a
// trailer (direct, trailer the buffer it is in), or buf, a copy of the
// block with its trailer.
type slotCopy struct {
	pieces  [][]byte
	trailer []byte
	buf     []byte
}

// maxDirectPieces bounds the pieces of pool memory one block is written
// from straight (one vectored write); a block in more is gathered.
const maxDirectPieces = 64

// readSlot begins the copy of j's block out of its slot, unless j.held
// between StartCopy and EndCopy: where the slot is host memory that
// O_DIRECT writes as it is (slotPieces), its pieces and a trailer, the
// copy ended by the caller (EndCopy, once the write ended); else a copy in
// canonical order through the set's slot I/O (a gather, or a download out
// of a device set), with its trailer, in a buffer of the tiers', the copy
// ended. An error says the slot was taken before the copy began: nothing
// was read; or, wrapping errSlotRead, that the slot could not be read:
// the slot stays being read (an allocation does not take it, as copied
// below or otherwise) until the caller ends the offload as failed.
func (t *tiers) readSlot(j *offloadJob, l *layout.Layout) (slotCopy, error) {
	sio, err := t.slotIO(j.set)
	if err != nil {
		return slotCopy{}, err
	}
	n := tierBlockBytes(l) - tierTrailer
	if h, ok := sio.(hostSlots); ok && !t.noDirect.Load() {
		if pieces := slotPieces(l, h.regions, j.blk.Slot); pieces != nil {
			sum, has, err := t.startCopy(j, true)
			if err != nil {
				return slotCopy{}, err
			}
			tr := t.trailerBuffer()
			putTrailer(tr, 0, sum, has)
			return slotCopy{pieces: append(pieces, tr[:tierTrailer]), trailer: tr}, nil
		}
	}
	sum, has, err := t.startCopy(j, false)
	if err != nil {
		return slotCopy{}, err
	}
	buf := t.buffer()
	err = sio.read(t.ctx, j.blk.Slot, buf)
	if f := t.failSlotRead.Load(); f != nil && err == nil {
		err = (*f)(j.hash)
	}
	if err != nil {
		t.putBuffer(buf)
		return slotCopy{}, fmt.Errorf("%w: %w", errSlotRead, err)
	}
	putTrailer(buf, n, sum, has)
	if !j.held {
		if err := j.set.EndCopy(j.blk); err != nil {
			return slotCopy{buf: buf}, nil // cannot be: a slot being read is not taken
		}
		t.signal() // an allocation waiting for this slot may take it now
	}
	return slotCopy{buf: buf}, nil
}

// startCopy is StartCopy for j, or, for a block its caller holds, its
// recorded checksum.
func (t *tiers) startCopy(j *offloadJob, direct bool) (uint64, bool, error) {
	if j.held {
		sum, has := j.set.Sum(j.blk)
		return sum, has, nil
	}
	return j.set.StartCopy(j.blk, direct)
}

// slotPieces is slot's block in canonical order as pieces of the set's
// memory, its contiguous chunks joined, where O_DIRECT writes them as they
// are (each at an address and of a length aligned to disk.Align, at most
// maxDirectPieces of them), else nil.
func slotPieces(l *layout.Layout, regions [][]byte, slot int) [][]byte {
	type span struct {
		rank       int
		start, end uint64
	}
	var spans []span
	forEachChunk(l, slot, func(rank int, off uint64, n int, _ int) {
		if k := len(spans) - 1; k >= 0 && spans[k].rank == rank && spans[k].end == off {
			spans[k].end += uint64(n)
			return
		}
		spans = append(spans, span{rank, off, off + uint64(n)})
	})
	if len(spans) > maxDirectPieces {
		return nil
	}
	out := make([][]byte, 0, len(spans)+1) // room for the trailer
	for _, s := range spans {
		p := regions[s.rank][s.start:s.end]
		if len(p)%disk.Align != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(p)))%disk.Align != 0 {
			return nil
		}
		out = append(out, p)
	}
	return out
}

// trailerBuffer is an aligned page for a block's trailer, written after
// the block's pieces straight from pool memory.
func (t *tiers) trailerBuffer() []byte {
	if b, ok := t.trailers.Get().(*[]byte); ok {
		return *b
	}
	return alignedBuffer(disk.Align)
}

// errSlotRead is readSlot's failure to read a slot it holds.
var errSlotRead = errors.New("fabric: slot not read")

// pick is the host tier if there is one, else the open tier with the
// most free slots, nil if none is open.
func (t *tiers) pick() *diskTier {
	if h := t.hostTier(); h != nil {
		return h
	}
	return t.pickBelow() // a host tier not open has no store: none to skip
}

// announce publishes that this node holds (or no longer holds) hashes on
// tier n: under the tier's block set number (tierSet), or to the owners as
// copies on disk, or in memory for the host tier's. announceMu is held,
// since the change to the records it announces.
func (t *tiers) announce(store bool, n int, hashes ...uint64) {
	m := t.a.joined.Load()
	if m == nil || !t.announcing.Load() || len(hashes) == 0 {
		return // announced whole once the node joins (announceAll)
	}
	set := t.tierSet(n)
	if f := t.a.cfg.hooks.tierAnnounced; f != nil {
		f(store, set, hashes)
	}
	if o := t.a.owned; o != nil {
		o.publishHeld(store, set < tierSetBase, hashes) // to the hashes' owners, not gossip
		return
	}
	kind := membership.EventRemove
	if store {
		kind = membership.EventStore
	}
	if _, err := m.Publish(kind, set, hashes...); err != nil && !errors.Is(err, membership.ErrClosed) {
		t.log.Warn("tier: events not published", "err", err)
	}
}

// announceAll publishes every disk-held block: at start, once joined,
// each tier's in one batch. The changes recorded before it are announced
// by it; those after, each on its own.
func (t *tiers) announceAll() {
	t.order()
	defer t.announceMu.Unlock()
	t.announcing.Store(true)
	for n, hashes := range t.heldByTier() {
		t.announce(true, n, hashes...)
	}
}

// announced calls f with the tiers' blocks as announced, each under its
// tier's block set number (tierSet): a resync's part from the tiers. f
// runs under announceMu, so no change to the records is waiting for its
// announcement, nor announced, while the records are read and f runs;
// before announceAll, f gets none (announceAll announces them later). f
// may take the owned index's mu or the membership's lock, not announceMu.
func (t *tiers) announced(f func(held []membership.Entry)) {
	t.order()
	defer t.announceMu.Unlock()
	var held []membership.Entry
	if t.announcing.Load() {
		held = t.holdings()
	}
	f(held)
}

// heldByTier are the hashes of the tiers' blocks, tier n's at [n].
func (t *tiers) heldByTier() [][]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([][]uint64, len(t.list))
	for k, e := range t.pos {
		n := e.Value.(*tierEntry).tier
		out[n] = append(out[n], k.Hash)
	}
	return out
}

// holdings are the tiers' blocks as membership entries, each under its
// tier's block set number (tierSet). A resync takes them through
// announced.
func (t *tiers) holdings() []membership.Entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]membership.Entry, 0, len(t.pos))
	for k, e := range t.pos {
		out = append(out, membership.Entry{Hash: k.Hash, BlockSet: t.tierSet(e.Value.(*tierEntry).tier)})
	}
	return out
}

// allocate takes n slots of es's set. The pool takes the slots of blocks
// being copied down when it finds no other (pool.Config.OffloadGiveUp), so
// an allocation never waits for the disk; it waits, until ctx ends, only
// when the slots it needs are being read by copies (a copy in memory), or
// held by the set's read-ahead (pool.AllocError.Spare, or one under way
// that holds its blocks referenced): that it ends first, and tries again
// (also where one ended since it looked: yieldAhead), as reading ahead is
// done only with room to spare, so that it never makes an allocation fail
// that would succeed without it.
func (t *tiers) allocate(ctx context.Context, es *engineSet, n int) ([]pool.Block, error) {
	for {
		wait := t.waitProgress()
		seen := t.aheadEnds(es)
		blks, err := es.set.Allocate(n)
		var ae *pool.AllocError
		if err == nil || !errors.As(err, &ae) {
			return blks, err
		}
		if t.yieldAhead(ctx, es, ae, &seen) {
			continue
		}
		if ae.Copying == 0 {
			return blks, err
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, err
		case <-t.done:
			return nil, err
		}
	}
}
