package index

import (
	"errors"
	"slices"
	"testing"
)

// A node holds at most MaxNodeBlocks distinct hashes: its stores of new
// hashes past it are refused and counted, copies of hashes it holds still
// count, a remove makes room again, and another node stores as before.
func TestStoreStopsAtMaxNodeBlocks(t *testing.T) {
	const most = 8
	ix, err := New(Config{Shards: 4, MaxNodeBlocks: most})
	if err != nil {
		t.Fatal(err)
	}
	a, b := mustID(t, ix, "a"), mustID(t, ix, "b")
	var first []uint64
	for h := range uint64(most) {
		first = append(first, 1000+h)
	}
	if err := ix.Store(a, first...); err != nil {
		t.Fatalf("storing up to the bound: %v", err)
	}
	if got := ix.NodeBlocks(a); got != most {
		t.Fatalf("a holds %d hashes, want %d", got, most)
	}
	// Past the bound: two new hashes refused, a copy of a held one taken.
	err = ix.Store(a, 1, first[0], 2)
	if !errors.Is(err, ErrNodeFull) {
		t.Fatalf("storing past the bound: %v, want ErrNodeFull", err)
	}
	if got := ix.NodeBlocks(a); got != most {
		t.Fatalf("past the bound a holds %d hashes, want %d", got, most)
	}
	if got := ix.Holders(1); got != nil {
		t.Fatalf("a refused hash has holders %v", got)
	}
	if got := ix.Copies(first[0], a); got != 2 {
		t.Fatalf("copies of a held hash stored past the bound: %d, want 2", got)
	}
	if got := ix.Metrics().Refused; got != 2 {
		t.Fatalf("Metrics().Refused = %d, want 2", got)
	}
	// Another node is not bound by a's entries.
	if err := ix.Store(b, 1, 2, 3); err != nil {
		t.Fatalf("another node's stores: %v", err)
	}
	if got := ix.FindMatches([]uint64{1, 2, 3}); !slices.Equal(got, []Match{{b, 3}}) {
		t.Fatalf("FindMatches = %v, want b alone", got)
	}
	// A hash removed for good makes room for one more.
	ix.Remove(a, first[1])
	if err := ix.Store(a, 1); err != nil {
		t.Fatalf("storing after a remove made room: %v", err)
	}
	if got := ix.Holders(1); !slices.Equal(got, []NodeID{a, b}) && !slices.Equal(got, []NodeID{b, a}) {
		t.Fatalf("holders of 1 = %v, want a and b", got)
	}
	if err := ix.Store(a, 2); !errors.Is(err, ErrNodeFull) {
		t.Fatalf("storing past the bound again: %v, want ErrNodeFull", err)
	}
}

func TestNewRejectsNegativeMaxNodeBlocks(t *testing.T) {
	if _, err := New(Config{MaxNodeBlocks: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New with MaxNodeBlocks -1 = %v, want ErrInvalidConfig", err)
	}
}

// An owner's slice keeps at most MaxNodeBlocks hashes of one origin: the
// origin's stores past it are taken as applied and not stored, its stream
// goes on (a later remove makes room, and a store after it is stored),
// and another origin's ops are applied as before.
func TestSliceStopsAtMaxNodeBlocks(t *testing.T) {
	const most = 4
	ix, _ := New(Config{Shards: 4, MaxNodeBlocks: most})
	s := NewSlice(ix, nil)
	ops := make([]Op, 0, MaxOpsPerCall)
	for i := range MaxOpsPerCall {
		ops = append(ops, Op{OpStoreDisk, uint64(i + 1)})
	}
	n, err := s.Apply("m", OpsCall{Inc: 1, First: 1, Replace: true, Ops: ops})
	if !errors.Is(err, ErrNodeFull) || n != len(ops) {
		t.Fatalf("a call of %d stores past the bound: %d applied, %v; want all, ErrNodeFull", len(ops), n, err)
	}
	m, _ := ix.Lookup("m")
	if got := ix.NodeBlocks(m); got != most {
		t.Fatalf("the slice holds %d hashes of m, want %d", got, most)
	}
	if got := s.disk.Len(); got != most {
		t.Fatalf("the slice counts %d disk copies of m, want %d", got, most)
	}
	if got := s.Holders([]uint64{most + 1})[0]; len(got) != 0 {
		t.Fatalf("a store past the bound is held by %v", got)
	}
	// The stream goes on: the next call continues it, and a remove
	// makes room for one more.
	next := uint64(1 + len(ops))
	n, err = s.Apply("m", OpsCall{Inc: 1, First: next, Ops: []Op{{OpRemoveDisk, 1}, {OpStore, 99999}}})
	if err != nil || n != 2 {
		t.Fatalf("the stream after the bound: %d, %v; want 2, nil", n, err)
	}
	if got := s.Holders([]uint64{1, 99999}); len(got[0]) != 0 || !slices.Equal(got[1], []string{"m"}) {
		t.Fatalf("after a remove and a store: holders %v, want none of 1 and m of 99999", got)
	}
	// Another origin stores as before.
	n, err = s.Apply("o", OpsCall{Inc: 1, First: 1, Replace: true, Ops: []Op{{OpStore, 5}, {OpStore, 6}}})
	if err != nil || n != 2 {
		t.Fatalf("another origin: %d, %v", n, err)
	}
	if got := s.Holders([]uint64{5, 6}); !slices.Equal(got[0], []string{"o"}) || !slices.Equal(got[1], []string{"o"}) {
		t.Fatalf("another origin's hashes are held by %v, want o", got)
	}
}

// The index's own node (Config.Self) is not bound by MaxNodeBlocks, in
// any run of it, directly or through an owned slice: its pools and tiers
// bound its stores, and one refused would stay unindexed. Another node
// past the bound is refused as before.
func TestStoreOfSelfPastMaxNodeBlocks(t *testing.T) {
	const most = 4
	ix, err := New(Config{Shards: 4, MaxNodeBlocks: most, Self: "me"})
	if err != nil {
		t.Fatal(err)
	}
	me, err := ix.Node("me", 1)
	if err != nil {
		t.Fatal(err)
	}
	other := mustID(t, ix, "other")
	if err := ix.Store(me, hashRange(1, 3*most)...); err != nil {
		t.Fatalf("this node's stores past the bound: %v", err)
	}
	if got := ix.NodeBlocks(me); got != 3*most {
		t.Fatalf("this node holds %d hashes, want %d", got, 3*most)
	}
	if err := ix.Store(other, hashRange(1, 3*most)...); !errors.Is(err, ErrNodeFull) {
		t.Fatalf("another node's stores past the bound: %v, want ErrNodeFull", err)
	}
	if got := ix.NodeBlocks(other); got != most {
		t.Fatalf("another node holds %d hashes, want %d", got, most)
	}
	if got := ix.Metrics().Refused; got != 2*most {
		t.Fatalf("Metrics().Refused = %d, want %d", got, 2*most)
	}
	// A later run of this node, named afresh.
	me2, err := ix.Node("me", 2)
	if err != nil || me2 == me {
		t.Fatalf("this node's next run: %v, %v", me2, err)
	}
	if err := ix.Store(me2, hashRange(100, 3*most)...); err != nil || ix.NodeBlocks(me2) != 3*most {
		t.Fatalf("this node's next run past the bound: %d hashes, %v", ix.NodeBlocks(me2), err)
	}
	// Through an owned slice: this node as the origin of its own stream.
	ix, _ = New(Config{Shards: 4, MaxNodeBlocks: most, Self: "me"})
	s := NewSlice(ix, nil)
	ops := make([]Op, 3*most)
	for i := range ops {
		ops[i] = Op{OpStoreDisk, uint64(i + 1)}
	}
	if n, err := s.Apply("me", OpsCall{Inc: 1, First: 1, Replace: true, Ops: ops}); err != nil || n != len(ops) {
		t.Fatalf("this node's own ops past the bound: %d, %v", n, err)
	}
	if m, _ := ix.Lookup("me"); ix.NodeBlocks(m) != 3*most || s.disk.Len() != 3*most {
		t.Fatalf("the slice holds %d hashes of this node, %d on disk; want %d", ix.NodeBlocks(m), s.disk.Len(), 3*most)
	}
}

func hashRange(from, n uint64) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = from + uint64(i)
	}
	return out
}
