//go:build cgo && linux

package cuda_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// peerCase is a plan between two block sets whose ranks live on the GPUs
// named: srcDevs[r] holds source rank r, dstDevs[r] destination rank r.
type peerCase struct {
	order            layout.KVOrder
	srcDevs, dstDevs []int
}

func (c peerCase) String() string {
	return fmt.Sprintf("%v/gpus=%v->%v", c.order, c.srcDevs, c.dstDevs)
}

// peerPlanRoundTrip fills the source ranks on their GPUs, executes the plan
// on s, copies every destination rank back to the host and compares it
// with what the host executor writes for the same plan and bytes. It
// returns how many of the plan's segments cross GPUs, how many of those
// are strided (neither one piece nor packed on both sides), and how many
// stay on one GPU.
func peerPlanRoundTrip(t *testing.T, d *cuda.Driver, s *cuda.Stream, c peerCase) (crossing, strided, same int) {
	t.Helper()
	src := planLayout(len(c.srcDevs), c.order, layout.FullyContiguous, 6)
	dst := planLayout(len(c.dstDevs), c.order, layout.FullyContiguous, 5)
	pairs := []layout.SlotPair{{Src: 0, Dst: 4}, {Src: 3, Dst: 1}, {Src: 4, Dst: 2}, {Src: 5, Dst: 3}}
	p, err := layout.NewPlan(src, dst, pairs)
	if err != nil {
		t.Fatal(err)
	}
	alloc := func(dev int, b []byte) cuda.Region {
		m, err := d.AllocDevice(dev, uint64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		closeT(t, m)
		if err := s.CopyHtoD(m.Addr(), b); err != nil {
			t.Fatal(err)
		}
		return cuda.Region{Addr: m.Addr(), Size: m.Size(), Device: dev}
	}
	hostSrc, hostDst := make([][]byte, len(c.srcDevs)), make([][]byte, len(c.dstDevs))
	devSrc, devDst := make([]cuda.Region, len(c.srcDevs)), make([]cuda.Region, len(c.dstDevs))
	for r, dev := range c.srcDevs {
		hostSrc[r] = pattern(int(src.Regions[r].Size), byte(r+1))
		devSrc[r] = alloc(dev, hostSrc[r])
	}
	for r, dev := range c.dstDevs {
		hostDst[r] = pattern(int(dst.Regions[r].Size), byte(0x80+r))
		devDst[r] = alloc(dev, hostDst[r])
	}
	if err := layout.Execute(p, hostSrc, hostDst); err != nil {
		t.Fatal(err)
	}
	if err := s.ExecutePlan(cuda.DeviceToDevice, p, devSrc, devDst); err != nil {
		t.Fatal(err)
	}
	for r, segs := range p.Ranks {
		for _, sg := range segs {
			if c.srcDevs[sg.SrcRank] == c.dstDevs[r] {
				same++
				continue
			}
			crossing++
			if sg.Count > 1 && (sg.SrcStride != sg.Length || sg.DstStride != sg.Length) {
				strided++
			}
		}
	}
	for r := range hostDst {
		got := make([]byte, len(hostDst[r]))
		if err := s.CopyDtoH(got, devDst[r].Addr); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, hostDst[r]) {
			t.Fatalf("destination rank %d (GPU %d) differs from the host executor's", r, c.dstDevs[r])
		}
	}
	t.Logf("%d segments cross GPUs, %d of them strided, %d stay on one; %d bytes", crossing, strided, same, p.Bytes())
	return crossing, strided, same
}

// ordinaryDtoD fails every ordinary device-to-device copy, so that a plan
// that still succeeds moved its bytes by peer copies only.
const ordinaryDtoD = "SOFTCUDA_FAIL=cuMemcpyDtoDAsync_v2=999,cuMemcpy2DAsync_v2=999"

// TP ranks copied between GPU 0 and GPU 1 arrive whole: contiguous HND
// head slices and strided NHD ones, gathered (TP 4 -> 2) and split
// (TP 2 -> 4), with the stream on either GPU. Where every rank crosses,
// the ordinary device-to-device copies are made to fail, so the bytes can
// only have come by peer copies; where ranks are spread over both GPUs,
// one plan mixes peer and ordinary copies.
func TestExecutePlanAcrossGPUs(t *testing.T) {
	peerOnly, _ := openSoft(t, "SOFTCUDA_DEVICES=2", ordinaryDtoD)
	mixed, _ := openSoft(t, "SOFTCUDA_DEVICES=2")
	cases := []struct {
		peerCase
		d *cuda.Driver
	}{
		{peerCase{layout.HND, []int{0, 0, 0, 0}, []int{1, 1}}, peerOnly},
		{peerCase{layout.NHD, []int{0, 0, 0, 0}, []int{1, 1}}, peerOnly},
		{peerCase{layout.NHD, []int{1, 1}, []int{0, 0, 0, 0}}, peerOnly},
		{peerCase{layout.HND, []int{0, 1}, []int{1, 0, 1, 0}}, mixed},
		{peerCase{layout.NHD, []int{1, 0}, []int{0, 1, 0, 1}}, mixed},
		{peerCase{layout.NHD, []int{0, 1, 0, 1}, []int{1, 1}}, mixed},
	}
	for _, c := range cases {
		for _, on := range []int{0, 1} {
			t.Run(fmt.Sprintf("%v/stream=%d", c.peerCase, on), func(t *testing.T) {
				s, err := c.d.NewStream(on)
				if err != nil {
					t.Fatal(err)
				}
				closeT(t, s)
				crossing, strided, same := peerPlanRoundTrip(t, c.d, s, c.peerCase)
				if crossing == 0 {
					t.Fatal("no segment crosses GPUs: the case tests nothing")
				}
				if c.order == layout.NHD && strided == 0 {
					t.Fatal("an NHD head slice made no strided segment: the 2-D peer copy went untested")
				}
				if c.d == mixed && same == 0 {
					t.Fatal("no segment stays on one GPU: the mixed case mixes nothing")
				}
			})
		}
	}
}

// A run packed on both sides crosses GPUs as one cuMemcpyPeerAsync: the
// second call, and any 2-D peer copy, fail as injected.
func TestExecutePlanPeerCoalesces(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2", "SOFTCUDA_FAIL=cuMemcpyPeerAsync=999@2,cuMemcpy3DPeerAsync=999")
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	a, b := allocPair(t, d, s, 0, 1, 8192)
	p := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 512, Count: 8, SrcOffset: 64, SrcStride: 512, DstOffset: 128, DstStride: 512}}}}
	if err := s.ExecutePlan(cuda.DeviceToDevice, p, []cuda.Region{a}, []cuda.Region{b}); err != nil {
		t.Fatal(err)
	}
	checkPlan(t, s, p, a, b)
	if err := s.ExecutePlan(cuda.DeviceToDevice, p, []cuda.Region{a}, []cuda.Region{b}); err == nil || !strings.Contains(err.Error(), "cuMemcpyPeerAsync") {
		t.Errorf("second plan: %v, want the injected failure of the second peer copy", err)
	}
}

// A plan whose regions are all on one GPU takes the ordinary copies, also
// when the regions leave Device 0 while the memory is on GPU 1 (callers
// that predate Device): the peer calls and the pointer query would fail.
func TestExecutePlanSameGPUUsesOrdinaryCopies(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2", "SOFTCUDA_FAIL=cuMemcpyPeerAsync=999,cuMemcpy3DPeerAsync=999,cuPointerGetAttribute=999")
	s, err := d.NewStream(1)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	for _, named := range []int{0, 1} {
		t.Run(fmt.Sprintf("named=%d", named), func(t *testing.T) {
			a, b := allocPair(t, d, s, 1, 1, 8192)
			a.Device, b.Device = named, named
			p := &layout.Plan{Ranks: [][]layout.Segment{{
				{Length: 512, Count: 1, SrcOffset: 0, DstOffset: 4096},
				{Length: 64, Count: 8, SrcOffset: 1024, SrcStride: 128, DstOffset: 0, DstStride: 256},
			}}}
			if err := s.ExecutePlan(cuda.DeviceToDevice, p, []cuda.Region{a}, []cuda.Region{b}); err != nil {
				t.Fatal(err)
			}
			checkPlan(t, s, p, a, b)
		})
	}
	// A pair that does cross GPUs reaches the peer path, which fails as
	// injected: the same plan is not silently copied another way.
	a, b := allocPair(t, d, s, 0, 1, 8192)
	p := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 512, Count: 1}}}}
	if err := s.ExecutePlan(cuda.DeviceToDevice, p, []cuda.Region{a}, []cuda.Region{b}); err == nil || !strings.Contains(err.Error(), "cuPointerGetAttribute") {
		t.Errorf("cross-GPU plan with the peer path failing: %v, want the injected cuPointerGetAttribute failure", err)
	}
}

// allocPair allocates n bytes on GPU sdev filled with a pattern and n
// zero bytes on GPU ddev.
func allocPair(t *testing.T, d *cuda.Driver, s *cuda.Stream, sdev, ddev int, n uint64) (src, dst cuda.Region) {
	t.Helper()
	var out [2]cuda.Region
	for i, dev := range [...]int{sdev, ddev} {
		m, err := d.AllocDevice(dev, n)
		if err != nil {
			t.Fatal(err)
		}
		closeT(t, m)
		b := make([]byte, n)
		if i == 0 {
			b = pattern(int(n), 5)
		}
		if err := s.CopyHtoD(m.Addr(), b); err != nil {
			t.Fatal(err)
		}
		out[i] = cuda.Region{Addr: m.Addr(), Size: n, Device: dev}
	}
	return out[0], out[1]
}

// checkPlan compares dst, read back, with p executed on the host over
// src's bytes and zeroes.
func checkPlan(t *testing.T, s *cuda.Stream, p *layout.Plan, src, dst cuda.Region) {
	t.Helper()
	hs := make([]byte, src.Size)
	if err := s.CopyDtoH(hs, src.Addr); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, dst.Size)
	if err := layout.Execute(p, [][]byte{hs}, [][]byte{want}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, dst.Size)
	if err := s.CopyDtoH(got, dst.Addr); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("destination differs from the host executor's")
	}
}

// A peer copy is refused before anything is queued when a region runs
// past its allocation or is not memory of the GPU it names; a region
// exactly as large as its allocation is fine.
func TestExecutePlanPeerRegionChecks(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2")
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	const n = 8192
	a, b := allocPair(t, d, s, 0, 1, n)
	// The first segment fits anything; the second reaches the regions' ends.
	p := &layout.Plan{Ranks: [][]layout.Segment{{
		{Length: 64, Count: 1},
		{Length: 64, Count: 2, SrcOffset: n - 64 - 4096, SrcStride: 4096, DstOffset: n - 64 - 4096, DstStride: 4096},
	}}}
	cases := []struct {
		name     string
		src, dst cuda.Region
		want     string
	}{
		{"source past its allocation", cuda.Region{Addr: a.Addr + 4096, Size: n, Device: 0}, b, "past the end of its allocation"},
		{"destination past its allocation", a, cuda.Region{Addr: b.Addr, Size: n + 1, Device: 1}, "past the end of its allocation"},
		{"source on another GPU than named", cuda.Region{Addr: b.Addr, Size: n, Device: 0}, cuda.Region{Addr: a.Addr, Size: n, Device: 1}, "the memory is on GPU 1"},
		{"not device memory", cuda.Region{Addr: addr(make([]byte, n)), Size: n, Device: 0}, b, "cuPointerGetAttribute"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q := *p
			if c.src.Addr != a.Addr {
				// Keep the segments inside the declared regions: only the
				// driver's view of the memory is wrong.
				q.Ranks = [][]layout.Segment{{{Length: 64, Count: 1}}}
			}
			err := s.ExecutePlan(cuda.DeviceToDevice, &q, []cuda.Region{c.src}, []cuda.Region{c.dst})
			if !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want ErrInvalidValue saying %q", err, c.want)
			}
			for _, r := range []cuda.Region{a, b} {
				got := make([]byte, 64)
				if err := s.CopyDtoH(got, r.Addr); err != nil {
					t.Fatal(err)
				}
				want := make([]byte, 64)
				if r == a {
					want = pattern(n, 5)[:64]
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("a refused plan wrote GPU %d", r.Device)
				}
			}
		})
	}
	t.Run("at the allocation's end", func(t *testing.T) {
		if err := s.ExecutePlan(cuda.DeviceToDevice, p, []cuda.Region{a}, []cuda.Region{b}); err != nil {
			t.Fatal(err)
		}
		checkPlan(t, s, p, a, b)
	})
}

// A GPU index the driver does not have is refused, naming the index,
// before anything is queued, in plans and in single peer copies.
func TestPeerCopyBadDevice(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2")
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	a, b := allocPair(t, d, s, 0, 1, 4096)
	p := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 64, Count: 1}}}}
	for _, dev := range []int{2, -1} {
		for _, side := range []string{"source", "destination"} {
			src, dst := a, b
			if side == "source" {
				src.Device = dev
			} else {
				dst.Device = dev
			}
			err := s.ExecutePlan(cuda.DeviceToDevice, p, []cuda.Region{src}, []cuda.Region{dst})
			want := fmt.Sprintf("%s rank 0 region names GPU %d, the driver has 2", side, dev)
			if !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s on GPU %d: %v, want ErrInvalidValue saying %q", side, dev, err, want)
			}
		}
		if err := s.CopyPeerAsync(b.Addr, dev, a.Addr, 0, 64); !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), fmt.Sprintf("GPU %d", dev)) {
			t.Errorf("peer copy to GPU %d: %v", dev, err)
		}
		if err := s.CopyPeerAsync(b.Addr, 1, a.Addr, dev, 0); !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("empty peer copy from GPU %d: %v", dev, err)
		}
	}
	// An empty plan's result: the destination still holds only zeroes.
	checkPlan(t, s, &layout.Plan{Ranks: [][]layout.Segment{{}}}, a, b)
}

// softcuda answers a peer copy as the driver does: a pointer that is not
// memory of its context's device, or a range that leaves its allocation,
// is CUDA_ERROR_INVALID_VALUE; injected faults reach the caller.
func TestCopyPeerAsyncDriverErrors(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2", "SOFTCUDA_FAIL=cuMemcpyPeerAsync=2@3")
	s, err := d.NewStream(1)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	a, b := allocPair(t, d, s, 0, 1, 4096)
	var ce *cuda.Error
	// Call 1: the destination is GPU 1's memory, named as GPU 0's.
	if err := s.CopyPeerAsync(b.Addr, 0, a.Addr, 1, 64); !errors.As(err, &ce) || ce.Call != "cuMemcpyPeerAsync" || ce.Code != cuda.ErrorInvalidValue {
		t.Errorf("wrong contexts: %v", err)
	}
	// Call 2: one byte past the allocation, at most 4096 from its start.
	if err := s.CopyPeerAsync(b.Addr+1, 1, a.Addr, 0, 4096); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("past the allocation: %v", err)
	}
	// Call 3: the injected out-of-memory.
	if err := s.CopyPeerAsync(b.Addr, 1, a.Addr, 0, 4096); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("injected failure: %v", err)
	}
	// Call 4: the whole allocation, up to its last byte.
	if err := s.CopyPeerAsync(b.Addr, 1, a.Addr, 0, 4096); err != nil {
		t.Fatalf("whole allocation: %v", err)
	}
	checkPlan(t, s, &layout.Plan{Ranks: [][]layout.Segment{{{Length: 4096, Count: 1}}}}, a, b)
}

// Strides up to MaxPitch cross GPUs as one 2-D peer copy; a wider one is
// copied piece by piece, with the same bytes.
func TestExecutePlanPeerAtAndPastMaxPitch(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2", "SOFTCUDA_MEMORY=12G")
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	const n = 6 << 30
	var reg [2]cuda.Region
	for dev := range reg {
		m, err := d.AllocDevice(dev, n)
		if err != nil {
			t.Fatal(err)
		}
		closeT(t, m)
		reg[dev] = cuda.Region{Addr: m.Addr(), Size: n, Device: dev}
	}
	for _, stride := range []uint64{cuda.MaxPitch, cuda.MaxPitch + 1} {
		t.Run(fmt.Sprint(stride), func(t *testing.T) {
			for k := range uint64(3) {
				if err := s.CopyHtoD(reg[0].Addr+k*stride, pattern(64, byte(k+1+stride&7))); err != nil {
					t.Fatal(err)
				}
			}
			p := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 64, Count: 3, SrcStride: stride, DstStride: stride}}}}
			if err := s.ExecutePlan(cuda.DeviceToDevice, p, reg[:1], reg[1:]); err != nil {
				t.Fatal(err)
			}
			for k := range uint64(3) {
				got := make([]byte, 64)
				if err := s.CopyDtoH(got, reg[1].Addr+k*stride); err != nil || !bytes.Equal(got, pattern(64, byte(k+1+stride&7))) {
					t.Errorf("piece %d: %v", k, err)
				}
			}
		})
	}
}

// Pinned memory allocated in GPU 0's context is copied into GPU 1 by a
// stream on GPU 1, as a staged upload does.
func TestExecutePlanPinnedIntoSecondGPU(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2")
	pin, err := d.AllocPinned(8192, -1)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, pin)
	copy(pin.Bytes(), pattern(8192, 9))
	s, err := d.NewStream(1)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	m, err := d.AllocDevice(1, 8192)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, m)
	p := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 256, Count: 16, SrcStride: 256, DstStride: 512}}}}
	src := cuda.Region{Addr: pin.Addr(), Size: pin.Size()}
	dst := cuda.Region{Addr: m.Addr(), Size: m.Size(), Device: 1}
	if err := s.CopyHtoD(m.Addr(), make([]byte, 8192)); err != nil {
		t.Fatal(err)
	}
	if err := s.ExecutePlan(cuda.HostToDevice, p, []cuda.Region{src}, []cuda.Region{dst}); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 8192)
	if err := layout.Execute(p, [][]byte{pin.Bytes()}, [][]byte{want}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8192)
	if err := s.CopyDtoH(got, m.Addr()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("GPU 1 does not hold what the pinned buffer's plan wrote")
	}
}

// softcuda refuses a 2-D copy whose extent wraps around 2^64 (and so
// would look small enough for its allocation) instead of running it.
func TestSoftcudaRefusesWrappingExtent(t *testing.T) {
	d, _ := openSoft(t)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	a, b := allocPair(t, d, s, 0, 0, 8192)
	// (Height-1) × pitch ≡ 1 (mod 2^64): the inverse of the odd pitch.
	pitch := uint64(cuda.MaxPitch)
	inv := pitch
	for range 6 {
		inv *= 2 - pitch*inv
	}
	if (inv * pitch) != 1 {
		t.Fatalf("no inverse of %d", pitch)
	}
	c := cuda.Copy2D{Dir: cuda.DeviceToDevice, Dst: b.Addr, DstPitch: pitch, Src: a.Addr, SrcPitch: pitch, Width: 64, Height: inv + 1}
	if err := s.Copy2DAsync(c); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Fatalf("2-D copy of %d rows: %v, want ErrInvalidValue", c.Height, err)
	}
	checkPlan(t, s, &layout.Plan{Ranks: [][]layout.Segment{{}}}, a, b)
}
