package layout

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

func llama70B(tp int, order KVOrder, slots int) *Layout {
	m := ModelConfig{Layers: 80, KVHeads: 8, HeadDim: 128, DType: DTypeBF16}
	return makeLayout(m, 16, tp, order, FullyContiguous, 256, slots, 0)
}

func TestStrides(t *testing.T) {
	cases := []struct {
		name string
		l    *Layout
		want Strides
	}{
		{"llama70b tp4 fully contiguous", llama70B(4, HND, 10), Strides{
			HeadsPerRank: 2, Chunk: 16 * 2 * 128 * 2, Shard: 80 * 2 * 8192,
			KV: 8192, Layer: 16384, Block: 80 * 16384, Region: 10 * 80 * 16384}},
		{"padding to the alignment", makeLayout(ModelConfig{Layers: 3, KVHeads: 1, HeadDim: 5, DType: DTypeF32}, 3, 1, NHD, FullyContiguous, 64, 4, 0),
			Strides{HeadsPerRank: 1, Chunk: 60, Shard: 360, KV: 60, Layer: 120, Block: 384, Region: 1536}},
		{"layer separate", makeLayout(ModelConfig{Layers: 3, KVHeads: 1, HeadDim: 5, DType: DTypeF32}, 3, 1, NHD, LayerSeparate, 64, 4, 0),
			Strides{HeadsPerRank: 1, Chunk: 60, Shard: 360, KV: 60, Layer: 512, Block: 128, Region: 1536}},
		{"replicated heads", makeLayout(ModelConfig{Layers: 2, KVHeads: 2, HeadDim: 4, DType: DTypeF16}, 4, 8, HND, FullyContiguous, 1, 2, 0),
			Strides{HeadsPerRank: 1, Chunk: 32, Shard: 128, KV: 32, Layer: 64, Block: 128, Region: 256}},
		{"mla is one plane, never split", makeLayout(ModelConfig{Layers: 2, KVHeads: 1, HeadDim: 576, DType: DTypeBF16, MLA: true}, 16, 4, HND, FullyContiguous, 1, 2, 0),
			Strides{HeadsPerRank: 1, Chunk: 16 * 576 * 2, Shard: 2 * 16 * 576 * 2, KV: 16 * 576 * 2, Layer: 16 * 576 * 2, Block: 2 * 16 * 576 * 2, Region: 4 * 16 * 576 * 2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.l.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := tc.l.Strides(); got != tc.want {
				t.Errorf("strides = %+v\nwant      %+v", got, tc.want)
			}
		})
	}
}

func TestLocate(t *testing.T) {
	for _, arr := range []Arrangement{FullyContiguous, LayerSeparate} {
		l := makeLayout(ModelConfig{Layers: 3, KVHeads: 2, HeadDim: 3, DType: DTypeF16}, 2, 1, HND, arr, 64, 5, 0)
		s := l.Strides()
		owner := make([]int, s.Region)
		for i := range owner {
			owner[i] = -1
		}
		eachElemSlots(l, func(slot int, off uint64) {
			owner[off], owner[off+1] = slot, slot
		})
		for off := range s.Region {
			slot, end, ok := l.Locate(off)
			if want := owner[off]; (want >= 0) != ok || ok && slot != want {
				t.Fatalf("%v: Locate(%d) = %d, %v; want slot %d", arr, off, slot, ok, want)
			}
			if ok && (end <= off || end > s.Region || owner[end-1] != slot) {
				t.Fatalf("%v: Locate(%d) extent end %d not in slot %d", arr, off, end, slot)
			}
		}
		if _, _, ok := l.Locate(s.Region); ok {
			t.Errorf("%v: offset past the region located", arr)
		}
	}
}

func eachElemSlots(l *Layout, fn func(slot int, off uint64)) {
	for slot := range l.Slots {
		eachElem(l, slot, func(rank, layer, plane, head, tok, dim int, off uint64) { fn(slot, off) })
	}
}

func TestValidateNamesTheField(t *testing.T) {
	good := func() *Layout { return llama70B(4, HND, 16) }
	cases := []struct {
		name  string
		mut   func(l *Layout)
		field string
	}{
		{"zero layers", func(l *Layout) { l.Model.Layers = 0 }, "model.layers"},
		{"absurd layers", func(l *Layout) { l.Model.Layers = 1 << 20 }, "model.layers"},
		{"zero heads", func(l *Layout) { l.Model.KVHeads = 0 }, "model.kv_heads"},
		{"zero head dim", func(l *Layout) { l.Model.HeadDim = 0 }, "model.head_dim"},
		{"unknown dtype", func(l *Layout) { l.Model.DType = 99 }, "model.dtype"},
		{"zero page", func(l *Layout) { l.PageSize = 0 }, "page_size"},
		{"zero tp", func(l *Layout) { l.TPSize = 0 }, "tp_size"},
		{"heads not divisible by tp", func(l *Layout) { l.TPSize = 3; l.Regions = l.Regions[:3] }, "tp_size"},
		{"uneven replication", func(l *Layout) { l.Model.KVHeads = 3; l.TPSize = 4 }, "tp_size"},
		{"unknown order", func(l *Layout) { l.Order = 7 }, "kv_order"},
		{"unknown arrangement", func(l *Layout) { l.Arrangement = 0 }, "arrangement"},
		{"alignment not a power of two", func(l *Layout) { l.Alignment = 48 }, "alignment"},
		{"zero alignment", func(l *Layout) { l.Alignment = 0 }, "alignment"},
		{"zero slots", func(l *Layout) { l.Slots = 0 }, "slots"},
		{"too few regions", func(l *Layout) { l.Regions = l.Regions[:3] }, "regions"},
		{"region too small", func(l *Layout) { l.Regions[2].Size-- }, "regions[2].size"},
		{"misaligned base", func(l *Layout) { l.Regions[1].Base += 8 }, "regions[1].base"},
		{"region wraps", func(l *Layout) { l.Regions[0].Base = 1<<64 - 256 }, "regions[0].size"},
		{"unknown memory kind", func(l *Layout) { l.Regions[3].Kind = 0 }, "regions[3].kind"},
		{"region size overflows", func(l *Layout) {
			l.Model = ModelConfig{Layers: MaxLayers, KVHeads: MaxKVHeads, HeadDim: MaxHeadDim, DType: DTypeF32}
			l.PageSize, l.TPSize, l.Slots, l.Regions = MaxPageSize, 1, MaxSlots, l.Regions[:1]
		}, "slots"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := good()
			tc.mut(l)
			err := l.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want an error on %s", err, tc.field)
			}
		})
	}
	if err := good().Validate(); err != nil {
		t.Fatalf("good layout: %v", err)
	}
}

func TestProtoRoundTripAndDigest(t *testing.T) {
	l := llama70B(4, NHD, 100)
	b := l.Marshal()
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(l) {
		t.Fatalf("round trip changed the layout:\n%+v\n%+v", got, l)
	}
	if !bytes.Equal(got.Marshal(), b) || got.Digest() != l.Digest() {
		t.Fatal("canonical encoding not stable")
	}
	other := l.Clone()
	other.Regions[3].Base += 1 << 20
	if other.Digest() == l.Digest() {
		t.Fatal("digest does not cover region bases")
	}
	j, err := ParseJSON(l.JSON())
	if err != nil || !j.Equal(l) {
		t.Fatalf("JSON round trip: %v", err)
	}
}

// A newer peer's extra fields are ignored; a digest is of what we know.
func TestProtoForwardCompatible(t *testing.T) {
	l := llama70B(2, HND, 8)
	b := l.Marshal()
	newer := append(append([]byte(nil), b...), protoFieldVarint(99, 12345)...)
	got, err := Unmarshal(newer)
	if err != nil {
		t.Fatalf("unknown field refused: %v", err)
	}
	if got.Digest() != l.Digest() {
		t.Fatal("unknown fields changed the digest")
	}
	p := l.Proto()
	p.Version = 7
	if _, err := FromProto(p); err != nil {
		t.Fatalf("newer version refused: %v", err)
	}
}

func protoFieldVarint(num int, v uint64) []byte {
	b := []byte{byte(num<<3) | 0x80, byte(num >> 4)}
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

func TestFromProtoRefuses(t *testing.T) {
	cases := []struct {
		name  string
		mut   func(p *layoutpb.Layout)
		field string
	}{
		{"no version", func(p *layoutpb.Layout) { p.Version = 0 }, "version"},
		{"no model", func(p *layoutpb.Layout) { p.Model = nil }, "model"},
		{"enum out of range", func(p *layoutpb.Layout) { p.Model.Dtype = 1000 }, "model.dtype"},
		{"negative enum", func(p *layoutpb.Layout) { p.KvOrder = -1 }, "kv_order"},
		{"wrong block stride", func(p *layoutpb.Layout) { p.Strides.Block += 256 }, "strides.block"},
		{"wrong layer stride", func(p *layoutpb.Layout) { p.Strides.Layer-- }, "strides.layer"},
		{"huge tp", func(p *layoutpb.Layout) { p.TpSize = 1 << 31 }, "tp_size"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := llama70B(4, HND, 8).Proto()
			tc.mut(p)
			_, err := FromProto(p)
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field {
				t.Fatalf("err = %v, want an error on %s", err, tc.field)
			}
		})
	}
	if _, err := Unmarshal([]byte{0xff, 0xff}); !errors.Is(err, ErrInvalid) {
		t.Errorf("garbage: err = %v", err)
	}
	if _, err := ParseJSON([]byte(`{"version":1,"pageSise":16}`)); err == nil {
		t.Error("JSON with a misspelt field accepted")
	}
}

// FuzzUnmarshal: no input panics; what decodes is valid, re-encodes
// canonically, and decodes to the same layout.
func FuzzUnmarshal(f *testing.F) {
	for _, l := range []*Layout{
		llama70B(4, HND, 8), llama70B(8, NHD, 3),
		makeLayout(ModelConfig{Layers: 2, KVHeads: 1, HeadDim: 576, DType: DTypeBF16, MLA: true}, 16, 2, HND, LayerSeparate, 4096, 4, 100),
		makeLayout(ModelConfig{Layers: 1, KVHeads: 2, HeadDim: 4, DType: DTypeU8}, 1, 8, NHD, FullyContiguous, 1, 1, 0),
	} {
		f.Add(l.Marshal())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := Unmarshal(b)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not match ErrInvalid: %v", err)
			}
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("decoded layout invalid: %v", err)
		}
		enc := l.Marshal()
		again, err := Unmarshal(enc)
		if err != nil {
			t.Fatalf("re-encoded layout refused: %v", err)
		}
		if !again.Equal(l) || !bytes.Equal(again.Marshal(), enc) {
			t.Fatal("decode -> encode -> decode changed the layout")
		}
		// Planning a valid layout onto itself must work and stay in bounds.
		if l.Slots <= 64 && l.Strides().Region <= 1<<20 {
			p, err := NewPlan(l, l, []SlotPair{{0, l.Slots - 1}})
			if err != nil {
				t.Fatalf("plan onto itself: %v", err)
			}
			for _, segs := range p.Ranks {
				for _, s := range segs {
					if err := s.Check(l.Strides().Region, l.Strides().Region); err != nil {
						t.Fatalf("plan segment out of bounds: %v", err)
					}
				}
			}
		}
	})
}

// BlockBytes counts K and V per layer, or the one MLA latent.
func TestBlockBytes(t *testing.T) {
	m := ModelConfig{Layers: 80, KVHeads: 8, HeadDim: 128, DType: DTypeBF16}
	if got := m.BlockBytes(16); got != 80*2*8*128*16*2 {
		t.Errorf("Llama-70B block of 16: %d bytes", got)
	}
	m = ModelConfig{Layers: 61, KVHeads: 1, HeadDim: 576, DType: DTypeBF16, MLA: true}
	if got := m.BlockBytes(64); got != 61*576*64*2 {
		t.Errorf("MLA block of 64: %d bytes, want one latent plane", got)
	}
}
