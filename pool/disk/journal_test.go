package disk

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond until it holds, failing the test past a wide deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func (s *Store) pendingWaiters() int {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	return len(s.pending)
}

// A commit group that makes the journal compact keeps its own records: the
// compaction's snapshot includes them.
func TestCompactionKeepsItsCommitGroup(t *testing.T) {
	ctx := context.Background()
	t.Run("batch", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, nil)
		for range compactAfter - 4 {
			if err := s.Put(ctx, Key{Hash: 1, Tag: 7}, blockOf(1, s.SlotBytes())); err != nil {
				t.Fatal(err)
			}
		}
		var items []PutItem
		for h := uint64(2); h < 10; h++ {
			items = append(items, PutItem{Key: Key{Hash: h, Tag: 7}, Data: blockOf(h, s.SlotBytes())})
		}
		for i, err := range s.PutBatch(ctx, items) {
			if err != nil {
				t.Fatalf("item %d: %v", i, err)
			}
		}
		if n := s.Stats().JournalRecords; n != 9 {
			t.Fatalf("%d journal records after the batch, want 9 (a compacted journal of the live blocks)", n)
		}
		s.Close()
		r := open(t, dir, nil)
		if n := len(r.Keys()); n != 9 {
			t.Fatalf("%d blocks after reopen, want 9", n)
		}
		for h := uint64(1); h < 10; h++ {
			if got := mustGet(t, r, h); !bytes.Equal(got, blockOf(h, r.SlotBytes())) {
				t.Fatalf("block %d after reopen: wrong bytes", h)
			}
		}
	})
	t.Run("replacing put", func(t *testing.T) {
		dir := t.TempDir()
		s := open(t, dir, nil)
		k := Key{Hash: 1, Tag: 7}
		old, last := blockOf(100, s.SlotBytes()), blockOf(1, s.SlotBytes())
		for range compactAfter - 1 {
			if err := s.Put(ctx, k, old); err != nil {
				t.Fatal(err)
			}
		}
		if n := s.Stats().JournalRecords; n != compactAfter-1 {
			t.Fatalf("%d journal records, want %d", n, compactAfter-1)
		}
		if err := s.Put(ctx, k, last); err != nil {
			t.Fatal(err)
		}
		if n := s.Stats().JournalRecords; n != 1 {
			t.Fatalf("%d journal records after the put, want 1 (compacted)", n)
		}
		s.Close()
		r := open(t, dir, nil)
		if got := mustGet(t, r, 1); !bytes.Equal(got, last) {
			t.Fatalf("after reopen: %d bytes, want the last put's %d", len(got), len(last))
		}
		if st := r.Stats(); st.Blocks != 1 {
			t.Fatalf("%d blocks after reopen, want 1", st.Blocks)
		}
	})
}

// A delete of a key whose new put waits for its commit: the delete takes
// the block held (the put's is not in the store yet) and its record goes
// with the put's commit, before the put's: memory and a replay of the
// journal agree on the outcome (the put's block, as the delete named the
// block it removed).
func TestOneCommitGroupPutThenDelete(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	k := Key{Hash: 1, Tag: 7}
	if err := s.Put(ctx, k, blockOf(100, s.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	var first atomic.Bool
	entered, hold := make(chan struct{}), make(chan struct{})
	s.beforeJournal = func() {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-hold
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Add(1)
	go func() { // holds the journal while the next group gathers
		defer wg.Done()
		errs[0] = s.Put(ctx, Key{Hash: 2, Tag: 7}, blockOf(2, s.SlotBytes()))
	}()
	<-entered
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[1] = s.Put(ctx, k, blockOf(1, s.SlotBytes()))
	}()
	waitFor(t, "the put to wait for the journal", func() bool { return s.pendingWaiters() == 1 })
	errs[2] = s.Delete(k) // waits for no commit: its record goes with the put's
	close(hold)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if got := mustGet(t, s, 1); !bytes.Equal(got, blockOf(1, s.SlotBytes())) {
		t.Fatalf("in memory: not the put's block")
	}
	s.Close()
	r := open(t, dir, nil)
	if !r.Has(k) {
		t.Fatalf("after reopen the put's block is gone, while the store held it before")
	}
	if got := mustGet(t, r, 1); !bytes.Equal(got, blockOf(1, r.SlotBytes())) {
		t.Fatalf("after reopen: not the put's block")
	}
}

// A journal write that fails and cannot be undone stops the store from
// committing: later puts fail rather than append records after a torn one,
// and a reopen finds the blocks committed before.
func TestJournalWriteFailureStopsCommits(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	if err := s.Put(ctx, Key{Hash: 1, Tag: 7}, blockOf(1, s.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	// A handle the journal cannot be written or cut back through.
	ro, err := os.Open(s.journalPath())
	if err != nil {
		t.Fatal(err)
	}
	s.jmu.Lock()
	good := s.journal
	s.journal = ro
	s.jmu.Unlock()
	if err := s.Put(ctx, Key{Hash: 2, Tag: 7}, blockOf(2, s.SlotBytes())); err == nil {
		t.Fatal("a put whose journal write failed returned nil")
	}
	s.jmu.Lock()
	s.journal = good
	s.jmu.Unlock()
	ro.Close()
	if err := s.Put(ctx, Key{Hash: 3, Tag: 7}, blockOf(3, s.SlotBytes())); err == nil {
		t.Fatal("a put after a journal write that could not be undone returned nil")
	}
	if s.Has(Key{Hash: 2, Tag: 7}) || s.Has(Key{Hash: 3, Tag: 7}) {
		t.Fatal("a failed put's block is held")
	}
	s.Close()
	r := open(t, dir, nil)
	if k := r.Keys(); len(k) != 1 || k[0] != (Key{Hash: 1, Tag: 7}) {
		t.Fatalf("after reopen: %v, want only block 1", k)
	}
	if got := mustGet(t, r, 1); !bytes.Equal(got, blockOf(1, r.SlotBytes())) {
		t.Fatal("block 1 after reopen: wrong bytes")
	}
}

// crashCopy copies the store's files in dir as they are now to a new
// directory, as a crash would leave them, and returns it.
func crashCopy(t *testing.T, dir string) string {
	t.Helper()
	to := t.TempDir()
	if err := copyFiles(dir, to); err != nil {
		t.Fatal(err)
	}
	return to
}

// copyFiles copies the regular files of dir into to.
func copyFiles(dir, to string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, e.Name()), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// A put of a key, its delete, and a put of it again with the same bytes
// before the next commit (the store hands the slot just freed to the next
// put: the same slot, length and checksum): the delete's record goes
// before the new put's, so a replay, as memory, holds the block.
func TestDeleteThenPutAgainKeepsTheBlock(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	k := Key{Hash: 5, Tag: 7}
	data := blockOf(5, s.SlotBytes())
	if err := s.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(k); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, s, 5); !bytes.Equal(got, data) {
		t.Fatal("in memory: not the block put again")
	}
	for name, d := range map[string]string{"a crash": crashCopy(t, dir), "Close": ""} {
		if d == "" {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			d = dir
		}
		r := open(t, d, nil)
		if !r.Has(k) {
			t.Fatalf("after %s and a reopen, the block put again after its delete is gone", name)
		}
		if got := mustGet(t, r, 5); !bytes.Equal(got, data) {
			t.Fatalf("after %s and a reopen: not the block put again", name)
		}
	}
}

// A delete waits for no commit: its record goes with the next one, before
// that commit's own records. A crash before then finds the block whole,
// as it was (a valid copy of its key), or, where a put wrote the freed
// slot and did not commit, refused by its checksum: never another block's
// bytes. A crash after the next put's commit finds it gone, the put's
// block in its slot, the delete having shared the put's commit.
func TestDeleteLeftForTheNextCommit(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	for h := uint64(1); h <= 2; h++ {
		if err := s.Put(ctx, Key{Hash: h, Tag: 7}, blockOf(h, s.SlotBytes())); err != nil {
			t.Fatal(err)
		}
	}
	commits := s.Stats().Commits
	gone := Key{Hash: 1, Tag: 7}
	if err := s.Delete(gone); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats().Commits; got != commits {
		t.Fatalf("a delete made %d commits; want none", got-commits)
	}
	if s.Has(gone) {
		t.Fatal("the block deleted is still held")
	}
	// A crash now: the delete never reached the journal.
	r := open(t, crashCopy(t, dir), nil)
	if got := mustGet(t, r, 1); !bytes.Equal(got, blockOf(1, r.SlotBytes())) {
		t.Fatal("after a crash before the delete's record: the block deleted is back, but not its bytes")
	}
	// A put into the freed slot, cut by a crash after its data sync and
	// before its journal write: the old record names the slot, whose bytes
	// are now the put's.
	var crashed string
	s.beforeJournal = func() {
		s.beforeJournal = nil
		crashed = t.TempDir()
		if err := copyFiles(dir, crashed); err != nil {
			crashed = "copy: " + err.Error() // failed after the Put, not under the journal's lock
		}
	}
	next := Key{Hash: 3, Tag: 7}
	if err := s.Put(ctx, next, blockOf(3, s.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(crashed, "copy: ") {
		t.Fatal(crashed)
	}
	r = open(t, crashed, nil)
	if !r.Has(gone) {
		t.Fatal("after a crash mid-put: the deleted block's record, never journalled, is not found")
	}
	if _, err := r.Get(ctx, gone, make([]byte, r.SlotBytes())); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("after a crash mid-put into the deleted block's slot: %v, want its checksum's refusal (the slot holds the put's bytes)", err)
	}
	// The put committed: the delete went with it, before it.
	if got := s.Stats().Commits; got != commits+1 {
		t.Fatalf("the put and the delete left to it made %d commits; want 1", got-commits)
	}
	r = open(t, crashCopy(t, dir), nil)
	if r.Has(gone) {
		t.Fatal("after the next commit and a crash, the block deleted is back")
	}
	if got := mustGet(t, r, 3); !bytes.Equal(got, blockOf(3, r.SlotBytes())) {
		t.Fatal("after the next commit and a crash: not the put's block")
	}
	if got := mustGet(t, r, 2); !bytes.Equal(got, blockOf(2, r.SlotBytes())) {
		t.Fatal("after the next commit and a crash: the block left alone changed")
	}
	// A delete with no commit after it: Close writes its record.
	if err := s.Delete(Key{Hash: 2, Tag: 7}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	r = open(t, dir, nil)
	if r.Has(Key{Hash: 2, Tag: 7}) {
		t.Fatal("a block deleted before Close is back after a reopen")
	}
	if got := mustGet(t, r, 3); !bytes.Equal(got, blockOf(3, r.SlotBytes())) {
		t.Fatal("after Close and a reopen: not the put's block")
	}
}

// Close waits for a commit under way (a caller's put, which it does not
// otherwise wait for) before it closes the files that commit syncs by
// descriptor: the put commits, durable, and a put after Close is refused
// as closed.
func TestCloseWaitsForACommitUnderWay(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	paused, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	s.beforeDataSync = func() { once.Do(func() { close(paused); <-release }) }
	var closedFiles atomic.Bool
	s.closingFiles = func() { closedFiles.Store(true) }
	put := make(chan error, 1)
	go func() { put <- s.Put(ctx, Key{Hash: 5, Tag: 7}, blockOf(5, s.SlotBytes())) }()
	<-paused
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	// Close has marked the store closed and stopped its workers (which
	// the put's commit no longer needs) well within this; it must not
	// close the files while the commit holds them.
	time.Sleep(100 * time.Millisecond)
	if closedFiles.Load() {
		t.Fatal("Close closed the data files while a commit was syncing them")
	}
	close(release)
	if err := <-put; err != nil {
		t.Fatalf("the put under way as Close began: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, Key{Hash: 6, Tag: 7}, blockOf(6, s.SlotBytes())); !errors.Is(err, ErrClosed) {
		t.Fatalf("a put after Close: %v, want ErrClosed", err)
	}
	r := open(t, dir, nil)
	if got := mustGet(t, r, 5); !bytes.Equal(got, blockOf(5, r.SlotBytes())) {
		t.Fatal("the block committed beside Close: wrong bytes after reopen")
	}
}

// A compaction whose directory sync fails has its journal in place all
// the same (later records go to it), and the next journal write syncs the
// directory first: while that fails, commits fail rather than report
// durable what a crash could lose with the rename; once it succeeds they
// go on, and a reopen finds every block.
func TestCompactionDirectorySyncRetried(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := open(t, dir, nil)
	var fail atomic.Bool
	var syncs atomic.Int32
	s.syncDir = func() error {
		syncs.Add(1)
		if fail.Load() {
			return errors.New("injected directory sync failure")
		}
		return nil
	}
	fail.Store(true)
	for range compactAfter {
		if err := s.Put(ctx, Key{Hash: 1, Tag: 7}, blockOf(1, s.SlotBytes())); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Stats().JournalRecords; n != 1 || syncs.Load() != 1 {
		t.Fatalf("%d journal records, %d directory syncs; want 1 (compacted), 1", n, syncs.Load())
	}
	if err := s.Put(ctx, Key{Hash: 2, Tag: 7}, blockOf(2, s.SlotBytes())); err == nil || !strings.Contains(err.Error(), "since its compaction") {
		t.Fatalf("a put while the directory does not sync: %v, want the directory's error", err)
	}
	fail.Store(false)
	if err := s.Put(ctx, Key{Hash: 3, Tag: 7}, blockOf(3, s.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, Key{Hash: 4, Tag: 7}, blockOf(4, s.SlotBytes())); err != nil {
		t.Fatal(err)
	}
	if n := syncs.Load(); n != 3 {
		t.Fatalf("%d directory syncs; want 3 (the compaction's, the failed retry, the retry that worked, none after)", n)
	}
	s.Close()
	r := open(t, dir, nil)
	for _, h := range []uint64{1, 3, 4} {
		if got := mustGet(t, r, h); !bytes.Equal(got, blockOf(h, r.SlotBytes())) {
			t.Fatalf("block %d after reopen: wrong bytes", h)
		}
	}
	if _, ok := r.entries[Key{Hash: 2, Tag: 7}]; ok {
		t.Fatal("the put refused for the directory's sync is held after reopen")
	}
}
