package disk

import (
	"context"
	"encoding/binary"
	"os"
	"testing"

	"github.com/zeebo/xxh3"
)

// wantParents checks s's parent of each key of want (tag 7): the hash, or
// none where want holds -1.
func wantParents(t *testing.T, what string, s interface {
	Parent(Key) (uint64, bool)
}, want map[uint64]int64) {
	t.Helper()
	for h, w := range want {
		p, ok := s.Parent(Key{Hash: h, Tag: 7})
		switch {
		case w < 0 && ok:
			t.Errorf("%s: block %d has parent %d, want none", what, h, p)
		case w >= 0 && (!ok || p != uint64(w)):
			t.Errorf("%s: block %d has parent %d (%v), want %d", what, h, p, ok, w)
		}
	}
}

// putParents puts blocks 1..6 (tag 7) through a Batch and a PutBatch:
// 1 with none, 2 after 1, 3 after 2 (its bytes replaced before Commit), 4
// after hash 0 (a hash like any other), 5 after 4 and 6 with none through
// PutBatch. It returns the parents the store must keep.
func putParents(t *testing.T, s *Store) map[uint64]int64 {
	t.Helper()
	ctx := context.Background()
	b := s.NewBatch()
	for h := uint64(1); h <= 4; h++ {
		b.Add(ctx, Key{Hash: h, Tag: 7}, blockOf(h+100, s.SlotBytes()))
	}
	b.SetParent(1, 1)
	b.SetParent(2, 2)
	b.SetParent(3, 0)
	b.Replace(ctx, 2, blockOf(3, s.SlotBytes()))
	for i, err := range b.Commit() {
		if err != nil {
			t.Fatalf("batch item %d: %v", i, err)
		}
	}
	for i, err := range s.PutBatch(ctx, []PutItem{
		{Key: Key{Hash: 5, Tag: 7}, Data: blockOf(5, s.SlotBytes()), Parent: 4, HasParent: true},
		{Key: Key{Hash: 6, Tag: 7}, Data: blockOf(6, s.SlotBytes())},
	}) {
		if err != nil {
			t.Fatalf("PutBatch item %d: %v", i, err)
		}
	}
	return map[uint64]int64{1: -1, 2: 1, 3: 2, 4: 0, 5: 4, 6: -1}
}

// A block's parent is kept in its journal record: Parent gives it back
// after a reopen, and after the journal was compacted; a block put with
// none has none, and a block deleted is gone with its parent.
func TestParentKeptInTheJournal(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir, nil)
	want := putParents(t, s)
	wantParents(t, "before a reopen", s, want)
	if err := s.Delete(Key{Hash: 5, Tag: 7}); err != nil {
		t.Fatal(err)
	}
	delete(want, 5)
	s.Close()
	// The delete's record, the journal's last, names block 5 without the
	// parent its put gave.
	j, err := os.ReadFile(dir + "/journal")
	if err != nil || len(j) < recordBytes {
		t.Fatalf("journal of %d bytes (%v)", len(j), err)
	}
	del := j[len(j)-recordBytes:]
	if del[4] != opDelete || binary.LittleEndian.Uint64(del[16:]) != 5 {
		t.Fatalf("the journal's last record: op %d of block %d, want the delete of 5", del[4], binary.LittleEndian.Uint64(del[16:]))
	}
	if del[5] != 0 || binary.LittleEndian.Uint64(del[48:]) != 0 {
		t.Fatalf("the delete of a block put with a parent has flags %#x, parent %d; want both zero", del[5], binary.LittleEndian.Uint64(del[48:]))
	}

	r := open(t, dir, nil)
	wantParents(t, "after a reopen", r, want)
	if r.Has(Key{Hash: 5, Tag: 7}) {
		t.Fatal("a block deleted with its parent is back after a reopen")
	}
	if p, ok := r.Parent(Key{Hash: 5, Tag: 7}); ok {
		t.Fatalf("a block not held has parent %d", p)
	}
	if got := mustGet(t, r, 3); string(got) != string(blockOf(3, r.SlotBytes())) {
		t.Fatal("block 3 after a reopen: not the bytes it was replaced with")
	}
	r.jmu.Lock()
	err = r.compactLocked()
	r.jmu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if n := r.Stats().JournalRecords; n != len(want) {
		t.Fatalf("%d journal records after compaction, want %d", n, len(want))
	}
	wantParents(t, "after compaction", r, want)
	r.Close()
	c := open(t, dir, nil)
	wantParents(t, "after compaction and a reopen", c, want)
	if n := len(c.Keys()); n != len(want) {
		t.Fatalf("%d blocks after compaction and a reopen, want %d", n, len(want))
	}
}

// oldRecord is a record as a journal written before parents were kept
// has it: bytes 5..7 and 48..55 zero.
func oldRecord(op byte, seq uint64, k Key, e entry) [recordBytes]byte {
	var b [recordBytes]byte
	copy(b[0:4], journalMagic)
	b[4] = op
	binary.LittleEndian.PutUint64(b[8:], seq)
	binary.LittleEndian.PutUint64(b[16:], k.Hash)
	binary.LittleEndian.PutUint64(b[24:], k.Tag)
	binary.LittleEndian.PutUint32(b[32:], e.slot)
	binary.LittleEndian.PutUint32(b[36:], e.length)
	binary.LittleEndian.PutUint64(b[40:], e.sum)
	binary.LittleEndian.PutUint64(b[56:], xxh3.Hash(b[:56]))
	return b
}

// A journal written before parents were kept replays as it did: its blocks
// found again, with no parent; a put with no parent writes the record
// such a journal has, byte for byte; and a delete journalled with no
// parent (by such a version) removes a block put with one.
func TestJournalWithoutParents(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	for h := uint64(1); h <= 3; h++ {
		if err := s.Put(ctx, Key{Hash: h, Tag: 7}, blockOf(h, s.SlotBytes())); err != nil {
			t.Fatal(err)
		}
	}
	entries := map[Key]entry{}
	s.mu.Lock()
	for k, e := range s.entries {
		entries[k] = e.entry
	}
	s.mu.Unlock()
	s.Close()
	// The journal as the old version wrote it.
	var old []byte
	for h := uint64(1); h <= 3; h++ {
		k := Key{Hash: h, Tag: 7}
		b := oldRecord(opPut, h, k, entries[k])
		old = append(old, b[:]...)
	}
	got, err := os.ReadFile(dir + "/journal")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(old) {
		t.Fatal("puts with no parent wrote records other than a journal without parents has")
	}
	if err := os.WriteFile(dir+"/journal", old, 0o600); err != nil {
		t.Fatal(err)
	}
	r := open(t, dir, nil)
	if n := len(r.Keys()); n != 3 {
		t.Fatalf("%d blocks from a journal without parents, want 3", n)
	}
	for h := uint64(1); h <= 3; h++ {
		if got := mustGet(t, r, h); string(got) != string(blockOf(h, r.SlotBytes())) {
			t.Fatalf("block %d from a journal without parents: wrong bytes", h)
		}
	}
	wantParents(t, "a journal without parents", r, map[uint64]int64{1: -1, 2: -1, 3: -1})

	// Block 4, put with a parent, deleted by a record that names none.
	b := r.NewBatch()
	b.Add(ctx, Key{Hash: 4, Tag: 7}, blockOf(4, r.SlotBytes()))
	b.SetParent(0, 3)
	if err := b.Commit()[0]; err != nil {
		t.Fatal(err)
	}
	k4 := Key{Hash: 4, Tag: 7}
	r.mu.Lock()
	e4 := r.entries[k4].entry
	r.mu.Unlock()
	seq := r.seq
	r.Close()
	del := oldRecord(opDelete, seq+1, k4, e4)
	j, err := os.OpenFile(dir+"/journal", os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Write(del[:]); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	r2 := open(t, dir, nil)
	if r2.Has(k4) {
		t.Fatal("a delete journalled with no parent left a block put with one")
	}
	if n := len(r2.Keys()); n != 3 {
		t.Fatalf("%d blocks, want 3", n)
	}
}

// A record whose parent or flag changed fails its checksum: the replay
// stops before it, as at any corrupt record.
func TestJournalParentCorruptRejected(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int
		bit  byte
	}{
		{"parent", 50, 0x10},
		{"flag", 5, flagParent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			s := open(t, dir, nil)
			for h := uint64(1); h <= 3; h++ {
				b := s.NewBatch()
				b.Add(ctx, Key{Hash: h, Tag: 7}, blockOf(h, s.SlotBytes()))
				b.SetParent(0, h+10)
				if err := b.Commit()[0]; err != nil {
					t.Fatal(err)
				}
			}
			s.Close()
			path := dir + "/journal"
			j, err := os.ReadFile(path)
			if err != nil || len(j) != 3*recordBytes {
				t.Fatalf("journal of %d bytes (%v), want 3 records", len(j), err)
			}
			j[2*recordBytes+tc.at] ^= tc.bit
			if err := os.WriteFile(path, j, 0o600); err != nil {
				t.Fatal(err)
			}
			r := open(t, dir, nil)
			if r.Has(Key{Hash: 3, Tag: 7}) {
				t.Fatalf("a record whose %s changed was replayed", tc.name)
			}
			wantParents(t, "the records before it", r, map[uint64]int64{1: 11, 2: 12})
		})
	}
}

// A MemStore keeps a block's parent as a Store does (in memory): given
// through a MemBatch or a PutBatch, kept when the item's bytes are
// replaced, none where none was given, gone with the block.
func TestMemStoreParent(t *testing.T) {
	ctx := context.Background()
	s, err := NewMem(MemConfig{Bytes: 8 * Align, SlotBytes: Align})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	b := s.NewBatch()
	for h := uint64(1); h <= 3; h++ {
		b.Add(ctx, Key{Hash: h, Tag: 7}, memBlock(byte(h), 100))
	}
	b.SetParent(1, 1)
	b.SetParent(2, 0)
	b.Replace(ctx, 2, memBlock(9, 100))
	for i, err := range b.Commit() {
		if err != nil {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	for i, err := range s.PutBatch(ctx, []PutItem{{Key: Key{Hash: 4, Tag: 7}, Data: memBlock(4, 100), Parent: 3, HasParent: true}}) {
		if err != nil {
			t.Fatalf("PutBatch item %d: %v", i, err)
		}
	}
	wantParents(t, "host memory", s, map[uint64]int64{1: -1, 2: 1, 3: 0, 4: 3})
	if err := s.Delete(Key{Hash: 4, Tag: 7}); err != nil {
		t.Fatal(err)
	}
	if p, ok := s.Parent(Key{Hash: 4, Tag: 7}); ok {
		t.Fatalf("a block deleted has parent %d", p)
	}
}
