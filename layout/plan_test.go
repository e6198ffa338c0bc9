package layout

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

var planSeed = flag.Uint64("layout.seed", 0, "seed of the plan property test (0: from the clock)")
var planIters = flag.Int("layout.iters", 400, "random configurations tried by the plan property test")

// elem returns the offset of one element in a rank's region, from the
// formulas of the package doc, written out again so that the test does not
// share the planner's arithmetic.
func elem(l *Layout, slot, layer, plane, localHead, tok, dim int) uint64 {
	es := int(l.Model.DType.Size())
	hpr := l.HeadsPerRank()
	planes := 2
	if l.Model.MLA {
		planes = 1
	}
	chunk := l.PageSize * hpr * l.Model.HeadDim * es
	align := func(v int) int { a := int(l.Alignment); return (v + a - 1) / a * a }
	var base int
	if l.Arrangement == FullyContiguous {
		base = slot*align(l.Model.Layers*planes*chunk) + (layer*planes+plane)*chunk
	} else {
		blk := align(planes * chunk)
		base = layer*align(l.Slots*blk) + slot*blk + plane*chunk
	}
	var in int
	if l.Order == NHD {
		in = (tok*hpr+localHead)*l.Model.HeadDim + dim
	} else {
		in = (localHead*l.PageSize+tok)*l.Model.HeadDim + dim
	}
	return uint64(base + in*es)
}

// value is the content of the element (block, layer, K/V, token, head, dim)
// of the logical data: which rank or slot holds it does not change it.
func value(block, layer, plane, tok, head, dim int) uint64 {
	x := uint64(block)<<48 ^ uint64(layer)<<40 ^ uint64(plane)<<36 ^ uint64(tok)<<24 ^ uint64(head)<<12 ^ uint64(dim)
	x ^= x >> 31
	x *= 0x9e3779b97f4a7c15
	return x ^ x>>29
}

// eachElem calls fn for every element of every rank of one slot.
func eachElem(l *Layout, slot int, fn func(rank, layer, plane, head, tok, dim int, off uint64)) {
	planes := 2
	if l.Model.MLA {
		planes = 1
	}
	for r := range l.TPSize {
		for layer := range l.Model.Layers {
			for p := range planes {
				for lh := range l.HeadsPerRank() {
					for tok := range l.PageSize {
						for d := range l.Model.HeadDim {
							fn(r, layer, p, l.FirstHead(r)+lh, tok, d, elem(l, slot, layer, p, lh, tok, d))
						}
					}
				}
			}
		}
	}
}

func regions(l *Layout, fill byte) [][]byte {
	out := make([][]byte, l.TPSize)
	for r := range out {
		out[r] = make([]byte, l.Regions[r].Size)
		for i := range out[r] {
			out[r][i] = fill
		}
	}
	return out
}

func makeLayout(m ModelConfig, page, tp int, order KVOrder, arr Arrangement, align uint64, slots int, extra uint64) *Layout {
	l := &Layout{Model: m, PageSize: page, TPSize: tp, Order: order, Arrangement: arr, Alignment: align, Slots: slots}
	l.Regions = make([]Region, tp)
	for r := range l.Regions {
		l.Regions[r] = Region{Base: 1 << 30 * uint64(r+1), Kind: Host}
	}
	size := l.Strides().Region + extra
	for r := range l.Regions {
		l.Regions[r].Size = size
	}
	return l
}

// randomCase draws two compatible layouts and slot pairs between them.
func randomCase(rng *rand.Rand) (src, dst *Layout, pairs []SlotPair) {
	m := ModelConfig{
		Layers:  1 + rng.IntN(3),
		HeadDim: 1 + rng.IntN(4),
		DType:   []DType{DTypeF32, DTypeF16, DTypeBF16, DTypeFP8E4M3, DTypeU8}[rng.IntN(5)],
		MLA:     rng.IntN(6) == 0,
	}
	tp := func() int {
		if m.MLA {
			return 1 + rng.IntN(4)
		}
		var ok []int
		for t := 1; t <= 16; t++ {
			if m.KVHeads%t == 0 || t%m.KVHeads == 0 {
				ok = append(ok, t)
			}
		}
		return ok[rng.IntN(len(ok))]
	}
	if m.MLA {
		m.KVHeads = 1
	} else {
		m.KVHeads = []int{1, 2, 4, 8}[rng.IntN(4)]
	}
	base := 1 + rng.IntN(4)
	sp, dp := base, base
	switch k := 1 + rng.IntN(3); rng.IntN(3) {
	case 0:
		sp *= k
	case 1:
		dp *= k
	}
	orders := []KVOrder{NHD, HND}
	arrs := []Arrangement{FullyContiguous, LayerSeparate}
	aligns := []uint64{1, 2, 8, 64, 256}
	src = makeLayout(m, sp, tp(), orders[rng.IntN(2)], arrs[rng.IntN(2)], aligns[rng.IntN(5)], 2+rng.IntN(7), uint64(rng.IntN(3)))
	dst = makeLayout(m, dp, tp(), orders[rng.IntN(2)], arrs[rng.IntN(2)], aligns[rng.IntN(5)], 2+rng.IntN(7), uint64(rng.IntN(3)))

	k := max(sp, dp) / min(sp, dp)
	switch {
	case dp > sp: // groups of k source slots share one destination slot
		for _, d := range rng.Perm(dst.Slots)[:1+rng.IntN(dst.Slots)] {
			for range k {
				pairs = append(pairs, SlotPair{Src: rng.IntN(src.Slots), Dst: d})
			}
		}
	case sp > dp: // one source slot spread over k destination slots
		dsts := rng.Perm(dst.Slots)
		for g := range rng.IntN(dst.Slots/k + 1) {
			s := rng.IntN(src.Slots)
			for j := range k {
				pairs = append(pairs, SlotPair{Src: s, Dst: dsts[g*k+j]})
			}
		}
	default:
		for _, d := range rng.Perm(dst.Slots)[:1+rng.IntN(dst.Slots)] {
			pairs = append(pairs, SlotPair{Src: rng.IntN(src.Slots), Dst: d})
		}
	}
	return src, dst, pairs
}

func describe(l *Layout) string {
	return fmt.Sprintf("{%+v page=%d tp=%d %v %v align=%d slots=%d}", l.Model, l.PageSize, l.TPSize, l.Order, l.Arrangement, l.Alignment, l.Slots)
}

// TestPlanProperty plans and executes random translations and checks every
// destination element, and that nothing outside the destination slots was
// written.
func TestPlanProperty(t *testing.T) {
	seed := *planSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	for i := range *planIters {
		rng := rand.New(rand.NewPCG(seed, uint64(i)))
		src, dst, pairs := randomCase(rng)
		if err := checkPlan(src, dst, pairs); err != nil {
			t.Fatalf("seed %d iteration %d (rerun: go test ./layout -run TestPlanProperty -layout.seed=%d):\nsrc %s\ndst %s\npairs %v\n%v",
				seed, i, seed, describe(src), describe(dst), pairs, err)
		}
	}
}

func checkPlan(src, dst *Layout, pairs []SlotPair) error {
	p, err := NewPlan(src, dst, pairs)
	if err != nil {
		return fmt.Errorf("NewPlan: %w", err)
	}
	es := int(src.Model.DType.Size())
	sMem := regions(src, 0)
	for s := range src.Slots {
		eachElem(src, s, func(rank, layer, plane, head, tok, dim int, off uint64) {
			var v [8]byte
			binary.LittleEndian.PutUint64(v[:], value(s, layer, plane, tok, head, dim))
			copy(sMem[rank][off:off+uint64(es)], v[:es])
		})
	}
	const sentinel = 0xA5
	dMem := regions(dst, sentinel)
	if err := Execute(p, sMem, dMem); err != nil {
		return fmt.Errorf("Execute: %w", err)
	}
	covered := make([][]bool, dst.TPSize)
	for r := range covered {
		covered[r] = make([]bool, len(dMem[r]))
	}
	units, _ := makeUnits(src, dst, pairs)
	var firstErr error
	for _, u := range units {
		eachElem(dst, u.dstSlot, func(rank, layer, plane, head, tok, dim int, off uint64) {
			if tok < u.dstTok || tok >= u.dstTok+u.n || firstErr != nil {
				return
			}
			var want [8]byte
			binary.LittleEndian.PutUint64(want[:], value(u.srcSlot, layer, plane, u.srcTok+tok-u.dstTok, head, dim))
			got := dMem[rank][off : off+uint64(es)]
			if string(got) != string(want[:es]) {
				firstErr = fmt.Errorf("dst rank %d slot %d layer %d plane %d head %d token %d dim %d: got %x, want %x (from src slot %d token %d)",
					rank, u.dstSlot, layer, plane, head, tok, dim, got, want[:es], u.srcSlot, u.srcTok+tok-u.dstTok)
			}
			for i := range uint64(es) {
				covered[rank][off+i] = true
			}
		})
	}
	if firstErr != nil {
		return firstErr
	}
	for r := range dMem {
		for i, b := range dMem[r] {
			if !covered[r][i] && b != sentinel {
				return fmt.Errorf("dst rank %d byte %d outside the destination blocks was written", r, i)
			}
		}
	}
	var want uint64
	for r := range covered {
		for _, c := range covered[r] {
			if c {
				want++
			}
		}
	}
	if got := p.Bytes(); got != want {
		return fmt.Errorf("plan moves %d bytes, the blocks hold %d (a byte read twice or missed)", got, want)
	}
	return nil
}

// Between identical layouts, a plan is at most one segment per contiguous
// run of slots, whatever the arrangement and padding.
func TestPlanIdenticalCoalesces(t *testing.T) {
	m := ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 16, DType: DTypeBF16}
	for _, arr := range []Arrangement{FullyContiguous, LayerSeparate} {
		for _, order := range []KVOrder{NHD, HND} {
			for _, align := range []uint64{1, 4096} {
				l := makeLayout(m, 16, 2, order, arr, align, 64, 0)
				name := fmt.Sprintf("%v/%v/align=%d", arr, order, align)
				cases := []struct {
					pairs []SlotPair
					runs  int
				}{
					{seqPairs(0, 0, 64), 1},
					{append(seqPairs(0, 10, 5), seqPairs(20, 40, 7)...), 2},
					{append(append(seqPairs(3, 3, 2), seqPairs(9, 30, 6)...), seqPairs(50, 50, 3)...), 3},
				}
				for _, tc := range cases {
					p, err := NewPlan(l, l, tc.pairs)
					if err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					for r, segs := range p.Ranks {
						if len(segs) > tc.runs {
							t.Errorf("%s: rank %d: %d segments for %d runs of slots: %+v", name, r, len(segs), tc.runs, segs)
						}
					}
					if err := checkPlan(l, l, tc.pairs); err != nil {
						t.Errorf("%s: %v", name, err)
					}
				}
			}
		}
	}
}

func seqPairs(src, dst, n int) []SlotPair {
	out := make([]SlotPair, n)
	for i := range out {
		out[i] = SlotPair{Src: src + i, Dst: dst + i}
	}
	return out
}

func TestPlanRefusals(t *testing.T) {
	base := ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 16, DType: DTypeBF16}
	mk := func(mut func(m *ModelConfig), page int) *Layout {
		m := base
		if mut != nil {
			mut(&m)
		}
		return makeLayout(m, page, 1, HND, FullyContiguous, 1, 8, 0)
	}
	ok := mk(nil, 16)
	cases := []struct {
		name  string
		dst   *Layout
		field string
	}{
		{"layers", mk(func(m *ModelConfig) { m.Layers = 5 }, 16), "model.layers"},
		{"kv heads", mk(func(m *ModelConfig) { m.KVHeads = 4 }, 16), "model.kv_heads"},
		{"head dim", mk(func(m *ModelConfig) { m.HeadDim = 32 }, 16), "model.head_dim"},
		{"dtype", mk(func(m *ModelConfig) { m.DType = DTypeF16 }, 16), "model.dtype"},
		{"mla", mk(func(m *ModelConfig) { m.MLA = true }, 16), "model.mla"},
		{"page ratio not an integer", mk(nil, 24), "page_size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewPlan(ok, tc.dst, seqPairs(0, 0, 1))
			var me *MismatchError
			if !errors.As(err, &me) || me.Field != tc.field || !errors.Is(err, ErrIncompatible) {
				t.Fatalf("err = %v, want a mismatch of %s", err, tc.field)
			}
		})
	}
	big := mk(nil, 32)
	pairCases := []struct {
		name     string
		src, dst *Layout
		pairs    []SlotPair
	}{
		{"source slot out of range", ok, ok, []SlotPair{{8, 0}}},
		{"negative destination slot", ok, ok, []SlotPair{{0, -1}}},
		{"destination written twice", ok, ok, []SlotPair{{0, 3}, {1, 3}}},
		{"incomplete group", ok, big, []SlotPair{{0, 0}}},
		{"group spans destinations", ok, big, []SlotPair{{0, 0}, {1, 1}}},
		{"group spans sources", big, ok, []SlotPair{{0, 0}, {1, 1}}},
		{"groups write one destination", ok, big, []SlotPair{{0, 0}, {1, 0}, {2, 0}, {3, 0}}},
	}
	for _, tc := range pairCases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := NewPlan(tc.src, tc.dst, tc.pairs); !errors.Is(err, ErrPairs) {
				t.Fatalf("err = %v, want ErrPairs", err)
			}
		})
	}
	bad := ok.Clone()
	bad.Regions[0].Size--
	if _, err := NewPlan(ok, bad, seqPairs(0, 0, 1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("invalid destination: err = %v, want ErrInvalid", err)
	}
}

func TestExecuteRejectsOutOfBounds(t *testing.T) {
	src := [][]byte{make([]byte, 100)}
	dst := [][]byte{make([]byte, 100)}
	for i := range dst[0] {
		dst[0][i] = 7
	}
	cases := []Segment{
		{Length: 10, Count: 1, SrcOffset: 95},
		{Length: 10, Count: 1, DstOffset: 91},
		{Length: 10, Count: 3, SrcStride: 50, DstStride: 10},
		{Length: 10, Count: 2, SrcStride: 5, DstStride: 10},
		{Length: 1, Count: 1 << 40, SrcStride: 1 << 40, DstStride: 1},
		{Length: 1<<64 - 1, Count: 1, SrcOffset: 2},
		{Length: 0, Count: 1},
		{SrcRank: 1, Length: 1, Count: 1},
	}
	for _, s := range cases {
		p := &Plan{Ranks: [][]Segment{{{Length: 5, Count: 1}, s}}}
		if err := Execute(p, src, dst); err == nil {
			t.Errorf("segment %+v: no error", s)
		}
		for i, b := range dst[0] {
			if b != 7 {
				t.Fatalf("segment %+v: byte %d written by a rejected plan", s, i)
			}
		}
	}
}
