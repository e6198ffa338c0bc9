package pool

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

var modelSeed = flag.Uint64("pool.seed", 0, "run the model test with this seed only")

// The reference model: the pool's rules written as plainly as possible,
// with maps and slices instead of free stacks, intrusive lists and heaps.
type mSlot struct {
	state        State
	gen          uint64
	hash, parent uint64
	users        int
	leases       int
	pattern      byte // written by the test; 0 when unknown
}

type mLease struct {
	seq      int
	deadline time.Time
	slots    []int
}

type refModel struct {
	slots     []mSlot
	free      map[int]bool
	registry  map[uint64]int
	lru       []int       // inactive blocks, least recently used first
	extends   map[int]int // slot -> its parent's slot, when the parent was registered first
	leases    map[LeaseID]*mLease
	leaseSeq  int
	low, high int
	evictions uint64
	expired   uint64
	events    []Event
	// What the run exercised, so that TestModel can tell that the seeds
	// reach the prefix rule's corners.
	cascades int // a parent became a leaf when its last child went
	pinned   int // an allocation failed on blocks pinned by extensions
}

func (m *refModel) reset(i int) {
	s := &m.slots[i]
	*s = mSlot{gen: s.gen + 1}
	delete(m.extends, i)
	m.free[i] = true
}

// children counts the Registered blocks that extend slot i.
func (m *refModel) children(i int) int {
	n := 0
	for _, p := range m.extends {
		if p == i {
			n++
		}
	}
	return n
}

// recycle takes the least recently used inactive block that nothing
// extends, k times or until there is none.
func (m *refModel) recycle(k int, set SetID) int {
	n := 0
	for n < k {
		j := slices.IndexFunc(m.lru, func(i int) bool { return m.children(i) == 0 })
		if j < 0 {
			break
		}
		i := m.lru[j]
		m.lru = slices.Delete(m.lru, j, j+1)
		if _, ok := m.extends[i]; ok && m.children(m.extends[i]) == 1 {
			m.cascades++
		}
		s := m.slots[i]
		m.events = append(m.events, Event{Kind: EventRemove, Set: set, Slot: i, Hash: s.hash, Parent: s.parent})
		delete(m.registry, s.hash)
		m.reset(i)
		m.evictions++
		n++
	}
	return n
}

func (m *refModel) unlru(i int) {
	if k := slices.Index(m.lru, i); k >= 0 {
		m.lru = slices.Delete(m.lru, k, k+1)
	}
}

func (m *refModel) ref(i int) {
	m.unlru(i)
	m.slots[i].users++
}

func (m *refModel) unpin(id LeaseID) {
	l := m.leases[id]
	delete(m.leases, id)
	for _, i := range l.slots {
		s := &m.slots[i]
		s.leases--
		if s.leases == 0 && s.users == 0 {
			m.lru = append(m.lru, i)
		}
	}
}

// expireAll reaps every lease at or past its deadline in (deadline,
// creation) order.
func (m *refModel) expireAll(now time.Time) int {
	var due []LeaseID
	for id, l := range m.leases {
		if !now.Before(l.deadline) {
			due = append(due, id)
		}
	}
	slices.SortFunc(due, func(a, b LeaseID) int {
		la, lb := m.leases[a], m.leases[b]
		if c := la.deadline.Compare(lb.deadline); c != 0 {
			return c
		}
		return la.seq - lb.seq
	})
	for _, id := range due {
		m.unpin(id)
		m.expired++
	}
	return len(due)
}

// slotOf says which slot's shard holds byte pos of a region, computed
// from the strides without layout.Locate.
func slotOf(l *layout.Layout, pos uint64) (int, bool) {
	s := l.Strides()
	planes := uint64(2)
	if l.Model.MLA {
		planes = 1
	}
	if l.Arrangement == layout.FullyContiguous {
		slot := pos / s.Block
		return int(slot), slot < uint64(l.Slots) && pos%s.Block < s.Shard
	}
	layer := pos / s.Layer
	in := pos % s.Layer
	slot := in / s.Block
	return int(slot), layer < uint64(l.Model.Layers) && slot < uint64(l.Slots) && in%s.Block < planes*s.Chunk
}

type held struct {
	blk     Block
	hash    uint64
	pattern byte
}

func TestModel(t *testing.T) {
	seeds, steps := 48, 2000
	if *long {
		seeds, steps = 400, 5000
	}
	var cascades, pinned int
	defer func() {
		if *modelSeed == 0 && !t.Failed() && (cascades == 0 || pinned == 0) {
			t.Errorf("%d seeds made %d cascades and %d pinned allocation failures: the prefix rule went untested",
				seeds, cascades, pinned)
		}
	}()
	for i := range seeds {
		seed := uint64(i) + 1
		if *modelSeed != 0 {
			if i > 0 {
				break
			}
			seed = *modelSeed
		}
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			m := runModel(t, seed, steps)
			cascades += m.cascades
			pinned += m.pinned
		})
	}
}

func runModel(t *testing.T, seed uint64, steps int) *refModel {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	fail := func(step int, op string, format string, args ...any) {
		t.Helper()
		t.Fatalf("seed %d (rerun with -run TestModel -pool.seed=%d), step %d, %s: %s",
			seed, seed, step, op, fmt.Sprintf(format, args...))
	}
	tp := []int{1, 2, 4}[rng.IntN(3)]
	arr := []layout.Arrangement{layout.FullyContiguous, layout.LayerSeparate}[rng.IntN(2)]
	align := []uint64{64, 1024}[rng.IntN(2)]
	const nslots, nhashes = 12, 16
	clock := newManualClock()
	var rec recorder
	cfg := testConfig(clock, rec.sink)
	cfg.EventBuffer = 1 << 16
	switch rng.IntN(3) {
	case 0:
		cfg.LowWatermark = -1
	case 1:
		cfg.LowWatermark, cfg.HighWatermark = 0.1, 0.3
	case 2:
		cfg.LowWatermark, cfg.HighWatermark = 0.25, 0.5
	}
	p, b := newTestPool(t, cfg, testLayout(nslots, tp, arr, align))
	lay := b.Layout()
	regions, _ := b.RegionBytes()
	m := &refModel{
		slots:    make([]mSlot, nslots),
		free:     map[int]bool{},
		registry: map[uint64]int{},
		extends:  map[int]int{},
		leases:   map[LeaseID]*mLease{},
		low:      b.low,
		high:     b.high,
	}
	for i := range nslots {
		m.free[i] = true
	}
	var owned []held // Partial or Complete, ours to commit, register or abort
	var refs []held  // one reference each on a Registered block
	var leaseIDs []LeaseID
	pick := func(n int) int { return rng.IntN(n) }
	patternAt := func(slot int) uint64 {
		return lay.ChunkOffset(slot, lay.Model.Layers-1, 1)
	}
	checkPattern := func(step int, op string, slot int) {
		want := m.slots[slot].pattern
		if want == 0 {
			return
		}
		for r := range regions {
			if got := regions[r][patternAt(slot)]; got != want {
				fail(step, op, "slot %d rank %d holds %#x, wrote %#x", slot, r, got, want)
			}
		}
	}
	wantErr := func(step int, op string, err, want error) {
		t.Helper()
		if !errors.Is(err, want) {
			fail(step, op, "err = %v, want %v", err, want)
		}
	}

	for step := range steps {
		now := clock.Now()
		var op string
		switch k := pick(100); {
		case k < 14:
			op = "allocate"
			n := 1 + pick(3)
			f := len(m.free)
			got, err := b.Allocate(n)
			if f < n && f+len(m.lru) < n {
				var ae *AllocError
				if !errors.As(err, &ae) || *ae != (AllocError{Asked: n, Free: f, Inactive: len(m.lru)}) {
					fail(step, op, "err = %v, want asked %d free %d inactive %d", err, n, f, len(m.lru))
				}
				break
			}
			if f < n {
				m.recycle(n-f, b.ID())
				if nf := len(m.free); nf < n {
					var ae *AllocError
					want := AllocError{Asked: n, Free: nf, Inactive: len(m.lru), Pinned: len(m.lru)}
					if !errors.As(err, &ae) || *ae != want {
						fail(step, op, "err = %v, want %+v", err, want)
					}
					m.pinned++
					break
				}
			}
			if err != nil {
				fail(step, op, "%v", err)
			}
			for _, blk := range got {
				if !m.free[blk.Slot] || m.slots[blk.Slot].gen != blk.Generation {
					fail(step, op, "got %+v, which is not free in the model", blk)
				}
				delete(m.free, blk.Slot)
				m.slots[blk.Slot].state = Partial
				owned = append(owned, held{blk: blk, hash: uint64(pick(nhashes))})
			}
			if len(m.free) < m.low && len(m.lru) > 0 {
				m.recycle(m.high-len(m.free), b.ID())
			}
		case k < 20:
			op = "write"
			if len(owned) == 0 {
				break
			}
			h := &owned[pick(len(owned))]
			if m.slots[h.blk.Slot].state != Partial {
				break
			}
			h.pattern = byte(1 + pick(255))
			for r := range regions {
				regions[r][patternAt(h.blk.Slot)] = h.pattern
			}
		case k < 30:
			op = "commit"
			if len(owned) == 0 {
				break
			}
			h := owned[pick(len(owned))]
			err := b.Commit(h.blk)
			if m.slots[h.blk.Slot].state != Partial {
				wantErr(step, op, err, ErrInvalidTransition)
				break
			}
			if err != nil {
				fail(step, op, "%v", err)
			}
			m.slots[h.blk.Slot].state = Complete
		case k < 40:
			op = "register"
			if len(owned) == 0 {
				break
			}
			j := pick(len(owned))
			h := owned[j]
			// Half the time extend a Registered block, so that chains
			// and trees form; else any hash, often one not here (0 is
			// "no parent").
			parent := uint64(pick(nhashes))
			if len(m.registry) > 0 && pick(2) == 0 {
				hs := slices.Sorted(maps.Keys(m.registry))
				parent = hs[pick(len(hs))]
			}
			got, err := b.Register(h.blk, h.hash, parent)
			s := &m.slots[h.blk.Slot]
			if s.state != Complete {
				wantErr(step, op, err, ErrInvalidTransition)
				break
			}
			if err != nil {
				fail(step, op, "%v", err)
			}
			owned = slices.Delete(owned, j, j+1)
			if e, ok := m.registry[h.hash]; ok {
				m.ref(e)
				m.reset(h.blk.Slot)
				if got != (Block{Slot: e, Generation: m.slots[e].gen}) {
					fail(step, op, "duplicate of hash %d returned %+v, want slot %d", h.hash, got, e)
				}
				refs = append(refs, held{blk: got, hash: h.hash})
				break
			}
			if got != h.blk {
				fail(step, op, "returned %+v, want %+v", got, h.blk)
			}
			s.state, s.hash, s.parent, s.users, s.pattern = Registered, h.hash, parent, 1, h.pattern
			if e, ok := m.registry[parent]; ok && parent != 0 {
				m.extends[h.blk.Slot] = e
			}
			m.registry[h.hash] = h.blk.Slot
			m.events = append(m.events, Event{Kind: EventStore, Set: b.ID(), Slot: h.blk.Slot, Hash: h.hash, Parent: parent})
			refs = append(refs, held{blk: got, hash: h.hash})
		case k < 46:
			op = "abort"
			if len(owned) > 0 && pick(4) > 0 {
				j := pick(len(owned))
				if err := b.Abort(owned[j].blk); err != nil {
					fail(step, op, "%v", err)
				}
				m.reset(owned[j].blk.Slot)
				owned = slices.Delete(owned, j, j+1)
			} else if len(refs) > 0 {
				wantErr(step, op, b.Abort(refs[pick(len(refs))].blk), ErrInvalidTransition)
			}
		case k < 56:
			op = "acquire"
			hash := uint64(pick(nhashes))
			got, ok := b.Acquire(hash)
			e, want := m.registry[hash]
			if ok != want {
				fail(step, op, "hash %d found %v, model %v", hash, ok, want)
			}
			if !ok {
				break
			}
			if got != (Block{Slot: e, Generation: m.slots[e].gen}) {
				fail(step, op, "hash %d: %+v, model slot %d gen %d", hash, got, e, m.slots[e].gen)
			}
			m.ref(e)
			checkPattern(step, op, e)
			refs = append(refs, held{blk: got, hash: hash})
		case k < 68:
			op = "release"
			if len(refs) == 0 {
				break
			}
			if pick(10) == 0 {
				// A handle from before the slot's last recycle.
				i := pick(nslots)
				if g := m.slots[i].gen; g > 0 {
					wantErr(step, op, b.Release(Block{Slot: i, Generation: g - 1}), ErrStaleBlock)
				}
				break
			}
			j := pick(len(refs))
			h := refs[j]
			if err := b.Release(h.blk); err != nil {
				fail(step, op, "%v", err)
			}
			refs = slices.Delete(refs, j, j+1)
			s := &m.slots[h.blk.Slot]
			s.users--
			if s.users == 0 && s.leases == 0 {
				m.lru = append(m.lru, h.blk.Slot)
			}
		case k < 76:
			op = "lease"
			hashes := make([]uint64, 1+pick(4))
			for i := range hashes {
				hashes[i] = uint64(pick(nhashes))
			}
			d := time.Duration(1+pick(10)) * time.Second
			id, got, err := b.Lease(hashes, d)
			if err != nil {
				fail(step, op, "%v", err)
			}
			var slots []int
			for i, h := range hashes {
				e, ok := m.registry[h]
				want := LeasedBlock{Hash: h}
				if ok {
					want = LeasedBlock{Hash: h, Found: true, Slot: e, Generation: m.slots[e].gen}
					slots = append(slots, e)
				}
				if got[i] != want {
					fail(step, op, "answer %d = %+v, want %+v", i, got[i], want)
				}
			}
			if len(slots) == 0 {
				if id != 0 {
					fail(step, op, "lease %#x made for absent hashes", id)
				}
				break
			}
			slices.Sort(slots)
			slots = slices.Compact(slots)
			for _, i := range slots {
				m.unlru(i)
				m.slots[i].leases++
				checkPattern(step, op, i)
			}
			m.leaseSeq++
			m.leases[id] = &mLease{seq: m.leaseSeq, deadline: now.Add(d), slots: slots}
			leaseIDs = append(leaseIDs, id)
		case k < 80:
			op = "renew"
			if len(leaseIDs) == 0 {
				break
			}
			id := leaseIDs[pick(len(leaseIDs))]
			d := time.Duration(1+pick(10)) * time.Second
			err := p.Renew(id, d)
			l := m.leases[id]
			switch {
			case l == nil:
				wantErr(step, op, err, ErrUnknownLease)
			case !now.Before(l.deadline):
				wantErr(step, op, err, ErrLeaseExpired)
				m.unpin(id)
				m.expired++
			default:
				if err != nil {
					fail(step, op, "%v", err)
				}
				l.deadline = now.Add(d)
			}
		case k < 86:
			op = "release lease"
			if len(leaseIDs) == 0 {
				break
			}
			id := leaseIDs[pick(len(leaseIDs))]
			valid, err := p.ReleaseLease(id)
			l := m.leases[id]
			if l == nil {
				if valid {
					fail(step, op, "unknown lease released as valid")
				}
				wantErr(step, op, err, ErrUnknownLease)
				break
			}
			want := now.Before(l.deadline)
			if err != nil || valid != want {
				fail(step, op, "= %v, %v; want %v", valid, err, want)
			}
			m.unpin(id)
			if !want {
				m.expired++
			}
		case k < 90:
			op = "advance clock"
			clock.Advance(time.Duration(pick(9)) * 500 * time.Millisecond)
		case k < 93:
			op = "expire"
			if got, want := p.ExpireLeases(), m.expireAll(now); got != want {
				fail(step, op, "reaped %d, model %d", got, want)
			}
		case k < 95:
			op = "evict"
			n := pick(4)
			if got, want := b.Evict(n), m.recycle(n, b.ID()); got != want {
				fail(step, op, "Evict(%d) = %d, model %d", n, got, want)
			}
		default:
			op = "check read"
			if len(leaseIDs) == 0 {
				break
			}
			id := leaseIDs[pick(len(leaseIDs))]
			st := lay.Strides()
			rank := pick(tp+2) - 1
			off := uint64(rng.Int64N(int64(st.Region + st.Block)))
			length := uint64(rng.Int64N(int64(3 * st.Block)))
			err := p.CheckRead(id, b.ID(), rank, off, length)
			l := m.leases[id]
			switch {
			case l == nil:
				wantErr(step, op, err, ErrUnknownLease)
			case rank < 0 || rank >= tp || length == 0:
				wantErr(step, op, err, ErrReadDenied)
			case !now.Before(l.deadline):
				wantErr(step, op, err, ErrLeaseExpired)
				m.unpin(id)
				m.expired++
			default:
				inside := true
				for pos := off; pos < off+length; pos++ {
					slot, ok := slotOf(lay, pos)
					if !ok || !slices.Contains(l.slots, slot) {
						inside = false
						break
					}
				}
				if inside != (err == nil) {
					fail(step, op, "[%d, +%d) rank %d of lease on %v: err = %v, model inside = %v",
						off, length, rank, l.slots, err, inside)
				}
				if err != nil {
					wantErr(step, op, err, ErrReadDenied)
				}
			}
		}
		compareModel(t, fail, step, op, b, m, nhashes)
	}
	p.Close()
	got, dropped := rec.events()
	if dropped != 0 || len(got) != len(m.events) {
		fail(steps, "events", "got %d (%d dropped), model %d", len(got), dropped, len(m.events))
	}
	for i := range got {
		want := m.events[i]
		want.Seq = uint64(i + 1)
		if got[i] != want {
			fail(steps, "events", "event %d = %+v, want %+v", i, got[i], want)
		}
	}
	return m
}

func compareModel(t *testing.T, fail func(int, string, string, ...any), step int, op string, b *BlockSet, m *refModel, nhashes int) {
	t.Helper()
	for i := range m.slots {
		got, err := b.Slot(i)
		if err != nil {
			fail(step, op, "%v", err)
		}
		s := m.slots[i]
		want := SlotInfo{State: s.state, Generation: s.gen, Hash: s.hash, Parent: s.parent,
			Users: s.users, Leases: s.leases, Inactive: slices.Contains(m.lru, i), Children: m.children(i)}
		if got != want {
			fail(step, op, "slot %d = %+v, model %+v", i, got, want)
		}
	}
	for h := range uint64(nhashes) {
		got, ok := b.Lookup(h)
		e, want := m.registry[h]
		if ok != want || (ok && got.Slot != e) {
			fail(step, op, "lookup %d = %+v %v, model slot %d %v", h, got, ok, e, want)
		}
	}
	mt := b.Metrics()
	leased := 0
	for _, s := range m.slots {
		if s.leases > 0 {
			leased++
		}
	}
	if mt.Free != len(m.free) || mt.Inactive != len(m.lru) || mt.Registered != len(m.registry) ||
		mt.Leased != leased || mt.Leases != len(m.leases) || mt.Evictions != m.evictions ||
		mt.LeasesExpired != m.expired || mt.Active != len(m.slots)-len(m.free)-len(m.lru) {
		fail(step, op, "metrics %+v; model free %d inactive %d registered %d leased %d leases %d evictions %d expired %d",
			mt, len(m.free), len(m.lru), len(m.registry), leased, len(m.leases), m.evictions, m.expired)
	}
}
