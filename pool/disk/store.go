package disk

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// Sentinels; match with errors.Is.
var (
	// ErrInvalidConfig: a Config field is out of range; the error names it.
	ErrInvalidConfig = errors.New("disk: invalid config")
	// ErrFull: every slot holds a block.
	ErrFull = errors.New("disk: full")
	// ErrNotFound: the store holds no block under the key.
	ErrNotFound = errors.New("disk: not found")
	// ErrCorrupt: a block's bytes did not match its checksum; the block
	// was dropped.
	ErrCorrupt = errors.New("disk: corrupt block")
	// ErrTooLarge: a block larger than a slot, or a buffer too small.
	ErrTooLarge = errors.New("disk: block does not fit")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("disk: closed")
	// ErrDropped: a Batch's item was taken out of it (Batch.Drop).
	ErrDropped = errors.New("disk: dropped from its batch")
)

// Limits. Each is enforced where the value arrives.
const (
	// Align is the alignment O_DIRECT needs of offsets, lengths and
	// buffers; slots are a multiple of it.
	Align = 4096
	// MaxSlotBytes bounds one slot (one block).
	MaxSlotBytes = 1 << 30
	// MaxFileBytes bounds one data file.
	MaxFileBytes = 1 << 40
	// MaxFiles bounds the data files of one store.
	MaxFiles = 1000
	// MaxSlots bounds the slots of one store (Bytes over SlotBytes): a
	// slot's number is 32 bits, and the store keeps a free list of 4
	// bytes a slot (1 GiB at the limit).
	MaxSlots = 1 << 28
	// MaxWorkers bounds the I/O workers.
	MaxWorkers = 64
	// MaxQueueDepth bounds the requests waiting for a worker.
	MaxQueueDepth = 4096
	// MaxPutBatch bounds the blocks of one Batch or PutBatch.
	MaxPutBatch = 256
	// recordBytes is one journal record.
	recordBytes = 64
)

// Defaults.
const (
	DefaultFileBytes  = 1 << 30
	DefaultWorkers    = 4
	DefaultQueueDepth = 64
)

// Config describes a store.
type Config struct {
	// Dir holds the store's files; made if missing. Required.
	Dir string
	// Bytes is the store's capacity; rounded down to whole slots. Required.
	Bytes int64
	// SlotBytes is the room of one block: a multiple of Align, at most
	// MaxSlotBytes. Required.
	SlotBytes int
	// FileBytes is the size of each data file, rounded down to whole
	// slots (at least one). If zero, DefaultFileBytes; at most MaxFileBytes.
	FileBytes int64
	// Workers is how many reads and writes run at once. If zero,
	// DefaultWorkers; at most MaxWorkers. Writes wait for one of as many
	// worker goroutines; reads run on their callers' goroutines.
	Workers int
	// QueueDepth is how many requests may wait for a worker. If zero,
	// DefaultQueueDepth; at most MaxQueueDepth.
	QueueDepth int
	// Buffered opens the files without O_DIRECT, for file systems that
	// refuse it (tmpfs). If false, O_DIRECT.
	Buffered bool
	// Logger receives dropped blocks and replay figures. If nil,
	// slog.Default().
	Logger *slog.Logger

	// FailIO, if set, is asked before each read or write runs (write, and
	// whether it reads or writes the caller's memory straight rather than
	// a buffer of the store's) and fails it with the error it returns
	// instead of running it: for tests of how callers handle a disk that
	// fails, or O_DIRECT refusing their memory. If nil, every request runs.
	FailIO func(write, straight bool) error
}

// populate fills the defaults and validates (the one place that does).
func (c Config) populate() (Config, error) {
	bad := func(field string, format string, args ...any) (Config, error) {
		return c, fmt.Errorf("disk: %s %s: %w", field, fmt.Sprintf(format, args...), ErrInvalidConfig)
	}
	if c.Dir == "" {
		return bad("Dir", "is empty")
	}
	if c.SlotBytes <= 0 || c.SlotBytes%Align != 0 || c.SlotBytes > MaxSlotBytes {
		return bad("SlotBytes", "%d: want a multiple of %d up to %d", c.SlotBytes, Align, MaxSlotBytes)
	}
	if c.FileBytes == 0 {
		c.FileBytes = DefaultFileBytes
	}
	if c.FileBytes < 0 || c.FileBytes > MaxFileBytes {
		return bad("FileBytes", "%d: want 1..%d", c.FileBytes, int64(MaxFileBytes))
	}
	if c.FileBytes < int64(c.SlotBytes) {
		c.FileBytes = int64(c.SlotBytes)
	}
	c.FileBytes -= c.FileBytes % int64(c.SlotBytes)
	if c.Bytes < int64(c.SlotBytes) {
		return bad("Bytes", "%d: less than one slot of %d", c.Bytes, c.SlotBytes)
	}
	if slots := c.Bytes / int64(c.SlotBytes); slots > MaxSlots {
		return bad("Bytes", "%d in slots of %d: %d slots, at most %d", c.Bytes, c.SlotBytes, slots, MaxSlots)
	}
	if files := (c.Bytes + c.FileBytes - 1) / c.FileBytes; files > MaxFiles {
		return bad("Bytes", "%d in files of %d: %d files, at most %d", c.Bytes, c.FileBytes, files, MaxFiles)
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Workers < 0 || c.Workers > MaxWorkers {
		return bad("Workers", "%d: want 1..%d", c.Workers, MaxWorkers)
	}
	if c.QueueDepth == 0 {
		c.QueueDepth = DefaultQueueDepth
	}
	if c.QueueDepth < 0 || c.QueueDepth > MaxQueueDepth {
		return bad("QueueDepth", "%d: want 1..%d", c.QueueDepth, MaxQueueDepth)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// Key names a block: its sequence hash, and a tag the caller keeps beside
// it (which layout its bytes are in).
type Key struct {
	Hash, Tag uint64
}

type entry struct {
	slot   uint32
	length uint32
	sum    uint64
	// parent, where hasParent, is the hash of the block this one follows
	// in its sequence (Batch.SetParent), under the same tag; a Store keeps
	// it in the block's journal record.
	parent    uint64
	hasParent bool
}

// held is a committed copy's entry and its generation: a number no other
// copy in the store was given, so that a caller that read a copy can act
// on that copy only (DeleteIf), not on one committed under its key since.
type held struct {
	entry
	gen uint64
}

// journalled is a Store's copy: held, and the order of the journal
// record that last named it (its sequence number): its put's, or a link
// record's (SetParent) once written. Keys lists the blocks in its order.
// A MemStore keeps no journal, nor the order.
type journalled struct {
	held
	order uint64
}

// Store is a disk tier. Its methods may be called concurrently.
type Store struct {
	cfg      Config
	slots    int
	perFile  int
	files    []*os.File
	journal  *os.File
	jmu      sync.Mutex // held by whoever commits a group of records, and by compaction
	pmu      sync.Mutex // guards pending
	pending  []*waiter  // records waiting for the next group commit
	seq      uint64     // under jmu
	jrecords int        // records in the journal, under jmu
	// jerr, under jmu, is set once a failed journal write could not be
	// undone, or by Close (ErrClosed); every later commit returns it.
	jerr error
	// records is jrecords for Stats, which must not wait for jmu: a
	// commit holds it through its syncs, and the tier above picks a store
	// by its Stats before every put.
	records   atomic.Int64
	requests  chan request
	workersWG sync.WaitGroup
	// queue is read-held while a request is handed to the workers and
	// write-held by Close as it closes requests.
	queue       sync.RWMutex
	queueClosed bool
	// running holds a token for each read or write under way: workers'
	// and reads run on their callers' goroutines (readInline) alike.
	running chan struct{}
	bufs    chan *aligned

	mu      sync.Mutex
	closed  bool
	entries map[Key]journalled
	free    []uint32
	busy    map[uint32]int // slots being read: not reused until done
	// gen is the last generation given to a copy: as a commit's puts
	// enter the entries, and to each entry replayed at Open. Kept in
	// memory only, not journaled: a generation names a copy while the
	// store is open.
	gen uint64
	// links, under mu, are the keys whose parent SetParent set since the
	// last commit, each with the order it was set in (lastLink counts):
	// the next commit journals them.
	links    map[Key]uint64
	lastLink uint64
	// deletes, under mu, are the records of the deletes since the last
	// commit: the next commit journals them, before its own records.
	deletes []pendingRecord

	stats struct {
		puts, gets, deletes, corrupt, bytesWritten, bytesRead, commits, links atomic.Uint64
	}

	// beforeJournal, if set, is called by a commit between its data syncs
	// and its journal write (tests: a crash there). beforeDataSync, if
	// set, is called by a commit before its data syncs, with jmu held;
	// closingFiles by Close before it closes the files (tests: Close
	// beside a commit).
	beforeJournal, beforeDataSync, closingFiles func()
	// syncDir syncs the store's directory (tests: a failing one).
	syncDir func() error
	// dirUnsynced says that a compaction renamed the journal into place
	// and the directory's sync after it failed: a crash may still bring
	// the old journal back, so the next journal write syncs the directory
	// first and fails if it cannot. Under jmu.
	dirUnsynced bool
}

// Stats are a store's counters.
type Stats struct {
	Blocks, Slots                int
	Puts, Gets, Deletes, Corrupt uint64
	BytesWritten, BytesRead      uint64
	JournalRecords               int
	// Commits counts the journal's commits: each one journal write and
	// one journal sync, after a sync of every data file its records'
	// blocks were written to (none for deletes and link records alone:
	// Close's write of those left, a corrupt copy's delete), shared by the
	// puts (and a batch's blocks) in it.
	Commits uint64
	// Links counts the link records written since Open: one for each block
	// held whose parent SetParent set since the last commit (set again
	// before it, still one), written with the next commit or by Close. A
	// put's own record keeps the parent it gives and is not one; nor are
	// the records a compaction writes. A MemStore keeps no journal: none.
	Links uint64
}

// Open opens or creates the store in cfg.Dir, replays its journal and
// returns with every block a completed put left there.
func Open(cfg Config) (*Store, error) {
	cfg, err := cfg.populate()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("disk: %w", err)
	}
	s := &Store{
		cfg:      cfg,
		perFile:  int(cfg.FileBytes / int64(cfg.SlotBytes)),
		entries:  map[Key]journalled{},
		busy:     map[uint32]int{},
		requests: make(chan request, cfg.QueueDepth),
		running:  make(chan struct{}, cfg.Workers),
		bufs:     make(chan *aligned, cfg.Workers+cfg.QueueDepth),
	}
	s.slots = int(cfg.Bytes / int64(cfg.SlotBytes))
	nfiles := (s.slots + s.perFile - 1) / s.perFile
	for i := range nfiles {
		f, err := s.openData(i)
		if err != nil {
			s.closeFiles()
			return nil, err
		}
		s.files = append(s.files, f)
	}
	if err := s.replay(); err != nil {
		s.closeFiles()
		return nil, err
	}
	for range cfg.Workers {
		s.workersWG.Add(1)
		go s.worker()
	}
	return s, nil
}

func (s *Store) openData(i int) (*os.File, error) {
	flags := os.O_RDWR | os.O_CREATE
	if !s.cfg.Buffered {
		flags |= unix.O_DIRECT
	}
	path := filepath.Join(s.cfg.Dir, fmt.Sprintf("blocks.%03d", i))
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("disk: %s: the file system refuses O_DIRECT (set Buffered, or put the tier on a local disk): %w", path, err)
		}
		return nil, fmt.Errorf("disk: %w", err)
	}
	want := int64(s.perFile) * int64(s.cfg.SlotBytes)
	if last := (s.slots - 1) / s.perFile; i == last {
		want = int64(s.slots-i*s.perFile) * int64(s.cfg.SlotBytes)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, want); err != nil {
		f.Close()
		return nil, fmt.Errorf("disk: preallocate %d bytes of %s: %w", want, path, err)
	}
	return f, nil
}

func (s *Store) closeFiles() {
	for _, f := range s.files {
		f.Close()
	}
	if s.journal != nil {
		s.journal.Close()
	}
}

// where is the file and offset of slot.
func (s *Store) where(slot uint32) (*os.File, int64) {
	return s.files[int(slot)/s.perFile], int64(int(slot)%s.perFile) * int64(s.cfg.SlotBytes)
}

// Slots is the store's capacity in blocks.
func (s *Store) Slots() int { return s.slots }

// SlotBytes is the room of one block.
func (s *Store) SlotBytes() int { return s.cfg.SlotBytes }

// Has says whether the store holds a block under k: false once the store
// is closed, as Gen says and a closed MemStore's Has (its Close drops
// every block).
func (s *Store) Has(k Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	_, ok := s.entries[k]
	return ok
}

// Keys lists the blocks the store holds (after Open: those found again);
// after Close, those it held (unlike Has and Gen, which then report none).
// They come in the order of the journal records that last named them (a
// put's, or a link record's once written: SetParent), the last named
// last; after Open, as the journal has them.
func (s *Store) Keys() []Key {
	named := s.inOrder()
	out := make([]Key, len(named))
	for i, r := range named {
		out[i] = r.key
	}
	return out
}

// inOrder is a put record of each block the store holds, as held when
// called, its seq the order of the record that last named the block
// (journalled.order), sorted by it: Keys', and a compaction's (with seqs
// of its own then). Only the copy is made under s.mu, in one pass over the
// entries; the sort is not, so that the blocks' readers and writers, and
// the tiers above that call the store under their own lock, do not wait
// for the sort of a large store's blocks.
func (s *Store) inOrder() []record {
	s.mu.Lock()
	out := make([]record, 0, len(s.entries))
	for k, e := range s.entries {
		out = append(out, record{op: opPut, seq: e.order, key: k, e: e.entry})
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b record) int { return cmp.Compare(a.seq, b.seq) })
	return out
}

// Parent is the parent kept with the block under k (Batch.SetParent,
// SetParent), if the store holds k and its put, or a SetParent since,
// gave one: after Open, as its journal records have it.
func (s *Store) Parent(k Key) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	return e.parent, ok && e.hasParent
}

// SetParent keeps parent with the block the store holds under k, as
// Batch.SetParent does at a put: Parent returns it from now on, and a link
// record of it is journalled with the next commit (a put's, a corrupt
// copy's delete, or Close's), sharing its write and sync; SetParent itself
// neither writes nor waits. A crash before that commit loses it (the block
// keeps the parent it had). Once written, its record is the last to name
// k, for Keys' order. False, and nothing kept, where the store holds no
// block under k or is closed. Setting k's parent again before the commit
// leaves one record, in the order of the last. A SetParent racing a put of
// k (Put, PutBatch, a Batch's Commit) may land on the copy the put
// replaces, as if it came first: it returns true, and the put's copy keeps
// the parent the put gave it (none where it gave none), journal and memory
// alike.
func (s *Store) SetParent(k Key, parent uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	if s.closed || !ok {
		return false
	}
	e.parent, e.hasParent = parent, true
	s.entries[k] = e
	if s.links == nil {
		s.links = map[Key]uint64{}
	}
	s.lastLink++
	s.links[k] = s.lastLink
	return true
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	blocks := len(s.entries)
	s.mu.Unlock()
	records := int(s.records.Load())
	return Stats{
		Blocks: blocks, Slots: s.slots,
		Puts: s.stats.puts.Load(), Gets: s.stats.gets.Load(), Deletes: s.stats.deletes.Load(),
		Corrupt: s.stats.corrupt.Load(), BytesWritten: s.stats.bytesWritten.Load(), BytesRead: s.stats.bytesRead.Load(),
		JournalRecords: records, Commits: s.stats.commits.Load(), Links: s.stats.links.Load(),
	}
}

// Put writes data under k. It returns when the block is durable: its bytes
// synced and its journal record synced. A key already held is replaced.
// With every slot full, ErrFull: the tier above evicts instead. Data
// aligned to Align with the capacity for its length rounded up to Align is
// written directly, the bytes past its length up to there zeroed first;
// any other through a buffer and a copy.
func (s *Store) Put(ctx context.Context, k Key, data []byte) error {
	return s.PutBatch(ctx, []PutItem{{Key: k, Data: data}})[0]
}

// PutItem is one block of a PutBatch.
type PutItem struct {
	Key  Key
	Data []byte
	// Parent, where HasParent, is kept with the block (Batch.SetParent).
	Parent    uint64
	HasParent bool
}

// PutBatch puts every item as Put does, in one Batch: their writes under
// way together on the workers, made durable together with one data sync
// per data file written and one journal write and sync for the lot. It
// returns each item's error (Batch.Commit): as in a Batch, the items past
// MaxPutBatch fail alone with ErrTooLarge and the others are put.
func (s *Store) PutBatch(ctx context.Context, items []PutItem) []error {
	b := s.NewBatch()
	for i, it := range items {
		b.Add(ctx, it.Key, it.Data)
		if it.HasParent {
			b.SetParent(i, it.Parent)
		}
	}
	return b.Commit()
}

// Batch is puts made durable together, where puts one by one each pay a
// data sync and a journal sync that only puts committing at the same time
// share: Add starts a block's write at once (so that a caller preparing
// the next block overlaps the writes), Commit waits for the writes and
// commits every block written in one go. An item may fail alone (ErrFull
// once the free slots ran out, ErrTooLarge, its write); the others are
// still put. Before Commit, Wait waits for one item's write, and Replace
// writes other bytes in its place or Drop takes it out: for a caller that
// wrote from memory that may have changed under the write. After a crash
// a block is in the store exactly when its record is, and the records
// reach the journal only after their bytes were synced: a batch cut short
// leaves whole blocks or none of them, never a record naming bytes that
// are not there. A Batch is used by one goroutine; Commit ends it, and a
// Batch never committed keeps its slots.
type Batch struct {
	s     *Store
	items []batchItem
	bufs  []*aligned
}

type batchItem struct {
	key Key
	e   entry
	// sent: a write of the item's was started into slot e.slot, which is
	// the item's until Commit (or Drop); done is that write's answer until
	// waited for (wait), then nil with err its error.
	sent bool
	done chan error
	err  error // with !sent, why the item is not put
}

// NewBatch starts a batch of puts.
func (s *Store) NewBatch() *Batch { return &Batch{s: s} }

// Len is how many blocks were added.
func (b *Batch) Len() int { return len(b.items) }

// Add starts the write of data under k: data, and the capacity past its
// length up to Align where it is written straight from there (see Put),
// must not change until Commit returns. Waiting for room in the workers'
// queue honours ctx. An item past MaxPutBatch fails with ErrTooLarge.
// Errors are Commit's, at the item's index.
func (b *Batch) Add(ctx context.Context, k Key, data []byte) {
	b.AddPieces(ctx, k, data)
}

// AddPieces is Add of one block made of pieces, in order: written
// straight from them in one vectored write where every piece starts at an
// address aligned to Align and every piece but the last is a multiple of
// Align long (the last with the capacity to its length rounded up to
// Align, zeroed past its length first, as Add does), else through a buffer
// and a copy. The block's checksum is of the pieces' bytes, taken while
// the write is under way: a caller whose pieces may change before the
// write ends must check, after Wait, that they did not, and else Replace
// or Drop the item.
func (b *Batch) AddPieces(ctx context.Context, k Key, pieces ...[]byte) {
	s := b.s
	it := batchItem{key: k}
	defer func() { b.items = append(b.items, it) }()
	if len(b.items) >= MaxPutBatch {
		it.err = fmt.Errorf("disk: a batch of more than %d blocks: %w", MaxPutBatch, ErrTooLarge)
		return
	}
	n := 0
	for _, p := range pieces {
		n += len(p)
	}
	if n == 0 || n > s.cfg.SlotBytes {
		it.err = fmt.Errorf("disk: a block of %d bytes in slots of %d: %w", n, s.cfg.SlotBytes, ErrTooLarge)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		it.err = ErrClosed
		return
	}
	if len(s.free) == 0 {
		s.mu.Unlock()
		it.err = fmt.Errorf("disk: %d slots hold blocks: %w", s.slots, ErrFull)
		return
	}
	it.e.slot = s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.mu.Unlock()
	if err := b.start(ctx, &it, pieces, n); err != nil {
		it.err = err
		s.giveBack(it.e.slot)
	}
}

// start sends the write of pieces (n bytes in all) into it's slot and
// takes their checksum while it is under way.
func (b *Batch) start(ctx context.Context, it *batchItem, pieces [][]byte, n int) error {
	s := b.s
	f, off := s.where(it.e.slot)
	r := request{write: true, f: f, off: off, done: make(chan error, 1), fail: s.cfg.FailIO}
	if vec, ok := straight(pieces, n, true); ok {
		r.straight = true
		if len(vec) == 1 {
			r.buf = vec[0]
		} else {
			r.vec = vec
		}
	} else {
		buf, err := s.bufferWith(pieces...)
		if err != nil {
			return err
		}
		b.bufs = append(b.bufs, buf)
		r.buf = buf.b[:roundUp(n)]
	}
	if err := s.send(ctx, r); err != nil {
		return err
	}
	it.sent, it.done, it.err = true, r.done, nil
	it.e.length, it.e.sum = uint32(n), sumOf(pieces)
	return nil
}

// straight is pieces as O_DIRECT takes them with no copy, the last
// extended to Align (and, with zero, zeroed past its length, for a
// write), or false.
func straight(pieces [][]byte, n int, zero bool) ([][]byte, bool) {
	for i, p := range pieces {
		if len(p) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(p)))%Align != 0 {
			return nil, false
		}
		if i < len(pieces)-1 && len(p)%Align != 0 {
			return nil, false
		}
	}
	last := pieces[len(pieces)-1]
	if cap(last) < roundUp(len(last)) {
		return nil, false
	}
	vec := append([][]byte(nil), pieces...)
	ext := last[:roundUp(len(last))]
	if zero {
		clear(ext[len(last):])
	}
	vec[len(vec)-1] = ext
	return vec, true
}

// sumOf is the checksum of pieces' bytes in order.
func sumOf(pieces [][]byte) uint64 {
	if len(pieces) == 1 {
		return xxh3.Hash(pieces[0])
	}
	h := xxh3.New()
	for _, p := range pieces {
		h.Write(p)
	}
	return h.Sum64()
}

// wait waits for it's write, once, and returns its error.
func (b *Batch) wait(it *batchItem) error {
	if it.done != nil {
		it.err = <-it.done
		it.done = nil
	}
	return it.err
}

// SetParent keeps parent with item i's block (in the order added; i <
// Len(), as for Wait, Replace and Drop): the hash of the block it follows
// in its sequence, under the same Tag, which Parent returns for as long
// as the store holds the block (until SetParent sets another), after a
// restart too (the block's journal record holds it). Before Commit; an item that is not put keeps nothing.
func (b *Batch) SetParent(i int, parent uint64) {
	b.items[i].e.parent, b.items[i].e.hasParent = parent, true
}

// Wait waits for the write of item i (in the order added) to end and
// returns its error, nil once its bytes are written; for an item that was
// never written, why not (Add's error: ErrFull, ErrTooLarge, ErrClosed, a
// ctx that ended while it waited for the queue; ErrDropped after Drop).
func (b *Batch) Wait(i int) error {
	it := &b.items[i]
	if !it.sent {
		return it.err
	}
	return b.wait(it)
}

// Replace writes data in place of item i's bytes, into the same slot,
// once its first write ended, and records data's checksum instead: for a
// caller whose first write's memory changed while it was under way. data
// follows Add's rules; the parent given (SetParent) is kept. An item not
// written is left as it is (false).
func (b *Batch) Replace(ctx context.Context, i int, data []byte) bool {
	it := &b.items[i]
	if !it.sent {
		return false
	}
	b.wait(it)
	if len(data) == 0 || len(data) > b.s.cfg.SlotBytes {
		b.Drop(i)
		it.err = fmt.Errorf("disk: a block of %d bytes in slots of %d: %w", len(data), b.s.cfg.SlotBytes, ErrTooLarge)
		return true
	}
	if err := b.start(ctx, it, [][]byte{data}, len(data)); err != nil {
		b.s.giveBack(it.e.slot)
		it.sent, it.err = false, err
	}
	return true
}

// Drop takes item i out of the batch (its write waited for, its slot
// freed): Commit returns ErrDropped for it and journals nothing of it.
func (b *Batch) Drop(i int) {
	it := &b.items[i]
	if it.sent {
		b.wait(it)
		b.s.giveBack(it.e.slot)
		it.sent = false
	}
	it.err = ErrDropped
}

// Commit waits for the batch's writes and makes the blocks written
// durable: one sync of each data file written, then their records in one
// journal write and one journal sync (shared with puts committing at the
// same time). It returns each item's error in the order added, nil once
// the block is durable; a key already held is replaced.
func (b *Batch) Commit() []error {
	s := b.s
	defer func() {
		for _, buf := range b.bufs {
			s.release(buf)
		}
		b.bufs = nil
	}()
	errs := make([]error, len(b.items))
	recs := make([]pendingRecord, 0, len(b.items))
	at := make([]int, 0, len(b.items)) // recs[j] is item at[j]'s
	for i := range b.items {
		it := &b.items[i]
		if !it.sent {
			errs[i] = it.err
			continue
		}
		if err := b.wait(it); err != nil {
			errs[i] = err
			s.giveBack(it.e.slot)
			continue
		}
		f, _ := s.where(it.e.slot)
		recs = append(recs, pendingRecord{op: opPut, key: it.key, e: it.e, dirty: f})
		at = append(at, i)
	}
	if len(recs) == 0 {
		return errs
	}
	if err := s.appendRecords(recs); err != nil {
		for j, r := range recs {
			errs[at[j]] = err
			s.giveBack(r.e.slot)
		}
		return errs
	}
	// The commit put the blocks in the entries (and freed the slots of
	// blocks they replaced).
	var bytes uint64
	for _, r := range recs {
		bytes += uint64(r.e.length)
	}
	s.stats.puts.Add(uint64(len(recs)))
	s.stats.bytesWritten.Add(bytes)
	return errs
}

// Free is how many slots no block holds nor a put under way has taken.
func (s *Store) Free() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.free)
}

// giveBack frees a slot taken for a put that failed.
func (s *Store) giveBack(slot uint32) {
	s.mu.Lock()
	s.free = append(s.free, slot)
	s.mu.Unlock()
}

// Get reads the block under k into dst and returns its length. Bytes that
// do not match the block's checksum are never returned: the block is
// dropped and ErrCorrupt returned (dst may then hold some of them). A dst
// aligned to Align and at least the block's length rounded up to Align
// long is read into directly (its bytes past the block's length up to
// there are overwritten); any other through a buffer and a copy. Nothing
// past len(dst) is written, whatever its capacity.
func (s *Store) Get(ctx context.Context, k Key, dst []byte) (int, error) {
	return s.GetPieces(ctx, k, dst[:len(dst):len(dst)])
}

// GetPieces is Get into pieces, filled in order up to the block's length
// (no longer than theirs together): read into directly, with one vectored
// read, where the pieces it fills are aligned as AddPieces writes them
// straight (the last it fills with room to its end rounded up to Align,
// which the read overwrites); else through a buffer and a copy. On an
// error the pieces may hold some of the block's bytes, or others.
func (s *Store) GetPieces(ctx context.Context, k Key, pieces ...[]byte) (int, error) {
	n, _, err := s.GetPiecesGen(ctx, k, pieces...)
	return n, err
}

// GetGen is Get that also returns the generation of the copy read: each
// put of a block (a key put again included) makes a new one, and so does
// each block found again at Open. DeleteIf with it deletes that copy and
// no later one. The generation of a copy that did not fit dst
// (ErrTooLarge) or failed its checksum (ErrCorrupt, dropped) is returned
// with the error; 0 (no copy's) with any other.
func (s *Store) GetGen(ctx context.Context, k Key, dst []byte) (int, uint64, error) {
	return s.GetPiecesGen(ctx, k, dst[:len(dst):len(dst)])
}

// GetPiecesGen is GetPieces that returns the generation of the copy read,
// as GetGen does.
func (s *Store) GetPiecesGen(ctx context.Context, k Key, pieces ...[]byte) (int, uint64, error) {
	total := 0
	for _, p := range pieces {
		total += len(p)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return 0, 0, ErrClosed
	}
	e, ok := s.entries[k]
	if !ok {
		s.mu.Unlock()
		return 0, 0, fmt.Errorf("disk: block %016x: %w", k.Hash, ErrNotFound)
	}
	if int(e.length) > total {
		s.mu.Unlock()
		return 0, e.gen, fmt.Errorf("disk: block %016x of %d bytes into %d: %w", k.Hash, e.length, total, ErrTooLarge)
	}
	s.busy[e.slot]++
	s.mu.Unlock()
	defer s.doneReading(e.slot)
	// The pieces that the block fills, the last cut to its end.
	want := int(e.length)
	fill := make([][]byte, 0, len(pieces))
	for _, p := range pieces {
		if want == 0 {
			break
		}
		m := min(len(p), want)
		fill = append(fill, p[:m])
		want -= m
	}
	// Straight into them where O_DIRECT takes them (pool memory is page
	// aligned); else through an aligned buffer and a copy.
	f, off := s.where(e.slot)
	r := request{f: f, off: off, fail: s.cfg.FailIO}
	got := fill
	if vec, ok := straight(fill, int(e.length), false); ok {
		r.straight = true
		if len(vec) == 1 {
			r.buf = vec[0]
		} else {
			r.vec = vec
		}
	} else {
		buf, err := s.buffer()
		if err != nil {
			return 0, 0, err
		}
		defer s.release(buf)
		r.buf = buf.b[:roundUp(int(e.length))]
		got = [][]byte{buf.b[:e.length]}
	}
	if err := s.readInline(ctx, r); err != nil {
		return 0, 0, err
	}
	if sumOf(got) != e.sum {
		s.stats.corrupt.Add(1)
		s.cfg.Logger.Warn("disk tier block failed its checksum: dropped", "hash", fmt.Sprintf("%016x", k.Hash),
			"slot", e.slot, "dir", s.cfg.Dir)
		if s.drop(k, e) { // the copy read only: its slot, busy, is not reused meanwhile
			s.commitDeletes()
		}
		return 0, e.gen, fmt.Errorf("disk: block %016x in slot %d: %w", k.Hash, e.slot, ErrCorrupt)
	}
	s.stats.gets.Add(1)
	s.stats.bytesRead.Add(uint64(e.length))
	if len(got) == 1 && len(fill) > 0 && unsafe.SliceData(got[0]) != unsafe.SliceData(fill[0]) {
		src := got[0] // read through the buffer
		for _, p := range fill {
			src = src[copy(p, src):]
		}
	}
	return int(e.length), e.gen, nil
}

// Delete removes the block under k; its slot is reused once no read holds
// it. Its record is written with the next commit (drop). ErrClosed where
// the store closed first.
func (s *Store) Delete(k Key) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	e, ok := s.entries[k]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("disk: block %016x: %w", k.Hash, ErrNotFound)
	}
	if !s.drop(k, e) && s.isClosed() {
		return ErrClosed // closed meanwhile: its record would be written by nothing
	}
	s.stats.deletes.Add(1)
	return nil
}

// isClosed says whether Close has begun.
func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// commitDeletes commits the deletes' records left for the next commit now,
// with a journal sync: for a copy dropped as corrupt, so that a crash does
// not bring it back to be chosen over a good copy of the block committed
// since elsewhere (a tier below, which the agent drops at Open as a second
// copy). A failure is logged: the record waits for the next commit.
func (s *Store) commitDeletes() {
	if err := s.appendRecords(nil); err != nil {
		s.cfg.Logger.Warn("disk tier: journal the delete of a corrupt copy", "err", err)
	}
}

// DeleteIf removes the block under k if it is still the copy of
// generation gen (GetGen): a copy put since is kept. ErrNotFound if k is
// not held, or held in another generation. For a copy found corrupt (the
// caller's own checks), its record is committed before it returns
// (commitDeletes), not left for the next commit.
func (s *Store) DeleteIf(k Key, gen uint64) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	e, ok := s.entries[k]
	s.mu.Unlock()
	if !ok || e.gen != gen || !s.drop(k, e) {
		if s.isClosed() {
			return ErrClosed
		}
		return fmt.Errorf("disk: block %016x of generation %d: %w", k.Hash, gen, ErrNotFound)
	}
	s.stats.deletes.Add(1)
	s.commitDeletes()
	return nil
}

// Gen is the generation of the copy the store holds under k (GetGen),
// never 0 (generations count from 1); false if it holds none, or is
// closed: a closed store's copies are none to act on, as a closed
// MemStore's are.
func (s *Store) Gen(k Key) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, false
	}
	e, ok := s.entries[k]
	return e.gen, ok
}

// drop deletes k if it still names e, the copy of e's generation, and
// frees its slot; false if it does not. Its record is left for the next
// commit (a put's, or Close's), which writes it before its own records,
// so that it reaches the journal before, or with, the record of any put
// that reuses the slot; until then a crash leaves the block in the store,
// whole, or, where a put wrote the slot since and did not commit, with
// bytes its checksum refuses (dropped at its first read). Deletes wait for
// no journal sync: a tier evicting for a batch of copies down took one
// each. The record names the block without its parent, as a journal
// written before parents were kept does.
func (s *Store) drop(k Key, e journalled) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.entries[k]
	if s.closed || !ok || cur.gen != e.gen {
		return false // closed: Close's flush may have been, and nothing would write the record
	}
	delete(s.entries, k)
	del := entry{slot: e.slot, length: e.length, sum: e.sum}
	s.deletes = append(s.deletes, pendingRecord{op: opDelete, key: k, e: del})
	s.releaseSlotLocked(e.slot)
	return true
}

func (s *Store) releaseSlotLocked(slot uint32) {
	if s.busy[slot] > 0 {
		s.busy[slot] = -s.busy[slot] // freed when the last read ends
		return
	}
	s.free = append(s.free, slot)
}

func (s *Store) doneReading(slot uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.busy[slot]
	switch {
	case n > 1:
		s.busy[slot] = n - 1
	case n == 1:
		delete(s.busy, slot)
	case n == -1:
		delete(s.busy, slot)
		s.free = append(s.free, slot)
	case n < -1:
		s.busy[slot] = n + 1
	}
}

// Close waits for the requests in flight and closes the files. Safe twice.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.queue.Lock()
	s.queueClosed = true
	close(s.requests)
	s.queue.Unlock()
	s.workersWG.Wait()
	for {
		select {
		case a := <-s.bufs:
			unix.Munmap(a.b)
			continue
		default:
		}
		break
	}
	// The files are closed under jmu: a commit under way (a caller's
	// put, which Close does not wait for otherwise) syncs them by their
	// descriptors, and one after this finds the store closed.
	s.jmu.Lock()
	defer s.jmu.Unlock()
	if f := s.closingFiles; f != nil {
		f()
	}
	errs := []error{s.flushPendingLocked()}
	for _, f := range s.files {
		errs = append(errs, f.Close())
	}
	errs = append(errs, s.journal.Close())
	if s.jerr == nil {
		s.jerr = ErrClosed
	}
	return errors.Join(errs...)
}

func roundUp(n int) int { return (n + Align - 1) &^ (Align - 1) }
