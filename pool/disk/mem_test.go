package disk

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func memBlock(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// A MemStore holds what it is given byte for byte, up to its slots: at
// its capacity every put lands, one past it fails with ErrFull; a block
// changed in memory is dropped on its next read, never returned.
func TestMemStore(t *testing.T) {
	ctx := context.Background()
	s, err := NewMem(MemConfig{Bytes: 4*Align + 100, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Slots() != 4 {
		t.Fatalf("%d slots, want 4", s.Slots())
	}
	for i := range 4 {
		if err := s.Put(ctx, Key{Hash: uint64(i), Tag: 9}, memBlock(byte(i), 3000)); err != nil {
			t.Fatalf("put %d of 4: %v", i, err)
		}
	}
	if err := s.Put(ctx, Key{Hash: 4, Tag: 9}, memBlock(4, 3000)); !errors.Is(err, ErrFull) {
		t.Fatalf("put past the capacity: %v, want ErrFull", err)
	}
	dst := make([]byte, Align)
	for i := range 4 {
		n, err := s.Get(ctx, Key{Hash: uint64(i), Tag: 9}, dst)
		if err != nil || !bytes.Equal(dst[:n], memBlock(byte(i), 3000)) {
			t.Fatalf("get %d: %d bytes, %v, not what was put", i, n, err)
		}
	}
	// Read in pieces.
	a, b := make([]byte, 1000), make([]byte, 2500)
	if n, err := s.GetPieces(ctx, Key{Hash: 1, Tag: 9}, a, b); err != nil || n != 3000 ||
		!bytes.Equal(append(a, b[:2000]...), memBlock(1, 3000)) {
		t.Fatalf("get in pieces: %d, %v", n, err)
	}
	if _, err := s.Get(ctx, Key{Hash: 1, Tag: 8}, dst); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get under another tag: %v, want ErrNotFound", err)
	}
	if _, err := s.Get(ctx, Key{Hash: 1, Tag: 9}, dst[:10]); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("get into too small a buffer: %v, want ErrTooLarge", err)
	}
	if !s.CorruptForTest(Key{Hash: 2, Tag: 9}, 2999, 1) || s.CorruptForTest(Key{Hash: 2, Tag: 9}, 3000, 1) {
		t.Fatal("corrupt: the last byte must be found, the one past it not")
	}
	if _, err := s.Get(ctx, Key{Hash: 2, Tag: 9}, dst); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("get of a changed block: %v, want ErrCorrupt", err)
	}
	if s.Has(Key{Hash: 2, Tag: 9}) || s.Free() != 1 || s.Stats().Corrupt != 1 {
		t.Fatalf("after a checksum failure: held %v, %d free, %+v", s.Has(Key{Hash: 2, Tag: 9}), s.Free(), s.Stats())
	}
	if err := s.Put(ctx, Key{Hash: 4, Tag: 9}, memBlock(4, Align+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a block larger than a slot: %v, want ErrTooLarge", err)
	}
	if err := s.Delete(Key{Hash: 0, Tag: 9}); err != nil || s.Free() != 2 {
		t.Fatalf("delete: %v, %d free", err, s.Free())
	}
}

// A batch's items enter the store at Commit; Replace records the bytes
// given instead, Drop frees the item's slot.
func TestMemBatch(t *testing.T) {
	ctx := context.Background()
	s, err := NewMem(MemConfig{Bytes: 2 * Align, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	b.AddPieces(ctx, Key{Hash: 1}, memBlock(1, 100), memBlock(2, 100))
	b.Add(ctx, Key{Hash: 2}, memBlock(3, 100))
	b.Add(ctx, Key{Hash: 3}, memBlock(4, 100)) // no slot left
	if s.Has(Key{Hash: 1}) {
		t.Fatal("an item is in the store before Commit")
	}
	if !b.Replace(ctx, 0, memBlock(5, 200)) || b.Replace(ctx, 2, memBlock(5, 200)) {
		t.Fatal("replace: an item added must be replaced, one not added not")
	}
	if b.Wait(0) != nil || !errors.Is(b.Wait(2), ErrFull) {
		t.Fatalf("wait: %v, %v; want nil for the item copied, ErrFull for the one with no slot", b.Wait(0), b.Wait(2))
	}
	b.Drop(1)
	errs := b.Commit()
	if errs[0] != nil || !errors.Is(errs[1], ErrDropped) || !errors.Is(errs[2], ErrFull) {
		t.Fatalf("commit: %v", errs)
	}
	dst := make([]byte, Align)
	if n, err := s.Get(ctx, Key{Hash: 1}, dst); err != nil || !bytes.Equal(dst[:n], memBlock(5, 200)) {
		t.Fatalf("the replaced item: %d bytes, %v", n, err)
	}
	if s.Free() != 1 {
		t.Fatalf("%d slots free, want the dropped item's", s.Free())
	}
	s.Close()
	s.Close()
	if _, err := s.Get(ctx, Key{Hash: 1}, dst); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
	if err := s.Put(ctx, Key{Hash: 5}, memBlock(6, 100)); !errors.Is(err, ErrClosed) {
		t.Fatalf("put after close: %v", err)
	}
}

// The configuration's limits, at and past them.
func TestMemConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg MemConfig
		ok  bool
	}{
		{MemConfig{Bytes: Align, SlotBytes: Align}, true},
		{MemConfig{Bytes: Align - 1, SlotBytes: Align}, false},
		{MemConfig{Bytes: MaxMemBytes + 1, SlotBytes: Align}, false},
		{MemConfig{Bytes: Align, SlotBytes: Align + 1}, false},
		{MemConfig{Bytes: MaxSlotBytes + Align, SlotBytes: MaxSlotBytes + Align}, false},
		{MemConfig{Bytes: 2 * Align, SlotBytes: Align, Memory: make([]byte, Align)}, false},
		{MemConfig{Bytes: 2 * Align, SlotBytes: Align, Memory: make([]byte, 2*Align)}, true},
	} {
		s, err := NewMem(tc.cfg)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalidConfig)) {
			t.Errorf("%+v: %v, want ok %v", MemConfig{Bytes: tc.cfg.Bytes, SlotBytes: tc.cfg.SlotBytes}, err, tc.ok)
		}
		if s != nil {
			s.Close()
		}
	}
}

// DeleteIf deletes the copy of the generation read and no other: a copy
// of the same key put since (the same bytes, even in the same slot) is
// kept.
func TestMemStoreDeleteIf(t *testing.T) {
	ctx := context.Background()
	s, err := NewMem(MemConfig{Bytes: 2 * Align, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := Key{Hash: 5, Tag: 1}
	data := memBlock(5, 3000)
	if err := s.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, Align)
	n, first, err := s.GetGen(ctx, k, dst)
	if err != nil || !bytes.Equal(dst[:n], data) {
		t.Fatalf("GetGen: %d bytes, %v", n, err)
	}
	// Freed and put again: the same key, the same bytes, a new copy.
	if err := s.Delete(k); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteIf(k, first); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DeleteIf of a copy since replaced: %v, want ErrNotFound", err)
	}
	if !s.Has(k) {
		t.Fatal("DeleteIf of an older generation deleted the copy put since")
	}
	_, second, err := s.GetGen(ctx, k, dst)
	if err != nil || second == first {
		t.Fatalf("GetGen of the copy put again: generation %d (was %d), %v", second, first, err)
	}
	if err := s.DeleteIf(k, second); err != nil {
		t.Fatalf("DeleteIf of the copy read: %v", err)
	}
	if s.Has(k) || s.Free() != 2 {
		t.Fatalf("after DeleteIf: held %v, %d free slots, want gone, 2", s.Has(k), s.Free())
	}
	if err := s.DeleteIf(k, second); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DeleteIf twice: %v, want ErrNotFound", err)
	}
}

// A MemStore's read that fails (the block larger than the buffer; its
// bytes not matching its checksum, the copy dropped) returns the
// generation of the copy it found, as a Store's does; Gen gives that
// generation, never 0, while the copy is held, and none once it is
// dropped.
func TestMemStoreGetGenOfAFailedRead(t *testing.T) {
	ctx := context.Background()
	s, err := NewMem(MemConfig{Bytes: 2 * Align, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := Key{Hash: 9, Tag: 7}
	data := memBlock(9, 3000)
	if err := s.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	held, ok := s.Gen(k)
	if !ok || held == 0 {
		t.Fatalf("Gen of the copy put: %d, %v; want a generation from 1 up", held, ok)
	}
	if _, g, err := s.GetGen(ctx, k, make([]byte, len(data)-1)); !errors.Is(err, ErrTooLarge) || g != held {
		t.Fatalf("a read into too small a buffer: generation %d, %v; want %d, ErrTooLarge", g, err, held)
	}
	if !s.CorruptForTest(k, 10, 0x40) {
		t.Fatal("the copy was not corrupted")
	}
	if _, g, err := s.GetPiecesGen(ctx, k, make([]byte, 1000), make([]byte, Align)); !errors.Is(err, ErrCorrupt) || g != held {
		t.Fatalf("a corrupt read: generation %d, %v; want %d, ErrCorrupt", g, err, held)
	}
	if s.Has(k) {
		t.Fatal("the corrupt copy is still held")
	}
	if g, ok := s.Gen(k); ok {
		t.Fatalf("Gen of the copy dropped: %d, held; want none", g)
	}
}

// After Close a Store's Gen and Has report no copy held, as a MemStore's
// do (its Close drops every block): a closed store has no copy to act on.
// So from the Close on (a second Close included).
func TestGenAndHasAfterClose(t *testing.T) {
	ctx := context.Background()
	k := Key{Hash: 3, Tag: 7}
	m, err := NewMem(MemConfig{Bytes: 2 * Align, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, t.TempDir(), nil)
	for _, st := range []interface {
		Put(context.Context, Key, []byte) error
		Gen(Key) (uint64, bool)
		Has(Key) bool
		Close() error
	}{m, s} {
		if err := st.Put(ctx, k, memBlock(3, 3000)); err != nil {
			t.Fatal(err)
		}
		if g, ok := st.Gen(k); !ok || g == 0 {
			t.Fatalf("%T: Gen of the copy put: %d, %v; want a generation from 1 up", st, g, ok)
		}
		if !st.Has(k) {
			t.Fatalf("%T: Has of the copy put: false, want true", st)
		}
		for i := 0; i < 2; i++ {
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			if g, ok := st.Gen(k); ok {
				t.Fatalf("%T: Gen after Close %d: %d, held; want none", st, i+1, g)
			}
			if st.Has(k) {
				t.Fatalf("%T: Has after Close %d: true, want false", st, i+1)
			}
		}
	}
}

// ProbeMem maps and unmaps what NewMem would; sizes outside 1..MaxMemBytes
// are refused as invalid, not mapped.
func TestProbeMem(t *testing.T) {
	if err := ProbeMem(16 << 20); err != nil {
		t.Fatalf("ProbeMem of 16MiB: %v", err)
	}
	for _, n := range []int64{0, -1, MaxMemBytes + 1} {
		if err := ProbeMem(n); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ProbeMem(%d): %v, want ErrInvalidConfig", n, err)
		}
	}
}

// A MemStore of as many slots as MaxMemBytes holds starts without a list
// of them (a few allocations, not one entry per slot), every slot free;
// slots are handed out first used, freed ones again before new ones.
func TestMemStoreSlotsHandedOutLazily(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s, err := NewMem(MemConfig{Bytes: MaxMemBytes, SlotBytes: Align})
	if errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("a store at MaxMemBytes refused as a config: %v", err)
	}
	if err != nil {
		t.Skipf("a mapping of %d bytes refused here (overcommit): %v", int64(MaxMemBytes), err)
	}
	runtime.ReadMemStats(&after)
	defer s.Close()
	slots := MaxMemBytes / Align
	if s.Free() != slots {
		t.Fatalf("%d free slots, want %d", s.Free(), slots)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("NewMem of %d slots allocated %d bytes", slots, grew)
	}
	ctx := context.Background()
	for i := range 3 {
		if err := s.Put(ctx, Key{Hash: uint64(i)}, memBlock(byte(i), 100)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Delete(Key{Hash: 1}); err != nil {
		t.Fatal(err)
	}
	if s.Free() != slots-2 {
		t.Fatalf("%d free slots after 3 puts and a delete, want %d", s.Free(), slots-2)
	}
	if err := s.Put(ctx, Key{Hash: 3}, memBlock(3, 100)); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	reused, fresh := s.entries[Key{Hash: 3}].slot, s.fresh
	s.mu.Unlock()
	if reused != 1 || fresh != 3 {
		t.Fatalf("the put after a delete took slot %d (%d first used), want the freed slot 1 (3)", reused, fresh)
	}
	dst := make([]byte, Align)
	for _, i := range []int{0, 2, 3} {
		if n, err := s.Get(ctx, Key{Hash: uint64(i)}, dst); err != nil || !bytes.Equal(dst[:n], memBlock(byte(i), 100)) {
			t.Fatalf("get %d: %d bytes, %v", i, n, err)
		}
	}
}

// A MemBatch and a Store's Batch answer Wait and Commit alike: an item
// added nil, one past MaxPutBatch ErrTooLarge, one dropped ErrDropped, one
// with no free slot ErrFull; a batch of MaxPutBatch blocks goes in whole.
func TestMemBatchWaitsAsBatch(t *testing.T) {
	ctx := context.Background()
	const slots = MaxPutBatch + 1
	mem, err := NewMem(MemConfig{Bytes: slots * Align, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	st, err := Open(Config{Dir: t.TempDir(), Bytes: slots * Align, SlotBytes: Align, Buffered: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	type batch interface {
		Add(ctx context.Context, k Key, data []byte)
		Wait(i int) error
		Drop(i int)
		Commit() []error
	}
	for _, tc := range []struct {
		name  string
		b     func() batch
		store interface {
			Free() int
			Stats() Stats
		}
	}{
		{"MemBatch", func() batch { return mem.NewBatch() }, mem},
		{"Batch", func() batch { return st.NewBatch() }, st},
	} {
		// MaxPutBatch blocks, then one past it.
		b := tc.b()
		for i := range MaxPutBatch + 1 {
			b.Add(ctx, Key{Hash: uint64(i), Tag: 1}, memBlock(byte(i), 1000))
		}
		for i := range MaxPutBatch {
			if err := b.Wait(i); err != nil {
				t.Fatalf("%s: item %d of %d: %v", tc.name, i, MaxPutBatch, err)
			}
		}
		if err := b.Wait(MaxPutBatch); !errors.Is(err, ErrTooLarge) {
			t.Fatalf("%s: item past MaxPutBatch: %v, want ErrTooLarge", tc.name, err)
		}
		b.Drop(0)
		if err := b.Wait(0); !errors.Is(err, ErrDropped) {
			t.Fatalf("%s: item dropped: %v, want ErrDropped", tc.name, err)
		}
		errs := b.Commit()
		for i, err := range errs {
			var want error
			switch i {
			case 0:
				want = ErrDropped
			case MaxPutBatch:
				want = ErrTooLarge
			}
			if (want == nil && err != nil) || (want != nil && !errors.Is(err, want)) {
				t.Fatalf("%s: commit of item %d: %v, want %v", tc.name, i, err, want)
			}
		}
		if got := tc.store.Stats().Blocks; got != MaxPutBatch-1 {
			t.Fatalf("%s: %d blocks after the commit, want %d", tc.name, got, MaxPutBatch-1)
		}
		// Two free slots: the third added has none.
		b = tc.b()
		for i := range 3 {
			b.Add(ctx, Key{Hash: uint64(1000 + i), Tag: 1}, memBlock(byte(i), 1000))
		}
		if err := b.Wait(2); !errors.Is(err, ErrFull) {
			t.Fatalf("%s: item with no free slot: %v, want ErrFull", tc.name, err)
		}
		if errs := b.Commit(); errs[0] != nil || errs[1] != nil || !errors.Is(errs[2], ErrFull) {
			t.Fatalf("%s: commit with the store full: %v", tc.name, errs)
		}
		if tc.store.Free() != 0 {
			t.Fatalf("%s: %d free slots, want 0", tc.name, tc.store.Free())
		}
	}
}

// Readers, deletes, puts reusing the slots freed and Close, all at once:
// a read returns the bytes of the key it asked for or an error (not
// found, closed), never another block's bytes from a reused slot; Close
// ends with the reads under way.
func TestMemStoreConcurrent(t *testing.T) {
	ctx := context.Background()
	s, err := NewMem(MemConfig{Bytes: 4 * Align, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	const keys = 8 // twice the slots: every put past 4 reuses a freed slot
	block := func(k uint64) []byte { return memBlock(byte(k*37+1), 3000) }
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var reads, found atomic.Int64
	for r := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, Align)
			for i := r; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := uint64(i % keys)
				n, err := s.Get(ctx, Key{Hash: k}, dst)
				reads.Add(1)
				switch {
				case errors.Is(err, ErrClosed):
					return
				case errors.Is(err, ErrNotFound):
				case err != nil:
					t.Errorf("get %d: %v", k, err)
					return
				case !bytes.Equal(dst[:n], block(k)):
					t.Errorf("get %d: %d bytes not its own", k, n)
					return
				default:
					found.Add(1)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			k := uint64(i % keys)
			if err := s.Put(ctx, Key{Hash: k}, block(k)); errors.Is(err, ErrClosed) {
				return
			}
			if err := s.Delete(Key{Hash: (k + keys/2) % keys}); errors.Is(err, ErrClosed) {
				return
			}
		}
	}()
	deadline := time.Now().Add(20 * time.Second)
	for (reads.Load() < 20000 || found.Load() < 1000) && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	if found.Load() == 0 {
		t.Fatalf("%d reads, none found a block", reads.Load())
	}
	if _, err := s.Get(ctx, Key{Hash: 0}, make([]byte, Align)); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after Close: %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close twice: %v", err)
	}
}
