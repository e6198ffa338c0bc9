package layout

import (
	"errors"
	"fmt"
	"math/bits"
)

// ErrSegment is matched by a segment that does not fit the memory it names.
var ErrSegment = errors.New("layout: segment out of bounds")

// Check reports whether every piece of s lies inside a source region of
// srcLen bytes and a destination region of dstLen bytes. It is safe on
// segments from untrusted peers: no sum or product may wrap.
func (s *Segment) Check(srcLen, dstLen uint64) error {
	if s.Count == 0 || s.Length == 0 {
		return fmt.Errorf("%w: empty segment (length %d, count %d)", ErrSegment, s.Length, s.Count)
	}
	if s.Count > 1 && (s.SrcStride < s.Length || s.DstStride < s.Length) {
		// Overlapping destination pieces would make the result depend on
		// copy order; overlapping source pieces are a sign of garbage.
		return fmt.Errorf("%w: strides %d/%d shorter than length %d", ErrSegment, s.SrcStride, s.DstStride, s.Length)
	}
	if end, ok := span(s.SrcOffset, s.Count, s.SrcStride, s.Length); !ok || end > srcLen {
		return fmt.Errorf("%w: source bytes [%d, %d) of %d", ErrSegment, s.SrcOffset, end, srcLen)
	}
	if end, ok := span(s.DstOffset, s.Count, s.DstStride, s.Length); !ok || end > dstLen {
		return fmt.Errorf("%w: destination bytes [%d, %d) of %d", ErrSegment, s.DstOffset, end, dstLen)
	}
	return nil
}

// span returns off + (count-1)×stride + length, and false if it overflows.
func span(off, count, stride, length uint64) (uint64, bool) {
	hi, last := bits.Mul64(count-1, stride)
	if hi != 0 {
		return 0, false
	}
	end, c1 := bits.Add64(off, last, 0)
	end, c2 := bits.Add64(end, length, 0)
	return end, c1 == 0 && c2 == 0
}

// Execute applies a plan to host memory: src[r] is source rank r's region,
// dst[r] destination rank r's. Every segment is checked before any byte is
// copied, so a plan that does not fit the memory changes nothing.
func Execute(p *Plan, src, dst [][]byte) error {
	if len(dst) != len(p.Ranks) {
		return fmt.Errorf("layout: %d destination regions for a plan of %d ranks", len(dst), len(p.Ranks))
	}
	for r, segs := range p.Ranks {
		if err := checkRank(segs, src, dst[r]); err != nil {
			return fmt.Errorf("destination rank %d: %w", r, err)
		}
	}
	for r, segs := range p.Ranks {
		copyRank(segs, src, dst[r])
	}
	return nil
}

// ExecuteRank applies the segments of one destination rank.
func ExecuteRank(segs []Segment, src [][]byte, dst []byte) error {
	if err := checkRank(segs, src, dst); err != nil {
		return err
	}
	copyRank(segs, src, dst)
	return nil
}

func checkRank(segs []Segment, src [][]byte, dst []byte) error {
	for i := range segs {
		s := &segs[i]
		if s.SrcRank < 0 || s.SrcRank >= len(src) {
			return fmt.Errorf("%w: segment %d reads source rank %d of %d", ErrSegment, i, s.SrcRank, len(src))
		}
		if err := s.Check(uint64(len(src[s.SrcRank])), uint64(len(dst))); err != nil {
			return fmt.Errorf("segment %d: %w", i, err)
		}
	}
	return nil
}

func copyRank(segs []Segment, src [][]byte, dst []byte) {
	// Segments of equal count that follow each other (the interleaved reads
	// of a gather) are copied in lock step, piece i of each in turn, so that
	// the destination is written front to back rather than in one pass per
	// source rank.
	for i := 0; i < len(segs); {
		j := i + 1
		for j < len(segs) && segs[j].Count == segs[i].Count && segs[j].Count > 1 {
			j++
		}
		if group := segs[i:j]; len(group) == 1 {
			copySegment(&group[0], src[group[0].SrcRank], dst)
		} else {
			for k := range group[0].Count {
				for g := range group {
					s := &group[g]
					so, do := s.SrcOffset+k*s.SrcStride, s.DstOffset+k*s.DstStride
					copy(dst[do:do+s.Length], src[s.SrcRank][so:so+s.Length])
				}
			}
		}
		i = j
	}
}

func copySegment(s *Segment, src, dst []byte) {
	so, do, n := s.SrcOffset, s.DstOffset, s.Length
	for range s.Count {
		copy(dst[do:do+n], src[so:so+n])
		so += s.SrcStride
		do += s.DstStride
	}
}
