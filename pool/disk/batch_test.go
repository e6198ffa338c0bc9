package disk

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// A batch's blocks are durable together, in one commit (one data sync per
// file written, one journal write and sync): each reads back byte-exact,
// now and after a reopen, whether it was written straight from aligned
// memory or through a buffer; an item that cannot be put fails alone.
func TestPutBatchOneCommit(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	ctx := context.Background()
	var items []PutItem
	for h := uint64(1); h <= 24; h++ {
		data := blockOf(h, s.SlotBytes())
		if h%2 == 0 {
			// Page aligned with room to the next 4 KiB, as the tier's
			// buffers are: written with no copy.
			m, err := unix.Mmap(-1, 0, s.SlotBytes(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(m)
			data = m[:copy(m, data)]
		}
		items = append(items, PutItem{Key: Key{Hash: h, Tag: 7}, Data: data})
	}
	tooLarge := make([]byte, s.SlotBytes()+1)
	items = append(items, PutItem{Key: Key{Hash: 99, Tag: 7}, Data: tooLarge}, PutItem{Key: Key{Hash: 98, Tag: 7}})
	before := s.Stats()
	errs := s.PutBatch(ctx, items)
	for i, err := range errs[:24] {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	for i, err := range errs[24:] {
		if !errors.Is(err, ErrTooLarge) {
			t.Fatalf("item %d of %d bytes: %v, want ErrTooLarge", 24+i, len(items[24+i].Data), err)
		}
	}
	after := s.Stats()
	if got := after.Commits - before.Commits; got != 1 {
		t.Fatalf("a batch of 24 blocks took %d commits, want 1", got)
	}
	if after.Puts-before.Puts != 24 || after.Blocks != 24 || after.JournalRecords-before.JournalRecords != 24 {
		t.Fatalf("stats %+v after a batch of 24 puts from %+v", after, before)
	}
	check := func(s *Store) {
		t.Helper()
		for h := uint64(1); h <= 24; h++ {
			if got := mustGet(t, s, h); string(got) != string(blockOf(h, s.SlotBytes())) {
				t.Fatalf("block %d differs", h)
			}
		}
		if s.Has(Key{Hash: 99, Tag: 7}) || s.Has(Key{Hash: 98, Tag: 7}) {
			t.Fatal("an item that failed is in the store")
		}
	}
	check(s)
	s.Close()
	check(open(t, dir, nil))
}

// A batch larger than the free slots puts what fits and refuses the rest
// with ErrFull; their slots are not lost.
func TestPutBatchPastFreeSlots(t *testing.T) {
	s := open(t, t.TempDir(), func(c *Config) { c.Bytes = 4 * 16 << 10 })
	var items []PutItem
	for h := uint64(1); h <= 6; h++ {
		items = append(items, PutItem{Key: Key{Hash: h, Tag: 7}, Data: blockOf(h, s.SlotBytes())})
	}
	errs := s.PutBatch(context.Background(), items)
	full := 0
	for i, err := range errs {
		switch {
		case errors.Is(err, ErrFull):
			full++
		case err != nil:
			t.Fatalf("item %d: %v", i, err)
		default:
			mustGet(t, s, items[i].Key.Hash)
		}
	}
	if full != 2 || s.Stats().Blocks != 4 {
		t.Fatalf("%d items refused for a full store, %d blocks held; want 2 and 4", full, s.Stats().Blocks)
	}
	if err := s.Delete(items[0].Key); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), Key{Hash: 50, Tag: 7}, blockOf(50, s.SlotBytes())); err != nil {
		t.Fatalf("put into the slot a delete freed: %v", err)
	}
}

// MaxPutBatch items are put in one batch; past it, a PutBatch and a
// Batch alike put the first MaxPutBatch and fail each item after alone.
func TestPutBatchLimit(t *testing.T) {
	s := open(t, t.TempDir(), func(c *Config) {
		c.SlotBytes, c.Bytes, c.FileBytes, c.QueueDepth = Align, (MaxPutBatch+2)*Align, 64*Align, 8
	})
	batch := func(n int) []PutItem {
		items := make([]PutItem, n)
		for i := range items {
			items[i] = PutItem{Key: Key{Hash: uint64(1000*n + i), Tag: 7}, Data: []byte(fmt.Sprint(i))}
		}
		return items
	}
	for i, err := range s.PutBatch(context.Background(), batch(MaxPutBatch)) {
		if err != nil {
			t.Fatalf("item %d of a batch at the limit: %v", i, err)
		}
	}
	if n := s.Stats().Blocks; n != MaxPutBatch {
		t.Fatalf("%d blocks after a batch at the limit, want %d", n, MaxPutBatch)
	}
	for _, viaBatch := range []bool{false, true} {
		for _, k := range s.Keys() {
			if err := s.Delete(k); err != nil {
				t.Fatal(err)
			}
		}
		items := batch(MaxPutBatch + 2)
		var errs []error
		if viaBatch {
			b := s.NewBatch()
			for _, it := range items {
				b.Add(context.Background(), it.Key, it.Data)
			}
			errs = b.Commit()
		} else {
			errs = s.PutBatch(context.Background(), items)
		}
		for i, err := range errs[:MaxPutBatch] {
			if err != nil {
				t.Fatalf("Batch %v: item %d within the limit: %v", viaBatch, i, err)
			}
		}
		for i, err := range errs[MaxPutBatch:] {
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("Batch %v: item %d past the limit: %v, want ErrTooLarge", viaBatch, MaxPutBatch+i, err)
			}
		}
		if n, free := s.Stats().Blocks, s.Free(); n != MaxPutBatch || free != 2 {
			t.Fatalf("Batch %v: %d blocks and %d free slots after a batch two past the limit, want %d and 2", viaBatch, n, free, MaxPutBatch)
		}
	}
}

// A store killed between a batch's data syncs and its journal write
// restarts with every block of the batches before it, byte-exact, and none
// of that batch's, though their bytes are on disk: a block whose record is
// not in the journal is never served.
func TestKilledBeforeBatchJournalled(t *testing.T) {
	dir := t.TempDir()
	cmd, sc := startChild(t, "KVFABRIC_DISK_BATCH_CHILD="+dir)
	var done []uint64
	var cut []uint64
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, "cut "); ok {
			for _, f := range strings.Fields(rest) {
				h, err := strconv.ParseUint(f, 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				cut = append(cut, h)
			}
			continue
		}
		if h, err := strconv.ParseUint(line, 10, 64); err == nil {
			done = append(done, h)
		} else {
			t.Logf("child: %s", line)
		}
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the child ended with %v, want killed", err)
	}
	if len(done) != batchChildBatches*batchChildSize || len(cut) != batchChildSize {
		t.Fatalf("the child put %d blocks and was cut in a batch of %d; want %d and %d", len(done), len(cut),
			batchChildBatches*batchChildSize, batchChildSize)
	}
	s := reopenAfterKill(t, dir, done)
	for _, h := range cut {
		if s.Has(Key{Hash: h, Tag: 7}) {
			t.Fatalf("block %d of the batch cut before its journal write is served after the kill", h)
		}
	}
	if n := len(s.Keys()); n != len(done) {
		t.Fatalf("%d blocks after the kill, want the %d of the completed batches", n, len(done))
	}
}

const batchChildBatches, batchChildSize = 5, 16

// batchPutterChild puts batchChildBatches batches, printing each block's
// hash once its batch returned, then kills itself in the next batch's
// commit, between its data syncs and its journal write:
// TestKilledBeforeBatchJournalled's child process.
func batchPutterChild(dir string) int {
	s, err := Open(Config{Dir: dir, Bytes: 4096 * 16 << 10, SlotBytes: 16 << 10, FileBytes: 16 * 16 << 10})
	if err != nil {
		fmt.Println(err)
		return 2
	}
	w := bufio.NewWriter(os.Stdout)
	h := uint64(1)
	for b := 0; ; b++ {
		items := make([]PutItem, batchChildSize)
		for i := range items {
			items[i] = PutItem{Key: Key{Hash: h, Tag: 7}, Data: blockOf(h, s.SlotBytes())}
			h++
		}
		if b == batchChildBatches {
			s.beforeJournal = func() {
				fmt.Fprint(w, "cut")
				for _, it := range items {
					fmt.Fprintf(w, " %d", it.Key.Hash)
				}
				fmt.Fprintln(w)
				w.Flush()
				syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // the signal ends the process
			}
		}
		for _, err := range s.PutBatch(context.Background(), items) {
			if err != nil {
				fmt.Fprintln(w, err)
				w.Flush()
				return 2
			}
		}
		for _, it := range items {
			fmt.Fprintln(w, it.Key.Hash)
		}
		w.Flush()
	}
}

// The checksum a batch records is of exactly each block's bytes, whichever
// way the block was written (straight from aligned memory whose room past
// the block held other bytes, or through a buffer) and whatever its length
// against Align: the record matches the bytes, each reads back byte-exact
// now and after a reopen, and a flip of a block's last byte is caught.
func TestBatchChecksumIsOfTheBlockBytes(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	slot := s.SlotBytes()
	lengths := []int{1, Align - 1, Align, Align + 1, slot - 1, slot}
	type block struct {
		key  Key
		data []byte
	}
	var blocks []block
	var items []PutItem
	for i, n := range lengths {
		for _, direct := range []bool{true, false} {
			k := Key{Hash: uint64(100 + 2*i), Tag: 7}
			var data []byte
			if direct {
				m, err := unix.Mmap(-1, 0, slot, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
				if err != nil {
					t.Fatal(err)
				}
				defer unix.Munmap(m)
				for j := range m {
					m[j] = 0xAA // past the block: zeroed on disk, not in its checksum
				}
				data = m[:n:roundUp(n)]
			} else {
				k.Hash++
				data = make([]byte, n+1)[1:] // not aligned: through a buffer
			}
			for j := range data {
				data[j] = byte(uint64(j)*7 ^ k.Hash)
			}
			blocks = append(blocks, block{k, append([]byte(nil), data...)})
			items = append(items, PutItem{Key: k, Data: data})
		}
	}
	for i, err := range s.PutBatch(context.Background(), items) {
		if err != nil {
			t.Fatalf("block %d of %d bytes: %v", i, len(items[i].Data), err)
		}
	}
	check := func(s *Store) {
		t.Helper()
		for _, b := range blocks {
			s.mu.Lock()
			e := s.entries[b.key]
			s.mu.Unlock()
			if want := xxh3.Hash(b.data); e.sum != want || int(e.length) != len(b.data) {
				t.Fatalf("block %d of %d bytes recorded with sum %016x, length %d; want %016x", b.key.Hash, len(b.data), e.sum, e.length, want)
			}
			dst := make([]byte, slot)
			n, err := s.Get(context.Background(), b.key, dst)
			if err != nil || !bytes.Equal(dst[:n], b.data) {
				t.Fatalf("block %d of %d bytes read back as %d bytes, %v", b.key.Hash, len(b.data), n, err)
			}
		}
	}
	check(s)
	s.Close()
	r := open(t, dir, nil)
	check(r)
	// The last byte of the block of Align+1 bytes written straight.
	k := Key{Hash: 106, Tag: 7}
	r.mu.Lock()
	e := r.entries[k]
	r.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("blocks.%03d", int(e.slot)/r.perFile)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(int(e.slot)%r.perFile)*int64(slot) + int64(e.length) - 1
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := r.Get(context.Background(), k, make([]byte, slot)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a flipped last byte: %v, want ErrCorrupt", err)
	}
}

// A block added in pieces is written straight from them when they are
// aligned (one vectored write) and through a buffer when not, and its
// recorded checksum is of the pieces' bytes in order. A block whose memory
// changed under its write is written again from other bytes (Replace),
// recorded with their checksum, or taken out (Drop: nothing journalled,
// its slot free again). Each holds after a reopen.
func TestBatchPiecesReplaceAndDrop(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil) // slots of 16 KiB
	mem, err := unix.Mmap(-1, 0, 8*Align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i*7 + i>>12)
	}
	tail, err := unix.Mmap(-1, 0, Align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(tail)
	copy(tail, "a trailer of 16.")
	for i := 16; i < Align; i++ {
		tail[i] = 0xAA // past the block: zeroed on disk, not in its checksum
	}
	concat := func(pieces ...[]byte) []byte { return bytes.Join(pieces, nil) }
	type want struct {
		hash uint64
		data []byte // nil: not in the store
	}
	var wants []want
	b := s.NewBatch()
	ctx := context.Background()
	// 0: aligned pieces, written straight.
	straightPieces := [][]byte{mem[:Align], mem[2*Align : 4*Align], tail[:16]}
	b.AddPieces(ctx, Key{Hash: 1, Tag: 7}, straightPieces...)
	wants = append(wants, want{1, concat(mem[:Align], mem[2*Align:4*Align], []byte("a trailer of 16."))})
	if tail[16] != 0 || tail[Align-1] != 0 {
		t.Fatal("aligned pieces not written straight: the last one's room past it was not zeroed")
	}
	// 1: a piece not a multiple of Align long: through a buffer.
	b.AddPieces(ctx, Key{Hash: 2, Tag: 7}, mem[:100], mem[Align:2*Align])
	wants = append(wants, want{2, concat(mem[:100], mem[Align:2*Align])})
	// 2: written from memory that changes under the write, then written
	// again from other bytes (of another length), which are what the store
	// must hold and record the checksum of.
	repl := bytes.Repeat([]byte("replaced"), (2*Align-100)/8)
	b.AddPieces(ctx, Key{Hash: 3, Tag: 7}, mem[4*Align:6*Align])
	// 3: the same, dropped.
	b.AddPieces(ctx, Key{Hash: 4, Tag: 7}, mem[6*Align:8*Align])
	for i := range 4 {
		if err := b.Wait(i); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for i := 4 * Align; i < 8*Align; i++ {
		mem[i] ^= 0xFF
	}
	free := s.Free()
	if !b.Replace(ctx, 2, repl) {
		t.Fatal("Replace of a block written refused")
	}
	wants = append(wants, want{3, repl})
	b.Drop(3)
	wants = append(wants, want{4, nil})
	if got := s.Free(); got != free+1 {
		t.Fatalf("%d free slots after a Drop, want %d", got, free+1)
	}
	errs := b.Commit()
	for i, err := range errs[:3] {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if !errors.Is(errs[3], ErrDropped) {
		t.Fatalf("the item dropped: %v, want ErrDropped", errs[3])
	}
	check := func(s *Store) {
		t.Helper()
		for _, w := range wants {
			k := Key{Hash: w.hash, Tag: 7}
			if w.data == nil {
				if s.Has(k) {
					t.Fatalf("block %d dropped from its batch is in the store", w.hash)
				}
				continue
			}
			s.mu.Lock()
			e := s.entries[k]
			s.mu.Unlock()
			if e.sum != xxh3.Hash(w.data) || int(e.length) != len(w.data) {
				t.Fatalf("block %d recorded with sum %016x, length %d; want those of its %d bytes", w.hash, e.sum, e.length, len(w.data))
			}
			if got := mustGet(t, s, w.hash); !bytes.Equal(got, w.data) {
				t.Fatalf("block %d differs", w.hash)
			}
		}
	}
	check(s)
	s.Close()
	check(open(t, dir, nil))
}

// GetPieces fills pieces in order with a block's bytes, read straight into
// aligned pieces or through a buffer into any others, up to the block's
// length; pieces too short for the block are refused, and bytes that fail
// the block's checksum are never returned as good.
func TestGetPieces(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil) // slots of 16 KiB
	data := make([]byte, 3*Align+16)
	for i := range data {
		data[i] = byte(i*13 + i>>9)
	}
	ctx := context.Background()
	if err := s.Put(ctx, Key{Hash: 1, Tag: 7}, data); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, 6*Align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for _, tc := range []struct {
		desc   string
		pieces [][]byte
		err    error
	}{
		{"aligned pieces, exactly the block", [][]byte{mem[:Align], mem[2*Align : 4*Align], mem[5*Align : 5*Align+16]}, nil},
		{"aligned pieces, longer than the block", [][]byte{mem[:2*Align], mem[2*Align : 6*Align]}, nil},
		{"a piece not a multiple of Align", [][]byte{mem[:100], mem[Align : 5*Align]}, nil},
		{"one unaligned piece", [][]byte{make([]byte, 5*Align)[1:]}, nil},
		{"pieces a byte short", [][]byte{mem[:Align], mem[2*Align : 4*Align], mem[5*Align : 5*Align+15]}, ErrTooLarge},
	} {
		clear(mem)
		n, err := s.GetPieces(ctx, Key{Hash: 1, Tag: 7}, tc.pieces...)
		if tc.err != nil {
			if !errors.Is(err, tc.err) {
				t.Fatalf("%s: %v, want %v", tc.desc, err, tc.err)
			}
			continue
		}
		if err != nil || n != len(data) {
			t.Fatalf("%s: %d bytes, %v", tc.desc, n, err)
		}
		if got := bytes.Join(tc.pieces, nil)[:n]; !bytes.Equal(got, data) {
			t.Fatalf("%s: the pieces hold other bytes", tc.desc)
		}
	}
	// A flipped byte on disk: ErrCorrupt into aligned pieces too, and the
	// block is gone.
	s.mu.Lock()
	e := s.entries[Key{Hash: 1, Tag: 7}]
	s.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("blocks.%03d", int(e.slot)/s.perFile)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(int(e.slot)%s.perFile)*int64(s.SlotBytes()) + Align + 5
	if _, err := f.WriteAt([]byte{^data[Align+5]}, off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.GetPieces(ctx, Key{Hash: 1, Tag: 7}, mem[:2*Align], mem[2*Align:6*Align]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a flipped byte read into pieces: %v, want ErrCorrupt", err)
	}
	if s.Has(Key{Hash: 1, Tag: 7}) {
		t.Fatal("a corrupt block is still held")
	}
}

// Wait says why an item was not written (Add's error: here ErrFull once
// the slots ran out) and a write that failed (EIO) with its error; Commit
// returns the same for each, journals neither and frees the failed
// write's slot, and the items written are put.
func TestBatchWaitSaysWhyNotWritten(t *testing.T) {
	var fail atomic.Bool
	s := open(t, t.TempDir(), func(c *Config) {
		c.Bytes, c.FileBytes = 2*16<<10, 2*16<<10
		c.FailIO = func(write, _ bool) error {
			if write && fail.Load() {
				return unix.EIO
			}
			return nil
		}
	})
	ctx := context.Background()
	data := bytes.Repeat([]byte{7}, 100)
	b := s.NewBatch()
	b.Add(ctx, Key{Hash: 1, Tag: 7}, data)
	if err := b.Wait(0); err != nil {
		t.Fatalf("a write that ran: %v", err)
	}
	fail.Store(true)
	b.Add(ctx, Key{Hash: 2, Tag: 7}, data)
	if err := b.Wait(1); !errors.Is(err, unix.EIO) {
		t.Fatalf("a write that failed: Wait %v, want EIO", err)
	}
	b.Add(ctx, Key{Hash: 3, Tag: 7}, data) // the one free slot is the failed write's until Commit
	if err := b.Wait(2); !errors.Is(err, ErrFull) {
		t.Fatalf("an item with no slot: Wait %v, want ErrFull", err)
	}
	errs := b.Commit()
	if errs[0] != nil || !errors.Is(errs[1], unix.EIO) || !errors.Is(errs[2], ErrFull) {
		t.Fatalf("Commit: %v, want nil, EIO, ErrFull", errs)
	}
	if !s.Has(Key{Hash: 1, Tag: 7}) || s.Has(Key{Hash: 2, Tag: 7}) || s.Has(Key{Hash: 3, Tag: 7}) {
		t.Fatal("the store holds other blocks than the one written")
	}
	if got := s.Free(); got != 1 {
		t.Fatalf("%d free slots after the batch, want 1 (the failed write's given back)", got)
	}
}

// FailIO fails exactly the requests it names: a read straight into the
// caller's memory refused (EINVAL, as O_DIRECT refuses memory it cannot
// take) fails with that errno, and the same read through a buffer of the
// store's runs and returns the block whole.
func TestFailIOStraightRead(t *testing.T) {
	s := open(t, t.TempDir(), func(c *Config) {
		c.FailIO = func(write, straight bool) error {
			if !write && straight {
				return unix.EINVAL
			}
			return nil
		}
	})
	ctx := context.Background()
	data := bytes.Repeat([]byte("block..."), Align/8)
	if err := s.Put(ctx, Key{Hash: 1, Tag: 7}, data); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, Align, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if _, err := s.GetPieces(ctx, Key{Hash: 1, Tag: 7}, mem); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("a straight read refused: %v, want EINVAL", err)
	}
	dst := make([]byte, Align+1)[1:] // not aligned: through a buffer
	if n, err := s.Get(ctx, Key{Hash: 1, Tag: 7}, dst); err != nil || !bytes.Equal(dst[:n], data) {
		t.Fatalf("a read through a buffer: %d bytes, %v; want the block whole", n, err)
	}
}
