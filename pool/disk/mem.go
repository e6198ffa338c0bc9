package disk

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"
)

// A MemStore is a host-memory tier: blocks under the same keys as a
// Store, in slots of one region of host memory, each with the xxh3 of its
// bytes, checked on every read (a block whose bytes changed is dropped,
// never returned). It is not persistent: an agent that restarts finds
// only its disk stores' blocks again. Its methods and its batches behave
// as a Store's do (the same sentinels, a key already held replaced, a
// slot being read not reused until the read ends), without a journal:
// a block is in the store once its put or its batch's Commit returns.
// It keeps no order of its blocks' use: which block to move or drop when
// it is full is its caller's choice (a Store does not choose either).
type MemStore struct {
	cfg   MemConfig
	slots int
	arena []byte
	// mapped: arena is the store's own anonymous mapping, outside the Go
	// heap (a tier of many GiB there would let the garbage collector let
	// as much garbage grow before it ran), unmapped by Close once the
	// copies in and out under way (using) ended.
	mapped bool
	using  sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	entries map[Key]held
	gen     uint64 // the last generation given to a copy, as a Store's
	// free is the slots freed since they were first used; fresh the
	// first never used (slots from fresh on are free too): a store of
	// millions of slots starts with no list to build.
	free  []uint32
	fresh uint32
	busy  map[uint32]int // slots being read: not reused until done

	stats struct {
		puts, gets, deletes, corrupt, bytesWritten, bytesRead atomic.Uint64
	}
}

// MemConfig describes a MemStore.
type MemConfig struct {
	// Bytes is the store's capacity; rounded down to whole slots.
	// Required: at least one slot, at most MaxMemBytes.
	Bytes int64
	// SlotBytes is the room of one block, a multiple of Align up to
	// MaxSlotBytes. Required.
	SlotBytes int
	// Memory, if set, is the store's memory (at least Bytes rounded down
	// to whole slots; pinned host memory, say): its bytes are the
	// store's until Close. Zero: an anonymous mapping of the store's own,
	// its pages touched as slots are first used.
	Memory []byte
}

// MaxMemBytes bounds one MemStore.
const MaxMemBytes = 1 << 40

// NewMem makes an empty MemStore.
func NewMem(cfg MemConfig) (*MemStore, error) {
	switch {
	case cfg.SlotBytes <= 0 || cfg.SlotBytes%Align != 0 || cfg.SlotBytes > MaxSlotBytes:
		return nil, fmt.Errorf("%w: slot bytes %d is not a multiple of %d up to %d", ErrInvalidConfig, cfg.SlotBytes, Align, MaxSlotBytes)
	case cfg.Bytes < int64(cfg.SlotBytes) || cfg.Bytes > MaxMemBytes:
		return nil, fmt.Errorf("%w: bytes %d is not in %d (one slot)..%d", ErrInvalidConfig, cfg.Bytes, cfg.SlotBytes, int64(MaxMemBytes))
	}
	slots := int(cfg.Bytes / int64(cfg.SlotBytes))
	s := &MemStore{cfg: cfg, slots: slots, entries: map[Key]held{}, busy: map[uint32]int{}}
	need := slots * cfg.SlotBytes
	switch {
	case cfg.Memory == nil:
		m, err := unix.Mmap(-1, 0, need, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			return nil, fmt.Errorf("disk: host memory of %d bytes: %w", need, err)
		}
		s.arena, s.mapped = m, true
	case len(cfg.Memory) < need:
		return nil, fmt.Errorf("%w: memory of %d bytes for %d slots of %d", ErrInvalidConfig, len(cfg.Memory), slots, cfg.SlotBytes)
	default:
		s.arena = cfg.Memory[:need:need]
	}
	return s, nil // slots handed out as they are first needed (take)
}

func (s *MemStore) slot(n uint32) []byte {
	off := int(n) * s.cfg.SlotBytes
	return s.arena[off : off+s.cfg.SlotBytes : off+s.cfg.SlotBytes]
}

// Slots is the store's capacity in blocks.
func (s *MemStore) Slots() int { return s.slots }

// SlotBytes is the room of one block.
func (s *MemStore) SlotBytes() int { return s.cfg.SlotBytes }

// Has says whether the store holds a block under k.
func (s *MemStore) Has(k Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.entries[k]
	return ok
}

// Keys lists the blocks the store holds.
func (s *MemStore) Keys() []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Key, 0, len(s.entries))
	for k := range s.entries {
		out = append(out, k)
	}
	return out
}

// Parent is the parent kept with the block under k (MemBatch.SetParent,
// SetParent), if the store holds k and its put, or a SetParent since,
// gave one. The host tier's puts give
// one as a disk tier's do, through the batch interface both stores share
// (the fabric's tierPuts), but nothing reads it back but tests: a block
// moved down takes its parent from the tiers' links, not from here.
func (s *MemStore) Parent(k Key) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	return e.parent, ok && e.hasParent
}

// SetParent keeps parent with the block the store holds under k, as
// Store.SetParent does (in memory only): Parent returns it from now on.
// False, and nothing kept, where the store holds no block under k or is
// closed.
func (s *MemStore) SetParent(k Key, parent uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	if s.closed || !ok {
		return false
	}
	e.parent, e.hasParent = parent, true
	s.entries[k] = e
	return true
}

// Stats returns the store's counters (no journal: JournalRecords and
// Commits stay 0).
func (s *MemStore) Stats() Stats {
	s.mu.Lock()
	blocks := len(s.entries)
	s.mu.Unlock()
	return Stats{
		Blocks: blocks, Slots: s.slots,
		Puts: s.stats.puts.Load(), Gets: s.stats.gets.Load(), Deletes: s.stats.deletes.Load(),
		Corrupt: s.stats.corrupt.Load(), BytesWritten: s.stats.bytesWritten.Load(), BytesRead: s.stats.bytesRead.Load(),
	}
}

// Free is how many slots no block holds nor a put under way has taken.
func (s *MemStore) Free() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.free) + s.slots - int(s.fresh)
}

// Put copies data in under k; ErrFull with every slot taken.
func (s *MemStore) Put(ctx context.Context, k Key, data []byte) error {
	return s.PutBatch(ctx, []PutItem{{Key: k, Data: data}})[0]
}

// PutBatch puts every item as Put does and returns each one's error.
func (s *MemStore) PutBatch(ctx context.Context, items []PutItem) []error {
	b := s.NewBatch()
	for i, it := range items {
		b.Add(ctx, it.Key, it.Data)
		if it.HasParent {
			b.SetParent(i, it.Parent)
		}
	}
	return b.Commit()
}

// take takes a free slot.
func (s *MemStore) take() (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	if len(s.free) == 0 {
		if int(s.fresh) < s.slots {
			s.fresh++
			return s.fresh - 1, nil
		}
		return 0, fmt.Errorf("disk: host memory tier of %d slots: %w", s.slots, ErrFull)
	}
	n := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	return n, nil
}

func (s *MemStore) giveBack(slot uint32) {
	s.mu.Lock()
	s.releaseSlotLocked(slot)
	s.mu.Unlock()
}

func (s *MemStore) releaseSlotLocked(slot uint32) {
	if s.busy[slot] > 0 {
		s.busy[slot] = -s.busy[slot] // freed when the last read ends
		return
	}
	s.free = append(s.free, slot)
}

func (s *MemStore) doneReading(slot uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch n := s.busy[slot]; {
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

// Get copies the block under k into dst and returns its length; bytes
// that do not match the block's checksum are never returned: the block is
// dropped and ErrCorrupt returned.
func (s *MemStore) Get(ctx context.Context, k Key, dst []byte) (int, error) {
	return s.GetPieces(ctx, k, dst)
}

// GetPieces is Get into pieces, filled in order up to the block's length.
// The bytes are checked as they are copied out: on an error the pieces
// may hold some of them.
func (s *MemStore) GetPieces(ctx context.Context, k Key, pieces ...[]byte) (int, error) {
	n, _, err := s.getPieces(k, pieces)
	return n, err
}

// GetGen is Get that also returns the generation of the copy read: each
// put of a block (a key put again included) makes a new one. DeleteIf
// with it deletes that copy and no later one. The generation of a copy
// that did not fit dst (ErrTooLarge) or failed its checksum (ErrCorrupt,
// dropped) is returned with the error; 0 (no copy's) with any other.
func (s *MemStore) GetGen(ctx context.Context, k Key, dst []byte) (int, uint64, error) {
	return s.getPieces(k, [][]byte{dst})
}

// GetPiecesGen is GetPieces that returns the generation of the copy read,
// as GetGen does.
func (s *MemStore) GetPiecesGen(ctx context.Context, k Key, pieces ...[]byte) (int, uint64, error) {
	return s.getPieces(k, pieces)
}

// Gen is the generation of the copy the store holds under k (GetGen),
// never 0 (generations count from 1); false if it holds none, or is
// closed (Close drops every block).
func (s *MemStore) Gen(k Key) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	return e.gen, ok
}

func (s *MemStore) getPieces(k Key, pieces [][]byte) (int, uint64, error) {
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
	s.using.Add(1)
	defer s.using.Done()
	s.mu.Unlock()
	defer s.doneReading(e.slot)
	src := s.slot(e.slot)[:e.length]
	h := xxh3.New()
	for _, p := range pieces {
		if len(src) == 0 {
			break
		}
		n := copy(p, src)
		h.Write(p[:n])
		src = src[n:]
	}
	s.stats.gets.Add(1)
	if h.Sum64() != e.sum {
		s.stats.corrupt.Add(1)
		s.drop(k, e) // the copy read only
		return 0, e.gen, fmt.Errorf("disk: block %016x in host memory does not match its checksum: %w", k.Hash, ErrCorrupt)
	}
	s.stats.bytesRead.Add(uint64(e.length))
	return int(e.length), e.gen, nil
}

// Delete removes the block under k; its slot is reused once no read holds it.
func (s *MemStore) Delete(k Key) error {
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
	s.drop(k, e)
	s.stats.deletes.Add(1)
	return nil
}

// DeleteIf removes the block under k if it is still the copy of
// generation gen (GetGen): a copy put since is kept. ErrNotFound if k is
// not held, or held in another generation.
func (s *MemStore) DeleteIf(k Key, gen uint64) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	e, ok := s.entries[k]
	s.mu.Unlock()
	if !ok || e.gen != gen || !s.drop(k, e) {
		return fmt.Errorf("disk: block %016x of generation %d: %w", k.Hash, gen, ErrNotFound)
	}
	s.stats.deletes.Add(1)
	return nil
}

// drop removes k if it still names e, the copy of e's generation, and
// frees its slot; false if it does not.
func (s *MemStore) drop(k Key, e held) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.entries[k]; !ok || cur.gen != e.gen {
		return false
	}
	delete(s.entries, k)
	s.releaseSlotLocked(e.slot)
	return true
}

// Close drops every block and, once the copies in and out under way
// ended, gives its memory back. Safe twice.
func (s *MemStore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.entries = map[Key]held{}
	s.mu.Unlock()
	s.using.Wait()
	if s.mapped {
		return unix.Munmap(s.arena)
	}
	return nil
}

// CorruptForTest flips the bits of mask in byte at of the block under k,
// as memory going bad would: for tests of the check on read. False if
// there is no such block or byte.
func (s *MemStore) CorruptForTest(k Key, at int, mask byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[k]
	if s.closed || !ok || at < 0 || at >= int(e.length) {
		return false
	}
	s.slot(e.slot)[at] ^= mask
	return true
}

// MemBatch is a MemStore's Batch: each block copied in as it is added
// (into a slot of its own, taken then), the lot entering the store at
// Commit. Used by one goroutine; Commit ends it.
type MemBatch struct {
	s     *MemStore
	items []memItem
}

type memItem struct {
	key  Key
	e    entry
	sent bool  // copied into slot e.slot, which is the item's until Commit or Drop
	err  error // with !sent, why the item is not put
}

// NewBatch starts a batch of puts.
func (s *MemStore) NewBatch() *MemBatch { return &MemBatch{s: s} }

// Len is how many blocks were added.
func (b *MemBatch) Len() int { return len(b.items) }

// Add copies data in under k (once Commit returns). Errors are Commit's,
// at the item's index: ErrFull once the free slots ran out, ErrTooLarge
// for a block larger than a slot or past MaxPutBatch.
func (b *MemBatch) Add(ctx context.Context, k Key, data []byte) { b.AddPieces(ctx, k, data) }

// AddPieces is Add of one block made of pieces, in order. The block's
// checksum is of the bytes copied: a caller whose pieces may have changed
// while they were copied checks, after Wait, that they did not, and else
// Replace or Drop the item.
func (b *MemBatch) AddPieces(ctx context.Context, k Key, pieces ...[]byte) {
	it := memItem{key: k}
	defer func() { b.items = append(b.items, it) }()
	if len(b.items) >= MaxPutBatch {
		it.err = fmt.Errorf("disk: a batch of more than %d blocks: %w", MaxPutBatch, ErrTooLarge)
		return
	}
	n := 0
	for _, p := range pieces {
		n += len(p)
	}
	if n == 0 || n > b.s.cfg.SlotBytes {
		it.err = fmt.Errorf("disk: a block of %d bytes in slots of %d: %w", n, b.s.cfg.SlotBytes, ErrTooLarge)
		return
	}
	if err := ctx.Err(); err != nil {
		it.err = err
		return
	}
	slot, err := b.s.take()
	if err != nil {
		it.err = err
		return
	}
	if it.e, err = b.s.fill(slot, pieces, n); err != nil {
		it.err = err
		return
	}
	it.sent = true
}

// fill copies pieces into slot and returns the entry naming them;
// ErrClosed once the store is closed.
func (s *MemStore) fill(slot uint32, pieces [][]byte, n int) (entry, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return entry{}, ErrClosed
	}
	s.using.Add(1)
	s.mu.Unlock()
	defer s.using.Done()
	dst := s.slot(slot)
	h := xxh3.New()
	at := 0
	for _, p := range pieces {
		copy(dst[at:], p)
		h.Write(dst[at : at+len(p)]) // the bytes kept, whatever p does next
		at += len(p)
	}
	return entry{slot: slot, length: uint32(n), sum: h.Sum64()}, nil
}

// SetParent keeps parent with item i's block (i < Len()), as
// Batch.SetParent does (in memory only). Before Commit.
func (b *MemBatch) SetParent(i int, parent uint64) {
	b.items[i].e.parent, b.items[i].e.hasParent = parent, true
}

// Wait returns item i's copy's error as Batch.Wait returns its write's:
// nil once its bytes are copied (a copy in memory ends as it is added, so
// Wait never waits); for an item never copied, why not (Add's error:
// ErrFull, ErrTooLarge, ErrClosed, a ctx that had ended; ErrDropped after
// Drop).
func (b *MemBatch) Wait(i int) error {
	if it := &b.items[i]; !it.sent {
		return it.err
	}
	return nil
}

// Replace copies data in place of item i's bytes and records data's
// checksum instead. An item not copied is left as it is (false).
func (b *MemBatch) Replace(ctx context.Context, i int, data []byte) bool {
	it := &b.items[i]
	if !it.sent {
		return false
	}
	if len(data) == 0 || len(data) > b.s.cfg.SlotBytes {
		b.Drop(i)
		it.err = fmt.Errorf("disk: a block of %d bytes in slots of %d: %w", len(data), b.s.cfg.SlotBytes, ErrTooLarge)
		return true
	}
	e, err := b.s.fill(it.e.slot, [][]byte{data}, len(data))
	if err != nil {
		b.Drop(i)
		it.err = err
		return true
	}
	e.parent, e.hasParent = it.e.parent, it.e.hasParent
	it.e = e
	return true
}

// Drop takes item i out of the batch, its slot freed: Commit returns
// ErrDropped for it.
func (b *MemBatch) Drop(i int) {
	it := &b.items[i]
	if it.sent {
		b.s.giveBack(it.e.slot)
		it.sent = false
	}
	it.err = ErrDropped
}

// Commit puts the batch's blocks in the store and returns each item's
// error in the order added; a key already held is replaced.
func (b *MemBatch) Commit() []error {
	s := b.s
	errs := make([]error, len(b.items))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range b.items {
		it := &b.items[i]
		if !it.sent {
			errs[i] = it.err
			continue
		}
		if s.closed {
			errs[i] = ErrClosed
			continue
		}
		if old, ok := s.entries[it.key]; ok {
			s.releaseSlotLocked(old.slot)
		}
		s.gen++
		s.entries[it.key] = held{entry: it.e, gen: s.gen}
		s.stats.puts.Add(1)
		s.stats.bytesWritten.Add(uint64(it.e.length))
	}
	b.items = nil
	return errs
}

// ProbeMem says whether a MemStore of bytes could map its memory now: it
// maps as much as NewMem would (no pages touched) and unmaps it again.
// Where the kernel refuses to overcommit, the error is its refusal.
func ProbeMem(bytes int64) error {
	if bytes <= 0 || bytes > MaxMemBytes {
		return fmt.Errorf("%w: bytes %d is not in 1..%d", ErrInvalidConfig, bytes, int64(MaxMemBytes))
	}
	m, err := unix.Mmap(-1, 0, int(bytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return fmt.Errorf("disk: host memory of %d bytes: %w", bytes, err)
	}
	return unix.Munmap(m)
}
