package fabric

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/pool/disk"
)

// The host tier ("host=SIZE" in Config.Tiers): host memory between the
// pools and the disk tiers, a disk.MemStore under the same keys and in
// the same canonical bytes (tier.go), each block checked against its
// checksum on every read. It comes first in the tiers' order: a block the
// pool recycles is copied down to it (pick), restores, Lookup, peers'
// leases and Prefetch find it there as in any tier (where: a block is in
// one tier at a time). When it is full, its least recently used blocks
// move down to the disk tier with the most free slots (pickBelow, roomFor): each
// read back (checked), written and committed below, then freed above;
// with no disk tier they are dropped, as the bottom tier evicts. It is
// not persistent: a restarted agent finds its disk tiers' blocks again,
// and none of the host tier's.

// tierHost is the host tier's kind in Config.Tiers, status, metrics and
// LookupResponse.local_tiers.
const tierHost = "host"

// parseHostTier parses the rest of "host=SIZE".
func parseHostTier(s, size string) (TierSpec, error) {
	if size == "" {
		return TierSpec{}, fmt.Errorf("%q: no size: want host=SIZE", s)
	}
	n, err := ParseSize(size)
	if err != nil {
		return TierSpec{}, fmt.Errorf("%q: %v", s, err)
	}
	if n < MinHostTierBytes || n > MaxHostTierBytes {
		return TierSpec{}, fmt.Errorf("%q: host tier size %d is not in %d (16MiB)..%d (1TiB)", s, n, MinHostTierBytes, uint64(MaxHostTierBytes))
	}
	return TierSpec{Kind: tierHost, Size: n}, nil
}

// openHost makes the host tier's store, with slots of t.blockBytes. t.mu
// is held.
func (t *tiers) openHost(d *diskTier) error {
	if t.hostRefused {
		return nil
	}
	if int64(d.spec.Size) < int64(t.blockBytes) {
		return fmt.Errorf("fabric: tiers[%d] host: %d bytes hold no block of %d", d.n, d.spec.Size, t.blockBytes)
	}
	st, err := disk.NewMem(disk.MemConfig{Bytes: int64(d.spec.Size), SlotBytes: t.blockBytes})
	if err != nil {
		return fmt.Errorf("fabric: tiers[%d] host: %w", d.n, err)
	}
	d.store.Store(st)
	return nil
}

// hostTierMemory is how much memory a host tier may take, and what says so:
// MemAvailable, or the memory.max of the agent's cgroup where that is
// lower. A variable for tests.
var hostTierMemory = readHostMemory

// readHostMemory is hostTierMemory on Linux: /proc/meminfo's MemAvailable and
// cgroup v2's memory.max ("max": none).
func readHostMemory() (uint64, string, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, "", err
	}
	var avail uint64
	found := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "MemAvailable:" && f[2] == "kB" {
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return 0, "", fmt.Errorf("/proc/meminfo: %q: %v", line, err)
			}
			avail, found = n<<10, true
		}
	}
	if !found {
		return 0, "", errors.New("/proc/meminfo: no MemAvailable")
	}
	from := "MemAvailable in /proc/meminfo"
	if cg, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, line := range strings.Split(string(cg), "\n") {
			dir, ok := strings.CutPrefix(line, "0::")
			if !ok {
				continue
			}
			path := filepath.Join("/sys/fs/cgroup", dir, "memory.max")
			v, err := os.ReadFile(path)
			if err != nil {
				break
			}
			if n, err := strconv.ParseUint(strings.TrimSpace(string(v)), 10, 64); err == nil && n < avail {
				avail, from = n, path
			}
		}
	}
	return avail, from, nil
}

// checkHostMemory refuses a host tier of size bytes larger than the
// memory it may take (hostTierMemory): filled, it would have the agent
// killed. Where that figure cannot be read, nothing is refused.
func checkHostMemory(size uint64) error {
	avail, from, err := hostTierMemory()
	if err != nil || size <= avail {
		return nil
	}
	return fmt.Errorf("host tier of %d bytes is more than the %d bytes of memory available (%s)", size, avail, from)
}

// probeHostMemory maps a host tier's memory at start and unmaps it
// (disk.ProbeMem). A variable for tests.
var probeHostMemory = disk.ProbeMem

// isHost says whether d is the host tier.
func (d *diskTier) isHost() bool { return d.spec.Kind == tierHost }

// hostTier is the host tier if there is one and it is open, else nil.
func (t *tiers) hostTier() *diskTier {
	if len(t.list) > 0 && t.list[0].isHost() && t.list[0].store.Load() != nil {
		return t.list[0]
	}
	return nil
}

// pickBelow is the open disk tier under the host tier with the most
// free slots, nil if there is none.
func (t *tiers) pickBelow() *diskTier {
	var best *diskTier
	free := -1
	for _, d := range t.list {
		st := d.store.Load()
		if st == nil || d.isHost() {
			continue
		}
		s := st.Stats()
		if f := s.Slots - s.Blocks; f > free {
			best, free = d, f
		}
	}
	return best
}

// hostMoveBatch bounds the blocks one move down takes from the host tier
// (one write below, its data and journal synced once).
const hostMoveBatch = 32

// roomFor makes want free slots in tier d (a copier's batch at most,
// tierBatch) and returns how many d has then, and how many blocks left d
// to make them: in the host tier by moving
// its least recently used blocks down (moveDown), up to hostMoveBatch at
// a time; in a disk tier, the bottom, by dropping its least recently used
// blocks. A few rounds more at most where copies racing it take the slots
// freed. Only d's blocks: one dropped from another tier frees nothing in
// d.
func (t *tiers) roomFor(d *diskTier, want int) (free, made int) {
	want = max(1, min(want, tierBatch))
	st := d.store.Load()
	free = st.Free()
	for try := 0; try < want/hostMoveBatch+4 && free < want; try++ {
		var gone int
		if d.isHost() {
			gone = t.moveDown(d, min(want-free, hostMoveBatch))
		} else {
			gone = t.evictOldest(d, want-free)
		}
		if gone == 0 {
			break
		}
		made += gone
		free = st.Free()
	}
	return free, made
}

// moveDown moves up to n of the host tier's least recently used blocks
// down to a disk tier, together: each read back (checked), the lot
// written and committed there in one batch, then each, in one step under
// t.mu, freed from the host tier and recorded below (movedDown), then
// announced below and no longer above (under announceMu from the record
// on). With no disk tier, or where a block's write below fails, the block
// is dropped (evict); where its read fails, the record left with no copy
// goes, and a copy committed since stays. One move at a time. Returns how
// many blocks it took from the host tier's list: at most as many left it
// (a block whose write below failed but was claimed meanwhile, or whose
// read failed and was committed again since, stays), so a caller making
// room may look once more.
func (t *tiers) moveDown(h *diskTier, n int) int {
	t.moveMu.Lock()
	defer t.moveMu.Unlock()
	st, ok := h.store.Load().(*disk.MemStore)
	if !ok || n <= 0 {
		return 0
	}
	type moving struct {
		k   disk.Key
		e   *list.Element
		buf []byte
		n   int
		gen uint64
	}
	var ms []moving
	// Each one's link's parent, kept with its copy below: only where the
	// block is the parent's child, as movedDown links it. One whose parent's
	// link went to another block since goes with none, as it is left
	// unlinked: a parent kept below, in a put after the other child's
	// records, would make it the child a restart keeps. relinks, as the
	// links are read, tells movedDown whether a parent's link went from
	// one block to another since.
	parents := map[disk.Key]uint64{}
	t.mu.Lock()
	relinks := t.relinks
	for e := t.lru(h.n).Front(); e != nil && len(ms) < n; e = e.Next() {
		if e.Value.(*tierEntry).gone {
			continue // being dropped: its dropper frees its slot
		}
		k := e.Value.(*tierEntry).key
		ms = append(ms, moving{k: k, e: e})
		if p, ok := t.parentOf[k]; ok && t.child[disk.Key{Hash: p, Tag: k.Tag}] == k.Hash {
			parents[k] = p
		}
	}
	t.mu.Unlock()
	if len(ms) == 0 {
		return 0
	}
	below := t.pickBelow()
	if below == nil {
		for _, m := range ms {
			t.evict(m.e) // the bottom tier evicts
		}
		return len(ms)
	}
	ctx, cancel := context.WithTimeout(t.ctx, time.Minute)
	defer cancel()
	var items []disk.PutItem
	var read []moving
	defer func() {
		for _, m := range read {
			t.putBuffer(m.buf)
		}
	}()
	for _, m := range ms {
		buf := t.buffer()
		if f := t.beforeRead.Load(); f != nil {
			(*f)(h, m.k)
		}
		got, gen, err := st.GetGen(ctx, m.k, buf)
		if f := t.afterRead.Load(); f != nil {
			(*f)(h, m.k, err)
		}
		if err != nil {
			t.putBuffer(buf)
			if errors.Is(err, disk.ErrCorrupt) {
				t.corrupt.Add(1)
				t.log.Warn("tier: host-memory block failed its check: dropped, never served", "hash", m.k.Hash, "err", err)
			}
			// The host store dropped the copy as it read it (its checksum
			// failed), or found none. As a restore's failed read
			// (readBlock), the move acts on the copy read and on the
			// record that names the host tier now, not on m.e as chosen:
			// where the store holds no copy of k by then, that record
			// (m.e, or one made in its place since the choice above, m.e
			// forgotten meanwhile) is marked gone, the sets told at once,
			// and forgotten (lostCopy; dropFound where a generation was
			// read, which drops a copy of that generation the store kept
			// too). Where the store holds a copy of k again (committed to
			// the host tier since the read: placed reuses m.e for it, or
			// records it), that copy and its record stay. A record gone
			// is its dropper's to forget. Nothing is written below; a
			// record this marked counts as an eviction of the host tier.
			f := tierFound{d: h, k: m.k, gen: gen}
			if gen != 0 {
				t.dropFound(&f)
			} else {
				f.e = t.lostCopy(h, m.k)
			}
			if f.e != nil {
				h.evicted.Add(1)
			}
			t.forgetFound(f)
			continue
		}
		m.buf, m.n, m.gen = buf, got, gen
		read = append(read, m)
		items = append(items, parentItem(m.k, buf[:got], parents[m.k]))
	}
	if len(items) == 0 {
		return len(ms)
	}
	t.roomFor(below, len(items))
	errs := below.store.Load().PutBatch(ctx, items)
	if f := t.beforeMoved.Load(); f != nil {
		(*f)()
	}
	for i, m := range read {
		if err := errs[i]; err != nil {
			t.log.Warn("tier: block not moved down from host memory: dropped", "hash", m.k.Hash, "tier", below.n, "err", err)
			below.failed.Add(1)
			t.evict(m.e)
			continue
		}
		below.offloads.Add(1)
		t.movedDown(st, h, below, m.k, m.n, m.gen, relinks)
	}
	if f := t.afterMoved.Load(); f != nil {
		(*f)()
	}
	return len(ms)
}

// movedDown records k, length bytes, in tier below, where it was just
// committed from the host tier h's copy of generation gen, and frees it
// above. Under t.mu, so that no record names a tier without its copy:
// while k's record names h (the copy read, or one put since in its
// place: the same block) the host copy is deleted and the record moved
// below at once; with no record (dropped meanwhile) it is recorded below,
// unlinked (keepMovedLinkLocked); with one below already, the write below
// replaced that copy. Only where another tier holds it is the copy below
// not kept. A copy of another generation in h and recorded nowhere is a
// copy down's under way: its placed finds k below and frees it. A delete of k below under way
// (dropCopy) may take the copy just committed, or not: as placeAll does,
// movedDown waits for it to end first, with no lock held (waitDeleted),
// and then, under announceMu and t.mu with none under way, asks the store
// below whether it holds the copy: where a delete took it, nothing is
// moved nor recorded below (the host copy and its record stay, if
// recorded). Deleting the copy below as a second one, as it was without
// the wait, lost the block where the host copy went meanwhile (its record
// dropped) and the delete below ended without taking the moved copy. Nor
// is the copy below kept where the host copy is being dropped (its record
// gone): the record stays where it is, for its dropper to forget. Where
// k's record below is gone (its copy there being dropped, or dropped), the
// copy just committed below is deleted (dropSecond), as placed has it: the
// dropper forgets the record, and would leave this copy in the store
// recorded nowhere. relinks is t.relinks when the move read the links
// (keepMovedLinkLocked).
func (t *tiers) movedDown(st *disk.MemStore, h, below *diskTier, k disk.Key, length int, gen uint64, relinks uint64) {
	for {
		t.waitDeleted(below, k)
		t.order()
		t.mu.Lock()
		if t.deleting[tierKey{below.n, k}] == 0 {
			break
		}
		// A delete began since the wait: waited for again, announceMu
		// let go of.
		t.mu.Unlock()
		t.announceMu.Unlock()
	}
	e, ok := t.pos[k]
	from := -1
	if ok {
		from = e.Value.(*tierEntry).tier
	}
	// Taken by a delete that ended since the commit below: none to record.
	kept := below.store.Load().Has(k)
	// A record below that is gone is its dropper's, to forget: the copy
	// just committed there is not its copy, and goes as a second one.
	goneBelow := from == below.n && e.Value.(*tierEntry).gone
	moved, recorded := false, false
	switch {
	case !kept:
	case from == h.n && !e.Value.(*tierEntry).gone:
		// By key, not the generation read: a copy put since in its place
		// (placed reusing the record) is the same block, now below, and
		// would be left recorded nowhere.
		if err := st.Delete(k); err != nil && !errors.Is(err, disk.ErrNotFound) {
			t.log.Warn("tier: free a block moved down from host memory", "hash", k.Hash, "err", err)
		}
		// Its parent's link to it kept only if it is still the parent's
		// child: a block linked to that parent since replaced it.
		parent, linked := t.parentOf[k]
		linked = linked && t.child[disk.Key{Hash: parent, Tag: k.Tag}] == k.Hash
		t.unrecordLocked(e)
		t.recordLocked(below, k, length)
		if linked {
			t.linkLocked(k, parent) // the same block, moved
		}
		t.keepMovedLinkLocked(below, k, linked, parent, t.relinks != relinks)
		moved = true
	case from == -1:
		t.recordLocked(below, k, length)
		// Its link went with its record, and it stays unlinked: where
		// another block took the parent's link meanwhile, that block's
		// link is journalled again, after the move's put.
		t.keepMovedLinkLocked(below, k, false, 0, false)
		recorded = true
	}
	if from != h.n {
		st.DeleteIf(k, gen) // recorded nowhere: the copy read, if still there
	}
	t.mu.Unlock()
	switch {
	case moved:
		t.announce(true, below.n, k.Hash)
		t.announce(false, h.n, k.Hash)
	case recorded:
		t.announce(true, below.n, k.Hash)
	}
	t.announceMu.Unlock()
	if kept && !moved && !recorded && (from != below.n || goneBelow) {
		// Another tier holds it, or keeps its record, or below's record
		// is gone: the copy below is recorded nowhere (dropSecond leaves
		// it if below records it by now, not gone).
		t.dropSecond(below, []disk.Key{k})
	}
}

// keepMovedLinkLocked has the journal name k's link as the tiers keep it
// now, k just moved to tier below with the parent moveDown found it linked
// to (or none), or recorded there afresh, unlinked (its host record
// dropped during the move): the link may have changed since, during the
// move. Where k is its parent's child now (linked), the store below keeps
// that parent (keepLinkLocked): journalled where the copy keeps another or
// none, and where relinked (a parent's link went from one block to another
// since moveDown read the links) though it keeps that one: another block
// may have taken the parent's link during the move, its put or link record
// written after the move's put, and k taken it back in the host tier (an
// offer that found k held there, or a copier that placed k there again),
// which the host store keeps unjournalled, so that the move's put is no
// longer the last record to name a child of the parent. Any relink
// counts, of any parent: a move that overlaps one pays a record for each
// block it moves linked. Where k is not its parent's child, and the copy
// below keeps a parent whose child is another block the tiers hold (linked
// to it during the move, its link record perhaps written before the
// move's put), that block's store journals its link again, after the put:
// either way a restart keeps the child the running agent has. t.mu is
// held.
func (t *tiers) keepMovedLinkLocked(below *diskTier, k disk.Key, linked bool, parent uint64, relinked bool) {
	if linked {
		t.keepLinkLocked(below, k, parent, relinked)
		return
	}
	st := below.store.Load()
	if st == nil {
		return
	}
	p, ok := st.Parent(k)
	if !ok {
		return
	}
	c, ok := t.child[disk.Key{Hash: p, Tag: k.Tag}]
	if !ok || c == k.Hash {
		return
	}
	ck := disk.Key{Hash: c, Tag: k.Tag}
	if e, ok := t.pos[ck]; ok {
		t.keepLinkLocked(t.list[e.Value.(*tierEntry).tier], ck, p, true)
	}
}

// evictOldest drops up to n of tier d's least recently used blocks and
// returns how many it dropped: a record gone is being dropped already,
// by another, and is neither dropped again nor counted.
func (t *tiers) evictOldest(d *diskTier, n int) int {
	var es []*list.Element
	t.mu.Lock()
	for e := t.lru(d.n).Front(); e != nil && len(es) < n; e = e.Next() {
		if !e.Value.(*tierEntry).gone {
			es = append(es, e)
		}
	}
	t.mu.Unlock()
	gone := 0
	for _, e := range es {
		if t.evict(e) {
			gone++
		}
	}
	return gone
}

// evict drops the copy that record e names from its tier and forgets it,
// if e is still its block's record and not gone: a block moved to
// another tier or placed again meanwhile is left as it is (false), and
// one whose copy another is dropping already (an eviction racing this
// one, a restore that found the copy corrupt) is not dropped, counted nor
// reported as room made twice (false). The copy is deleted
// with its record marked gone and the sets holding the block told first
// (dropCopyOf), then the record forgotten (forgetIf): e's copy and e
// only, so that where a restore dropped e's copy and forgot e after this
// claim, and a copy committed since was recorded in e's place, that
// record and its copy stay.
//
// From the claim to the forget (the drop's delete and, after it, the
// forget's wait for announceMu) e is gone and no tier holds the block
// (where, heldLocked): a copy down of it that ends meanwhile (the block
// still in a set's memory, which the drop told its copy below is gone)
// writes it again to the tier pick gives, and placed, finding e gone,
// has that copy deleted as a second one (dropSecond: a write and a delete
// wasted per such copy down), its offload ended as not copied below
// (offloaded, heldLocked), the block left in memory unmarked, offered
// again; one placed after the forget is recorded. Nothing is lost, no
// record names a tier without its copy, no copy is left recorded nowhere,
// and nothing is served from e (a restore, a Lookup or a lease finds the
// block in no tier then).
func (t *tiers) evict(e *list.Element) bool {
	te := e.Value.(*tierEntry)
	t.mu.Lock()
	ok := t.pos[te.key] == e && !te.gone
	if ok {
		te.gone = true // this eviction's: another finds it gone (dropCopy marks it again)
	}
	t.mu.Unlock()
	if !ok {
		return false
	}
	d := t.list[te.tier]
	if f := t.beforeEvictDrop.Load(); f != nil {
		(*f)(d, te.key)
	}
	// e's copy only: a record placed since in e's place (its copy dropped
	// and e forgotten meanwhile) keeps its copy.
	if err := t.dropCopyOf(d, te.key, true, e); err != nil && !errors.Is(err, disk.ErrNotFound) {
		t.log.Warn("tier: evict", "hash", te.key.Hash, "tier", d.n, "err", err)
	}
	d.evicted.Add(1)
	t.forgetIf(d, te.key, e)
	return true
}

// tierOf is the tier that holds k, nil if none does or there are no tiers.
func (a *Agent) tierOf(k disk.Key) *diskTier {
	if a.tiers == nil {
		return nil
	}
	return a.tiers.where(k)
}
