package pool

import (
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// storeInactive registers hashes in order, each its own sequence unless
// chained (then each extends the one before), and releases them in the
// order given by release (indexes into hashes), so that the first
// released is the least recently used.
func storeInactive(t *testing.T, b *BlockSet, hashes []uint64, chained bool, release []int) {
	t.Helper()
	regs := make([]Block, len(hashes))
	for i, h := range hashes {
		blks, err := b.Allocate(1)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(blks[0]); err != nil {
			t.Fatal(err)
		}
		parent := uint64(0)
		if chained && i > 0 {
			parent = hashes[i-1]
		}
		if regs[i], err = b.Register(blks[0], h, parent); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range release {
		if err := b.Release(regs[i]); err != nil {
			t.Fatal(err)
		}
	}
}

// evicted recycles n blocks and returns which of hashes went, in the
// order checked: Evict(1) at a time.
func evictOrder(t *testing.T, b *BlockSet, hashes []uint64, n int) []uint64 {
	t.Helper()
	var out []uint64
	for range n {
		before := map[uint64]bool{}
		for _, h := range hashes {
			if _, ok := b.Lookup(h); ok {
				before[h] = true
			}
		}
		if got := b.Evict(1); got != 1 {
			t.Fatalf("Evict(1) = %d", got)
		}
		for _, h := range hashes {
			if _, ok := b.Lookup(h); before[h] && !ok {
				out = append(out, h)
			}
		}
	}
	return out
}

func equalHashes(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDemoteOrdersEviction(t *testing.T) {
	hashes := []uint64{11, 12, 13, 14, 15, 16}
	all := []int{0, 1, 2, 3, 4, 5} // 11 least recently used
	for _, tc := range []struct {
		name string
		// act runs after the blocks are stored and released.
		act  func(b *BlockSet)
		want []uint64
	}{
		{"no mark: least recently used first", func(b *BlockSet) {}, []uint64{11, 12, 13}},
		{"a demoted block goes first", func(b *BlockSet) { b.Demote(15) }, []uint64{15, 11, 12}},
		{"demoted blocks among themselves by last use", func(b *BlockSet) { b.Demote(16); b.Demote(13) }, []uint64{13, 16, 11}},
		{"undemoted goes back to its place", func(b *BlockSet) { b.Demote(15, 12); b.Undemote(15) }, []uint64{12, 11, 13}},
		{"unknown hashes are skipped", func(b *BlockSet) { b.Demote(99, 14) }, []uint64{14, 11, 12}},
		{"every block demoted: plain last use", func(b *BlockSet) { b.Demote(hashes...) }, []uint64{11, 12, 13}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, b := newTestPool(t, testConfig(nil, nil), testLayout(8, 1, layout.FullyContiguous, 64))
			storeInactive(t, b, hashes, false, all)
			tc.act(b)
			if got := evictOrder(t, b, hashes, len(tc.want)); !equalHashes(got, tc.want) {
				t.Fatalf("evicted %v, want %v", got, tc.want)
			}
		})
	}
}

// Leaves first holds for demoted blocks: a demoted parent waits for its
// child, and a child leaves before its demoted parent.
func TestDemotedParentWaitsForItsChild(t *testing.T) {
	_, b := newTestPool(t, testConfig(nil, nil), testLayout(8, 1, layout.FullyContiguous, 64))
	chain := []uint64{21, 22, 23}
	storeInactive(t, b, chain, true, []int{0, 1, 2})
	single := []uint64{31}
	storeInactive(t, b, single, false, []int{0})
	if n := b.Demote(21); n != 1 {
		t.Fatalf("Demote = %d, want 1", n)
	}
	// 23 is the only leaf of the chain and older than 31; 22, then the
	// demoted 21 as soon as it is a leaf.
	got := evictOrder(t, b, append(chain, single...), 4)
	if want := []uint64{23, 22, 21, 31}; !equalHashes(got, want) {
		t.Fatalf("evicted %v, want %v", got, want)
	}
}

// A block demoted while in use keeps its mark: once released it is the
// first to go. A recycled slot loses the mark.
func TestDemoteInUseAndRecycled(t *testing.T) {
	_, b := newTestPool(t, testConfig(nil, nil), testLayout(4, 1, layout.FullyContiguous, 64))
	hashes := []uint64{41, 42, 43}
	storeInactive(t, b, hashes[:2], false, []int{0, 1})
	blks, _ := b.Allocate(1)
	b.Commit(blks[0])
	held, err := b.Register(blks[0], 43, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := b.Demote(43); n != 1 {
		t.Fatalf("Demote of a block in use = %d, want 1", n)
	}
	if n := b.Demote(43); n != 0 {
		t.Fatalf("Demote twice = %d, want 0", n)
	}
	if m := b.Metrics(); m.Demoted != 1 {
		t.Fatalf("Demoted = %d, want 1", m.Demoted)
	}
	if err := b.Release(held); err != nil {
		t.Fatal(err)
	}
	if got := evictOrder(t, b, hashes, 1); !equalHashes(got, []uint64{43}) {
		t.Fatalf("evicted %v, want the released demoted block 43", got)
	}
	if m := b.Metrics(); m.Demoted != 0 {
		t.Fatalf("Demoted after its block was recycled = %d, want 0", m.Demoted)
	}
	// The slot holds a new block now, not demoted: 41 goes before it.
	storeInactive(t, b, []uint64{44}, false, []int{0})
	if got := evictOrder(t, b, []uint64{41, 42, 44}, 1); !equalHashes(got, []uint64{41}) {
		t.Fatalf("evicted %v, want 41: a recycled slot kept the mark", got)
	}
}

// Pool.Demote reaches every block set that holds the hash.
func TestPoolDemoteEverySet(t *testing.T) {
	p, b1 := newTestPool(t, testConfig(nil, nil), testLayout(4, 1, layout.FullyContiguous, 64))
	b2, err := p.NewBlockSet(testLayout(4, 1, layout.FullyContiguous, 64))
	if err != nil {
		t.Fatal(err)
	}
	storeInactive(t, b1, []uint64{51, 52}, false, []int{0, 1})
	storeInactive(t, b2, []uint64{52, 53}, false, []int{0, 1})
	if n := p.Demote(52, 99); n != 2 {
		t.Fatalf("Pool.Demote = %d, want 2 (one per set)", n)
	}
	if m := p.Metrics(); m.Demoted != 2 {
		t.Fatalf("pool Demoted = %d, want 2", m.Demoted)
	}
	if n := p.Undemote(52); n != 2 {
		t.Fatalf("Pool.Undemote = %d, want 2", n)
	}
	if m := p.Metrics(); m.Demoted != 0 {
		t.Fatalf("pool Demoted = %d, want 0", m.Demoted)
	}
}

// A peer's lease is a use of the block it leases: once the lease ends the
// block goes after the blocks last used before it, and a demoted block
// leased is the newest of the demoted ones (cluster-aware eviction keeps
// the copy a peer just read over a copy here read longer ago).
func TestLeaseEndIsAUse(t *testing.T) {
	hashes := []uint64{51, 52, 53, 54}
	for _, tc := range []struct {
		name   string
		demote []uint64
		want   []uint64
	}{
		{"no mark", nil, []uint64{52, 53, 54, 51}},
		{"all demoted", hashes, []uint64{52, 53, 54, 51}},
		{"the leased one and one other demoted", []uint64{51, 53}, []uint64{53, 51, 52, 54}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, b := newTestPool(t, testConfig(nil, nil), testLayout(8, 1, layout.FullyContiguous, 64))
			storeInactive(t, b, hashes, false, []int{0, 1, 2, 3}) // 51 least recently used
			b.Demote(tc.demote...)
			id, got, err := b.Lease([]uint64{51}, time.Second)
			if err != nil || len(got) != 1 || !got[0].Found {
				t.Fatalf("Lease(51) = %v, %v", got, err)
			}
			if valid, err := p.ReleaseLease(id); !valid || err != nil {
				t.Fatalf("ReleaseLease = %v, %v", valid, err)
			}
			if order := evictOrder(t, b, hashes, len(hashes)); !equalHashes(order, tc.want) {
				t.Fatalf("evicted %v, want %v", order, tc.want)
			}
		})
	}
}
