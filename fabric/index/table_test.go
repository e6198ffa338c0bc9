package index

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestTableAgreesWithMap drives the table and a map with the same random
// operations over a small key space (so that probe runs collide, wrap and
// shift back), growing and shrinking.
func TestTableAgreesWithMap(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	r := rand.New(rand.NewPCG(seed, 2))
	tb := newTable(r.Uint64())
	m := map[uint64]uint32{}
	for step := range 200000 {
		k := uint64(r.IntN(3000)) // includes the zero key
		if step > 100000 {
			k = uint64(r.IntN(300)) // shrink phase: fewer live keys
		}
		if r.IntN(2) == 0 {
			v := r.Uint32()
			tb.set(k, v)
			m[k] = v
		} else {
			tb.del(k)
			delete(m, k)
		}
		if step%1000 == 0 {
			if tb.len() != len(m) {
				t.Fatalf("seed %d step %d: len %d, want %d", seed, step, tb.len(), len(m))
			}
			for k, v := range m {
				if got, ok := tb.get(k); !ok || got != v {
					t.Fatalf("seed %d step %d: get(%d) = %d %v, want %d", seed, step, k, got, ok, v)
				}
			}
			n := 0
			tb.each(func(k uint64, v uint32) {
				if m[k] != v {
					t.Fatalf("seed %d: each yields %d=%d, map has %d", seed, k, v, m[k])
				}
				n++
			})
			if n != len(m) {
				t.Fatalf("seed %d: each yields %d keys, want %d", seed, n, len(m))
			}
		}
	}
	if len(tb.slots) > 4*minTableSlots*64 {
		t.Fatalf("table did not shrink: %d slots for %d keys", len(tb.slots), tb.len())
	}
}

// check fails if some entry of t cannot be found where it is.
func (tb *table) check(t testing.TB, what string) {
	t.Helper()
	for i := range tb.slots {
		if s := &tb.slots[i]; s.klo|s.khi != 0 {
			if j := tb.find(s.key()); j != i {
				t.Fatalf("%s: key %#x at slot %d is found at %d (%d slots, %d keys)", what, s.key(), i, j, len(tb.slots), tb.n)
			}
		}
	}
}

// TestTableResizeKeepsKeys grows tables by inserts and shrinks them by
// deleting in slot order from the end (as Sweep does), under many seeds, so
// that probe runs wrap round the end of the table at every resize; every
// key stays findable.
func TestTableResizeKeepsKeys(t *testing.T) {
	for seed := uint64(1); seed <= 500; seed++ {
		tb := newTable(seed * 0x9e3779b97f4a7c15)
		keep := map[uint64]bool{}
		for k := uint64(1); k < 4096; k += 8 {
			tb.set(k, uint32(k))
			keep[k] = true
		}
		tb.check(t, fmt.Sprintf("seed %d grown", seed))
		var keys []uint64
		tb.each(func(k uint64, _ uint32) { keys = append(keys, k) })
		for i := len(keys) - 1; i >= 0; i-- {
			if k := keys[i]; k < 3600 && k != 1 {
				tb.del(k)
				delete(keep, k)
				if v, ok := tb.get(1); !ok || v != 1 {
					tb.check(t, fmt.Sprintf("seed %d deleting %d", seed, k))
					t.Fatalf("seed %d: key 1 lost deleting %d", seed, k)
				}
			}
		}
		tb.check(t, fmt.Sprintf("seed %d shrunk", seed))
		for k := range keep {
			if v, ok := tb.get(k); !ok || v != uint32(k) {
				t.Fatalf("seed %d: key %d = %d %v after shrinking", seed, k, v, ok)
			}
		}
		if tb.len() != len(keep) {
			t.Fatalf("seed %d: %d keys, want %d", seed, tb.len(), len(keep))
		}
	}
}
