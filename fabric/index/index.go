// Package index is the global block index: which nodes hold which blocks,
// keyed by sequence hash, and how long a prefix of a request each node holds.
//
// An entry is a sequence hash and the set of its holders, kept as a bitset
// over small slots that the index hands out for node names; a [NodeID] is a
// slot and the generation of its occupant. Because a
// sequence hash names a whole prefix, a flat hash table answers prefix
// queries as well as a radix tree would: FindMatches walks the request's
// hashes in order, intersecting the holder sets, and stops at the first
// block that no remaining node holds. The table is split into shards, each
// behind its own lock, so that lookups and event application run
// concurrently. Each shard is an open-addressing table whose 16-byte slots
// hold a hash and the holder bits of nodes 0..63 (larger ids spill into a
// side map), because a lookup is one cache miss that way: FindMatches is
// bound by memory latency, not by computation.
//
// Routers rank nodes with [Rank], the overlap-minus-load score of Dynamo's
// KV router.
//
// A node may hold the same hash more than once (in several block sets, or
// pools of several tiers); the index counts the copies and keeps the node as
// a holder until the last copy is removed. The caller delivers each node's
// events exactly once and in order (package membership does), so the counts
// stay exact.
//
// # Node ids
//
// At most [MaxNodes] nodes are named at once. Dropping a node
// ([Index.DropNode]) is O(1): its id stops answering at once, and its
// entries stay in the table, invisible, until [Index.Sweep] removes the
// entries of every node dropped since the last sweep in one pass and frees
// their slots. A freed slot is handed to a new node with the next
// generation, so a stale NodeID never reads or writes its successor's
// holdings. Each id also carries the incarnation of the node's run
// ([Index.Node]): events of an older run than the indexed one are refused,
// and a newer run replaces the older one's entries.
//
// The index does no I/O and runs no goroutines: the agent feeds it events,
// drops nodes that membership declares dead and sweeps from a goroutine of
// its own. Entries live as long as their holder says it holds them.
package index

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
)

// NodeID is the index's name for one node: a slot below MaxNodes in the
// low 32 bits and the slot's generation, from 1, in the high 32, so that
// zero is never an id and an id is never reused. See [Index.ID].
type NodeID uint64

func newNodeID(slot int, gen uint32) NodeID { return NodeID(uint64(gen)<<32 | uint64(slot)) }

// slot is where the id's node sits in the holder bitsets.
func (id NodeID) slot() int { return int(uint32(id)) }

// ErrInvalidConfig is matched by every configuration error of [New].
var ErrInvalidConfig = errors.New("index: invalid config")

// Config configures an [Index].
type Config struct {
	// Shards is the number of independently locked shards, a power of two.
	// If zero, 64.
	Shards int
}

// DefaultConfig returns a Config with 64 shards.
func DefaultConfig() Config { return Config{Shards: 64} }

// MaxNodes bounds the nodes an index names at once; it keeps the holder
// bitsets and query scratch small. A dropped node's slot is reused once
// swept, so only the live nodes count.
const MaxNodes = 4096

// Index maps sequence hashes to holder sets. All methods are safe for
// concurrent use.
type Index struct {
	mask   uint64
	shards []shard

	mu      sync.RWMutex
	ids     map[string]NodeID // live names
	nodes   []nodeRec         // per slot; grows to MaxNodes
	free    []int             // swept slots, ready for a new node
	retired []NodeID          // dropped, entries not swept yet
	live    int
	pending atomic.Int64 // len(retired), read without the lock
	sweepMu sync.Mutex   // one sweep at a time

	// Per slot, fixed capacity MaxNodes, read without ix.mu: occ is the
	// live NodeID (zero when none), checked under a shard lock before every
	// write, which is what keeps a sweep exact; liveMask is occ != 0 as
	// bits, for queries; counts and digests are the occupant's pairs and
	// their digest terms, changed under the shard lock of the pair.
	occ      []atomic.Uint64
	liveMask [MaxNodes / 64]atomic.Uint64
	counts   []atomic.Int64
	digests  []atomic.Uint64
}

type nodeState uint8

const (
	slotFree nodeState = iota
	slotLive
	slotRetired
)

type nodeRec struct {
	name     string
	nameHash uint64
	inc      uint64 // the run's incarnation; 0 until known
	gen      uint32 // of the current or last occupant
	state    nodeState
}

type holderKey struct {
	hash uint64
	node NodeID
}

type shard struct {
	mu sync.RWMutex
	// t holds each hash's holders among ids 0..63; hi, the other words of
	// the hashes that have holders past 63 (absent in clusters of up to 64
	// nodes). A hash is present iff it is in t.
	t  table
	hi map[uint64][]uint64
	// multi counts copies beyond the first of a (hash, node) pair; most pairs
	// have one copy and no entry here.
	multi map[holderKey]uint32
	_     [64]byte // keep neighbouring shards' locks on separate cache lines
}

// holders is a bitset over NodeIDs: lo holds ids 0..63, hi[i] ids 64(i+1)..
type holders struct {
	lo uint64
	hi []uint64
}

func (h *holders) has(id int) bool {
	w := id / 64
	if w == 0 {
		return h.lo&(1<<(id%64)) != 0
	}
	return w-1 < len(h.hi) && h.hi[w-1]&(1<<(id%64)) != 0
}

func (h *holders) set(id int) {
	w := id / 64
	if w == 0 {
		h.lo |= 1 << (id % 64)
		return
	}
	// Copy on write: readers copy holders under the shard lock and read hi
	// after releasing it.
	hi := make([]uint64, max(len(h.hi), w))
	copy(hi, h.hi)
	hi[w-1] |= 1 << (id % 64)
	h.hi = hi
}

func (h *holders) clear(id int) {
	w := id / 64
	if w == 0 {
		h.lo &^= 1 << (id % 64)
		return
	}
	if w-1 < len(h.hi) {
		hi := slices.Clone(h.hi) // copy on write, see set
		hi[w-1] &^= 1 << (id % 64)
		h.hi = hi
	}
}

func (h *holders) empty() bool {
	if h.lo != 0 {
		return false
	}
	for _, w := range h.hi {
		if w != 0 {
			return false
		}
	}
	return true
}

func (h *holders) word(i int) uint64 {
	if i == 0 {
		return h.lo
	}
	if i-1 < len(h.hi) {
		return h.hi[i-1]
	}
	return 0
}

// get returns the holders of h; ok is false if no node holds it.
func (s *shard) get(h uint64) (hs holders, ok bool) {
	hs.lo, ok = s.t.get(h)
	if ok && len(s.hi) > 0 {
		hs.hi = s.hi[h]
	}
	return hs, ok
}

// put stores the holders of h, removing h when there are none.
func (s *shard) put(h uint64, hs holders) {
	if hs.empty() {
		s.t.del(h)
		delete(s.hi, h)
		return
	}
	s.t.set(h, hs.lo)
	if len(hs.hi) > 0 {
		s.hi[h] = hs.hi
	} else if len(s.hi) > 0 {
		delete(s.hi, h)
	}
}

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	if cfg.Shards == 0 {
		cfg.Shards = 64
	}
	if cfg.Shards < 0 || cfg.Shards&(cfg.Shards-1) != 0 || cfg.Shards > maxShards {
		return nil, fmt.Errorf("%w: Shards %d is not a power of two in [1, %d]", ErrInvalidConfig, cfg.Shards, maxShards)
	}
	ix := &Index{
		mask:    uint64(cfg.Shards - 1),
		shards:  make([]shard, cfg.Shards),
		ids:     make(map[string]NodeID),
		occ:     make([]atomic.Uint64, MaxNodes),
		counts:  make([]atomic.Int64, MaxNodes),
		digests: make([]atomic.Uint64, MaxNodes),
	}
	seed := rand.Uint64()
	for i := range ix.shards {
		s := &ix.shards[i]
		s.t = newTable(seed + uint64(i)*0x9e3779b97f4a7c15)
		s.hi = make(map[uint64][]uint64)
		s.multi = make(map[holderKey]uint32)
	}
	return ix, nil
}

// ErrTooManyNodes is returned by [Index.ID] past [MaxNodes] live names.
var ErrTooManyNodes = errors.New("index: too many nodes")

// ErrStaleIncarnation is returned by [Index.Node] for a run of a node older
// than the one indexed under its name.
var ErrStaleIncarnation = errors.New("index: stale incarnation")

// ErrUnknownNode is returned for a NodeID that is not live: never handed
// out, or dropped.
var ErrUnknownNode = errors.New("index: unknown node")

// ID returns the live id of a node name, naming it on first use (with
// incarnation 0, "not known yet"). A dropped name gets a new id.
func (ix *Index) ID(name string) (NodeID, error) { return ix.Node(name, 0) }

// Lookup returns the live id of name without naming it.
func (ix *Index) Lookup(name string) (NodeID, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	id, ok := ix.ids[name]
	return id, ok
}

// Node returns the id of the run inc of node name, naming it on first use.
// Incarnation 0 matches any run, and an id named with 0 takes the first
// incarnation asked for. A run newer than the indexed one drops the older
// run's id (its entries go with the next sweep) and names the new run; a
// run older than the indexed one is refused with ErrStaleIncarnation, so
// that a stale instance of a node never writes over the live one's
// holdings. Past MaxNodes live names, ErrTooManyNodes; also when every
// slot is live or waiting for a sweep: Node never sweeps (it runs inside
// membership's callbacks, and a sweep is a pass over the whole index that
// waits behind any sweep under way), so the caller runs [Index.Sweep], or
// wakes whoever does, and asks again. [Index.Pending] > 0 tells the two
// cases apart.
func (ix *Index) Node(name string, inc uint64) (NodeID, error) {
	ix.mu.RLock()
	id, ok := ix.ids[name]
	if ok {
		if have := ix.nodes[id.slot()].inc; inc == 0 || have == inc {
			ix.mu.RUnlock()
			return id, nil
		}
	}
	ix.mu.RUnlock()
	return ix.name(name, inc)
}

// name is Node under the write lock.
func (ix *Index) name(name string, inc uint64) (NodeID, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if id, ok := ix.ids[name]; ok {
		r := &ix.nodes[id.slot()]
		switch {
		case inc == 0 || r.inc == inc:
			return id, nil
		case r.inc == 0:
			r.inc = inc
			return id, nil
		case inc < r.inc:
			return 0, fmt.Errorf("%w: %q run %d, the index holds run %d", ErrStaleIncarnation, name, inc, r.inc)
		}
		ix.retireLocked(id) // a restart: the old run's blocks went with it
	}
	if ix.live >= MaxNodes {
		return 0, fmt.Errorf("%w: %d live names already, cannot add %q", ErrTooManyNodes, MaxNodes, name)
	}
	var slot int
	switch {
	case len(ix.free) > 0:
		slot = ix.free[len(ix.free)-1]
		ix.free = ix.free[:len(ix.free)-1]
	case len(ix.nodes) < MaxNodes:
		slot = len(ix.nodes)
		ix.nodes = append(ix.nodes, nodeRec{})
	default:
		return 0, fmt.Errorf("%w: every slot is live or waiting for a sweep, cannot add %q", ErrTooManyNodes, name)
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	r := &ix.nodes[slot]
	if r.gen++; r.gen == 0 { // after 2^32 nodes in one slot: 0 is no id
		r.gen = 1
	}
	*r = nodeRec{name: name, nameHash: h.Sum64(), inc: inc, gen: r.gen, state: slotLive}
	id := newNodeID(slot, r.gen)
	ix.ids[name] = id
	ix.live++
	ix.occ[slot].Store(uint64(id))
	ix.liveMask[slot/64].Or(1 << (slot % 64))
	return id, nil
}

// retireLocked drops a live id: it answers no more, and the next sweep
// removes its entries. ix.mu is held.
func (ix *Index) retireLocked(id NodeID) {
	slot := id.slot()
	r := &ix.nodes[slot]
	r.state = slotRetired
	delete(ix.ids, r.name)
	ix.live--
	ix.occ[slot].Store(0)
	ix.liveMask[slot/64].And(^uint64(1 << (slot % 64)))
	ix.retired = append(ix.retired, id)
	ix.pending.Add(1)
}

// Name returns the name of id, or "" if id is not live.
func (ix *Index) Name(id NodeID) string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if s := id.slot(); s < len(ix.nodes) && ix.occ[s].Load() == uint64(id) {
		return ix.nodes[s].name
	}
	return ""
}

// Incarnation returns the run of node id that the index holds, 0 if not
// known, and whether id is live.
func (ix *Index) Incarnation(id NodeID) (uint64, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if s := id.slot(); s < len(ix.nodes) && ix.occ[s].Load() == uint64(id) {
		return ix.nodes[s].inc, true
	}
	return 0, false
}

// isLive reports whether id is its slot's live occupant.
func (ix *Index) isLive(id NodeID) bool {
	s := id.slot()
	return s < MaxNodes && id != 0 && ix.occ[s].Load() == uint64(id)
}

// nameHashOf returns the digest hash of id's name, and whether id is live.
func (ix *Index) nameHashOf(id NodeID) (uint64, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if s := id.slot(); s < len(ix.nodes) && ix.occ[s].Load() == uint64(id) {
		return ix.nodes[s].nameHash, true
	}
	return 0, false
}

func (ix *Index) shardOf(hash uint64) *shard {
	// Sequence hashes are xxh3 outputs, so their low bits are uniform; the
	// map hashes the key again anyway.
	return &ix.shards[hash&ix.mask]
}

// mix spreads a (hash, node) pair for the order-independent digest.
func mix(hash, node uint64) uint64 {
	x := hash ^ (node * 0x9e3779b97f4a7c15)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// Store records that node id holds one more copy of each hash. It fails
// with ErrUnknownNode, having stored a prefix of hashes, if id is dropped
// meanwhile.
func (ix *Index) Store(id NodeID, hashes ...uint64) error {
	nh, ok := ix.nameHashOf(id)
	if !ok {
		return fmt.Errorf("%w: %#x", ErrUnknownNode, uint64(id))
	}
	slot := id.slot()
	for _, h := range hashes {
		s := ix.shardOf(h)
		s.mu.Lock()
		// Checked under the shard lock: a sweep that started after the
		// drop takes this lock after us, and sees what we write.
		if !ix.isLive(id) {
			s.mu.Unlock()
			return fmt.Errorf("%w: %#x was dropped", ErrUnknownNode, uint64(id))
		}
		hs, _ := s.get(h)
		k := holderKey{h, id}
		if hs.has(slot) {
			s.multi[k]++
		} else {
			hs.set(slot)
			s.put(h, hs)
			ix.counts[slot].Add(1)
			ix.digests[slot].Add(mix(h, nh))
		}
		s.mu.Unlock()
	}
	return nil
}

// Remove records that node id holds one copy fewer of each hash; the node
// stops being a holder when its last copy goes. Removing a hash the node does
// not hold is not an error: a remove may race a sweep. A dropped id is
// ErrUnknownNode: the sweep removes its entries.
func (ix *Index) Remove(id NodeID, hashes ...uint64) error {
	nh, ok := ix.nameHashOf(id)
	if !ok {
		return fmt.Errorf("%w: %#x", ErrUnknownNode, uint64(id))
	}
	for _, h := range hashes {
		s := ix.shardOf(h)
		s.mu.Lock()
		if !ix.isLive(id) {
			s.mu.Unlock()
			return fmt.Errorf("%w: %#x was dropped", ErrUnknownNode, uint64(id))
		}
		ix.removeLocked(s, h, id, nh, false)
		s.mu.Unlock()
	}
	return nil
}

// removeLocked drops one copy (or every copy, if all) of (h, id) and reports
// whether the node stopped being a holder. The shard's lock is held.
func (ix *Index) removeLocked(s *shard, h uint64, id NodeID, nameHash uint64, all bool) bool {
	slot := id.slot()
	hs, ok := s.get(h)
	if !ok || !hs.has(slot) {
		return false
	}
	k := holderKey{h, id}
	if n := s.multi[k]; n > 0 && !all {
		if n == 1 {
			delete(s.multi, k)
		} else {
			s.multi[k] = n - 1
		}
		return false
	}
	delete(s.multi, k)
	hs.clear(slot)
	s.put(h, hs)
	ix.counts[slot].Add(-1)
	ix.digests[slot].Add(-mix(h, nameHash))
	return true
}

// DropNode drops node id, as when it dies, leaves or restarts: at once it
// holds nothing in any answer and its name is free for a new id; its
// entries are removed by the next [Index.Sweep]. It is O(1), so that it can
// run inside membership's callbacks. Dropping an id that is not live does
// nothing.
func (ix *Index) DropNode(id NodeID) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if id.slot() < len(ix.nodes) && ix.occ[id.slot()].Load() == uint64(id) {
		ix.retireLocked(id)
	}
}

// DropName drops the live id of name, if any, as DropNode does, and
// reports whether there was one.
func (ix *Index) DropName(name string) bool {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	id, ok := ix.ids[name]
	if ok {
		ix.retireLocked(id)
	}
	return ok
}

// Pending returns how many dropped nodes wait for a sweep.
func (ix *Index) Pending() int { return int(ix.pending.Load()) }

// Sweep removes the entries of every node dropped since the last sweep, in
// one pass over the index, one shard at a time, and frees their slots for
// new nodes. It returns how many nodes it swept. Sweeps run one at a time;
// queries and events go on meanwhile.
func (ix *Index) Sweep() int {
	ix.sweepMu.Lock()
	defer ix.sweepMu.Unlock()
	ix.mu.Lock()
	ids := ix.retired
	ix.retired = nil
	names := make(map[int]uint64, len(ids))
	for _, id := range ids {
		names[id.slot()] = ix.nodes[id.slot()].nameHash
	}
	ix.mu.Unlock()
	if len(ids) == 0 {
		return 0
	}
	var mask [MaxNodes / 64]uint64
	bySlot := make(map[int]NodeID, len(ids))
	for _, id := range ids {
		mask[id.slot()/64] |= 1 << (id.slot() % 64)
		bySlot[id.slot()] = id
	}
	type hit struct {
		h    uint64
		slot int
	}
	var hits []hit
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		// Collect first: removing shifts slots under the iteration.
		hits = hits[:0]
		s.t.each(func(h, lo uint64) {
			hs := holders{lo: lo, hi: s.hi[h]}
			for w := 0; w <= len(hs.hi); w++ {
				for x := hs.word(w) & mask[w]; x != 0; x &= x - 1 {
					hits = append(hits, hit{h, w*64 + bits.TrailingZeros64(x)})
				}
			}
		})
		for _, e := range hits {
			ix.removeLocked(s, e.h, bySlot[e.slot], names[e.slot], true)
		}
		s.mu.Unlock()
	}
	ix.mu.Lock()
	for _, id := range ids {
		slot := id.slot()
		ix.nodes[slot].state = slotFree
		ix.free = append(ix.free, slot)
	}
	ix.pending.Add(-int64(len(ids)))
	ix.mu.Unlock()
	return len(ids)
}

// Holders returns the live nodes holding hash, in slot order.
func (ix *Index) Holders(hash uint64) []NodeID {
	s := ix.shardOf(hash)
	s.mu.RLock()
	defer s.mu.RUnlock()
	hs, ok := s.get(hash)
	if !ok {
		return nil
	}
	var out []NodeID
	for w := 0; w <= len(hs.hi); w++ {
		for x := hs.word(w); x != 0; x &= x - 1 {
			if id := ix.idAt(w*64 + bits.TrailingZeros64(x)); id != 0 {
				out = append(out, id)
			}
		}
	}
	return out
}

// idAt returns the live id in slot, zero if none.
func (ix *Index) idAt(slot int) NodeID { return NodeID(ix.occ[slot].Load()) }

// Match is one node's overlap with a query: it holds the first Blocks hashes.
type Match struct {
	Node   NodeID
	Blocks int
}

// FindMatches returns, for every live node holding at least the first hash,
// how many leading hashes of the query it holds, longest first (ties in slot
// order). It stops at the first hash that none of the remaining nodes holds.
// A node dropped during the query may be left out of the answer.
func (ix *Index) FindMatches(hashes []uint64) []Match {
	return ix.AppendMatches(nil, hashes)
}

// AppendMatches is [Index.FindMatches] appending to dst, for callers that
// reuse a buffer.
func (ix *Index) AppendMatches(dst []Match, hashes []uint64) []Match {
	if len(hashes) == 0 {
		return dst
	}
	start := len(dst)
	// The active set: nodes that held every hash so far. Most clusters fit
	// the first word, so the scratch lives on the stack.
	var buf [MaxNodes / 64]uint64
	active := buf[:0]
	// Lookups go in groups: first the group's shards are read-locked (each
	// once, in ascending order, released at the end of the group), then the
	// group's hashes are looked up with no atomic operation in between, so
	// that their cache misses overlap instead of queueing behind each lock's
	// barrier. At most a group's worth of lookups is wasted past the first
	// miss. Locks are never held from one group to the next: two queries
	// holding shards in opposite orders, each waiting behind a writer on the
	// other's shard, would deadlock.
	var locked [maxShards / 64]uint64
	var group [lookupGroup]holders
	for base := 0; base < len(hashes); base += lookupGroup {
		chunk := hashes[base:min(base+lookupGroup, len(hashes))]
		for _, h := range chunk {
			si := h & ix.mask
			locked[si/64] |= 1 << (si % 64)
		}
		ix.lockAll(&locked)
		for j, h := range chunk {
			group[j], _ = ix.shards[h&ix.mask].get(h)
		}
		for j := range chunk {
			hs := &group[j]
			i := base + j
			if i == 0 {
				if hs.lo == 0 && len(hs.hi) == 0 {
					ix.unlockAll(&locked)
					return dst
				}
				// Dropped nodes' entries wait for a sweep: not holders.
				active = buf[:1+len(hs.hi)]
				any := uint64(0)
				for w := range active {
					active[w] = hs.word(w) & ix.liveMask[w].Load()
					any |= active[w]
				}
				if any == 0 {
					ix.unlockAll(&locked)
					return dst
				}
				continue
			}
			any := uint64(0)
			for w := range active {
				next := active[w] & hs.word(w)
				for lost := active[w] &^ next; lost != 0; lost &= lost - 1 {
					if id := ix.idAt(w*64 + bits.TrailingZeros64(lost)); id != 0 {
						dst = append(dst, Match{Node: id, Blocks: i})
					}
				}
				active[w] = next
				any |= next
			}
			if any == 0 {
				ix.unlockAll(&locked)
				return sortMatches(dst, start)
			}
		}
		ix.unlockAll(&locked)
	}
	for w := range active {
		for x := active[w]; x != 0; x &= x - 1 {
			if id := ix.idAt(w*64 + bits.TrailingZeros64(x)); id != 0 {
				dst = append(dst, Match{Node: id, Blocks: len(hashes)})
			}
		}
	}
	return sortMatches(dst, start)
}

// lookupGroup is how many hashes FindMatches looks up before intersecting.
const lookupGroup = 32

// lockAll read-locks the shards marked in locked, in ascending order.
func (ix *Index) lockAll(locked *[maxShards / 64]uint64) {
	for w, bits64 := range locked {
		for x := bits64; x != 0; x &= x - 1 {
			ix.shards[w*64+bits.TrailingZeros64(x)].mu.RLock()
		}
	}
}

// unlockAll releases the shards marked in locked and clears the marks.
func (ix *Index) unlockAll(locked *[maxShards / 64]uint64) {
	for w, bits64 := range locked {
		for x := bits64; x != 0; x &= x - 1 {
			ix.shards[w*64+bits.TrailingZeros64(x)].mu.RUnlock()
		}
		locked[w] = 0
	}
}

// maxShards bounds Config.Shards, so that FindMatches can track the shards
// it holds in a small bitset.
const maxShards = 256

func sortMatches(dst []Match, start int) []Match {
	out := dst[start:]
	// Nodes were appended shortest match first and by id within a length;
	// reverse the groups so the longest comes first.
	slices.SortStableFunc(out, func(a, b Match) int { return b.Blocks - a.Blocks })
	return dst
}

// Metrics is a snapshot of the index's size.
type Metrics struct {
	// Hashes is the number of distinct sequence hashes in the table,
	// counting those only dropped nodes hold until they are swept.
	Hashes int
	// Pairs is the number of (hash, holder) pairs of live nodes.
	Pairs int64
	// Nodes is the number of live node names.
	Nodes int
	// Pending is the dropped nodes whose entries wait for a sweep.
	Pending int
}

// Metrics returns the index's current size.
func (ix *Index) Metrics() Metrics {
	var st Metrics
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.RLock()
		st.Hashes += s.t.len()
		s.mu.RUnlock()
	}
	ix.mu.RLock()
	st.Nodes = ix.live
	st.Pending = len(ix.retired)
	for _, id := range ix.ids {
		st.Pairs += ix.counts[id.slot()].Load()
	}
	ix.mu.RUnlock()
	return st
}

// NodeBlocks returns how many distinct hashes node id holds; 0 if id is not
// live.
func (ix *Index) NodeBlocks(id NodeID) int64 {
	if !ix.isLive(id) {
		return 0
	}
	return ix.counts[id.slot()].Load()
}

// Digest is an order-independent checksum of the (hash, holder name) pairs
// present; two indexes with the same pairs have the same digest whatever the
// order of events or the ids they gave the names.
func (ix *Index) Digest() uint64 {
	var d uint64
	ix.mu.RLock()
	for _, id := range ix.ids {
		d += ix.digests[id.slot()].Load()
	}
	ix.mu.RUnlock()
	return d
}
