package index

import (
	"slices"
	"testing"
	"time"
)

func TestAnswerCache(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ttl := time.Second
	tests := []struct {
		desc string
		run  func(c *AnswerCache) (got []Holder, ok bool)
		want []Holder
		ok   bool
	}{
		{"fresh answer", func(c *AnswerCache) ([]Holder, bool) {
			c.Put(1, hs("a", "b"), t0)
			return c.Get(1, t0.Add(ttl-time.Nanosecond))
		}, hs("a", "b"), true},
		{"answer at its TTL is stale", func(c *AnswerCache) ([]Holder, bool) {
			c.Put(1, hs("a"), t0)
			return c.Get(1, t0.Add(ttl))
		}, nil, false},
		{"a newer answer replaces the old", func(c *AnswerCache) ([]Holder, bool) {
			c.Put(1, hs("a"), t0)
			c.Put(1, hs("c"), t0.Add(ttl))
			return c.Get(1, t0.Add(ttl+time.Millisecond))
		}, hs("c"), true},
		{"never stored", func(c *AnswerCache) ([]Holder, bool) { return c.Get(7, t0) }, nil, false},
		{"cleared", func(c *AnswerCache) ([]Holder, bool) {
			c.Put(1, hs("a"), t0)
			c.Clear()
			return c.Get(1, t0)
		}, nil, false},
		{"an empty answer is an answer", func(c *AnswerCache) ([]Holder, bool) {
			c.Put(1, hs(), t0)
			return c.Get(1, t0)
		}, hs(), true},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, ok := tc.run(NewAnswerCache(4, ttl))
			if ok != tc.ok || !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// The cache holds at most its size: at the limit every answer stays, one
// past it the oldest stored goes.
func TestAnswerCacheSize(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const size = 8
	c := NewAnswerCache(size, time.Minute)
	for h := uint64(1); h <= size; h++ {
		c.Put(h, hs("a"), t0)
	}
	if c.Len() != size {
		t.Fatalf("at the limit: %d answers, want %d", c.Len(), size)
	}
	for h := uint64(1); h <= size; h++ {
		if _, ok := c.Get(h, t0); !ok {
			t.Fatalf("at the limit: answer %d lost", h)
		}
	}
	c.Put(size+1, hs("b"), t0)
	if c.Len() != size {
		t.Fatalf("one past the limit: %d answers, want %d", c.Len(), size)
	}
	if _, ok := c.Get(1, t0); ok {
		t.Fatal("one past the limit: the oldest answer was kept")
	}
	for h := uint64(2); h <= size+1; h++ {
		if _, ok := c.Get(h, t0); !ok {
			t.Fatalf("one past the limit: answer %d lost", h)
		}
	}
	// Storing a hash again does not take a second place.
	c.Put(5, hs("c"), t0)
	if c.Len() != size {
		t.Fatalf("restored: %d answers, want %d", c.Len(), size)
	}
	// Zero TTL keeps nothing.
	z := NewAnswerCache(0, 0)
	z.Put(1, hs("a"), t0)
	if z.Len() != 0 {
		t.Fatal("a cache with no TTL kept an answer")
	}
}

// Stats counts each Get by outcome: hit, miss (never stored, or cleared)
// and expired (stored, past its TTL).
func TestAnswerCacheStats(t *testing.T) {
	t0 := time.Unix(1000, 0)
	c := NewAnswerCache(4, time.Second)
	c.Get(1, t0) // miss
	c.Put(1, hs("a"), t0)
	c.Get(1, t0)                  // hit
	c.Get(1, t0.Add(time.Second)) // expired
	c.Put(2, hs("b"), t0)
	c.Clear()
	c.Get(2, t0) // miss
	if got, want := c.Stats(), (AnswerCacheStats{Hits: 1, Misses: 2, Expired: 1}); got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}

// hs names holders in memory.
func hs(names ...string) []Holder {
	out := make([]Holder, len(names))
	for i, n := range names {
		out[i] = Holder{Name: n}
	}
	return out
}
