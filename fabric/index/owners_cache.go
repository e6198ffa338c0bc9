package index

import (
	"sync"
	"sync/atomic"
	"time"
)

// AnswerCache keeps owners' recent answers about hashes, so that a node
// of an owned-slices index asks an owner again only once an answer is
// older than its TTL. It is bounded: past Size answers, the oldest stored
// is forgotten first. All methods are safe for concurrent use; Get's
// holders are shared with the cache and must not be modified.
type AnswerCache struct {
	ttl  time.Duration
	size int

	mu   sync.Mutex
	m    map[uint64]cachedAnswer
	ring []uint64 // hashes in the order they were stored; len(ring) <= size
	next int      // where the next stored hash goes once ring is full

	hits, misses, expired atomic.Uint64
}

// AnswerCacheStats counts Get's outcomes: an answer young enough (Hits),
// none (Misses), one past its TTL (Expired).
type AnswerCacheStats struct {
	Hits, Misses, Expired uint64
}

// Stats returns Get's outcomes so far.
func (c *AnswerCache) Stats() AnswerCacheStats {
	return AnswerCacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Expired: c.expired.Load()}
}

type cachedAnswer struct {
	holders []Holder
	at      time.Time
}

// DefaultAnswerCacheSize is the answers an AnswerCache keeps if its size
// is zero: about 6 MiB with three holders per hash.
const DefaultAnswerCacheSize = 1 << 16

// NewAnswerCache returns a cache of at most size answers (if zero,
// DefaultAnswerCacheSize), each good for ttl (if zero or less, nothing is
// kept).
func NewAnswerCache(size int, ttl time.Duration) *AnswerCache {
	if size <= 0 {
		size = DefaultAnswerCacheSize
	}
	return &AnswerCache{ttl: ttl, size: size, m: make(map[uint64]cachedAnswer)}
}

// Get returns the holders an owner answered for hash, if the answer was
// stored less than the TTL before now.
func (c *AnswerCache) Get(hash uint64, now time.Time) ([]Holder, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[hash]
	switch {
	case !ok:
		c.misses.Add(1)
		return nil, false
	case now.Sub(e.at) >= c.ttl:
		c.expired.Add(1)
		return nil, false
	}
	c.hits.Add(1)
	return e.holders, true
}

// Put stores the holders of hash as of now; the cache keeps holders.
func (c *AnswerCache) Put(hash uint64, holders []Holder, now time.Time) {
	if c.ttl <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[hash]; !ok {
		if len(c.ring) < c.size {
			c.ring = append(c.ring, hash)
		} else {
			delete(c.m, c.ring[c.next])
			c.ring[c.next] = hash
			c.next = (c.next + 1) % c.size
		}
	}
	c.m[hash] = cachedAnswer{holders: holders, at: now}
}

// Clear forgets every answer, as when the member list changes and the
// owners of every hash may have.
func (c *AnswerCache) Clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.m)
	c.ring, c.next = c.ring[:0], 0
}

// Len returns how many answers the cache holds, stale ones included.
func (c *AnswerCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}
