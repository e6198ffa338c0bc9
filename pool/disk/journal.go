package disk

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

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
	// flagLink, in a put record's byte 5 beside flagParent: a link
	// record (Store.SetParent), which sets the parent of the block it
	// restates (its slot, length and checksum as held when it was
	// written) and makes no new copy. A version that ignores the bit
	// replays it as the put of the same block again.
	flagLink = 2
	// compactAfter: the journal is rewritten with only the live blocks
	// once it holds this many records and four times as many as blocks.
	compactAfter = 4096
)

type record struct {
	op  byte
	seq uint64
	key Key
	e   entry
	// link: a link record (flagLink), its parent in e.
	link bool
}

func (r record) encode() [recordBytes]byte {
	var b [recordBytes]byte
	copy(b[0:4], journalMagic)
	b[4] = r.op
	if r.e.hasParent {
		b[5] = flagParent
		binary.LittleEndian.PutUint64(b[48:], r.e.parent)
	}
	if r.link {
		b[5] |= flagLink
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
	r.link = b[5]&flagLink != 0
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
	dropped, ignored := 0, 0
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
		switch {
		case r.op == opPut && r.link:
			// A link record sets the parent of the block it restates,
			// only while that is the block held, and only with a parent.
			cur, ok := s.entries[r.key]
			if !ok || !r.e.hasParent || !sameBlock(cur.entry, r.e) {
				ignored++
				continue
			}
			cur.parent, cur.hasParent, cur.order = r.e.parent, true, r.seq
			s.entries[r.key] = cur
		case r.op == opPut:
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
			s.entries[r.key] = journalled{held: held{entry: r.e, gen: s.gen}, order: r.seq}
		case r.op == opDelete:
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
		"records", s.jrecords, "dropped", dropped, "links ignored", ignored)
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
	if f := s.beforeDataSync; f != nil {
		f()
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
	// The links set since the last commit go first, restating the
	// blocks held before this group's records change any; then the
	// deletes since, before any record of a put that reuses their slots.
	buf, links, taken := s.linkRecordsLocked(n)
	buf, dels := s.deleteRecordsLocked(buf)
	base := s.seq // the group's records are numbered base+1 on, in order
	for _, w := range batch {
		for _, r := range w.recs {
			s.seq++
			b := record{op: r.op, seq: s.seq, key: r.key, e: r.e}.encode()
			buf = append(buf, b[:]...)
		}
	}
	if err := s.writeJournalLocked(buf); err != nil {
		s.requeueLinks(taken)
		s.requeueDeletes(dels)
		return err
	}
	s.jrecords += n + len(links) + len(dels)
	s.records.Store(int64(s.jrecords))
	s.stats.commits.Add(1)
	s.stats.links.Add(uint64(len(links)))
	// The group's puts take effect here, in the journal's order and
	// before a compaction snapshots the entries: a replay, and the
	// compacted journal, then hold what memory holds. (A delete left
	// memory before its record was written.)
	s.mu.Lock()
	s.linkedLocked(links)
	i := -1
	for _, w := range batch {
		for _, r := range w.recs {
			i++
			if r.op != opPut {
				continue
			}
			old, had := s.entries[r.key]
			s.gen++
			s.entries[r.key] = journalled{held: held{entry: r.e, gen: s.gen}, order: base + uint64(i) + 1}
			if had {
				s.releaseSlotLocked(old.slot)
			}
		}
	}
	live := len(s.entries)
	s.mu.Unlock()
	if s.jrecords >= compactAfter && s.jrecords > 4*live {
		if err := s.compactLocked(); err != nil && s.dirUnsynced {
			s.cfg.Logger.Warn("disk tier: journal compacted, its directory not synced; the next commit syncs it first", "err", err)
		} else if err != nil {
			s.cfg.Logger.Warn("disk tier: journal compaction failed; the journal keeps growing", "err", err)
		}
	}
	return nil
}

// writeJournalLocked appends buf to the journal and syncs it; a write or
// sync that fails is cut back (cutBackLocked). Called with jmu held.
func (s *Store) writeJournalLocked(buf []byte) error {
	if s.dirUnsynced {
		if err := s.dirSync(); err != nil {
			return fmt.Errorf("disk: journal: sync %s since its compaction: %w", s.cfg.Dir, err)
		}
		s.dirUnsynced = false
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
	return nil
}

// linkWritten is a link record encoded for the copy of generation gen
// held under key: seq is its sequence number, the copy's order once the
// record is written (linkedLocked).
type linkWritten struct {
	key      Key
	gen, seq uint64
}

// linkRecordsLocked takes the links SetParent set since the last commit
// and encodes a link record of each, in the order set, into a buffer with
// room for more records after them: each restates the block held under its
// key now, with the parent set (a block no longer held has none; its delete
// is journalled after). It returns the buffer, the records it holds, and
// the links taken (to give back to the next commit where this one's write
// fails: requeueLinks). The copies' order is the caller's to set once the
// write succeeded (linkedLocked). Called with jmu held.
func (s *Store) linkRecordsLocked(more int) ([]byte, []linkWritten, map[Key]uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	taken := s.links
	s.links = nil
	keys := make([]Key, 0, len(taken))
	for k := range taken {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b Key) int { return cmp.Compare(taken[a], taken[b]) })
	buf := make([]byte, 0, (len(keys)+more)*recordBytes)
	var written []linkWritten
	for _, k := range keys {
		e, ok := s.entries[k]
		if !ok || !e.hasParent {
			continue
		}
		s.seq++
		b := record{op: opPut, seq: s.seq, key: k, e: e.entry, link: true}.encode()
		buf = append(buf, b[:]...)
		written = append(written, linkWritten{key: k, gen: e.gen, seq: s.seq})
	}
	return buf, written, taken
}

// linkedLocked makes the link records written the last to name their
// copies, for Keys' order: each copy still held, of the generation its
// record restated (a put since made another, with an order of its own).
// s.mu is held.
func (s *Store) linkedLocked(written []linkWritten) {
	for _, w := range written {
		if e, ok := s.entries[w.key]; ok && e.gen == w.gen {
			e.order = w.seq
			s.entries[w.key] = e
		}
	}
}

// requeueLinks gives the links of a commit whose write failed back to the
// next commit, each with the number it was set in: they are written before
// the links set since, as they were set before them, and a key set again
// since keeps its later number (its entry holds the later parent either
// way).
func (s *Store) requeueLinks(taken map[Key]uint64) {
	if len(taken) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.links == nil {
		s.links = map[Key]uint64{}
	}
	for k, o := range taken {
		if _, ok := s.links[k]; !ok {
			s.links[k] = o
		}
	}
}

// deleteRecordsLocked appends to buf the records of the deletes left for
// the next commit (drop), numbered on from s.seq, and returns them. Called
// with jmu held.
func (s *Store) deleteRecordsLocked(buf []byte) ([]byte, []pendingRecord) {
	s.mu.Lock()
	dels := s.deletes
	s.deletes = nil
	s.mu.Unlock()
	for _, r := range dels {
		s.seq++
		b := record{op: r.op, seq: s.seq, key: r.key, e: r.e}.encode()
		buf = append(buf, b[:]...)
	}
	return buf, dels
}

// requeueDeletes gives the delete records of a commit whose write failed
// back to the next commit, before those left since.
func (s *Store) requeueDeletes(dels []pendingRecord) {
	if len(dels) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deletes = append(dels, s.deletes...)
}

// flushPendingLocked writes the link records SetParent left for the next
// commit and the deletes' records, with a sync: Close's, so that a store
// closed keeps every link set and every delete. It counts as a commit
// (Stats.Commits): a journal write and sync with no data file to sync.
// Called with jmu held.
func (s *Store) flushPendingLocked() error {
	if s.jerr != nil {
		return s.jerr // what is pending stays so: nothing more is written
	}
	buf, written, taken := s.linkRecordsLocked(0)
	buf, dels := s.deleteRecordsLocked(buf)
	if len(written) == 0 && len(dels) == 0 {
		return nil
	}
	if err := s.writeJournalLocked(buf); err != nil {
		s.requeueLinks(taken)
		s.requeueDeletes(dels)
		return err
	}
	s.jrecords += len(written) + len(dels)
	s.records.Store(int64(s.jrecords))
	s.stats.commits.Add(1)
	s.stats.links.Add(uint64(len(written)))
	s.mu.Lock()
	s.linkedLocked(written)
	s.mu.Unlock()
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

// compactLocked writes the live blocks' records to journal.new, in the
// order of the records that last named them (inOrder), each with its
// latest parent, and renames it over the journal. Called with jmu held:
// puts wait for it to enter the entries (commitLocked), so no put's block
// enters them meanwhile, nor replaces one there; deletes and SetParent do
// not wait for it, as follows. inOrder copies the entries under s.mu, in
// one pass, and sorts the copy after letting go of it: what the copy holds
// is the store as it was then, whatever changes after. A block deleted
// after the copy is in it, and its delete's record, left for the next
// commit, follows the compacted ones; one deleted before it is not, and
// the record of its delete, naming a block the journal no longer holds, is
// ignored by a replay. A parent SetParent sets after the copy goes in a
// link record with the next commit, after the compacted ones.
func (s *Store) compactLocked() error {
	snapshot := s.inOrder()
	for i := range snapshot {
		s.seq++
		snapshot[i].seq = s.seq
	}
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
	// The compacted journal is the store's from here on: later records go
	// to it. Until the directory's sync makes the rename durable, a crash
	// may bring the old journal back without them, so where that sync
	// fails the next journal write tries it again first.
	s.journal.Close()
	s.journal = f
	s.jrecords = len(snapshot)
	s.records.Store(int64(s.jrecords))
	if err := s.dirSync(); err != nil {
		s.dirUnsynced = true
		return fmt.Errorf("disk: sync %s after the journal's compaction: %w", s.cfg.Dir, err)
	}
	return nil
}

// dirSync syncs the store's directory (its entries: the journal's name).
func (s *Store) dirSync() error {
	if f := s.syncDir; f != nil {
		return f()
	}
	d, err := os.Open(s.cfg.Dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
