package fabric

import (
	"container/list"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/disk"
	"golang.org/x/sys/unix"
)

// Disk tiers. Under the host or device pools, an agent may keep disk tiers
// (Config.Tiers, pool/disk stores; a host tier above them, tier_host.go,
// reached through the same tierStore interface, tier_store.go): a block the pool is about to recycle
// is copied down first (tier_offload.go), a block an engine asks for that
// is on disk is restored into its block set (tier_restore.go), peers'
// leases stage disk-held blocks into slots of a staging set
// (tier_serve.go), and a restarted agent finds its disk blocks again and
// announces them. Slots in host and in device memory are read and
// written alike through a slotIO (tier_device.go).
//
// A block on disk is keyed by its sequence hash and its shape tag (model
// config, page size, TP size, KV order: what makes two block sets' bytes
// the same block); its bytes are canonical, whatever the arrangement and
// alignment of the set it came from, so that a set of another slot count,
// arrangement or alignment restores it:
//
//	for rank in 0..tp-1
//	  for layer in 0..layers-1
//	    for plane in K, V (the latent alone for MLA)
//	      the rank's chunk of (layer, plane)
//	then a trailer of 16 bytes, little endian:
//	  0  8  the block's content checksum (layout.BlockSum)
//	  8  8  1 if the block had one, else 0
//
// Each tier's directory also holds tier.json: the block size its store was
// made for and one layout per shape tag (for the staging sets that serve
// peers after a restart).
//
// Disk-held blocks are announced to the cluster under their tier's own
// block set number (tierSetBase + tier; the host tier's blocks under
// tierHostSet, as copies in memory), beside the pool's store and remove
// events, so that a block recycled from host memory but kept on disk stays
// announced, and the index's count of this node's copies stays right.

// tierSetBase is the block set number of disk tier 0 in announcements:
// above every pool set id an agent makes.
const tierSetBase = 1 << 31

// tierHostSet is the host tier's block set number in announcements: below
// tierSetBase, so that peers count its blocks as copies in memory (a peer
// of any version counts only the numbers from tierSetBase on as disk
// copies), and above every pool set id an agent makes (they count from 1).
const tierHostSet = tierSetBase - 1

// tierSet is the block set number tier n's blocks are announced under.
func (t *tiers) tierSet(n int) uint32 {
	if n < len(t.list) && t.list[n].isHost() {
		return tierHostSet
	}
	return uint32(tierSetBase + n)
}

// tierIOWorkers is how many reads and writes each tier's store runs at
// once: a restore's readers (restoreReaders) all at once, and as many of
// the writes of a copier's batch.
const tierIOWorkers = 8

// tierCopiers is how many copiers each tier runs. One: a copier writes a
// batch of blocks at once (the store's workers write them in parallel
// and one commit makes them durable), so more copiers add little to the
// rate and take cores from the engines' calls (gathering, checksums):
// BenchmarkTierAllocate measures the cost against Allocate without a tier
// (BENCHMARKS.md, engine Allocate with and without a disk tier).
const tierCopiers = 1

// tierBatchDelay is how long a copier woken by a block waits before it
// starts a batch: the engine call that queued the block (an Allocate
// recycling its slot) ends meanwhile rather than wait for a core the copy
// holds, and the blocks queued meanwhile join the batch
// (BenchmarkTierAllocate, with and without the delay, in BENCHMARKS.md).
const tierBatchDelay = time.Millisecond

// tierBatch is the most blocks a copier takes from the queue at once and
// puts in one batch (one data sync and one journal sync for all of them);
// tierBatchBytes bounds the batch's bytes (its buffers, for blocks not
// written straight from their slots). Between batches the store's writers
// run down and wait for the commit: 128 blocks of 256 KiB a batch copy
// down faster than 32 (BenchmarkTierOffload, in BENCHMARKS.md).
const (
	tierBatch      = 128
	tierBatchBytes = 32 << 20
)

// A batch is one disk.Batch, which takes at most disk.MaxPutBatch blocks:
// this fails to compile (a negative array length) if tierBatch passes it.
var _ [disk.MaxPutBatch - tierBatch]struct{}

// tierTrailer is the bytes after a block's canonical bytes on disk.
const tierTrailer = 16

// shapeTag names what makes two block sets' bytes of a hash the same
// block.
func shapeTag(l *layout.Layout) uint64 {
	m := l.Model
	return xxh3.HashString(fmt.Sprintf("kvfabric-tier/1 layers=%d heads=%d dim=%d dtype=%d mla=%v page=%d tp=%d order=%d",
		m.Layers, m.KVHeads, m.HeadDim, m.DType, m.MLA, l.PageSize, l.TPSize, l.Order))
}

// tierBlockBytes is a block's bytes on disk, trailer included.
func tierBlockBytes(l *layout.Layout) int {
	return int(l.Strides().Shard)*l.TPSize + tierTrailer
}

// gatherBlock copies slot's block in canonical order into dst.
func gatherBlock(l *layout.Layout, regions [][]byte, slot int, dst []byte) {
	forEachChunk(l, slot, func(rank int, off uint64, n int, at int) {
		copy(dst[at:at+n], regions[rank][off:off+uint64(n)])
	})
}

// scatterBlock is gatherBlock's inverse.
func scatterBlock(l *layout.Layout, regions [][]byte, slot int, src []byte) {
	forEachChunk(l, slot, func(rank int, off uint64, n int, at int) {
		copy(regions[rank][off:off+uint64(n)], src[at:at+n])
	})
}

func forEachChunk(l *layout.Layout, slot int, f func(rank int, off uint64, n int, at int)) {
	st := l.Strides()
	planes := 2
	if l.Model.MLA {
		planes = 1
	}
	at := 0
	for r := range l.TPSize {
		for layer := range l.Model.Layers {
			for p := range planes {
				f(r, l.ChunkOffset(slot, layer, p), int(st.Chunk), at)
				at += int(st.Chunk)
			}
		}
	}
}

// tierMeta is a tier directory's tier.json.
type tierMeta struct {
	// BlockBytes is the slot size the store was made with.
	BlockBytes int `json:"block_bytes"`
	// Layouts are a layout of each shape tag (hex) the tier holds blocks of.
	Layouts map[string]json.RawMessage `json:"layouts"`
}

// diskTier is one disk tier.
type diskTier struct {
	n    int
	spec TierSpec
	// store is nil until the block size is known (the first block, or
	// tier.json, or Config.TierBlockBytes).
	store storeRef
	// realPath is the directory with symbolic links resolved; lock the
	// open lock file (claimDir).
	realPath string
	lock     *os.File

	offloads, restores, evicted, failed atomic.Uint64
	restoreTime                         latency
}

// tierEntry is a block in the tiers' recency list. gone says its copy is
// being deleted, or was (dropCopy, lostCopy): the record waits to be
// forgotten, holds nothing for look-ups (where, find), is neither evicted
// again nor moved down, and no copy down is taken as complete on the
// strength of it (heldLocked); a copy committed to its tier meanwhile is
// deleted as a second copy (placed, movedDown).
type tierEntry struct {
	tier   int
	key    disk.Key
	length int
	gone   bool
}

// tierKey is a block's copy in one tier.
type tierKey struct {
	tier int
	key  disk.Key
}

// tiers are an agent's disk tiers.
type tiers struct {
	a     *Agent
	log   *slog.Logger
	list  []*diskTier
	queue chan *offloadJob
	// jobs are the queued copies by slot, for take (under the set's lock:
	// jobsMu comes after every set's lock).
	jobsMu sync.Mutex
	jobs   map[jobKey]*offloadJob
	// pending are the hashes with copies down queued or under way, each
	// with a channel closed when the last of them ends: a block whose slot
	// an allocation took mid-copy is in neither memory nor the tier's
	// index until its put ends, and a restore waits for it (whereWait).
	pending map[uint64]*pendingCopy
	done    chan struct{}
	// ctx is cancelled by close: copies under way stop waiting.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	bufs   sync.Pool

	// A block set's lock may be taken under mu (a copy down's end, a
	// restore's registration: whether a tier holds the copy is decided
	// with the set's change), and so may a store's own lock (placed, a
	// move down and lostCopy ask a store whether it holds a copy; a move
	// down deletes the host copy): a store calls nothing of the tiers
	// under its lock.
	mu         sync.Mutex // guards what follows and the stores' opening
	blockBytes int        // the stores' slot size; 0 until known
	layouts    map[uint64]*layout.Layout
	lrus       map[int]*list.List // per tier, of *tierEntry, least recently used first (lru)
	pos        map[disk.Key]*list.Element
	heldBytes  []int64 // per tier
	staging    map[uint64]*engineSet
	progress   chan struct{} // closed and replaced when a copy down has read its slot
	// deleting counts the deletes under way of each copy (dropCopy): a
	// copy committed there meanwhile is recorded only once they end, if
	// the store holds it then (placed, movedDown), since the delete may
	// take it.
	deleting map[tierKey]int
	// deleted is broadcast (its L is mu) when a delete counted in
	// deleting ends: waitDeleted waits for the deletes of a copy just
	// committed (placeAll, movedDown).
	// Made when first needed.
	deleted *sync.Cond

	room      atomic.Int64 // blockBytes, for offer, which may not take mu
	queueFull atomic.Uint64
	taken     atomic.Uint64 // blocks copied out of slots allocations took
	// beforePut, if set, is called by each copy down between reading its
	// block and writing it (tests: a write that does not end).
	beforePut atomic.Pointer[func()]
	// beforeCommit, if set, is called by each copy down between the ends
	// of its writes and its commit (tests: a commit that does not end).
	beforeCommit atomic.Pointer[func()]
	// restoring, if set, is called by each restore that is not a
	// read-ahead once it has its slots, before it reads (tests: a
	// read-ahead registers the same blocks meanwhile).
	restoring atomic.Pointer[func()]
	// pendingWait, if set, is called by whereWait as it begins to wait
	// for the copies down of a hash under way (tests).
	pendingWait atomic.Pointer[func()]
	// countWaitCap, if not zero, replaces noDeadlineCountWait, the bound
	// on a look-up's wait for copies down where its call has no deadline
	// (tests).
	countWaitCap atomic.Int64
	// beforeMoved and afterMoved, if set, are called by each move down
	// from the host tier between its commit below and its record there,
	// and right after that record (tests).
	beforeMoved, afterMoved atomic.Pointer[func()]
	// afterDrop, if set, is called by dropCopy right after a tier's store
	// deleted a block's copy (tests: a set that recycles then, a copy
	// placed then).
	afterDrop atomic.Pointer[func(d *diskTier, k disk.Key)]
	// beforeDelete, if set, is called by dropCopy once the delete is
	// under way (counted in deleting) and before the store's Delete
	// (tests: a copy placed then); beforeDeleteWait by waitDeleted
	// (placeAll, movedDown), t.mu held and announceMu not, as it begins
	// to wait for a delete of k in d to end (tests).
	beforeDelete, beforeDeleteWait atomic.Pointer[func(d *diskTier, k disk.Key)]
	// beforeEvictDrop, if set, is called by evict between its claim of a
	// record (marked gone) and the delete of its copy (tests).
	beforeEvictDrop atomic.Pointer[func(d *diskTier, k disk.Key)]
	// afterRead, if set, is called by each restore's, read-ahead's or
	// move down's read of a block right after the store's read, with its
	// error, before a copy found corrupt or missing is acted on (tests: a
	// record replaced meanwhile, a copy committed since).
	afterRead atomic.Pointer[func(d *diskTier, k disk.Key, err error)]
	// beforeRead, if set, is called by each restore's, read-ahead's or
	// move down's read of a block right before the store's read (tests: a
	// record replaced then).
	beforeRead atomic.Pointer[func(d *diskTier, k disk.Key)]
	// failIO, if set, is the stores' disk.Config.FailIO (tests: a disk
	// that fails, O_DIRECT refusing pool memory).
	failIO atomic.Pointer[func(write, straight bool) error]
	// failSlotRead, if set, is asked by each copy down before it reads a
	// slot into a buffer: its error is the read's (tests: a device slot
	// the driver cannot copy out).
	failSlotRead atomic.Pointer[func(hash uint64) error]
	// readBackoff keeps blocks whose slot read failed from being offered
	// again at once (tier_backoff.go).
	readBackoff readBackoff
	// skipLog spaces the log lines of blocks dropped for allocations
	// (the pool's Metrics.OffloadsGivenUp counts them).
	skipLog logSpacing
	corrupt atomic.Uint64 // blocks that failed a check on restore

	// Copies down written straight from pool memory (tier_offload.go):
	// trailers are their trailer pages; direct counts those committed as
	// written, rewritten those written again from bytes copied out when an
	// allocation took the slot under the write; noDirect, set once O_DIRECT refused pool
	// memory (EINVAL, EFAULT) for a write or a read, turns writes and reads
	// straight from and into slots off.
	trailers  sync.Pool
	direct    atomic.Uint64
	rewritten atomic.Uint64
	noDirect  atomic.Bool

	stagers stagerCache // device sets' slot I/O (tier_device.go)

	moveMu sync.Mutex // one move down from the host tier at a time (tier_host.go)
	// announceMu orders the tiers' records with their announcements: each
	// change to the records that is announced (a copy placed, moved down
	// from host memory, forgotten: after an eviction, from any tier, or a
	// copy lost) is made and announced under it, and a resync of what
	// this node holds reads the records under it (announced). Marking a
	// record gone (dropCopy, lostCopy) is not made under it nor announced:
	// the block is announced gone when its record is forgotten, under it.
	// No one waits under it for a delete (dropCopy: a disk store's delete
	// of a corrupt copy writes and syncs its journal, another may wait for
	// a commit's lock): placeAll and movedDown wait for the deletes of a
	// copy they committed before they take it (waitDeleted), and let go
	// of it to wait again for one begun since; a forget (a read-ahead's
	// too, made as the block it found lost lands) waits under it only for
	// mu and what announce takes. So the announcements of one block go
	// out in the order of its records' changes (a removal never
	// overtakes the store it follows), and no record waits for its
	// announcement while a resync reads them. Taken after moveMu and before mu and what announce
	// takes (the owned index's mu, the membership's lock), never while
	// holding those nor a set's lock; announce does no network I/O. A
	// resync or reconcile (announced) takes the pool's lock and every
	// block set's lock (the pool's Snapshot) under it, so those too come
	// after it: nothing holding the pool's or a set's lock takes it.
	// Agent.registerMu (blockSetForSession) comes before Agent.mu, and
	// both before these locks and a set's setAhead.mu.
	announceMu sync.Mutex
	// announcing is set, under announceMu, when announceAll announces the
	// records once the node joined: changes before it are announced by
	// it, not each on its own.
	announcing atomic.Bool
	// beforeOrder, if set, is called by each taker of announceMu just
	// before it takes it (tests: a resync that must wait for an
	// announcement under way).
	beforeOrder atomic.Pointer[func()]
	// hostRefused, under mu, is set once the host tier could not be made
	// (its size holds no block): the disk tiers go on without it.
	hostRefused bool

	// Read-ahead along sequences (tier_readahead.go). Under mu: child is
	// the block that follows each parent (its key) in a tier, as the last
	// copy down of a child said (after a restart, as the disk stores
	// kept it: relinkLocked); parentOf each such child's parent, so
	// that both go when the child leaves the tiers (at most one of each
	// per block the tiers hold). relinks, under mu, counts the links that
	// took a parent's link from another block (linkLocked): a move down
	// that sees it change while its blocks moved journals their links
	// below again (keepMovedLinkLocked).
	child, parentOf map[disk.Key]uint64
	relinks         uint64
	ahead           aheadRuns
}

// openTiers opens the configured disk tiers and finds the blocks they hold.
func openTiers(a *Agent, specs []TierSpec) (*tiers, error) {
	t := &tiers{a: a, log: a.log, done: make(chan struct{}), layouts: map[uint64]*layout.Layout{},
		pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, len(specs)),
		staging: map[uint64]*engineSet{}, progress: make(chan struct{})}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	q := a.cfg.TierQueue
	if q == 0 {
		q = DefaultTierQueue
	}
	t.queue = make(chan *offloadJob, q)
	t.jobs = map[jobKey]*offloadJob{}
	t.pending = map[uint64]*pendingCopy{}
	if a.cfg.TierBlockBytes > 0 {
		t.blockBytes = roundUp4K(int(a.cfg.TierBlockBytes))
	}
	for i, s := range specs {
		if s.Kind == tierHost {
			// Its memory is mapped with the disk tiers (its slots sized by
			// the first block); one the kernel refuses now is an error
			// here, not a tier missing later.
			if err := probeHostMemory(int64(s.Size)); err != nil {
				t.close()
				return nil, fmt.Errorf("fabric: tiers[%d] host: %w", i, err)
			}
			t.list = append(t.list, &diskTier{n: i, spec: s}) // opened with the disk tiers, empty
			continue
		}
		if err := os.MkdirAll(s.Path, 0o700); err != nil {
			t.close()
			return nil, fmt.Errorf("fabric: tiers[%d]: %w", i, err)
		}
		d := &diskTier{n: i, spec: s}
		t.list = append(t.list, d)
		if err := t.claimDir(d); err != nil {
			t.close()
			return nil, err
		}
		if err := t.readMeta(t.list[i]); err != nil {
			t.close()
			return nil, fmt.Errorf("fabric: tiers[%d] %s: %w", i, s.Path, err)
		}
	}
	if t.blockBytes > 0 {
		t.mu.Lock()
		err := t.openStoresLocked()
		t.mu.Unlock()
		if err != nil {
			t.close()
			return nil, err
		}
	}
	for range tierCopiers * len(t.list) {
		t.wg.Add(1)
		go t.worker()
	}
	return t, nil
}

// ioFault is the stores' disk.Config.FailIO: failIO's answer, nil when
// it is not set.
func (t *tiers) ioFault(write, straight bool) error {
	if f := t.failIO.Load(); f != nil {
		return (*f)(write, straight)
	}
	return nil
}

func roundUp4K(n int) int { return (n + disk.Align - 1) &^ (disk.Align - 1) }

// readMeta reads d's tier.json, if there is one: the block size (which
// must agree between tiers and with the configuration) and the layouts.
func (t *tiers) readMeta(d *diskTier) error {
	b, err := os.ReadFile(filepath.Join(d.spec.Path, "tier.json"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var m tierMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("tier.json: %w", err)
	}
	if m.BlockBytes <= 0 || m.BlockBytes%disk.Align != 0 || m.BlockBytes > disk.MaxSlotBytes {
		return fmt.Errorf("tier.json: block_bytes %d is not a multiple of %d up to %d", m.BlockBytes, disk.Align, disk.MaxSlotBytes)
	}
	if t.blockBytes != 0 && t.blockBytes != m.BlockBytes {
		return fmt.Errorf("tier.json: blocks of %d bytes, not %d (tier_block_bytes or another tier): give the tier a directory of its own",
			m.BlockBytes, t.blockBytes)
	}
	t.blockBytes = m.BlockBytes
	for tag, raw := range m.Layouts {
		var n uint64
		if _, err := fmt.Sscanf(tag, "%016x", &n); err != nil {
			return fmt.Errorf("tier.json: layout tag %q", tag)
		}
		var js string
		if err := json.Unmarshal(raw, &js); err != nil {
			return fmt.Errorf("tier.json: layout %s: %w", tag, err)
		}
		l, err := layout.ParseJSON([]byte(js))
		if err != nil {
			return fmt.Errorf("tier.json: layout %s: %w", tag, err)
		}
		if shapeTag(l) != n {
			return fmt.Errorf("tier.json: layout %s has the tag %016x", tag, shapeTag(l))
		}
		t.layouts[n] = l
	}
	return nil
}

// writeMetaLocked records the block size and layouts in every tier's
// tier.json (written aside and renamed over). t.mu is held.
func (t *tiers) writeMetaLocked() error {
	m := tierMeta{BlockBytes: t.blockBytes, Layouts: map[string]json.RawMessage{}}
	for tag, l := range t.layouts {
		js, _ := json.Marshal(string(l.JSON()))
		m.Layouts[fmt.Sprintf("%016x", tag)] = js
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	for _, d := range t.list {
		if d.spec.Kind == tierHost {
			continue
		}
		path := filepath.Join(d.spec.Path, "tier.json")
		if err := os.WriteFile(path+".new", b, 0o600); err != nil {
			return fmt.Errorf("fabric: %s: %w", path, err)
		}
		if err := syncFile(path + ".new"); err != nil {
			return err
		}
		if err := os.Rename(path+".new", path); err != nil {
			return fmt.Errorf("fabric: %s: %w", path, err)
		}
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// openStoresLocked opens each tier's store with blocks of t.blockBytes and
// lists what they hold, each block linked to the parent its store kept
// with it. t.mu is held.
func (t *tiers) openStoresLocked() error {
	t.room.Store(int64(t.blockBytes))
	for _, d := range t.list {
		if d.store.Load() != nil {
			continue
		}
		if d.spec.Kind == tierHost {
			if err := t.openHost(d); err != nil && !t.hostRefused {
				t.hostRefused = true
				t.log.Warn("tier: no host tier: blocks go down to the disk tiers", "err", err)
			}
			continue
		}
		cfg := disk.Config{Dir: d.spec.Path, Bytes: int64(d.spec.Size), SlotBytes: t.blockBytes, Workers: tierIOWorkers,
			Logger: t.log.With("tier", d.n), FailIO: t.ioFault}
		st, err := disk.Open(cfg)
		if err != nil && errors.Is(err, unix.EINVAL) {
			t.log.Warn("the tier's file system refuses O_DIRECT: its blocks go through the page cache", "tier", d.n, "dir", d.spec.Path)
			cfg.Buffered = true
			st, err = disk.Open(cfg)
		}
		if err != nil {
			return fmt.Errorf("fabric: tiers[%d] %s: %w", d.n, d.spec.Path, err)
		}
		d.store.Store(st)
		for _, k := range st.Keys() {
			if _, ok := t.layouts[k.Tag]; !ok {
				// No layout for it: it could not be staged for peers
				// nor told apart; not served.
				st.Delete(k)
				continue
			}
			if e, ok := t.pos[k]; ok {
				// A second copy, left by a crash between a copy placed
				// here and the one above it dropped, or between a second
				// copy's delete (left for the next commit) and that
				// commit: the first tier's is kept, this slot freed,
				// unless the first fails its check (its slot was written
				// again since that delete, and the crash cut the commit
				// that would have journalled both). Then this one is kept.
				first := e.Value.(*tierEntry).tier
				if !t.corruptAtOpenLocked(first, k) {
					t.log.Info("tier: a block held twice after a restart: the copy here is dropped",
						"tier", d.n, "kept in", first, "hash", k.Hash)
					st.Delete(k)
					continue
				}
				t.log.Warn("tier: a block held twice after a restart failed its check in the first tier: the copy here is kept",
					"tier", d.n, "dropped in", first, "hash", k.Hash)
				t.unrecordLocked(e)
			}
			t.recordLocked(d, k, t.blockBytes)
			t.relinkLocked(st, k)
		}
	}
	return nil
}

// corruptAtOpenLocked reads k's copy in tier n, opened, and says whether
// it failed its checksum (the store has dropped it then). A copy that
// could not be read for another reason is not called corrupt. t.mu is
// held: only as the stores open, for a block two tiers hold.
func (t *tiers) corruptAtOpenLocked(n int, k disk.Key) bool {
	st := t.list[n].store.Load()
	if st == nil {
		return false
	}
	_, err := st.Get(context.Background(), k, alignedBuffer(t.blockBytes))
	if errors.Is(err, disk.ErrCorrupt) {
		t.corrupt.Add(1)
		return true
	}
	return false
}

// ensureShape makes sure the tiers can take blocks of l: the stores open
// (sized by the first block unless configured) and l's layout recorded.
func (t *tiers) ensureShape(l *layout.Layout) (uint64, error) {
	tag := shapeTag(l)
	need := tierBlockBytes(l)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.blockBytes == 0 {
		t.blockBytes = roundUp4K(need)
	}
	if need > t.blockBytes {
		return 0, fmt.Errorf("fabric: a block of %d bytes does not fit the disk tiers' %d: %w", need, t.blockBytes, disk.ErrTooLarge)
	}
	if _, ok := t.layouts[tag]; !ok {
		t.layouts[tag] = l.Clone()
		if err := t.writeMetaLocked(); err != nil {
			delete(t.layouts, tag)
			return 0, err
		}
	}
	if err := t.openStoresLocked(); err != nil {
		return 0, err
	}
	return tag, nil
}

// where returns the tier that holds k, or nil: a record gone (its copy
// being deleted, or deleted and not yet forgotten) holds nothing, so that
// a copy down writes the block again rather than take it as held, and no
// restore, Lookup or lease looks for it there.
func (t *tiers) where(k disk.Key) *diskTier {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.pos[k]; ok && !e.Value.(*tierEntry).gone {
		return t.list[e.Value.(*tierEntry).tier]
	}
	return nil
}

// lru is tier n's list of its blocks' records, least recently used
// first, made when first needed. t.mu is held.
func (t *tiers) lru(n int) *list.List {
	l := t.lrus[n]
	if l == nil {
		if t.lrus == nil {
			t.lrus = map[int]*list.List{}
		}
		l = list.New()
		t.lrus[n] = l
	}
	return l
}

// recordLocked records that tier d holds k, length bytes, as its most
// recently used block. k has no record. t.mu is held.
func (t *tiers) recordLocked(d *diskTier, k disk.Key, length int) {
	t.pos[k] = t.lru(d.n).PushBack(&tierEntry{tier: d.n, key: k, length: length})
	t.heldBytes[d.n] += int64(length)
}

// unrecordLocked drops record e: its block is in no tier's list, nor
// counted in its tier's bytes. t.mu is held.
func (t *tiers) unrecordLocked(e *list.Element) {
	te := e.Value.(*tierEntry)
	t.unlinkLocked(te.key)
	t.lru(te.tier).Remove(e)
	delete(t.pos, te.key)
	t.heldBytes[te.tier] -= int64(te.length)
}

// touch makes k the most recently used.
func (t *tiers) touch(k disk.Key) {
	t.mu.Lock()
	if e, ok := t.pos[k]; ok {
		t.lru(e.Value.(*tierEntry).tier).MoveToBack(e)
	}
	t.mu.Unlock()
}

// forgetIf drops k's record from the list (after d's store dropped its
// copy) and announces that the node no longer holds it on disk, if the
// record is the element only and names d: a block that moved to another
// tier meanwhile (a move down from the host tier) keeps its record there,
// and a record made since in only's place (placed records a copy committed
// after only's copy was deleted) is another copy's, good, and stays. Every
// forget names the record it drops: an eviction the record it claimed, a
// restore, a read-ahead or a move down from host memory the one its
// read's failure marked gone (lostCopy) or, for a copy dropFound dropped,
// the record that named it.
func (t *tiers) forgetIf(d *diskTier, k disk.Key, only *list.Element) {
	t.order()
	t.mu.Lock()
	e, ok := t.pos[k]
	if ok && (e.Value.(*tierEntry).tier != d.n || e != only) {
		ok = false
	}
	if ok {
		t.unrecordLocked(e)
	}
	t.mu.Unlock()
	if ok {
		t.announce(false, d.n, k.Hash)
	}
	t.announceMu.Unlock()
	if ok {
		t.lostBelow(k)
	}
}

// heldLocked says whether a tier holds k's copy: k has a record, not
// gone. t.mu is held.
func (t *tiers) heldLocked(k disk.Key) bool {
	e, ok := t.pos[k]
	return ok && !e.Value.(*tierEntry).gone
}

// dropCopy deletes tier d's copy of k. Where k's record names d (and
// recorded is set; else that copy is left alone, being the record's,
// unless the record is gone: then the copy, committed since, is recorded
// nowhere and deleted too), the record is marked gone and the block sets
// that hold k in memory are told their copy below is gone (lostBelow)
// before the store deletes it, so
// that no set takes the block as copied below, and recycles it as such,
// while no tier holds the copy: a copy down that ends meanwhile is not
// taken as complete on the strength of a gone record (heldLocked), nor is
// a restore's block registered as copied below. The record stays, gone,
// for the caller to forget. A copy of k committed to d while the record
// waits, gone, to be forgotten is recorded nowhere (placed, movedDown) and
// deleted as a second copy (dropSecond): the forget drops the record,
// whatever copy it would name. One committed while the delete is under
// way with no record is recorded (placeAll, movedDown) only once the
// delete ended and only if the store holds it still. Called with neither
// t.mu nor announceMu held:
// lostBelow takes the sets' locks, and a disk store's delete writes its
// journal.
func (t *tiers) dropCopy(d *diskTier, k disk.Key, recorded bool) error {
	return t.dropCopyOf(d, k, recorded, nil)
}

// dropCopyOf is dropCopy, for the copy that record only names where only
// is not nil (an eviction's, which claimed only, marking it gone, before
// it let go of t.mu): if only is no longer k's record, its copy was
// dropped and the record forgotten meanwhile (a restore that found the
// copy corrupt), and nothing is marked nor deleted: the record in its
// place, and its copy, are another's, committed since.
func (t *tiers) dropCopyOf(d *diskTier, k disk.Key, recorded bool, only *list.Element) error {
	_, err := t.dropCopyGen(d, k, recorded, only, 0)
	return err
}

// dropCopyGen is dropCopyOf, for the copy of generation gen only where
// gen is not 0 (a read's, found corrupt by the tiers' own checks:
// dropFound). If d's store holds a copy of k of another generation by
// then (asked under t.mu), the copy read was replaced by one committed
// since, which placed took as the record's (the same record, reused):
// nothing is marked nor deleted, and the record and its good copy stay.
// If it holds none, the copy read is gone already (the store dropped it,
// a read's checksum failing): nothing is deleted, and k's record, if it
// names d and is not gone, is marked gone, the sets told, and returned to
// be forgotten, as lostCopy does. Else k's record, if it names d, is that
// copy's, whichever record the read was made from (one replaced between
// the read's start and the store's read included): it is marked gone, the
// sets told, as dropCopy does, and the delete is of that generation only
// (DeleteIf), so that a copy committed between the check and the delete
// is kept (recorded once the delete ended if the record was forgotten by
// then, else deleted as a second copy: placeAll, movedDown). It returns
// the record it marked gone, for the caller to forget: nil where it
// marked none. Its generation branch (gen not 0, the store holding no
// copy of k or another generation's) looks at neither recorded nor only:
// right only as a gen is passed with recorded true and only nil
// (dropFound's call, the one with a gen), for which dropCopyOf's checks
// of them let every record through; where the store holds the copy of
// gen, they are checked as dropCopyOf checks them.
func (t *tiers) dropCopyGen(d *diskTier, k disk.Key, recorded bool, only *list.Element, gen uint64) (*list.Element, error) {
	tk := tierKey{d.n, k}
	st := d.store.Load()
	t.mu.Lock()
	if gen != 0 {
		held, ok := st.Gen(k)
		if !ok {
			// The copy read is gone from the store, and no delete of
			// the tiers' took it with the record naming d left as it
			// was (they mark it gone first, or move it: lostCopy): a
			// record naming d not gone is left with no copy, and is
			// marked as lostCopy marks it.
			e := t.lostLocked(d, k)
			t.mu.Unlock()
			if e != nil {
				t.lostBelow(k)
			}
			return e, nil
		}
		if held != gen {
			t.mu.Unlock()
			return nil, nil
		}
	}
	e, ok := t.pos[k]
	if only != nil && (!ok || e != only) {
		t.mu.Unlock()
		return nil, nil
	}
	ok = ok && e.Value.(*tierEntry).tier == d.n
	if ok && !recorded {
		if !e.Value.(*tierEntry).gone {
			t.mu.Unlock()
			return nil, nil
		}
		// The record's copy is being dropped already (marked, the sets
		// told): this copy, committed since, is recorded nowhere and
		// deleted too.
		ok = false
	}
	if ok {
		e.Value.(*tierEntry).gone = true
	} else {
		e = nil
	}
	if t.deleting == nil {
		t.deleting = map[tierKey]int{}
	}
	t.deleting[tk]++
	t.mu.Unlock()
	if ok {
		t.lostBelow(k)
	}
	if f := t.beforeDelete.Load(); f != nil {
		(*f)(d, k)
	}
	var err error
	if gen != 0 {
		err = st.DeleteIf(k, gen)
	} else {
		err = st.Delete(k)
	}
	if f := t.afterDrop.Load(); f != nil {
		(*f)(d, k)
	}
	t.mu.Lock()
	if t.deleting[tk]--; t.deleting[tk] <= 0 {
		delete(t.deleting, tk)
	}
	t.deletedCond().Broadcast()
	t.mu.Unlock()
	return e, err
}

// waitDeleted waits until no delete of any of ks in d is under way
// (dropCopy), taking t.mu and nothing else: placeAll and movedDown wait so
// before they take announceMu, and never under it, so that no
// announcement nor resync waits behind a disk store's journal (a corrupt
// copy's delete syncs it; any delete may wait for a commit's lock).
func (t *tiers) waitDeleted(d *diskTier, ks ...disk.Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range ks {
		for t.deleting[tierKey{d.n, k}] > 0 {
			if f := t.beforeDeleteWait.Load(); f != nil {
				(*f)(d, k)
			}
			t.deletedCond().Wait()
		}
	}
}

// deletedCond is t.deleted, made if it is not yet. t.mu is held.
func (t *tiers) deletedCond() *sync.Cond {
	if t.deleted == nil {
		t.deleted = sync.NewCond(&t.mu)
	}
	return t.deleted
}

// lostCopy is for a copy of k in tier d that went without dropCopy: the
// store dropped it as it read it (its checksum failed) or found it
// missing. Where k's record names d, is not gone, and d's store holds no
// copy of k, it is marked gone and the block sets holding k are told at
// once, not when the record is forgotten, and lostCopy returns it: the
// caller forgets it (forgetFound); nil where it marked none. That is
// whichever record names d, the one the read was made from or one made
// since in its place (a record replaced between the read's start and the
// store's read, whose copy the store then dropped): a record naming d
// whose tier holds no copy is never a state the tiers make while they
// run (a copy is recorded only once committed and while its store holds
// it: placed, movedDown; each delete of theirs either marks the record
// gone first, under t.mu: dropCopy, evict, or moves the record below in
// the same t.mu step as it deletes the host copy: movedDown), only what a
// store's own drop leaves (lostLocked), and a store closed at shutdown (a
// MemStore's Close drops every block, its records left as they are).
// Left held, such a record was served from, and counted, until a read of
// it found it missing. A record whose tier holds a copy of k by now is
// left as it is: the copy is one committed since the read, which placed
// takes as the record's (the store replaced its copy, the record is
// reused) and keeps the record for, or will; marking the record gone then,
// and forgetting it, left that good copy in the store with no record.
// Called with neither t.mu nor announceMu held; the store's lock is taken
// under t.mu (Has).
func (t *tiers) lostCopy(d *diskTier, k disk.Key) *list.Element {
	t.mu.Lock()
	e := t.lostLocked(d, k)
	t.mu.Unlock()
	if e != nil {
		t.lostBelow(k)
	}
	return e
}

// lostLocked marks k's record gone and returns it if it names d, is not
// gone, and d's store holds no copy of k (lostCopy); else nil. t.mu is
// held.
func (t *tiers) lostLocked(d *diskTier, k disk.Key) *list.Element {
	e, ok := t.pos[k]
	if !ok {
		return nil
	}
	te := e.Value.(*tierEntry)
	if te.tier != d.n || te.gone || d.store.Load().Has(k) {
		return nil
	}
	te.gone = true
	return e
}

// order takes announceMu: from a change to the records to its
// announcement, or while a resync reads them.
func (t *tiers) order() {
	if f := t.beforeOrder.Load(); f != nil {
		(*f)()
	}
	t.announceMu.Lock()
}

// lostBelow tells the block sets of k's shape that hold it in memory that
// their copy below is gone, so that they copy it down again rather than
// drop it. It takes the pool's and the sets' locks, not a.mu: a restore
// that drops a corrupt copy calls it while an agent lock holder may wait
// for that restore (a read-ahead).
func (t *tiers) lostBelow(k disk.Key) {
	if t.a.pool == nil {
		return
	}
	for _, set := range t.a.pool.BlockSets() {
		if shapeTag(set.Layout()) != k.Tag {
			continue
		}
		if b, ok := set.Lookup(k.Hash); ok {
			set.LostBelow(b) // a stale handle: recycled meanwhile, nothing to keep
		}
	}
}

// buffer is a block's room on disk from a pool of them.
func (t *tiers) buffer() []byte {
	t.mu.Lock()
	n := t.blockBytes
	t.mu.Unlock()
	return t.bufferOf(n)
}

// bufferOf is a buffer of n bytes from the pool of them, without t.mu.
func (t *tiers) bufferOf(n int) []byte {
	if b, ok := t.bufs.Get().(*[]byte); ok && len(*b) == n {
		return *b
	}
	return alignedBuffer(n)
}

// alignedBuffer is n bytes at an address aligned to disk.Align, so that
// the stores read into it and write from it directly (O_DIRECT), without
// a copy through a buffer of their own.
func alignedBuffer(n int) []byte {
	b := make([]byte, n+disk.Align)
	off := (disk.Align - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%disk.Align)) % disk.Align
	return b[off : off+n : off+n]
}

func (t *tiers) putBuffer(b []byte) { t.bufs.Put(&b) }

// signal wakes whoever waits for a copy down to end.
func (t *tiers) signal() {
	t.mu.Lock()
	close(t.progress)
	t.progress = make(chan struct{})
	t.mu.Unlock()
}

// waitProgress returns the channel that the next copy down to finish
// reading its slot closes.
func (t *tiers) waitProgress() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.progress
}

// find reports whether some tier holds hash, and under which shape (a
// record gone holds nothing, as for where).
func (t *tiers) find(hash uint64) (disk.Key, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for tag := range t.layouts {
		if t.heldLocked(disk.Key{Hash: hash, Tag: tag}) {
			return disk.Key{Hash: hash, Tag: tag}, true
		}
	}
	return disk.Key{}, false
}

// close stops the workers and closes the stores. Safe twice.
func (t *tiers) close() error {
	select {
	case <-t.done:
		return nil
	default:
	}
	close(t.done)
	t.cancel()
	t.wg.Wait()
	t.ahead.close()
	t.stagers.close()
	var errs []error
	for _, d := range t.list {
		if st := d.store.Load(); st != nil {
			errs = append(errs, st.Close())
		}
		if d.lock != nil {
			errs = append(errs, d.lock.Close()) // and its lock with it
		}
	}
	return errors.Join(errs...)
}

// tierLockFile is the file in a disk tier's directory that its agent holds
// an exclusive lock on (flock) while the tier is open.
const tierLockFile = "lock"

// claimDir makes sure that d's directory is no earlier tier's (the same
// directory, or one inside the other, by another path: a symbolic link, a
// bind mount) and that no other agent, or store of this one, has it
// open, and locks it for d until the tiers close: two stores in one
// directory overwrite each other's blocks and journal.
func (t *tiers) claimDir(d *diskTier) error {
	real, err := filepath.EvalSymlinks(d.spec.Path)
	if err != nil {
		return fmt.Errorf("fabric: tiers[%d] %s: %w", d.n, d.spec.Path, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return fmt.Errorf("fabric: tiers[%d] %s: %w", d.n, d.spec.Path, err)
	}
	for _, e := range t.list {
		if e == d || e.isHost() {
			continue
		}
		efi, err := os.Stat(e.realPath)
		if err == nil && os.SameFile(fi, efi) ||
			strings.HasPrefix(real, e.realPath+"/") || strings.HasPrefix(e.realPath, real+"/") {
			return fmt.Errorf("fabric: tiers[%d] %s (%s) overlaps tiers[%d]'s directory %s (%s): a tier's directory is its own",
				d.n, d.spec.Path, real, e.n, e.spec.Path, e.realPath)
		}
	}
	f, err := os.OpenFile(filepath.Join(real, tierLockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("fabric: tiers[%d] %s: %w", d.n, d.spec.Path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fmt.Errorf("fabric: tiers[%d] %s: %w (another agent has it open: its lock file %s is held)",
				d.n, d.spec.Path, errTierDirInUse, filepath.Join(real, tierLockFile))
		}
		return fmt.Errorf("fabric: tiers[%d] %s: lock: %w", d.n, d.spec.Path, err)
	}
	d.realPath, d.lock = real, f
	return nil
}

// errTierDirInUse is the refusal of a disk tier whose directory another
// agent has open.
var errTierDirInUse = errors.New("the tier's directory is in use")

// putTrailer writes the trailer after n canonical bytes.
func putTrailer(b []byte, n int, sum uint64, has bool) {
	binary.LittleEndian.PutUint64(b[n:], sum)
	h := uint64(0)
	if has {
		h = 1
	}
	binary.LittleEndian.PutUint64(b[n+8:], h)
}

func trailer(b []byte, n int) (sum uint64, has bool) {
	return binary.LittleEndian.Uint64(b[n:]), binary.LittleEndian.Uint64(b[n+8:]) == 1
}
