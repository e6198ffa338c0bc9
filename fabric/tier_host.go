package fabric

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvfabric/kvfabric/pool/disk"
)

// The host tier ("host=SIZE" in Config.Tiers): host memory between the
// pools and the disk tiers, a disk.MemStore under the same keys and in
// the same canonical bytes (tier.go), each block checked against its
// checksum on every read. It comes first in the tiers' order: a block the
// pool recycles is copied down to it (pick), restores, Lookup, peers'
// leases and Prefetch find it there as in any tier (where: a block is in
// one tier at a time). When it is full, its least recently used blocks
// move down to the disk tier with the most free slots (moveOldest): each
// read back (checked), written and committed below, then freed above;
// with no disk tier they are dropped, as the bottom tier evicts. It is
// not persistent: a restarted agent finds its disk tiers' blocks again,
// and none of the host tier's.

// tierHost is the host tier's kind in Config.Tiers, status, metrics and
// LookupResponse.local_tiers.
const tierHost = "host"

// parseHostTier parses the rest of "host=SIZE".
func parseHostTier(s, size string) (TierSpec, error) {
	if size == "" {
		return TierSpec{}, fmt.Errorf("%q: no size: want host=SIZE", s)
	}
	n, err := ParseSize(size)
	if err != nil {
		return TierSpec{}, fmt.Errorf("%q: %v", s, err)
	}
	if n < MinHostTierBytes || n > MaxHostTierBytes {
		return TierSpec{}, fmt.Errorf("%q: host tier size %d is not in %d (16MiB)..%d (1TiB)", s, n, MinHostTierBytes, uint64(MaxHostTierBytes))
	}
	return TierSpec{Kind: tierHost, Size: n}, nil
}

// openHost makes the host tier's store, with slots of t.blockBytes. t.mu
// is held.
func (t *tiers) openHost(d *diskTier) error {
	if t.hostRefused {
		return nil
	}
	if int64(d.spec.Size) < int64(t.blockBytes) {
		return fmt.Errorf("fabric: tiers[%d] host: %d bytes hold no block of %d", d.n, d.spec.Size, t.blockBytes)
	}
	st, err := disk.NewMem(disk.MemConfig{Bytes: int64(d.spec.Size), SlotBytes: t.blockBytes})
	if err != nil {
		return fmt.Errorf("fabric: tiers[%d] host: %w", d.n, err)
	}
	d.store.Store(st)
	return nil
}

// isHost says whether d is the host tier.
func (d *diskTier) isHost() bool { return d.spec.Kind == tierHost }

// hostTier is the host tier if there is one and it is open, else nil.
func (t *tiers) hostTier() *diskTier {
	if len(t.list) > 0 && t.list[0].isHost() && t.list[0].store.Load() != nil {
		return t.list[0]
	}
	return nil
}

// pickBelow is the open disk tier under the host tier with the most
// free slots, nil if there is none.
func (t *tiers) pickBelow() *diskTier {
	var best *diskTier
	free := -1
	for _, d := range t.list {
		st := d.store.Load()
		if st == nil || d.isHost() {
			continue
		}
		s := st.Stats()
		if f := s.Slots - s.Blocks; f > free {
			best, free = d, f
		}
	}
	return best
}

// hostRoom moves the host tier's least recently used blocks down while it
// has no free slot, a few at most.
func (t *tiers) hostRoom(h *diskTier) {
	for try := 0; try < 4 && h.store.Load().Free() == 0 && t.moveOldest(h); try++ {
	}
}

// evictFor makes room in d: in the host tier by moving its least recently
// used block down, in a disk tier by dropping its least recently used
// block (a block dropped from another tier frees nothing in d). False if
// there was nothing to move or drop.
func (t *tiers) evictFor(d *diskTier) bool {
	if d.isHost() {
		return t.moveOldest(d)
	}
	return t.evictOldestIn(d)
}

// hostMoveCandidates is how many of the host tier's oldest blocks a move
// looks at for one the tiers have placed there (a block committed by a
// copy down that has not recorded it yet is left to it).
const hostMoveCandidates = 8

// moveOldest moves the host tier's least recently used block down to a
// disk tier: read back (checked), written and committed there, recorded
// there and announced, then freed from the host tier. With no disk tier,
// or where the write below fails, the block is dropped. One move at a
// time. False if the host tier holds no block to move.
func (t *tiers) moveOldest(h *diskTier) bool {
	t.moveMu.Lock()
	defer t.moveMu.Unlock()
	st, ok := h.store.Load().(*disk.MemStore)
	if !ok {
		return false
	}
	var k disk.Key
	found := false
	for _, c := range st.Oldest(hostMoveCandidates) {
		if t.where(c) == h {
			k, found = c, true
			break
		}
	}
	if !found {
		return false
	}
	drop := func() {
		if err := st.Delete(k); err != nil && !errors.Is(err, disk.ErrNotFound) {
			t.log.Warn("tier: evict from host memory", "hash", k.Hash, "err", err)
		}
		h.evicted.Add(1)
		t.forget(h, k)
	}
	below := t.pickBelow()
	if below == nil {
		drop() // the bottom tier evicts
		return true
	}
	ctx, cancel := context.WithTimeout(t.ctx, time.Minute)
	defer cancel()
	buf := t.buffer()
	defer t.putBuffer(buf)
	n, err := st.Get(ctx, k, buf)
	if err != nil {
		if errors.Is(err, disk.ErrCorrupt) {
			t.corrupt.Add(1)
			t.log.Warn("tier: host-memory block failed its check: dropped, never served", "hash", k.Hash, "err", err)
		}
		drop()
		return true
	}
	bs := below.store.Load()
	for try := 0; try < 4 && bs.Free() == 0 && t.evictOldestIn(below); try++ {
	}
	if err := bs.PutBatch(ctx, []disk.PutItem{{Key: k, Data: buf[:n]}})[0]; err != nil {
		t.log.Warn("tier: block not moved down from host memory: dropped", "hash", k.Hash, "tier", below.n, "err", err)
		below.failed.Add(1)
		drop()
		return true
	}
	// Committed below: recorded there (placed frees it above), announced
	// there before it is no longer announced above.
	t.placed(below, k, n)
	below.offloads.Add(1)
	t.announce(true, below.n, k.Hash)
	if err := st.Delete(k); err != nil && !errors.Is(err, disk.ErrNotFound) {
		t.log.Warn("tier: free a block moved down from host memory", "hash", k.Hash, "err", err)
	}
	t.announce(false, h.n, k.Hash)
	return true
}

// evictOldestIn drops the least recently used block of tier d; false if
// it holds none.
func (t *tiers) evictOldestIn(d *diskTier) bool {
	t.mu.Lock()
	var te *tierEntry
	for e := t.lru.Front(); e != nil; e = e.Next() {
		if x := e.Value.(*tierEntry); x.tier == d.n {
			te = x
			break
		}
	}
	t.mu.Unlock()
	if te == nil {
		return false
	}
	if err := d.store.Load().Delete(te.key); err != nil && !errors.Is(err, disk.ErrNotFound) {
		t.log.Warn("tier: evict", "hash", te.key.Hash, "err", err)
	}
	d.evicted.Add(1)
	t.forget(d, te.key)
	return true
}

// tierOf is the tier that holds k, nil if none does or there are no tiers.
func (a *Agent) tierOf(k disk.Key) *diskTier {
	if a.tiers == nil {
		return nil
	}
	return a.tiers.where(k)
}
