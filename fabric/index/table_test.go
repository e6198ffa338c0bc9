package index

import (
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
	m := map[uint64]uint64{}
	for step := range 200000 {
		k := uint64(r.IntN(3000)) // includes the zero key
		if step > 100000 {
			k = uint64(r.IntN(300)) // shrink phase: fewer live keys
		}
		if r.IntN(2) == 0 {
			v := r.Uint64()
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
			tb.each(func(k, v uint64) {
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
