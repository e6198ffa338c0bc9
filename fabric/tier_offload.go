package fabric

import (
	"context"
	"errors"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// offloadJob is a block the pool offered to the disk tiers.
type offloadJob struct {
	set  *pool.BlockSet
	blk  pool.Block
	hash uint64
}

// offer is the pool's Offload hook: it queues the block for a worker, or
// refuses when the queue is full or the block cannot go to disk (device
// memory). Called with the set's lock held: it only queues.
func (t *tiers) offer(set *pool.BlockSet, blk pool.Block, hash, parent uint64) bool {
	l := set.Layout()
	if len(l.Regions) == 0 || l.Regions[0].Kind == layout.Device {
		return false
	}
	if room := t.room.Load(); room > 0 && int64(tierBlockBytes(l)) > room {
		return false // larger than the tiers' slots: recycled as it is
	}
	select {
	case <-t.done:
		return false
	default:
	}
	select {
	case t.queue <- offloadJob{set: set, blk: blk, hash: hash}:
		return true
	default:
		t.queueFull.Add(1)
		return false
	}
}

func (t *tiers) worker() {
	defer t.wg.Done()
	for {
		select {
		case <-t.done:
			// Blocks still queued keep their slots: the pool goes with
			// the agent.
			return
		case j := <-t.queue:
			ok := t.copyDown(j)
			if err := j.set.Offloaded(j.blk, ok); err != nil {
				t.log.Debug("tier: block copied down but its slot moved on", "hash", j.hash, "err", err)
			}
			t.signal()
		}
	}
}

// copyDown writes j's block to a disk tier and reports whether it is there.
// A full tier makes room by dropping its least recently used blocks.
func (t *tiers) copyDown(j offloadJob) bool {
	l := j.set.Layout()
	tag, err := t.ensureShape(l)
	if err != nil {
		t.log.Warn("tier: block not copied down", "hash", j.hash, "err", err)
		t.list[0].failed.Add(1)
		return false
	}
	k := disk.Key{Hash: j.hash, Tag: tag}
	if d := t.where(k); d != nil {
		t.touch(k)
		return true
	}
	regions, err := j.set.RegionBytes()
	if err != nil {
		return false
	}
	n := tierBlockBytes(l) - tierTrailer
	buf := t.buffer()
	defer t.putBuffer(buf)
	gatherBlock(l, regions, j.blk.Slot, buf)
	sum, has := j.set.Sum(j.blk)
	putTrailer(buf, n, sum, has)
	data := buf[:n+tierTrailer]
	// Close cancels copies under way: the pool's memory goes next.
	ctx, cancel := context.WithTimeout(t.ctx, time.Minute)
	defer cancel()
	for try := 0; try < 8; try++ {
		d := t.pick()
		if d == nil {
			err = errors.New("fabric: no disk tier is open")
			break
		}
		err = d.store.Load().Put(ctx, k, data)
		if err == nil {
			t.mu.Lock()
			if e, ok := t.pos[k]; ok {
				// Another copy of the same block got there first: the store
				// replaced it, in this tier or another.
				old := e.Value.(*tierEntry)
				t.heldBytes[old.tier] -= int64(old.length)
				t.lru.Remove(e)
				if old.tier != d.n {
					t.list[old.tier].store.Load().Delete(k)
				}
			}
			t.pos[k] = t.lru.PushBack(&tierEntry{tier: d.n, key: k, length: len(data)})
			t.heldBytes[d.n] += int64(len(data))
			t.mu.Unlock()
			d.offloads.Add(1)
			t.announce(true, d.n, j.hash)
			return true
		}
		if !errors.Is(err, disk.ErrFull) || !t.evictOldest() {
			break
		}
	}
	t.log.Warn("tier: block not copied down", "hash", j.hash, "err", err)
	t.list[0].failed.Add(1)
	return false
}

// pick is the open tier with the most free slots, nil if none is open.
func (t *tiers) pick() *diskTier {
	var best *diskTier
	free := -1
	for _, d := range t.list {
		st := d.store.Load()
		if st == nil {
			continue
		}
		s := st.Stats()
		if f := s.Slots - s.Blocks; f > free {
			best, free = d, f
		}
	}
	return best
}

// evictOldest drops the least recently used disk block; false if there is
// none.
func (t *tiers) evictOldest() bool {
	t.mu.Lock()
	e := t.lru.Front()
	if e == nil {
		t.mu.Unlock()
		return false
	}
	te := e.Value.(*tierEntry)
	t.mu.Unlock()
	d := t.list[te.tier]
	if err := d.store.Load().Delete(te.key); err != nil && !errors.Is(err, disk.ErrNotFound) {
		t.log.Warn("tier: evict", "hash", te.key.Hash, "err", err)
	}
	d.evicted.Add(1)
	t.forget(d, te.key)
	return true
}

// announce publishes that this node holds (or no longer holds) hash on
// disk tier n.
func (t *tiers) announce(store bool, n int, hashes ...uint64) {
	m := t.a.joined.Load()
	if m == nil || len(hashes) == 0 {
		return // announced whole once the node joins (announceAll)
	}
	if o := t.a.owned; o != nil {
		o.publishHeld(store, hashes) // to the hashes' owners, not gossip
		return
	}
	kind := membership.EventRemove
	if store {
		kind = membership.EventStore
	}
	if _, err := m.Publish(kind, uint32(tierSetBase+n), hashes...); err != nil && !errors.Is(err, membership.ErrClosed) {
		t.log.Warn("tier: events not published", "err", err)
	}
}

// announceAll publishes every disk-held block: at start, once joined.
func (t *tiers) announceAll() {
	for _, e := range t.holdings() {
		t.announce(true, int(e.BlockSet-tierSetBase), e.Hash)
	}
}

// holdings are the disk-held blocks as membership entries.
func (t *tiers) holdings() []membership.Entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]membership.Entry, 0, len(t.pos))
	for k, e := range t.pos {
		out = append(out, membership.Entry{Hash: k.Hash, BlockSet: uint32(tierSetBase + e.Value.(*tierEntry).tier)})
	}
	return out
}

// allocate takes n slots of set, waiting for copies down that hold the
// slots it needs, until ctx ends.
func (t *tiers) allocate(ctx context.Context, set *pool.BlockSet, n int) ([]pool.Block, error) {
	for {
		wait := t.waitProgress()
		blks, err := set.Allocate(n)
		var ae *pool.AllocError
		if err == nil || !errors.As(err, &ae) || ae.Offloading == 0 {
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
