package kvtest

import (
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

func mk(tp int, order layout.KVOrder, slots int) *layout.Layout {
	l := &layout.Layout{Model: layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 3, DType: layout.DTypeBF16},
		PageSize: 4, TPSize: tp, Order: order, Arrangement: layout.FullyContiguous, Alignment: 64, Slots: slots}
	l.Regions = make([]layout.Region, tp)
	for r := range l.Regions {
		l.Regions[r] = layout.Region{Kind: layout.Host, Size: 1 << 20}
	}
	return l
}

// A block filled under TP 4 HND, moved by a plan to TP 2 NHD, checks; the
// wrong block id or a corrupted byte does not.
func TestFillPlanCheck(t *testing.T) {
	src, dst := mk(4, layout.HND, 4), mk(2, layout.NHD, 4)
	sm, dm := regions(src), regions(dst)
	Fill(src, sm, 1, 77)
	p, err := layout.NewPlan(src, dst, []layout.SlotPair{{Src: 1, Dst: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if err := layout.Execute(p, sm, dm); err != nil {
		t.Fatal(err)
	}
	if err := Check(dst, dm, 3, 77); err != nil {
		t.Fatal(err)
	}
	if err := Check(dst, dm, 3, 78); err == nil {
		t.Fatal("another block id checked")
	}
	dm[1][dst.ChunkOffset(3, 1, 1)+5] ^= 1
	if err := Check(dst, dm, 3, 77); err == nil {
		t.Fatal("a flipped bit checked")
	}
}

func regions(l *layout.Layout) [][]byte {
	out := make([][]byte, l.TPSize)
	for r := range out {
		out[r] = make([]byte, l.Regions[r].Size)
	}
	return out
}
