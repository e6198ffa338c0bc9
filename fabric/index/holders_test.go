package index

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestHoldersAgreeWithSets drives holder words and plain sets with the same
// random adds and removes, over slots small (the bits form) and large (pairs
// and spilled lists of every size class), and checks every form's answers.
func TestHoldersAgreeWithSets(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 3))
	var a arena
	const words = 64
	vs := make([]uint32, words)
	sets := make([]map[int]bool, words)
	for i := range sets {
		sets[i] = map[int]bool{}
	}
	for step := range 100000 {
		i := r.IntN(words)
		// Each word has its own slot range, from 8 slots to MaxNodes, so
		// that sets of every size and form occur.
		span := 8 << (i % 10)
		slot := r.IntN(min(span, MaxNodes))
		if i%3 == 0 {
			slot = MaxNodes - 1 - slot
		}
		if r.IntN(5) < 3 { // adds outnumber removes: sets grow
			nv, added, err := a.add(vs[i], slot)
			if err != nil {
				t.Fatalf("seed %d step %d: add: %v", seed, step, err)
			}
			if added == sets[i][slot] {
				t.Fatalf("seed %d step %d: add %d to %v: added %v", seed, step, slot, sets[i], added)
			}
			vs[i], sets[i][slot] = nv, true
		} else {
			nv, removed := a.remove(vs[i], slot)
			if removed != sets[i][slot] {
				t.Fatalf("seed %d step %d: remove %d from %v: removed %v", seed, step, slot, sets[i], removed)
			}
			vs[i] = nv
			delete(sets[i], slot)
		}
		if r.IntN(1000) == 0 { // empty a word now and then
			for s := range sets[i] {
				vs[i], _ = a.remove(vs[i], s)
			}
			clear(sets[i])
		}
		want := make([]uint16, 0, len(sets[i]))
		for s := range sets[i] {
			want = append(want, uint16(s))
		}
		slices.Sort(want)
		got := a.appendHolders(nil, vs[i])
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d step %d: word %#x holds %v, want %v", seed, step, vs[i], got, want)
		}
		if (vs[i] == 0) != (len(want) == 0) {
			t.Fatalf("seed %d step %d: word %#x for %d holders", seed, step, vs[i], len(want))
		}
		if len(want) > 0 {
			if m := a.maxHolder(vs[i]); m != int(want[len(want)-1]) {
				t.Fatalf("seed %d step %d: maxHolder %d, want %d", seed, step, m, want[len(want)-1])
			}
			probe := r.IntN(MaxNodes)
			if a.has(vs[i], probe) != sets[i][probe] {
				t.Fatalf("seed %d step %d: has(%d) = %v", seed, step, probe, !sets[i][probe])
			}
			if step%100 != 0 {
				continue
			}
			active := make([]uint64, MaxNodes/64)
			for w := range active {
				active[w] = r.Uint64()
			}
			next := make([]uint64, len(active))
			a.intersect(vs[i], active, next)
			for s := range MaxNodes {
				in := active[s/64]&(1<<(s%64)) != 0 && sets[i][s]
				if got := next[s/64]&(1<<(s%64)) != 0; got != in {
					t.Fatalf("seed %d step %d: intersect slot %d = %v, want %v", seed, step, s, got, in)
				}
			}
		}
	}
}

// TestHoldersFullCluster puts every slot up to MaxNodes on one hash, the
// largest set, and takes them off again.
func TestHoldersFullCluster(t *testing.T) {
	var a arena
	var v uint32
	for s := MaxNodes - 1; s >= 0; s-- {
		var err error
		if v, _, err = a.add(v, s); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.appendHolders(nil, v); len(got) != MaxNodes || got[0] != 0 || int(got[MaxNodes-1]) != MaxNodes-1 {
		t.Fatalf("holds %d slots, first %d", len(got), got[0])
	}
	for s := range MaxNodes {
		var removed bool
		if v, removed = a.remove(v, s); !removed {
			t.Fatalf("slot %d not removed", s)
		}
	}
	if v != 0 {
		t.Fatalf("empty set is word %#x", v)
	}
}
