package pool

import (
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

// FitsFreeing answers whether a set would fit once a given set is freed,
// as NewBlockSet then finds, and frees and carves nothing: a storage of
// three sets' room holds A, B and room for one more; a set of twice their
// size fits only once B (next to the free room) is freed, not A (whose
// room is apart from it), nor with nothing freed; a set with retired
// slots frees no room.
func TestFitsFreeingAnswersAsNewBlockSetWould(t *testing.T) {
	small := testLayout(64, 1, layout.FullyContiguous, 4096)
	big := testLayout(128, 1, layout.FullyContiguous, 4096)
	probe, _ := newTestPool(t, testConfig(newManualClock(), nil), small)
	region := probe.BlockSets()[0].Layout().Regions[0].Size
	if region%4096 != 0 {
		t.Fatalf("region of %d bytes, want a multiple of the alignment", region)
	}
	// A pool with room for three small sets, holding A then B.
	twoSets := func() (*Pool, *BlockSet, *BlockSet) {
		p, err := New(newSliceStorage(int(3*region)), testConfig(newManualClock(), nil))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		a, err := p.NewBlockSet(small)
		if err != nil {
			t.Fatal(err)
		}
		b, err := p.NewBlockSet(small)
		if err != nil {
			t.Fatal(err)
		}
		return p, a, b
	}
	p, a, b := twoSets()
	for _, tc := range []struct {
		desc  string
		freed SetID
		want  bool
	}{
		{"nothing freed", 0, false},
		{"a set freed that is not", 99, false},
		{"A freed, apart from the free room", a.ID(), false},
		{"B freed, next to the free room", b.ID(), true},
	} {
		got, err := p.FitsFreeing(big, nil, tc.freed)
		if err != nil || got != tc.want {
			t.Fatalf("%s: fits %v, %v; want %v", tc.desc, got, err, tc.want)
		}
	}
	huge := testLayout(192, 1, layout.FullyContiguous, 4096)
	for _, tc := range []struct {
		desc  string
		freed []SetID
		want  bool
	}{
		{"a set three times as big, B freed", []SetID{b.ID()}, false},
		{"a set three times as big, A and B freed", []SetID{a.ID(), b.ID()}, true},
	} {
		got, err := p.FitsFreeing(huge, nil, tc.freed...)
		if err != nil || got != tc.want {
			t.Fatalf("%s: fits %v, %v; want %v", tc.desc, got, err, tc.want)
		}
	}
	if _, err := p.NewBlockSet(big); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("the big set made with A and B held: %v, want ErrOutOfMemory", err)
	}
	if n := len(p.BlockSets()); n != 2 {
		t.Fatalf("%d sets after the checks, want A and B", n)
	}
	if ok, err := p.FitsFreeing(&layout.Layout{}, nil, b.ID()); ok || !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("an invalid layout: fits %v, %v; want ErrInvalidConfig", ok, err)
	}
	if err := p.FreeBlockSet(b.ID()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.NewBlockSet(big); err != nil {
		t.Fatalf("the big set made once B is freed: %v", err)
	}

	p, _, b = twoSets()
	blk, err := b.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Retire(blk[0]); err != nil {
		t.Fatal(err)
	}
	if ok, err := p.FitsFreeing(big, nil, b.ID()); ok || err != nil {
		t.Fatalf("B with a retired slot freed: fits %v, %v; want false: its memory is withheld", ok, err)
	}
}
