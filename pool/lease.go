package pool

import (
	"container/heap"
	"fmt"
	"slices"
	"time"
)

// LeasedBlock is the answer for one hash of a lease request.
type LeasedBlock struct {
	Hash uint64
	// Found is false when the block set does not hold the hash ("not
	// here"); Slot and Generation are then zero.
	Found      bool
	Slot       int
	Generation uint64
	// Sum is the block's content checksum (layout.BlockSum) where one was
	// recorded (HasSum), by SetSum.
	Sum    uint64
	HasSum bool
}

type lease struct {
	id       LeaseID
	seq      uint64 // creation order, to break deadline ties
	deadline time.Time
	slots    []int32 // sorted, unique
	heapIdx  int
}

// LeasedSlot is a slot a lease holds and the hash of the block it held
// when leased: a leased slot is neither recycled nor registered anew while
// the lease lives, and a withdrawn block keeps its hash in its slot, so
// the slot's hash is still that one.
type LeasedSlot struct {
	Slot int
	Hash uint64
}

// leaseHeap orders a block set's live leases by deadline, then creation,
// so that expiry, and the LRU order it feeds, is deterministic.
type leaseHeap []*lease

func (h leaseHeap) Len() int { return len(h) }
func (h leaseHeap) Less(i, j int) bool {
	if !h[i].deadline.Equal(h[j].deadline) {
		return h[i].deadline.Before(h[j].deadline)
	}
	return h[i].seq < h[j].seq
}
func (h leaseHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *leaseHeap) Push(x any) {
	l := x.(*lease)
	l.heapIdx = len(*h)
	*h = append(*h, l)
}
func (h *leaseHeap) Pop() any {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return l
}

// Lease promises a reader that the Registered blocks with these sequence
// hashes will not be recycled until the lease is released or d passes. It
// answers, per hash in order, the slot and generation or "not here". When
// no hash is here no lease is made and the id is zero. d must be in
// (0, Config.MaxLeaseDuration] and the hashes at most Config.MaxLeaseBlocks.
func (b *BlockSet) Lease(hashes []uint64, d time.Duration) (LeaseID, []LeasedBlock, error) {
	if b.p.closed.Load() {
		return 0, nil, ErrClosed
	}
	if err := b.p.checkDuration(d); err != nil {
		return 0, nil, err
	}
	if len(hashes) == 0 || len(hashes) > b.p.cfg.MaxLeaseBlocks {
		return 0, nil, fmt.Errorf("%w: %d hashes (want 1..%d)", ErrBadLease, len(hashes), b.p.cfg.MaxLeaseBlocks)
	}
	id, err := b.p.reserveLease(b)
	if err != nil {
		return 0, nil, err
	}
	out := make([]LeasedBlock, len(hashes))
	slots := make([]int32, 0, len(hashes))
	now := b.p.cfg.Clock.Now()
	b.mu.Lock()
	for k, h := range hashes {
		out[k].Hash = h
		if i, ok := b.registry[h]; ok {
			s := &b.slots[i]
			out[k] = LeasedBlock{Hash: h, Found: true, Slot: int(i), Generation: s.gen, Sum: s.sum, HasSum: s.hasSum}
			slots = append(slots, i)
		}
	}
	if len(slots) == 0 {
		b.mu.Unlock()
		b.p.forgetLeases(id)
		return 0, out, nil
	}
	slices.Sort(slots)
	slots = slices.Compact(slots)
	for _, i := range slots {
		s := &b.slots[i]
		if s.inactive {
			b.unlinkInactive(i)
		}
		if s.leases == 0 {
			b.leased++
		}
		s.leases++
	}
	b.leaseSeq++
	l := &lease{id: id, seq: b.leaseSeq, deadline: now.Add(d), slots: slots}
	b.leases[id] = l
	heap.Push(&b.expiry, l)
	b.mu.Unlock()
	return id, out, nil
}

// unpin ends lease l; the lock is held.
func (b *BlockSet) unpin(l *lease) {
	delete(b.leases, l.id)
	heap.Remove(&b.expiry, l.heapIdx)
	for _, i := range l.slots {
		s := &b.slots[i]
		s.leases--
		if s.leases == 0 {
			b.leased--
			if s.users == 0 {
				b.pushInactive(i)
			}
		}
	}
}

// live returns the lease if it is live at now; a lease past its deadline is
// reaped on the spot. The lock is held.
func (b *BlockSet) live(id LeaseID, now time.Time) (*lease, error) {
	l := b.leases[id]
	if l == nil {
		return nil, fmt.Errorf("%w: %#x", ErrUnknownLease, uint64(id))
	}
	if !now.Before(l.deadline) {
		b.unpin(l)
		b.expired++
		return nil, fmt.Errorf("%w: %#x at %v", ErrLeaseExpired, uint64(id), l.deadline)
	}
	return l, nil
}

func (b *BlockSet) renew(id LeaseID, d time.Duration) error {
	now := b.p.cfg.Clock.Now()
	b.mu.Lock()
	l, err := b.live(id, now)
	if err == nil {
		l.deadline = now.Add(d)
		heap.Fix(&b.expiry, l.heapIdx)
	}
	b.mu.Unlock()
	if err != nil {
		b.p.forgetLeases(id)
	}
	return err
}

func (b *BlockSet) leasedSlots(id LeaseID) ([]LeasedSlot, error) {
	now := b.p.cfg.Clock.Now()
	b.mu.Lock()
	l, err := b.live(id, now)
	var out []LeasedSlot
	if err == nil {
		out = make([]LeasedSlot, len(l.slots))
		for i, s := range l.slots {
			out[i] = LeasedSlot{Slot: int(s), Hash: b.slots[s].hash}
		}
	}
	b.mu.Unlock()
	if err != nil {
		b.p.forgetLeases(id)
	}
	return out, err
}

func (b *BlockSet) leaseDeadline(id LeaseID) (time.Time, error) {
	now := b.p.cfg.Clock.Now()
	b.mu.Lock()
	l, err := b.live(id, now)
	var deadline time.Time
	if err == nil {
		deadline = l.deadline
	}
	b.mu.Unlock()
	if err != nil {
		b.p.forgetLeases(id)
	}
	return deadline, err
}

func (b *BlockSet) releaseLease(id LeaseID) (bool, error) {
	now := b.p.cfg.Clock.Now()
	b.mu.Lock()
	l := b.leases[id]
	if l == nil {
		b.mu.Unlock()
		return false, fmt.Errorf("%w: %#x", ErrUnknownLease, uint64(id))
	}
	valid := now.Before(l.deadline)
	b.unpin(l)
	if !valid {
		b.expired++
	}
	b.mu.Unlock()
	b.p.forgetLeases(id)
	return valid, nil
}

func (b *BlockSet) expireLeases() int {
	now := b.p.cfg.Clock.Now()
	var ids []LeaseID
	b.mu.Lock()
	for len(b.expiry) > 0 && !now.Before(b.expiry[0].deadline) {
		l := b.expiry[0]
		b.unpin(l)
		b.expired++
		ids = append(ids, l.id)
	}
	b.mu.Unlock()
	b.p.forgetLeases(ids...)
	return len(ids)
}

func (b *BlockSet) checkRead(id LeaseID, rank int, offset, length uint64) error {
	deny := func(format string, args ...any) error {
		return &ReadError{Lease: id, Rank: rank, Offset: offset, Length: length, Reason: fmt.Sprintf(format, args...)}
	}
	if rank < 0 || rank >= len(b.offsets) {
		return deny("no rank %d in a block set of %d ranks", rank, len(b.offsets))
	}
	end := offset + length
	if length == 0 || end < offset {
		return deny("empty or wrapping range")
	}
	now := b.p.cfg.Clock.Now()
	b.mu.Lock()
	l, err := b.live(id, now)
	var slots []int32
	if err == nil {
		// Immutable once made, so the walk needs no lock.
		slots = l.slots
	}
	b.mu.Unlock()
	if err != nil {
		b.p.forgetLeases(id)
		return err
	}
	for pos := offset; pos < end; {
		slot, extentEnd, ok := b.lay.Locate(pos)
		if !ok {
			return deny("offset %d is padding or past the last slot", pos)
		}
		if _, held := slices.BinarySearch(slots, int32(slot)); !held {
			return deny("offset %d is in slot %d, which the lease does not hold", pos, slot)
		}
		pos = extentEnd
	}
	return nil
}
