package index

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Two queries meet shards in opposite orders while writers wait on them:
// with RWMutex's writer preference, queries that held one shard while
// taking the next deadlocked. Progress is checked every 100 ms.
func TestFindMatchesLockOrder(t *testing.T) {
	ix, _ := New(Config{Shards: 64})
	id, _ := ix.ID("a")
	// hashes whose shard is 1 and 2
	a, b := uint64(1), uint64(2)
	ix.Store(id, a, b, a+64, b+64)
	q1 := []uint64{a, b, a + 64, b + 64}
	q2 := []uint64{b, a, b + 64, a + 64}
	var stop atomic.Bool
	var ops atomic.Int64
	var wg sync.WaitGroup
	for _, q := range [][]uint64{q1, q2, q1, q2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				ix.FindMatches(q)
				ops.Add(1)
			}
		}()
	}
	for _, h := range []uint64{a, b} {
		h := h
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				ix.Store(id, h+128)
				ix.Remove(id, h+128)
				ops.Add(1)
			}
		}()
	}
	last := int64(-1)
	for range 15 {
		time.Sleep(100 * time.Millisecond)
		n := ops.Load()
		if n == last {
			t.Fatalf("no progress after %d ops: deadlock", n)
		}
		last = n
	}
	stop.Store(true)
	wg.Wait()
}
