//go:build cgo && linux

package cuda_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

func planLayout(tp int, order layout.KVOrder, arr layout.Arrangement, slots int) *layout.Layout {
	l := &layout.Layout{
		Model:    layout.ModelConfig{Layers: 3, KVHeads: 8, HeadDim: 16, DType: layout.DTypeBF16},
		PageSize: 4, TPSize: tp, Order: order, Arrangement: arr, Alignment: 256, Slots: slots,
	}
	l.Regions = make([]layout.Region, tp)
	for r := range l.Regions {
		l.Regions[r] = layout.Region{Base: 1 << 30 * uint64(r+1), Kind: layout.Device}
	}
	size := l.Strides().Region
	for r := range l.Regions {
		l.Regions[r].Size = size
	}
	return l
}

// A plan executed on the device, one 2-D copy per segment, writes exactly
// what the host executor writes for the same plan and source bytes.
func TestExecutePlanMatchesHost(t *testing.T) {
	d, _ := openSoft(t)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	cases := []struct {
		srcTP, dstTP int
		srcOrder     layout.KVOrder
		dstOrder     layout.KVOrder
		arr          layout.Arrangement
	}{
		{4, 2, layout.HND, layout.HND, layout.FullyContiguous},
		{2, 4, layout.NHD, layout.NHD, layout.FullyContiguous},
		{4, 2, layout.NHD, layout.HND, layout.LayerSeparate},
		{1, 8, layout.HND, layout.NHD, layout.FullyContiguous},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("tp=%d->%d/%v->%v/%v", c.srcTP, c.dstTP, c.srcOrder, c.dstOrder, c.arr), func(t *testing.T) {
			src := planLayout(c.srcTP, c.srcOrder, c.arr, 6)
			dst := planLayout(c.dstTP, c.dstOrder, c.arr, 5)
			pairs := []layout.SlotPair{{Src: 0, Dst: 4}, {Src: 3, Dst: 1}, {Src: 4, Dst: 2}, {Src: 5, Dst: 3}}
			p, err := layout.NewPlan(src, dst, pairs)
			if err != nil {
				t.Fatal(err)
			}
			hostSrc, hostDst := make([][]byte, c.srcTP), make([][]byte, c.dstTP)
			devSrc, devDst := make([]cuda.Region, c.srcTP), make([]cuda.Region, c.dstTP)
			for r := range hostSrc {
				hostSrc[r] = pattern(int(src.Regions[r].Size), byte(r+1))
				m, err := d.AllocDevice(0, src.Regions[r].Size)
				if err != nil {
					t.Fatal(err)
				}
				closeT(t, m)
				if err := s.CopyHtoD(m.Addr(), hostSrc[r]); err != nil {
					t.Fatal(err)
				}
				devSrc[r] = cuda.Region{Addr: m.Addr(), Size: m.Size()}
			}
			for r := range hostDst {
				hostDst[r] = make([]byte, dst.Regions[r].Size)
				m, err := d.AllocDevice(0, dst.Regions[r].Size)
				if err != nil {
					t.Fatal(err)
				}
				closeT(t, m)
				if err := s.CopyHtoD(m.Addr(), hostDst[r]); err != nil {
					t.Fatal(err)
				}
				devDst[r] = cuda.Region{Addr: m.Addr(), Size: m.Size()}
			}
			if err := layout.Execute(p, hostSrc, hostDst); err != nil {
				t.Fatal(err)
			}
			if err := s.ExecutePlan(cuda.DeviceToDevice, p, devSrc, devDst); err != nil {
				t.Fatal(err)
			}
			var segs int
			for _, rs := range p.Ranks {
				segs += len(rs)
			}
			for r := range hostDst {
				got := make([]byte, len(hostDst[r]))
				if err := s.CopyDtoH(got, devDst[r].Addr); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, hostDst[r]) {
					t.Fatalf("destination rank %d differs from the host executor's", r)
				}
			}
			t.Logf("%d segments, %d bytes", segs, p.Bytes())
		})
	}
}

// A plan that does not fit its regions queues nothing.
func TestExecutePlanRefusesOutOfBounds(t *testing.T) {
	d, _ := openSoft(t)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	m, err := d.AllocDevice(0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, m)
	if err := s.CopyHtoD(m.Addr(), make([]byte, 8192)); err != nil {
		t.Fatal(err)
	}
	reg := []cuda.Region{{Addr: m.Addr(), Size: 4096}}
	dreg := []cuda.Region{{Addr: m.Addr() + 4096, Size: 4096}}
	p := &layout.Plan{Ranks: [][]layout.Segment{{
		{SrcRank: 0, DstRank: 0, Length: 16, Count: 1},
		{SrcRank: 0, DstRank: 0, SrcOffset: 0, DstOffset: 4096 - 8, Length: 16, Count: 1},
	}}}
	if err := s.ExecutePlan(cuda.DeviceToDevice, p, reg, dreg); !errors.Is(err, cuda.ErrInvalidValue) || !errors.Is(err, layout.ErrSegment) {
		t.Errorf("segment past the destination: %v", err)
	}
	p.Ranks[0][1].SrcRank = 1
	if err := s.ExecutePlan(cuda.DeviceToDevice, p, reg, dreg); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("segment from a missing source rank: %v", err)
	}
	if err := s.ExecutePlan(cuda.DeviceToDevice, p, reg, nil); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("no destination regions: %v", err)
	}
	got := make([]byte, 16)
	if err := s.CopyDtoH(got, m.Addr()+4096); err != nil || !bytes.Equal(got, make([]byte, 16)) {
		t.Errorf("a refused plan wrote: %v", err)
	}
}

// Strides up to MaxPitch go as one 2-D copy; a wider stride (which the
// driver refuses as a pitch) is copied piece by piece, with the same result.
func TestExecutePlanAtAndPastMaxPitch(t *testing.T) {
	// Device memory is a sparse memfd: 6 GiB of address costs only the
	// pages the copies touch.
	d, _ := openSoft(t, "SOFTCUDA_MEMORY=12G")
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	const n = 6 << 30
	a, err := d.AllocDevice(0, n)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, a)
	b, err := d.AllocDevice(0, n)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, b)
	for _, stride := range []uint64{cuda.MaxPitch, cuda.MaxPitch + 1} {
		t.Run(fmt.Sprint(stride), func(t *testing.T) {
			for k := range uint64(3) {
				if err := s.CopyHtoD(a.Addr()+k*stride, pattern(64, byte(k+1))); err != nil {
					t.Fatal(err)
				}
			}
			p := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 64, Count: 3, SrcStride: stride, DstStride: stride}}}}
			err := s.ExecutePlan(cuda.DeviceToDevice, p, []cuda.Region{{Addr: a.Addr(), Size: n}}, []cuda.Region{{Addr: b.Addr(), Size: n}})
			if err != nil {
				t.Fatal(err)
			}
			for k := range uint64(3) {
				got := make([]byte, 64)
				if err := s.CopyDtoH(got, b.Addr()+k*stride); err != nil || !bytes.Equal(got, pattern(64, byte(k+1))) {
					t.Errorf("piece %d: %v", k, err)
				}
			}
			direct := cuda.Copy2D{Dir: cuda.DeviceToDevice, Dst: b.Addr(), DstPitch: stride, Src: a.Addr(), SrcPitch: stride, Width: 64, Height: 3}
			err = s.Copy2DAsync(direct)
			if stride <= cuda.MaxPitch && err != nil {
				t.Errorf("2-D copy at the pitch limit: %v", err)
			}
			if stride > cuda.MaxPitch && !errors.Is(err, cuda.ErrInvalidValue) {
				t.Errorf("2-D copy past the pitch limit: %v, want ErrInvalidValue", err)
			}
			if err := s.Synchronize(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
