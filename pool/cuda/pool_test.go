//go:build cgo && linux

package cuda_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
)

func gpuLayout(slots, tp int) *layout.Layout {
	return &layout.Layout{
		Model:       layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 64, DType: layout.DTypeF16},
		PageSize:    16,
		TPSize:      tp,
		Order:       layout.HND,
		Arrangement: layout.FullyContiguous,
		Alignment:   256,
		Slots:       slots,
	}
}

// A pool carves block sets out of device memory: the regions are device
// pointers inside the allocation, copies reach a slot's bytes through
// them, and the host cannot ask for them as bytes.
func TestPoolOnDeviceMemory(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_DEVICES=2")
	m, err := d.AllocDevice(1, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, m)
	p, err := pool.New(m, pool.DefaultLocalConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b, err := p.NewBlockSet(gpuLayout(8, 2))
	if err != nil {
		t.Fatal(err)
	}
	l := b.Layout()
	stride := l.Strides().Block
	for r, reg := range l.Regions {
		if reg.Kind != layout.Device || reg.Device != 1 || reg.Base < m.Addr() || reg.Base+reg.Size > m.Addr()+m.Size() {
			t.Errorf("region %d: %+v outside device memory [%#x, +%d)", r, reg, m.Addr(), m.Size())
		}
	}
	if _, err := b.RankBytes(0); !errors.Is(err, pool.ErrNotHostMemory) {
		t.Errorf("RankBytes of device memory: %v", err)
	}
	s, err := d.NewStream(1)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, s)
	// Slot 5 of rank 1, written and read back through the device pointer.
	at := l.Regions[1].Base + 5*stride
	want := pattern(int(stride), 8)
	if err := s.CopyHtoD(at, want); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, stride)
	if err := s.CopyDtoH(got, at); err != nil || !bytes.Equal(got, want) {
		t.Errorf("slot bytes through the region's device pointer: %v", err)
	}
}

// Pinned memory and pinned host storage are pools whose bytes the host
// reads, of kind Pinned.
func TestPoolOnPinnedMemory(t *testing.T) {
	d, _ := openSoft(t)
	pm, err := d.AllocPinned(8<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, pm)
	h, err := pool.NewHostStorage(pool.HostConfig{Size: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := d.PinHost(h)
	if err != nil {
		h.Close()
		t.Fatal(err)
	}
	closeT(t, ps)
	for _, st := range []pool.Storage{pm, ps} {
		p, err := pool.New(st, pool.DefaultLocalConfig())
		if err != nil {
			t.Fatal(err)
		}
		b, err := p.NewBlockSet(gpuLayout(4, 1))
		if err != nil {
			t.Fatal(err)
		}
		if k := b.Layout().Regions[0].Kind; k != layout.Pinned {
			t.Errorf("region kind %v, want pinned", k)
		}
		mem, err := b.RankBytes(0)
		if err != nil || len(mem) == 0 {
			t.Errorf("RankBytes of pinned memory: %d bytes, %v", len(mem), err)
		}
		p.Close()
	}
}
