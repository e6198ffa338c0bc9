package kvtest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
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

// fillEach is Fill element by element, as this package first wrote it:
// the reference the row-wise Fill must match.
func fillEach(l *layout.Layout, regions [][]byte, slot int, id uint64) {
	es := l.Model.DType.Size()
	hpr := l.HeadsPerRank()
	planes := 2
	if l.Model.MLA {
		planes = 1
	}
	hd := uint64(l.Model.HeadDim)
	var v [8]byte
	for r := range l.TPSize {
		first := l.FirstHead(r)
		for layer := range l.Model.Layers {
			for p := range planes {
				base := l.ChunkOffset(slot, layer, p)
				for lh := range hpr {
					for tok := range l.PageSize {
						var in uint64
						if l.Order == layout.NHD {
							in = (uint64(tok)*uint64(hpr) + uint64(lh)) * hd
						} else {
							in = (uint64(lh)*uint64(l.PageSize) + uint64(tok)) * hd
						}
						for d := range l.Model.HeadDim {
							off := base + (in+uint64(d))*es
							binary.LittleEndian.PutUint64(v[:], Value(id, layer, p, tok, first+lh, d))
							copy(regions[r][off:off+es], v[:es])
						}
					}
				}
			}
		}
	}
}

// Fill writes, and Check accepts, exactly the bytes of the element-wise
// reference for every dtype size, both orders, TP sizes below and above
// the KV heads, and MLA; Check names the element a flipped byte is in.
func TestFillMatchesElementwise(t *testing.T) {
	for _, dt := range []layout.DType{layout.DTypeF32, layout.DTypeBF16, layout.DTypeFP8E4M3} {
		for _, order := range []layout.KVOrder{layout.NHD, layout.HND} {
			for _, tp := range []int{1, 2, 8} {
				for _, mla := range []bool{false, true} {
					l := mk(tp, order, 3)
					l.Model.DType, l.Model.MLA = dt, mla
					got, ref := regions(l), regions(l)
					Fill(l, got, 2, 91)
					fillEach(l, ref, 2, 91)
					name := fmt.Sprintf("%v TP %d %v MLA %v", dt, tp, order, mla)
					for r := range got {
						if !bytes.Equal(got[r], ref[r]) {
							t.Fatalf("%s: rank %d: Fill differs from the element-wise reference", name, r)
						}
					}
					if err := Check(l, ref, 2, 91); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					off := l.ChunkOffset(2, 1, 0) + 3*l.Model.DType.Size()
					ref[tp-1][off] ^= 0x10
					err := Check(l, ref, 2, 91)
					if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("rank %d layer 1 plane 0", tp-1)) {
						t.Fatalf("%s: a flipped byte at rank %d layer 1 plane 0: %v", name, tp-1, err)
					}
				}
			}
		}
	}
}
