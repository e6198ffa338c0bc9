package fabric

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// maxRestoreBatch bounds the blocks one restore brings up at once;
// restoreReaders of them are read at a time.
const (
	maxRestoreBatch = 256
	restoreReaders  = 8
)

// restore brings the leading blocks of hashes that a disk tier holds in
// es's shape up into es: each block read back (straight into its slot
// of host memory where O_DIRECT takes it as it is, slotPieces; else into
// a buffer, then into the slot through the set's slot I/O: a scatter, or
// an upload into a device set), checked (the store's checksum of its bytes,
// then the content checksum it had when it went down, over its bytes in
// the slot), and registered with a reference the caller owns. A block that fails a check is dropped from its tier and
// ends the run. Returns the blocks restored, in order. A block not on disk
// whose copy down is under way is waited for (whereWait).
func (t *tiers) restore(ctx context.Context, es *engineSet, hashes []uint64, parent uint64) ([]pool.Block, error) {
	return t.restoreFound(ctx, es, hashes, parent, t.whereWait)
}

// restoreNow is restore of the blocks a disk tier holds now (where),
// waiting for no copy down under way: for Lookup, which answers at once.
func (t *tiers) restoreNow(ctx context.Context, es *engineSet, hashes []uint64, parent uint64) ([]pool.Block, error) {
	return t.restoreFound(ctx, es, hashes, parent, func(_ context.Context, k disk.Key) *diskTier { return t.where(k) })
}

// restoreFound is restore with find saying which tier holds each block.
// Where the set's read-ahead under way brings up a leading block, it is
// waited for, and the leading blocks the set holds then are taken from
// it (referenced) before the run that follows is restored.
func (t *tiers) restoreFound(ctx context.Context, es *engineSet, hashes []uint64, parent uint64,
	find func(context.Context, disk.Key) *diskTier) ([]pool.Block, error) {
	var out []pool.Block
	if t.awaitAhead(ctx, es, hashes) {
		for _, h := range hashes {
			b, ok := es.set.Acquire(h)
			if !ok {
				break
			}
			t.aheadUsed(es, h, b)
			out = append(out, b)
		}
		if len(out) == len(hashes) {
			return out, nil
		}
		if len(out) > 0 {
			parent, hashes = hashes[len(out)-1], hashes[len(out):]
		}
	}
	alloc := func(ctx context.Context, _ *pool.BlockSet, n int) ([]pool.Block, error) {
		return t.allocate(ctx, es, n)
	}
	blks, own, err := t.restoreRun(ctx, es, hashes, parent, find, alloc, t.forgetFound, false)
	// A copy registered meanwhile under one of these hashes is what the
	// caller gets instead of the restored one: where a read-ahead brought
	// it, it is taken as an Acquire takes it (counted, no longer ahead of
	// use), so that it does not count against the next read-ahead's room
	// until recycled.
	for i, b := range blks {
		if !own[i] {
			t.aheadUsed(es, hashes[i], b)
		}
	}
	return append(out, blks...), err
}

// restoreRun restores the leading blocks of hashes that find places in a
// tier into es, into slots alloc gives (all it is asked for, or as many
// as it can: the run is cut to the slots it gave), and returns them,
// referenced, with own[i] true where blks[i] is the block restored (not a
// copy registered meanwhile under the same hash, which blks[i] then
// references instead). A run read ahead (ahead) is registered after
// parent but detached from it (pool.Registration.Detached), so that the
// blocks of the sequence already used go before it. A block found corrupt
// or missing has its record marked gone and the sets that hold it told at
// once (dropFound, lostCopy: the pool's and the sets' locks, not a.mu),
// and is passed to forget, which drops that record (the one its failure
// marked, tierFound.e, and no record made since the failure) and
// announces it (tiers.forgetFound).
func (t *tiers) restoreRun(ctx context.Context, es *engineSet, hashes []uint64, parent uint64,
	find func(context.Context, disk.Key) *diskTier,
	alloc func(context.Context, *pool.BlockSet, int) ([]pool.Block, error),
	forget func(tierFound), ahead bool) (blks []pool.Block, own []bool, err error) {
	set := es.set
	l := set.Layout()
	if !t.reachable(l) {
		return nil, nil, nil
	}
	tag := shapeTag(l)
	var run []tierFound
	limit := min(maxRestoreBatch, max(1, set.Retains()/2))
	for _, h := range hashes {
		k := disk.Key{Hash: h, Tag: tag}
		d := find(ctx, k)
		if d == nil || len(run) == limit {
			break
		}
		run = append(run, tierFound{d: d, k: k})
	}
	if len(run) == 0 {
		return nil, nil, nil
	}
	blks, err = alloc(ctx, set, len(run))
	if err != nil {
		return nil, nil, fmt.Errorf("slots to restore %d blocks from disk: %w", len(run), err)
	}
	if run = run[:len(blks)]; len(run) == 0 {
		return nil, nil, nil
	}
	if f := t.restoring.Load(); f != nil && !ahead {
		(*f)()
	}
	sio, err := t.slotIO(set)
	if err != nil {
		for _, b := range blks {
			set.Abort(b)
		}
		return nil, nil, err
	}
	// The blocks are read, checked and copied into their slots in
	// parallel (restoreReaders at a time); the run registered is the
	// prefix that came up whole.
	outs := make([]restoreOutcome, len(run))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(t.restoreReaders(l), len(run)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte // for blocks not read straight into their slots
			defer func() {
				if buf != nil {
					t.putBuffer(buf)
				}
			}()
			tr := t.trailerBuffer()
			defer t.trailers.Put(&tr)
			for i := range next {
				outs[i] = t.readBlock(ctx, set, sio, &run[i], blks[i], &buf, tr)
			}
		}()
	}
	for i := range run {
		next <- i
	}
	close(next)
	wg.Wait()
	regs := make([]pool.Registration, 0, len(run))
	var cause error
	for i, f := range run {
		o := outs[i]
		if o.err != nil {
			if errors.Is(o.err, disk.ErrCorrupt) || errors.Is(o.err, disk.ErrNotFound) {
				if errors.Is(o.err, disk.ErrCorrupt) {
					t.corrupt.Add(1)
					t.log.Warn("tier: disk block failed its check: dropped, never served", "hash", f.k.Hash, "tier", f.d.n, "err", o.err)
				}
				forget(f)
			}
			if cause == nil {
				cause = o.err
			}
			continue
		}
		if cause != nil {
			continue // after a gap: not registered, kept on disk
		}
		regs = append(regs, pool.Registration{Block: blks[i], Hash: f.k.Hash, Sum: o.sum, HasSum: o.has && es.sums, Below: true,
			Detached: ahead && len(regs) == 0})
		t.touch(f.k)
		f.d.restores.Add(1)
		f.d.restoreTime.record(o.took)
	}
	for i, b := range blks[len(regs):] {
		if errors.Is(outs[len(regs)+i].err, errSlotUnsynced) {
			// Its upload may still land: the slot is retired, out of
			// use for the set's life, so that no later block is put in
			// it and overwritten; once the set is freed its memory goes
			// to no other set while the agent runs (pool.BlockSet.Retire).
			if err := set.Retire(b); err != nil {
				t.log.Error("tier: device slot not retired", "set", set.ID(), "slot", b.Slot, "err", err)
			}
			t.log.Warn("tier: a device slot retired: its restore's copy may still land", "set", set.ID(), "slot", b.Slot, "hash", run[len(regs)+i].k.Hash)
			continue
		}
		set.Abort(b)
	}
	if len(regs) == 0 {
		return nil, nil, cause
	}
	// Copied below only while a tier holds the copy still, checked under
	// t.mu with the registration: a copy dropped since it was read
	// (dropCopy marks its record gone, then clears the marks, then
	// deletes it) is not taken as below.
	t.mu.Lock()
	for i := range regs {
		regs[i].Below = t.heldLocked(run[i].k)
	}
	out, err := set.RegisterBatch(regs, parent)
	t.mu.Unlock()
	for _, r := range regs[len(out):] {
		set.Abort(r.Block)
	}
	own = make([]bool, len(out))
	for i, b := range out {
		own[i] = b == regs[i].Block
	}
	if err != nil {
		return out, own, err
	}
	return out, own, cause
}

// fromTier restores the leading blocks of hashes from this node's disk
// tiers into s, for an import: the blocks are the session's.
func (a *Agent) fromTier(ctx context.Context, s *sessionSet, hashes []uint64, parent uint64) ([]*fabricpb.BlockRef, *fabricpb.Fetch, error) {
	if a.tiers == nil {
		return nil, nil, nil
	}
	start := time.Now()
	blks, err := a.tiers.restore(ctx, s.engineSet, hashes, parent)
	if len(blks) == 0 {
		if err != nil && !errors.Is(err, disk.ErrCorrupt) && !errors.Is(err, disk.ErrNotFound) {
			return nil, nil, localError{fmt.Errorf("restore from disk: %w", err)}
		}
		return nil, nil, nil // dropped: looked for elsewhere
	}
	if !s.holdAll(blks) {
		return nil, nil, localError{errSessionGone} // given back: no read-ahead
	}
	a.tiers.readAheadAfter(s.engineSet, hashes[len(blks)-1])
	refs := make([]*fabricpb.BlockRef, len(blks))
	for i, b := range blks {
		refs[i] = &fabricpb.BlockRef{Hash: hashes[i], Slot: uint32(b.Slot)}
	}
	l := s.set.Layout()
	// "host" where every block came from the host tier (restores leave
	// their copies in their tiers), else "disk".
	transport := tierHost
	tag := shapeTag(l)
	for _, h := range hashes[:len(blks)] {
		if d := a.tiers.where(disk.Key{Hash: h, Tag: tag}); d == nil || !d.isHost() {
			transport = "disk"
			break
		}
	}
	f := &fabricpb.Fetch{Node: a.cfg.NodeName, Transport: transport, Blocks: uint32(len(blks)),
		Bytes: uint64(len(blks)) * l.Strides().Shard * uint64(l.TPSize), Micros: uint64(time.Since(start).Microseconds())}
	return refs, f, nil
}

// tierFound is a block to restore and the tier that holds it; once read
// (readBlock), gen is the generation of the copy read (0: none read), and
// e the record the read's failure marked gone, to be forgotten
// (forgetFound), nil if it marked none: a copy found missing, or dropped
// by the store as its checksum failed, marks the record that names d then
// (lostCopy); a copy found corrupt by the tiers' own checks is dropped by
// its generation (dropFound), with the record that named it as it was
// dropped. A record the failure did not mark (one whose copy was
// committed since the read, placed in it) is never forgotten for it.
type tierFound struct {
	d   *diskTier
	k   disk.Key
	gen uint64
	e   *list.Element
}

// forgetFound forgets the record f's failure marked gone (f.e: lostCopy's
// or dropFound's), if it is still k's record; nothing where the failure
// marked none. Gone by then and another's (an eviction's claim), or
// forgotten and replaced, it is left for its own dropper.
func (t *tiers) forgetFound(f tierFound) {
	if f.e != nil {
		t.forgetIf(f.d, f.k, f.e)
	}
}

// dropFound drops f's copy, found corrupt by the tiers' own checks (its
// length, its content checksum) or by the store itself (a move down's
// read of a host copy): the copy of the generation read, f.gen,
// and only while the store holds that one (dropCopyGen), with the record
// that names it then marked gone and kept in f.e to be forgotten, so that
// a copy committed since in its place (placed reusing the record) and its
// record stay, and a record replaced between the read's start and the
// store's read is acted on as the one the copy read was of. A copy no
// record names is deleted alone. With f.gen 0 no copy was read (a store
// gives each copy it holds a generation from 1 up): nothing is dropped
// nor marked, where dropCopyGen would take 0 as a delete by key.
func (t *tiers) dropFound(f *tierFound) {
	if f.gen == 0 {
		f.e = nil
		return
	}
	f.e, _ = t.dropCopyGen(f.d, f.k, true, nil, f.gen)
}

// restoreOutcome is one block's read for a restore: its content checksum
// (has: it had one), how long it took, or why it failed.
type restoreOutcome struct {
	sum  uint64
	has  bool
	took time.Duration
	err  error
}

// readBlock reads f's block into blk's slot of set through sio: straight
// into the slot where O_DIRECT takes its memory as it is (the trailer into
// tr, a page of its own), else into *buf (taken from the tiers' buffers
// if nil; the caller gives it back), scattered from there; then checks it
// (its length, the content checksum over the slot). A block that fails a
// check is deleted from its store (disk.ErrCorrupt), only while the store
// still holds the generation read. One not found where f said is looked
// for once more in the tier that holds it now (moved down meanwhile), and
// f updated. f.gen is set to the generation of the copy read: a copy
// found corrupt by the tiers' checks is dropped by it (dropFound); f.e to
// the record a failure marked gone, for the caller to forget: a copy
// found missing, or corrupt by the store's check (the store dropped it),
// marks the record that names f's tier then, if its store holds no copy
// of the block by then (lostCopy). ctx ended: not read.
func (t *tiers) readBlock(ctx context.Context, set *pool.BlockSet, sio slotIO, f *tierFound, blk pool.Block, buf *[]byte, tr []byte) (o restoreOutcome) {
	l := set.Layout()
	n := tierBlockBytes(l) - tierTrailer
	f.e = nil
	if err := ctx.Err(); err != nil {
		// Cancelled (a read-ahead ended for its slots): the blocks left
		// are not read.
		o.err = fmt.Errorf("fabric: restore of disk block %016x: %w", f.k.Hash, err)
		return o
	}
	start := time.Now()
	var pieces [][]byte
	if h, ok := sio.(hostSlots); ok && !t.noDirect.Load() {
		pieces = slotPieces(l, h.regions, blk.Slot)
	}
	var got int
	var err error
	for try := 0; ; try++ {
		if h := t.beforeRead.Load(); h != nil {
			(*h)(f.d, f.k)
		}
		if pieces != nil {
			got, f.gen, err = f.d.store.Load().GetPiecesGen(ctx, f.k, append(pieces, tr[:tierTrailer])...)
			if err != nil && directRefused(err) {
				t.directFailed(err)
				pieces = nil // read again through a buffer
			}
		}
		if pieces == nil {
			if *buf == nil {
				*buf = t.buffer()
			}
			got, f.gen, err = f.d.store.Load().GetGen(ctx, f.k, *buf)
		}
		if try > 0 || !errors.Is(err, disk.ErrNotFound) {
			break
		}
		// Moved meanwhile (down from the host tier): read once more from
		// the tier that holds it now.
		d := t.where(f.k)
		if d == nil || d == f.d {
			break
		}
		f.d = d
	}
	if h := t.afterRead.Load(); h != nil {
		(*h)(f.d, f.k, err)
	}
	switch {
	case errors.Is(err, disk.ErrTooLarge):
		err = fmt.Errorf("fabric: disk block %016x longer than its shape's %d bytes: %w", f.k.Hash, n+tierTrailer, disk.ErrCorrupt)
		t.dropFound(f)
	case err == nil && got != n+tierTrailer:
		err = fmt.Errorf("fabric: disk block %016x of %d bytes, its shape has %d: %w", f.k.Hash, got, n+tierTrailer, disk.ErrCorrupt)
		t.dropFound(f)
	case errors.Is(err, disk.ErrCorrupt), errors.Is(err, disk.ErrNotFound):
		f.e = t.lostCopy(f.d, f.k) // the store dropped it (its checksum failed), or it went
	}
	if err == nil && pieces == nil {
		err = sio.write(ctx, blk.Slot, *buf)
	}
	if err == nil {
		if pieces != nil {
			o.sum, o.has = trailer(tr, 0)
		} else {
			o.sum, o.has = trailer(*buf, n)
		}
		if o.has && !t.a.cfg.NoChecksums {
			if again, ok := blockSum(set, blk.Slot, 0, l.PageSize); ok && again != o.sum {
				err = fmt.Errorf("fabric: disk block %016x restored with content checksum %016x, not %016x: %w", f.k.Hash, again, o.sum, disk.ErrCorrupt)
				t.dropFound(f)
			}
		} else if !t.a.cfg.NoChecksums {
			// Copied down without one (from device memory, which is not
			// summed): its bytes, checked by the store on the way up, get
			// their sum now that they are in host memory, as a
			// registration there gives them, so that peers check what
			// they import of it.
			o.sum, o.has = blockSum(set, blk.Slot, 0, l.PageSize)
		}
	}
	o.err, o.took = err, time.Since(start)
	return o
}
