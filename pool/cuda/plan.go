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
// address (as the copy's direction says), its size, and for device memory
// the GPU it is on.
type Region struct {
	Addr uint64
	Size uint64
	// Device is the GPU (the driver's index, 0 to len(Devices())-1) whose
	// memory Addr is. Only DeviceToDevice plans read it, and there it
	// decides how each segment is copied:
	//
	//   - source and destination regions name the same GPU: the ordinary
	//     copies on the stream, exactly as before Device existed, so callers
	//     whose memory is all on one GPU may leave it 0 on both sides
	//     whatever that GPU is (put the stream on that GPU);
	//   - they name different GPUs: peer copies (cuMemcpyPeerAsync,
	//     cuMemcpy3DPeerAsync) between the two GPUs' primary contexts, after
	//     the driver has confirmed, before anything is queued, that each such
	//     region is memory of the GPU it names and lies inside one
	//     allocation. The stream may be on either GPU or a third.
	//
	// A DeviceToDevice plan refuses a Device that is not a GPU of the
	// driver, even where both sides name the same one. HostToDevice and
	// DeviceToHost plans ignore Device, as they ignore it on host memory:
	// their device side is copied by the stream's GPU, so put the stream on
	// the GPU that memory is on (pinned memory from AllocPinned or PinHost
	// is portable: a stream on any GPU copies to and from it).
	Device int
}

// ExecutePlan queues a plan's copies on s: src[r] is source rank r's
// region and dst[r] destination rank r's. Each segment is one 2-D copy (its
// pieces are the rows, its strides the pitches), so a strided NHD head
// slice costs one call, not one per token. In a DeviceToDevice plan a
// segment between regions on different GPUs (see Region.Device) is a peer
// copy: one call for a contiguous run, one 2-D peer copy for a strided
// one. Every segment is checked against the regions, and every region a
// peer copy touches against the driver's view of its memory, before
// anything is queued, so a plan that does not fit changes nothing. It
// returns once the copies are queued: record an event or synchronise the
// stream to know they are done.
func (s *Stream) ExecutePlan(dir Direction, p *layout.Plan, src, dst []Region) error {
	if dir < HostToDevice || dir > DeviceToDevice {
		return fmt.Errorf("cuda: plan: %v: %w", dir, ErrInvalidValue)
	}
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
	if dir == DeviceToDevice {
		if err := s.checkPeerRegions(p, src, dst); err != nil {
			return err
		}
	}
	for r, segs := range p.Ranks {
		for i := range segs {
			sg := &segs[i]
			sr, dr := &src[sg.SrcRank], &dst[r]
			var err error
			if dir == DeviceToDevice && sr.Device != dr.Device {
				err = s.copyPeerSegment(sg, sr, dr)
			} else {
				err = s.copySegment(dir, sg, sr.Addr, dr.Addr)
			}
			if err != nil {
				return fmt.Errorf("cuda: plan: destination rank %d segment %d: %w", r, i, err)
			}
		}
	}
	return nil
}

// checkPeerRegions checks the Device of every region a DeviceToDevice
// plan touches, and asks the driver about every region a peer copy
// touches: it must be memory of the GPU it names, inside one allocation.
func (s *Stream) checkPeerRegions(p *layout.Plan, src, dst []Region) error {
	srcPeer := make([]bool, len(src))
	dstPeer := make([]bool, len(dst))
	for r, segs := range p.Ranks {
		for i := range segs {
			sr, dr := &src[segs[i].SrcRank], &dst[r]
			for _, c := range [...]struct {
				side string
				rank int
				dev  int
			}{{"source", segs[i].SrcRank, sr.Device}, {"destination", r, dr.Device}} {
				if n := len(s.d.devices); c.dev < 0 || c.dev >= n {
					return fmt.Errorf("cuda: plan: %s rank %d region names GPU %d, the driver has %d (0 to %d): %w",
						c.side, c.rank, c.dev, n, n-1, ErrInvalidValue)
				}
			}
			if sr.Device != dr.Device {
				srcPeer[segs[i].SrcRank] = true
				dstPeer[r] = true
			}
		}
	}
	for _, side := range [...]struct {
		name    string
		regions []Region
		peer    []bool
	}{{"source", src, srcPeer}, {"destination", dst, dstPeer}} {
		for r, reg := range side.regions {
			if !side.peer[r] {
				continue
			}
			if err := s.checkRegion(reg); err != nil {
				return fmt.Errorf("cuda: plan: %s rank %d region %#x+%d on GPU %d: %w", side.name, r, reg.Addr, reg.Size, reg.Device, err)
			}
		}
	}
	return nil
}

// checkRegion asks the driver whether reg is memory of reg.Device inside
// one allocation.
func (s *Stream) checkRegion(reg Region) error {
	if err := s.d.context(reg.Device); err != nil {
		return err
	}
	dev, err := s.d.lib.pointerDevice(reg.Device, reg.Addr)
	if err != nil {
		return fmt.Errorf("which GPU holds it: %w", err)
	}
	if dev != reg.Device {
		return fmt.Errorf("the memory is on GPU %d: %w", dev, ErrInvalidValue)
	}
	base, size, err := s.d.lib.addressRange(reg.Device, reg.Addr)
	if err != nil {
		return fmt.Errorf("its allocation: %w", err)
	}
	if end := base + size; reg.Size > end-reg.Addr {
		return fmt.Errorf("it runs %d bytes past the end of its allocation %#x+%d: %w", reg.Size-(end-reg.Addr), base, size, ErrInvalidValue)
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

// copyPeerSegment copies a segment between two GPUs: a contiguous run
// (one piece, or pieces packed back to back on both sides) as one peer
// copy, a strided one as one 2-D peer copy, or piece by piece where a
// stride is wider than MaxPitch.
func (s *Stream) copyPeerSegment(sg *layout.Segment, src, dst *Region) error {
	if sg.Length == 0 || sg.Count == 0 {
		return nil
	}
	if sg.Count == 1 || (sg.SrcStride == sg.Length && sg.DstStride == sg.Length) {
		return s.CopyPeerAsync(dst.Addr+sg.DstOffset, dst.Device, src.Addr+sg.SrcOffset, src.Device, sg.Bytes())
	}
	if sg.SrcStride <= MaxPitch && sg.DstStride <= MaxPitch && sg.SrcStride >= sg.Length && sg.DstStride >= sg.Length {
		c := Copy2D{
			Dir: DeviceToDevice, Dst: dst.Addr + sg.DstOffset, DstPitch: sg.DstStride,
			Src: src.Addr + sg.SrcOffset, SrcPitch: sg.SrcStride,
			Width: sg.Length, Height: sg.Count,
		}
		if err := s.d.lib.copy2DPeerAsync(s.dev, c, dst.Device, src.Device, s.h); err != nil {
			return fmt.Errorf("cuda: device %d: 2-D peer copy %dx%d (GPU %d -> GPU %d): %w", s.dev, c.Width, c.Height, src.Device, dst.Device, err)
		}
		return nil
	}
	for k := range sg.Count {
		so, do := sg.Piece(k)
		if err := s.CopyPeerAsync(dst.Addr+do, dst.Device, src.Addr+so, src.Device, sg.Length); err != nil {
			return err
		}
	}
	return nil
}
