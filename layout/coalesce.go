package layout

// coalescer appends segments to a destination rank's plan, merging each new
// one into an earlier segment from the same source rank when the two are
// one copy: contiguous on both sides, or the next pieces of one stride.
//
// It looks back over the last few segments, not only the last one: in a
// gather the reads of several source ranks interleave, and in a
// layer-separate layout the same run of slots comes back once per layer, a
// layer stride further on. Segments of one destination rank never overlap,
// so their order does not matter and any of them may grow.
//
// Pieces arrive in small steps (one chunk at a time), so new strides are
// only started in a second pass over finished segments: pairing two pieces
// early would stop one of them from growing contiguously.
type coalescer struct {
	segs []Segment
}

// window is how many recent segments a new one may merge into.
const window = 16

// add merges s into an earlier segment it continues, or appends it.
func (c *coalescer) add(s Segment) { c.merge(s, extend) }

// finish returns the segments with strides started between equal ones.
func (c *coalescer) finish() []Segment {
	var out coalescer
	out.segs = make([]Segment, 0, len(c.segs))
	for _, s := range c.segs {
		out.merge(s, extend, startStride)
	}
	return out.segs
}

func (c *coalescer) merge(s Segment, rules ...func(l, s *Segment) bool) {
	if s.Count > 1 && s.SrcStride == s.Length && s.DstStride == s.Length {
		s.Length *= s.Count
		s.Count = 1
	}
	if s.Count == 1 {
		s.SrcStride, s.DstStride = 0, 0
	}
	lo := max(0, len(c.segs)-window)
	// Rules in order of preference: extending what is already contiguous
	// or strided beats starting a new stride.
	for _, rule := range rules {
		for i := len(c.segs) - 1; i >= lo; i-- {
			if l := &c.segs[i]; l.SrcRank == s.SrcRank && rule(l, &s) {
				return
			}
		}
	}
	c.segs = append(c.segs, s)
}

// extend grows l by s when s continues it exactly: the bytes right after a
// plain segment, or the next pieces of a strided one.
func extend(l, s *Segment) bool {
	if l.Count == 1 && s.Count == 1 {
		if l.SrcOffset+l.Length == s.SrcOffset && l.DstOffset+l.Length == s.DstOffset {
			l.Length += s.Length
			return true
		}
		return false
	}
	if l.Length != s.Length {
		return false
	}
	if l.Count == 1 {
		// A plain piece one stride before a strided segment heads it.
		if s.SrcOffset == l.SrcOffset+s.SrcStride && s.DstOffset == l.DstOffset+s.DstStride {
			l.SrcStride, l.DstStride = s.SrcStride, s.DstStride
			l.Count = s.Count + 1
			return true
		}
		return false
	}
	nextSrc, nextDst := l.Piece(l.Count)
	if s.SrcOffset != nextSrc || s.DstOffset != nextDst {
		return false
	}
	if s.Count == 1 || s.SrcStride == l.SrcStride && s.DstStride == l.DstStride {
		l.Count += s.Count
		return true
	}
	return false
}

// startStride turns two equal plain pieces, the second after the first on
// both sides, into a strided segment of two.
func startStride(l, s *Segment) bool {
	if l.Count != 1 || s.Count != 1 || l.Length != s.Length {
		return false
	}
	if s.SrcOffset < l.SrcOffset+l.Length || s.DstOffset < l.DstOffset+l.Length {
		return false
	}
	l.SrcStride, l.DstStride = s.SrcOffset-l.SrcOffset, s.DstOffset-l.DstOffset
	l.Count = 2
	return true
}
