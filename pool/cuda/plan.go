package cuda

import (
	"fmt"

	"github.com/kvfabric/kvfabric/layout"
)

// MaxPitch is the widest pitch a 2-D copy takes
// (CU_DEVICE_ATTRIBUTE_MAX_PITCH on current GPUs). A strided segment whose
// stride is wider is copied one piece at a time instead.
const MaxPitch = 1<<31 - 1

// Region is memory a plan reads or writes: a device pointer or a host
// address (as the copy's direction says) and its size.
type Region struct {
	Addr uint64
	Size uint64
}

// ExecutePlan queues a plan's copies on s: src[r] is source rank r's
// region and dst[r] destination rank r's. Each segment is one 2-D copy (its
// pieces are the rows, its strides the pitches), so a strided NHD head
// slice costs one call, not one per token. Every segment is checked
// against the regions before anything is queued, so a plan that does not
// fit changes nothing. It returns once the copies are queued: record an
// event or synchronise the stream to know they are done.
func (s *Stream) ExecutePlan(dir Direction, p *layout.Plan, src, dst []Region) error {
	if len(dst) != len(p.Ranks) {
		return fmt.Errorf("cuda: plan: %d destination regions for a plan of %d ranks: %w", len(dst), len(p.Ranks), ErrInvalidValue)
	}
	for r, segs := range p.Ranks {
		for i := range segs {
			sg := &segs[i]
			if sg.SrcRank < 0 || sg.SrcRank >= len(src) {
				return fmt.Errorf("cuda: plan: destination rank %d segment %d reads source rank %d of %d: %w",
					r, i, sg.SrcRank, len(src), ErrInvalidValue)
			}
			if err := sg.Check(src[sg.SrcRank].Size, dst[r].Size); err != nil {
				return fmt.Errorf("cuda: plan: destination rank %d segment %d: %w: %w", r, i, err, ErrInvalidValue)
			}
		}
	}
	for r, segs := range p.Ranks {
		for i := range segs {
			sg := &segs[i]
			if err := s.copySegment(dir, sg, src[sg.SrcRank].Addr, dst[r].Addr); err != nil {
				return fmt.Errorf("cuda: plan: destination rank %d segment %d: %w", r, i, err)
			}
		}
	}
	return nil
}

func (s *Stream) copySegment(dir Direction, sg *layout.Segment, src, dst uint64) error {
	if sg.Count == 1 {
		return s.CopyAsync(dir, dst+sg.DstOffset, src+sg.SrcOffset, sg.Length)
	}
	if sg.SrcStride <= MaxPitch && sg.DstStride <= MaxPitch {
		return s.Copy2DAsync(Copy2D{
			Dir: dir, Dst: dst + sg.DstOffset, DstPitch: sg.DstStride,
			Src: src + sg.SrcOffset, SrcPitch: sg.SrcStride,
			Width: sg.Length, Height: sg.Count,
		})
	}
	for k := range sg.Count {
		so, do := sg.Piece(k)
		if err := s.CopyAsync(dir, dst+do, src+so, sg.Length); err != nil {
			return err
		}
	}
	return nil
}
