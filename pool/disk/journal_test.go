package disk

import (
	"bytes"
	"context"
	"os"
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

// A put and a delete of the same key committed in one group, the put's
// record first: memory and a replay of the journal agree on the outcome
// (the put's block, as the delete named the block it replaced).
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
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[2] = s.Delete(k)
	}()
	waitFor(t, "the delete to wait for the journal", func() bool { return s.pendingWaiters() == 2 })
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
