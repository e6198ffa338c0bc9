package index

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("node-%d", i)
	}
	return out
}

// TestPlacementOwners checks the owners against a brute-force ranking, and
// that the member list's order does not matter.
func TestPlacementOwners(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, c := range []struct{ members, replicas, want int }{
		{0, 3, 0}, {1, 3, 1}, {2, 3, 2}, {5, 3, 3}, {64, 1, 1}, {64, 3, 3}, {300, 12, 12}, {3, 0, 1},
	} {
		ms := names(c.members)
		p := NewPlacement(ms, c.replicas)
		shuffled := slices.Clone(ms)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		q := NewPlacement(append(shuffled, shuffled...), c.replicas) // duplicates count once
		for range 200 {
			h := r.Uint64()
			got := p.AppendOwners(nil, h)
			if len(got) != c.want {
				t.Fatalf("%d members, %d replicas: %d owners", c.members, c.replicas, len(got))
			}
			want := slices.Clone(p.names)
			slices.SortFunc(want, func(a, b string) int {
				sa, sb := mix(h, p.nh[slices.Index(p.names, a)]), mix(h, p.nh[slices.Index(p.names, b)])
				switch {
				case sa > sb:
					return -1
				case sa < sb:
					return 1
				}
				return 0
			})
			if !slices.Equal(got, want[:c.want]) {
				t.Fatalf("owners %v, want %v", got, want[:c.want])
			}
			if other := q.AppendOwners(nil, h); !slices.Equal(got, other) {
				t.Fatalf("member order changed the owners: %v vs %v", got, other)
			}
		}
	}
}

// TestPlacementBalanceAndHandOff: each of 100 members owns close to its
// share of 3 replicas, and a join moves only what the new member gains
// (about 3/101 of the hashes), each from an owner that loses it.
func TestPlacementBalanceAndHandOff(t *testing.T) {
	const n, replicas, hashes = 100, 3, 200000
	r := rand.New(rand.NewPCG(1, 1))
	hs := make([]uint64, hashes)
	for i := range hs {
		hs[i] = r.Uint64()
	}
	before := NewPlacement(names(n), replicas)
	owned := map[string][]uint64{}
	for _, h := range hs {
		for _, o := range before.AppendOwners(nil, h) {
			owned[o] = append(owned[o], h)
		}
	}
	share := float64(hashes*replicas) / n
	for m, o := range owned {
		if d := float64(len(o))/share - 1; d > 0.05 || d < -0.05 {
			t.Errorf("%s owns %d hashes, share %.0f", m, len(o), share)
		}
	}
	after := NewPlacement(names(n+1), replicas)
	newcomer := fmt.Sprintf("node-%d", n)
	moved := 0
	for m, o := range owned {
		for to, hs := range HandOff(before, after, m, o) {
			if to != newcomer {
				t.Fatalf("%s hands %d hashes to %s, which owned nothing new", m, len(hs), to)
			}
			moved += len(hs)
		}
	}
	// Each hash the newcomer gains is sent by each of its old owners.
	gained := 0
	for _, h := range hs {
		if after.Owns(newcomer, h) {
			gained++
		}
	}
	if moved != gained*replicas {
		t.Fatalf("%d hashes sent, newcomer gained %d (x%d owners)", moved, gained, replicas)
	}
	if f := float64(gained) / hashes; f < 0.8*replicas/(n+1) || f > 1.2*replicas/(n+1) {
		t.Fatalf("newcomer gained %.4f of the hashes, want about %.4f", f, float64(replicas)/(n+1))
	}
}

// Forget drops every copy of a hash at once, where Remove drops one.
func TestForget(t *testing.T) {
	ix, _ := New(DefaultConfig())
	a, b := mustID(t, ix, "a"), mustID(t, ix, "b")
	ix.Store(a, 1, 1, 1, 2)
	ix.Store(b, 1)
	if err := ix.Forget(a, 1, 9); err != nil {
		t.Fatal(err)
	}
	if got := ix.Holders(1); !slices.Equal(got, []NodeID{b}) {
		t.Fatalf("after Forget, holders of 1 = %v, want [b]", got)
	}
	if got := ix.NodeBlocks(a); got != 1 {
		t.Fatalf("after Forget, a holds %d hashes, want 1", got)
	}
	ix.Store(a, 1)
	ix.Remove(a, 1)
	if got := ix.Holders(1); !slices.Equal(got, []NodeID{b}) {
		t.Fatalf("a copy counted before the Forget came back: holders %v", got)
	}
	ix.DropNode(a)
	if err := ix.Forget(a, 2); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("Forget on a dropped node = %v, want ErrUnknownNode", err)
	}
}
