package pool

import "fmt"

// AllocateSpare allocates up to n slots, as Partial, without losing
// anything the set holds: free slots beyond the low watermark first, then
// the slots of inactive leaves that the tier below holds a copy of
// (Registered with Below, or Offloaded), least recently used first. It
// never recycles a referenced or leased block, nor one whose only copy is
// here, nor offers a block to Config.Offload, nor takes a slot whose copy
// below is under way; nor the block whose hash is keep (if not 0), nor the
// blocks it extends: the blocks allocated for are to follow it. It
// stops at the first leaf it may not recycle, so it may return fewer than
// n slots, or none (no error): for work that is worth doing only with
// room to spare, such as reading blocks ahead of use. It recycles nothing
// unless the slots free after recycling exceed the low watermark, so that
// it hands out at least one: it works out first, recycling nothing, which
// leaves it would take in turn (spareDrops). The slots recycled
// send their remove events as Allocate's do. Until each slot is
// registered, given back (Abort) or retired, AllocError.Spare counts it:
// an allocation that falls short while it is may get it back by ending the
// work that holds it.
func (b *BlockSet) AllocateSpare(n int, keep uint64) ([]Block, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: allocate %d spare slots", ErrInvalidArgument, n)
	}
	if b.p.closed.Load() {
		return nil, ErrClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed.Load() {
		return nil, fmt.Errorf("%w: %d was freed", ErrUnknownBlockSet, b.id)
	}
	if need := n + b.low - len(b.free); need > 0 && b.leaves > 0 {
		var buf [16]int32 // a read-ahead's run or two, on the stack
		drops := b.spareDrops(buf[:0], need, keep)
		if len(b.free)+len(drops) > b.low {
			var removed []Event
			for _, i := range drops {
				b.unlinkInactive(i)
				removed = b.drop(i, removed)
			}
			b.p.events.pushBatch(removed) // one batch, not a loss
		}
	}
	var out []Block
	for len(out) < n && len(b.free) > b.low {
		i := b.free[len(b.free)-1]
		b.free = b.free[:len(b.free)-1]
		s := &b.slots[i]
		s.state = Partial
		s.spare = true
		b.spare++
		out = append(out, Block{Slot: int(i), Generation: s.gen})
	}
	return out, nil
}

// spareDrops appends to drops the inactive leaves AllocateSpare may
// recycle for up to need slots, in the order recycling takes them, and
// changes nothing: least recently used first, as oldestLeaf takes them,
// up to the first it may not recycle (its only copy here, or its hash
// keep); a parent whose children it all takes is a leaf from then on, in
// its place by its last use, as drop makes it one. The lock is held.
func (b *BlockSet) spareDrops(drops []int32, need int, keep uint64) []int32 {
	next := b.leafHead // the leaf list, in order of use
	// late: the leaves of the late-leaf heap not yet taken whose parents
	// in the heap were (by their place in b.evictable), and the parents
	// left without children (place none), the oldest first.
	var late spareHeap
	if len(b.evictable) > 0 {
		late.push(b, spareLeaf{slot: b.evictable[0], at: 0})
	}
	var taken map[int32]int32 // children taken, by parent slot
	for len(drops) < need {
		var i int32
		switch {
		case next != none && (len(late) == 0 || b.slots[late[0].slot].used >= b.slots[next].used):
			i, next = next, b.slots[next].next // the list first, as oldestLeaf
		case len(late) > 0:
			e := late.pop(b)
			i = e.slot
			if e.at != none {
				for c := 2*e.at + 1; c <= 2*e.at+2 && int(c) < len(b.evictable); c++ {
					late.push(b, spareLeaf{slot: b.evictable[c], at: c})
				}
			}
		default:
			return drops // no leaf left
		}
		s := &b.slots[i]
		if !s.below || (keep != 0 && s.hash == keep) {
			return drops // its only copy is here, or it is kept
		}
		drops = append(drops, i)
		if up := s.up; up != none {
			if taken == nil {
				taken = map[int32]int32{}
			}
			taken[up]++
			if ps := &b.slots[up]; ps.inactive && taken[up] == ps.children {
				late.push(b, spareLeaf{slot: up, at: none})
			}
		}
	}
	return drops
}

// spareLeaf is a leaf spareDrops may take next: its slot, and its place
// in the late-leaf heap (none for a parent it left without children).
type spareLeaf struct{ slot, at int32 }

// spareHeap is spareDrops' leaves, a min-heap by their slots' used.
type spareHeap []spareLeaf

func (h *spareHeap) push(b *BlockSet, e spareLeaf) {
	*h = append(*h, e)
	q := *h
	for j := len(q) - 1; j > 0; {
		p := (j - 1) / 2
		if b.slots[q[j].slot].used >= b.slots[q[p].slot].used {
			break
		}
		q[j], q[p] = q[p], q[j]
		j = p
	}
}

func (h *spareHeap) pop(b *BlockSet) spareLeaf {
	q := *h
	top, last := q[0], len(q)-1
	q[0] = q[last]
	q = q[:last]
	for j := 0; ; {
		c := 2*j + 1
		if c >= len(q) {
			break
		}
		if r := c + 1; r < len(q) && b.slots[q[r].slot].used < b.slots[q[c].slot].used {
			c = r
		}
		if b.slots[q[c].slot].used >= b.slots[q[j].slot].used {
			break
		}
		q[j], q[c] = q[c], q[j]
		j = c
	}
	*h = q
	return top
}
