// Package index is the global block index: which nodes hold which blocks,
// keyed by sequence hash, and how long a prefix of a request each node holds.
//
// An entry is a sequence hash and the set of its holders, kept as a bitset
// over small node ids that the index hands out for node names. Because a
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
// The index does no I/O and runs no goroutines: the agent feeds it events,
// drops nodes that membership declares dead and, if expiry is configured,
// calls [Index.Expire] on a ticker.
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
	"time"
)

// NodeID is the index's small integer name for a node; see [Index.ID].
type NodeID uint32

// ErrInvalidConfig is matched by every configuration error of [New].
var ErrInvalidConfig = errors.New("index: invalid config")

// Config configures an [Index].
type Config struct {
	// Shards is the number of independently locked shards, a power of two.
	// If zero, 64.
	Shards int
	// Expiry drops a holder of a hash that has not been stored again for this
	// long, when [Index.Expire] runs. If zero, entries never expire, and the
	// index keeps no per-entry timestamps.
	Expiry time.Duration
	// Now is the clock used to stamp stores. If nil, time.Now.
	Now func() time.Time
}

// DefaultConfig returns a Config with 64 shards and no expiry.
func DefaultConfig() Config { return Config{Shards: 64} }

// MaxNodes bounds the number of distinct node names an index will name; it
// keeps the holder bitsets and query scratch small.
const MaxNodes = 4096

// Index maps sequence hashes to holder sets. All methods are safe for
// concurrent use.
type Index struct {
	expiry time.Duration
	now    func() time.Time
	mask   uint64
	shards []shard

	mu       sync.RWMutex
	ids      map[string]NodeID
	names    []string
	nameHash []uint64
	counts   []atomic.Int64 // per node: (hash, node) pairs held; fixed capacity MaxNodes
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
	// stamps is the last store time (unix nanoseconds) of each pair; nil
	// without expiry.
	stamps map[holderKey]int64
	// digest is the sum of mix(hash, node name) over the pairs present.
	digest uint64
	_      [64]byte // keep neighbouring shards' locks on separate cache lines
}

// holders is a bitset over NodeIDs: lo holds ids 0..63, hi[i] ids 64(i+1)..
type holders struct {
	lo uint64
	hi []uint64
}

func (h *holders) has(id NodeID) bool {
	w := int(id / 64)
	if w == 0 {
		return h.lo&(1<<(id%64)) != 0
	}
	return w-1 < len(h.hi) && h.hi[w-1]&(1<<(id%64)) != 0
}

func (h *holders) set(id NodeID) {
	w := int(id / 64)
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

func (h *holders) clear(id NodeID) {
	w := int(id / 64)
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
	if cfg.Expiry < 0 {
		return nil, fmt.Errorf("%w: Expiry %v is negative", ErrInvalidConfig, cfg.Expiry)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	ix := &Index{
		expiry: cfg.Expiry,
		now:    cfg.Now,
		mask:   uint64(cfg.Shards - 1),
		shards: make([]shard, cfg.Shards),
		ids:    make(map[string]NodeID),
		counts: make([]atomic.Int64, MaxNodes),
	}
	seed := rand.Uint64()
	for i := range ix.shards {
		s := &ix.shards[i]
		s.t = newTable(seed + uint64(i)*0x9e3779b97f4a7c15)
		s.hi = make(map[uint64][]uint64)
		s.multi = make(map[holderKey]uint32)
		if cfg.Expiry > 0 {
			s.stamps = make(map[holderKey]int64)
		}
	}
	return ix, nil
}

// ErrTooManyNodes is returned by [Index.ID] past [MaxNodes] names.
var ErrTooManyNodes = errors.New("index: too many nodes")

// ID returns the id of a node name, naming it on first use. Ids are never
// reused, so a caller may cache them; a node that restarts under the same
// name keeps its id.
func (ix *Index) ID(name string) (NodeID, error) {
	ix.mu.RLock()
	id, ok := ix.ids[name]
	ix.mu.RUnlock()
	if ok {
		return id, nil
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if id, ok := ix.ids[name]; ok {
		return id, nil
	}
	if len(ix.names) >= MaxNodes {
		return 0, fmt.Errorf("%w: %d names already, cannot add %q", ErrTooManyNodes, MaxNodes, name)
	}
	id = NodeID(len(ix.names))
	ix.ids[name] = id
	ix.names = append(ix.names, name)
	h := fnv.New64a()
	h.Write([]byte(name))
	ix.nameHash = append(ix.nameHash, h.Sum64())
	return id, nil
}

// Name returns the name of id, or "" if the index never named it.
func (ix *Index) Name(id NodeID) string {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if int(id) < len(ix.names) {
		return ix.names[id]
	}
	return ""
}

// nameHashOf returns the digest hash of id's name, and whether id is named.
func (ix *Index) nameHashOf(id NodeID) (uint64, bool) {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if int(id) < len(ix.nameHash) {
		return ix.nameHash[id], true
	}
	return 0, false
}

// ErrUnknownNode is returned for a NodeID that [Index.ID] never handed out.
var ErrUnknownNode = errors.New("index: unknown node")

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

// Store records that node id holds one more copy of each hash.
func (ix *Index) Store(id NodeID, hashes ...uint64) error {
	nh, ok := ix.nameHashOf(id)
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownNode, id)
	}
	var stamp int64
	if ix.expiry > 0 {
		stamp = ix.now().UnixNano()
	}
	added := int64(0)
	for _, h := range hashes {
		s := ix.shardOf(h)
		s.mu.Lock()
		hs, _ := s.get(h)
		k := holderKey{h, id}
		if hs.has(id) {
			s.multi[k]++
		} else {
			hs.set(id)
			s.put(h, hs)
			s.digest += mix(h, nh)
			added++
		}
		if s.stamps != nil {
			s.stamps[k] = stamp
		}
		s.mu.Unlock()
	}
	ix.counts[id].Add(added)
	return nil
}

// Remove records that node id holds one copy fewer of each hash; the node
// stops being a holder when its last copy goes. Removing a hash the node does
// not hold is not an error: a remove may race an expiry.
func (ix *Index) Remove(id NodeID, hashes ...uint64) error {
	nh, ok := ix.nameHashOf(id)
	if !ok {
		return fmt.Errorf("%w: %d", ErrUnknownNode, id)
	}
	removed := int64(0)
	for _, h := range hashes {
		s := ix.shardOf(h)
		s.mu.Lock()
		if s.removeLocked(h, id, nh, false) {
			removed++
		}
		s.mu.Unlock()
	}
	ix.counts[id].Add(-removed)
	return nil
}

// removeLocked drops one copy (or every copy, if all) of (h, id) and reports
// whether the node stopped being a holder.
func (s *shard) removeLocked(h uint64, id NodeID, nameHash uint64, all bool) bool {
	hs, ok := s.get(h)
	if !ok || !hs.has(id) {
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
	if s.stamps != nil {
		delete(s.stamps, k)
	}
	hs.clear(id)
	s.put(h, hs)
	s.digest -= mix(h, nameHash)
	return true
}

// DropNode removes every entry of node id, as when it dies, leaves or
// restarts. It scans the whole index, one shard at a time; nodes come and go
// rarely enough that a per-node reverse index is not worth its memory.
func (ix *Index) DropNode(id NodeID) {
	nh, ok := ix.nameHashOf(id)
	if !ok {
		return
	}
	removed := int64(0)
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		// Collect first: removing shifts slots under the iteration.
		var mine []uint64
		s.t.each(func(h, lo uint64) {
			hs := holders{lo: lo, hi: s.hi[h]}
			if hs.has(id) {
				mine = append(mine, h)
			}
		})
		for _, h := range mine {
			if s.removeLocked(h, id, nh, true) {
				removed++
			}
		}
		s.mu.Unlock()
	}
	ix.counts[id].Add(-removed)
}

// Expire drops every holder whose last store is older than the configured
// expiry before now, and returns how many it dropped. Without expiry it does
// nothing.
func (ix *Index) Expire(now time.Time) int {
	if ix.expiry <= 0 {
		return 0
	}
	cutoff := now.Add(-ix.expiry).UnixNano()
	// The name hashes once, not under ix.mu per entry: names only grow,
	// and a node named after the copy has no stamp old enough to expire.
	ix.mu.RLock()
	names := slices.Clone(ix.nameHash)
	ix.mu.RUnlock()
	dropped := 0
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		for k, st := range s.stamps {
			if st >= cutoff || int(k.node) >= len(names) {
				continue
			}
			if s.removeLocked(k.hash, k.node, names[k.node], true) {
				ix.counts[k.node].Add(-1)
				dropped++
			}
		}
		s.mu.Unlock()
	}
	return dropped
}

// Holders returns the nodes holding hash, in id order.
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
			out = append(out, NodeID(w*64+bits.TrailingZeros64(x)))
		}
	}
	return out
}

// Match is one node's overlap with a query: it holds the first Blocks hashes.
type Match struct {
	Node   NodeID
	Blocks int
}

// FindMatches returns, for every node holding at least the first hash, how
// many leading hashes of the query it holds, longest first (ties by node id).
// It stops at the first hash that none of the remaining nodes holds.
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
				active = buf[:1+len(hs.hi)]
				active[0] = hs.lo
				copy(active[1:], hs.hi)
				continue
			}
			any := uint64(0)
			for w := range active {
				next := active[w] & hs.word(w)
				for lost := active[w] &^ next; lost != 0; lost &= lost - 1 {
					dst = append(dst, Match{Node: NodeID(w*64 + bits.TrailingZeros64(lost)), Blocks: i})
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
			dst = append(dst, Match{Node: NodeID(w*64 + bits.TrailingZeros64(x)), Blocks: len(hashes)})
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

// Stats is a snapshot of the index's size.
type Stats struct {
	// Hashes is the number of distinct sequence hashes with a holder.
	Hashes int
	// Pairs is the number of (hash, holder) pairs.
	Pairs int64
	// Nodes is the number of node names the index has seen.
	Nodes int
}

// Stats returns the index's current size.
func (ix *Index) Stats() Stats {
	var st Stats
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.RLock()
		st.Hashes += s.t.len()
		s.mu.RUnlock()
	}
	ix.mu.RLock()
	st.Nodes = len(ix.names)
	ix.mu.RUnlock()
	for i := 0; i < st.Nodes; i++ {
		st.Pairs += ix.counts[i].Load()
	}
	return st
}

// NodeBlocks returns how many distinct hashes node id holds.
func (ix *Index) NodeBlocks(id NodeID) int64 {
	if int(id) >= MaxNodes {
		return 0
	}
	return ix.counts[id].Load()
}

// Digest is an order-independent checksum of the (hash, holder name) pairs
// present; two indexes with the same pairs have the same digest whatever the
// order of events or the ids they gave the names.
func (ix *Index) Digest() uint64 {
	var d uint64
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.RLock()
		d += s.digest
		s.mu.RUnlock()
	}
	return d
}
