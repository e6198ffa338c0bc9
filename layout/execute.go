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
	stream := p.Bytes() >= streamMin
	for r, segs := range p.Ranks {
		copyRank(segs, src, dst[r], stream)
	}
	if stream {
		sfence()
	}
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

// streamMin is the plan size from which large pieces bypass the cache: a
// plan this large does not fit in it anyway, and what a plan writes is read
// later by someone else (an engine, a peer), not by the copying core.
const streamMin = 16 << 20

// streamPiece is the piece size from which streaming pays: smaller pieces
// gain little and pay the alignment of their ends.
const streamPiece = 1 << 10

// copyRank copies the segments; with stream, large pieces use
// non-temporal stores and the caller must sfence before the data is used.
func copyRank(segs []Segment, src [][]byte, dst []byte, stream bool) {
	// Segments of equal count that follow each other (the interleaved
	// reads of a gather) are copied in lock step, piece i of each in turn,
	// so that the destination is written front to back rather than in one
	// pass per source rank.
	for i := 0; i < len(segs); {
		j := i + 1
		for j < len(segs) && segs[j].Count == segs[i].Count && segs[j].Count > 1 {
			j++
		}
		group := segs[i:j]
		for k := range group[0].Count {
			for g := range group {
				s := &group[g]
				so, do := s.SrcOffset+k*s.SrcStride, s.DstOffset+k*s.DstStride
				d, from := dst[do:do+s.Length], src[s.SrcRank][so:so+s.Length]
				if stream && haveStream && s.Length >= streamPiece {
					copyStream(d, from)
				} else {
					copy(d, from)
				}
			}
		}
		i = j
	}
}
