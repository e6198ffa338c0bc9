package index

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// The owned-slices index moves a node's events to its hashes' owners in
// streams: per origin run and owner, an ordered list of ops, each numbered,
// that the owner applies once and in order to its slice. An owner that
// cannot continue a stream (a gap, its own restart, the origin dropped
// meanwhile) asks for a replace: the origin's whole holdings that the owner
// owns, sent afresh as the stream's new start. When the member list changes
// the origin sends each owner the hashes it gained (stores) and lost
// (forgets), and a member new to the list gets a replace, so that once the
// members agree on the list every owner's slice holds exactly the live
// holders of the hashes it owns. [Publisher] is the origin's side, [Slice]
// the owner's; the caller moves calls between them (the agent over its
// peer connections, the simulation in memory) and runs the clocks.

// Op kinds.
const (
	OpStore  = 1 // one more copy of the hash
	OpRemove = 2 // one copy fewer
	OpForget = 3 // every copy: the owner no longer owns the hash
	// OpStoreDisk and OpRemoveDisk are OpStore and OpRemove of a copy
	// on a lower tier (disk), so that an importer prefers holders with
	// the block in memory.
	OpStoreDisk  = 4
	OpRemoveDisk = 5
)

// MaxOpKind is the highest op kind.
const MaxOpKind = OpRemoveDisk

// Op is one event of a stream.
type Op struct {
	Kind uint8
	Hash uint64
}

// OpsCall is one call of a stream: Ops numbered from First, of the
// origin's run Inc; Replace says the first op starts the stream afresh.
type OpsCall struct {
	Inc, First uint64
	Replace    bool
	Ops        []Op
}

// MaxOpsPerCall bounds the ops of one call.
const MaxOpsPerCall = 1 << 14

// MaxQueuedOps bounds the ops queued for one owner; past it the queue is
// dropped and the owner gets a replace instead.
const MaxQueuedOps = 1 << 18

// MaxReplicas is the most owners a hash may have in a stream: placements
// are asked without allocating up to this many.
const MaxReplicas = 8

// Publisher is an origin's side of the streams: it keeps the origin's
// holdings and, per owner, the ops not yet delivered. Safe for concurrent
// use.
type Publisher struct {
	self     string
	replicas int

	mu    sync.Mutex
	place *Placement
	held  map[uint64]uint32 // copies per hash
	disk  map[uint64]uint32 // of them, copies on a lower tier
	out   map[string]*outStream
	// unused is, per owner whose stream ended (it left the member list),
	// the first op number not used: a stream to it that starts again
	// continues the numbering, so that an owner that kept the old stream
	// (it never saw this node go) takes the new start for what it is.
	unused map[string]uint64
	// probe is how long a stream may stay silent before an empty call
	// checks that the owner still holds it.
	probe time.Duration

	// Replaces counts the replaces built, Moved the ops queued by member
	// list changes, handoffs the member list changes that moved any.
	replaces, moved, handoffs int64
}

type outStream struct {
	base      uint64 // the number of ops[0]
	ops       []Op
	replace   bool   // a replace is pending, built when next sent
	replaceAt uint64 // the op that carries the replace flag, 0 if none
	busy      bool   // a call is out
	retryAt   time.Time
	failures  int
	lastSent  time.Time
}

// reset drops the queued ops for a replace. Their numbers are not used
// again, so that the answer to a call out does not take ops queued after
// the reset for its own.
func (st *outStream) reset() {
	st.base += uint64(len(st.ops))
	st.ops, st.replace, st.replaceAt = nil, true, 0
}

// DefaultProbe is how long a stream stays silent before the publisher
// checks it with an empty call: an owner that dropped this node (it saw
// it fail, and come back) asks for a replace only when called.
const DefaultProbe = 5 * time.Second

// NewPublisher returns the side of origin self, with replicas owners a
// hash (clamped to [1, MaxReplicas]), probing silent streams every probe
// (if zero, DefaultProbe).
func NewPublisher(self string, replicas int, probe time.Duration) *Publisher {
	if probe <= 0 {
		probe = DefaultProbe
	}
	return &Publisher{self: self, replicas: max(1, min(replicas, MaxReplicas)), held: map[uint64]uint32{}, disk: map[uint64]uint32{},
		out: map[string]*outStream{}, unused: map[string]uint64{}, probe: probe}
}

// Placement returns the current placement, nil before SetMembers.
func (p *Publisher) Placement() *Placement {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.place
}

// Held returns how many distinct hashes the origin holds.
func (p *Publisher) Held() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.held)
}

// Copies returns the copies of hash the origin holds, and of those how
// many on a lower tier (disk): what its owners are told.
func (p *Publisher) Copies(hash uint64) (held, disk int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int(p.held[hash]), int(p.disk[hash])
}

// Store records one more copy of each hash and queues it for the owners;
// Remove one copy fewer (a hash not held is ignored). They report whether
// an op was queued.
func (p *Publisher) Store(hashes ...uint64) bool { return p.event(OpStore, hashes) }

// Remove: see Store.
func (p *Publisher) Remove(hashes ...uint64) bool { return p.event(OpRemove, hashes) }

// StoreDisk and RemoveDisk are Store and Remove of copies on a lower tier
// (disk): the owners tell importers that the origin holds them on disk.
func (p *Publisher) StoreDisk(hashes ...uint64) bool { return p.event(OpStoreDisk, hashes) }

// RemoveDisk: see StoreDisk.
func (p *Publisher) RemoveDisk(hashes ...uint64) bool { return p.event(OpRemoveDisk, hashes) }

func (p *Publisher) event(kind uint8, hashes []uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var owners [MaxReplicas]string
	queued := false
	for _, h := range hashes {
		switch kind {
		case OpRemove, OpRemoveDisk:
			// A remove of a copy of a tier the hash has none of is
			// ignored, as one of a hash not held.
			mem := p.held[h] - p.disk[h]
			if (kind == OpRemove && mem == 0) || (kind == OpRemoveDisk && p.disk[h] == 0) {
				continue
			}
			if kind == OpRemoveDisk {
				if p.disk[h]--; p.disk[h] == 0 {
					delete(p.disk, h)
				}
			}
			if p.held[h]--; p.held[h] == 0 {
				delete(p.held, h)
			}
		case OpStoreDisk:
			p.disk[h]++
			p.held[h]++
		default:
			p.held[h]++
		}
		if p.place == nil {
			continue
		}
		for _, w := range p.place.AppendOwners(owners[:0], h) {
			p.queueLocked(w, Op{kind, h})
			queued = true
		}
	}
	return queued
}

// Reset replaces the holdings with hashes (a hash once per copy), as after
// the origin lost track of its events, and has every owner sent them
// afresh.
func (p *Publisher) Reset(hashes []uint64) { p.ResetTiers(hashes, nil) }

// ResetTiers is Reset of holdings in memory (mem) and on a lower tier
// (disk).
func (p *Publisher) ResetTiers(mem, disk []uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	clear(p.held)
	clear(p.disk)
	for _, h := range mem {
		p.held[h]++
	}
	for _, h := range disk {
		p.held[h]++
		p.disk[h]++
	}
	for _, st := range p.out {
		st.reset()
	}
}

func (p *Publisher) queueLocked(w string, op Op) {
	st := p.out[w]
	if st == nil || st.replace {
		return // a replace pending covers it
	}
	if len(st.ops) >= MaxQueuedOps {
		st.reset()
		return
	}
	st.ops = append(st.ops, op)
}

// SetMembers moves the origin's part of the index to the owners under
// members: an owner that gains a hash the origin holds gets its copies,
// one that loses it is told to forget it, and a member new to the list
// gets a replace. It reports false if the list is the current one.
func (p *Publisher) SetMembers(members []string) bool {
	next := NewPlacement(members, p.replicas)
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.place
	if old != nil && slices.Equal(old.Members(), next.Members()) {
		return false
	}
	p.place = next
	for w, st := range p.out {
		if !slices.Contains(next.Members(), w) {
			delete(p.out, w) // gone: its slice went with it
			p.unused[w] = st.base + uint64(len(st.ops)) + 1
		}
	}
	for _, w := range next.Members() {
		if p.out[w] == nil {
			p.out[w] = &outStream{base: max(1, p.unused[w]), replace: true}
		}
	}
	if old == nil {
		return true
	}
	var was, now [MaxReplicas]string
	moved := p.moved
	defer func() {
		if p.moved > moved {
			p.handoffs++
		}
	}()
	for h, copies := range p.held {
		before := old.AppendOwners(was[:0], h)
		after := next.AppendOwners(now[:0], h)
		for _, w := range after {
			if !slices.Contains(before, w) {
				for i := range copies {
					p.queueLocked(w, p.copyOp(h, i))
					p.moved++
				}
			}
		}
		for _, w := range before {
			if !slices.Contains(after, w) {
				p.queueLocked(w, Op{OpForget, h})
				p.moved++
			}
		}
	}
	return true
}

// copyOp is the op that stores copy i of hash h: its disk copies are the
// last. p.mu is held.
func (p *Publisher) copyOp(h uint64, i uint32) Op {
	if i >= p.held[h]-p.disk[h] {
		return Op{OpStoreDisk, h}
	}
	return Op{OpStore, h}
}

// Outgoing is a call to send to Owner.
type Outgoing struct {
	Owner string
	Call  OpsCall
	st    *outStream // the stream it was made for
}

// Next returns the calls due at now, one per owner that has ops (or a
// replace) pending and no call out, and marks them out: the caller sends
// each and reports its outcome with Done. inc is the origin's run.
func (p *Publisher) Next(now time.Time, inc uint64) []Outgoing {
	p.mu.Lock()
	defer p.mu.Unlock()
	due := func(st *outStream) bool { return !st.busy && !now.Before(st.retryAt) }
	// Replaces are built in one pass over the holdings, however many
	// owners wait for one (after a partition heals, half the members):
	// finding a hash's owners is O(members).
	replacing := map[string]*outStream{}
	for w, st := range p.out {
		if st.replace && due(st) {
			// No op queues behind a pending replace: it starts the
			// stream, with the holdings the owner owns.
			st.replace, st.replaceAt = false, st.base
			replacing[w] = st
			p.replaces++
		}
	}
	if len(replacing) > 0 {
		var owners [MaxReplicas]string
		for h, copies := range p.held {
			for _, w := range p.place.AppendOwners(owners[:0], h) {
				if st := replacing[w]; st != nil {
					for i := range copies {
						st.ops = append(st.ops, p.copyOp(h, i))
					}
				}
			}
		}
	}
	var out []Outgoing
	for w, st := range p.out {
		if !due(st) {
			continue
		}
		if len(st.ops) == 0 && st.replaceAt != st.base && now.Sub(st.lastSent) < p.probe {
			continue
		}
		n := min(len(st.ops), MaxOpsPerCall)
		st.busy, st.lastSent = true, now
		out = append(out, Outgoing{Owner: w, Call: OpsCall{Inc: inc, First: st.base, Replace: st.replaceAt == st.base,
			Ops: slices.Clone(st.ops[:n])}, st: st})
	}
	return out
}

// Outcome is how a call ended.
type Outcome int

const (
	Applied Outcome = iota // the owner applied the call
	Replace                // the owner asks for a replace
	Failed                 // not delivered: try again later
)

// Done records the outcome of a call Next returned, and reports whether
// more is pending for its owner.
func (p *Publisher) Done(o Outgoing, outcome Outcome, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.out[o.Owner]
	if st == nil || st != o.st {
		return false // the member left meanwhile (and perhaps came back)
	}
	st.busy = false
	switch outcome {
	case Failed:
		st.failures++
		st.retryAt = now.Add(min(time.Duration(st.failures)*50*time.Millisecond, time.Second))
		return false
	case Replace:
		st.reset()
		st.failures = 0
	case Applied:
		// Ops may have been dropped for a replace meanwhile.
		if st.base == o.Call.First {
			st.ops = st.ops[len(o.Call.Ops):]
			st.base += uint64(len(o.Call.Ops))
		}
		if st.replaceAt == o.Call.First {
			st.replaceAt = 0
		}
		st.failures = 0
	}
	return len(st.ops) > 0 || st.replace
}

// PublisherStats counts what a publisher did.
type PublisherStats struct {
	Replaces, Moved int64 // replaces built; ops queued by member changes
	Queued          int64 // ops waiting now
	// Handoffs counts the member list changes that moved any of the
	// origin's hashes to other owners.
	Handoffs int64
}

// Stats returns the publisher's counts.
func (p *Publisher) Stats() PublisherStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := PublisherStats{Replaces: p.replaces, Moved: p.moved, Handoffs: p.handoffs}
	for _, st := range p.out {
		s.Queued += int64(len(st.ops))
	}
	return s
}

// Slice is an owner's side of the streams: it applies origins' calls to
// the owner's index, each op once and in order. Safe for concurrent use.
type Slice struct {
	ix *Index
	// drop forgets every entry of an origin (the agent's sink also wakes
	// its sweeper).
	drop func(origin string)

	mu sync.Mutex
	in map[string]*inStream

	disk DiskCopies
}

type inStream struct {
	mu   sync.Mutex
	inc  uint64
	id   NodeID // the index id the stream's ops went to
	next uint64 // the number of the next op expected
}

// NewSlice returns the owner side over ix; drop forgets an origin's
// entries (if nil, ix.DropName).
func NewSlice(ix *Index, drop func(origin string)) *Slice {
	if drop == nil {
		drop = func(o string) { ix.DropName(o) }
	}
	return &Slice{ix: ix, drop: drop, in: map[string]*inStream{}}
}

// ErrReplaceNeeded is returned by [Slice.Apply] when the stream cannot be
// continued: the origin must send a replace.
var ErrReplaceNeeded = errors.New("index: replace needed")

// Apply applies a call of origin's stream and returns how many ops it
// applied (those already applied are skipped); ErrReplaceNeeded where it
// cannot continue the stream, and ErrTooManyNodes where the index has no
// slot for the origin (try again later). Where the origin holds the most
// hashes the index keeps for one node ([Config].MaxNodeBlocks), its stores
// of hashes it does not hold already are taken as applied but not stored,
// and Apply returns the whole call's count with ErrNodeFull.
func (s *Slice) Apply(origin string, c OpsCall) (int, error) {
	s.mu.Lock()
	st := s.in[origin]
	if st == nil {
		st = &inStream{}
		s.in[origin] = st
	}
	s.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	// The stream holds while the index still has the id its ops went to:
	// the origin may have been dropped (it failed), and named afresh.
	cur, ok := s.ix.Lookup(origin)
	if ok {
		if inc, _ := s.ix.Incarnation(cur); inc > c.Inc {
			return 0, nil // an older run's: it is gone
		}
	}
	valid := st.id != 0 && ok && cur == st.id && st.inc == c.Inc
	if valid && !c.Replace && c.First > st.next {
		return 0, ErrReplaceNeeded // a gap
	}
	ops := c.Ops
	switch {
	case c.Replace && !(valid && c.First < st.next):
		s.drop(origin)
		id, err := s.ix.Node(origin, c.Inc)
		if errors.Is(err, ErrStaleIncarnation) {
			return 0, nil
		}
		if err != nil {
			st.id = 0
			return 0, err
		}
		st.id, st.inc, st.next = id, c.Inc, c.First
	case !valid:
		st.id = 0
		return 0, ErrReplaceNeeded
	default:
		skip := st.next - c.First // a retry may repeat ops applied
		if skip >= uint64(len(ops)) {
			return 0, nil
		}
		ops = ops[skip:]
	}
	refused := 0
	for i, op := range ops {
		var err error
		switch op.Kind {
		case OpStore, OpStoreDisk:
			err = s.ix.Store(st.id, op.Hash)
		case OpRemove, OpRemoveDisk:
			err = s.ix.Remove(st.id, op.Hash)
		case OpForget:
			err = s.ix.Forget(st.id, op.Hash)
		}
		if errors.Is(err, ErrNodeFull) {
			// Not stored, and the stream goes on: the slice holds fewer
			// of the origin's copies than it has, never more (a remove
			// of a hash not held is ignored), and a replace would only
			// fill it up to the bound again.
			refused++
			st.next++
			continue
		}
		if err != nil {
			st.id = 0 // dropped meanwhile
			return i, ErrReplaceNeeded
		}
		switch op.Kind {
		case OpStoreDisk:
			s.disk.Store(s.ix, st.id, op.Hash)
		case OpRemoveDisk:
			s.disk.Remove(st.id, op.Hash)
		case OpForget:
			s.disk.Forget(st.id, op.Hash)
		}
		st.next++
	}
	if refused > 0 {
		return len(ops), fmt.Errorf("%w: %d stores of %q refused", ErrNodeFull, refused, origin)
	}
	return len(ops), nil
}

// Forget forgets the stream of origin, as when it leaves.
func (s *Slice) Forget(origin string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.in, origin)
}

// Holder is a holder of a hash, by name, and whether it holds the hash on
// a lower tier (disk) only.
type Holder struct {
	Name     string
	DiskOnly bool
}

// HolderTiers returns the holders of each hash in the slice, with their
// tiers.
func (s *Slice) HolderTiers(hashes []uint64) [][]Holder {
	out := make([][]Holder, len(hashes))
	for i, h := range hashes {
		ids := s.ix.Holders(h)
		hs := make([]Holder, 0, len(ids))
		for _, id := range ids {
			if n := s.ix.Name(id); n != "" {
				hs = append(hs, Holder{Name: n, DiskOnly: s.disk.DiskOnly(s.ix, id, h)})
			}
		}
		out[i] = hs
	}
	return out
}

// Holders returns the holder names of each hash in the slice.
func (s *Slice) Holders(hashes []uint64) [][]string {
	out := make([][]string, len(hashes))
	for i, h := range hashes {
		ids := s.ix.Holders(h)
		names := make([]string, 0, len(ids))
		for _, id := range ids {
			if n := s.ix.Name(id); n != "" {
				names = append(names, n)
			}
		}
		out[i] = names
	}
	return out
}
