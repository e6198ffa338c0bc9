package pool

import (
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// SetID names a block set within its pool. It is never zero.
type SetID uint64

// Pool is the memory an agent owns in one tier, carved into block sets: one
// storage, or one per GPU (NewSpanning), a block set's ranks each carved
// from one of them. All methods are safe for concurrent use.
type Pool struct {
	cfg    Config
	arenas []*arena // one per storage, in the order given
	page   uint64

	mu   sync.RWMutex // guards sets and the arenas' next and holes
	sets []*BlockSet  // sets[id-1]; nil once freed, so that ids are never reused
	// givenUpFreed is the OffloadsGivenUp of the sets freed (under mu), so
	// that the pool's count only grows.
	givenUpFreed uint64
	// retiredFreed is the Retired slots of the sets freed, and withheld
	// the bytes of the memory of those that had any, which no other set
	// gets (under mu); Metrics adds the sets still held.
	retiredFreed int
	withheld     uint64

	leaseMu  sync.Mutex
	leaseIdx map[LeaseID]*BlockSet
	rng      *rand.ChaCha8

	events eventQueue

	closed    atomic.Bool
	done      chan struct{}
	loopDone  chan struct{}
	closeOnce sync.Once
}

// New makes a pool over storage, which the caller keeps owning: close it
// after the pool. The pool starts a goroutine for event delivery and lease
// expiry; Close stops it.
func New(storage Storage, cfg Config) (*Pool, error) {
	return NewSpanning([]Storage{storage}, cfg)
}

// NewSpanning makes a pool over several storages of one memory kind, one
// per device (a GPU each, for device memory), which the caller keeps
// owning: a block set's ranks are carved each from one of them
// (NewBlockSetOn). Otherwise it is New.
func NewSpanning(storages []Storage, cfg Config) (*Pool, error) {
	if len(storages) == 0 {
		return nil, fmt.Errorf("%w: no storage", ErrInvalidConfig)
	}
	arenas := make([]*arena, len(storages))
	for i, st := range storages {
		if st == nil {
			return nil, fmt.Errorf("%w: storage %d is nil", ErrInvalidConfig, i)
		}
		if st.Kind() != storages[0].Kind() {
			return nil, fmt.Errorf("%w: storage %d is %s memory, storage 0 %s: a pool is one tier",
				ErrInvalidConfig, i, st.Kind(), storages[0].Kind())
		}
		arenas[i] = &arena{storage: st}
	}
	cfg, err := cfg.populate()
	if err != nil {
		return nil, err
	}
	var seed [32]byte
	// Lease ids are capabilities a peer presents: they must not be
	// guessable, so the generator is seeded from the OS.
	if _, err := crand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("pool: seed lease ids: %w", err)
	}
	p := &Pool{
		cfg:      cfg,
		arenas:   arenas,
		page:     uint64(os.Getpagesize()),
		leaseIdx: make(map[LeaseID]*BlockSet),
		rng:      rand.NewChaCha8(seed),
		done:     make(chan struct{}),
		loopDone: make(chan struct{}),
	}
	p.events.init(cfg.Events != nil, cfg.EventBuffer)
	go p.loop()
	return p, nil
}

// Close stops the pool's goroutine after handing the sink the events still
// queued. Allocate, Lease and NewBlockSet return ErrClosed afterwards; the
// operations that let go of blocks (Release, Abort, ReleaseLease) keep
// working so that holders can finish, but their events are not delivered.
// It is safe to call twice and returns once the goroutine has exited,
// which waits for a sink call in progress to return.
func (p *Pool) Close() error {
	p.closeOnce.Do(func() {
		p.closed.Store(true)
		close(p.done)
	})
	<-p.loopDone
	return nil
}

func (p *Pool) loop() {
	defer close(p.loopDone)
	var tick <-chan time.Time
	if p.cfg.ExpiryInterval > 0 {
		t := time.NewTicker(p.cfg.ExpiryInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-p.done:
			p.deliver()
			return
		case <-p.events.wake:
			p.deliver()
		case <-tick:
			if n := p.ExpireLeases(); n > 0 {
				p.cfg.Logger.Debug("pool: leases expired", "count", n)
			}
		}
	}
}

func (p *Pool) deliver() {
	for {
		b, ok := p.events.take(p.cfg.MaxEventBatch)
		if !ok {
			return
		}
		p.cfg.Events(b)
	}
}

// Storage returns the memory the pool carves from: the first of Storages.
func (p *Pool) Storage() Storage { return p.arenas[0].storage }

// Storages returns the memories the pool carves from, in the order given to
// NewSpanning. The slice is the caller's.
func (p *Pool) Storages() []Storage {
	out := make([]Storage, len(p.arenas))
	for i, a := range p.arenas {
		out[i] = a.storage
	}
	return out
}

// NewBlockSet carves a block set for the layout from the pool's storage,
// rank r from storage r mod len(Storages()). The layout's Regions are
// ignored and filled in by the pool: region r starts page aligned (and
// aligned to the layout's Alignment) at BlockSet.RegionOffset(r) of its
// storage, with that storage's kind and device. Everything else in the
// layout must be valid.
func (p *Pool) NewBlockSet(tmpl *layout.Layout) (*BlockSet, error) {
	return p.NewBlockSetOn(tmpl, nil)
}

// NewBlockSetOn is NewBlockSet with rank r's region carved from storage
// place[r] (an index into Storages). A nil place spreads the ranks as
// NewBlockSet does. The regions on one storage are carved together, in
// rank order; it is all or nothing: when one storage has no room, nothing
// is carved.
func (p *Pool) NewBlockSetOn(tmpl *layout.Layout, place []int) (*BlockSet, error) {
	l, place, err := p.setLayout(tmpl, place)
	if err != nil {
		return nil, err
	}
	st := l.Strides()
	align := max(l.Alignment, p.page)

	p.mu.Lock()
	defer p.mu.Unlock()
	// Place every storage's share before taking any.
	offsets := make([]uint64, l.TPSize)
	var cuts []cut
	for a, ar := range p.arenas {
		var ranks []int
		for r, pa := range place {
			if pa == a {
				ranks = append(ranks, r)
			}
		}
		if len(ranks) == 0 {
			continue
		}
		o, hole, ok := ar.place(align, st.Region, len(ranks))
		if !ok {
			s := ar.storage
			return nil, fmt.Errorf("%w: block set needs %d regions of %d bytes on storage %d (%s, device %d), %d of %d bytes left (%d in %d freed holes)",
				ErrOutOfMemory, len(ranks), st.Region, a, s.Kind(), s.Device(), s.Size()-min(ar.next, s.Size()), s.Size(),
				ar.holeBytes(), len(ar.holes))
		}
		for i, r := range ranks {
			offsets[r] = o[i]
			base := ar.storage.Addr()
			l.Regions[r] = layout.Region{Base: base + o[i], Size: st.Region, Device: ar.storage.Device(), Kind: ar.storage.Kind()}
		}
		cuts = append(cuts, cut{arena: a, span: span{start: o[0], end: o[len(o)-1] + st.Region}, hole: hole})
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%w: carved block set layout: %w", ErrInvalidConfig, err)
	}
	for _, c := range cuts {
		p.arenas[c.arena].take(c.span, c.hole)
	}
	b := newBlockSet(p, SetID(len(p.sets)+1), l, st, offsets, append([]int(nil), place...))
	b.cuts = cuts
	p.sets = append(p.sets, b)
	return b, nil
}

// setLayout checks a block set's layout and placement before any room is
// looked for (NewBlockSetOn, FitsFreeing): a copy of tmpl with placeholder
// regions, and the placement (nil spread over the storages).
func (p *Pool) setLayout(tmpl *layout.Layout, place []int) (*layout.Layout, []int, error) {
	if p.closed.Load() {
		return nil, nil, ErrClosed
	}
	if tmpl == nil {
		return nil, nil, fmt.Errorf("%w: layout is nil", ErrInvalidConfig)
	}
	l := tmpl.Clone()
	if l.TPSize >= 1 && l.TPSize <= layout.MaxTPSize {
		if place == nil {
			place = make([]int, l.TPSize)
			for r := range place {
				place[r] = r % len(p.arenas)
			}
		}
		// Placeholders, so that Validate judges the rest before we carve.
		l.Regions = make([]layout.Region, l.TPSize)
		for i := range l.Regions {
			st := p.arenas[0].storage
			l.Regions[i] = layout.Region{Size: 1 << 62, Kind: st.Kind(), Device: st.Device()}
		}
	}
	if err := l.Validate(); err != nil {
		return nil, nil, fmt.Errorf("%w: block set layout: %w", ErrInvalidConfig, err)
	}
	if len(place) != l.TPSize {
		return nil, nil, fmt.Errorf("%w: placement names %d storages for %d ranks", ErrInvalidConfig, len(place), l.TPSize)
	}
	for r, a := range place {
		if a < 0 || a >= len(p.arenas) {
			return nil, nil, fmt.Errorf("%w: rank %d placed on storage %d of %d", ErrInvalidConfig, r, a, len(p.arenas))
		}
	}
	return l, place, nil
}

// arena is one storage of a pool and what is carved from it. The pool's
// mu guards next and holes.
type arena struct {
	storage Storage
	next    uint64 // first uncarved byte
	holes   []span // freed storage below next, by offset, never adjacent
}

// cut is the storage one block set occupies in one arena; hole is the
// hole it was carved from when it was placed, -1 past next.
type cut struct {
	arena int
	span  span
	hole  int
}

// place finds room for n regions of size bytes, each aligned: first fit in
// the memory of freed sets, else past the last carved byte. hole is the
// hole's index, or -1.
func (ar *arena) place(align, size uint64, n int) (offsets []uint64, hole int, ok bool) {
	base := ar.storage.Addr()
	for i, h := range ar.holes {
		if o, end, ok := carve(base, h.start, h.end, align, size, n); ok && end <= h.end {
			return o, i, true
		}
	}
	o, end, ok := carve(base, ar.next, ar.storage.Size(), align, size, n)
	if !ok || end > ar.storage.Size() {
		return nil, 0, false
	}
	return o, -1, true
}

// take commits what place found.
func (ar *arena) take(sp span, hole int) {
	if hole >= 0 {
		h := ar.holes[hole]
		var keep []span
		if h.start < sp.start {
			keep = append(keep, span{h.start, sp.start})
		}
		if sp.end < h.end {
			keep = append(keep, span{sp.end, h.end})
		}
		ar.holes = append(ar.holes[:hole], append(keep, ar.holes[hole+1:]...)...)
		return
	}
	if ar.next < sp.start {
		ar.addHole(span{ar.next, sp.start})
	}
	ar.next = sp.end
}

// span is a byte range [start, end) of the storage.
type span struct{ start, end uint64 }

// carve places n regions of size bytes, each aligned, from offset from of
// the storage at base; it returns their offsets and where the last ends.
// ok is false when the arithmetic overflows or the end passes limit.
func carve(base, from, limit, align, size uint64, n int) (offsets []uint64, end uint64, ok bool) {
	offsets = make([]uint64, n)
	next := from
	for r := range n {
		abs, ok := alignUp(base+next, align)
		if !ok {
			return nil, 0, false
		}
		off := abs - base
		end := off + size
		if end < off || end > limit {
			return nil, 0, false
		}
		offsets[r] = off
		next = end
	}
	return offsets, next, true
}

// addHole records freed storage, merging it with its neighbours, and gives
// a hole that reaches next back to the uncarved end. The pool's mu is
// held.
func (ar *arena) addHole(h span) {
	i := sort.Search(len(ar.holes), func(i int) bool { return ar.holes[i].start >= h.start })
	ar.holes = append(ar.holes, span{})
	copy(ar.holes[i+1:], ar.holes[i:])
	ar.holes[i] = h
	if i+1 < len(ar.holes) && ar.holes[i].end == ar.holes[i+1].start {
		ar.holes[i].end = ar.holes[i+1].end
		ar.holes = append(ar.holes[:i+1], ar.holes[i+2:]...)
	}
	if i > 0 && ar.holes[i-1].end == ar.holes[i].start {
		ar.holes[i-1].end = ar.holes[i].end
		ar.holes = append(ar.holes[:i], ar.holes[i+1:]...)
	}
	if last := len(ar.holes) - 1; last >= 0 && ar.holes[last].end == ar.next {
		ar.next = ar.holes[last].start
		ar.holes = ar.holes[:last]
	}
}

func (ar *arena) holeBytes() uint64 {
	var n uint64
	for _, h := range ar.holes {
		n += h.end - h.start
	}
	return n
}

// FreeBlockSet gives a block set's memory back to the pool for new block
// sets. Its registered blocks are evicted first, each with a remove event.
// It refuses, changing nothing, with an error matching ErrBlockSetBusy
// while any slot is allocated (Partial or Complete), referenced or leased.
// The set's id is never reused; calls on the freed set fail with
// ErrUnknownBlockSet, and BlockSet and BlockSets no longer return it.
func (p *Pool) FreeBlockSet(id SetID) error {
	return p.freeBlockSet(id, false)
}

// ReclaimBlockSet is FreeBlockSet for a caller that frees the set only for
// its memory (room for another set): it refuses too, changing nothing,
// with an error matching ErrBlockSetRetired, a set with Retired slots,
// whose memory FreeBlockSet would withhold rather than give back. The
// slots are looked at under the lock Retire takes, so a slot retired just
// before is seen: a caller that checked Retired before cannot free a set
// retired since, and find its room not there. A set both busy and
// retired is refused as retired.
func (p *Pool) ReclaimBlockSet(id SetID) error {
	return p.freeBlockSet(id, true)
}

// freeBlockSet is FreeBlockSet, or ReclaimBlockSet where reclaim is set.
func (p *Pool) freeBlockSet(id SetID, reclaim bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if id == 0 || uint64(id) > uint64(len(p.sets)) || p.sets[id-1] == nil {
		return fmt.Errorf("%w: %d", ErrUnknownBlockSet, id)
	}
	b := p.sets[id-1]
	b.mu.Lock()
	defer b.mu.Unlock()
	if reclaim && b.retired > 0 {
		return fmt.Errorf("%w: block set %d has %d retired slots: freed, its memory would be withheld", ErrBlockSetRetired, id, b.retired)
	}
	var allocated, used int
	for i := range b.slots {
		s := &b.slots[i]
		switch {
		case s.state == Partial || s.state == Complete:
			allocated++
		case s.state == Registered && (s.users > 0 || s.leases > 0):
			used++
		}
	}
	if allocated > 0 || used > 0 || len(b.leases) > 0 {
		return fmt.Errorf("%w: block set %d has %d slots allocated, %d blocks referenced or leased, %d leases",
			ErrBlockSetBusy, id, allocated, used, len(b.leases))
	}
	if n := b.offloadBeforeFree(); n > 0 {
		return errOffloading(id, n)
	}
	var removed []Event
	for i := range b.slots {
		s := &b.slots[i]
		if s.state != Registered {
			continue
		}
		b.evictions++
		if !s.withdrawn {
			removed = append(removed, Event{Kind: EventRemove, Set: b.id, Slot: i, Hash: s.hash, Parent: s.parent})
		}
		s.state = Reset
		s.gen++
	}
	b.p.events.pushBatch(removed) // one batch, not a loss
	p.givenUpFreed += b.givenUp
	p.retiredFreed += b.retired
	b.registry = map[uint64]int32{}
	b.evictable, b.free = nil, nil
	b.leafHead, b.leafTail, b.leaves = none, none, 0
	b.registered, b.inactive, b.demoted = 0, 0, 0
	b.freed.Store(true)
	p.sets[id-1] = nil
	for _, c := range b.cuts {
		if b.retired > 0 {
			// A late copy may still land in a retired slot: no other
			// set gets this memory while the pool lives.
			p.withheld += c.span.end - c.span.start
			continue
		}
		p.arenas[c.arena].addHole(c.span)
	}
	return nil
}

func alignUp(v, a uint64) (uint64, bool) {
	r := (v + a - 1) &^ (a - 1)
	return r, r >= v
}

// BlockSet returns the block set with the given id.
func (p *Pool) BlockSet(id SetID) (*BlockSet, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if id == 0 || uint64(id) > uint64(len(p.sets)) || p.sets[id-1] == nil {
		return nil, fmt.Errorf("%w: %d", ErrUnknownBlockSet, id)
	}
	return p.sets[id-1], nil
}

// BlockSets returns every block set, in id order. The slice is the caller's.
func (p *Pool) BlockSets() []*BlockSet {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]*BlockSet, 0, len(p.sets))
	for _, b := range p.sets {
		if b != nil {
			out = append(out, b)
		}
	}
	return out
}

// Metrics returns a snapshot summed over the block sets (and, for
// OffloadsGivenUp, Retired and WithheldBytes, the sets freed).
func (p *Pool) Metrics() Metrics {
	var m Metrics
	// The sets and the freed sets' count at one point: a set freed after
	// it is counted once, by its own Metrics.
	p.mu.RLock()
	sets := make([]*BlockSet, 0, len(p.sets))
	for _, b := range p.sets {
		if b != nil {
			sets = append(sets, b)
		}
	}
	m.OffloadsGivenUp = p.givenUpFreed
	m.Retired = p.retiredFreed
	m.WithheldBytes = p.withheld
	p.mu.RUnlock()
	for _, b := range sets {
		bm := b.Metrics()
		m.add(&bm)
	}
	m.EventsDropped = p.events.droppedCount()
	m.finish()
	return m
}

// RegistrySnapshot is what is Registered at one point of the event sequence.
type RegistrySnapshot struct {
	// Seq is the last event number issued when the snapshot was taken:
	// apply events with a higher Seq on top of it.
	Seq uint64
	// Blocks are store events (Seq zero) for every Registered block.
	Blocks []Event
}

// Snapshot returns every Registered block with the event number it is
// consistent with, for a sink that lost events to resynchronise.
func (p *Pool) Snapshot() RegistrySnapshot {
	// Holding the set list too: a set made between listing and locking
	// could register a block numbered within the snapshot yet missing.
	p.mu.RLock()
	defer p.mu.RUnlock()
	var sets []*BlockSet
	for _, b := range p.sets {
		if b != nil {
			sets = append(sets, b)
		}
	}
	for _, b := range sets {
		b.mu.Lock()
	}
	var s RegistrySnapshot
	// No event can be issued while every set is locked.
	s.Seq = p.events.lastSeq()
	for _, b := range sets {
		for i := range b.slots {
			sl := &b.slots[i]
			if sl.state == Registered && !sl.withdrawn {
				s.Blocks = append(s.Blocks, Event{Kind: EventStore, Set: b.id, Slot: i, Hash: sl.hash, Parent: sl.parent})
			}
		}
	}
	for _, b := range sets {
		b.mu.Unlock()
	}
	return s
}

// ExpireLeases reaps every lease past its deadline now and returns how many.
// The pool's goroutine calls it every Config.ExpiryInterval.
func (p *Pool) ExpireLeases() int {
	n := 0
	for _, b := range p.BlockSets() {
		n += b.expireLeases()
	}
	return n
}

// LeaseID names a lease. It is random and unguessable, so that it can be
// handed to a peer and presented back as the right to read; zero is never
// a lease.
type LeaseID uint64

// reserveLease picks a fresh id for a lease in b, refusing past MaxLeases.
func (p *Pool) reserveLease(b *BlockSet) (LeaseID, error) {
	p.leaseMu.Lock()
	defer p.leaseMu.Unlock()
	if len(p.leaseIdx) >= p.cfg.MaxLeases {
		return 0, fmt.Errorf("%w: %d live", ErrTooManyLeases, len(p.leaseIdx))
	}
	for {
		id := LeaseID(p.rng.Uint64())
		if _, taken := p.leaseIdx[id]; id != 0 && !taken {
			p.leaseIdx[id] = b
			return id, nil
		}
	}
}

func (p *Pool) forgetLeases(ids ...LeaseID) {
	if len(ids) == 0 {
		return
	}
	p.leaseMu.Lock()
	for _, id := range ids {
		delete(p.leaseIdx, id)
	}
	p.leaseMu.Unlock()
}

func (p *Pool) leaseSet(id LeaseID) (*BlockSet, error) {
	p.leaseMu.Lock()
	b := p.leaseIdx[id]
	p.leaseMu.Unlock()
	if b == nil {
		return nil, fmt.Errorf("%w: %#x", ErrUnknownLease, uint64(id))
	}
	return b, nil
}

// Renew moves a live lease's deadline to d from now. A lease already past
// its deadline is reaped and ErrLeaseExpired returned.
func (p *Pool) Renew(id LeaseID, d time.Duration) error {
	if err := p.checkDuration(d); err != nil {
		return err
	}
	b, err := p.leaseSet(id)
	if err != nil {
		return err
	}
	return b.renew(id, d)
}

// ReleaseLease ends a lease and reports whether it was still valid (never
// past its deadline) at this moment. Only then may a reader trust the bytes
// it read under the lease. An unknown id (never issued, released twice, or
// expired and reaped) returns false and an error matching ErrUnknownLease.
func (p *Pool) ReleaseLease(id LeaseID) (valid bool, err error) {
	b, err := p.leaseSet(id)
	if err != nil {
		return false, err
	}
	return b.releaseLease(id)
}

// CheckRead reports whether the bytes [offset, offset+length) of rank's
// region of block set set lie entirely in the shards of slots that the live
// lease id holds. It returns nil if so, else an error matching
// ErrReadDenied, ErrLeaseExpired or ErrUnknownLease. The transport serves
// nothing it refuses.
func (p *Pool) CheckRead(id LeaseID, set SetID, rank int, offset, length uint64) error {
	b, err := p.leaseSet(id)
	if err != nil {
		return err
	}
	if b.id != set {
		return &ReadError{Lease: id, Rank: rank, Offset: offset, Length: length,
			Reason: fmt.Sprintf("lease is on block set %d, not %d", b.id, set)}
	}
	return b.checkRead(id, rank, offset, length)
}

// LeasedSlots returns the block set live lease id is on and the slots it
// holds, ascending, each with the hash of the block it held when leased
// (one withdrawn since included): what a holder checks a reader's claims
// about the lease against. A lease past its deadline is reaped and
// ErrLeaseExpired returned; an unknown one returns ErrUnknownLease.
func (p *Pool) LeasedSlots(id LeaseID) (SetID, []LeasedSlot, error) {
	b, err := p.leaseSet(id)
	if err != nil {
		return 0, nil, err
	}
	slots, err := b.leasedSlots(id)
	if err != nil {
		return 0, nil, err
	}
	return b.id, slots, nil
}

// LeaseDeadline returns live lease id's deadline, which only Renew moves.
// A lease past its deadline is reaped and ErrLeaseExpired returned; an
// unknown one returns ErrUnknownLease.
func (p *Pool) LeaseDeadline(id LeaseID) (time.Time, error) {
	b, err := p.leaseSet(id)
	if err != nil {
		return time.Time{}, err
	}
	return b.leaseDeadline(id)
}

func (p *Pool) checkDuration(d time.Duration) error {
	if d <= 0 || d > p.cfg.MaxLeaseDuration {
		return fmt.Errorf("%w: duration %v is not in (0, %v]", ErrBadLease, d, p.cfg.MaxLeaseDuration)
	}
	return nil
}
