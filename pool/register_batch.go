package pool

import "fmt"

// MaxRegisterBatch bounds the blocks of one RegisterBatch: the set's lock
// is held for the whole batch, and its store events enter the event queue
// together (see eventQueue), so a batch bounds both. It is an import's
// largest chunk.
const MaxRegisterBatch = 4096

// Registration is one block of a RegisterBatch.
type Registration struct {
	// Block is an allocated slot whose bytes are in place: Partial (it
	// is committed first) or Complete.
	Block Block
	// Hash is the block's sequence hash.
	Hash uint64
	// Sum is the block's content checksum, recorded with it when HasSum
	// and the block is registered in its own slot (not a duplicate), as
	// SetSum would, but with no moment in which the block is Registered
	// without it.
	Sum    uint64
	HasSum bool
	// Below says that the tier below already holds a copy of the block
	// (it was restored from there): recycling takes it without offering
	// it to Config.Offload again.
	Below bool
	// Detached registers the block after its parent (its store event names
	// the parent) without extending the parent's block in the set: neither
	// keeps the other from being recycled. For blocks brought up ahead of
	// use, so that the blocks of the sequence already used are recycled
	// before them, not held for them.
	Detached bool
}

// RegisterBatch commits and registers a sequence of blocks under one hold
// of the set's lock, queueing their store events as one batch: regs[0]
// after parent, each next one after the one before it. Each block is what
// Register makes of it (a duplicate frees its slot and references the
// block already there); out[i] is the block to use for regs[i].
//
// The blocks are registered in order until one is refused (a stale
// handle, a slot that is neither Partial nor Complete): then out holds
// those registered before it, which stay registered, and the refused block
// and those after it are left as they were, for the caller to Abort. More
// than MaxRegisterBatch blocks are refused whole (ErrInvalidArgument),
// with nothing changed.
func (b *BlockSet) RegisterBatch(regs []Registration, parent uint64) (out []Block, err error) {
	if len(regs) > MaxRegisterBatch {
		return nil, fmt.Errorf("%w: register batch of %d blocks (at most %d)", ErrInvalidArgument, len(regs), MaxRegisterBatch)
	}
	if len(regs) == 0 {
		return nil, nil
	}
	out = make([]Block, 0, len(regs))
	evs := make([]Event, 0, len(regs))
	b.mu.Lock()
	defer b.mu.Unlock()
	// Queued under the lock, as Register's, which orders a block's store
	// before its remove; the ones registered before a refusal too.
	defer func() { b.p.events.pushBatch(evs) }()
	for i := range regs {
		r := &regs[i]
		s, err := b.check(r.Block)
		if err != nil {
			return out, fmt.Errorf("block %d of %d: %w", i, len(regs), err)
		}
		if s.state != Partial && s.state != Complete {
			return out, fmt.Errorf("block %d of %d: %w", i, len(regs), &TransitionError{Op: "register", Slot: r.Block.Slot, State: s.state})
		}
		s.state = Complete
		reg, ev, fresh := b.registerLocked(r.Block, s, r.Hash, parent)
		if fresh && r.Detached && s.up != none {
			b.detach(s)
		}
		if fresh {
			evs = append(evs, ev)
			if r.HasSum {
				s.sum, s.hasSum = r.Sum, true
			}
			s.below = r.Below
		}
		out = append(out, reg)
		parent = r.Hash
	}
	return out, nil
}

// detach undoes the link a registration made from s to its parent's
// slot: the parent may become a leaf again. The lock is held.
func (b *BlockSet) detach(s *slot) {
	up := s.up
	s.up = none
	ps := &b.slots[up]
	ps.children--
	if ps.children == 0 && ps.inactive {
		b.leafPush(up)
	}
}
