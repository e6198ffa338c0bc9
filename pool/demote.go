package pool

// Cluster-aware eviction. A block that other nodes also hold costs the
// cluster nothing when this node recycles it (an importer finds another
// copy), while a block only this node holds is gone from the cluster with
// it. Demote marks blocks held elsewhere: among the evictable leaves they
// go first, least recently used among them, before any block only this
// node holds; leaves first still holds (a demoted block that a Registered
// block extends waits for it).
//
// The order costs nothing on the common paths: a slot's last use (used) is
// the set's tick with the top bit set (ticks start at demotedBit), and a
// demoted slot's has it cleared, so that it sorts before every other in
// the leaf list and heap that order eviction already. Demoting moves a
// slot once, O(log n); a demoted block used again keeps its mark (its new
// last use is demoted too) until Undemote or until it is recycled.

// demotedBit is set in the last use of every slot not demoted.
const demotedBit = 1 << 63

// Demote marks the Registered blocks with these hashes as held by other
// nodes too, and returns how many it marked (hashes not Registered here,
// or marked already, are skipped). An inactive one becomes the next to
// recycle, ahead of blocks only this node holds.
func (b *BlockSet) Demote(hashes ...uint64) int {
	return b.markShared(hashes, true)
}

// Undemote takes Demote's mark off the Registered blocks with these
// hashes (no other node holds them any more) and returns how many it
// changed: each goes back to its place by last use.
func (b *BlockSet) Undemote(hashes ...uint64) int {
	return b.markShared(hashes, false)
}

func (b *BlockSet) markShared(hashes []uint64, shared bool) int {
	n := 0
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, h := range hashes {
		i, ok := b.registry[h]
		if !ok {
			continue
		}
		s := &b.slots[i]
		if s.shared == shared {
			continue
		}
		s.shared = shared
		if shared {
			b.demoted++
			s.used &^= demotedBit
		} else {
			b.demoted--
			s.used |= demotedBit
		}
		if s.listed || s.heapIdx != none {
			// Evictable now: take it out and put it back in its new place.
			b.leafRemove(i)
			b.leafPush(i)
		}
		n++
	}
	return n
}

// Demote marks the blocks with these hashes in every block set of the
// pool (see BlockSet.Demote) and returns how many it marked.
func (p *Pool) Demote(hashes ...uint64) int {
	n := 0
	for _, b := range p.BlockSets() {
		n += b.Demote(hashes...)
	}
	return n
}

// Undemote takes Demote's mark off the blocks with these hashes in every
// block set of the pool and returns how many it changed.
func (p *Pool) Undemote(hashes ...uint64) int {
	n := 0
	for _, b := range p.BlockSets() {
		n += b.Undemote(hashes...)
	}
	return n
}
