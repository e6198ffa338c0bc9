package layout

import "fmt"

// DType is the element type of the KV cache. The set is closed: a peer that
// sends another value is refused.
type DType uint8

// The element types. Zero is not a dtype, so that a missing field is caught.
const (
	DTypeF32 DType = iota + 1
	DTypeF16
	DTypeBF16
	DTypeFP8E4M3
	DTypeFP8E5M2
	DTypeU8
)

var dtypeInfo = [...]struct {
	name string
	size uint64
}{
	DTypeF32:     {"f32", 4},
	DTypeF16:     {"f16", 2},
	DTypeBF16:    {"bf16", 2},
	DTypeFP8E4M3: {"fp8_e4m3", 1},
	DTypeFP8E5M2: {"fp8_e5m2", 1},
	DTypeU8:      {"u8", 1},
}

// Valid reports whether d is one of the known dtypes.
func (d DType) Valid() bool { return d >= DTypeF32 && d <= DTypeU8 }

// Size returns the bytes of one element, or 0 for an unknown dtype.
func (d DType) Size() uint64 {
	if !d.Valid() {
		return 0
	}
	return dtypeInfo[d].size
}

func (d DType) String() string {
	if !d.Valid() {
		return fmt.Sprintf("dtype(%d)", uint8(d))
	}
	return dtypeInfo[d].name
}

// ParseDType parses the names String returns.
func ParseDType(s string) (DType, error) {
	for d := DTypeF32; d <= DTypeU8; d++ {
		if dtypeInfo[d].name == s {
			return d, nil
		}
	}
	return 0, fmt.Errorf("layout: unknown dtype %q (want f32, f16, bf16, fp8_e4m3, fp8_e5m2 or u8)", s)
}

// ModelConfig is what makes two blocks' bytes comparable: blocks may be
// copied between layouts only when their model configs are equal.
type ModelConfig struct {
	// Layers is the number of transformer layers.
	Layers int
	// KVHeads is the number of KV heads (after grouped-query sharing). For
	// MLA it is the number of latent heads, usually 1.
	KVHeads int
	// HeadDim is the elements per head (for MLA, the latent width).
	HeadDim int
	// DType is the element type.
	DType DType
	// MLA marks multi-head latent attention: one latent tensor instead of K
	// and V, never split across TP ranks.
	MLA bool
}

// BlockBytes is the bytes of one block of page tokens of this model, every
// layer and KV head once (K and V, or the MLA latent): what importing the
// block moves into an engine's layout, padding and replicated heads aside.
func (m ModelConfig) BlockBytes(page int) uint64 {
	return uint64(m.Layers) * uint64(m.planes()) * uint64(m.KVHeads) * uint64(m.HeadDim) * uint64(page) * m.DType.Size()
}

// planes returns the tensors per layer: K and V, or the one MLA latent.
func (m ModelConfig) planes() int {
	if m.MLA {
		return 1
	}
	return 2
}

// KVOrder is the order of elements inside one (layer, K/V) chunk of a shard.
type KVOrder uint8

const (
	// NHD is [token][head][dim]: a head slice is strided per token.
	NHD KVOrder = iota + 1
	// HND is [head][token][dim]: a head slice is contiguous.
	HND
)

func (o KVOrder) String() string {
	switch o {
	case NHD:
		return "NHD"
	case HND:
		return "HND"
	}
	return fmt.Sprintf("kv_order(%d)", uint8(o))
}

// Arrangement is how a block's layers sit in a region.
type Arrangement uint8

const (
	// FullyContiguous keeps all layers of a block together:
	// [slot][layer][K/V][chunk].
	FullyContiguous Arrangement = iota + 1
	// LayerSeparate keeps each layer of all slots together, as engines that
	// allocate one tensor per layer do: [layer][slot][K/V][chunk].
	LayerSeparate
)

func (a Arrangement) String() string {
	switch a {
	case FullyContiguous:
		return "fully_contiguous"
	case LayerSeparate:
		return "layer_separate"
	}
	return fmt.Sprintf("arrangement(%d)", uint8(a))
}

// MemoryKind is the tier a region lives in.
type MemoryKind uint8

const (
	// Host is pageable host memory.
	Host MemoryKind = iota + 1
	// Pinned is page-locked host memory.
	Pinned
	// Device is GPU memory.
	Device
)

func (k MemoryKind) String() string {
	switch k {
	case Host:
		return "host"
	case Pinned:
		return "pinned"
	case Device:
		return "device"
	}
	return fmt.Sprintf("memory_kind(%d)", uint8(k))
}
