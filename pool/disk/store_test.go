package disk

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// blockOf is the content a test stores under hash h: every byte depends on
// h and its offset, and its length on h.
func blockOf(h uint64, slot int) []byte {
	n := 1 + int(h*2654435761)%slot
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(uint64(i)*31 ^ h ^ h>>8)
	}
	return b
}

func open(t *testing.T, dir string, mod func(*Config)) *Store {
	t.Helper()
	cfg := Config{Dir: dir, Bytes: 64 * 16 << 10, SlotBytes: 16 << 10, FileBytes: 16 * 16 << 10}
	if mod != nil {
		mod(&cfg)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustGet(t *testing.T, s *Store, h uint64) []byte {
	t.Helper()
	dst := make([]byte, s.SlotBytes())
	n, err := s.Get(context.Background(), Key{Hash: h, Tag: 7}, dst)
	if err != nil {
		t.Fatalf("get %d: %v", h, err)
	}
	return dst[:n]
}

func TestPutGetAcrossFilesAndReopen(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	if s.Slots() != 64 {
		t.Fatalf("%d slots, want 64", s.Slots())
	}
	ctx := context.Background()
	for h := uint64(1); h <= 64; h++ {
		if err := s.Put(ctx, Key{Hash: h, Tag: 7}, blockOf(h, s.SlotBytes())); err != nil {
			t.Fatalf("put %d: %v", h, err)
		}
	}
	// A full slot's worth, and a replaced key.
	full := make([]byte, s.SlotBytes())
	for i := range full {
		full[i] = byte(i)
	}
	if err := s.Delete(Key{Hash: 64, Tag: 7}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, Key{Hash: 64, Tag: 7}, full); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, Key{Hash: 1, Tag: 7}, blockOf(1001, s.SlotBytes())); !errors.Is(err, ErrFull) {
		t.Fatalf("replacing a key in a full store: %v, want ErrFull", err)
	}
	if err := s.Delete(Key{Hash: 2, Tag: 7}); err != nil {
		t.Fatal(err)
	}
	check := func(s *Store) {
		t.Helper()
		for h := uint64(3); h < 64; h++ {
			if got, want := mustGet(t, s, h), blockOf(h, s.SlotBytes()); string(got) != string(want) {
				t.Fatalf("block %d differs", h)
			}
		}
		if got := mustGet(t, s, 64); string(got) != string(full) {
			t.Fatal("the full-slot block differs")
		}
		if _, err := s.Get(ctx, Key{Hash: 2, Tag: 7}, make([]byte, s.SlotBytes())); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a deleted block: %v, want ErrNotFound", err)
		}
		if _, err := s.Get(ctx, Key{Hash: 3, Tag: 8}, make([]byte, s.SlotBytes())); !errors.Is(err, ErrNotFound) {
			t.Fatalf("another tag: %v, want ErrNotFound", err)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	r := open(t, dir, nil)
	if n := len(r.Keys()); n != 63 {
		t.Fatalf("reopened with %d blocks, want 63", n)
	}
	check(r)
	// The freed slot is found again: one more fits, a second does not.
	for h := uint64(200); h < 201; h++ {
		if err := r.Put(ctx, Key{Hash: h, Tag: 7}, blockOf(h, r.SlotBytes())); err != nil {
			t.Fatalf("put %d after reopen: %v", h, err)
		}
	}
	if err := r.Put(ctx, Key{Hash: 300, Tag: 7}, []byte{1}); !errors.Is(err, ErrFull) {
		t.Fatalf("a put past the slots: %v, want ErrFull", err)
	}
}

func TestBlockSizeLimits(t *testing.T) {
	s := open(t, t.TempDir(), nil)
	ctx := context.Background()
	if err := s.Put(ctx, Key{Hash: 1}, make([]byte, s.SlotBytes())); err != nil {
		t.Fatalf("a block of one slot: %v", err)
	}
	if err := s.Put(ctx, Key{Hash: 2}, make([]byte, s.SlotBytes()+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a block one byte past a slot: %v, want ErrTooLarge", err)
	}
	if err := s.Put(ctx, Key{Hash: 3}, nil); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("an empty block: %v, want ErrTooLarge", err)
	}
	if _, err := s.Get(ctx, Key{Hash: 1}, make([]byte, s.SlotBytes()-1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a buffer one byte short: %v, want ErrTooLarge", err)
	}
}

// A byte flipped in the data file is caught on read, the block dropped,
// and it stays dropped after a restart.
func TestCorruptBlockDropped(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	ctx := context.Background()
	for h := uint64(1); h <= 3; h++ {
		if err := s.Put(ctx, Key{Hash: h, Tag: 7}, blockOf(h, s.SlotBytes())); err != nil {
			t.Fatal(err)
		}
	}
	s.mu.Lock()
	e := s.entries[Key{Hash: 2, Tag: 7}]
	s.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(dir, "blocks.000"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(e.slot)*int64(s.SlotBytes()) + int64(e.length)/2
	var b [1]byte
	f.ReadAt(b[:], off)
	b[0] ^= 0x40
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := s.Get(ctx, Key{Hash: 2, Tag: 7}, make([]byte, s.SlotBytes())); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a flipped byte: %v, want ErrCorrupt", err)
	}
	if s.Has(Key{Hash: 2, Tag: 7}) || s.Stats().Corrupt != 1 {
		t.Fatalf("the corrupt block is still held (stats %+v)", s.Stats())
	}
	// Its delete was committed at once, not left for the next commit: a
	// crash now does not bring it back.
	if c := open(t, crashCopy(t, dir), nil); c.Has(Key{Hash: 2, Tag: 7}) {
		t.Fatal("the corrupt block came back after a crash")
	}
	mustGet(t, s, 1)
	mustGet(t, s, 3)
	s.Close()
	r := open(t, dir, nil)
	if r.Has(Key{Hash: 2, Tag: 7}) {
		t.Fatal("the corrupt block came back after a restart")
	}
	mustGet(t, r, 3)
}

// A journal whose last record was cut short (a crash mid-append) opens
// with every complete record, and the tail is truncated.
func TestTornJournalTail(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	ctx := context.Background()
	for h := uint64(1); h <= 5; h++ {
		if err := s.Put(ctx, Key{Hash: h, Tag: 7}, blockOf(h, s.SlotBytes())); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	path := filepath.Join(dir, "journal")
	st, _ := os.Stat(path)
	// Cut the last record in half, then add garbage of a whole record.
	if err := os.Truncate(path, st.Size()-recordBytes/2); err != nil {
		t.Fatal(err)
	}
	r := open(t, dir, nil)
	if n := len(r.Keys()); n != 4 {
		t.Fatalf("%d blocks after a torn last record, want 4", n)
	}
	for h := uint64(1); h <= 4; h++ {
		mustGet(t, r, h)
	}
	if err := r.Put(ctx, Key{Hash: 9, Tag: 7}, blockOf(9, r.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	r.Close()
	j, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	j.Write(make([]byte, recordBytes))
	j.Close()
	r2 := open(t, dir, nil)
	if n := len(r2.Keys()); n != 5 {
		t.Fatalf("%d blocks after a zeroed record, want 5", n)
	}
	mustGet(t, r2, 9)
}

func TestJournalCompacts(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	ctx := context.Background()
	for i := range compactAfter + 100 {
		h := uint64(i%8 + 1)
		if err := s.Put(ctx, Key{Hash: h, Tag: uint64(i)}, blockOf(h, s.SlotBytes())); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(Key{Hash: h, Tag: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Put(ctx, Key{Hash: 42, Tag: 1}, blockOf(42, s.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	if n := s.Stats().JournalRecords; n >= compactAfter {
		t.Fatalf("%d journal records for one block, want a compacted journal", n)
	}
	s.Close()
	r := open(t, dir, nil)
	if k := r.Keys(); len(k) != 1 || k[0] != (Key{Hash: 42, Tag: 1}) {
		t.Fatalf("after compaction and restart: %v", k)
	}
}

func TestConfigLimits(t *testing.T) {
	dir := t.TempDir()
	base := Config{Dir: dir, Bytes: 1 << 20, SlotBytes: Align}
	for _, c := range []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"no dir", func(c *Config) { c.Dir = "" }, false},
		{"slot not aligned", func(c *Config) { c.SlotBytes = Align + 1 }, false},
		{"slot at the limit", func(c *Config) { c.SlotBytes = MaxSlotBytes; c.Bytes = MaxSlotBytes; c.FileBytes = MaxSlotBytes }, true},
		{"slot past the limit", func(c *Config) { c.SlotBytes = MaxSlotBytes + Align }, false},
		{"less than a slot", func(c *Config) { c.Bytes = Align - 1 }, false},
		{"workers at the limit", func(c *Config) { c.Workers = MaxWorkers }, true},
		{"workers past", func(c *Config) { c.Workers = MaxWorkers + 1 }, false},
		{"queue at the limit", func(c *Config) { c.QueueDepth = MaxQueueDepth }, true},
		{"queue past", func(c *Config) { c.QueueDepth = MaxQueueDepth + 1 }, false},
		{"file at the limit", func(c *Config) { c.FileBytes = MaxFileBytes }, true},
		{"file past", func(c *Config) { c.FileBytes = MaxFileBytes + 1 }, false},
		{"files at the limit", func(c *Config) { c.FileBytes = Align; c.Bytes = MaxFiles * Align }, true},
		{"files past", func(c *Config) { c.FileBytes = Align; c.Bytes = (MaxFiles + 1) * Align }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := base
			cfg.Dir = filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-"))
			c.mod(&cfg)
			if c.name == "no dir" {
				cfg.Dir = ""
			}
			s, err := Open(cfg)
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				return
			}
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("%v, want ErrInvalidConfig", err)
			}
		})
	}
}

// The queue holds QueueDepth requests; one past waits for room under its
// context and gives up with it.
func TestQueueDepthLimit(t *testing.T) {
	s := &Store{requests: make(chan request, 2)}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for range 2 {
		go s.do(context.Background(), request{f: f}) // no worker takes them
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(s.requests) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("two requests never queued")
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.do(ctx, request{f: f}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a request past the queue's depth: %v, want the context's deadline", err)
	}
}

// An agent killed while putting blocks restarts with every block whose put
// returned, each byte-exact, and no torn block served.
func TestKilledWhilePutting(t *testing.T) {
	dir := t.TempDir()
	cmd, sc := startChild(t, "KVFABRIC_DISK_CHILD="+dir)
	var done []uint64
	for sc.Scan() && len(done) < 200 {
		if h, err := strconv.ParseUint(sc.Text(), 10, 64); err == nil {
			done = append(done, h)
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	if len(done) < 200 {
		t.Fatalf("the child put %d blocks before it stopped", len(done))
	}
	s := reopenAfterKill(t, dir, done)
	// Whatever else the journal holds (puts that finished as the child
	// died) reads back whole too.
	for _, k := range s.Keys() {
		if _, err := s.Get(context.Background(), k, make([]byte, s.SlotBytes())); err != nil {
			t.Fatalf("block %d: %v", k.Hash, err)
		}
	}
	t.Logf("%d puts reported, %d blocks found after the kill", len(done), len(s.Keys()))
}

// startChild starts this test binary again as a child process with env
// added (which TestMain turns into a child's work) and returns it with a
// scanner of its standard output.
func startChild(t *testing.T, env string) (*exec.Cmd, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, bufio.NewScanner(out)
}

// reopenAfterKill opens the store a killed child left in dir and checks
// that every block of done (the hashes whose puts returned) reads back
// byte-exact.
func reopenAfterKill(t *testing.T, dir string, done []uint64) *Store {
	t.Helper()
	s := open(t, dir, func(c *Config) { c.Bytes = 4096 * 16 << 10 })
	for _, h := range done {
		if got, want := mustGet(t, s, h), blockOf(h, s.SlotBytes()); string(got) != string(want) {
			t.Fatalf("block %d differs after the kill", h)
		}
	}
	return s
}

// putterChild puts blocks until killed, printing each hash once its put
// returned: TestKilledWhilePutting's child process.
func putterChild(dir string) int {
	s, err := Open(Config{Dir: dir, Bytes: 4096 * 16 << 10, SlotBytes: 16 << 10, FileBytes: 16 * 16 << 10})
	if err != nil {
		fmt.Println(err)
		return 2
	}
	for h := uint64(1); ; h++ {
		if err := s.Put(context.Background(), Key{Hash: h, Tag: 7}, blockOf(h, s.SlotBytes())); err != nil {
			fmt.Println(err)
			return 2
		}
		fmt.Println(h)
	}
}

func TestMain(m *testing.M) {
	if dir := os.Getenv("KVFABRIC_DISK_CHILD"); dir != "" {
		os.Exit(putterChild(dir))
	}
	if dir := os.Getenv("KVFABRIC_DISK_BATCH_CHILD"); dir != "" {
		os.Exit(batchPutterChild(dir))
	}
	os.Exit(m.Run())
}

// DeleteIf deletes the copy of the generation read and no other: a copy of
// the same key put since (the same bytes, even in the slot freed) is
// kept, and so is one replaced by a put of the key still held. After a
// reopen each block found again has a generation of its own, which
// DeleteIf takes, and a put after it a new one.
func TestStoreDeleteIf(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, func(c *Config) { c.Bytes = 3 * int64(c.SlotBytes); c.FileBytes = c.Bytes })
	ctx := context.Background()
	k := Key{Hash: 5, Tag: 7}
	data := blockOf(5, s.SlotBytes())
	gen := func(s *Store, k Key) uint64 {
		t.Helper()
		dst := make([]byte, s.SlotBytes())
		n, g, err := s.GetGen(ctx, k, dst)
		if err != nil || string(dst[:n]) != string(data) {
			t.Fatalf("GetGen: %d bytes, %v", n, err)
		}
		if held, ok := s.Gen(k); !ok || held != g {
			t.Fatalf("Gen: %d, %v; the copy read is of generation %d", held, ok, g)
		}
		return g
	}
	if err := s.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	first := gen(s, k)
	// Replaced by a put of the key held: a new copy.
	if err := s.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteIf(k, first); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DeleteIf of a copy since replaced: %v, want ErrNotFound", err)
	}
	if !s.Has(k) {
		t.Fatal("DeleteIf of an older generation deleted the copy put in its place")
	}
	second := gen(s, k)
	if second == first {
		t.Fatalf("a copy put in place of another has its generation, %d", first)
	}
	// Deleted and put again, into the slot freed: a new copy.
	if err := s.Delete(k); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteIf(k, second); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DeleteIf of a copy deleted and put again: %v, want ErrNotFound", err)
	}
	third := gen(s, k)
	if third == second || third == first {
		t.Fatalf("a copy put again has generation %d, as an earlier one (%d, %d)", third, first, second)
	}
	if err := s.DeleteIf(k, third); err != nil {
		t.Fatalf("DeleteIf of the copy read: %v", err)
	}
	if s.Has(k) || s.Free() != 3 || s.Stats().Deletes != 2 {
		t.Fatalf("after DeleteIf: held %v, %d free slots, stats %+v; want gone, 3, 2 deletes", s.Has(k), s.Free(), s.Stats())
	}
	if err := s.DeleteIf(k, third); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DeleteIf twice: %v, want ErrNotFound", err)
	}
	if _, ok := s.Gen(k); ok {
		t.Fatal("Gen of a key deleted: held")
	}

	// Reopened: each block found again has a generation of its own.
	k2 := Key{Hash: 6, Tag: 7}
	for _, kk := range []Key{k, k2} {
		if err := s.Put(ctx, kk, data); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	r := open(t, dir, func(c *Config) { c.Bytes = 3 * int64(c.SlotBytes); c.FileBytes = c.Bytes })
	g1, g2 := gen(r, k), gen(r, k2)
	if g1 == 0 || g2 == 0 || g1 == g2 {
		t.Fatalf("blocks found again at open: generations %d and %d, want two, not 0", g1, g2)
	}
	if err := r.DeleteIf(k, g2); !errors.Is(err, ErrNotFound) {
		t.Fatalf("DeleteIf of another block's generation: %v, want ErrNotFound", err)
	}
	if err := r.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if g := gen(r, k); g == g1 || g == g2 {
		t.Fatalf("a put after the open has generation %d, as a block found again (%d, %d)", g, g1, g2)
	}
	if err := r.DeleteIf(k, g1); !errors.Is(err, ErrNotFound) || !r.Has(k) {
		t.Fatalf("DeleteIf of the copy found again, since replaced: %v, held %v; want ErrNotFound, held", err, r.Has(k))
	}
	if err := r.DeleteIf(k2, g2); err != nil || r.Has(k2) {
		t.Fatalf("DeleteIf of a block found again at its generation: %v, held %v", err, r.Has(k2))
	}
	r.Close()
	if r3 := open(t, dir, func(c *Config) { c.Bytes = 3 * int64(c.SlotBytes); c.FileBytes = c.Bytes }); r3.Has(k2) || !r3.Has(k) {
		t.Fatalf("after DeleteIf and a reopen: %v, %v held; want the block put again alone", r3.Has(k), r3.Has(k2))
	}
}

// A read that fails (the block larger than the buffer; its bytes not
// matching its checksum, the copy dropped) returns the generation of the
// copy it found, for its caller to act on that copy only.
func TestStoreGetGenOfAFailedRead(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	ctx := context.Background()
	k := Key{Hash: 9, Tag: 7}
	data := blockOf(9, s.SlotBytes())
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
	s.mu.Lock()
	e := s.entries[k]
	s.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(dir, "blocks.000"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	off := int64(e.slot) * int64(s.SlotBytes())
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, g, err := s.GetPiecesGen(ctx, k, make([]byte, s.SlotBytes())); !errors.Is(err, ErrCorrupt) || g != held {
		t.Fatalf("a corrupt read: generation %d, %v; want %d, ErrCorrupt", g, err, held)
	}
	if s.Has(k) {
		t.Fatal("the corrupt copy is still held")
	}
}

// A store has at most MaxSlots slots: at the limit its configuration is
// taken (checked without opening it: that would be 1 TiB of files), one
// slot past it is refused, naming the count.
func TestSlotsLimit(t *testing.T) {
	at := Config{Dir: t.TempDir(), SlotBytes: Align, FileBytes: MaxFileBytes, Bytes: MaxSlots * Align}
	if _, err := at.populate(); err != nil {
		t.Fatalf("at the limit: %v", err)
	}
	past := at
	past.Bytes += Align
	_, err := past.populate()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "slots, at most") {
		t.Fatalf("one slot past the limit: %v, want ErrInvalidConfig naming the slots", err)
	}
}
