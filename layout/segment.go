package layout

// Segment is one copy descriptor of a plan: Count pieces of Length bytes,
// the i-th read at SrcOffset + i×SrcStride of the source rank's region and
// written at DstOffset + i×DstStride of the destination rank's region.
// Offsets are relative to the regions' starts, never addresses. A plain
// contiguous copy has Count 1 and zero strides.
type Segment struct {
	SrcRank   int
	DstRank   int
	SrcOffset uint64
	DstOffset uint64
	Length    uint64
	Count     uint64
	SrcStride uint64
	DstStride uint64
}

// Bytes returns the bytes the segment moves.
func (s *Segment) Bytes() uint64 { return s.Length * s.Count }

// Piece returns the source and destination offsets of piece i.
func (s *Segment) Piece(i uint64) (src, dst uint64) {
	return s.SrcOffset + i*s.SrcStride, s.DstOffset + i*s.DstStride
}
