package pool

import (
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

// gpuStorage stands in for one GPU's memory: an address range and no
// bytes.
type gpuStorage struct {
	addr, size uint64
	dev        int32
}

func (g gpuStorage) Addr() uint64            { return g.addr }
func (g gpuStorage) Size() uint64            { return g.size }
func (g gpuStorage) Kind() layout.MemoryKind { return layout.Device }
func (g gpuStorage) Device() int32           { return g.dev }
func (g gpuStorage) Bytes() []byte           { return nil }
func (g gpuStorage) Close() error            { return nil }

func newSpanningPool(t *testing.T, sizes ...uint64) *Pool {
	t.Helper()
	var st []Storage
	for i, n := range sizes {
		st = append(st, gpuStorage{addr: uint64(i+1) << 40, size: n, dev: int32(i)})
	}
	p, err := NewSpanning(st, testConfig(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// checkPlaced checks that every rank's region lies in the storage the set
// says it was carved from, at the offset it says, on that storage's GPU.
func checkPlaced(t *testing.T, p *Pool, b *BlockSet, want []int) {
	t.Helper()
	l := b.Layout()
	for r, reg := range l.Regions {
		a, err := b.RegionStorage(r)
		if err != nil {
			t.Fatal(err)
		}
		off, err := b.RegionOffset(r)
		if err != nil {
			t.Fatal(err)
		}
		st := p.Storages()[a]
		if a != want[r] || reg.Device != st.Device() || reg.Kind != layout.Device ||
			reg.Base != st.Addr()+off || off+reg.Size > st.Size() {
			t.Fatalf("rank %d: storage %d (want %d), region %+v at offset %d; storage at %#x of %d bytes on GPU %d",
				r, a, want[r], reg, off, st.Addr(), st.Size(), st.Device())
		}
	}
}

// A block set's ranks are spread over the pool's storages, one per GPU,
// by rank or as placed, and freeing it gives every storage its memory back.
func TestSpanningPoolPlacesRanks(t *testing.T) {
	p := newSpanningPool(t, 1<<20, 1<<20)
	spread, err := p.NewBlockSet(testLayout(16, 4, layout.FullyContiguous, 4096))
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, spread, []int{0, 1, 0, 1})
	placed, err := p.NewBlockSetOn(testLayout(16, 4, layout.FullyContiguous, 4096), []int{1, 1, 1, 0})
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, placed, []int{1, 1, 1, 0})
	// Regions on one storage never overlap.
	seen := map[int][][2]uint64{}
	for _, b := range []*BlockSet{spread, placed} {
		for r, reg := range b.Layout().Regions {
			a, _ := b.RegionStorage(r)
			for _, s := range seen[a] {
				if reg.Base < s[1] && s[0] < reg.Base+reg.Size {
					t.Fatalf("set %d rank %d [%#x, %#x) overlaps [%#x, %#x) on storage %d", b.ID(), r, reg.Base, reg.Base+reg.Size, s[0], s[1], a)
				}
			}
			seen[a] = append(seen[a], [2]uint64{reg.Base, reg.Base + reg.Size})
		}
	}
	for _, id := range []SetID{spread.ID(), placed.ID()} {
		if err := p.FreeBlockSet(id); err != nil {
			t.Fatal(err)
		}
	}
	for a, ar := range p.arenas {
		if ar.next != 0 || len(ar.holes) != 0 {
			t.Fatalf("storage %d after freeing all: next %d, %d holes", a, ar.next, len(ar.holes))
		}
	}
}

// A set that does not fit on one of its storages carves nothing on any.
func TestSpanningPoolAllOrNothing(t *testing.T) {
	l := testLayout(64, 2, layout.FullyContiguous, 4096)
	region := l.Strides().Region
	// Storage 1 holds one region less one page; storage 0 exactly one.
	p := newSpanningPool(t, region, region-4096)
	_, err := p.NewBlockSet(l)
	if !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("rank 1 past storage 1's end: %v, want ErrOutOfMemory", err)
	}
	if p.arenas[0].next != 0 {
		t.Fatalf("storage 0 kept %d bytes of a set that was refused", p.arenas[0].next)
	}
	// At the limit: both ranks on storage 0 do not fit, one does.
	if _, err := p.NewBlockSetOn(l, []int{0, 0}); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("two regions on a storage of one: %v, want ErrOutOfMemory", err)
	}
	one := testLayout(64, 1, layout.FullyContiguous, 4096)
	b, err := p.NewBlockSetOn(one, []int{0})
	if err != nil {
		t.Fatalf("one region filling storage 0 exactly: %v", err)
	}
	checkPlaced(t, p, b, []int{0})
}

// A set refused on one storage leaves a hole it would have taken on
// another as it was.
func TestSpanningPoolAllOrNothingInHoles(t *testing.T) {
	l := testLayout(64, 1, layout.FullyContiguous, 4096)
	region := l.Strides().Region
	p := newSpanningPool(t, 3*region, region)
	var sets []*BlockSet
	for range 2 {
		b, err := p.NewBlockSetOn(l, []int{0})
		if err != nil {
			t.Fatal(err)
		}
		sets = append(sets, b)
	}
	if _, err := p.NewBlockSetOn(l, []int{1}); err != nil {
		t.Fatal(err)
	}
	// Storage 0: a hole of one region at the front; storage 1 is full.
	if err := p.FreeBlockSet(sets[0].ID()); err != nil {
		t.Fatal(err)
	}
	holes := append([]span(nil), p.arenas[0].holes...)
	two := testLayout(64, 2, layout.FullyContiguous, 4096)
	if _, err := p.NewBlockSetOn(two, []int{0, 1}); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("rank 1 on a full storage: %v, want ErrOutOfMemory", err)
	}
	if len(p.arenas[0].holes) != len(holes) || (len(holes) > 0 && p.arenas[0].holes[0] != holes[0]) {
		t.Fatalf("storage 0's holes %v after a refused set, were %v", p.arenas[0].holes, holes)
	}
	b, err := p.NewBlockSetOn(l, []int{0})
	if err != nil {
		t.Fatalf("the hole, still free: %v", err)
	}
	if off, _ := b.RegionOffset(0); off != 0 {
		t.Fatalf("the set took offset %d, want the freed hole at 0", off)
	}
}

func TestSpanningPoolRefusesBadInput(t *testing.T) {
	if _, err := NewSpanning(nil, testConfig(nil, nil)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("no storage: %v", err)
	}
	if _, err := NewSpanning([]Storage{gpuStorage{addr: 1 << 40, size: 1 << 20}, nil}, testConfig(nil, nil)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("a nil storage: %v", err)
	}
	if _, err := NewSpanning([]Storage{gpuStorage{addr: 1 << 40, size: 1 << 20}, newSliceStorage(1 << 20)}, testConfig(nil, nil)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("device and host storage in one pool: %v", err)
	}
	p := newSpanningPool(t, 1<<20, 1<<20, 1<<20)
	l := testLayout(4, 2, layout.FullyContiguous, 4096)
	for _, place := range [][]int{{0}, {0, 1, 2}, {0, -1}, {3, 0}} {
		if _, err := p.NewBlockSetOn(l, place); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("placement %v for TP 2 on 3 storages: %v, want ErrInvalidConfig", place, err)
		}
	}
	// At the limit: the last storage.
	b, err := p.NewBlockSetOn(l, []int{2, 2})
	if err != nil {
		t.Fatal(err)
	}
	checkPlaced(t, p, b, []int{2, 2})
	if len(p.BlockSets()) != 1 {
		t.Fatalf("%d block sets after refusals and one success", len(p.BlockSets()))
	}
}
