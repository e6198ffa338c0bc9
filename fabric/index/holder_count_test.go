package index

import "testing"

func TestHolderCount(t *testing.T) {
	ix, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	a, _ := ix.ID("a")
	b, _ := ix.ID("b")
	c, _ := ix.ID("c")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ix.Store(a, 1, 2))
	must(ix.Store(b, 1))
	must(ix.Store(c, 1, 3))
	for _, tc := range []struct {
		name   string
		hash   uint64
		id     NodeID
		holds  bool
		others int
	}{
		{"held by all three", 1, a, true, 2},
		{"held by a alone", 2, a, true, 0},
		{"held by another only", 3, a, false, 1},
		{"held by nobody", 4, a, false, 0},
	} {
		if holds, others := ix.HolderCount(tc.hash, tc.id); holds != tc.holds || others != tc.others {
			t.Errorf("%s: holds %v, others %d; want %v, %d", tc.name, holds, others, tc.holds, tc.others)
		}
	}
	// A dropped node is no holder, before its entries are swept.
	ix.DropNode(c)
	if holds, others := ix.HolderCount(1, a); !holds || others != 1 {
		t.Errorf("after c dropped: holds %v, others %d; want true, 1", holds, others)
	}
	must(ix.Remove(b, 1))
	if holds, others := ix.HolderCount(1, a); !holds || others != 0 {
		t.Errorf("after b removed: holds %v, others %d; want true, 0", holds, others)
	}
}
