package pool

import (
	"fmt"
	"math"
)

// Offload: a block set's blocks may fall to a tier below (a disk) instead
// of being recycled away. Recycling offers each victim that has no copy
// below to Config.Offload; a block taken is kept, Registered and served,
// but out of recycling's reach, until Offloaded says its copy is complete:
// then it is the first to be recycled, and recycling it loses nothing.
// Recycling ahead of need (past OffloadWatermark) offers blocks and stops
// when Offload refuses one; recycling for an allocation that needs the
// slots now recycles a refused block as it always did (a full queue or a
// full tier below drops blocks rather than failing the allocation). Under
// Config.OffloadGiveUp such an allocation also takes the slots of blocks
// whose copies are under way rather than fail for its caller to wait
// (giveUp): only a slot being read (BeginCopy to EndCopy) is never taken;
// one being written straight to the tier below (StartCopy, direct) may be,
// its bytes copied out first or its block dropped, and EndCopy tells the
// copier so.

// DefaultOffloadWatermark is Config.OffloadWatermark's default: host
// memory offloads past 0.90 of use.
const DefaultOffloadWatermark = 0.90

// DefaultOffloadInFlight is Config.OffloadInFlight's default: a quarter of
// a set's slots may wait for copies below. An engine that writes faster
// than the tier below takes blocks then loses some of them, as it would
// without a tier, rather than wait in Allocate for the disk.
const DefaultOffloadInFlight = 0.25

// OffloadFunc is offered a Registered block about to be recycled: blk,
// the set it is in, its sequence hash and its parent's. It returns true
// if it took the block, and then calls set.Offloaded(blk, ok) exactly
// once when the copy is complete (ok) or abandoned; under
// Config.OffloadGiveUp it reads the slot only between BeginCopy (or
// StartCopy) and EndCopy, and skips a block they refuse (its slot was
// taken: no Offloaded then); after a write straight from the slot
// (StartCopy direct), an EndCopy error says the slot was taken under the
// write, and a write that failed is not ended with EndCopy but with
// Offloaded(blk, false), so that no allocation takes the slot as copied. It is called with the set's lock held: it must not
// block nor call the set, only queue.
type OffloadFunc func(set *BlockSet, blk Block, hash, parent uint64) bool

// offloadWatermarks moves the recycling watermarks of a set under an
// Offload hook: recycling (offering) starts past OffloadWatermark of use
// and goes on to the same margin below it that LowWatermark and
// HighWatermark keep.
func (b *BlockSet) offloadWatermarks() {
	c := &b.p.cfg
	n := float64(len(b.slots))
	b.maxOffloading = max(1, int(c.OffloadInFlight*n))
	if !b.offload || c.LowWatermark <= 0 {
		return
	}
	b.low = max(b.low, int(math.Ceil((1-c.OffloadWatermark)*n)))
	b.high = max(b.high, b.low+int(math.Ceil((c.HighWatermark-c.LowWatermark)*n)))
	b.high = min(b.high, len(b.slots))
}

// offer hands inactive leaf i to the Offload hook unless it has a copy
// below or the set already has OffloadInFlight of its slots waiting for
// copies; a block taken leaves recycling's reach until Offloaded. The
// lock is held.
func (b *BlockSet) offer(i int32) bool {
	if b.offloading >= b.maxOffloading {
		return false
	}
	return b.offerAny(i)
}

// offerAny is offer without the bound on copies in flight, for a set
// being freed, which no allocation waits on.
func (b *BlockSet) offerAny(i int32) bool {
	off := b.p.cfg.Offload
	s := &b.slots[i]
	if !b.offload || s.below || s.withdrawn || s.offloading {
		return false
	}
	if !off(b, Block{Slot: int(i), Generation: s.gen}, s.hash, s.parent) {
		return false
	}
	if s.inactive {
		b.unlinkInactive(i)
	}
	if b.p.cfg.OffloadGiveUp && !s.offered {
		// A slot listed already (an earlier offer of the same block whose
		// copy failed, or of a block recycled since) stays listed once:
		// the list names slots, and a walk takes each at most once.
		if len(b.offered) > 2*b.offloading+64 {
			b.compactOffered()
		}
		b.offered = append(b.offered, i)
		s.offered = true
	}
	s.offloading = true
	b.offloading++
	return true
}

// compactOffered forgets the offered slots whose copy has ended (their
// block's, or the block's recycled since): offers append, and only giveUp (rare, under
// pressure) walks the list otherwise, so without it the list grows with
// every copy down for the set's life. Called when the list holds more than
// twice the copies under way, its cost is spread over the offers that grew
// it. The lock is held.
func (b *BlockSet) compactOffered() {
	keep := b.offered[:0]
	for _, i := range b.offered {
		if s := &b.slots[i]; s.offloading {
			keep = append(keep, i)
		} else {
			s.offered = false
		}
	}
	clear(b.offered[len(keep):])
	b.offered = keep
}

// givable is how many slots giveUp could take at most: the offloading
// blocks not being read. The lock is held.
func (b *BlockSet) givable() int {
	if !b.p.cfg.OffloadGiveUp {
		return 0
	}
	return b.offloading - b.copying
}

// giveUp takes up to n slots whose blocks are being copied below, for an
// allocation that found no other: blocks whose bytes the copier has read
// (or written straight from the slot) already first (their copy goes on,
// nothing is lost), then those whose copy has not begun, then those being
// written straight from their slots (StartCopy, direct): for these two
// OffloadTake copies the bytes out now, else they are dropped; BeginCopy
// refuses the first and EndCopy the second, whose copier then writes the
// copied-out bytes or drops the block. Slots being read, in use, or
// extended by a block still here are not taken. One walk of the offered
// slots (each listed once), which forgets those no longer offloading. It returns how many
// it freed. The lock is held.
func (b *BlockSet) giveUp(n int) int {
	// The candidates of each kind, in order, as indexes into b.offered
	// once compacted: read, not begun, being written.
	var cand [3][]int
	keep := b.offered[:0]
	for _, i := range b.offered {
		s := &b.slots[i]
		if !s.offloading {
			s.offered = false // its copy ended, or the slot was recycled: forget it
			continue
		}
		keep = append(keep, i)
		if s.copying || s.users > 0 || s.leases > 0 || s.children > 0 || s.state != Registered {
			continue
		}
		kind := 1
		switch {
		case s.copied:
			kind = 0
		case s.writing:
			kind = 2
		}
		if len(cand[kind]) < n {
			cand[kind] = append(cand[kind], len(keep)-1)
		}
	}
	clear(b.offered[len(keep):])
	b.offered = keep
	var removed []Event
	done := 0
	for _, kind := range cand {
		for _, at := range kind {
			if done == n {
				break
			}
			i := b.offered[at]
			s := &b.slots[i]
			blk := Block{Slot: int(i), Generation: s.gen}
			if !s.copied {
				if take := b.p.cfg.OffloadTake; take == nil || !take(b, blk, s.sum, s.hasSum) {
					b.givenUp++ // dropped, its copy lost
				}
			}
			// Taken: forgotten at the next walk or compaction (no
			// longer offloading). Each slot is listed once, so no
			// candidate is taken twice.
			removed = b.drop(i, removed)
			done++
		}
	}
	b.p.events.pushBatch(removed)
	return done
}

// BeginCopy is called by the Offload hook's copier before it reads blk's
// slot: it returns an error, and the copier must skip the block, if an
// allocation took the slot meanwhile (Config.OffloadGiveUp) or the copy
// is not under way. Until EndCopy the slot is not taken.
func (b *BlockSet) BeginCopy(blk Block) error {
	_, _, err := b.StartCopy(blk, false)
	return err
}

// StartCopy is BeginCopy returning the block's content checksum as
// recorded (sum, and whether it has one), for the copy's trailer. With
// direct, the copier writes the tier below straight from the slot rather
// than read it into memory of its own: the write takes as long as the
// disk, which no allocation may wait for, so under Config.OffloadGiveUp
// an allocation may take the slot meanwhile (OffloadTake copies its bytes
// out first) and EndCopy then fails: what the write took from the slot
// may be another block's, and the copier must write the copied-out bytes
// instead or drop the block, never keep what it wrote.
func (b *BlockSet) StartCopy(blk Block, direct bool) (sum uint64, hasSum bool, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return 0, false, err
	}
	if !s.offloading || s.copying || s.writing || s.copied {
		return 0, false, &TransitionError{Op: "begin copy", Slot: blk.Slot, State: s.state, Reason: "no copy below waiting to begin"}
	}
	if direct {
		s.writing = true
	} else {
		s.copying = true
		b.copying++
	}
	return s.sum, s.hasSum, nil
}

// EndCopy says the copier has read blk's slot (or written the tier below
// from it, StartCopy direct): from here an allocation may take the slot
// (Config.OffloadGiveUp) while the copy goes on. An error after a direct
// start says the slot was taken under the write: its bytes on the tier
// below are not the block's.
func (b *BlockSet) EndCopy(blk Block) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return err
	}
	switch {
	case s.copying:
		s.copying = false
		b.copying--
	case s.writing:
		s.writing = false
	default:
		return &TransitionError{Op: "end copy", Slot: blk.Slot, State: s.state, Reason: "not being read"}
	}
	s.copied = true
	return nil
}

// recycleAhead is recycling ahead of need: like recycle, but it stops at
// the first block the Offload hook refuses rather than drop it, since
// nothing needs its slot yet. The remove events of the blocks it drops go
// to the event queue as one batch, as recycle's do: a batch each would
// wake the pool's event loop once per block, under the set's lock, within
// the allocation.
func (b *BlockSet) recycleAhead(n int) int {
	if !b.offload {
		return b.recycle(n)
	}
	var buf [recycleEvents]Event
	var removed []Event
	if n <= recycleEvents {
		removed = buf[:0]
	}
	defer func() { b.p.events.pushBatch(removed) }() // one batch, not a loss
	done := 0
	for done < n && b.leaves > 0 {
		i := b.oldestLeaf()
		s := &b.slots[i]
		if !s.below && !s.withdrawn && !b.offer(i) {
			break // the queue below is full: try again at the next allocation
		}
		if s.offloading {
			done++
			continue
		}
		// Copied below already, or withdrawn: recycled now.
		b.unlinkInactive(i)
		removed = b.drop(i, removed)
		done++
	}
	b.offerAhead(n)
	return done
}

// offerAhead offers up to k more blocks that have no copy below, beyond
// what recycling asked for, so that copies keep pace with a set that is
// written faster than it is recycled and recycling finds copied blocks
// ready instead of waiting for copies: the least recently used leaves,
// each with the inactive blocks it extends (recycled right after it, so
// copied with it). It walks at most 4k+64 leaves of the list, and stops
// at the first refusal.
func (b *BlockSet) offerAhead(k int) {
	for i, steps := b.leafHead, 0; i != none && k > 0 && steps < 4*k+64; steps++ {
		next := b.slots[i].next
		for j := i; j != none && k > 0; j = b.slots[j].up {
			s := &b.slots[j]
			if !s.inactive && !s.offloading {
				break // in use: it and what it extends stay
			}
			if s.below || s.withdrawn || s.offloading {
				continue
			}
			if !b.offer(j) {
				return
			}
			k--
		}
		i = next
	}
}

// Offloaded ends the copy below of blk that the Offload hook took: ok says
// the copy is complete (the block is then recycled first, losing nothing),
// else the block is as it was before it was offered. A block no one uses
// becomes inactive again with its last use unchanged.
func (b *BlockSet) Offloaded(blk Block, ok bool) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return err
	}
	if !s.offloading {
		return &TransitionError{Op: "offloaded", Slot: blk.Slot, State: s.state, Reason: "no copy below under way"}
	}
	if s.copying {
		s.copying = false
		b.copying--
	}
	s.offloading, s.copied, s.writing = false, false, false
	b.offloading--
	s.below = ok
	if s.state == Registered && s.users == 0 && s.leases == 0 && !s.inactive {
		// Inactive again with its old last use: a block copied below goes
		// before the blocks used since.
		s.inactive = true
		b.inactive++
		if s.children == 0 {
			b.leafPush(int32(blk.Slot))
		}
	}
	return nil
}

// LostBelow says that the tier below no longer holds blk's copy (it
// dropped it for room, or for failing a check): recycling offers the block
// again instead of taking it as copied. A stale handle is an error.
func (b *BlockSet) LostBelow(blk Block) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return err
	}
	s.below = false
	return nil
}

// Below reports whether blk has a complete copy in the tier below.
func (b *BlockSet) Below(blk Block) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	return err == nil && s.below
}

// offloadBeforeFree offers every unused Registered block without a copy
// below, so that a set freed loses none of them, and returns how many
// copies are under way: the set is not freed until that is zero. The lock
// is held.
func (b *BlockSet) offloadBeforeFree() int {
	if !b.offload {
		return 0
	}
	for i := range b.slots {
		s := &b.slots[i]
		if s.state == Registered && s.users == 0 && s.leases == 0 {
			b.offerAny(int32(i))
		}
	}
	return b.offloading
}

// CopyDown offers every unused Registered block that has no copy below to
// the Offload hook, as freeing the set would, but keeps the set: for a set
// kept as a cache after its engine, so that its blocks outlive a restart.
// It returns how many copies are under way.
func (b *BlockSet) CopyDown() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.offloadBeforeFree()
}

// errOffloading is FreeBlockSet's refusal while copies below are under way.
func errOffloading(id SetID, n int) error {
	return fmt.Errorf("%w: block set %d has %d blocks being copied to the tier below", ErrBlockSetBusy, id, n)
}
