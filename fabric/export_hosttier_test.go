package fabric

import (
	"context"
	"fmt"

	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// TierHolding names the tier of a that holds hash for the shape of its
// block set id: "host", "disk", or "" where no tier does.
func TierHolding(a *Agent, id, hash uint64) string {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil || a.tiers == nil {
		return ""
	}
	if d := a.tiers.where(disk.Key{Hash: hash, Tag: shapeTag(s.Layout())}); d != nil {
		return d.spec.Kind
	}
	return ""
}

// TierCorruptHost flips a bit of byte at of the host tier's copy of hash
// (block set id's shape), as memory going bad would; false if the host
// tier does not hold it.
func TierCorruptHost(a *Agent, id, hash uint64, at int) bool {
	s, err := a.pool.BlockSet(pool.SetID(id))
	if err != nil || a.tiers == nil {
		return false
	}
	h := a.tiers.hostTier()
	if h == nil {
		return false
	}
	st, ok := h.store.Load().(*disk.MemStore)
	return ok && st.CorruptForTest(disk.Key{Hash: hash, Tag: shapeTag(s.Layout())}, at, 0x40)
}

// TierRestoreAcrossMove restores the host tier's least recently used
// block into block set id as a restore does, with that block moved down to
// a disk tier between the restore finding its tier and reading it (as the
// copier may while the restore waits for slots). Returns the block's hash,
// the kind of tier the restore found it in and how many blocks it
// restored (released before it returns).
func TierRestoreAcrossMove(a *Agent, id uint64) (uint64, string, int, error) {
	a.mu.Lock()
	es := a.sets[pool.SetID(id)]
	a.mu.Unlock()
	h := a.tiers.hostTier()
	if es == nil || h == nil {
		return 0, "", 0, fmt.Errorf("no block set %d or no host tier", id)
	}
	a.tiers.mu.Lock()
	front := a.tiers.lru(h.n).Front()
	a.tiers.mu.Unlock()
	if front == nil {
		return 0, "", 0, fmt.Errorf("the host tier is empty")
	}
	oldest := front.Value.(*tierEntry).key
	var found string
	blks, err := a.tiers.restoreFound(context.Background(), es, []uint64{oldest.Hash}, 0,
		func(_ context.Context, k disk.Key) *diskTier {
			d := a.tiers.where(k)
			if d != nil {
				found = d.spec.Kind
			}
			if d == h {
				a.tiers.moveDown(h, 1)
			}
			return d
		})
	for _, b := range blks {
		es.set.Release(b)
	}
	return oldest.Hash, found, len(blks), err
}

// TierMoveAllDown moves every block of a's host tier down to a disk tier;
// false if it moved none.
func TierMoveAllDown(a *Agent) bool {
	h := a.tiers.hostTier()
	if h == nil {
		return false
	}
	moved := 0
	for {
		n := a.tiers.moveDown(h, hostMoveBatch)
		if n == 0 {
			return moved > 0
		}
		moved += n
	}
}
