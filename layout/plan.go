package layout

import (
	"errors"
	"fmt"
)

// ErrIncompatible is matched by every refusal to plan between two layouts
// whose blocks cannot be translated into each other.
var ErrIncompatible = errors.New("layout: layouts cannot be translated")

// ErrPairs is matched by errors in the slot pairs given to [NewPlan].
var ErrPairs = errors.New("layout: invalid slot pairs")

// MismatchError names the field that makes two layouts untranslatable. It
// matches [ErrIncompatible].
type MismatchError struct {
	Field    string
	Src, Dst any
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("layout: cannot translate %s: source %v, destination %v", e.Field, e.Src, e.Dst)
}

// Is makes errors.Is(err, ErrIncompatible) true.
func (e *MismatchError) Is(target error) bool { return target == ErrIncompatible }

// SlotPair says that source slot Src goes to destination slot Dst.
//
// When the page sizes differ by an integer factor k, pairs come in groups of
// k. If the destination page is k times the source page, a group shares one
// Dst and lists the k source slots in token order. If the source page is k
// times the destination page, a group shares one Src and lists the k
// destination slots in token order.
type SlotPair struct {
	Src, Dst int
}

// Plan is the list of copies that moves blocks from a source layout to a
// destination layout. It is a value: nothing in it refers to memory.
type Plan struct {
	// Ranks holds, for each destination TP rank, the segments that fill it.
	// Segments of one rank never overlap in the destination.
	Ranks [][]Segment
}

// RankSummary describes the work of one destination rank.
type RankSummary struct {
	DstRank int
	// Segments is the number of descriptors; Pieces the contiguous copies
	// they expand to.
	Segments int
	Pieces   uint64
	Bytes    uint64
	// MinPiece and MaxPiece are the smallest and largest contiguous copy.
	MinPiece, MaxPiece uint64
	// SrcRanks is the number of source ranks the rank reads from.
	SrcRanks int
}

// Summary returns what each destination rank will copy.
func (p *Plan) Summary() []RankSummary {
	out := make([]RankSummary, len(p.Ranks))
	for r, segs := range p.Ranks {
		s := RankSummary{DstRank: r, Segments: len(segs)}
		srcs := map[int]bool{}
		for i := range segs {
			g := &segs[i]
			s.Pieces += g.Count
			s.Bytes += g.Bytes()
			if s.MinPiece == 0 || g.Length < s.MinPiece {
				s.MinPiece = g.Length
			}
			s.MaxPiece = max(s.MaxPiece, g.Length)
			srcs[g.SrcRank] = true
		}
		s.SrcRanks = len(srcs)
		out[r] = s
	}
	return out
}

// Bytes returns the total bytes the plan moves.
func (p *Plan) Bytes() uint64 {
	var n uint64
	for _, segs := range p.Ranks {
		for i := range segs {
			n += segs[i].Bytes()
		}
	}
	return n
}

// unit is a run of tokens copied from one source block to one destination
// block: n tokens from token srcTok of srcSlot to token dstTok of dstSlot.
type unit struct {
	srcSlot, dstSlot int
	srcTok, dstTok   int
	n                int
}

// headRun is a run of consecutive heads of one destination rank that sit,
// consecutively too, in one source rank's shard. Head indices are local to
// the ranks.
type headRun struct {
	srcRank          int
	srcHead, dstHead int
	n                int
}

// NewPlan computes the segments that copy the source slots of pairs into
// their destination slots, translating tensor parallelism, KV order, layer
// arrangement and page size. Both layouts are validated. It refuses, with a
// *MismatchError, layouts whose blocks are not the same data.
func NewPlan(src, dst *Layout, pairs []SlotPair) (*Plan, error) {
	if err := src.Validate(); err != nil {
		return nil, fmt.Errorf("source: %w", err)
	}
	if err := dst.Validate(); err != nil {
		return nil, fmt.Errorf("destination: %w", err)
	}
	if err := compatible(src, dst); err != nil {
		return nil, err
	}
	units, err := makeUnits(src, dst, pairs)
	if err != nil {
		return nil, err
	}
	p := &Plan{Ranks: make([][]Segment, dst.TPSize)}
	pl := planner{src: src, dst: dst, ss: src.Strides(), ds: dst.Strides(), units: units}
	for r := range dst.TPSize {
		p.Ranks[r] = pl.rank(r)
	}
	return p, nil
}

func compatible(src, dst *Layout) error {
	a, b := &src.Model, &dst.Model
	switch {
	case a.Layers != b.Layers:
		return &MismatchError{"model.layers", a.Layers, b.Layers}
	case a.KVHeads != b.KVHeads:
		return &MismatchError{"model.kv_heads", a.KVHeads, b.KVHeads}
	case a.HeadDim != b.HeadDim:
		return &MismatchError{"model.head_dim", a.HeadDim, b.HeadDim}
	case a.DType != b.DType:
		return &MismatchError{"model.dtype", a.DType, b.DType}
	case a.MLA != b.MLA:
		return &MismatchError{"model.mla", a.MLA, b.MLA}
	}
	if src.PageSize%dst.PageSize != 0 && dst.PageSize%src.PageSize != 0 {
		return &MismatchError{"page_size", src.PageSize, dst.PageSize}
	}
	return nil
}

func makeUnits(src, dst *Layout, pairs []SlotPair) ([]unit, error) {
	for i, p := range pairs {
		if p.Src < 0 || p.Src >= src.Slots {
			return nil, fmt.Errorf("%w: pair %d: source slot %d not in 0..%d", ErrPairs, i, p.Src, src.Slots-1)
		}
		if p.Dst < 0 || p.Dst >= dst.Slots {
			return nil, fmt.Errorf("%w: pair %d: destination slot %d not in 0..%d", ErrPairs, i, p.Dst, dst.Slots-1)
		}
	}
	sp, dp := src.PageSize, dst.PageSize
	k := max(sp, dp) / min(sp, dp)
	if len(pairs)%k != 0 {
		return nil, fmt.Errorf("%w: %d pairs do not form groups of %d (page sizes %d and %d)", ErrPairs, len(pairs), k, sp, dp)
	}
	units := make([]unit, len(pairs))
	seen := make(map[int]struct{}, len(pairs))
	for g := 0; g < len(pairs); g += k {
		group := pairs[g : g+k]
		for j, p := range group {
			u := unit{srcSlot: p.Src, dstSlot: p.Dst, n: min(sp, dp)}
			switch {
			case dp > sp: // k source blocks fill one destination block
				if p.Dst != group[0].Dst {
					return nil, fmt.Errorf("%w: pair %d: destination slot %d in a group for slot %d (a destination block takes %d source blocks)",
						ErrPairs, g+j, p.Dst, group[0].Dst, k)
				}
				u.dstTok = j * sp
			case sp > dp: // one source block fills k destination blocks
				if p.Src != group[0].Src {
					return nil, fmt.Errorf("%w: pair %d: source slot %d in a group for slot %d (a source block fills %d destination blocks)",
						ErrPairs, g+j, p.Src, group[0].Src, k)
				}
				u.srcTok = j * dp
			}
			units[g+j] = u
		}
		// Each destination slot is written once: by a whole group when
		// source blocks are gathered into it, else by one pair.
		written := group
		if dp > sp {
			written = group[:1]
		}
		for _, p := range written {
			if _, dup := seen[p.Dst]; dup {
				return nil, fmt.Errorf("%w: destination slot %d written twice", ErrPairs, p.Dst)
			}
			seen[p.Dst] = struct{}{}
		}
	}
	return units, nil
}

type planner struct {
	src, dst *Layout
	ss, ds   Strides
	units    []unit
}

// runs returns the head runs of destination rank r.
func (pl *planner) runs(r int) []headRun {
	src, dst := pl.src, pl.dst
	hpr := dst.HeadsPerRank()
	first := dst.FirstHead(r)
	var runs []headRun
	for i := range hpr {
		var sr, sh int
		switch h := first + i; {
		case src.Model.MLA:
			sr, sh = r%src.TPSize, i
		case src.TPSize > src.Model.KVHeads:
			// Replicated heads: spread the readers over the replicas.
			rep := src.TPSize / src.Model.KVHeads
			sr, sh = h*rep+r%rep, 0
		default:
			sr, sh = h/pl.ss.HeadsPerRank, h%pl.ss.HeadsPerRank
		}
		if n := len(runs); n > 0 {
			last := &runs[n-1]
			if last.srcRank == sr && last.srcHead+last.n == sh {
				last.n++
				continue
			}
		}
		runs = append(runs, headRun{srcRank: sr, srcHead: sh, dstHead: i, n: 1})
	}
	return runs
}

// rank plans destination rank r, walking its memory in address order so
// that neighbouring copies meet in the coalescer.
func (pl *planner) rank(r int) []Segment {
	runs := pl.runs(r)
	var b coalescer
	layers, planes := pl.dst.Model.Layers, pl.dst.Model.planes()
	if pl.dst.Arrangement == LayerSeparate {
		for l := range layers {
			for _, u := range pl.units {
				for p := range planes {
					pl.chunk(&b, r, runs, u, l, p)
				}
			}
		}
	} else {
		for _, u := range pl.units {
			for l := range layers {
				for p := range planes {
					pl.chunk(&b, r, runs, u, l, p)
				}
			}
		}
	}
	return b.finish()
}

// chunk emits the copies of one (unit, layer, plane) chunk of rank r.
func (pl *planner) chunk(b *coalescer, r int, runs []headRun, u unit, layer, plane int) {
	src, dst := pl.src, pl.dst
	es := src.Model.DType.Size()
	hd := uint64(src.Model.HeadDim) * es // bytes of one head of one token
	sHPR, dHPR := uint64(pl.ss.HeadsPerRank), uint64(pl.ds.HeadsPerRank)
	sPage, dPage := uint64(src.PageSize), uint64(dst.PageSize)
	sBase := pl.ss.offset(src.Arrangement, u.srcSlot, layer, plane)
	dBase := pl.ds.offset(dst.Arrangement, u.dstSlot, layer, plane)
	n := uint64(u.n)
	sTok, dTok := uint64(u.srcTok), uint64(u.dstTok)
	for _, run := range runs {
		sh, dh, m := uint64(run.srcHead), uint64(run.dstHead), uint64(run.n)
		s := Segment{SrcRank: run.srcRank, DstRank: r}
		switch {
		case src.Order == HND && dst.Order == HND:
			// Per head, the tokens are contiguous on both sides.
			s.SrcOffset = sBase + (sh*sPage+sTok)*hd
			s.DstOffset = dBase + (dh*dPage+dTok)*hd
			s.Length, s.Count = n*hd, m
			s.SrcStride, s.DstStride = sPage*hd, dPage*hd
			b.add(s)
		case src.Order == NHD && dst.Order == NHD:
			// Per token, the run's heads are contiguous on both sides.
			s.SrcOffset = sBase + (sTok*sHPR+sh)*hd
			s.DstOffset = dBase + (dTok*dHPR+dh)*hd
			s.Length, s.Count = m*hd, n
			s.SrcStride, s.DstStride = sHPR*hd, dHPR*hd
			b.add(s)
		default:
			// Orders differ: one head of one token is the largest
			// contiguous piece; one strided segment per head.
			for i := range m {
				if src.Order == NHD {
					s.SrcOffset = sBase + (sTok*sHPR+sh+i)*hd
					s.SrcStride = sHPR * hd
					s.DstOffset = dBase + ((dh+i)*dPage+dTok)*hd
					s.DstStride = hd
				} else {
					s.SrcOffset = sBase + ((sh+i)*sPage+sTok)*hd
					s.SrcStride = hd
					s.DstOffset = dBase + (dTok*dHPR+dh+i)*hd
					s.DstStride = dHPR * hd
				}
				s.Length, s.Count = hd, n
				b.add(s)
			}
		}
	}
}
