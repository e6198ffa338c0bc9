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
// It works in two stages. Pieces arrive in small steps (one chunk at a
// time) and the first stage only extends: pairing two pieces into a new
// stride early would stop one of them from growing contiguously. A segment
// that has left the first stage's window can no longer grow there, so it
// moves to the second stage, which also starts strides between equal
// segments. Both stages keep little: the plan's memory is its final size.
type coalescer struct {
	active []Segment // first stage: the last pieces, still growing
	final  []Segment // second stage: the plan
}

// window is how many recent segments a new one may merge into.
const window = 16

func (c *coalescer) add(s Segment) {
	if s.Count > 1 && s.SrcStride == s.Length && s.DstStride == s.Length {
		s.Length *= s.Count
		s.Count = 1
	}
	if s.Count == 1 {
		s.SrcStride, s.DstStride = 0, 0
	}
	if mergeInto(c.active, &s, false) {
		return
	}
	c.active = append(c.active, s)
	if len(c.active) >= 4*window {
		c.settle(len(c.active) - window)
	}
}

// settle moves the first n active segments to the second stage.
func (c *coalescer) settle(n int) {
	for i := range n {
		s := c.active[i]
		if !mergeInto(c.final, &s, true) {
			c.final = append(c.final, s)
		}
	}
	c.active = append(c.active[:0], c.active[n:]...)
}

// finish returns the plan's segments.
func (c *coalescer) finish() []Segment {
	c.settle(len(c.active))
	return c.final
}

// mergeInto merges s into one of the last window segments of segs and
// reports whether it did. Extending is preferred to starting a stride.
func mergeInto(segs []Segment, s *Segment, strides bool) bool {
	lo := max(0, len(segs)-window)
	for i := len(segs) - 1; i >= lo; i-- {
		if l := &segs[i]; l.SrcRank == s.SrcRank && extend(l, s) {
			return true
		}
	}
	if !strides {
		return false
	}
	for i := len(segs) - 1; i >= lo; i-- {
		if l := &segs[i]; l.SrcRank == s.SrcRank && startStride(l, s) {
			return true
		}
	}
	return false
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
