//go:build cgo && linux

package cuda_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

func TestDevices(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=3", "SOFTCUDA_MEMORY=64M",
		"SOFTCUDA_PCI_BUS_IDS=00000000:18:00.0,00000000:2A:00.0,00000000:9B:00.0", "SOFTCUDA_DMABUF=1")
	devs := d.Devices()
	if len(devs) != 3 {
		t.Fatalf("%d devices, want 3", len(devs))
	}
	for i, want := range []string{"00000000:18:00.0", "00000000:2A:00.0", "00000000:9B:00.0"} {
		if devs[i].PCIBusID != want || devs[i].TotalMemory != 64<<20 || !devs[i].Dmabuf || devs[i].Index != i || devs[i].Name == "" {
			t.Errorf("device %d: %+v", i, devs[i])
		}
	}
	free, total, err := d.MemInfo(2)
	if err != nil || free != 64<<20 || total != 64<<20 {
		t.Errorf("MemInfo(2) = %d, %d, %v", free, total, err)
	}
	if _, _, err := d.MemInfo(3); !errors.Is(err, cuda.ErrUnavailable) {
		t.Errorf("MemInfo(3): %v, want ErrUnavailable", err)
	}
}

func TestOpenErrors(t *testing.T) {
	_, err := cuda.Open(cuda.Config{Path: "/nonexistent/libcuda.so.1"})
	if !errors.Is(err, cuda.ErrNotSupported) || errors.Is(err, cuda.ErrMissingCall) || !strings.Contains(err.Error(), "/nonexistent/libcuda.so.1") {
		t.Errorf("missing library: %v, want ErrNotSupported (not ErrMissingCall) naming the path", err)
	}
	// A library that is not a driver: one of the symbols is missing.
	_, err = cuda.Open(cuda.Config{Path: "libc.so.6"})
	if !errors.Is(err, cuda.ErrNotSupported) || !errors.Is(err, cuda.ErrMissingCall) || !strings.Contains(err.Error(), "cuInit") {
		t.Errorf("libc as a driver: %v, want ErrNotSupported and ErrMissingCall naming cuInit", err)
	}
	t.Setenv("SOFTCUDA_DEVICES", "0")
	_, err = cuda.Open(cuda.Config{Path: softLib(t)})
	if !errors.Is(err, cuda.ErrUnavailable) {
		t.Errorf("no devices: %v, want ErrUnavailable", err)
	}
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Code != cuda.ErrorNoDevice || ce.Name != "CUDA_ERROR_NO_DEVICE" {
		t.Errorf("no devices: %#v", err)
	}
}

func TestOpenFromEnvironment(t *testing.T) {
	path := softLib(t)
	t.Setenv(cuda.EnvLibrary, path)
	d, err := cuda.Open(cuda.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if d.Path() != path {
		t.Errorf("Path() = %q, want %q", d.Path(), path)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := d.AllocDevice(0, 4096); !errors.Is(err, cuda.ErrClosed) {
		t.Errorf("alloc after Close: %v, want ErrClosed", err)
	}
}

func TestDeviceMemoryIsStorage(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2")
	m, err := d.AllocDevice(1, 10000)
	if err != nil {
		t.Fatal(err)
	}
	var s pool.Storage = m
	if s.Kind() != layout.Device || s.Device() != 1 || s.Bytes() != nil || s.Size() != 10000 || s.Addr() == 0 {
		t.Errorf("storage: kind %v device %d bytes %v size %d addr %#x", s.Kind(), s.Device(), s.Bytes() != nil, s.Size(), s.Addr())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// SOFTCUDA_MEMORY is the device's size: an allocation of exactly that much
// succeeds, one page more fails with ErrOutOfMemory, and freeing gives the
// memory back.
func TestAllocAtAndPastMemoryLimit(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_MEMORY=8M")
	m, err := d.AllocDevice(0, 8<<20)
	if err != nil {
		t.Fatalf("alloc at the limit: %v", err)
	}
	if _, err := d.AllocDevice(0, 1); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("alloc with the device full: %v, want ErrOutOfMemory", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AllocDevice(0, 8<<20+uint64(os.Getpagesize())); !errors.Is(err, cuda.ErrOutOfMemory) {
		t.Errorf("alloc a page past the limit: %v, want ErrOutOfMemory", err)
	}
	if _, err := d.AllocDevice(0, 0); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("alloc 0: %v, want ErrInvalidValue", err)
	}
	if _, err := d.AllocDevice(1, 4096); !errors.Is(err, cuda.ErrUnavailable) {
		t.Errorf("alloc on device 1 of 1: %v, want ErrUnavailable", err)
	}
}

func TestCopiesBothWaysAndDeviceToDevice(t *testing.T) {
	d, _ := openSoft(t)
	const n = 3 << 20 // page multiple: softcuda, like the driver, rounds sizes up
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
	want := pattern(n, 9)
	if err := s.CopyHtoD(a.Addr(), want); err != nil {
		t.Fatal(err)
	}
	if err := s.CopyAsync(cuda.DeviceToDevice, b.Addr(), a.Addr(), n); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, n)
	if err := s.CopyDtoH(got, b.Addr()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes differ after HtoD, DtoD, DtoH")
	}
	// Ranges that leave the allocation are refused before anything moves.
	if err := s.CopyAsync(cuda.HostToDevice, a.Addr()+1, addr(want), n); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("copy one byte past the end: %v, want ErrInvalidValue", err)
	}
	if err := s.CopyAsync(cuda.HostToDevice, a.Addr()+1, addr(want), n-1); err != nil {
		t.Errorf("copy ending exactly at the end: %v", err)
	}
	if err := s.CopyAsync(cuda.DeviceToHost, addr(got), 0x1000, 16); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("copy from a pointer that is no allocation: %v, want ErrInvalidValue", err)
	}
	if err := s.CopyAsync(cuda.Direction(9), a.Addr(), b.Addr(), 1); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("unknown direction: %v", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// A 2-D copy writes Height rows of Width bytes at the pitches given, and
// nothing between them.
func TestCopy2D(t *testing.T) {
	d, _ := openSoft(t)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	const width, height, spitch, dpitch = 64, 64, 160, 128 // both ends page multiples
	src := pattern(spitch*height, 3)
	dev, err := d.AllocDevice(0, dpitch*height)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	if err := s.CopyHtoD(dev.Addr(), make([]byte, dpitch*height)); err != nil {
		t.Fatal(err)
	}
	err = s.Copy2DAsync(cuda.Copy2D{Dir: cuda.HostToDevice, Dst: dev.Addr(), DstPitch: dpitch, Src: addr(src) + 8, SrcPitch: spitch, Width: width, Height: height})
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, dpitch*height)
	if err := s.CopyDtoH(got, dev.Addr()); err != nil {
		t.Fatal(err)
	}
	for y := 0; y < height; y++ {
		row := got[y*dpitch : (y+1)*dpitch]
		if !bytes.Equal(row[:width], src[y*spitch+8:y*spitch+8+width]) {
			t.Fatalf("row %d differs", y)
		}
		if !bytes.Equal(row[width:], make([]byte, dpitch-width)) {
			t.Fatalf("row %d: bytes past the width were written", y)
		}
	}
	// Device to device and back to host, gathering the rows again.
	dev2, err := d.AllocDevice(0, width*height)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev2)
	if err := s.Copy2DAsync(cuda.Copy2D{Dir: cuda.DeviceToDevice, Dst: dev2.Addr(), DstPitch: width, Src: dev.Addr(), SrcPitch: dpitch, Width: width, Height: height}); err != nil {
		t.Fatal(err)
	}
	packed := make([]byte, width*height)
	if err := s.Copy2DAsync(cuda.Copy2D{Dir: cuda.DeviceToHost, Dst: addr(packed), DstPitch: width, Src: dev2.Addr(), SrcPitch: width, Width: width, Height: height}); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for y := 0; y < height; y++ {
		if !bytes.Equal(packed[y*width:(y+1)*width], src[y*spitch+8:y*spitch+8+width]) {
			t.Fatalf("packed row %d differs", y)
		}
	}
	// The last row ending exactly at the allocation's end is allowed; one
	// more row is not.
	ok := cuda.Copy2D{Dir: cuda.DeviceToDevice, Dst: dev2.Addr(), DstPitch: width, Src: dev.Addr(), SrcPitch: dpitch, Width: width, Height: height}
	if err := s.Copy2DAsync(ok); err != nil {
		t.Errorf("2-D copy ending at the allocation's end: %v", err)
	}
	past := ok
	past.Height++
	if err := s.Copy2DAsync(past); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("2-D copy a row past the end: %v, want ErrInvalidValue", err)
	}
	narrow := ok
	narrow.SrcPitch = width - 1
	if err := s.Copy2DAsync(narrow); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("pitch narrower than the width: %v, want ErrInvalidValue", err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

// Work on one stream runs in order; an event orders a second stream after
// the first; Done reports work still in flight.
func TestStreamsAndEventsOrder(t *testing.T) {
	// Each copy sleeps 250 ms before moving bytes, so that work is still
	// queued when the test looks, even on a loaded machine.
	d, _ := openSoft(t, "SOFTCUDA_COPY_DELAY_US=250000")
	const n = 1 << 16
	dev, err := d.AllocDevice(0, n)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	pin, err := d.AllocPinned(3*n, -1)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, pin)
	host := pin.Bytes()
	copy(host[:n], pattern(n, 1))
	copy(host[n:2*n], pattern(n, 2))
	s1, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s1)
	s2, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s2)
	e, err := d.NewEvent(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, e)
	if done, err := e.Done(); !done || err != nil {
		t.Errorf("an event never recorded: done %v, %v", done, err)
	}
	// s1: pattern 1 then pattern 2 into the same bytes; the event after.
	if err := s1.CopyAsync(cuda.HostToDevice, dev.Addr(), pin.Addr(), n); err != nil {
		t.Fatal(err)
	}
	if err := s1.CopyAsync(cuda.HostToDevice, dev.Addr(), pin.Addr()+n, n); err != nil {
		t.Fatal(err)
	}
	if err := e.Record(s1); err != nil {
		t.Fatal(err)
	}
	if done, err := e.Done(); done || err != nil {
		t.Errorf("event behind 500 ms of copies: done %v, %v; want not done", done, err)
	}
	// s2 reads the device bytes only after the event.
	if err := s2.Wait(e); err != nil {
		t.Fatal(err)
	}
	if err := s2.CopyAsync(cuda.DeviceToHost, pin.Addr()+2*n, dev.Addr(), n); err != nil {
		t.Fatal(err)
	}
	if err := s2.Synchronize(); err != nil {
		t.Fatal(err)
	}
	if done, err := e.Done(); !done || err != nil {
		t.Errorf("event after s2 waited on it: done %v, %v", done, err)
	}
	if !bytes.Equal(host[2*n:], pattern(n, 2)) {
		t.Error("s2 did not see the last copy of s1")
	}
	// Wait honours its context.
	if err := s1.CopyAsync(cuda.HostToDevice, dev.Addr(), pin.Addr(), n); err != nil {
		t.Fatal(err)
	}
	if err := e.Record(s1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	if err := e.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with an expiring context: %v", err)
	}
	if err := e.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestPinned(t *testing.T) {
	d, _ := openSoft(t)
	p, err := d.AllocPinned(5000, 1)
	if err != nil {
		t.Fatal(err)
	}
	if p.Kind() != layout.Pinned || p.Device() != 1 || len(p.Bytes()) != 5000 || p.Addr() == 0 {
		t.Errorf("pinned: kind %v device %d len %d", p.Kind(), p.Device(), len(p.Bytes()))
	}
	p.Bytes()[4999] = 7
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}

	h, err := pool.NewHostStorage(pool.HostConfig{Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := d.PinHost(h)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Kind() != layout.Pinned || ps.Addr() != h.Addr() {
		t.Errorf("pinned host storage: kind %v", ps.Kind())
	}
	// The same memory twice is the driver's "already registered".
	_, err = d.PinHost(h)
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Code != cuda.ErrorHostMemoryRegistered {
		t.Errorf("pin twice: %v, want CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", err)
	}
	// Copies reach it.
	dev, err := d.AllocDevice(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	copy(ps.Bytes(), pattern(4096, 5))
	if err := s.CopyAsync(cuda.HostToDevice, dev.Addr(), ps.Addr(), 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := s.CopyDtoH(got, dev.Addr()); err != nil || !bytes.Equal(got, pattern(4096, 5)) {
		t.Errorf("copy through pinned host storage: %v", err)
	}
	if err := ps.Close(); err != nil {
		t.Fatal(err)
	}
	if h.Bytes() != nil {
		t.Error("PinnedStorage.Close left the host storage open")
	}
	if _, err := d.PinHost(dev); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("pin device memory: %v, want ErrInvalidValue", err)
	}
}

// Host storage pinned range by range: each range is registered with the
// pages it has when pinned (a section's), overlapping ranges are the
// driver's "already registered", an unpinned range may be pinned again
// over new pages, and Close unregisters what is left.
func TestPinHostRanges(t *testing.T) {
	d, _ := openSoft(t)
	h, err := pool.NewHostStorage(pool.HostConfig{Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := d.PinHostRanges(h)
	if err != nil {
		t.Fatal(err)
	}
	if ps.Kind() != layout.Pinned || ps.PinnedBytes() != 0 {
		t.Fatalf("pinned by ranges: kind %v, %d bytes pinned before any range", ps.Kind(), ps.PinnedBytes())
	}
	const page = 64 << 10
	sec, err := h.NewSection(page, 2*page, "pin-ranges")
	if err != nil {
		t.Fatal(err)
	}
	defer sec.Close()
	if err := ps.Pin(page, 2*page); err != nil {
		t.Fatal(err)
	}
	if err := ps.Pin(4*page, page); err != nil {
		t.Fatal(err)
	}
	if got := ps.PinnedBytes(); got != 3*page {
		t.Errorf("%d bytes pinned, want %d", got, 3*page)
	}
	var ce *cuda.Error
	if err := ps.Pin(2*page, page); !errors.As(err, &ce) || ce.Code != cuda.ErrorHostMemoryRegistered {
		t.Errorf("pin inside a pinned range: %v, want CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", err)
	}
	if err := ps.Pin(15*page, 2*page); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("pin past the end: %v, want ErrInvalidValue", err)
	}
	// Copies reach the section's pages through the pinned range.
	dev, err := d.AllocDevice(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	copy(ps.Bytes()[page:], pattern(4096, 9))
	if err := s.CopyAsync(cuda.HostToDevice, dev.Addr(), ps.Addr()+page, 4096); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	if err := s.CopyDtoH(got, dev.Addr()); err != nil || !bytes.Equal(got, pattern(4096, 9)) {
		t.Errorf("copy from a pinned section: %v", err)
	}
	if err := ps.Unpin(page); err != nil {
		t.Fatal(err)
	}
	if err := ps.Unpin(page); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("unpin twice: %v, want ErrInvalidValue", err)
	}
	// New pages under the range, pinned afresh.
	sec2, err := h.NewSection(page, page, "pin-ranges-2")
	if err != nil {
		t.Fatal(err)
	}
	defer sec2.Close()
	if err := ps.Pin(page, page); err != nil {
		t.Fatalf("pin a range again over new pages: %v", err)
	}
	if err := ps.Close(); err != nil {
		t.Fatalf("close with two ranges pinned: %v", err)
	}
	if err := ps.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	if h.Bytes() != nil {
		t.Error("PinnedStorage.Close left the host storage open")
	}
	// A whole registration has no ranges to pin.
	h2, err := pool.NewHostStorage(pool.HostConfig{Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	whole, err := d.PinHost(h2)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, whole)
	if err := whole.Pin(0, page); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("pin a range of storage pinned whole: %v, want ErrInvalidValue", err)
	}
}

// The real-GPU rounds of pinned sections on softcuda.
func TestPinHostRangesNewPages(t *testing.T) {
	d, _ := openSoft(t)
	pinSectionRounds(t, d)
}

// Another process opens the IPC handle, sees the bytes, writes its own, and
// the exporter sees those.
func TestIPCHandleAcrossProcesses(t *testing.T) {
	d, lib := openSoft(t)
	const n = 1 << 20
	m, s, h, out, err := ipcChild(t, d, lib, n)
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("child: %s", strings.TrimSpace(out))
	got := make([]byte, n)
	if err := s.CopyDtoH(got, m.Addr()+n); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, pattern(n, 2)) {
		t.Error("the exporter does not see what the other process wrote")
	}
	// A pointer inside the allocation names the same allocation.
	if h2, err := d.IPCHandle(0, m.Addr()+n+5); err != nil || h2 != h {
		t.Errorf("handle of an inner pointer: %v, same %v", err, h2 == h)
	}
	if _, err := d.IPCHandle(0, 0x1000); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("handle of a pointer that is no allocation: %v, want ErrInvalidValue", err)
	}
	// The driver refuses a handle in the process that made it.
	if _, err := d.OpenIPCHandle(0, h); err == nil {
		t.Error("opening our own IPC handle succeeded")
	}
	// Garbage is refused, not mapped.
	var junk cuda.IPCHandle
	copy(junk[:], "not a handle")
	if _, err := d.OpenIPCHandle(0, junk); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("junk handle: %v, want ErrInvalidValue", err)
	}
}

// Both ways softcuda reaches another process's memfd work: the /proc path
// and pidfd_getfd.
func TestIPCHandleOpenPaths(t *testing.T) {
	for _, how := range []string{"proc", "pidfd"} {
		t.Run(how, func(t *testing.T) {
			d, lib := openSoft(t, "SOFTCUDA_IPC_OPEN="+how)
			const n = 4096
			m, s, _, out, err := ipcChild(t, d, lib, n)
			if err != nil && how == "pidfd" && strings.Contains(out, "CUDA_ERROR_INVALID_HANDLE") {
				// pidfd_getfd needs Linux 5.6 and ptrace access to the
				// exporter (Yama's ptrace_scope 1 refuses a child).
				t.Skipf("pidfd_getfd unavailable here: %s", out)
			}
			if err != nil {
				t.Fatalf("child: %v\n%s", err, out)
			}
			got := make([]byte, n)
			if err := s.CopyDtoH(got, m.Addr()+n); err != nil || !bytes.Equal(got, pattern(n, 2)) {
				t.Errorf("exporter does not see the child's bytes: %v", err)
			}
		})
	}
}

// ipcChild allocates 2n bytes of device memory on GPU 0, writes pattern 1
// into the first n, and runs the "ipc" child on its IPC handle (it checks
// those bytes and writes pattern 2 into the second n). It returns the
// memory, a stream on GPU 0, the handle, and the child's output and error.
func ipcChild(t *testing.T, d *cuda.Driver, lib string, n int) (*cuda.DeviceMemory, *cuda.Stream, cuda.IPCHandle, string, error) {
	t.Helper()
	m, err := d.AllocDevice(0, uint64(2*n))
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, m)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	if err := s.CopyHtoD(m.Addr(), pattern(n, 1)); err != nil {
		t.Fatal(err)
	}
	h, err := m.IPCHandle()
	if err != nil {
		t.Fatal(err)
	}
	out, err := runChild(t, "ipc", lib, "CHILD_HANDLE="+hex.EncodeToString(h[:]), fmt.Sprintf("CHILD_N=%d", n))
	return m, s, h, out, err
}

// A handle whose memory was freed cannot be opened by another process.
func TestIPCHandleAfterFree(t *testing.T) {
	d, lib := openSoft(t)
	m, err := d.AllocDevice(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	h, err := m.IPCHandle()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := runChild(t, "ipc", lib, "CHILD_HANDLE="+hex.EncodeToString(h[:]), "CHILD_N=16")
	var ee *exitError
	if err == nil || !asExit(err, &ee) || ee.code != 3 || !strings.Contains(out, "CUDA_ERROR_INVALID_HANDLE") {
		t.Errorf("child opening a freed handle: %v\n%s", err, out)
	}
}

// A host dereference of a device pointer faults, as on a GPU.
func TestHostDereferenceFaults(t *testing.T) {
	_, lib := openSoft(t)
	out, err := runChild(t, "fault", lib)
	if err != nil || !strings.HasPrefix(out, "fault at ") {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

func TestDmabuf(t *testing.T) {
	d, _ := openSoft(t)
	const n = 1 << 20
	m, err := d.AllocDevice(0, n)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, m)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	if err := s.CopyHtoD(m.Addr(), pattern(n, 4)); err != nil {
		t.Fatal(err)
	}
	f, err := m.Dmabuf()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if !bytes.Equal(mem, pattern(n, 4)) {
		t.Error("the dma-buf does not hold the device bytes")
	}
	page := uint64(os.Getpagesize())
	if _, err := d.DmabufFD(0, m.Addr()+1, page); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("unaligned dma-buf range: %v, want ErrInvalidValue", err)
	}
	if _, err := d.DmabufFD(0, m.Addr(), n+page); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("dma-buf range past the allocation: %v, want ErrInvalidValue", err)
	}
}

// Without dma-buf the error lets the caller fall back to peer memory.
func TestDmabufUnsupported(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DMABUF=0")
	if d.Devices()[0].Dmabuf {
		t.Error("device reports dma-buf support")
	}
	m, err := d.AllocDevice(0, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, m)
	if _, err := m.Dmabuf(); !errors.Is(err, cuda.ErrNotSupported) {
		t.Errorf("dma-buf without support: %v, want ErrNotSupported", err)
	}
}

// Injected failures come back as the driver's codes, naming the call.
func TestInjectedFailures(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_FAIL=cuMemAlloc_v2=2@2,cuStreamCreate=999")
	a, err := d.AllocDevice(0, 4096)
	if err != nil {
		t.Fatalf("first alloc: %v", err)
	}
	closeT(t, a)
	_, err = d.AllocDevice(0, 4096)
	if !errors.Is(err, cuda.ErrOutOfMemory) || !strings.Contains(err.Error(), "cuMemAlloc_v2") {
		t.Errorf("second alloc: %v, want ErrOutOfMemory naming cuMemAlloc_v2", err)
	}
	c, err := d.AllocDevice(0, 4096)
	if err != nil {
		t.Errorf("third alloc: %v", err)
	} else {
		closeT(t, c)
	}
	_, err = d.NewStream(0)
	var ce *cuda.Error
	if !errors.As(err, &ce) || ce.Code != cuda.ErrorUnknown || ce.Call != "cuStreamCreate" {
		t.Errorf("stream: %v", err)
	}
}

func TestStagerRoundTrip(t *testing.T) {
	d, _ := openSoft(t)
	for _, n := range []uint64{1, 4096, 4096*5 + 3, 4096 * 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			st, err := d.NewStager(0, 4096)
			if err != nil {
				t.Fatal(err)
			}
			closeT(t, st)
			dev, err := d.AllocDevice(0, n)
			if err != nil {
				t.Fatal(err)
			}
			closeT(t, dev)
			want := pattern(int(n), 6)
			src := bytes.NewReader(want)
			err = st.ToDevice(context.Background(), dev.Addr(), n, func(p []byte) error {
				_, err := src.Read(p)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			var got []byte
			err = st.FromDevice(context.Background(), dev.Addr(), n, func(p []byte) error {
				got = append(got, p...)
				return nil
			})
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("round trip of %d bytes: %v, equal %v", n, err, bytes.Equal(got, want))
			}
		})
	}
	st, err := d.NewStager(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, st)
	dev, err := d.AllocDevice(0, 3*4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	boom := errors.New("producer failed")
	calls := 0
	err = st.ToDevice(context.Background(), dev.Addr(), 3*4096, func(p []byte) error {
		if calls++; calls == 2 {
			return boom
		}
		return nil
	})
	if !errors.Is(err, boom) {
		t.Errorf("producer error: %v", err)
	}
	if _, err := d.NewStager(0, 0); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("chunk 0: %v", err)
	}
}

// While the producer fills one buffer, the other is being copied. Each
// copy sleeps 40 ms (SOFTCUDA_COPY_DELAY_US) and so does the producer: a
// stager that waited for a chunk's copy before asking for the next would
// leave at least 40 ms between one producer call's end and the next one's
// start, every time, however loaded the machine. Overlapped, the next
// buffer is free when the producer returns, so some of those gaps are near
// zero (all of them on an idle machine).
func TestStagerOverlaps(t *testing.T) {
	const step = 40 * time.Millisecond
	d, _ := openSoft(t, fmt.Sprintf("SOFTCUDA_COPY_DELAY_US=%d", step.Microseconds()))
	st, err := d.NewStager(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, st)
	dev, err := d.AllocDevice(0, 8*4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	var gaps []time.Duration
	var returned time.Time
	err = st.ToDevice(context.Background(), dev.Addr(), 8*4096, func(p []byte) error {
		if !returned.IsZero() {
			gaps = append(gaps, time.Since(returned))
		}
		time.Sleep(step)
		returned = time.Now()
		return nil
	})
	if err != nil || len(gaps) != 7 {
		t.Fatalf("upload: %v after %d chunks", err, len(gaps)+1)
	}
	t.Logf("between the producer's calls: %v", gaps)
	if slices.Min(gaps) >= step/2 {
		t.Errorf("every chunk waited %v or more for the copy before it after the producer returned (%v): copies do not overlap the producer", slices.Min(gaps), gaps)
	}
}

// Freeing memory with copies still queued waits for them, as the driver's
// free does, instead of pulling the pages from under the copy.
func TestFreeWaitsForQueuedCopies(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_COPY_DELAY_US=50000")
	pin, err := d.AllocPinned(1<<20, -1)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, pin)
	s, err := d.NewStream(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	e, err := d.NewEvent(0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, e)
	m, err := d.AllocDevice(0, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.CopyAsync(cuda.HostToDevice, m.Addr(), pin.Addr(), 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if done, err := e.Done(); !done || err != nil {
		t.Errorf("after free: queued copies done %v, %v; want done", done, err)
	}
}

// SOFTCUDA_DEVICES is at most 16: 16 gives 16 GPUs, 17 is refused.
func TestDeviceCountLimit(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=16")
	if n := len(d.Devices()); n != 16 {
		t.Errorf("SOFTCUDA_DEVICES=16: %d devices", n)
	}
	if m, err := d.AllocDevice(15, 4096); err != nil {
		t.Errorf("alloc on the last device: %v", err)
	} else {
		closeT(t, m)
	}
	if _, err := d.AllocDevice(16, 4096); !errors.Is(err, cuda.ErrUnavailable) {
		t.Errorf("alloc past the last device: %v, want ErrUnavailable", err)
	}
	t.Setenv("SOFTCUDA_DEVICES", "17")
	if _, err := cuda.Open(cuda.Config{Path: softLib(t)}); !errors.Is(err, cuda.ErrInvalidValue) {
		t.Errorf("SOFTCUDA_DEVICES=17: %v, want ErrInvalidValue", err)
	}
}

// A malformed SOFTCUDA_* setting fails cuInit instead of running a test on
// settings nobody asked for.
func TestSoftcudaRefusesBadSettings(t *testing.T) {
	for _, kv := range []string{
		"SOFTCUDA_DEVICES=two", "SOFTCUDA_DEVICES=-1", "SOFTCUDA_MEMORY=0", "SOFTCUDA_MEMORY=1T",
		"SOFTCUDA_PCI_BUS_IDS=0000:18:00", "SOFTCUDA_DMABUF=yes", "SOFTCUDA_COPY_DELAY_US=soon",
		"SOFTCUDA_FAIL=cuMemAlloc_v2", "SOFTCUDA_FAIL=cuMemAlloc_v2=oom", "SOFTCUDA_FAIL=cuMemAlloc_v2=2@0",
		"SOFTCUDA_IPC_OPEN=socket",
	} {
		t.Run(kv, func(t *testing.T) {
			for _, name := range []string{"SOFTCUDA_DEVICES", "SOFTCUDA_MEMORY", "SOFTCUDA_PCI_BUS_IDS", "SOFTCUDA_DMABUF", "SOFTCUDA_COPY_DELAY_US", "SOFTCUDA_FAIL", "SOFTCUDA_IPC_OPEN"} {
				t.Setenv(name, "")
			}
			k, v, _ := strings.Cut(kv, "=")
			t.Setenv(k, v)
			if _, err := cuda.Open(cuda.Config{Path: softLib(t)}); !errors.Is(err, cuda.ErrInvalidValue) || !strings.Contains(err.Error(), "cuInit") {
				t.Errorf("%s: %v, want cuInit to fail with ErrInvalidValue", kv, err)
			}
		})
	}
}

// A handle whose descriptor now names another file (the inode softcuda
// records does not match) is refused in the opening process, not mapped.
func TestIPCHandleForged(t *testing.T) {
	d, lib := openSoft(t)
	m, err := d.AllocDevice(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, m)
	h, err := m.IPCHandle()
	if err != nil {
		t.Fatal(err)
	}
	h[16] ^= 0xff // softcuda's handle: magic, pid, fd, then the memfd's inode
	out, err := runChild(t, "ipc", lib, "CHILD_HANDLE="+hex.EncodeToString(h[:]), "CHILD_N=16")
	var ee *exitError
	if err == nil || !asExit(err, &ee) || ee.code != 3 || !strings.Contains(out, "CUDA_ERROR_INVALID_HANDLE") {
		t.Errorf("child opening a forged handle: %v\n%s", err, out)
	}
}

// Whatever 64 bytes an engine sends as a handle, opening it returns an
// error or memory that closes; it never crashes the agent.
func FuzzOpenIPCHandle(f *testing.F) {
	f.Add(make([]byte, 64))
	f.Add([]byte("not a handle at all"))
	seed := make([]byte, 64)
	copy(seed, "SCPIAC1\x00")
	f.Add(seed)
	path := softLib(f)
	d, err := cuda.Open(cuda.Config{Path: path})
	if err != nil {
		f.Fatal(err)
	}
	defer d.Close()
	m, err := d.AllocDevice(0, 4096)
	if err != nil {
		f.Fatal(err)
	}
	defer m.Close()
	h, err := m.IPCHandle()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(h[:])
	f.Fuzz(func(t *testing.T, raw []byte) {
		var h cuda.IPCHandle
		copy(h[:], raw)
		mem, err := d.OpenIPCHandle(0, h)
		if err == nil {
			if cerr := mem.Close(); cerr != nil {
				t.Fatalf("close: %v", cerr)
			}
		}
	})
}
