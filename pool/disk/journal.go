package disk

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

const (
	journalMagic = "KVFJ"
	opPut        = 1
	opDelete     = 2
	// flagParent, in a record's byte 5: bytes 48..55 hold the block's
	// parent (entry.parent). A journal written before parents were kept
	// has the byte zero: its blocks have none. Other bits are ignored.
	flagParent = 1
	// compactAfter: the journal is rewritten with only the live blocks
	// once it holds this many records and four times as many as blocks.
	compactAfter = 4096
)

type record struct {
	op  byte
	seq uint64
	key Key
	e   entry
}

func (r record) encode() [recordBytes]byte {
	var b [recordBytes]byte
	copy(b[0:4], journalMagic)
	b[4] = r.op
	if r.e.hasParent {
		b[5] = flagParent
		binary.LittleEndian.PutUint64(b[48:], r.e.parent)
	}
	binary.LittleEndian.PutUint64(b[8:], r.seq)
	binary.LittleEndian.PutUint64(b[16:], r.key.Hash)
	binary.LittleEndian.PutUint64(b[24:], r.key.Tag)
	binary.LittleEndian.PutUint32(b[32:], r.e.slot)
	binary.LittleEndian.PutUint32(b[36:], r.e.length)
	binary.LittleEndian.PutUint64(b[40:], r.e.sum)
	binary.LittleEndian.PutUint64(b[56:], xxh3.Hash(b[:56]))
	return b
}

// decodeRecord checks a record read back; a record cut short or changed
// fails its own checksum.
func decodeRecord(b []byte) (record, bool) {
	if len(b) != recordBytes || string(b[0:4]) != journalMagic || binary.LittleEndian.Uint64(b[56:]) != xxh3.Hash(b[:56]) {
		return record{}, false
	}
	r := record{
		op:  b[4],
		seq: binary.LittleEndian.Uint64(b[8:]),
		key: Key{Hash: binary.LittleEndian.Uint64(b[16:]), Tag: binary.LittleEndian.Uint64(b[24:])},
		e: entry{
			slot:   binary.LittleEndian.Uint32(b[32:]),
			length: binary.LittleEndian.Uint32(b[36:]),
			sum:    binary.LittleEndian.Uint64(b[40:]),
		},
	}
	if b[5]&flagParent != 0 {
		r.e.parent, r.e.hasParent = binary.LittleEndian.Uint64(b[48:]), true
	}
	return r, r.op == opPut || r.op == opDelete
}

// sameBlock says whether a and b name the same bytes in the same slot.
func sameBlock(a, b entry) bool {
	return a.slot == b.slot && a.length == b.length && a.sum == b.sum
}

func (s *Store) journalPath() string { return filepath.Join(s.cfg.Dir, "journal") }

// replay reads the journal, keeps every complete record in order, truncates
// what follows the last one, and builds the entries and the free slots.
func (s *Store) replay() error {
	os.Remove(s.journalPath() + ".new") // a compaction cut short
	f, err := os.OpenFile(s.journalPath(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	s.journal = f
	var good int64
	var buf [recordBytes]byte
	dropped := 0
	owner := map[uint32]Key{}
	for {
		if _, err := io.ReadFull(f, buf[:]); err != nil {
			break
		}
		r, ok := decodeRecord(buf[:])
		if !ok || r.seq <= s.seq {
			break
		}
		good += recordBytes
		s.seq = r.seq
		s.jrecords++
		switch r.op {
		case opPut:
			if int(r.e.slot) >= s.slots || int(r.e.length) > s.cfg.SlotBytes || r.e.length == 0 {
				// A store reopened smaller, or a record we did not write.
				dropped++
				delete(s.entries, r.key)
				continue
			}
			// A slot named by an earlier live key was reused: the later
			// put wins (a journal we wrote never has this; a damaged one
			// might).
			if o, ok := owner[r.e.slot]; ok && o != r.key {
				if oe, live := s.entries[o]; live && oe.slot == r.e.slot {
					delete(s.entries, o)
					dropped++
				}
			}
			owner[r.e.slot] = r.key
			s.gen++
			s.entries[r.key] = held{r.e, s.gen}
		case opDelete:
			// A delete names the block it removed: a put of the same key
			// committed in the same group, before it, stays. Its parent
			// is no part of the name: a delete journalled by a version
			// that kept none still names a block put with one.
			if cur, ok := s.entries[r.key]; ok && sameBlock(cur.entry, r.e) {
				delete(s.entries, r.key)
			}
		}
	}
	if err := f.Truncate(good); err != nil {
		return fmt.Errorf("disk: truncate the journal's torn tail: %w", err)
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		return fmt.Errorf("disk: %w", err)
	}
	used := make(map[uint32]bool, len(s.entries))
	for _, e := range s.entries {
		used[e.slot] = true
	}
	for slot := s.slots - 1; slot >= 0; slot-- {
		if !used[uint32(slot)] {
			s.free = append(s.free, uint32(slot))
		}
	}
	s.cfg.Logger.Info("disk tier opened", "dir", s.cfg.Dir, "blocks", len(s.entries), "slots", s.slots,
		"records", s.jrecords, "dropped", dropped)
	s.records.Store(int64(s.jrecords))
	return nil
}

// pendingRecord is a record to append, after a sync of the data file
// dirty (if any) that its bytes were written to.
type pendingRecord struct {
	op    byte
	key   Key
	e     entry
	dirty *os.File
}

// waiter is records of one caller waiting to be made durable together.
type waiter struct {
	recs []pendingRecord
	done chan error
}

// appendRecords makes recs durable, after the data files they name as
// dirty. Records are committed in groups: whoever takes the journal next
// writes every record waiting by then, after one sync of each data file
// they wrote, in one write and with one sync of the journal, so that
// concurrent puts, and the blocks of one batch, share their syncs.
func (s *Store) appendRecords(recs []pendingRecord) error {
	w := &waiter{recs: recs, done: make(chan error, 1)}
	s.pmu.Lock()
	s.pending = append(s.pending, w)
	s.pmu.Unlock()
	s.jmu.Lock()
	s.pmu.Lock()
	batch := s.pending
	s.pending = nil
	s.pmu.Unlock()
	if len(batch) > 0 {
		err := s.commitLocked(batch)
		for _, b := range batch {
			b.done <- err
		}
	}
	s.jmu.Unlock()
	return <-w.done
}

// commitLocked syncs the batch's data files, then appends its records and
// syncs the journal, then puts the batch's blocks in the entries in the
// order of their records; the journal is compacted after that, when it has
// grown past what the live blocks need. Called with jmu held.
func (s *Store) commitLocked(batch []*waiter) error {
	if s.jerr != nil {
		return s.jerr
	}
	synced := map[*os.File]bool{}
	n := 0
	for _, w := range batch {
		for _, r := range w.recs {
			n++
			if r.dirty != nil && !synced[r.dirty] {
				synced[r.dirty] = true
				if err := unix.Fdatasync(int(r.dirty.Fd())); err != nil {
					return fmt.Errorf("disk: fdatasync %s: %w", r.dirty.Name(), err)
				}
			}
		}
	}
	if f := s.beforeJournal; f != nil {
		f()
	}
	buf := make([]byte, 0, n*recordBytes)
	for _, w := range batch {
		for _, r := range w.recs {
			s.seq++
			b := record{op: r.op, seq: s.seq, key: r.key, e: r.e}.encode()
			buf = append(buf, b[:]...)
		}
	}
	off, err := s.journal.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("disk: journal: %w", err)
	}
	if _, err := s.journal.Write(buf); err != nil {
		return s.cutBackLocked(off, fmt.Errorf("disk: journal: %w", err))
	}
	if err := unix.Fdatasync(int(s.journal.Fd())); err != nil {
		return s.cutBackLocked(off, fmt.Errorf("disk: journal: fdatasync: %w", err))
	}
	s.jrecords += n
	s.records.Store(int64(s.jrecords))
	s.stats.commits.Add(1)
	// The group's puts take effect here, in the journal's order and
	// before a compaction snapshots the entries: a replay, and the
	// compacted journal, then hold what memory holds. (A delete left
	// memory before its record was written.)
	s.mu.Lock()
	for _, w := range batch {
		for _, r := range w.recs {
			if r.op != opPut {
				continue
			}
			old, had := s.entries[r.key]
			s.gen++
			s.entries[r.key] = held{r.e, s.gen}
			if had {
				s.releaseSlotLocked(old.slot)
			}
		}
	}
	live := len(s.entries)
	s.mu.Unlock()
	if s.jrecords >= compactAfter && s.jrecords > 4*live {
		if err := s.compactLocked(); err != nil {
			s.cfg.Logger.Warn("disk tier: journal compaction failed; the journal keeps growing", "err", err)
		}
	}
	return nil
}

// cutBackLocked undoes a journal write that failed (err): the journal is
// cut back to off, where the write began, so that no torn record is left
// with records after it that a replay would never reach. Where that fails
// too, the store commits nothing more: every later commit returns the
// error. Called with jmu held.
func (s *Store) cutBackLocked(off int64, err error) error {
	cut := s.journal.Truncate(off)
	if cut == nil {
		_, cut = s.journal.Seek(off, io.SeekStart)
	}
	if cut == nil {
		cut = unix.Fdatasync(int(s.journal.Fd()))
	}
	if cut != nil {
		s.jerr = fmt.Errorf("%w; cutting the journal back failed (%v), so the store commits nothing more", err, cut)
		s.cfg.Logger.Error("disk tier: journal cannot be cut back after a failed write; commits fail from now on",
			"dir", s.cfg.Dir, "err", s.jerr)
		return s.jerr
	}
	return err
}

// compactLocked writes the live blocks' records to journal.new and renames
// it over the journal. Called with jmu held; puts and deletes that are not
// yet journalled wait for jmu, so the snapshot is exact.
func (s *Store) compactLocked() error {
	s.mu.Lock()
	snapshot := make([]record, 0, len(s.entries))
	for k, e := range s.entries {
		s.seq++
		snapshot = append(snapshot, record{op: opPut, seq: s.seq, key: k, e: e.entry})
	}
	s.mu.Unlock()
	path := s.journalPath() + ".new"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(snapshot)*recordBytes)
	for _, r := range snapshot {
		b := r.encode()
		buf = append(buf, b[:]...)
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := os.Rename(path, s.journalPath()); err != nil {
		f.Close()
		return err
	}
	if d, err := os.Open(s.cfg.Dir); err == nil {
		d.Sync()
		d.Close()
	}
	s.journal.Close()
	s.journal = f
	s.jrecords = len(snapshot)
	s.records.Store(int64(s.jrecords))
	return nil
}
