package disk

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"golang.org/x/sys/unix"
)

// A put from page-aligned memory with room for its length rounded up is
// written straight from it: the bytes past its length up to the boundary
// are zeroed, and nothing past that is touched; the block reads back whole,
// straight into aligned memory and through a copy into any other.
func TestPutGetStraightFromAlignedMemory(t *testing.T) {
	s := open(t, t.TempDir(), nil)
	ctx := context.Background()
	mem, err := unix.Mmap(-1, 0, 3*Align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = 0xa5
	}
	n := Align + 100 // rounds up to 2*Align
	want := bytes.Repeat([]byte{0xa5}, n)
	k := Key{Hash: 1, Tag: 7}
	if err := s.Put(ctx, k, mem[:n:2*Align]); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(mem[n:2*Align], make([]byte, 2*Align-n)) {
		t.Fatal("the bytes up to the boundary were not zeroed")
	}
	if mem[2*Align] != 0xa5 {
		t.Fatal("a byte past the data's capacity was touched")
	}
	// Aligned, room for the rounded length: read straight in.
	dst, err := unix.Mmap(-1, 0, 2*Align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(dst)
	if got, err := s.Get(ctx, k, dst); err != nil || !bytes.Equal(dst[:got], want) {
		t.Fatalf("get into aligned memory: %d bytes, %v", got, err)
	}
	// Too little capacity to write straight from: through a buffer.
	k2 := Key{Hash: 2, Tag: 7}
	if err := s.Put(ctx, k2, mem[:n:n]); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, 2); !bytes.Equal(got, want) {
		t.Fatalf("put through a buffer read back %d bytes, want %d", len(got), n)
	}
}

// Reads run on their callers' goroutines, at most Workers at once with
// the workers' writes: at the limit a read waits, honouring its context,
// and goes ahead once one ends.
func TestGetWaitsForItsTurnAtWorkers(t *testing.T) {
	const workers = 2
	s := open(t, t.TempDir(), func(c *Config) { c.Workers = workers })
	ctx := context.Background()
	k := Key{Hash: 3, Tag: 7}
	if err := s.Put(ctx, k, blockOf(3, s.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	// One fewer than the limit under way: the read goes ahead.
	for range workers - 1 {
		s.running <- struct{}{}
	}
	mustGet(t, s, 3)
	// At the limit: it waits, until its context ends.
	s.running <- struct{}{}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	dst := make([]byte, s.SlotBytes())
	if _, err := s.Get(cctx, k, dst); !errors.Is(err, context.Canceled) {
		t.Fatalf("get with %d of %d under way: %v, want context.Canceled", workers, workers, err)
	}
	for range workers {
		<-s.running
	}
	mustGet(t, s, 3)
}

// Get writes nothing past len(dst): an aligned dst as long as the block,
// not its rounded length, with capacity past it, is read through a buffer,
// and the bytes past its length are left as they were.
func TestGetWritesNothingPastLen(t *testing.T) {
	s := open(t, t.TempDir(), nil)
	ctx := context.Background()
	data := bytes.Repeat([]byte{0x3c}, Align+100)
	if err := s.Put(ctx, Key{Hash: 1, Tag: 7}, data); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, 2*Align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = 0xee
	}
	n, err := s.Get(ctx, Key{Hash: 1, Tag: 7}, mem[:len(data)])
	if err != nil || !bytes.Equal(mem[:n], data) {
		t.Fatalf("get: %d bytes, %v; want the block whole", n, err)
	}
	if !bytes.Equal(mem[len(data):], bytes.Repeat([]byte{0xee}, 2*Align-len(data))) {
		t.Fatal("Get wrote past len(dst) into its capacity")
	}
}
