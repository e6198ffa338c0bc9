package index

import "testing"

// Past diskSweepMin entries, a sweep drops what the index no longer
// backs: the entries of a dropped node.
func TestDiskCopiesSweepsDroppedNodes(t *testing.T) {
	ix, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	gone, _ := ix.ID("gone")
	live, _ := ix.ID("live")
	var h DiskCopies
	for x := range uint64(diskSweepMin) {
		if err := ix.Store(gone, x); err != nil {
			t.Fatal(err)
		}
		h.Store(ix, gone, x)
	}
	ix.DropNode(gone)
	if n := h.Len(); n != diskSweepMin {
		t.Fatalf("%d entries before the sweep, want %d", n, diskSweepMin)
	}
	// The entry past the limit triggers the sweep.
	if err := ix.Store(live, 1<<40); err != nil {
		t.Fatal(err)
	}
	h.Store(ix, live, 1<<40)
	if n := h.Len(); n != 1 {
		t.Fatalf("%d entries after the sweep, want the live node's 1", n)
	}
	if d := h.CountDiskOnly(ix, live, []uint64{1 << 40}); d != 1 {
		t.Fatalf("the live node's disk copy: %d, want 1", d)
	}
}
