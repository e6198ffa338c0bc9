package pool

// Cluster-aware eviction. A block that other nodes also hold costs the
// cluster only an import when this node recycles it (an importer finds
// another copy), while a block only this node holds is gone from the
// cluster with it; and a block no engine or peer has hit since it was
// registered is less likely to be hit than one that has. Demote marks
// blocks held elsewhere. Eviction takes the evictable leaves (leaves first
// still holds: a demoted block that a Registered block extends waits for
// it) by their last use aged: a block counts as sharedAgeSlots set sizes
// of releases older than its last use while it is demoted, and as
// freshAgeSlots more while it has not been hit since registered (Acquire,
// Register of its hash again, Lease). So a copy held elsewhere goes before
// a block only this node holds, and one never hit before one hit, unless
// it was used that much more recently: a hot copy stays, where marking
// copies strictly first dropped the copy in use and kept a stale one.
//
// The order costs little on the common paths: a slot's used is the set's
// tick at its last release less its age (ticks start at tickBase, so it
// never wraps); the blocks not hit and the blocks hit each become
// inactive in order of used, so each kind has a list (O(1)), and a
// demoted block, which is older than its list's tail, goes in the heap of
// late leaves (O(log n)). Demoting moves a slot once, O(log n); a demoted
// block used again keeps its mark until Undemote or until it is recycled.

// tickBase is a set's first tick: used never falls below zero. The tick
// advances by tickStep a release, and the ages are 2 and 1 more than
// multiples of it, so that no two evictable slots have the same used (the
// four kinds, aged or not twice, differ modulo 4): the order of eviction
// never rests on how the lists and the heap break ties.
const (
	tickBase = 1 << 63
	tickStep = 4
)

// The ages, in releases per slot of the set (see above). Chosen on the
// replay model (testbed.ModelReplay, cluster-aged) over Mooncake's
// conversation trace: 4 sets of 2,048 blocks under random routing keep
// more of the trace than one LRU cache of 8,192.
const (
	sharedAgeSlots = 6
	freshAgeSlots  = 8
)

// age is how much older than its last release slot s counts.
func (b *BlockSet) age(s *slot) uint64 {
	var a uint64
	if s.shared {
		a += b.sharedAge
	}
	if !s.reused {
		a += b.freshAge
	}
	return a
}

// markReused records a hit on slot s, which is not evictable now (its
// list follows reused). The lock is held.
func (b *BlockSet) markReused(s *slot) {
	if !s.reused {
		s.reused = true
		s.used += b.freshAge
	}
}

// Demote marks the Registered blocks with these hashes as held by other
// nodes too, and returns how many it marked (hashes not Registered here,
// or marked already, are skipped). An inactive one is recycled ahead of
// the blocks only this node holds that were used less than the demoted
// age before it (see above).
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
		listed := s.listed || s.heapIdx != none
		if listed {
			b.leafRemove(i)
		}
		s.shared = shared
		if shared {
			b.demoted++
			s.used -= b.sharedAge
		} else {
			b.demoted--
			s.used += b.sharedAge
		}
		if listed {
			// Evictable: back in its new place.
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
