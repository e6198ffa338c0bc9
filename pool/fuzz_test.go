package pool

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// FuzzCheckRead: whatever range a peer asks for, CheckRead allows it
// exactly when every byte lies in a leased slot's shard, and never panics.
func FuzzCheckRead(f *testing.F) {
	type fixture struct {
		p     *Pool
		b     *BlockSet
		id    LeaseID
		slots []int
	}
	var fixtures []fixture
	for _, l := range []*layout.Layout{
		testLayout(8, 2, layout.FullyContiguous, 1024),
		testLayout(8, 2, layout.FullyContiguous, 64),
		testLayout(8, 4, layout.LayerSeparate, 64),
		testLayout(8, 1, layout.LayerSeparate, 512),
	} {
		p, b := newTestPool(f, testConfig(newManualClock(), nil), l)
		blks, _ := b.Allocate(6)
		for i, blk := range blks {
			b.Commit(blk)
			b.Register(blk, uint64(100+i), 0)
		}
		// Slots 1, 2 and 4: two adjacent, one apart, the rest not leased.
		id, _, err := b.Lease([]uint64{101, 102, 104}, time.Minute)
		if err != nil {
			f.Fatal(err)
		}
		fixtures = append(fixtures, fixture{p, b, id, []int{1, 2, 4}})
	}
	f.Add(uint8(0), 0, uint64(1024), uint64(512))
	f.Add(uint8(1), 1, uint64(1000), uint64(100))
	f.Add(uint8(2), 3, uint64(300), uint64(1<<20))
	f.Add(uint8(3), -1, uint64(0), uint64(math.MaxUint64))
	f.Fuzz(func(t *testing.T, which uint8, rank int, off, length uint64) {
		fx := fixtures[int(which)%len(fixtures)]
		lay := fx.b.Layout()
		err := fx.p.CheckRead(fx.id, fx.b.ID(), rank, off, length)
		region := lay.Strides().Region
		want := rank >= 0 && rank < lay.TPSize && length > 0 && off < region && length <= region-off
		for pos := off; want && pos < off+length; pos++ {
			slot, ok := slotOf(lay, pos)
			want = ok && slices.Contains(fx.slots, slot)
		}
		if want != (err == nil) {
			t.Fatalf("rank %d [%d, +%d): err = %v, want allowed %v", rank, off, length, err, want)
		}
		if err != nil && !errors.Is(err, ErrReadDenied) {
			t.Fatalf("refusal %v is not ErrReadDenied", err)
		}
	})
}
