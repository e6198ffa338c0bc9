package disk

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/zeebo/xxh3"
)

// keyHashes is s's Keys' hashes, in Keys' order.
func keyHashes(s *Store) []uint64 {
	var out []uint64
	for _, k := range s.Keys() {
		out = append(out, k.Hash)
	}
	return out
}

// putLinked puts blocks 1..3 (tag 7): 1 with no parent, 2 after 1, 3
// after 9.
func putLinked(t *testing.T, s *Store) {
	t.Helper()
	for i, err := range s.PutBatch(context.Background(), []PutItem{
		{Key: Key{Hash: 1, Tag: 7}, Data: blockOf(1, s.SlotBytes())},
		{Key: Key{Hash: 2, Tag: 7}, Data: blockOf(2, s.SlotBytes()), Parent: 1, HasParent: true},
		{Key: Key{Hash: 3, Tag: 7}, Data: blockOf(3, s.SlotBytes()), Parent: 9, HasParent: true},
	}) {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
}

// A parent set for a block held (SetParent) is journalled with the next
// commit, in a link record of its own, and no sooner: SetParent writes and
// syncs nothing. After a reopen the block has it, and Keys lists the
// blocks in the order of the records that last named them, the block
// linked after the blocks put before its link.
func TestSetParentJournalledWithTheNextCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	putLinked(t, s)
	before := s.Stats()
	if !s.SetParent(Key{Hash: 1, Tag: 7}, 5) || !s.SetParent(Key{Hash: 3, Tag: 7}, 8) || !s.SetParent(Key{Hash: 3, Tag: 7}, 2) {
		t.Fatal("SetParent of a block held refused")
	}
	if s.SetParent(Key{Hash: 4, Tag: 7}, 1) {
		t.Fatal("SetParent of a block not held kept it")
	}
	if st := s.Stats(); st.Commits != before.Commits || st.JournalRecords != before.JournalRecords || st.Links != 0 {
		t.Fatalf("SetParent wrote: %d commits, %d records, %d links; want %d, %d, 0", st.Commits, st.JournalRecords, st.Links, before.Commits, before.JournalRecords)
	}
	want := map[uint64]int64{1: 5, 2: 1, 3: 2}
	wantParents(t, "before the commit", s, want)
	if err := s.Put(ctx, Key{Hash: 4, Tag: 7}, blockOf(4, s.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	// One commit: the put's record and one link record of each block
	// (block 3's set twice, one record), counted as links.
	if st := s.Stats(); st.Commits != before.Commits+1 || st.JournalRecords != before.JournalRecords+3 || st.Links != 2 {
		t.Fatalf("after a put: %d commits, %d records, %d links; want %d, %d, 2", st.Commits, st.JournalRecords, st.Links, before.Commits+1, before.JournalRecords+3)
	}
	want[4] = -1
	s.mu.Lock()
	e3 := s.entries[Key{Hash: 3, Tag: 7}].entry
	s.mu.Unlock()
	s.Close()

	j, err := os.ReadFile(dir + "/journal")
	if err != nil || len(j) != 6*recordBytes {
		t.Fatalf("journal of %d bytes (%v), want 6 records", len(j), err)
	}
	// Block 3's link record restates its block, with the parent set last.
	link := j[4*recordBytes : 5*recordBytes]
	if r, ok := decodeRecord(link); !ok || r.op != opPut || !r.link || r.key.Hash != 3 || !sameBlock(r.e, e3) || r.e.parent != 2 || link[5] != flagParent|flagLink {
		t.Fatalf("block 3's link record: %+v (%v), flags %#x", r, ok, link[5])
	}
	r := open(t, dir, nil)
	wantParents(t, "after a reopen", r, want)
	if got := keyHashes(r); !slices.Equal(got, []uint64{2, 1, 3, 4}) {
		t.Fatalf("keys after a reopen: %v, want 2, 1, 3, 4 (as the journal last named them)", got)
	}
	if got := mustGet(t, r, 3); string(got) != string(blockOf(3, r.SlotBytes())) {
		t.Fatal("block 3 after its link record: not its bytes")
	}
}

// Close journals the parents set since the last commit; a block deleted
// after SetParent is journalled with no link record; the generation of a
// block is the same after SetParent (DeleteIf of it deletes it, and, for
// a copy found corrupt, commits at once).
func TestSetParentJournalledByClose(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	putLinked(t, s)
	k2 := Key{Hash: 2, Tag: 7}
	_, gen, err := s.GetGen(ctx, k2, make([]byte, s.SlotBytes()))
	if err != nil {
		t.Fatal(err)
	}
	s.SetParent(Key{Hash: 1, Tag: 7}, 3)
	s.SetParent(k2, 7)
	if err := s.DeleteIf(k2, gen); err != nil {
		t.Fatalf("DeleteIf of the copy read, its parent set since: %v", err)
	}
	records := s.Stats().JournalRecords
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// The delete's commit wrote block 1's link; Close wrote nothing more.
	if n := s.Stats().JournalRecords; n != records {
		t.Fatalf("%d journal records after Close, want %d", n, records)
	}
	if records != 3+2 {
		t.Fatalf("%d journal records, want 5: 3 puts, a link, a delete", records)
	}
	if n := s.Stats().Links; n != 1 {
		t.Fatalf("%d link records written, want 1 (none for the block deleted)", n)
	}
	r := open(t, dir, nil)
	wantParents(t, "after a reopen", r, map[uint64]int64{1: 3, 3: 9})
	if r.Has(k2) {
		t.Fatal("a block deleted after SetParent is back")
	}
	if !r.SetParent(Key{Hash: 3, Tag: 7}, 1) {
		t.Fatal("SetParent refused")
	}
	if n := r.Stats().Links; n != 0 {
		t.Fatalf("%d link records written by a reopen, want none (those replayed are not)", n)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if n := r.Stats().Links; n != 1 {
		t.Fatalf("%d link records written by Close, want 1", n)
	}
	if r.SetParent(Key{Hash: 3, Tag: 7}, 2) {
		t.Fatal("SetParent after Close kept it")
	}
	c := open(t, dir, nil)
	wantParents(t, "after Close's link", c, map[uint64]int64{1: 3, 3: 1})
	if got := keyHashes(c); !slices.Equal(got, []uint64{1, 3}) {
		t.Fatalf("keys: %v, want 1, 3", got)
	}
}

// linkRecord is a link record of block k held as e, with parent p where
// hasParent.
func linkRecord(seq uint64, k Key, e entry, p uint64, hasParent bool) [recordBytes]byte {
	e.parent, e.hasParent = p, hasParent
	return record{op: opPut, seq: seq, key: k, e: e, link: true}.encode()
}

// A link record is trusted only whole and only for the block it names: one
// torn or changed fails its checksum and ends the replay, as any record
// does; one that names another block than the one held (another slot,
// length or checksum, a key not held) or no parent is ignored, the
// records after it replayed.
func TestLinkRecordRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		// bad changes the link record of block 2 (entry e, parent 5);
		// stops: the replay ends there (the record after it lost).
		bad   func(b []byte, e entry, seq uint64) []byte
		stops bool
	}{
		{"parent changed", func(b []byte, _ entry, _ uint64) []byte { b[49] ^= 1; return b }, true},
		{"link flag cleared", func(b []byte, _ entry, _ uint64) []byte { b[5] &^= flagLink; return b }, true},
		{"torn", func(b []byte, _ entry, _ uint64) []byte { return b[:recordBytes/2] }, true},
		{"another slot", func(_ []byte, e entry, seq uint64) []byte {
			e.slot++
			r := linkRecord(seq, Key{Hash: 2, Tag: 7}, e, 5, true)
			return r[:]
		}, false},
		{"another checksum", func(_ []byte, e entry, seq uint64) []byte {
			e.sum++
			r := linkRecord(seq, Key{Hash: 2, Tag: 7}, e, 5, true)
			return r[:]
		}, false},
		{"no parent", func(_ []byte, e entry, seq uint64) []byte {
			r := linkRecord(seq, Key{Hash: 2, Tag: 7}, e, 5, false)
			return r[:]
		}, false},
		{"a key not held", func(_ []byte, e entry, seq uint64) []byte {
			r := linkRecord(seq, Key{Hash: 8, Tag: 7}, e, 5, true)
			return r[:]
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, nil)
			putLinked(t, s)
			k2 := Key{Hash: 2, Tag: 7}
			s.mu.Lock()
			e2 := s.entries[k2].entry
			s.mu.Unlock()
			s.SetParent(k2, 5)
			s.Close()
			path := dir + "/journal"
			j, err := os.ReadFile(path)
			if err != nil || len(j) != 4*recordBytes {
				t.Fatalf("journal of %d bytes (%v), want 4 records", len(j), err)
			}
			if r, ok := decodeRecord(j[3*recordBytes:]); !ok || !r.link {
				t.Fatal("the journal's last record is no link record")
			}
			// A put of block 4 after the link record (its bytes are not
			// read).
			k4 := Key{Hash: 4, Tag: 7}
			e4 := entry{slot: 40, length: 100, sum: 4}
			put := record{op: opPut, seq: 5, key: k4, e: e4}.encode()
			bad := tc.bad(slices.Clone(j[3*recordBytes:]), e2, 4)
			j = slices.Concat(j[:3*recordBytes], bad, put[:])
			if err := os.WriteFile(path, j, 0o600); err != nil {
				t.Fatal(err)
			}
			r := open(t, dir, nil)
			wantParents(t, "after the link record", r, map[uint64]int64{1: -1, 2: 1, 3: 9})
			if got := mustGet(t, r, 2); string(got) != string(blockOf(2, r.SlotBytes())) {
				t.Fatal("block 2: not its bytes")
			}
			if r.Has(k4) == tc.stops {
				t.Fatalf("the put after the link record replayed: %v, want %v", r.Has(k4), !tc.stops)
			}
			if r.Has(Key{Hash: 8, Tag: 7}) {
				t.Fatal("a link record of a key not held made a block")
			}
		})
	}
}

// A link record counts in the journal's records for its compaction: a
// commit whose link and put records bring the journal to compactAfter
// compacts it, keeping the parent set and the order the journal named the
// blocks in; one record short, it does not.
func TestCompactionKeepsLinks(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		short   int // records short of compactAfter once the commit is in
		compact bool
	}{
		{"at the limit", 0, true},
		{"one short", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := open(t, dir, nil)
			putLinked(t, s)
			k4 := Key{Hash: 4, Tag: 7}
			for range compactAfter - 3 - 2 - tc.short {
				if err := s.Put(ctx, k4, blockOf(4, s.SlotBytes())); err != nil {
					t.Fatal(err)
				}
			}
			s.SetParent(Key{Hash: 1, Tag: 7}, 3)
			if err := s.Put(ctx, Key{Hash: 5, Tag: 7}, blockOf(5, s.SlotBytes())); err != nil {
				t.Fatal(err)
			}
			want := compactAfter - tc.short
			if tc.compact {
				want = 5
			}
			if n := s.Stats().JournalRecords; n != want {
				t.Fatalf("%d journal records after the commit, want %d", n, want)
			}
			s.Close()
			r := open(t, dir, nil)
			wantParents(t, "after a reopen", r, map[uint64]int64{1: 3, 2: 1, 3: 9, 4: -1, 5: -1})
			if got := keyHashes(r); !slices.Equal(got, []uint64{2, 3, 4, 1, 5}) {
				t.Fatalf("keys after a reopen: %v, want 2, 3, 4, 1, 5", got)
			}
		})
	}
}

// A link record read by a version that ignores flagLink is the put of
// the block it restates again: the same slot, length and checksum, with
// the parent set; the record read so (here, the bit cleared and its
// checksum made anew) replays to the same store.
func TestLinkRecordReadAsAPut(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	putLinked(t, s)
	k1 := Key{Hash: 1, Tag: 7}
	s.mu.Lock()
	e1 := s.entries[k1].entry
	s.mu.Unlock()
	s.SetParent(k1, 6)
	s.Close()
	j, err := os.ReadFile(dir + "/journal")
	if err != nil || len(j) != 4*recordBytes {
		t.Fatalf("journal of %d bytes (%v)", len(j), err)
	}
	b := j[3*recordBytes:]
	if b[4] != opPut || binary.LittleEndian.Uint64(b[16:]) != 1 || binary.LittleEndian.Uint32(b[32:]) != e1.slot ||
		binary.LittleEndian.Uint32(b[36:]) != e1.length || binary.LittleEndian.Uint64(b[40:]) != e1.sum ||
		b[5]&flagParent == 0 || binary.LittleEndian.Uint64(b[48:]) != 6 {
		t.Fatalf("block 1's link record is not a put of its block with parent 6: % x", b)
	}
	r := open(t, dir, nil)
	wantParents(t, "after a reopen", r, map[uint64]int64{1: 6, 2: 1, 3: 9})
	r.Close()
	b[5] = flagParent
	binary.LittleEndian.PutUint64(b[56:], xxh3.Hash(b[:56]))
	if err := os.WriteFile(dir+"/journal", j, 0o600); err != nil {
		t.Fatal(err)
	}
	p := open(t, dir, nil)
	wantParents(t, "the link record read as a put", p, map[uint64]int64{1: 6, 2: 1, 3: 9})
	if got := mustGet(t, p, 1); string(got) != string(blockOf(1, p.SlotBytes())) {
		t.Fatal("block 1, its link record read as a put: not its bytes")
	}
}

// A MemStore's SetParent keeps a block's parent in memory, as a Store's
// does: Parent returns it, the copy's generation is the same (DeleteIf of
// it deletes it), and a block not held keeps none.
func TestMemStoreSetParent(t *testing.T) {
	ctx := context.Background()
	s, err := NewMem(MemConfig{Bytes: 8 * Align, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := Key{Hash: 1, Tag: 7}
	if err := s.Put(ctx, k, memBlock(1, 100)); err != nil {
		t.Fatal(err)
	}
	_, gen, err := s.GetGen(ctx, k, make([]byte, Align))
	if err != nil {
		t.Fatal(err)
	}
	if !s.SetParent(k, 4) || s.SetParent(Key{Hash: 2, Tag: 7}, 4) {
		t.Fatal("SetParent: refused a block held, or kept one not held")
	}
	wantParents(t, "host memory", s, map[uint64]int64{1: 4, 2: -1})
	if err := s.DeleteIf(k, gen); err != nil {
		t.Fatalf("DeleteIf of the copy read, its parent set since: %v", err)
	}
	if s.Has(k) {
		t.Fatal("DeleteIf left the block")
	}
}

// A block whose parent is set while a read of it is under way is still
// the copy that read: where the read finds its bytes corrupt, the copy is
// dropped (a copy is matched by its generation, not by its parent).
func TestSetParentDuringACorruptRead(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	k := Key{Hash: 2, Tag: 7}
	var s *Store
	var reading atomic.Bool
	s = open(t, dir, func(c *Config) {
		c.FailIO = func(write, _ bool) error {
			if !write && reading.Load() {
				s.SetParent(k, 9)
			}
			return nil
		}
	})
	putLinked(t, s)
	s.mu.Lock()
	e := s.entries[k]
	s.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(dir, "blocks.000"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(e.slot)*int64(s.SlotBytes()) + int64(e.length)/2
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	f.Close()
	reading.Store(true)
	if _, err := s.Get(ctx, k, make([]byte, s.SlotBytes())); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a corrupt read: %v, want ErrCorrupt", err)
	}
	reading.Store(false)
	if s.Has(k) {
		t.Fatal("the corrupt copy, its parent set during the read, is still held")
	}
}

// A link record makes its block the last named, for Keys' order, only
// once written: after a commit whose journal write failed, Keys lists the
// blocks as the journal has them, as a reopen lists them.
func TestLinkOrderOnceWritten(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	putLinked(t, s)
	if !s.SetParent(Key{Hash: 1, Tag: 7}, 5) {
		t.Fatal("SetParent of a block held refused")
	}
	// A handle the journal cannot be written through.
	ro, err := os.Open(s.journalPath())
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	s.jmu.Lock()
	good := s.journal
	s.journal = ro
	s.jmu.Unlock()
	if err := s.Put(ctx, Key{Hash: 4, Tag: 7}, blockOf(4, s.SlotBytes())); err == nil {
		t.Fatal("a put whose journal write failed returned nil")
	}
	s.jmu.Lock()
	s.journal = good
	s.jmu.Unlock()
	if got := keyHashes(s); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("keys after a failed link record: %v, want 1, 2, 3 (as the journal has them)", got)
	}
	s.Close()
	r := open(t, dir, nil)
	if got := keyHashes(r); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("keys after a reopen: %v, want 1, 2, 3", got)
	}
}
