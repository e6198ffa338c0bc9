package fabric

import (
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
