package index

import "testing"

func TestCopies(t *testing.T) {
	ix, _ := New(DefaultConfig())
	a, b := mustID(t, ix, "a"), mustID(t, ix, "b")
	const h = 0x1234
	check := func(what string, id NodeID, want int) {
		t.Helper()
		if got := ix.Copies(h, id); got != want {
			t.Fatalf("%s: %d copies, want %d", what, got, want)
		}
	}
	check("none stored", a, 0)
	for range 3 {
		if err := ix.Store(a, h); err != nil {
			t.Fatal(err)
		}
	}
	if err := ix.Store(b, h); err != nil {
		t.Fatal(err)
	}
	check("three stored", a, 3)
	check("another node's one", b, 1)
	if err := ix.Remove(a, h); err != nil {
		t.Fatal(err)
	}
	check("one removed", a, 2)
	if err := ix.Remove(a, h, h); err != nil {
		t.Fatal(err)
	}
	check("all removed", a, 0)
	check("another node's kept", b, 1)
	ix.DropNode(b)
	check("a dropped node", b, 0)
}
