package pool

import (
	crand "crypto/rand"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// SetID names a block set within its pool. It is never zero.
type SetID uint64

// Pool is the memory an agent owns in one tier on one device, carved into
// block sets. All methods are safe for concurrent use.
type Pool struct {
	cfg     Config
	storage Storage
	page    uint64

	mu   sync.RWMutex // guards sets and next
	sets []*BlockSet  // sets[id-1]
	next uint64       // first uncarved byte of storage

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
	if storage == nil {
		return nil, fmt.Errorf("%w: storage is nil", ErrInvalidConfig)
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
		storage:  storage,
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

// Storage returns the memory the pool carves from.
func (p *Pool) Storage() Storage { return p.storage }

// NewBlockSet carves a block set for the layout from the pool's storage.
// The layout's Regions are ignored and filled in by the pool: region r
// starts page aligned (and aligned to the layout's Alignment) at
// BlockSet.RegionOffset(r) of the storage, with the storage's kind and
// device. Everything else in the layout must be valid.
func (p *Pool) NewBlockSet(tmpl *layout.Layout) (*BlockSet, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if tmpl == nil {
		return nil, fmt.Errorf("%w: layout is nil", ErrInvalidConfig)
	}
	l := tmpl.Clone()
	if l.TPSize >= 1 && l.TPSize <= layout.MaxTPSize {
		// Placeholders, so that Validate judges the rest before we carve.
		l.Regions = make([]layout.Region, l.TPSize)
		for i := range l.Regions {
			l.Regions[i] = layout.Region{Size: 1 << 62, Kind: p.storage.Kind(), Device: p.storage.Device()}
		}
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%w: block set layout: %w", ErrInvalidConfig, err)
	}
	st := l.Strides()
	align := max(l.Alignment, p.page)

	p.mu.Lock()
	defer p.mu.Unlock()
	base := p.storage.Addr()
	offsets := make([]uint64, l.TPSize)
	next := p.next
	for r := range l.TPSize {
		abs, ok := alignUp(base+next, align)
		if !ok {
			return nil, fmt.Errorf("%w: region %d does not fit the address space", ErrOutOfMemory, r)
		}
		off := abs - base
		end := off + st.Region
		if end < off || end > p.storage.Size() {
			return nil, fmt.Errorf("%w: block set needs %d regions of %d bytes, %d of %d bytes left",
				ErrOutOfMemory, l.TPSize, st.Region, p.storage.Size()-min(p.next, p.storage.Size()), p.storage.Size())
		}
		offsets[r] = off
		l.Regions[r] = layout.Region{Base: abs, Size: st.Region, Device: p.storage.Device(), Kind: p.storage.Kind()}
		next = end
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%w: carved block set layout: %w", ErrInvalidConfig, err)
	}
	p.next = next
	b := newBlockSet(p, SetID(len(p.sets)+1), l, st, offsets)
	p.sets = append(p.sets, b)
	return b, nil
}

func alignUp(v, a uint64) (uint64, bool) {
	r := (v + a - 1) &^ (a - 1)
	return r, r >= v
}

// BlockSet returns the block set with the given id.
func (p *Pool) BlockSet(id SetID) (*BlockSet, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if id == 0 || uint64(id) > uint64(len(p.sets)) {
		return nil, fmt.Errorf("%w: %d", ErrUnknownBlockSet, id)
	}
	return p.sets[id-1], nil
}

// BlockSets returns every block set, in id order. The slice is the caller's.
func (p *Pool) BlockSets() []*BlockSet {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return append([]*BlockSet(nil), p.sets...)
}

// Metrics returns a snapshot summed over the block sets.
func (p *Pool) Metrics() Metrics {
	var m Metrics
	for _, b := range p.BlockSets() {
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
	sets := p.sets
	for _, b := range sets {
		b.mu.Lock()
	}
	var s RegistrySnapshot
	// No event can be issued while every set is locked.
	s.Seq = p.events.lastSeq()
	for _, b := range sets {
		for i := range b.slots {
			sl := &b.slots[i]
			if sl.state == Registered {
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

func (p *Pool) checkDuration(d time.Duration) error {
	if d <= 0 || d > p.cfg.MaxLeaseDuration {
		return fmt.Errorf("%w: duration %v is not in (0, %v]", ErrBadLease, d, p.cfg.MaxLeaseDuration)
	}
	return nil
}
