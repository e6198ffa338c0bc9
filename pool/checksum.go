package pool

import "fmt"

// Content checksums. A block in host memory gets its checksum
// (layout.BlockSum) when it is registered; leases carry it, so that a
// reader checks the bytes it got before it registers them. A holder told
// that a block's bytes no longer match withdraws it: the block leaves the
// registry (with its remove event) at once, and its slot is recycled as an
// inactive block would be, once its users and leases are gone.

// SetSum records blk's content checksum; blk must be Registered and not
// withdrawn.
func (b *BlockSet) SetSum(blk Block, sum uint64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return err
	}
	if s.state != Registered || s.withdrawn {
		return &TransitionError{Op: "set sum", Slot: blk.Slot, State: s.state, Reason: "not a registered block"}
	}
	s.sum, s.hasSum = sum, true
	return nil
}

// Sum returns blk's recorded content checksum; ok is false when none was
// recorded or the handle is stale.
func (b *BlockSet) Sum(blk Block) (sum uint64, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil || s.state != Registered {
		return 0, false
	}
	return s.sum, s.hasSum
}

// Withdraw takes the Registered block blk out of the registry now: it can
// no longer be acquired or leased, a remove event says it is gone, and its
// slot is recycled once nobody uses or leases it (references and leases
// held keep working on its bytes until then). A block of the same hash may
// be registered again meanwhile.
func (b *BlockSet) Withdraw(blk Block) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return err
	}
	if s.state != Registered || s.withdrawn {
		return &TransitionError{Op: "withdraw", Slot: blk.Slot, State: s.state, Reason: "not a registered block"}
	}
	if i, ok := b.registry[s.hash]; !ok || int(i) != blk.Slot {
		return fmt.Errorf("pool: withdraw slot %d: %w: its hash names another slot", blk.Slot, ErrInvalidTransition)
	}
	delete(b.registry, s.hash)
	s.withdrawn = true
	b.p.events.push(Event{Kind: EventRemove, Set: b.id, Slot: blk.Slot, Hash: s.hash, Parent: s.parent})
	return nil
}
