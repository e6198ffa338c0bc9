package index

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func mustID(t testing.TB, ix *Index, name string) NodeID {
	t.Helper()
	id, err := ix.ID(name)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, tc := range []struct {
		desc string
		cfg  Config
	}{
		{"shards not a power of two", Config{Shards: 3}},
		{"negative shards", Config{Shards: -4}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if _, err := New(tc.cfg); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("New(%+v) = %v, want ErrInvalidConfig", tc.cfg, err)
			}
		})
	}
}

func TestFindMatches(t *testing.T) {
	ix, _ := New(DefaultConfig())
	a, b, c := mustID(t, ix, "a"), mustID(t, ix, "b"), mustID(t, ix, "c")
	ix.Store(a, 1, 2, 3, 4)
	ix.Store(b, 1, 2)
	ix.Store(c, 2, 3, 4) // holds later blocks but not the first: no overlap
	for _, tc := range []struct {
		desc  string
		query []uint64
		want  []Match
	}{
		{"empty query", nil, nil},
		{"unknown first block", []uint64{9, 1, 2}, nil},
		{"full and partial", []uint64{1, 2, 3, 4}, []Match{{a, 4}, {b, 2}}},
		{"stops at first miss", []uint64{1, 2, 9, 4}, []Match{{a, 2}, {b, 2}}},
		{"one block", []uint64{1}, []Match{{a, 1}, {b, 1}}},
		{"query longer than holdings", []uint64{1, 2, 3, 4, 5}, []Match{{a, 4}, {b, 2}}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if got := ix.FindMatches(tc.query); !slices.Equal(got, tc.want) {
				t.Fatalf("FindMatches(%v) = %v, want %v", tc.query, got, tc.want)
			}
		})
	}
}

func TestCopiesAreCounted(t *testing.T) {
	ix, _ := New(DefaultConfig())
	a := mustID(t, ix, "a")
	ix.Store(a, 7)
	ix.Store(a, 7) // a second block set holds it too
	ix.Remove(a, 7)
	if got := ix.Holders(7); !slices.Equal(got, []NodeID{a}) {
		t.Fatalf("after removing one of two copies, holders = %v, want [a]", got)
	}
	ix.Remove(a, 7)
	if got := ix.Holders(7); got != nil {
		t.Fatalf("after removing both copies, holders = %v", got)
	}
	ix.Remove(a, 7) // removing what is not held is harmless
	if st := ix.Metrics(); st.Pairs != 0 || st.Hashes != 0 {
		t.Fatalf("stats = %+v, want empty", st)
	}
}

func TestUnknownNode(t *testing.T) {
	ix, _ := New(DefaultConfig())
	if err := ix.Store(5, 1); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("Store with unnamed id = %v, want ErrUnknownNode", err)
	}
}

// model is the obvious implementation the index must agree with.
type model map[uint64]map[string]int

func (m model) findMatches(q []uint64) map[string]int {
	out := map[string]int{}
	if len(q) == 0 {
		return out
	}
	for n := range m[q[0]] {
		k := 0
		for k < len(q) && m[q[k]][n] > 0 {
			k++
		}
		out[n] = k
	}
	return out
}

func TestAgreesWithModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 1))
	ix, _ := New(Config{Shards: 4})
	m := model{}
	names := make([]string, 150) // past one bitset word
	for i := range names {
		names[i] = fmt.Sprintf("n%d", i)
	}
	for step := 0; step < 20000; step++ {
		n := names[r.IntN(len(names))]
		id := mustID(t, ix, n)
		h := uint64(r.IntN(64))
		switch r.IntN(10) {
		case 0:
			ix.DropNode(id)
			for _, hs := range m {
				delete(hs, n)
			}
			if r.IntN(3) == 0 {
				ix.Sweep()
			}
		case 1, 2, 3:
			ix.Remove(id, h)
			if m[h][n] > 0 {
				m[h][n]--
				if m[h][n] == 0 {
					delete(m[h], n)
				}
			}
		default:
			ix.Store(id, h)
			if m[h] == nil {
				m[h] = map[string]int{}
			}
			m[h][n]++
		}
		if step%500 == 0 {
			q := make([]uint64, 1+r.IntN(8))
			for i := range q {
				q[i] = uint64(r.IntN(64))
			}
			got := map[string]int{}
			for _, mt := range ix.FindMatches(q) {
				got[ix.Name(mt.Node)] = mt.Blocks
			}
			want := m.findMatches(q)
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("seed %d step %d query %v: got %v, want %v", seed, step, q, got, want)
			}
		}
	}
	// The digest depends only on the pairs present, not on ids or history.
	fresh, _ := New(Config{Shards: 16})
	var pairs int64
	for h, hs := range m {
		for n := range hs {
			fresh.Store(mustID(t, fresh, n), h)
			pairs++
		}
	}
	if ix.Digest() != fresh.Digest() {
		t.Fatalf("seed %d: digest %x differs from a fresh index with the same pairs %x", seed, ix.Digest(), fresh.Digest())
	}
	if st := ix.Metrics(); st.Pairs != pairs {
		t.Fatalf("seed %d: pairs %d, want %d", seed, st.Pairs, pairs)
	}
}

func TestRank(t *testing.T) {
	// The seed's example: overlap minus load picks worker 2.
	matches := []Match{{3, 75}, {2, 50}, {1, 15}}
	loads := map[NodeID]float64{1: 0.30, 2: 0.50, 3: 0.80, 4: 0.1}
	got := Rank(matches, loads, 100, 1)
	var order []NodeID
	for _, r := range got {
		order = append(order, r.Node)
	}
	if want := []NodeID{2, 3, 4, 1}; !slices.Equal(order, want) {
		t.Fatalf("Rank order = %v, want %v (%+v)", order, want, got)
	}
	if got := Rank(matches, loads, 100, 0); got[0].Node != 3 {
		t.Fatalf("with weight 0 the longest overlap must win, got %+v", got[0])
	}
}
