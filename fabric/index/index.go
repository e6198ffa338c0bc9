// Package index is the global block index: which nodes hold which blocks,
// keyed by sequence hash, and how long a prefix of a request each node holds.
//
// An entry is a sequence hash and the set of its holders, kept over small
// slots that the index hands out for node names; a [NodeID] is a
// slot and the generation of its occupant. Because a
// sequence hash names a whole prefix, a flat hash table answers prefix
// queries as well as a radix tree would: FindMatches walks the request's
// hashes in order, intersecting the holder sets, and stops at the first
// block that no remaining node holds. The table is split into shards, each
// behind its own lock, so that lookups and event application run
// concurrently. Each shard is an open-addressing table whose 12-byte slots
// hold a hash and a word that is its holder set (a bitset of small slots,
// or up to two slots of any size; longer sets spill into a per-shard arena
// of sorted lists), because a lookup is one cache miss that way
// (FindMatches is bound by memory latency, not by computation) and because
// in a large cluster most hashes have one or two holders: a pair costs
// about 16 bytes, not the width of a bitset over every node.
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
// One node's entries are bounded too: past [Config].MaxNodeBlocks distinct
// hashes, its stores of hashes it does not hold yet are refused
// ([ErrNodeFull]) and counted, so that a node announcing made-up hashes
// cannot fill the index for the others. The index's own node
// ([Config].Self) is not bounded: its pools and tiers bound what it
// stores.
//
// # Owned slices
//
// Past the cluster size where every node can keep the whole index, each
// hash is indexed only by its owners ([Placement]): a node's [Index] is then
// its slice. [Publisher] (a node's own holdings, and per owner the ordered
// ops not yet delivered) and [Slice] (an owner applying each origin's ops
// once and in order) carry events to the owners and move hashes between
// them as members come and go; [AnswerCache] keeps owners' recent answers.
//
// The index does no I/O and runs no goroutines: the agent feeds it events,
// drops nodes that membership declares dead and sweeps from a goroutine of
// its own. Entries live as long as their holder says it holds them.
package index

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math"
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
	// MaxNodeBlocks is the most distinct hashes the index holds for one
	// node other than Self: past it, [Index.Store] stores no hash that the
	// node does not hold already (it counts more copies of those it does),
	// so that a node that sends endless stores of made-up hashes costs
	// this index a bounded share of its memory (see
	// [DefaultMaxNodeBlocks]), and the others' entries still fit. If zero,
	// DefaultMaxNodeBlocks.
	MaxNodeBlocks int64
	// Self is the name of the node this index belongs to, whose stores
	// MaxNodeBlocks does not bound: its own pools and tiers bound them,
	// and a store of its own refused would stay unindexed for good (no
	// event stores it again), losing its local hits. "" bounds every node.
	Self string
}

// DefaultMaxNodeBlocks is the default Config.MaxNodeBlocks: 2^26 hashes,
// as many as 8 TiB of pools and tiers hold in blocks of 128 KiB, so a node
// with more room in smaller blocks needs a higher bound on every node.
//
// What one holder costs at the bound, by the estimates [Index.Metrics]
// uses: a table slot a hash (12 bytes at a load of 0.75 to 0.9, about 16
// bytes: 1 GiB for 2^26), and an entry of the copy counts a hash
// (mapEntryBytes, 40 bytes: 2.5 GiB), as more copies of the hashes it
// holds are still stored past the bound: about 3.5 GiB. Copies it
// announces on a disk tier add an entry a hash of about as much to the
// disk copies counted beside the index ([DiskCopies]): about 6 GiB in
// all. A few bytes a hash more where it joins others' holder lists (the
// spilled lists); and DiskCopies keeps the entries of hashes no longer
// held until it has doubled since its last sweep, so between sweeps it
// may hold up to as many again as every holder's disk copies.
const DefaultMaxNodeBlocks = 1 << 26

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

	maxNodeBlocks int64
	self          string       // Config.Self
	refused       atomic.Int64 // stores of new hashes refused at maxNodeBlocks

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
	self     bool // named Config.Self: not bounded by maxNodeBlocks
}

type holderKey struct {
	hash uint64
	node NodeID
}

type shard struct {
	mu sync.RWMutex
	// t holds each hash's holders as one word (see holders.go); sp, the
	// holder lists too long for a word. A hash is present iff it is in t.
	t  table
	sp arena
	// multi counts copies beyond the first of a (hash, node) pair; most pairs
	// have one copy and no entry here.
	multi map[holderKey]uint32
	_     [64]byte // keep neighbouring shards' locks on separate cache lines
}

// get returns the holder word of h; ok is false if no node holds it.
func (s *shard) get(h uint64) (v uint32, ok bool) { return s.t.get(h) }

// put stores the holder word of h, removing h when it is 0.
func (s *shard) put(h uint64, v uint32) {
	if v == 0 {
		s.t.del(h)
		return
	}
	s.t.set(h, v)
}

// New returns an empty index.
func New(cfg Config) (*Index, error) {
	if cfg.Shards == 0 {
		cfg.Shards = 64
	}
	if cfg.Shards < 0 || cfg.Shards&(cfg.Shards-1) != 0 || cfg.Shards > maxShards {
		return nil, fmt.Errorf("%w: Shards %d is not a power of two in [1, %d]", ErrInvalidConfig, cfg.Shards, maxShards)
	}
	if cfg.MaxNodeBlocks == 0 {
		cfg.MaxNodeBlocks = DefaultMaxNodeBlocks
	}
	if cfg.MaxNodeBlocks < 0 {
		return nil, fmt.Errorf("%w: MaxNodeBlocks %d is negative", ErrInvalidConfig, cfg.MaxNodeBlocks)
	}
	ix := &Index{
		mask:          uint64(cfg.Shards - 1),
		maxNodeBlocks: cfg.MaxNodeBlocks,
		self:          cfg.Self,
		shards:        make([]shard, cfg.Shards),
		ids:           make(map[string]NodeID),
		occ:           make([]atomic.Uint64, MaxNodes),
		counts:        make([]atomic.Int64, MaxNodes),
		digests:       make([]atomic.Uint64, MaxNodes),
	}
	seed := rand.Uint64()
	for i := range ix.shards {
		s := &ix.shards[i]
		s.t = newTable(seed + uint64(i)*0x9e3779b97f4a7c15)
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

// ErrNodeFull is returned by [Index.Store] when it refused hashes because
// the node holds Config.MaxNodeBlocks distinct hashes already.
var ErrNodeFull = errors.New("index: node holds the most hashes the index keeps for one node")

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
	*r = nodeRec{name: name, nameHash: h.Sum64(), inc: inc, gen: r.gen, state: slotLive, self: name == ix.self && name != ""}
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

// nameHashOf returns the digest hash of id's name, whether id is the
// index's own node (Config.Self), and whether id is live.
func (ix *Index) nameHashOf(id NodeID) (nameHash uint64, self, ok bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if s := id.slot(); s < len(ix.nodes) && ix.occ[s].Load() == uint64(id) {
		return ix.nodes[s].nameHash, ix.nodes[s].self, true
	}
	return 0, false, false
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

// PairDigest is the term that a (hash, holder name) pair adds to
// [Index.Digest], so that a digest can be computed from a list of pairs
// without an index.
func PairDigest(hash uint64, name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return mix(hash, h.Sum64())
}

// Store records that node id holds one more copy of each hash. It fails
// with ErrUnknownNode, having stored a prefix of hashes, if id is dropped
// meanwhile. A hash the node does not hold yet is not stored while it
// holds Config.MaxNodeBlocks distinct hashes (concurrent stores of one
// node may pass that by one each), unless the node is Config.Self: Store
// goes on with the rest, and returns ErrNodeFull saying how many it
// refused.
func (ix *Index) Store(id NodeID, hashes ...uint64) error {
	nh, self, ok := ix.nameHashOf(id)
	if !ok {
		return fmt.Errorf("%w: %#x", ErrUnknownNode, uint64(id))
	}
	slot := id.slot()
	most := ix.maxNodeBlocks
	if self {
		most = math.MaxInt64 // its own pools and tiers bound it
	}
	refused := 0
	defer func() {
		if refused > 0 {
			ix.refused.Add(int64(refused))
		}
	}()
	for _, h := range hashes {
		s := ix.shardOf(h)
		s.mu.Lock()
		// Checked under the shard lock: a sweep that started after the
		// drop takes this lock after us, and sees what we write.
		if !ix.isLive(id) {
			s.mu.Unlock()
			return fmt.Errorf("%w: %#x was dropped", ErrUnknownNode, uint64(id))
		}
		v, _ := s.get(h)
		if ix.counts[slot].Load() >= most && !s.sp.has(v, slot) {
			s.mu.Unlock()
			refused++
			continue
		}
		k := holderKey{h, id}
		nv, added, err := s.sp.add(v, slot)
		switch {
		case err != nil:
			s.mu.Unlock()
			return fmt.Errorf("store %#x: %w", h, err)
		case added:
			s.put(h, nv)
			ix.counts[slot].Add(1)
			ix.digests[slot].Add(mix(h, nh))
		default:
			s.multi[k]++
		}
		s.mu.Unlock()
	}
	if refused > 0 {
		return fmt.Errorf("%w: %d hashes of %q not stored: it holds %d already", ErrNodeFull, refused, ix.Name(id), ix.maxNodeBlocks)
	}
	return nil
}

// Remove records that node id holds one copy fewer of each hash; the node
// stops being a holder when its last copy goes. Removing a hash the node does
// not hold is not an error: a remove may race a sweep. A dropped id is
// ErrUnknownNode: the sweep removes its entries.
func (ix *Index) Remove(id NodeID, hashes ...uint64) error {
	return ix.remove(id, hashes, false)
}

// Forget records that node id holds no copy of each hash any more,
// however many it held: an owned-slices owner's slice loses a hash it no
// longer owns. Like Remove, a hash the node does not hold is not an error.
func (ix *Index) Forget(id NodeID, hashes ...uint64) error {
	return ix.remove(id, hashes, true)
}

// remove is Remove, or Forget when all: every copy of each hash goes.
func (ix *Index) remove(id NodeID, hashes []uint64, all bool) error {
	nh, _, ok := ix.nameHashOf(id)
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
		ix.removeLocked(s, h, id, nh, all)
		s.mu.Unlock()
	}
	return nil
}

// removeLocked drops one copy (or every copy, if all) of (h, id) and reports
// whether the node stopped being a holder. The shard's lock is held.
func (ix *Index) removeLocked(s *shard, h uint64, id NodeID, nameHash uint64, all bool) bool {
	slot := id.slot()
	v, ok := s.get(h)
	if !ok || !s.sp.has(v, slot) {
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
	nv, removed := s.sp.remove(v, slot)
	if !removed {
		return false // the arena is full (ErrFull): the pair stays, counted
	}
	s.put(h, nv)
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
		s.t.each(func(h uint64, v uint32) {
			s.sp.eachHolder(v, func(slot int) {
				if mask[slot/64]&(1<<(slot%64)) != 0 {
					hits = append(hits, hit{h, slot})
				}
			})
		})
		// Last first: removing an entry shifts the rest of its probe run
		// back, and the rest is shorter from the end.
		for _, e := range slices.Backward(hits) {
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
	v, ok := s.get(hash)
	if !ok {
		return nil
	}
	var out []NodeID
	s.sp.eachHolder(v, func(slot int) {
		if id := ix.idAt(slot); id != 0 {
			out = append(out, id)
		}
	})
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
	var group [lookupGroup]uint32
	var nextBuf [MaxNodes / 64]uint64
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
		// The words are read under the same locks, so that spilled lists
		// stay as they were looked up.
		for j, h := range chunk {
			v := group[j]
			sp := &ix.shards[h&ix.mask].sp
			i := base + j
			if i == 0 {
				if v == 0 {
					ix.unlockAll(&locked)
					return dst
				}
				// Dropped nodes' entries wait for a sweep: not holders.
				active = buf[:1+sp.maxHolder(v)/64]
				sp.eachHolder(v, func(slot int) { active[slot/64] |= 1 << (slot % 64) })
				any := uint64(0)
				for w := range active {
					active[w] &= ix.liveMask[w].Load()
					any |= active[w]
				}
				if any == 0 {
					ix.unlockAll(&locked)
					return dst
				}
				continue
			}
			next := nextBuf[:len(active)]
			sp.intersect(v, active, next)
			any := uint64(0)
			for w := range active {
				for lost := active[w] &^ next[w]; lost != 0; lost &= lost - 1 {
					if id := ix.idAt(w*64 + bits.TrailingZeros64(lost)); id != 0 {
						dst = append(dst, Match{Node: id, Blocks: i})
					}
				}
				active[w] = next[w]
				any |= next[w]
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
	// Refused counts, since the index was made, the stores of hashes
	// refused because their node held Config.MaxNodeBlocks hashes.
	Refused int64
	// Bytes is the memory the entries take: the tables' slots, the
	// spilled holder lists, and an estimate for the copy counts and
	// timestamps kept beside them.
	Bytes int64
}

// mapEntryBytes estimates a Go map entry of a holderKey and a small value,
// its share of the groups and control words included.
const mapEntryBytes = 40

// Metrics returns the index's current size.
func (ix *Index) Metrics() Metrics {
	var st Metrics
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.RLock()
		st.Hashes += s.t.len()
		st.Bytes += int64(s.t.bytes() + s.sp.bytes())
		st.Bytes += int64(len(s.multi)) * mapEntryBytes
		s.mu.RUnlock()
	}
	ix.mu.RLock()
	st.Nodes = ix.live
	st.Pending = len(ix.retired)
	st.Refused = ix.refused.Load()
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
