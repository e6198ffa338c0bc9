package layout

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// FormatVersion is the layout wire format this package writes.
const FormatVersion = 1

// MaxEncodedSize caps an encoded layout accepted from a peer. A layout of
// MaxTPSize regions is about 30 KiB.
const MaxEncodedSize = 1 << 20

// Digest identifies a layout by the SHA-256 of its canonical encoding:
// peers compare digests to know when to fetch a layout again.
type Digest [sha256.Size]byte

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// Short returns the first 12 hex digits, for logs and tables.
func (d Digest) Short() string { return hex.EncodeToString(d[:6]) }

// Proto returns the wire form of the layout, strides included.
func (l *Layout) Proto() *layoutpb.Layout {
	s := l.Strides()
	m := &layoutpb.Layout{
		Version:     FormatVersion,
		Model:       l.Model.Proto(),
		PageSize:    uint32(l.PageSize),
		TpSize:      uint32(l.TPSize),
		KvOrder:     layoutpb.KVOrder(l.Order),
		Arrangement: layoutpb.Arrangement(l.Arrangement),
		Alignment:   l.Alignment,
		Slots:       uint32(l.Slots),
		Strides:     &layoutpb.Strides{Block: s.Block, Layer: s.Layer, Kv: s.KV},
	}
	m.Regions = make([]*layoutpb.Region, len(l.Regions))
	for i, r := range l.Regions {
		m.Regions[i] = &layoutpb.Region{Base: r.Base, Size: r.Size, Device: r.Device, Kind: layoutpb.MemoryKind(r.Kind)}
	}
	return m
}

// Proto returns the wire form of the model config.
func (m ModelConfig) Proto() *layoutpb.ModelConfig {
	return &layoutpb.ModelConfig{
		Layers:  uint32(m.Layers),
		KvHeads: uint32(m.KVHeads),
		HeadDim: uint32(m.HeadDim),
		Dtype:   layoutpb.DType(m.DType),
		Mla:     m.MLA,
	}
}

// ModelConfigFromProto converts and validates a model config.
func ModelConfigFromProto(p *layoutpb.ModelConfig) (ModelConfig, error) {
	if p == nil {
		return ModelConfig{}, fieldErr("model", "missing")
	}
	m := ModelConfig{
		Layers:  int(p.GetLayers()),
		KVHeads: int(p.GetKvHeads()),
		HeadDim: int(p.GetHeadDim()),
		DType:   DType(enum8(int32(p.GetDtype()))),
		MLA:     p.GetMla(),
	}
	if err := m.Validate(); err != nil {
		return ModelConfig{}, err
	}
	return m, nil
}

// KVOrderFromProto converts a wire KV order; a value the package does not
// know becomes one that validation refuses.
func KVOrderFromProto(o layoutpb.KVOrder) KVOrder { return KVOrder(enum8(int32(o))) }

// ArrangementFromProto converts a wire arrangement likewise.
func ArrangementFromProto(a layoutpb.Arrangement) Arrangement { return Arrangement(enum8(int32(a))) }

// enum8 maps a wire enum to the Go one, sending values that do not fit to
// zero, which validation refuses.
func enum8(v int32) uint8 {
	if v < 0 || v > 255 {
		return 0
	}
	return uint8(v)
}

// FromProto converts a layout from its wire form and validates it. The
// result is safe to use whatever the message held.
func FromProto(p *layoutpb.Layout) (*Layout, error) {
	if p.GetVersion() < 1 {
		return nil, fieldErr("version", "missing (want >= 1)")
	}
	m, err := ModelConfigFromProto(p.GetModel())
	if err != nil {
		return nil, err
	}
	if n := len(p.GetRegions()); n > MaxTPSize {
		return nil, fieldErr("regions", "%d regions (at most %d)", n, MaxTPSize)
	}
	l := &Layout{
		Model:       m,
		PageSize:    int(p.GetPageSize()),
		TPSize:      int(p.GetTpSize()),
		Order:       KVOrderFromProto(p.GetKvOrder()),
		Arrangement: ArrangementFromProto(p.GetArrangement()),
		Alignment:   p.GetAlignment(),
		Slots:       int(p.GetSlots()),
		Regions:     make([]Region, len(p.GetRegions())),
	}
	for i, r := range p.GetRegions() {
		l.Regions[i] = Region{Base: r.GetBase(), Size: r.GetSize(), Device: r.GetDevice(), Kind: MemoryKind(enum8(int32(r.GetKind())))}
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	if ps := p.GetStrides(); ps != nil {
		s := l.Strides()
		for _, c := range []struct {
			field      string
			sent, want uint64
		}{{"strides.block", ps.GetBlock(), s.Block}, {"strides.layer", ps.GetLayer(), s.Layer}, {"strides.kv", ps.GetKv(), s.KV}} {
			if c.sent != c.want {
				return nil, fieldErr(c.field, "sent %d, derived %d", c.sent, c.want)
			}
		}
	}
	return l, nil
}

// Marshal returns the canonical encoding of the layout: deterministic, with
// no unknown fields.
func (l *Layout) Marshal() []byte {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(l.Proto())
	if err != nil {
		// Marshalling a message built here cannot fail.
		panic(fmt.Sprintf("layout: marshal: %v", err))
	}
	return b
}

// Unmarshal decodes and validates a layout received from a peer.
func Unmarshal(b []byte) (*Layout, error) {
	if len(b) > MaxEncodedSize {
		return nil, fmt.Errorf("%w: encoded layout is %d bytes (at most %d)", ErrInvalid, len(b), MaxEncodedSize)
	}
	var p layoutpb.Layout
	if err := proto.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%w: decode: %v", ErrInvalid, err)
	}
	return FromProto(&p)
}

// Digest returns the digest of the canonical encoding.
func (l *Layout) Digest() Digest { return sha256.Sum256(l.Marshal()) }

// ParseJSON reads a layout in protobuf JSON form, as operators write it, and
// validates it. Unknown fields are errors here: in a file they are typos.
func ParseJSON(b []byte) (*Layout, error) {
	var p layoutpb.Layout
	if err := protojson.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return FromProto(&p)
}

// JSON returns the layout in protobuf JSON form.
func (l *Layout) JSON() []byte {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(l.Proto())
	if err != nil {
		panic(fmt.Sprintf("layout: marshal json: %v", err))
	}
	return b
}
