//go:build cgo && linux

package cuda_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// benchDriver opens the real driver, or softcuda where there is none (its
// figures say nothing about a GPU; they keep the benchmark honest).
func benchDriver(b *testing.B) *cuda.Driver {
	b.Helper()
	d, err := cuda.Open(cuda.Config{Path: os.Getenv(cuda.EnvLibrary)})
	if err != nil && os.Getenv(envRequireGPU) == "1" {
		b.Fatalf("%s=1 and no GPU: %v", envRequireGPU, err)
	}
	if errors.Is(err, cuda.ErrNotSupported) || errors.Is(err, cuda.ErrUnavailable) {
		b.Logf("no GPU (%v): measuring softcuda, not a GPU", err)
		b.Setenv("SOFTCUDA_MEMORY", "4G")
		d, err = cuda.Open(cuda.Config{Path: softLib(b)})
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	b.Logf("driver %s, device 0: %+v", d.Path(), d.Devices()[0])
	return d
}

func llamaLayout(tp int, order layout.KVOrder, slots int) *layout.Layout {
	l := &layout.Layout{
		Model:    layout.ModelConfig{Layers: 80, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16},
		PageSize: 16, TPSize: tp, Order: order, Arrangement: layout.FullyContiguous, Alignment: 256, Slots: slots,
	}
	l.Regions = make([]layout.Region, tp)
	for r := range l.Regions {
		l.Regions[r] = layout.Region{Base: 1 << 40 * uint64(r+1), Kind: layout.Device}
	}
	size := l.Strides().Region
	for r := range l.Regions {
		l.Regions[r].Size = size
	}
	return l
}

// BenchmarkPlanVsCopy runs a plan between device regions, 16 blocks of a
// Llama-70B-shaped model, against one device-to-device copy of the same
// bytes in the same iteration, and reports plan speed / copy speed.
func BenchmarkPlanVsCopy(b *testing.B) {
	d := benchDriver(b)
	for _, c := range []struct {
		name         string
		srcTP, dstTP int
		order        layout.KVOrder
	}{{"tp=4->2/HND", 4, 2, layout.HND}, {"tp=2->8/NHD", 2, 8, layout.NHD}} {
		b.Run(c.name, func(b *testing.B) {
			const blocks = 16
			src, dst := llamaLayout(c.srcTP, c.order, blocks), llamaLayout(c.dstTP, c.order, blocks)
			pairs := make([]layout.SlotPair, blocks)
			for i := range pairs {
				pairs[i] = layout.SlotPair{Src: i, Dst: i}
			}
			p, err := layout.NewPlan(src, dst, pairs)
			if err != nil {
				b.Fatal(err)
			}
			alloc := func(l *layout.Layout) []cuda.Region {
				out := make([]cuda.Region, l.TPSize)
				for r := range out {
					m, err := d.AllocDevice(0, l.Regions[r].Size)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { m.Close() })
					out[r] = cuda.Region{Addr: m.Addr(), Size: m.Size()}
				}
				return out
			}
			sr, dr := alloc(src), alloc(dst)
			flatA, err := d.AllocDevice(0, p.Bytes())
			if err != nil {
				b.Fatal(err)
			}
			defer flatA.Close()
			flatB, err := d.AllocDevice(0, p.Bytes())
			if err != nil {
				b.Fatal(err)
			}
			defer flatB.Close()
			s, err := d.NewStream(0)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.SetBytes(int64(p.Bytes()))
			b.ReportAllocs()
			var planT, copyT time.Duration
			for b.Loop() {
				t0 := time.Now()
				if err := s.ExecutePlan(cuda.DeviceToDevice, p, sr, dr); err != nil {
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := s.CopyAsync(cuda.DeviceToDevice, flatB.Addr(), flatA.Addr(), p.Bytes()); err != nil {
					b.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
				planT += t1.Sub(t0)
				copyT += time.Since(t1)
			}
			var segs int
			for _, r := range p.Ranks {
				segs += len(r)
			}
			b.ReportMetric(float64(segs), "segments")
			b.ReportMetric(copyT.Seconds()/planT.Seconds(), "plan/copy-speed")
		})
	}
}

// BenchmarkStaging moves 256 MiB host to device through the Stager (4 MiB
// pinned buffers, a producer that only hands them over) against one copy
// from a pinned buffer of the whole size, and reports the ratio.
func BenchmarkStaging(b *testing.B) {
	d := benchDriver(b)
	const n, chunk = 256 << 20, 4 << 20
	dev, err := d.AllocDevice(0, n)
	if err != nil {
		b.Fatal(err)
	}
	defer dev.Close()
	pin, err := d.AllocPinned(n, -1)
	if err != nil {
		b.Fatal(err)
	}
	defer pin.Close()
	st, err := d.NewStager(0, chunk)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	s, err := d.NewStream(0)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.SetBytes(n)
	var stageT, copyT time.Duration
	for b.Loop() {
		t0 := time.Now()
		if err := st.ToDevice(context.Background(), dev.Addr(), n, func([]byte) error { return nil }); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := s.CopyAsync(cuda.HostToDevice, dev.Addr(), pin.Addr(), n); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
		stageT += t1.Sub(t0)
		copyT += time.Since(t1)
	}
	b.ReportMetric(copyT.Seconds()/stageT.Seconds(), "staged/copy-speed")
	b.ReportMetric(float64(n)/copyT.Seconds()*float64(b.N)/1e9, "copy-GB/s")
}
