package pool

import (
	"flag"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfabric/kvfabric/layout"
)

var long = flag.Bool("kvfabric.long", false, "run the long randomized suites")

// sliceStorage is host memory from the Go heap: enough for the state
// machine tests, which need no sharing, and portable.
type sliceStorage struct {
	mem    []byte
	closed bool
}

func newSliceStorage(size int) *sliceStorage { return &sliceStorage{mem: make([]byte, size)} }

func (s *sliceStorage) Addr() uint64            { return uint64(uintptr(unsafe.Pointer(&s.mem[0]))) }
func (s *sliceStorage) Size() uint64            { return uint64(len(s.mem)) }
func (s *sliceStorage) Kind() layout.MemoryKind { return layout.Host }
func (s *sliceStorage) Device() int32           { return -1 }
func (s *sliceStorage) Bytes() []byte           { return s.mem }
func (s *sliceStorage) Close() error            { s.closed = true; return nil }

// deviceStorage stands in for GPU memory: an address and no bytes.
type deviceStorage struct{ size uint64 }

func (d deviceStorage) Addr() uint64            { return 1 << 40 }
func (d deviceStorage) Size() uint64            { return d.size }
func (d deviceStorage) Kind() layout.MemoryKind { return layout.Device }
func (d deviceStorage) Device() int32           { return 3 }
func (d deviceStorage) Bytes() []byte           { return nil }
func (d deviceStorage) Close() error            { return nil }

// manualClock only moves when told.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func newManualClock() *manualClock {
	return &manualClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *manualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testLayout is a small model: 2 layers, 4 KV heads of 8 f16 elements,
// pages of 4 tokens. Per rank at TP 2: chunk 128 bytes, shard 512.
func testLayout(slots, tp int, arr layout.Arrangement, align uint64) *layout.Layout {
	return &layout.Layout{
		Model:       layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16},
		PageSize:    4,
		TPSize:      tp,
		Order:       layout.NHD,
		Arrangement: arr,
		Alignment:   align,
		Slots:       slots,
	}
}

// testConfig has no loop-driven expiry, so that tests decide when leases
// are reaped.
func testConfig(clock Clock, sink EventSink) Config {
	c := DefaultLocalConfig()
	c.Clock = clock
	c.Events = sink
	c.ExpiryInterval = -1
	return c
}

// newTestPool makes a pool over heap memory with one block set.
func newTestPool(t testing.TB, cfg Config, l *layout.Layout) (*Pool, *BlockSet) {
	t.Helper()
	// Every test layout's block stride is at most 2 KiB per rank.
	st := newSliceStorage(1<<20 + l.Slots*max(l.TPSize, 1)*2048)
	p, err := New(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	b, err := p.NewBlockSet(l)
	if err != nil {
		t.Fatal(err)
	}
	return p, b
}
