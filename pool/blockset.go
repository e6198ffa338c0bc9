package pool

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/kvfabric/kvfabric/layout"
)

// State is where a slot is in its life. See the package doc for the table.
type State uint8

const (
	// Reset: free, no sequence; allocation takes it.
	Reset State = iota
	// Partial: allocated, being written by its owner.
	Partial
	// Complete: fully written, not yet visible.
	Complete
	// Registered: visible by sequence hash, shared by reference.
	Registered
	// Retired: out of use for the rest of the set's life (Retire): a copy
	// into it may still land.
	Retired
)

func (s State) String() string {
	switch s {
	case Reset:
		return "reset"
	case Partial:
		return "partial"
	case Complete:
		return "complete"
	case Registered:
		return "registered"
	case Retired:
		return "retired"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Block is a handle on a slot: the slot index and the generation it had
// when the handle was issued. Operations refuse a handle whose slot has
// been recycled since (ErrStaleBlock).
type Block struct {
	Slot       int
	Generation uint64
}

// SlotInfo is a snapshot of one slot, for introspection and tests.
type SlotInfo struct {
	State      State
	Generation uint64
	// Hash and Parent are set while Registered.
	Hash   uint64
	Parent uint64
	// Users is the engine references of a Registered block.
	Users int
	// Leases is the live leases holding the slot.
	Leases int
	// Inactive is true for a Registered block with no users and no leases.
	Inactive bool
	// Children is the Registered blocks of the set that extend this one:
	// while it is not zero the block is not recycled.
	Children int
}

const none = -1

type slot struct {
	hash, parent uint64
	gen          uint64
	used         uint64 // when it last became inactive, in the set's ticks
	users        int32
	leases       int32
	up           int32 // the parent's slot, when the parent was here first
	children     int32 // Registered slots whose up is this one
	heapIdx      int32 // place in the late-leaf heap, or none
	prev, next   int32 // neighbours in the leaf list while in it
	listed       bool  // in the leaf list
	state        State
	inactive     bool
	// sum is the content checksum recorded while Registered (hasSum);
	// withdrawn: the block left the registry early (Withdraw) and is
	// recycled without a second remove event.
	sum       uint64
	hasSum    bool
	withdrawn bool
	// shared: another node holds the block too (Demote), so it is
	// recycled before the blocks only this node holds.
	shared bool
	// below: a copy of the block is in the tier below (tier_offload.go),
	// so recycling it loses nothing; offloading: that copy is being made,
	// and the slot is kept until Offloaded says it is done.
	below, offloading bool
	// copying: the copier is reading the slot (BeginCopy to EndCopy);
	// writing: it writes the tier below straight from the slot (StartCopy
	// direct to EndCopy), which an allocation may take all the same;
	// copied: it has read or written it, so the copy no longer needs the
	// slot.
	copying, writing, copied bool
	// offered: the slot is in the set's list of offered slots (offerAny
	// adds it once, the walks of the list take it out), whatever block it
	// holds now, so that no walk finds it twice.
	offered bool
	// spare: AllocateSpare handed the slot out and it is not yet
	// registered, given back or retired (BlockSet.spare counts them).
	spare bool
}

// BlockSet is slots sharing one layout, one region per TP rank. All
// methods are safe for concurrent use.
type BlockSet struct {
	p       *Pool
	id      SetID
	lay     *layout.Layout
	strides layout.Strides
	offsets []uint64    // rank r's region starts at offsets[r] of...
	place   []int       // ...the pool's storage place[r]
	low     int         // recycle when free falls below this...
	high    int         // ...until this many are free
	cuts    []cut       // the storage it occupies, set by NewBlockSet
	freed   atomic.Bool // by FreeBlockSet

	mu       sync.Mutex
	slots    []slot
	free     []int32 // stack of Reset slots
	registry map[uint64]int32
	// The inactive leaves, the evictable slots, least recently used first
	// in two parts: a list in order of used (a slot that becomes inactive
	// is the newest and goes at its tail) and a heap by used of the
	// leaves that became leaves after they became inactive (a parent
	// whose last child was recycled), which are older than the list's
	// tail. The next to evict is the older of the list's head and the
	// heap's top.
	leafHead, leafTail int32
	evictable          []int32 // the late leaves, a min-heap by used
	leaves             int     // in the list and the heap together
	tick               uint64
	inactive           int
	registered         int
	leased             int
	leases             map[LeaseID]*lease
	leaseSeq           uint64
	expiry             leaseHeap
	evictions          uint64
	expired            uint64
	demoted            int // Registered slots marked shared
	allocLat           Histogram
	releaseLat         Histogram
	offloading         int     // slots kept for a copy below (tier_offload.go)
	maxOffloading      int     // at most this many (Config.OffloadInFlight)
	copying            int     // of those, being read now (BeginCopy)
	offered            []int32 // the slots offered, in the order each was first listed (a slot offered again keeps its place), some no longer offloading; each once (slot.offered)
	givenUp            uint64  // offloading blocks taken by allocations
	retired            int     // slots Retired
	spare              int     // slots AllocateSpare handed out, not yet registered, given back or retired
	// offload: Config.Offload is offered the set's blocks (it is set and
	// Config.OffloadSkips does not skip the layout).
	offload bool
}

func newBlockSet(p *Pool, id SetID, l *layout.Layout, st layout.Strides, offsets []uint64, place []int) *BlockSet {
	n := l.Slots
	b := &BlockSet{
		p: p, id: id, lay: l, strides: st, offsets: offsets, place: place,
		slots:    make([]slot, n),
		free:     make([]int32, n),
		registry: make(map[uint64]int32),
		leases:   make(map[LeaseID]*lease),
		leafHead: none, leafTail: none,
		tick: demotedBit, // see Demote
	}
	for i := range b.slots {
		b.slots[i].up, b.slots[i].heapIdx = none, none
		// Slot 0 on top of the stack: allocation starts at the front.
		b.free[i] = int32(n - 1 - i)
	}
	b.offload = p.cfg.Offload != nil && (p.cfg.OffloadSkips == nil || !p.cfg.OffloadSkips(l))
	skipped := p.cfg.Offload != nil && !b.offload // no recycling ahead (OffloadSkips)
	if lw := p.cfg.LowWatermark; lw > 0 && !skipped {
		b.low = int(math.Ceil(lw * float64(n)))
		b.high = max(b.low, int(math.Ceil(p.cfg.HighWatermark*float64(n))))
	}
	b.offloadWatermarks()
	return b
}

// Retains is how many registered blocks the set keeps before allocating
// starts to recycle them: its slots less its low watermark and its
// retired slots. A sequence longer than that loses its tail first (see
// Evict).
func (b *BlockSet) Retains() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return max(len(b.slots)-b.low-b.retired, 0)
}

// ID returns the block set's id in its pool.
func (b *BlockSet) ID() SetID { return b.id }

// Layout returns the block set's layout with its regions filled in. It is
// shared: do not modify it.
func (b *BlockSet) Layout() *layout.Layout { return b.lay }

// Slots returns the number of slots.
func (b *BlockSet) Slots() int { return len(b.slots) }

// RegionOffset returns where rank's region starts in its storage
// (RegionStorage): what an engine that mapped the storage adds to find its
// shards.
func (b *BlockSet) RegionOffset(rank int) (uint64, error) {
	if rank < 0 || rank >= len(b.offsets) {
		return 0, fmt.Errorf("%w: rank %d of %d", ErrInvalidArgument, rank, len(b.offsets))
	}
	return b.offsets[rank], nil
}

// RegionStorage returns the index, in the pool's Storages, of the storage
// rank's region is carved from.
func (b *BlockSet) RegionStorage(rank int) (int, error) {
	if rank < 0 || rank >= len(b.place) {
		return 0, fmt.Errorf("%w: rank %d of %d", ErrInvalidArgument, rank, len(b.place))
	}
	return b.place[rank], nil
}

// RankBytes returns rank's region as a slice of host memory, valid until
// the storage is closed. Device memory returns ErrNotHostMemory.
func (b *BlockSet) RankBytes(rank int) ([]byte, error) {
	off, err := b.RegionOffset(rank)
	if err != nil {
		return nil, err
	}
	if b.freed.Load() {
		// The memory may be another set's by now.
		return nil, fmt.Errorf("%w: %d was freed", ErrUnknownBlockSet, b.id)
	}
	st := b.p.arenas[b.place[rank]].storage
	mem := st.Bytes()
	if mem == nil {
		return nil, fmt.Errorf("%w: %s storage", ErrNotHostMemory, st.Kind())
	}
	end := off + b.strides.Region
	return mem[off:end:end], nil
}

// RegionBytes returns every rank's region, in rank order, as RankBytes does:
// the form layout.Execute and the transport take.
func (b *BlockSet) RegionBytes() ([][]byte, error) {
	out := make([][]byte, len(b.offsets))
	for r := range out {
		m, err := b.RankBytes(r)
		if err != nil {
			return nil, err
		}
		out[r] = m
	}
	return out, nil
}

// check validates a handle; the lock is held.
func (b *BlockSet) check(blk Block) (*slot, error) {
	if blk.Slot < 0 || blk.Slot >= len(b.slots) {
		return nil, fmt.Errorf("%w: slot %d of %d", ErrBadSlot, blk.Slot, len(b.slots))
	}
	s := &b.slots[blk.Slot]
	if s.gen != blk.Generation {
		return nil, fmt.Errorf("%w: slot %d generation %d, now %d", ErrStaleBlock, blk.Slot, blk.Generation, s.gen)
	}
	return s, nil
}

// allocated validates a handle on a slot its owner holds (Partial or
// Complete) for op; the lock is held.
func (b *BlockSet) allocated(blk Block, op string) (*slot, error) {
	s, err := b.check(blk)
	if err != nil {
		return nil, err
	}
	if s.state != Partial && s.state != Complete {
		return nil, &TransitionError{Op: op, Slot: blk.Slot, State: s.state}
	}
	return s, nil
}

// Allocate takes n free slots, moving them Reset -> Partial, and returns
// them owned by the caller. If fewer than n are free, inactive blocks are
// recycled, leaves first and least recently used among leaves (see
// Evict). If free and inactive together are fewer than n, nothing is
// changed and an *AllocError says how many were asked, free and inactive;
// if they are enough but recycling stops short because blocks in use
// extend the inactive ones left, the blocks recycled so far stay recycled,
// nothing is allocated, and the *AllocError counts the pinned blocks. An
// allocation that leaves fewer free slots than the low watermark recycles
// inactive blocks up to the high watermark.
func (b *BlockSet) Allocate(n int) ([]Block, error) {
	return b.AppendAllocate(nil, n)
}

// AppendAllocate is Allocate appending to dst, for callers that reuse a
// slice.
func (b *BlockSet) AppendAllocate(dst []Block, n int) ([]Block, error) {
	if n <= 0 {
		return dst, fmt.Errorf("%w: allocate %d slots", ErrInvalidArgument, n)
	}
	if b.p.closed.Load() {
		return dst, ErrClosed
	}
	start, timed := sampleStart()
	b.mu.Lock()
	if b.freed.Load() {
		b.mu.Unlock()
		return dst, fmt.Errorf("%w: %d was freed", ErrUnknownBlockSet, b.id)
	}
	if free := len(b.free); free < n {
		if free+b.inactive+b.givable() < n {
			err := &AllocError{Asked: n, Free: free, Inactive: b.inactive, Offloading: b.offloading, Copying: b.copying, Spare: b.spare}
			b.mu.Unlock()
			return dst, err
		}
		b.recycle(n - free)
		for b.p.cfg.OffloadGiveUp && len(b.free) < n && b.giveUp(n-len(b.free)) > 0 {
			b.recycle(n - len(b.free)) // parents left without children
		}
		if f := len(b.free); f < n {
			err := &AllocError{Asked: n, Free: f, Inactive: b.inactive, Pinned: b.inactive, Offloading: b.offloading, Copying: b.copying, Spare: b.spare}
			b.mu.Unlock()
			return dst, err
		}
	}
	for range n {
		i := b.free[len(b.free)-1]
		b.free = b.free[:len(b.free)-1]
		s := &b.slots[i]
		s.state = Partial
		dst = append(dst, Block{Slot: int(i), Generation: s.gen})
	}
	if len(b.free) < b.low && b.inactive > 0 {
		b.recycleAhead(b.high - len(b.free))
	}
	if timed {
		b.allocLat.record(sinceEpoch() - start)
	}
	b.mu.Unlock()
	return dst, nil
}

// Commit marks a Partial slot fully written: Partial -> Complete.
func (b *BlockSet) Commit(blk Block) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return err
	}
	if s.state != Partial {
		return &TransitionError{Op: "commit", Slot: blk.Slot, State: s.state}
	}
	s.state = Complete
	return nil
}

// Abort gives a Partial or Complete slot back: -> Reset, generation bumped.
func (b *BlockSet) Abort(blk Block) error {
	start, timed := sampleStart()
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, err := b.allocated(blk, "abort"); err != nil {
		return err
	}
	b.reset(int32(blk.Slot))
	if timed {
		b.releaseLat.record(sinceEpoch() - start)
	}
	return nil
}

// Retire takes a Partial or Complete slot out of use for the rest of the
// set's life: -> Retired. It is for a slot that a copy may still reach
// after its writer gave up (a device copy whose stream could not be
// synchronised): given back, the slot would go to a later block and the
// late copy overwrite it. A retired slot is never allocated again, and
// the set's memory is never given to another set: FreeBlockSet frees the
// set but withholds its memory. Metrics.Retired counts the slot, and
// Metrics.WithheldBytes its memory while the set is held, all the set's
// once it is freed.
func (b *BlockSet) Retire(blk Block) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.allocated(blk, "retire")
	if err != nil {
		return err
	}
	b.unspare(s)
	s.state = Retired
	b.retired++
	return nil
}

// retiredBytes is the memory the Retired slots keep out of use: each
// slot's share of the set's regions, on every rank. The lock is held.
func (b *BlockSet) retiredBytes() uint64 {
	if b.retired == 0 {
		return 0
	}
	return uint64(b.retired) * (b.strides.Region / uint64(len(b.slots))) * uint64(len(b.offsets))
}

// Usable is how many of the set's slots may still be allocated: its
// slots less those Retired.
func (b *BlockSet) Usable() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.slots) - b.retired
}

// Retired is how many of the set's slots are Retired.
func (b *BlockSet) Retired() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retired
}

// Register makes a Complete slot visible under its sequence hash:
// Complete -> Registered, with the caller holding one reference, and a
// store event. If the hash is already Registered in the set, the caller's
// slot is freed instead (Reset) and the existing block is returned with a
// reference for the caller. Use the returned Block from then on. parent is
// the previous block's sequence hash, 0 for the first block; it is carried
// in the event. If parent is Registered in this set, the new block extends
// it, and the parent is not recycled while the new block is Registered. A
// parent that is not here (another set, not registered, or registered
// later) is not held: links only ever point at older registrations, so a
// parent hash that lies cannot make a cycle that pins slots for good.
func (b *BlockSet) Register(blk Block, hash, parent uint64) (Block, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return Block{}, err
	}
	if s.state != Complete {
		return Block{}, &TransitionError{Op: "register", Slot: blk.Slot, State: s.state}
	}
	reg, ev, fresh := b.registerLocked(blk, s, hash, parent)
	if fresh {
		b.p.events.push(ev)
	}
	return reg, nil
}

// registerLocked is Register's work on a Complete slot s of blk; it
// returns the block to use and, when the hash is new to the set (fresh),
// the store event to queue. The lock is held.
func (b *BlockSet) registerLocked(blk Block, s *slot, hash, parent uint64) (reg Block, ev Event, fresh bool) {
	b.unspare(s)
	if e, ok := b.registry[hash]; ok {
		b.ref(e)
		b.reset(int32(blk.Slot))
		return Block{Slot: int(e), Generation: b.slots[e].gen}, Event{}, false
	}
	s.state = Registered
	s.hash, s.parent = hash, parent
	s.users = 1
	if parent != 0 {
		if pi, ok := b.registry[parent]; ok {
			s.up = pi
			ps := &b.slots[pi]
			ps.children++
			b.leafRemove(pi)
		}
	}
	b.registry[hash] = int32(blk.Slot)
	b.registered++
	return blk, Event{Kind: EventStore, Set: b.id, Slot: blk.Slot, Hash: hash, Parent: parent}, true
}

// Acquire takes a reference on the Registered block with the sequence
// hash, which stops it being recycled until Release.
func (b *BlockSet) Acquire(hash uint64) (Block, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i, ok := b.registry[hash]
	if !ok {
		return Block{}, false
	}
	b.ref(i)
	return Block{Slot: int(i), Generation: b.slots[i].gen}, true
}

// Lookup finds the Registered block with the sequence hash without taking
// a reference: the answer may be stale by the time it is used.
func (b *BlockSet) Lookup(hash uint64) (Block, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	i, ok := b.registry[hash]
	if !ok {
		return Block{}, false
	}
	return Block{Slot: int(i), Generation: b.slots[i].gen}, true
}

// Release drops a reference from Register or Acquire. A block left with no
// users and no leases becomes inactive: the most recently used of the
// blocks allocation may recycle. O(log n) in the set's inactive blocks.
func (b *BlockSet) Release(blk Block) error {
	start, timed := sampleStart()
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.check(blk)
	if err != nil {
		return err
	}
	if s.state != Registered || s.users == 0 {
		return &TransitionError{Op: "release", Slot: blk.Slot, State: s.state, Reason: "no references held"}
	}
	s.users--
	if s.users == 0 && s.leases == 0 {
		b.pushInactive(int32(blk.Slot))
	}
	if timed {
		b.releaseLat.record(sinceEpoch() - start)
	}
	return nil
}

// Evict recycles up to n inactive blocks and returns how many it recycled.
// It takes leaves first: a block is not recycled while a Registered block
// extends it (see Register), so a cached sequence loses its tail before
// its head; except where a block was registered Detached
// (Registration.Detached): it does not hold its parent, so the blocks
// before it may go first, the sequence then kept as two, the older part
// losing its tail first too. Among leaves the least recently used goes first; a parent
// whose last child goes becomes a leaf with its own last use. A block
// costs O(log n) in the set's inactive blocks. Under Config.Offload a
// block without a copy below is offered instead, and not counted.
func (b *BlockSet) Evict(n int) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.recycle(n)
}

// Slot returns a snapshot of slot i.
func (b *BlockSet) Slot(i int) (SlotInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i < 0 || i >= len(b.slots) {
		return SlotInfo{}, fmt.Errorf("%w: slot %d of %d", ErrBadSlot, i, len(b.slots))
	}
	s := &b.slots[i]
	return SlotInfo{State: s.state, Generation: s.gen, Hash: s.hash, Parent: s.parent,
		Users: int(s.users), Leases: int(s.leases), Inactive: s.inactive, Children: int(s.children)}, nil
}

// Metrics returns a snapshot of the block set.
func (b *BlockSet) Metrics() Metrics {
	b.mu.Lock()
	m := Metrics{
		Slots:           len(b.slots),
		Free:            len(b.free),
		Inactive:        b.inactive,
		Registered:      b.registered,
		Leased:          b.leased,
		Leases:          len(b.leases),
		LeasesExpired:   b.expired,
		Evictions:       b.evictions,
		Demoted:         b.demoted,
		Offloading:      b.offloading,
		OffloadsGivenUp: b.givenUp,
		Retired:         b.retired,
		WithheldBytes:   b.retiredBytes(),
		AllocLatency:    b.allocLat,
		ReleaseLatency:  b.releaseLat,
	}
	b.mu.Unlock()
	m.Active = m.Slots - m.Free - m.Inactive
	m.finish()
	return m
}

// ref takes a user reference on a Registered slot.
func (b *BlockSet) ref(i int32) {
	s := &b.slots[i]
	if s.inactive {
		b.unlinkInactive(i)
	}
	s.users++
}

// reset returns a slot to the free stack with a new generation, so that
// every handle on its old contents goes stale.
func (b *BlockSet) reset(i int32) {
	s := &b.slots[i]
	b.unspare(s)
	s.state = Reset
	s.hash, s.parent = 0, 0
	s.users = 0
	s.up, s.children = none, 0
	s.sum, s.hasSum, s.withdrawn = 0, false, false
	if s.shared {
		s.shared = false
		b.demoted--
	}
	s.below = false
	if s.offloading {
		s.offloading = false
		b.offloading--
	}
	s.copied, s.writing = false, false
	s.gen++
	b.free = append(b.free, i)
}

// unspare counts s out of the slots AllocateSpare handed out, if it was
// one. The lock is held.
func (b *BlockSet) unspare(s *slot) {
	if s.spare {
		s.spare = false
		b.spare--
	}
}

// recycleEvents is how many remove events recycle keeps on the stack.
const recycleEvents = 8

// recycle evicts up to n inactive leaves, least recently used first; a
// parent left without children joins the leaves.
func (b *BlockSet) recycle(n int) int {
	// The remove events of a small recycling (one allocation's need, as
	// when a set recycles on need) stay on the stack.
	var buf [recycleEvents]Event
	var removed []Event
	if n <= recycleEvents {
		removed = buf[:0]
	}
	defer func() { b.p.events.pushBatch(removed) }() // one batch, not a loss
	done := 0
	for done < n && b.leaves > 0 {
		i := b.oldestLeaf()
		if b.offer(i) {
			continue // kept until its copy below is made
		}
		b.unlinkInactive(i)
		removed = b.drop(i, removed)
		done++
	}
	return done
}

// drop recycles Registered slot i, which nothing uses or extends, and
// appends its remove event to removed. The lock is held.
func (b *BlockSet) drop(i int32, removed []Event) []Event {
	s := &b.slots[i]
	hash, parent := s.hash, s.parent
	if up := s.up; up != none {
		ps := &b.slots[up]
		ps.children--
		if ps.children == 0 && ps.inactive {
			b.leafPush(up)
		}
	}
	withdrawn := s.withdrawn
	if !withdrawn {
		delete(b.registry, hash)
	}
	b.registered--
	b.reset(i)
	b.evictions++
	if !withdrawn {
		removed = append(removed, Event{Kind: EventRemove, Set: b.id, Slot: int(i), Hash: hash, Parent: parent})
	}
	return removed
}

// pushInactive marks a Registered slot inactive, now its last use; a leaf
// becomes evictable.
func (b *BlockSet) pushInactive(i int32) {
	s := &b.slots[i]
	if s.offloading {
		return // Offloaded makes it inactive once its copy is done
	}
	s.inactive = true
	b.tick++
	s.used = b.tick
	if s.shared {
		s.used &^= demotedBit
	}
	b.inactive++
	if s.children == 0 {
		b.leafPush(i)
	}
}

// unlinkInactive makes an inactive slot active (referenced, leased or
// recycled).
func (b *BlockSet) unlinkInactive(i int32) {
	b.leafRemove(i)
	b.slots[i].inactive = false
	b.inactive--
}

// leafPush makes inactive slot i evictable: at the list's tail when it is
// the newest (the common case, O(1)), else in the heap.
func (b *BlockSet) leafPush(i int32) {
	s := &b.slots[i]
	b.leaves++
	if t := b.leafTail; t != none && b.slots[t].used > s.used {
		b.heapPush(i)
		return
	}
	s.listed, s.prev, s.next = true, b.leafTail, none
	if b.leafTail != none {
		b.slots[b.leafTail].next = i
	} else {
		b.leafHead = i
	}
	b.leafTail = i
}

// leafRemove takes slot i out of the evictable leaves, if it is there.
func (b *BlockSet) leafRemove(i int32) {
	s := &b.slots[i]
	switch {
	case s.listed:
		if s.prev != none {
			b.slots[s.prev].next = s.next
		} else {
			b.leafHead = s.next
		}
		if s.next != none {
			b.slots[s.next].prev = s.prev
		} else {
			b.leafTail = s.prev
		}
		s.listed, s.prev, s.next = false, none, none
	case s.heapIdx != none:
		b.heapRemove(i)
	default:
		return
	}
	b.leaves--
}

// oldestLeaf is the least recently used evictable slot; there is one.
func (b *BlockSet) oldestLeaf() int32 {
	h := b.leafHead
	if len(b.evictable) > 0 && (h == none || b.slots[b.evictable[0]].used < b.slots[h].used) {
		return b.evictable[0]
	}
	return h
}

// The late-leaf heap: slots ordered by used, each slot knowing its place,
// so that a leaf leaves it in O(log n) when it is referenced or extended.
// container/heap would box every slot index in an interface.

func (b *BlockSet) heapLess(x, y int) bool {
	return b.slots[b.evictable[x]].used < b.slots[b.evictable[y]].used
}

func (b *BlockSet) heapSwap(x, y int) {
	h := b.evictable
	h[x], h[y] = h[y], h[x]
	b.slots[h[x]].heapIdx = int32(x)
	b.slots[h[y]].heapIdx = int32(y)
}

func (b *BlockSet) heapUp(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !b.heapLess(j, p) {
			return
		}
		b.heapSwap(j, p)
		j = p
	}
}

func (b *BlockSet) heapDown(j int) bool {
	start, n := j, len(b.evictable)
	for {
		l := 2*j + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && b.heapLess(r, l) {
			c = r
		}
		if !b.heapLess(c, j) {
			break
		}
		b.heapSwap(j, c)
		j = c
	}
	return j > start
}

func (b *BlockSet) heapPush(i int32) {
	b.slots[i].heapIdx = int32(len(b.evictable))
	b.evictable = append(b.evictable, i)
	b.heapUp(len(b.evictable) - 1)
}

func (b *BlockSet) heapRemove(i int32) {
	j := int(b.slots[i].heapIdx)
	last := len(b.evictable) - 1
	if j != last {
		b.heapSwap(j, last)
	}
	b.evictable = b.evictable[:last]
	b.slots[i].heapIdx = none
	if j != last && !b.heapDown(j) {
		b.heapUp(j)
	}
}
