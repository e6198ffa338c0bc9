package layout

// Region is the memory of one TP rank's shards of a block set.
type Region struct {
	// Base is the address of the region in its owner's address space. It is
	// informational to peers, which address a region by offset.
	Base uint64
	// Size is the bytes of the region; it must hold every slot.
	Size uint64
	// Device is the GPU index for Device memory, or the NUMA node (-1 for
	// any) for host memory.
	Device int32
	// Kind is the memory tier.
	Kind MemoryKind
}

// Layout is how one block set sits in memory. A Layout that came from a peer
// must pass [Layout.Validate] before any other method is called on it.
type Layout struct {
	Model ModelConfig
	// PageSize is the tokens per block.
	PageSize int
	// TPSize is the tensor-parallel size: the number of ranks, and regions.
	TPSize int
	// Order is the element order inside a (layer, K/V) chunk.
	Order KVOrder
	// Arrangement is how the layers of a block are placed.
	Arrangement Arrangement
	// Alignment is a power of two that block and layer strides are rounded
	// up to.
	Alignment uint64
	// Slots is the number of blocks in the set.
	Slots int
	// Regions holds one region per TP rank, in rank order.
	Regions []Region
}

// Strides are the derived byte distances of a layout, identical for every
// rank of the block set.
type Strides struct {
	// HeadsPerRank is the KV heads one rank's shard holds.
	HeadsPerRank int
	// Chunk is the bytes of one (layer, K/V) piece of one block's shard.
	Chunk uint64
	// Shard is the bytes of one block's shard on one rank, padding excluded.
	Shard uint64
	// KV is the distance between the K and V chunks of one layer.
	KV uint64
	// Layer is the distance between consecutive layers of one block.
	Layer uint64
	// Block is the distance between consecutive slots.
	Block uint64
	// Region is the smallest region that holds every slot.
	Region uint64
}

// HeadsPerRank returns how many KV heads one rank holds: the whole set for
// MLA, one when heads are replicated (TP > KVHeads), else KVHeads/TP.
func (l *Layout) HeadsPerRank() int {
	switch {
	case l.Model.MLA:
		return l.Model.KVHeads
	case l.TPSize > l.Model.KVHeads:
		return 1
	default:
		return l.Model.KVHeads / l.TPSize
	}
}

// FirstHead returns the global index of the first KV head rank holds.
func (l *Layout) FirstHead(rank int) int {
	switch {
	case l.Model.MLA:
		return 0
	case l.TPSize > l.Model.KVHeads:
		return rank / (l.TPSize / l.Model.KVHeads)
	default:
		return rank * l.HeadsPerRank()
	}
}

// Strides returns the derived strides. The layout must be valid.
func (l *Layout) Strides() Strides {
	s, _ := l.strides()
	return s
}

// strides computes the strides with overflow checks; the field that
// overflowed is returned with the zero Strides.
func (l *Layout) strides() (Strides, *FieldError) {
	var s Strides
	var ok bool
	m := &l.Model
	s.HeadsPerRank = l.HeadsPerRank()
	s.Chunk, ok = mulAll(uint64(l.PageSize), uint64(s.HeadsPerRank), uint64(m.HeadDim), m.DType.Size())
	if !ok {
		return Strides{}, fieldErr("page_size", "page × heads per rank × head dim × dtype size overflows")
	}
	planes := uint64(m.planes())
	s.KV = s.Chunk
	s.Shard, ok = mulAll(s.Chunk, planes, uint64(m.Layers))
	if !ok {
		return Strides{}, fieldErr("model.layers", "shard size overflows")
	}
	switch l.Arrangement {
	case FullyContiguous:
		s.Layer = planes * s.Chunk
		s.Block, ok = alignUp(s.Shard, l.Alignment)
		if !ok {
			return Strides{}, fieldErr("alignment", "block stride overflows")
		}
		s.Region, ok = mulAll(s.Block, uint64(l.Slots))
		if !ok {
			return Strides{}, fieldErr("slots", "region size overflows")
		}
	case LayerSeparate:
		s.Block, ok = alignUp(planes*s.Chunk, l.Alignment)
		if !ok {
			return Strides{}, fieldErr("alignment", "block stride overflows")
		}
		perLayer, ok := mulAll(s.Block, uint64(l.Slots))
		if ok {
			s.Layer, ok = alignUp(perLayer, l.Alignment)
		}
		if !ok {
			return Strides{}, fieldErr("slots", "layer stride overflows")
		}
		s.Region, ok = mulAll(s.Layer, uint64(m.Layers))
		if !ok {
			return Strides{}, fieldErr("model.layers", "region size overflows")
		}
	}
	return s, nil
}

// Offset returns the offset in a rank's region of the chunk of (slot, layer,
// plane), where plane is 0 for K (or the MLA latent) and 1 for V.
func (s *Strides) offset(a Arrangement, slot, layer, plane int) uint64 {
	if a == LayerSeparate {
		return uint64(layer)*s.Layer + uint64(slot)*s.Block + uint64(plane)*s.KV
	}
	return uint64(slot)*s.Block + uint64(layer)*s.Layer + uint64(plane)*s.KV
}

// ChunkOffset returns the offset in each rank's region of the chunk of
// (slot, layer, plane), where plane is 0 for K (or the MLA latent) and 1 for
// V. The layout must be valid and the indices in range.
func (l *Layout) ChunkOffset(slot, layer, plane int) uint64 {
	s := l.Strides()
	return s.offset(l.Arrangement, slot, layer, plane)
}

// Locate finds the slot whose shard holds byte offset of a rank's region. It
// returns the slot and the end of the contiguous extent of that slot's shard
// that holds offset; ok is false when offset is in padding or past the last
// slot. A reader's range is inside a set of slots when walking it extent by
// extent finds only those slots. The layout must be valid.
func (l *Layout) Locate(offset uint64) (slot int, extentEnd uint64, ok bool) {
	s := l.Strides()
	if offset >= s.Region {
		return 0, 0, false
	}
	switch l.Arrangement {
	case LayerSeparate:
		layer := offset / s.Layer
		in := offset % s.Layer
		slot := in / s.Block
		if slot >= uint64(l.Slots) {
			return 0, 0, false
		}
		start := layer*s.Layer + slot*s.Block
		end := start + uint64(l.Model.planes())*s.Chunk
		if offset >= end {
			return 0, 0, false
		}
		return int(slot), end, true
	default:
		slot := offset / s.Block
		end := slot*s.Block + s.Shard
		if offset >= end {
			return 0, 0, false
		}
		return int(slot), end, true
	}
}

// Equal reports whether two layouts describe the same memory.
func (l *Layout) Equal(o *Layout) bool {
	if l.Model != o.Model || l.PageSize != o.PageSize || l.TPSize != o.TPSize ||
		l.Order != o.Order || l.Arrangement != o.Arrangement ||
		l.Alignment != o.Alignment || l.Slots != o.Slots || len(l.Regions) != len(o.Regions) {
		return false
	}
	for i := range l.Regions {
		if l.Regions[i] != o.Regions[i] {
			return false
		}
	}
	return true
}

// Clone returns a deep copy.
func (l *Layout) Clone() *Layout {
	c := *l
	c.Regions = append([]Region(nil), l.Regions...)
	return &c
}
