package pool

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

func TestBlockSetRegions(t *testing.T) {
	for _, arr := range []layout.Arrangement{layout.FullyContiguous, layout.LayerSeparate} {
		t.Run(arr.String(), func(t *testing.T) {
			st := newSliceStorage(1 << 20)
			p, err := New(st, testConfig(nil, nil))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			// Two block sets, so the second one's regions start after the
			// first one's.
			var sets []*BlockSet
			for _, tp := range []int{2, 4} {
				b, err := p.NewBlockSet(testLayout(5, tp, arr, 256))
				if err != nil {
					t.Fatal(err)
				}
				sets = append(sets, b)
			}
			var prevEnd uint64
			for _, b := range sets {
				l := b.Layout()
				if err := l.Validate(); err != nil {
					t.Fatalf("carved layout invalid: %v", err)
				}
				s := l.Strides()
				regions, err := b.RegionBytes()
				if err != nil {
					t.Fatal(err)
				}
				for r := range l.TPSize {
					off, err := b.RegionOffset(r)
					if err != nil {
						t.Fatal(err)
					}
					reg := l.Regions[r]
					if reg.Base != st.Addr()+off || reg.Base%4096 != 0 || reg.Size != s.Region {
						t.Errorf("set %d rank %d: region %+v, offset %d, storage at %#x", b.ID(), r, reg, off, st.Addr())
					}
					if off < prevEnd {
						t.Errorf("set %d rank %d at %d overlaps the previous region ending at %d", b.ID(), r, off, prevEnd)
					}
					prevEnd = off + s.Region
					if reg.Kind != layout.Host || reg.Device != -1 {
						t.Errorf("region kind %v device %d, want the storage's", reg.Kind, reg.Device)
					}
					// A byte written through the rank's slice at the
					// chunk offset of (slot 3, layer 1, V) is in the storage
					// where the layout says.
					co := l.ChunkOffset(3, 1, 1)
					regions[r][co] = byte(0x40 + r)
					if got := st.mem[off+co]; got != byte(0x40+r) {
						t.Errorf("rank %d: storage byte %d = %#x, want %#x", r, off+co, got, 0x40+r)
					}
					if uint64(len(regions[r])) != s.Region || uint64(cap(regions[r])) != s.Region {
						t.Errorf("rank %d slice len %d cap %d, want %d", r, len(regions[r]), cap(regions[r]), s.Region)
					}
				}
				if _, err := b.RankBytes(l.TPSize); !errors.Is(err, ErrInvalidArgument) {
					t.Errorf("RankBytes past the last rank: %v", err)
				}
			}
			got, err := p.BlockSet(sets[1].ID())
			if err != nil || got != sets[1] {
				t.Errorf("BlockSet(%d) = %p, %v", sets[1].ID(), got, err)
			}
			if _, err := p.BlockSet(9); !errors.Is(err, ErrUnknownBlockSet) {
				t.Errorf("BlockSet(9): %v", err)
			}
		})
	}
}

func TestBlockSetBadInput(t *testing.T) {
	p, err := New(newSliceStorage(1<<16), testConfig(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	cases := []struct {
		desc  string
		l     *layout.Layout
		want  error
		field string
	}{
		{"nil layout", nil, ErrInvalidConfig, ""},
		{"zero TP", testLayout(4, 0, layout.FullyContiguous, 64), layout.ErrInvalid, "tp_size"},
		{"huge TP", testLayout(4, 1<<20, layout.FullyContiguous, 64), layout.ErrInvalid, "tp_size"},
		{"no slots", testLayout(0, 1, layout.FullyContiguous, 64), layout.ErrInvalid, "slots"},
		{"alignment not a power of two", testLayout(4, 1, layout.FullyContiguous, 48), layout.ErrInvalid, "alignment"},
		{"heads do not divide", testLayout(4, 3, layout.FullyContiguous, 64), layout.ErrInvalid, "tp_size"},
		{"does not fit the storage", testLayout(200, 1, layout.FullyContiguous, 64), ErrOutOfMemory, ""},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := p.NewBlockSet(tc.l)
			if !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if tc.field != "" && !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %s", err, tc.field)
			}
		})
	}
	if n := len(p.BlockSets()); n != 0 {
		t.Errorf("%d block sets after only failures", n)
	}
}

func TestDeviceStorageHasNoBytes(t *testing.T) {
	p, err := New(deviceStorage{size: 1 << 20}, testConfig(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	b, err := p.NewBlockSet(testLayout(4, 2, layout.FullyContiguous, 64))
	if err != nil {
		t.Fatal(err)
	}
	if r := b.Layout().Regions[1]; r.Kind != layout.Device || r.Device != 3 {
		t.Errorf("region %+v, want device 3", r)
	}
	if _, err := b.RankBytes(0); !errors.Is(err, ErrNotHostMemory) {
		t.Errorf("RankBytes of device memory: %v", err)
	}
}

func TestRegisterDeduplicates(t *testing.T) {
	var events []Event
	sink := func(b EventBatch) { events = append(events, b.Events...) }
	p, b := newTestPool(t, testConfig(nil, sink), testLayout(4, 1, layout.FullyContiguous, 64))
	first := toState(t, b, Registered, 42)
	dup := toState(t, b, Complete, 0)
	got, err := b.Register(dup, 42, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != first {
		t.Fatalf("registering a known hash returned %+v, want the existing %+v", got, first)
	}
	if info, _ := b.Slot(dup.Slot); info.State != Reset || info.Generation != dup.Generation+1 {
		t.Errorf("duplicate slot not freed: %+v", info)
	}
	if info, _ := b.Slot(first.Slot); info.Users != 2 {
		t.Errorf("existing block has %d users, want 2", info.Users)
	}
	if m := b.Metrics(); m.Registered != 1 || m.Free != 3 {
		t.Errorf("metrics %+v, want 1 registered and 3 free", m)
	}
	p.Close()
	if len(events) != 1 || events[0].Kind != EventStore || events[0].Slot != first.Slot {
		t.Errorf("events %+v, want one store for slot %d", events, first.Slot)
	}
}

func TestAllocationRecyclesAndFails(t *testing.T) {
	cfg := testConfig(nil, nil)
	cfg.LowWatermark = -1 // only recycle on need
	_, b := newTestPool(t, cfg, testLayout(4, 1, layout.FullyContiguous, 64))
	var regs []Block
	for h := range uint64(3) {
		regs = append(regs, toState(t, b, Registered, 100+h))
	}
	held, _ := b.Allocate(1)
	// All four slots are in use: nothing is free or recyclable.
	_, err := b.Allocate(1)
	var ae *AllocError
	if !errors.As(err, &ae) || ae.Asked != 1 || ae.Free != 0 || ae.Inactive != 0 {
		t.Fatalf("err = %v, want AllocError asked 1 free 0", err)
	}
	if !strings.Contains(err.Error(), "asked for 1") {
		t.Errorf("error %q does not say how many were asked", err)
	}
	// Release in the order 2, 0, 1: the LRU order recycling must follow.
	for _, i := range []int{2, 0, 1} {
		if err := b.Release(regs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.Allocate(4); !errors.As(err, &ae) || ae.Free != 0 || ae.Inactive != 3 {
		t.Fatalf("Allocate(4) err = %v, want asked 4, 0 free, 3 recyclable", err)
	}
	if m := b.Metrics(); m.Inactive != 3 || m.Evictions != 0 {
		t.Fatalf("a failed allocation recycled: %+v", m)
	}
	got, err := b.Allocate(2)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Slot == held[0].Slot || got[1].Slot == held[0].Slot {
		t.Fatal("allocated a slot that is still owned")
	}
	want := map[int]bool{regs[2].Slot: true, regs[0].Slot: true}
	for _, g := range got {
		if !want[g.Slot] {
			t.Errorf("recycled slot %d, want the least recently used %v", g.Slot, want)
		}
		if g.Generation != 1 {
			t.Errorf("recycled slot %d generation %d, want 1", g.Slot, g.Generation)
		}
	}
	if _, ok := b.Lookup(100 + 1); !ok {
		t.Error("the most recently used block was recycled")
	}
	if _, ok := b.Lookup(100 + 2); ok {
		t.Error("a recycled block is still in the registry")
	}
	if m := b.Metrics(); m.Evictions != 2 {
		t.Errorf("evictions %d, want 2", m.Evictions)
	}
}

func TestWatermarks(t *testing.T) {
	cfg := testConfig(nil, nil)
	cfg.LowWatermark = 0.25  // 5 of 20 slots
	cfg.HighWatermark = 0.50 // 10 of 20
	_, b := newTestPool(t, cfg, testLayout(20, 1, layout.FullyContiguous, 64))
	for h := range uint64(14) {
		if err := b.Release(toState(t, b, Registered, h)); err != nil {
			t.Fatal(err)
		}
	}
	// 6 free, 14 inactive: above the low watermark, nothing recycled yet.
	if m := b.Metrics(); m.Free != 6 || m.Inactive != 14 || m.Evictions != 0 {
		t.Fatalf("before: %+v", m)
	}
	if _, err := b.Allocate(2); err != nil {
		t.Fatal(err)
	}
	// 4 free < 5: recycle up to 10 free, the six oldest.
	m := b.Metrics()
	if m.Free != 10 || m.Inactive != 8 || m.Evictions != 6 {
		t.Fatalf("after: free %d inactive %d evictions %d, want 10, 8, 6", m.Free, m.Inactive, m.Evictions)
	}
	for h := range uint64(14) {
		if _, ok := b.Lookup(h); ok != (h >= 6) {
			t.Errorf("hash %d present %v: recycling must take the oldest first", h, ok)
		}
	}
}

func TestClosedPool(t *testing.T) {
	p, b := newTestPool(t, testConfig(nil, nil), testLayout(4, 1, layout.FullyContiguous, 64))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := b.Allocate(1); !errors.Is(err, ErrClosed) {
		t.Errorf("Allocate after Close: %v", err)
	}
	if _, _, err := b.Lease([]uint64{1}, 1e9); !errors.Is(err, ErrClosed) {
		t.Errorf("Lease after Close: %v", err)
	}
	if _, err := p.NewBlockSet(testLayout(4, 1, layout.FullyContiguous, 64)); !errors.Is(err, ErrClosed) {
		t.Errorf("NewBlockSet after Close: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		desc  string
		edit  func(*Config)
		field string
	}{
		{"negative buffer", func(c *Config) { c.EventBuffer = -1 }, "EventBuffer"},
		{"low above high", func(c *Config) { c.LowWatermark, c.HighWatermark = 0.5, 0.2 }, "HighWatermark"},
		{"low above one", func(c *Config) { c.LowWatermark = 2 }, "LowWatermark"},
		{"negative leases", func(c *Config) { c.MaxLeases = -5 }, "MaxLeases"},
		{"negative duration", func(c *Config) { c.MaxLeaseDuration = -1 }, "MaxLeaseDuration"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			_, err := New(newSliceStorage(4096), c)
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
		})
	}
	if _, err := New(nil, Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil storage: %v", err)
	}
}
