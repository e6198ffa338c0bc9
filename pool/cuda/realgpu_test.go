//go:build cgo && linux

package cuda_test

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// requireGPU opens the real driver (libcuda.so.1, whatever
// KVFABRIC_CUDA_LIB says) or skips with the reason; with
// KVF_REQUIRE_GPU=1 (make gpu-check) no GPU is a failure.
func requireGPU(t *testing.T) *cuda.Driver {
	t.Helper()
	d, err := cuda.Open(cuda.Config{Path: cuda.DefaultLibrary})
	if err != nil && os.Getenv(envRequireGPU) == "1" {
		t.Fatalf("%s=1 and no GPU: %v", envRequireGPU, err)
	}
	if errors.Is(err, cuda.ErrMissingCall) {
		// A driver that loads but lacks a call we declare: a wrong name
		// of ours, or a driver kvfabric cannot run on.
		t.Fatalf("the real driver: %v", err)
	}
	if errors.Is(err, cuda.ErrNotSupported) || errors.Is(err, cuda.ErrUnavailable) {
		t.Skipf("no GPU to test on: %v", err)
	}
	if err != nil {
		t.Fatalf("open the real driver: %v", err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// envRequireGPU=1 makes the real-GPU tests and benchmarks fail, not skip
// or fall back to softcuda, where no GPU is found.
const envRequireGPU = "KVF_REQUIRE_GPU"

// The same calls as the softcuda tests, on a real GPU.
func TestRealGPURoundTrip(t *testing.T) {
	d := requireGPU(t)
	for _, info := range d.Devices() {
		t.Logf("device %d: %s, %d bytes, PCI %s, dma-buf %v", info.Index, info.Name, info.TotalMemory, info.PCIBusID, info.Dmabuf)
	}
	const n = 64 << 20
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
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	want := pattern(n, 3)
	if err := s.CopyHtoD(a.Addr(), want); err != nil {
		t.Fatal(err)
	}
	if err := s.Copy2DAsync(cuda.Copy2D{Dir: cuda.DeviceToDevice, Dst: b.Addr(), DstPitch: 4096, Src: a.Addr(), SrcPitch: 4096, Width: 4096, Height: n / 4096}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := s.CopyDtoH(got, b.Addr()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ after HtoD, 2-D DtoD, DtoH")
	}
	f, err := a.Dmabuf()
	switch {
	case errors.Is(err, cuda.ErrNotSupported):
		t.Logf("dma-buf not supported here (the NIC would use peer memory): %v", err)
	case err != nil:
		t.Errorf("dma-buf: %v", err)
	default:
		f.Close()
	}
	if _, err := d.AllocDevice(0, 1<<62); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("allocating 4 EiB: %v, want ErrOutOfMemory", err)
	}
}

// The softcuda peer cases on two real GPUs: TP ranks copied between GPU 0
// and GPU 1 (HND and NHD head slices, all crossing or mixed with copies on
// one GPU), bytes checked against the host executor, and a region past
// its allocation refused by the driver's own view of the memory.
func TestRealGPUPeerPlan(t *testing.T) {
	d := requireGPU(t)
	if n := len(d.Devices()); n < 2 {
		t.Skipf("peer copies need 2 GPUs, the driver has %d", n)
	}
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	for _, c := range []peerCase{
		{layout.HND, []int{0, 0, 0, 0}, []int{1, 1}},
		{layout.NHD, []int{1, 1}, []int{0, 0, 0, 0}},
		{layout.NHD, []int{0, 1}, []int{1, 0, 1, 0}},
	} {
		t.Run(c.String(), func(t *testing.T) {
			if crossing, _, _ := peerPlanRoundTrip(t, d, s, c); crossing == 0 {
				t.Fatal("no segment crosses GPUs")
			}
		})
	}
	a, b := allocPair(t, d, s, 0, 1, 1<<20)
	p := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 64, Count: 1}}}}
	past := cuda.Region{Addr: a.Addr, Size: 1<<20 + 1<<30, Device: 0}
	if err := s.ExecutePlan(cuda.DeviceToDevice, p, []cuda.Region{past}, []cuda.Region{b}); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("source region past its allocation: %v, want ErrInvalidValue", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// Host storage pinned range by range on the real driver, as an agent's
// pinned pool is: a section (a memory file of its own, mapped over the
// range) registered with cuMemHostRegister, copied from by the GPU; then
// unregistered, given new pages by a new section, registered again, and
// the GPU copies the new pages' bytes, not the old.
func TestRealGPUPinHostRanges(t *testing.T) { pinSectionRounds(t, requireGPU(t)) }

// pinSectionRounds is TestRealGPUPinHostRanges on d (softcuda runs it too).
func pinSectionRounds(t *testing.T, d *cuda.Driver) {
	h, err := pool.NewHostStorage(pool.HostConfig{Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := d.PinHostRanges(h)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, ps)
	const off, n = 1 << 20, 2 << 20
	dev, err := d.AllocDevice(0, n)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	for round, seed := range []byte{11, 12} {
		sec, err := h.NewSection(off, n, "real-pin")
		if err != nil {
			t.Fatal(err)
		}
		if err := ps.Pin(off, n); err != nil {
			t.Fatalf("round %d: pin a section: %v", round, err)
		}
		want := pattern(n, seed)
		copy(ps.Bytes()[off:off+n], want)
		if err := s.CopyAsync(cuda.HostToDevice, dev.Addr(), ps.Addr()+off, n); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, n)
		if err := s.CopyDtoH(got, dev.Addr()); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("round %d: the GPU copied other bytes than the section's from its pinned range", round)
		}
		if err := ps.Unpin(off); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		sec.Close()
	}
}
