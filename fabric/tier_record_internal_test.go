package fabric

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// A restore whose read of a block's copy fails (missing from the store, or
// read whole but corrupt) acts on the record its read was made from, and
// that record only: where another restore of the block found it so too,
// dropped and forgot that record, and a copier committed the block again
// and recorded its copy, all between the read and its failure being acted
// on, the new record and its good copy stay. Acting by key marked that
// record gone (or dropped its copy) and forgot it: the copy left in the
// store with no record, or deleted, the block lost from the tiers.
func TestTierRestoreFailureLeavesARecordPlacedSince(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		corrupt bool // the copy read is of the wrong length, else missing
	}{
		{"missing", false},
		{"corrupt", true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, d, other, k := restoreSet(t, false)
			whole := bytes.Repeat([]byte{0x5a}, tierBlockBytes(other.Layout())-tierTrailer)
			whole = append(whole, make([]byte, tierTrailer)...) // no content checksum
			if !tc.corrupt {
				// The copy went from the store; its record stays.
				if err := d.store.Load().Delete(k); err != nil {
					t.Fatal(err)
				}
			} // else belowSet's copy: 1000 bytes, not a block of the shape
			ran := false
			f := func(dd *diskTier, kk disk.Key, rerr error) {
				if dd != d || kk != k || ran {
					return
				}
				ran = true
				if rerr == nil && !tc.corrupt {
					t.Errorf("a missing copy read without error")
				}
				// Another restore of the block found the same and acted
				// on it: the copy dropped, the record forgotten.
				if tc.corrupt {
					if err := tr.dropCopy(d, k, true); err != nil {
						t.Error(err)
					}
				} else {
					lostKey(t, tr, d, k)
				}
				forgetKey(tr, d, k)
				// A copier commits the block again and records it.
				if err := d.store.Load().Put(context.Background(), k, whole); err != nil {
					t.Error(err)
				}
				if !placeCopy(tr, d, k, disk.Align) {
					t.Error("the copy committed again was not recorded")
				}
			}
			tr.afterRead.Store(&f)
			find := func(context.Context, disk.Key) *diskTier { return d }
			alloc := func(_ context.Context, s *pool.BlockSet, n int) ([]pool.Block, error) { return s.Allocate(n) }
			blks, _, err := tr.restoreRun(context.Background(), &engineSet{set: other}, []uint64{k.Hash}, 0, find, alloc, tr.forgetFound, false)
			if !ran {
				t.Fatal("the block was not read")
			}
			if len(blks) != 0 || err == nil {
				t.Fatalf("restore of a copy %s: %d blocks, %v; want none and an error", tc.desc, len(blks), err)
			}
			consistent(t, tr, d, k)
			if got := tr.where(k); got != d {
				t.Fatalf("the block committed again is held by tier %d, want %d", tierNum(got), d.n)
			}
			if !has(d, k) {
				t.Fatal("the copy committed again was deleted")
			}
		})
	}
}

// A restore whose read found a block's copy missing (or corrupt: the store
// dropped it), where a copier committed the block again to that tier and
// placed it before the failure was acted on, leaves the record and the
// good copy: placed took the copy as the record's (the same record, the
// store having replaced its copy), so the record the read was made from is
// the new copy's. Marking it gone and forgetting it, as the restore did
// whatever the store held by then, left the good copy in the store with no
// record (a slot lost until a restart, the block not found).
func TestTierRestoreFailureLeavesACopyCommittedOverItsRecord(t *testing.T) {
	tr, d, other, k := restoreSet(t, false)
	whole := bytes.Repeat([]byte{0x5b}, tierBlockBytes(other.Layout())-tierTrailer)
	whole = append(whole, make([]byte, tierTrailer)...) // no content checksum
	// The first copier's copy went from the store; its record stays.
	if err := d.store.Load().Delete(k); err != nil {
		t.Fatal(err)
	}
	ran := false
	f := func(dd *diskTier, kk disk.Key, rerr error) {
		if dd != d || kk != k || ran {
			return
		}
		ran = true
		if !errors.Is(rerr, disk.ErrNotFound) {
			t.Errorf("the read of a missing copy: %v, want not found", rerr)
		}
		// A second copier commits the block and places it: the record the
		// read was made from is taken as its copy's.
		e := tr.recordIn(d, k)
		if err := d.store.Load().Put(context.Background(), k, whole); err != nil {
			t.Error(err)
		}
		if placeCopy(tr, d, k, disk.Align) {
			t.Error("the copy committed again was announced: its block had a record")
		}
		if got := tr.recordIn(d, k); got != e || e == nil {
			t.Error("the copy committed again was not placed in the record the read was made from")
		}
	}
	tr.afterRead.Store(&f)
	find := func(context.Context, disk.Key) *diskTier { return d }
	alloc := func(_ context.Context, s *pool.BlockSet, n int) ([]pool.Block, error) { return s.Allocate(n) }
	blks, _, err := tr.restoreRun(context.Background(), &engineSet{set: other}, []uint64{k.Hash}, 0, find, alloc, tr.forgetFound, false)
	if !ran {
		t.Fatal("the block was not read")
	}
	if len(blks) != 0 || err == nil {
		t.Fatalf("restore of a missing copy: %d blocks, %v; want none and an error", len(blks), err)
	}
	consistent(t, tr, d, k)
	if got := tr.where(k); got != d {
		t.Fatalf("the block committed again is held by tier %d, want %d", tierNum(got), d.n)
	}
}

// restoreFrom restores k from tier d into set, through the restore's
// failures' own handling (forgetFound), and returns the blocks restored.
func restoreFrom(tr *tiers, d *diskTier, set *pool.BlockSet, k disk.Key) ([]pool.Block, error) {
	find := func(context.Context, disk.Key) *diskTier { return d }
	alloc := func(_ context.Context, s *pool.BlockSet, n int) ([]pool.Block, error) { return s.Allocate(n) }
	blks, _, err := tr.restoreRun(context.Background(), &engineSet{set: set}, []uint64{k.Hash}, 0, find, alloc, tr.forgetFound, false)
	return blks, err
}

// restoresExactly restores k from d into set and fails the test unless
// it comes up with want's block bytes (want without its trailer).
func restoresExactly(t *testing.T, tr *tiers, d *diskTier, set *pool.BlockSet, k disk.Key, want []byte) {
	t.Helper()
	blks, err := restoreFrom(tr, d, set, k)
	if err != nil || len(blks) != 1 {
		t.Fatalf("restore of the good copy: %d blocks, %v", len(blks), err)
	}
	regions, err := set.RegionBytes()
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	gatherBlock(set.Layout(), regions, blks[0].Slot, got)
	if !bytes.Equal(got, want) {
		t.Fatal("the block restored is not the good copy's bytes")
	}
}

// badCopies are copies of a block that the store reads back whole but the
// tiers' own checks find corrupt: of the wrong length for the block's
// shape (belowSet's copy, 1000 bytes), or of the right one with a content
// checksum its bytes do not have.
var badCopies = []struct {
	desc string
	sum  bool   // a content checksum that does not match, else the wrong length
	why  string // in the restore's error
}{
	{"length", false, "its shape has"},
	{"content checksum", true, "restored with content checksum"},
}

// putBadCopy commits a bad copy (badCopies) of k to d, recorded, and
// returns the good copy's bytes for k's shape (n bytes and a trailer with
// no content checksum); nil where the commit failed, reported with
// t.Error (it may run in a hook, on a reader goroutine).
func putBadCopy(t *testing.T, tr *tiers, d *diskTier, set *pool.BlockSet, k disk.Key, sum bool, fill byte) []byte {
	t.Helper()
	n := tierBlockBytes(set.Layout()) - tierTrailer
	if sum {
		bad := bytes.Repeat([]byte{fill}, n+tierTrailer)
		putTrailer(bad, n, 0x5eed, true)
		if err := d.store.Load().Put(context.Background(), k, bad); err != nil {
			t.Error(err)
			return nil
		}
		placeCopy(tr, d, k, disk.Align)
	}
	return append(bytes.Repeat([]byte{fill ^ 0xff}, n), make([]byte, tierTrailer)...)
}

// A restore whose read of a block's copy is found corrupt by the tiers'
// own checks (its length, its content checksum), where a copier committed
// a good copy of the block to that tier between the read and the drop and
// placed it (the same record, reused: the store replaced its copy), drops
// the copy it read only: the good copy and its record stay, and the block
// restores from it byte for byte. Deleting by key deleted the good copy,
// its record marked gone and forgotten: the block lost from the tiers.
// The same in a disk tier and in host memory.
func TestTierRestoreDropKeepsACopyCommittedSince(t *testing.T) {
	for _, tc := range badCopies {
		for _, host := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/host=%v", tc.desc, host), func(t *testing.T) {
				tr, d, other, k := restoreSet(t, host)
				good := putBadCopy(t, tr, d, other, k, tc.sum, 0x61)
				if good == nil {
					t.FailNow()
				}
				e := tr.recordIn(d, k)
				ran := false
				f := func(dd *diskTier, kk disk.Key, rerr error) {
					if dd != d || kk != k || ran {
						return
					}
					ran = true
					if rerr != nil {
						t.Errorf("the store's read of the bad copy: %v, want it read whole", rerr)
					}
					if err := d.store.Load().Put(context.Background(), k, good); err != nil {
						t.Error(err)
					}
					if placeCopy(tr, d, k, disk.Align) {
						t.Error("the good copy was announced: its block had a record")
					}
					if tr.recordIn(d, k) != e {
						t.Error("the good copy was not placed in the record the read was made from")
					}
				}
				tr.afterRead.Store(&f)
				blks, err := restoreFrom(tr, d, other, k)
				if !ran {
					t.Fatal("the block was not read")
				}
				if len(blks) != 0 || !errors.Is(err, disk.ErrCorrupt) || !strings.Contains(err.Error(), tc.why) {
					t.Fatalf("restore of a bad copy: %d blocks, %v; want none and ErrCorrupt (%s)", len(blks), err, tc.why)
				}
				tr.afterRead.Store(nil)
				consistent(t, tr, d, k)
				if !has(d, k) {
					t.Fatal("the good copy committed since the read was deleted")
				}
				if got := tr.where(k); got != d || tr.recordIn(d, k) != e {
					t.Fatalf("the good copy's record: held by tier %d, the same record %v; want tier %d, the same", tierNum(got), tr.recordIn(d, k) == e, d.n)
				}
				restoresExactly(t, tr, d, other, k, good[:len(good)-tierTrailer])
			})
		}
	}
}

// A restore that found a block's copy corrupt by the tiers' own checks
// drops that copy only, also where a good copy is committed in its place
// after the drop marked the record gone and before the store's delete:
// the delete leaves it (DeleteIf, the generation read), and, the record
// forgotten, the copier records it once the delete ended. Deleting by key
// deleted the good copy. A copier started as the drop's delete begins,
// on its own goroutine, leaves the records and the store consistent: its
// copy recorded, or deleted as a second copy where the record was still
// gone when it placed it. Its commit races the store's delete, and its
// place (after the delete ended) the restore's forget: each run checks
// the one order the scheduler gives, not each of them; the "ordered"
// subtests force each of the four (the commit before or after the
// delete, the place before or after the forget).
func TestTierRestoreDropLeavesACopyCommittedUnderIt(t *testing.T) {
	for _, tc := range []struct {
		afterDelete, placeFirst bool
	}{{false, false}, {false, true}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("ordered/commit after the delete=%v/placed before the forget=%v", tc.afterDelete, tc.placeFirst), func(t *testing.T) {
			tr, d, other, k := restoreSet(t, false)
			good := putBadCopy(t, tr, d, other, k, false, 0x68)
			committed := false
			commit := func(dd *diskTier, kk disk.Key) {
				if dd != d || kk != k || committed {
					return
				}
				committed = true
				if err := d.store.Load().Put(context.Background(), k, good); err != nil {
					t.Error(err)
				}
			}
			if tc.afterDelete {
				tr.afterDrop.Store(&commit)
			} else {
				tr.beforeDelete.Store(&commit)
			}
			forgot := false
			forget := func(f tierFound) { // the copier places its copy before or after the forget
				if !committed {
					t.Error("the restore's failure handed on before the good copy was committed")
				}
				if tc.placeFirst {
					placeCopy(tr, d, k, disk.Align)
				}
				tr.forgetFound(f)
				forgot = true
				if !tc.placeFirst {
					placeCopy(tr, d, k, disk.Align)
				}
			}
			find := func(context.Context, disk.Key) *diskTier { return d }
			alloc := func(_ context.Context, s *pool.BlockSet, n int) ([]pool.Block, error) { return s.Allocate(n) }
			blks, _, err := tr.restoreRun(context.Background(), &engineSet{set: other}, []uint64{k.Hash}, 0, find, alloc, forget, false)
			tr.afterDrop.Store(nil)
			tr.beforeDelete.Store(nil)
			if len(blks) != 0 || !errors.Is(err, disk.ErrCorrupt) || !forgot {
				t.Fatalf("restore of a bad copy: %d blocks, %v, handed to be forgotten %v; want none, ErrCorrupt, handed", len(blks), err, forgot)
			}
			consistent(t, tr, d, k)
			if tc.placeFirst {
				// Placed while the record was gone: deleted as a second copy.
				if has(d, k) || tr.where(k) != nil {
					t.Fatalf("placed while its record was gone: the copy held %v, recorded in tier %d; want neither", has(d, k), tierNum(tr.where(k)))
				}
				return
			}
			if got := tr.where(k); got != d {
				t.Fatalf("placed after the forget: the good copy recorded in tier %d, want %d", tierNum(got), d.n)
			}
			restoresExactly(t, tr, d, other, k, good[:len(good)-tierTrailer])
		})
	}

	t.Run("committed", func(t *testing.T) {
		tr, d, other, k := restoreSet(t, false)
		good := putBadCopy(t, tr, d, other, k, false, 0x62)
		ran := false
		f := func(dd *diskTier, kk disk.Key) {
			if dd != d || kk != k || ran {
				return
			}
			ran = true
			if err := d.store.Load().Put(context.Background(), k, good); err != nil {
				t.Error(err)
			}
		}
		tr.beforeDelete.Store(&f)
		blks, err := restoreFrom(tr, d, other, k)
		if !ran {
			t.Fatal("the bad copy was not dropped")
		}
		if len(blks) != 0 || !errors.Is(err, disk.ErrCorrupt) {
			t.Fatalf("restore of a bad copy: %d blocks, %v; want none and ErrCorrupt", len(blks), err)
		}
		tr.beforeDelete.Store(nil)
		if !has(d, k) {
			t.Fatal("the good copy committed under the drop was deleted")
		}
		if !placeCopy(tr, d, k, disk.Align) { // the copier, once the delete ended
			t.Fatal("the good copy was not recorded")
		}
		consistent(t, tr, d, k)
		restoresExactly(t, tr, d, other, k, good[:len(good)-tierTrailer])
	})
	t.Run("placed by a copier meanwhile", func(t *testing.T) {
		tr, d, other, k := restoreSet(t, false)
		good := putBadCopy(t, tr, d, other, k, false, 0x67)
		var once sync.Once
		started := false
		// The copier ends before the test does, whatever fails first: its
		// t.Error after the test's end would panic the test binary.
		var copier sync.WaitGroup
		t.Cleanup(copier.Wait)
		f := func(dd *diskTier, kk disk.Key) {
			if dd != d || kk != k {
				return
			}
			once.Do(func() {
				// A copier commits its copy and places it (placed waits
				// for the delete to end), on its own goroutine.
				started = true
				copier.Add(1)
				go func() {
					defer copier.Done()
					if err := d.store.Load().Put(context.Background(), k, good); err != nil {
						t.Error(err)
						return
					}
					placeCopy(tr, d, k, disk.Align)
				}()
			})
		}
		tr.beforeDelete.Store(&f)
		blks, err := restoreFrom(tr, d, other, k)
		if !started {
			t.Fatal("the bad copy was not dropped")
		}
		if len(blks) != 0 || !errors.Is(err, disk.ErrCorrupt) {
			t.Fatalf("restore of a bad copy: %d blocks, %v; want none and ErrCorrupt", len(blks), err)
		}
		copier.Wait()
		tr.beforeDelete.Store(nil)
		consistent(t, tr, d, k)
	})
}

// A restore whose block's record was replaced between its noting the
// record it reads from and the store's read (the copy dropped and the
// record forgotten, another bad copy committed and recorded) acts on the
// copy it read, and on the record that names it: a copy found corrupt by
// the tiers' own checks is dropped and its record forgotten. Taken as
// made from the older record, the read left the bad copy it found in the
// store and its record, for every later restore to read and fail on.
func TestTierRestoreDropOfARecordReplacedBeforeTheRead(t *testing.T) {
	for _, tc := range badCopies {
		t.Run(tc.desc, func(t *testing.T) {
			tr, d, other, k := restoreSet(t, false)
			if putBadCopy(t, tr, d, other, k, tc.sum, 0x63) == nil {
				t.FailNow()
			}
			ran := false
			f := func(dd *diskTier, kk disk.Key) {
				if dd != d || kk != k || ran {
					return
				}
				ran = true
				// Another restore dropped the copy and forgot its record;
				// a copier commits another bad copy and records it.
				if err := tr.dropCopy(d, k, true); err != nil {
					t.Error(err)
				}
				forgetKey(tr, d, k)
				if tc.sum {
					if putBadCopy(t, tr, d, other, k, true, 0x64) == nil {
						return
					}
				} else {
					if err := d.store.Load().Put(context.Background(), k, bytes.Repeat([]byte{0x64}, 1000)); err != nil {
						t.Error(err)
					}
					placeCopy(tr, d, k, disk.Align)
				}
				if tr.where(k) != d {
					t.Error("the bad copy committed again was not recorded")
				}
			}
			tr.beforeRead.Store(&f)
			blks, err := restoreFrom(tr, d, other, k)
			if !ran {
				t.Fatal("the block was not read")
			}
			if len(blks) != 0 || !errors.Is(err, disk.ErrCorrupt) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("restore of a bad copy: %d blocks, %v; want none and ErrCorrupt (%s)", len(blks), err, tc.why)
			}
			consistent(t, tr, d, k)
			if has(d, k) {
				t.Fatal("the bad copy read is still in the store")
			}
			if got := tr.where(k); got != nil {
				t.Fatalf("the bad copy's block is held by tier %d, want none", tierNum(got))
			}
		})
	}
}

// storeDrops drops d's copy of k as the store itself does when a read of
// it fails its checksum, with no delete of the tiers' nor its record
// marked: in host memory the copy is corrupted and read (the MemStore
// drops it); on disk, where the tests cannot corrupt a copy in its file,
// it is deleted through the store. It says whether the copy went. For
// hooks on a reader goroutine: it reports with t.Error.
func storeDrops(t *testing.T, d *diskTier, k disk.Key) bool {
	t.Helper()
	st := d.store.Load()
	if m, ok := st.(*disk.MemStore); ok {
		if !m.CorruptForTest(k, 10, 0x40) {
			t.Error("the copy was not corrupted")
			return false
		}
		if _, err := st.Get(context.Background(), k, make([]byte, disk.Align)); !errors.Is(err, disk.ErrCorrupt) {
			t.Errorf("the read of the corrupted copy: %v, want ErrCorrupt", err)
			return false
		}
	} else if err := st.Delete(k); err != nil {
		t.Error(err)
		return false
	}
	if has(d, k) {
		t.Error("the store still holds the copy it dropped")
		return false
	}
	return true
}

// noRecord fails the test unless k has no record and no copy in d, the
// tiers consistent: a record whose copy went, marked gone and forgotten.
func noRecord(t *testing.T, tr *tiers, d *diskTier, k disk.Key) {
	t.Helper()
	consistent(t, tr, d, k)
	tr.mu.Lock()
	_, ok := tr.pos[k]
	tr.mu.Unlock()
	if ok || has(d, k) {
		t.Fatalf("the block whose copy went: a record %v, a copy %v; want neither", ok, has(d, k))
	}
}

// A restore whose block's record was replaced between the read's start
// and the store's read (the copy dropped and the record forgotten, a good
// copy committed and recorded), where the store then drops the copy it
// reads (its checksum failed) or finds it missing, marks the record that
// names the tier then gone and has it forgotten: the record is left with
// no copy behind it, which the tiers never make (each delete of theirs
// marks the record first). Acting on the record the read began with only,
// the restore left the new record held, served from and counted, with no
// copy in the store.
func TestTierRestoreLostOfARecordReplacedBeforeTheRead(t *testing.T) {
	for _, host := range []bool{false, true} {
		t.Run(fmt.Sprintf("host=%v", host), func(t *testing.T) {
			tr, d, other, k := restoreSet(t, host)
			good := append(bytes.Repeat([]byte{0x66}, tierBlockBytes(other.Layout())-tierTrailer), make([]byte, tierTrailer)...)
			first := tr.recordIn(d, k)
			ran := false
			f := func(dd *diskTier, kk disk.Key) {
				if dd != d || kk != k || ran {
					return
				}
				ran = true
				// Another restore dropped the copy and forgot its record;
				// a copier commits a good copy and records it; the store
				// drops that copy as it reads it, or it goes.
				if err := tr.dropCopy(d, k, true); err != nil {
					t.Error(err)
				}
				forgetKey(tr, d, k)
				if err := d.store.Load().Put(context.Background(), k, good); err != nil {
					t.Error(err)
					return
				}
				if !placeCopy(tr, d, k, disk.Align) {
					t.Error("the copy committed again was not recorded")
				}
				if e := tr.recordIn(d, k); e == nil || e == first {
					t.Error("the copy committed again is not in a record of its own")
				}
				if !host {
					storeDrops(t, d, k) // on disk: it goes
				} else if !d.store.Load().(*disk.MemStore).CorruptForTest(k, 10, 0x40) {
					// In host memory the store drops it as the restore
					// reads it.
					t.Error("the copy was not corrupted")
				}
			}
			tr.beforeRead.Store(&f)
			blks, err := restoreFrom(tr, d, other, k)
			if !ran {
				t.Fatal("the block was not read")
			}
			if len(blks) != 0 || err == nil {
				t.Fatalf("restore of a copy that went: %d blocks, %v; want none and an error", len(blks), err)
			}
			noRecord(t, tr, d, k)
			if got := tr.where(k); got != nil {
				t.Fatalf("the block is held by tier %d, want none", tierNum(got))
			}
		})
	}
}

// A restore whose read is found corrupt by the tiers' own checks, where
// the store drops the copy read before the restore acts on it (a read of
// it that failed the store's checksum, or the copy gone), marks the record
// that names the tier gone and has it forgotten, as a restore whose read
// found the copy missing does: with no copy of that generation to drop,
// the restore left the record held with no copy behind it.
func TestTierRestoreDropOfACopyTheStoreDropped(t *testing.T) {
	for _, host := range []bool{false, true} {
		t.Run(fmt.Sprintf("host=%v", host), func(t *testing.T) {
			tr, d, other, k := restoreSet(t, host) // its copy: 1000 bytes, the wrong length
			ran := false
			f := func(dd *diskTier, kk disk.Key, rerr error) {
				if dd != d || kk != k || ran {
					return
				}
				ran = true
				if rerr != nil {
					t.Errorf("the store's read of the bad copy: %v, want it read whole", rerr)
				}
				storeDrops(t, d, k)
			}
			tr.afterRead.Store(&f)
			blks, err := restoreFrom(tr, d, other, k)
			if !ran {
				t.Fatal("the block was not read")
			}
			if len(blks) != 0 || !errors.Is(err, disk.ErrCorrupt) {
				t.Fatalf("restore of a bad copy: %d blocks, %v; want none and ErrCorrupt", len(blks), err)
			}
			noRecord(t, tr, d, k)
		})
	}
}

// A drop of a copy found corrupt with no generation read (0: no copy's; a
// store gives each copy it holds one from 1 up) drops nothing and marks
// nothing: taken to dropCopyGen, 0 deleted the copy by key, whatever it
// is, and marked its record gone.
func TestTierDropFoundOfNoGeneration(t *testing.T) {
	for _, host := range []bool{false, true} {
		t.Run(fmt.Sprintf("host=%v", host), func(t *testing.T) {
			tr, _, k := belowSet(t, host, false)
			d := tr.list[0]
			if gen, ok := d.store.Load().Gen(k); !ok || gen == 0 {
				t.Fatalf("the copy held: generation %d, held %v; want one from 1 up", gen, ok)
			}
			e := tr.recordIn(d, k)
			f := tierFound{d: d, k: k, e: e}
			tr.dropFound(&f)
			if f.e != nil {
				t.Fatal("a drop of no generation marked a record")
			}
			consistent(t, tr, d, k)
			if !has(d, k) || tr.where(k) != d || tr.recordIn(d, k) != e {
				t.Fatalf("after a drop of no generation: in the store %v, held by tier %d; want the copy and its record as they were", has(d, k), tierNum(tr.where(k)))
			}
		})
	}
}

// A restore whose read's failure marked the block's record gone (a copy
// found missing, or corrupt by the tiers' own checks and dropped) forgets
// that record only: where another forgot it, and a copier committed the
// block again and recorded its copy, between the failure and the forget,
// the new record and its good copy stay.
func TestTierRestoreForgetLeavesARecordPlacedSince(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		missing bool // the copy went from the store, else of the wrong length
	}{
		{"missing", true},
		{"corrupt", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, d, other, k := restoreSet(t, false)
			good := append(bytes.Repeat([]byte{0x65}, tierBlockBytes(other.Layout())-tierTrailer), make([]byte, tierTrailer)...)
			if tc.missing {
				if err := d.store.Load().Delete(k); err != nil {
					t.Fatal(err)
				}
			}
			marked := tr.recordIn(d, k)
			forgot := false
			forget := func(f tierFound) {
				forgot = true
				if f.e != marked {
					t.Errorf("the read's failure: marked %v, the record read from %v; want the record read from marked", f.e != nil, f.e == marked)
				}
				// Another forgets the record gone; a copier commits the
				// block again and records it.
				forgetKey(tr, d, k)
				if err := d.store.Load().Put(context.Background(), k, good); err != nil {
					t.Error(err)
				}
				if !placeCopy(tr, d, k, disk.Align) {
					t.Error("the copy committed again was not recorded")
				}
				tr.forgetFound(f)
			}
			find := func(context.Context, disk.Key) *diskTier { return d }
			alloc := func(_ context.Context, s *pool.BlockSet, n int) ([]pool.Block, error) { return s.Allocate(n) }
			blks, _, err := tr.restoreRun(context.Background(), &engineSet{set: other}, []uint64{k.Hash}, 0, find, alloc, forget, false)
			if !forgot || len(blks) != 0 || err == nil {
				t.Fatalf("restore of a copy %s: forgotten %v, %d blocks, %v; want forgotten, none and an error", tc.desc, forgot, len(blks), err)
			}
			consistent(t, tr, d, k)
			if got := tr.where(k); got != d || !has(d, k) {
				t.Fatalf("the block committed again: held by tier %d, in the store %v; want tier %d, held", tierNum(got), has(d, k), d.n)
			}
			restoresExactly(t, tr, d, other, k, good[:len(good)-tierTrailer])
		})
	}
}

// A move down from host memory whose commit below lands while a delete of
// the block there is under way (a second copy's) waits for the delete to
// end, without the tiers' ordering lock (a resync goes on meanwhile), and
// keeps the copy it committed only where the delete left it. Committed
// after the delete ran, with the host copy gone meanwhile (a restore found
// it missing and forgot its record), the copy below is the node's only
// one: deleting it as a second copy, as the move did without waiting, lost
// the block. Committed before the delete runs, the delete takes it: the
// block stays in host memory, not recorded below and its host copy freed
// (the block lost) as a move that does not wait has it.
func TestHostMoveWaitsForADeleteBelow(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		after bool // committed after the delete ran, the host copy gone; else before it runs
	}{
		{"committed after the delete", true},
		{"committed before the delete", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, h, d := hostOverDisk(t, 4)
			ctx := context.Background()
			k := disk.Key{Hash: 51, Tag: 1}
			data := bytes.Repeat([]byte{0x51}, 3000)
			mem := h.store.Load().(*disk.MemStore)
			if err := mem.Put(ctx, k, data); err != nil {
				t.Fatal(err)
			}
			placeCopy(tr, h, k, disk.Align)
			buf := alignedBuffer(disk.Align)
			_, gen, err := mem.GetGen(ctx, k, buf) // the move's read
			if err != nil {
				t.Fatal(err)
			}
			// A copy below recorded nowhere, deleted as a second copy.
			if err := d.store.Load().Put(ctx, k, data); err != nil {
				t.Fatal(err)
			}
			ran := false
			var done <-chan struct{}
			f := func(dd *diskTier, kk disk.Key) {
				if dd != d || kk != k || ran {
					return
				}
				ran = true
				if tc.after {
					// The host copy goes: a restore finds it missing and
					// forgets its record.
					if err := mem.Delete(k); err != nil {
						t.Error(err)
					}
					lostKey(t, tr, h, k)
					forgetKey(tr, h, k)
					// The move's commit below lands after the delete's.
					if err := d.store.Load().Put(ctx, k, data); err != nil {
						t.Error(err)
					}
				} // else the move's commit is the copy the delete takes
				done = startMove(t, tr, d, k, func() { tr.movedDown(mem, h, d, k, disk.Align, gen, 0) })
				resyncGoesOn(t, tr)
			}
			if tc.after {
				tr.afterDrop.Store(&f)
			} else {
				tr.beforeDelete.Store(&f)
			}
			tr.dropSecond(d, []disk.Key{k})
			if !ran {
				t.Fatal("no copy deleted below")
			}
			waitClosed(t, done, "the move down")
			consistent(t, tr, d, k)
			consistent(t, tr, h, k)
			want := h
			if tc.after {
				want = d
			}
			if got := tr.where(k); got != want {
				t.Fatalf("the block is held by tier %d, want %d", tierNum(got), want.n)
			}
			if !has(want, k) {
				t.Fatalf("tier %d holds no copy of the block: the node lost it", want.n)
			}
		})
	}
}

// resyncGoesOn fails the test unless a resync's read of the tiers'
// records (announced, under announceMu) ends within a wide margin.
func resyncGoesOn(t *testing.T, tr *tiers) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		tr.announced(func([]membership.Entry) {})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Error("a resync waited 30s for the tiers' ordering lock while a delete was under way")
	}
}

// A copier whose commit lands while a delete of the block in that tier is
// under way waits for the delete to end without the tiers' ordering lock:
// a resync (and every announcement and forget) goes on meanwhile rather
// than wait behind a disk store's delete and journal sync. The copy is
// recorded once the delete ended, where the store holds it.
func TestTierPlacedWaitsForADeleteOutsideTheOrder(t *testing.T) {
	tr, _, d := hostOverDisk(t, 4)
	ctx := context.Background()
	k := disk.Key{Hash: 52, Tag: 1}
	data := bytes.Repeat([]byte{0x52}, 3000)
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	var once sync.Once
	w := func(dd *diskTier, kk disk.Key) {
		if dd == d && kk == k {
			once.Do(func() { close(waiting) })
		}
	}
	tr.beforeDeleteWait.Store(&w)
	ran := false
	done := make(chan struct{})
	var second []disk.Key
	f := func(dd *diskTier, kk disk.Key) {
		if dd != d || kk != k || ran {
			return
		}
		ran = true
		// A copy down's commit lands after the delete's, and it places it
		// while the delete is still under way.
		if err := d.store.Load().Put(ctx, k, data); err != nil {
			t.Error(err)
		}
		go func() {
			defer close(done)
			second = tr.placeAll(d, []disk.Key{k}, []int{disk.Align})
		}()
		select {
		case <-waiting:
		case <-done:
			t.Error("the copy was placed while a delete of it was under way")
		case <-time.After(30 * time.Second):
			t.Error("the copy's placing did not wait for the delete after 30s")
		}
		resyncGoesOn(t, tr)
	}
	tr.afterDrop.Store(&f)
	tr.dropSecond(d, []disk.Key{k})
	if !ran {
		t.Fatal("no copy deleted")
	}
	waitClosed(t, done, "the copy placed")
	if len(second) != 0 {
		t.Fatalf("the copy committed after the delete taken as a second copy: %v", second)
	}
	consistent(t, tr, d, k)
	if tr.where(k) != d {
		t.Fatal("the copy committed after the delete is not recorded")
	}
}

// A read-ahead that finds a block's copy missing forgets its record as the
// read lands, not once the read-ahead is over (it may wait long for its
// other blocks to be read or taken): until the record is forgotten it is
// gone, holds nothing, and each copy down of the block meanwhile wrote it
// and deleted it as a second copy, again and again. Here four copies down
// of the block while the read-ahead is under way write it once.
func TestTierReadAheadLostBlockNotRewrittenWhileItRuns(t *testing.T) {
	tr, set, _ := belowSet(t, false, false)
	d := tr.list[0]
	l := set.Layout()
	tag := shapeTag(l)
	tr.layouts = map[uint64]*layout.Layout{tag: l} // no tier.json to write
	tr.room.Store(int64(tr.blockBytes))
	ctx := context.Background()
	whole := make([]byte, tierBlockBytes(l)) // no content checksum
	lost := disk.Key{Hash: 2, Tag: tag}      // in the set, and to be read ahead
	next := disk.Key{Hash: 3, Tag: tag}
	for _, k := range []disk.Key{lost, next} {
		if err := d.store.Load().Put(ctx, k, whole); err != nil {
			t.Fatal(err)
		}
		placeCopy(tr, d, k, disk.Align)
	}
	if err := d.store.Load().Delete(lost); err != nil { // gone, its record left
		t.Fatal(err)
	}
	into, err := tr.a.pool.NewBlockSet(belowLayout(4))
	if err != nil {
		t.Fatal(err)
	}
	es := &engineSet{set: into}
	release := make(chan struct{})
	hold := func(ctx context.Context, hash uint64) {
		if hash == next.Hash {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	}
	tr.ahead.reading.Store(&hold)
	run := []uint64{lost.Hash, next.Hash}
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := newAheadRun(run, 0, cancel)
	es.ahead.run = r
	go tr.readAhead(actx, es, r, run, 0, 8)
	defer func() {
		close(release)
		waitClosed(t, r.done, "the read-ahead")
	}()
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	tr.awaitAhead(wctx, es, []uint64{lost.Hash}) // landed: its read failed
	if wctx.Err() != nil {
		t.Fatal("the missing block's read did not land")
	}
	blk := mustLookup(t, set, lost.Hash)
	puts := d.store.Load().Stats().Puts
	for range 4 {
		tr.copyDownBatch([]*offloadJob{{set: set, blk: blk, hash: lost.Hash, held: true}})
	}
	if got := d.store.Load().Stats().Puts - puts; got != 1 {
		t.Fatalf("4 copies down of a block lost by a read-ahead under way wrote it %d times, want 1", got)
	}
	consistent(t, tr, d, lost)
	if tr.where(lost) != d {
		t.Fatal("the block copied down again is not recorded")
	}
	select {
	case <-r.done:
		t.Fatal("the read-ahead ended before its held read")
	default:
	}
}

// A copier whose wait for the deletes of its block ended, and a delete of
// the block in its tier began before it took the tiers' ordering lock (a
// second copy's), waits for that one too: it records its copy only with no
// delete under way, where the store holds it then. Recorded at once, the
// delete took the copy from under the record.
func TestTierPlacedWaitsForADeleteBegunAfterItsWait(t *testing.T) {
	tr, _, d := hostOverDisk(t, 4)
	ctx := context.Background()
	k := disk.Key{Hash: 53, Tag: 1}
	data := bytes.Repeat([]byte{0x53}, 3000)
	if err := d.store.Load().Put(ctx, k, data); err != nil { // the copier's commit
		t.Fatal(err)
	}
	// A delete of k in d (a second copy, recorded nowhere) begins
	// between the copier's wait and its placing.
	waiting, release, deleted := deleteAfterTheWait(t, tr, d, k)
	placed := make(chan []disk.Key, 1)
	go func() { placed <- tr.placeAll(d, []disk.Key{k}, []int{disk.Align}) }()
	// The delete goes on once the copier waits for it, or has placed its
	// copy (wrongly, with the delete under way).
	var second []disk.Key
	select {
	case <-waiting:
		close(release)
		second = <-placed
	case second = <-placed:
		close(release)
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the copier neither waited for the delete nor placed its copy after 30s")
	}
	waitClosed(t, deleted, "the delete")
	if len(second) != 0 {
		t.Fatalf("a copy taken as a second copy: %v", second)
	}
	consistent(t, tr, d, k)
	if tr.where(k) != nil {
		t.Fatal("the copy the delete took is recorded")
	}
}

// A move down from host memory whose wait for the deletes of its block
// below ended, and a delete of the block there began before it took the
// tiers' ordering lock (a copier's second copy: it committed the block
// below while the host tier recorded it, the move's commit landing on the
// same copy), waits for that one too: the delete takes the copy below, and
// the block stays in host memory with its record. Moved at once, the
// record named the tier below, whose copy the delete then took, and the
// host copy was freed: the node lost the block.
func TestHostMoveWaitsForADeleteBegunAfterItsWait(t *testing.T) {
	tr, h, d := hostOverDisk(t, 4)
	ctx := context.Background()
	k := disk.Key{Hash: 54, Tag: 1}
	data := bytes.Repeat([]byte{0x54}, 3000)
	mem := h.store.Load().(*disk.MemStore)
	if err := mem.Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, h, k, disk.Align)
	buf := alignedBuffer(disk.Align)
	_, gen, err := mem.GetGen(ctx, k, buf) // the move's read
	if err != nil {
		t.Fatal(err)
	}
	// The copier's commit below, and the move's after it: one copy there.
	if err := d.store.Load().Put(ctx, k, data); err != nil {
		t.Fatal(err)
	}
	if announce, second := place(tr, d, k, disk.Align); announce || !second {
		t.Fatalf("the copier's copy below placed as announce %v, second %v; want a second copy", announce, second)
	}
	// The copier deletes its second copy (dropSecond): the delete begins
	// between the move's wait and its taking the records.
	waiting, release, deleted := deleteAfterTheWait(t, tr, d, k)
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		tr.movedDown(mem, h, d, k, disk.Align, gen, 0)
	}()
	// The delete goes on once the move waits for it, or has ended
	// (wrongly, with the delete under way).
	select {
	case <-waiting:
		close(release)
		waitClosed(t, moved, "the move down")
	case <-moved:
		close(release)
	case <-time.After(30 * time.Second):
		close(release)
		t.Fatal("the move down neither waited for the delete nor ended after 30s")
	}
	waitClosed(t, deleted, "the delete")
	consistent(t, tr, d, k)
	consistent(t, tr, h, k)
	if got := tr.where(k); got != h {
		t.Fatalf("the block is held by tier %d, want the host tier", tierNum(got))
	}
	if !has(h, k) {
		t.Fatal("the host tier holds no copy of the block: the node lost it")
	}
}

// deleteAfterTheWait makes a delete of k in d (dropSecond, a second copy's)
// begin once the caller's wait for the deletes of k has ended, as it takes
// the tiers' ordering lock (beforeOrder), and holds that delete before the
// store's Delete until release is closed. waiting is closed when the caller
// waits for the delete (beforeDeleteWait), deleted when the delete ends.
func deleteAfterTheWait(t *testing.T, tr *tiers, d *diskTier, k disk.Key) (waiting, release, deleted chan struct{}) {
	t.Helper()
	deleting := make(chan struct{})
	release = make(chan struct{})
	var once sync.Once
	bd := func(dd *diskTier, kk disk.Key) {
		if dd == d && kk == k {
			once.Do(func() {
				close(deleting)
				<-release
			})
		}
	}
	tr.beforeDelete.Store(&bd)
	waiting = make(chan struct{})
	var wonce sync.Once
	w := func(dd *diskTier, kk disk.Key) {
		if dd == d && kk == k {
			wonce.Do(func() { close(waiting) })
		}
	}
	tr.beforeDeleteWait.Store(&w)
	deleted = make(chan struct{})
	started := false
	o := func() {
		if started {
			return
		}
		started = true
		go func() {
			defer close(deleted)
			tr.dropSecond(d, []disk.Key{k})
		}()
		select {
		case <-deleting:
		case <-time.After(30 * time.Second):
			t.Error("the delete did not begin after 30s")
		}
	}
	tr.beforeOrder.Store(&o)
	return waiting, release, deleted
}

// A move down from host memory whose chosen block's record was replaced
// before its read (the copy dropped and the record forgotten, a good copy
// committed and recorded), where the host store then drops the copy it
// reads (its checksum failed) or finds it missing, marks the record that
// names the host tier then gone and forgets it, as a restore's read does:
// nothing is left recorded with no copy behind it, nor written below.
// Acting on the record it chose only, the move left the new record held,
// served from and counted, with no copy in the store.
func TestHostMoveDownLostOfARecordReplacedBeforeTheRead(t *testing.T) {
	for _, tc := range []struct {
		desc    string
		missing bool // the copy went before the read, else the read finds it corrupt
	}{
		{"corrupt", false},
		{"missing", true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, h, d := hostOverDisk(t, 4)
			ctx := context.Background()
			k := disk.Key{Hash: 61, Tag: 1}
			mem := h.store.Load().(*disk.MemStore)
			if err := mem.Put(ctx, k, bytes.Repeat([]byte{0x61}, 3000)); err != nil {
				t.Fatal(err)
			}
			placeCopy(tr, h, k, disk.Align)
			chosen := tr.recordIn(h, k)
			ran := false
			f := func(dd *diskTier, kk disk.Key) {
				if dd != h || kk != k || ran {
					return
				}
				ran = true
				// A restore dropped the chosen copy and forgot its record;
				// a copier commits the block again and records it.
				if err := tr.dropCopy(h, k, true); err != nil {
					t.Error(err)
				}
				forgetKey(tr, h, k)
				if err := mem.Put(ctx, k, bytes.Repeat([]byte{0x62}, 3000)); err != nil {
					t.Error(err)
					return
				}
				if !placeCopy(tr, h, k, disk.Align) {
					t.Error("the copy committed again was not recorded")
				}
				if e := tr.recordIn(h, k); e == nil || e == chosen {
					t.Error("the copy committed again is not in a record of its own")
				}
				if tc.missing {
					storeDrops(t, h, k)
				} else if !mem.CorruptForTest(k, 10, 0x40) { // dropped as the move reads it
					t.Error("the copy was not corrupted")
				}
			}
			tr.beforeRead.Store(&f)
			if got := tr.moveDown(h, 1); got != 1 {
				t.Fatalf("%d blocks left the host tier, want 1", got)
			}
			if !ran {
				t.Fatal("the block was not read")
			}
			noRecord(t, tr, h, k)
			consistent(t, tr, d, k)
			if s := d.store.Load().Stats(); s.Puts != 0 {
				t.Fatalf("%d puts below, want nothing written for a copy that went", s.Puts)
			}
			if n := h.evicted.Load(); n != 1 {
				t.Fatalf("%d evictions of the host tier counted, want 1", n)
			}
		})
	}
}

// A move down from host memory whose read of a block failed (the host
// store dropped the copy on its checksum), where a copier committed the
// block again to the host tier after the read, keeps that copy and its
// record (the record the move chose, which placed reuses for it, whether
// it placed it before the move acts on its failure or after): the block
// stays in host memory, read back byte for byte, nothing written below.
// Acting on the record it chose, the move marked it gone, deleted the good
// copy by key and forgot the record: a cached copy lost, and, placed after
// that, no record made for a copy the delete took.
func TestHostMoveDownKeepsACopyCommittedAfterItsRead(t *testing.T) {
	for _, tc := range []struct {
		desc   string
		before bool // placed before the move acts on its failure, else after the move
	}{
		{"placed before the move acts", true},
		{"placed after the move", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, h, d := hostOverDisk(t, 4)
			ctx := context.Background()
			k := disk.Key{Hash: 63, Tag: 1}
			good := bytes.Repeat([]byte{0x63}, 3000)
			mem := h.store.Load().(*disk.MemStore)
			if err := mem.Put(ctx, k, good); err != nil {
				t.Fatal(err)
			}
			placeCopy(tr, h, k, disk.Align)
			chosen := tr.recordIn(h, k)
			if !mem.CorruptForTest(k, 10, 0x40) {
				t.Fatal("the copy was not corrupted")
			}
			ran := false
			f := func(dd *diskTier, kk disk.Key, rerr error) {
				if dd != h || kk != k || ran {
					return
				}
				ran = true
				if !errors.Is(rerr, disk.ErrCorrupt) {
					t.Errorf("the move's read of the corrupted copy: %v, want ErrCorrupt", rerr)
				}
				if err := mem.Put(ctx, k, good); err != nil {
					t.Error(err)
					return
				}
				if tc.before {
					placeCopy(tr, h, k, disk.Align)
				}
			}
			tr.afterRead.Store(&f)
			tr.moveDown(h, 1)
			if !ran {
				t.Fatal("the block was not read")
			}
			if !tc.before {
				placeCopy(tr, h, k, disk.Align)
			}
			consistent(t, tr, h, k)
			consistent(t, tr, d, k)
			if e := tr.recordIn(h, k); e != chosen || tr.where(k) != h {
				t.Fatalf("the copy committed after the read: held by tier %d, its record the one chosen %v; want the host tier's, the one chosen", tierNum(tr.where(k)), e == chosen)
			}
			buf := make([]byte, disk.Align)
			if n, err := mem.Get(ctx, k, buf); err != nil || !bytes.Equal(buf[:n], good) {
				t.Fatalf("the host tier's copy reads %d bytes, %v; want the copy committed", n, err)
			}
			if s := d.store.Load().Stats(); s.Puts != 0 {
				t.Fatalf("%d puts below, want nothing written", s.Puts)
			}
			if n := h.evicted.Load(); n != 0 {
				t.Fatalf("%d evictions of the host tier counted, want none", n)
			}
		})
	}
}
