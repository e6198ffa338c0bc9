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
// room to spare, such as reading blocks ahead of use. The slots recycled
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
	var removed []Event
	for len(b.free) < n+b.low && b.leaves > 0 {
		i := b.oldestLeaf()
		if s := &b.slots[i]; !s.below || (keep != 0 && s.hash == keep) {
			break // its only copy is here, or it is kept
		}
		b.unlinkInactive(i)
		removed = b.drop(i, removed)
	}
	b.p.events.pushBatch(removed) // one batch, not a loss
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
