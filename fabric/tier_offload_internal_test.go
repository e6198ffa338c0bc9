package fabric

import (
	"bytes"
	"container/list"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// A block on disk is found at once, though a copy down of its hash (from
// another set) is queued and never ends; one not on disk waits for its
// pending copy until the context ends.
func TestTierWhereWaitFindsDiskBlockWithoutWaiting(t *testing.T) {
	d := &diskTier{n: 0}
	tr := &tiers{list: []*diskTier{d}, pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 1),
		pending: map[uint64]*pendingCopy{}, done: make(chan struct{})}
	onDisk := disk.Key{Hash: 7, Tag: 1}
	notOnDisk := disk.Key{Hash: 8, Tag: 1}
	tr.recordLocked(d, onDisk, 4096)
	for _, h := range []uint64{onDisk.Hash, notOnDisk.Hash} {
		tr.pending[h] = &pendingCopy{n: 1, done: make(chan struct{})} // never closed
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	found := make(chan *diskTier, 1)
	go func() { found <- tr.whereWait(ctx, onDisk) }()
	select {
	case got := <-found:
		if got != d {
			t.Fatalf("whereWait of a block on disk = %v, want tier 0", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("whereWait of a block on disk waited for a pending copy of its hash")
	}

	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if got := tr.whereWait(short, notOnDisk); got != nil {
		t.Fatalf("whereWait of a block not on disk = %v, want nil", got)
	}
	if short.Err() == nil {
		t.Fatal("whereWait of a block not on disk returned before its pending copy ended or its context did")
	}
}

// A copier's batch is tierBatch blocks, fewer where their buffers would
// pass tierBatchBytes, and one block until the block size is known.
func TestTierBatchLen(t *testing.T) {
	for _, tc := range []struct {
		desc string
		room int64
		want int
	}{
		{"block size not known yet", 0, 1},
		{"small blocks: the count bounds it", 4096, tierBatch},
		{"blocks at the count's share of the bytes", tierBatchBytes / tierBatch, tierBatch},
		{"a byte past it", tierBatchBytes/tierBatch + 1, tierBatch - 1},
		{"blocks of 256 KiB and a trailer", 266240, 126},
		{"one block fills the bytes", tierBatchBytes, 1},
		{"a block past the bytes still goes", tierBatchBytes + 4096, 1},
	} {
		var tr tiers
		tr.room.Store(tc.room)
		if got := tr.batchLen(); got != tc.want {
			t.Errorf("%s (room %d): batch of %d, want %d", tc.desc, tc.room, got, tc.want)
		}
	}
}

// A slot is written to (and read from) disk straight from its memory only
// where O_DIRECT takes it as it is: its canonical pieces, contiguous chunks
// joined, each page aligned and whole pages, at most maxDirectPieces of
// them; the pieces then hold exactly the bytes a gather would. Anything
// else is gathered (nil).
func TestSlotPieces(t *testing.T) {
	model := layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16} // chunks of 32 KiB at page 16
	for _, tc := range []struct {
		desc   string
		mod    func(l *layout.Layout)
		offset int // the regions start this far past a page
		pieces int // 0: gathered
	}{
		{"one rank, contiguous: one piece", nil, 0, 1},
		{"two ranks: a piece each", func(l *layout.Layout) { l.TPSize = 2 }, 0, 2},
		{"layers apart: a piece per layer", func(l *layout.Layout) { l.Arrangement = layout.LayerSeparate }, 0, 4},
		{"regions not page aligned", nil, 64, 0},
		{"chunks shorter than a page, joined into whole pages", func(l *layout.Layout) { l.PageSize = 1 }, 0, 1},
		{"a shard not whole pages", func(l *layout.Layout) { l.PageSize, l.Model.HeadDim = 1, 100 }, 0, 0},
		{"more pieces than a vectored write takes", func(l *layout.Layout) {
			l.Arrangement, l.Model.Layers = layout.LayerSeparate, maxDirectPieces+1
		}, 0, 0},
		{"as many as it takes", func(l *layout.Layout) {
			l.Arrangement, l.Model.Layers = layout.LayerSeparate, maxDirectPieces
		}, 0, maxDirectPieces},
	} {
		l := &layout.Layout{Model: model, PageSize: 16, TPSize: 1, Order: layout.HND, Arrangement: layout.FullyContiguous,
			Alignment: 4096, Slots: 3}
		if tc.mod != nil {
			tc.mod(l)
		}
		region := int(l.Strides().Region)
		regions := make([][]byte, l.TPSize)
		for r := range regions {
			regions[r] = alignedBuffer(region + disk.Align)[tc.offset : tc.offset+region]
			for i := range regions[r] {
				regions[r][i] = byte(i*7 + r*3 + i>>12)
			}
		}
		const slot = 1
		pieces := slotPieces(l, regions, slot)
		if len(pieces) != tc.pieces {
			t.Errorf("%s: %d pieces, want %d", tc.desc, len(pieces), tc.pieces)
			continue
		}
		if pieces == nil {
			continue
		}
		want := make([]byte, tierBlockBytes(l)-tierTrailer)
		gatherBlock(l, regions, slot, want)
		if got := bytes.Join(pieces, nil); !bytes.Equal(got, want) {
			t.Errorf("%s: the pieces hold %d bytes, not the %d a gather does", tc.desc, len(got), len(want))
		}
	}
}

// With two tiers full, making room in one drops that tier's least
// recently used blocks, however much older the other tier's are: a block
// dropped from the other frees nothing where the copy goes.
func TestTierMakeRoomEvictsFromItsTier(t *testing.T) {
	tr := &tiers{a: &Agent{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 2)}
	const slots = 4
	for i := range 2 {
		st, err := disk.Open(disk.Config{Dir: t.TempDir(), Bytes: slots * disk.Align, SlotBytes: disk.Align, Buffered: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		d := &diskTier{n: i}
		d.store.Store(st)
		tr.list = append(tr.list, d)
	}
	// Tier 0's blocks are all older than tier 1's.
	for i := range 2 * slots {
		d := tr.list[i/slots]
		k := disk.Key{Hash: uint64(i + 1), Tag: 1}
		if err := d.store.Load().Put(context.Background(), k, bytes.Repeat([]byte{byte(i)}, 100)); err != nil {
			t.Fatal(err)
		}
		placeCopy(tr, d, k, disk.Align)
	}
	d1 := tr.list[1]
	tr.roomFor(d1, 1)
	if got := d1.store.Load().Free(); got != 1 {
		t.Fatalf("tier 1 has %d free slots after making room, want 1", got)
	}
	if got := tr.list[0].store.Load().Stats().Blocks; got != slots {
		t.Fatalf("tier 0 holds %d of its %d blocks after making room in tier 1", got, slots)
	}
	if tr.where(disk.Key{Hash: slots + 1, Tag: 1}) != nil {
		t.Fatal("tier 1's least recently used block is still held")
	}
	if tr.where(disk.Key{Hash: 1, Tag: 1}) == nil {
		t.Fatal("the tiers' least recently used block (tier 0's) was dropped")
	}
}

// A copy under a block set's lock (take) uses only a stager the tiers
// keep: with none kept it is refused at once, without making one (the
// agent here has no staging to make one from, which a try would touch).
func TestTierTakeMakesNoStager(t *testing.T) {
	tr := &tiers{a: &Agent{}}
	if _, err := tr.stager(0, false); err != errNoStagerKept {
		t.Fatalf("stager with none kept, none to be made: %v, want errNoStagerKept", err)
	}
}

// forget of a block in a tier its record no longer names (the block moved
// to another tier meanwhile) leaves the record, and the bytes counted for
// each tier, as they are; in the tier named, it drops them.
func TestTierForgetOnlyItsTier(t *testing.T) {
	tr := &tiers{a: &Agent{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 2)}
	tr.list = []*diskTier{{n: 0}, {n: 1}}
	k := disk.Key{Hash: 3, Tag: 1}
	placeCopy(tr, tr.list[1], k, 100)
	e := tr.recordIn(tr.list[1], k)
	tr.forgetIf(tr.list[0], k, e)
	if tr.where(k) != tr.list[1] || tr.heldBytes[0] != 0 || tr.heldBytes[1] != 100 {
		t.Fatalf("forget in tier 0 of a block recorded in tier 1: held by %v, bytes %v; want tier 1, [0 100]", tr.where(k), tr.heldBytes)
	}
	tr.forgetIf(tr.list[1], k, e)
	if tr.where(k) != nil || tr.heldBytes[1] != 0 {
		t.Fatalf("forget in its tier: held by %v, bytes %v; want none, [0 0]", tr.where(k), tr.heldBytes)
	}
}

// A block committed twice to one tier (two sets' copies of it in one
// copier batch, or two copiers at once) is one copy there: recorded and
// counted once, and announced once, the second placed saying not to.
func TestTierPlacedTwiceInOneTierAnnouncesOnce(t *testing.T) {
	tr := &tiers{a: &Agent{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 2)}
	tr.list = []*diskTier{{n: 0}, {n: 1}}
	k, other := disk.Key{Hash: 3, Tag: 1}, disk.Key{Hash: 4, Tag: 1}
	if !placeCopy(tr, tr.list[1], k, 100) {
		t.Fatal("the first copy of a block is not to be announced")
	}
	if !placeCopy(tr, tr.list[1], other, 100) {
		t.Fatal("another block's first copy is not to be announced")
	}
	if placeCopy(tr, tr.list[1], k, 100) {
		t.Fatal("a second commit of a block to the tier holding it is to be announced again")
	}
	if tr.where(k) != tr.list[1] || tr.heldBytes[1] != 200 || tr.lru(1).Len() != 2 {
		t.Fatalf("after a second commit: held by %v, bytes %v, %d records; want tier 1, 200, 2", tr.where(k), tr.heldBytes, tr.lru(1).Len())
	}
	if back := tr.lru(1).Back().Value.(*tierEntry).key; back != k {
		t.Fatalf("the most recently used record is %v, want the block committed again, %v", back, k)
	}
}

// hostOverDisk is tiers of a host tier of slots blocks over a disk tier,
// of blocks of disk.Align bytes, without an agent's workers.
func hostOverDisk(t *testing.T, slots int) (*tiers, *diskTier, *diskTier) {
	t.Helper()
	tr := &tiers{a: &Agent{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 2), blockBytes: disk.Align, ctx: context.Background()}
	tr.room.Store(disk.Align)
	mem, err := disk.NewMem(disk.MemConfig{Bytes: int64(slots) * disk.Align, SlotBytes: disk.Align})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close() })
	st, err := disk.Open(disk.Config{Dir: t.TempDir(), Bytes: 64 * disk.Align, SlotBytes: disk.Align, Buffered: true, Logger: tr.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h := &diskTier{n: 0, spec: TierSpec{Kind: tierHost}}
	h.store.Store(mem)
	d := &diskTier{n: 1, spec: TierSpec{Kind: "disk"}}
	d.store.Store(st)
	tr.list = []*diskTier{h, d}
	return tr, h, d
}

// Whatever copies of a block a move down races with, the tier its record
// names holds it: a second copy committed to the host tier while the block
// moves down, before the move's record below or after it, and recorded
// before or after it, leaves no record naming a tier without the block,
// and no copy no record names.
func TestHostMoveRacingASecondCopy(t *testing.T) {
	for _, tc := range []struct {
		desc   string
		after  bool // the second copy committed after the move's record, else before
		placed bool // and recorded at once, else once the move ended
	}{
		{"committed and recorded before the move's record", false, true},
		{"committed before the move's record, recorded after the move", false, false},
		{"committed and recorded after the move's record", true, true},
	} {
		tr, h, d := hostOverDisk(t, 4)
		ctx := context.Background()
		k := disk.Key{Hash: 9, Tag: 1}
		data := bytes.Repeat([]byte{0x5a}, 3000)
		if err := h.store.Load().Put(ctx, k, data); err != nil {
			t.Fatal(err)
		}
		placeCopy(tr, h, k, len(data))
		second := func() {
			if err := h.store.Load().Put(ctx, k, data); err != nil {
				t.Error(err)
				return
			}
			if tc.placed {
				placeCopy(tr, h, k, len(data))
			}
		}
		hook := &tr.beforeMoved
		if tc.after {
			hook = &tr.afterMoved
		}
		hook.Store(&second)
		if tr.moveDown(h, 1) == 0 {
			t.Fatalf("%s: nothing moved", tc.desc)
		}
		hook.Store(nil)
		if !tc.placed {
			placeCopy(tr, h, k, len(data))
		}
		at := tr.where(k)
		if at == nil {
			t.Fatalf("%s: no record of the block", tc.desc)
		}
		buf := make([]byte, disk.Align)
		n, err := at.store.Load().Get(ctx, k, buf)
		if err != nil || !bytes.Equal(buf[:n], data) {
			t.Fatalf("%s: the record names tier %d, whose copy reads %d bytes, %v", tc.desc, at.n, n, err)
		}
		for _, x := range []*diskTier{h, d} {
			if x != at && x.store.Load().Stats().Blocks != 0 {
				t.Fatalf("%s: tier %d holds a copy no record names", tc.desc, x.n)
			}
			want := int64(0)
			if x == at {
				want = int64(len(data))
			}
			if tr.heldBytes[x.n] != want {
				t.Fatalf("%s: tier %d counts %d bytes, want %d", tc.desc, x.n, tr.heldBytes[x.n], want)
			}
		}
	}
}

// A full host tier makes room for a batch in moves down of hostMoveBatch
// blocks at most: its least recently used blocks written below in one
// batch (one commit there) per hostMoveBatch, as many as the batch needs;
// then each is recorded below, byte for byte, and freed above.
func TestHostRoomMovesABatch(t *testing.T) {
	for _, tc := range []struct {
		desc        string
		slots, want int
		commits     uint64
	}{
		{"a batch of 8", 8, 8, 1},
		{"a batch of hostMoveBatch", hostMoveBatch, hostMoveBatch, 1},
		{"one past hostMoveBatch: two moves", hostMoveBatch + 1, hostMoveBatch + 1, 2},
	} {
		tr, h, d := hostOverDisk(t, tc.slots)
		ctx := context.Background()
		data := func(i int) []byte { return bytes.Repeat([]byte{byte(i + 1)}, 3000) }
		for i := range tc.slots {
			k := disk.Key{Hash: uint64(i + 1), Tag: 1}
			if err := h.store.Load().Put(ctx, k, data(i)); err != nil {
				t.Fatal(err)
			}
			placeCopy(tr, h, k, 3000)
		}
		commits := d.store.Load().Stats().Commits
		tr.roomFor(h, tc.want)
		if free := h.store.Load().Free(); free != tc.want {
			t.Fatalf("%s: %d free host slots, want %d", tc.desc, free, tc.want)
		}
		if got := d.store.Load().Stats().Commits - commits; got != tc.commits {
			t.Fatalf("%s: %d commits below, want %d", tc.desc, got, tc.commits)
		}
		buf := make([]byte, disk.Align)
		for i := range tc.slots {
			k := disk.Key{Hash: uint64(i + 1), Tag: 1}
			at := tr.where(k)
			if want := h; i < tc.want {
				want = d
				if at != want {
					t.Fatalf("%s: block %d (of the oldest) in tier %v, want the disk tier", tc.desc, i, at)
				}
			} else if at != want {
				t.Fatalf("%s: block %d (of the newest) in tier %v, want the host tier", tc.desc, i, at)
			}
			if n, err := at.store.Load().Get(ctx, k, buf); err != nil || !bytes.Equal(buf[:n], data(i)) {
				t.Fatalf("%s: block %d reads %d bytes, %v", tc.desc, i, n, err)
			}
		}
	}
}

// roomFor in a full disk tier (the bottom) drops as many of its least
// recently used blocks as it needs at once, up to a copier's batch
// (tierBatch): asked for one more than that, it makes tierBatch free
// slots, never more.
func TestTierRoomForEvictsTheOldestUpToABatch(t *testing.T) {
	for _, tc := range []struct {
		desc      string
		want, got int
	}{
		{"three", 3, 3},
		{"a batch", tierBatch, tierBatch},
		{"one past a batch", tierBatch + 1, tierBatch},
	} {
		tr := &tiers{a: &Agent{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 1)}
		const slots = tierBatch + 8
		st, err := disk.Open(disk.Config{Dir: t.TempDir(), Bytes: slots * disk.Align, SlotBytes: disk.Align, Buffered: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		d := &diskTier{n: 0, spec: TierSpec{Kind: "disk"}}
		d.store.Store(st)
		tr.list = []*diskTier{d}
		items := make([]disk.PutItem, slots)
		for i := range items {
			items[i] = disk.PutItem{Key: disk.Key{Hash: uint64(i + 1), Tag: 1}, Data: bytes.Repeat([]byte{byte(i)}, 100)}
		}
		for i, err := range st.PutBatch(context.Background(), items) {
			if err != nil {
				t.Fatal(err)
			}
			placeCopy(tr, d, items[i].Key, disk.Align)
		}
		if free, made := tr.roomFor(d, tc.want); free != tc.got || made != tc.got || st.Free() != tc.got {
			t.Fatalf("%s: roomFor says %d free after dropping %d, the store %d free; want %d", tc.desc, free, made, st.Free(), tc.got)
		}
		for i, it := range items {
			if held := tr.where(it.Key) != nil; held != (i >= tc.got) {
				t.Fatalf("%s: block %d (oldest first) held %v after making room for %d", tc.desc, i, held, tc.want)
			}
		}
		if got := tr.heldBytes[0]; got != int64(slots-tc.got)*disk.Align {
			t.Fatalf("%s: %d bytes counted, want %d", tc.desc, got, (slots-tc.got)*disk.Align)
		}
	}
}

// A block found in two disk tiers when they open (a crash between a copy
// placed in one and the other's dropped) is recorded once, in the first
// tier, and the second copy's slot is freed: a second record would leave
// the first orphaned in its tier's list and counted in its bytes. Where
// the first tier's copy fails its check (its slot written again after a
// delete left for a commit that the crash cut), it is dropped and the
// second kept: the node keeps the block.
func TestTierOpenKeepsOneOfTwoCopies(t *testing.T) {
	for _, corrupt := range []bool{false, true} {
		t.Run(fmt.Sprintf("first corrupt=%v", corrupt), func(t *testing.T) { openTwoCopies(t, corrupt) })
	}
}

func openTwoCopies(t *testing.T, corrupt bool) {
	const slot = disk.Align
	twice, once := disk.Key{Hash: 7, Tag: 1}, disk.Key{Hash: 8, Tag: 1}
	var specs []TierSpec
	for i := range 2 {
		dir := t.TempDir()
		specs = append(specs, TierSpec{Path: dir, Size: 16 * slot})
		st, err := disk.Open(disk.Config{Dir: dir, Bytes: 16 * slot, SlotBytes: slot, Buffered: true})
		if err != nil {
			t.Fatal(err)
		}
		items := []disk.PutItem{{Key: twice, Data: bytes.Repeat([]byte{byte(i)}, slot)}}
		if i == 1 {
			items = append(items, disk.PutItem{Key: once, Data: bytes.Repeat([]byte{9}, slot)})
		}
		for _, err := range st.PutBatch(context.Background(), items) {
			if err != nil {
				t.Fatal(err)
			}
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if corrupt {
		// twice is tier 0's only block: its first slot, at the start of
		// its first data file.
		f, err := os.OpenFile(filepath.Join(specs[0].Path, "blocks.000"), os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt([]byte{0xff}, 100); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	tr := &tiers{log: slog.New(slog.NewTextHandler(io.Discard, nil)), blockBytes: slot,
		layouts: map[uint64]*layout.Layout{1: nil}, pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 2)}
	for i, s := range specs {
		tr.list = append(tr.list, &diskTier{n: i, spec: s})
	}
	tr.mu.Lock()
	err := tr.openStoresLocked()
	tr.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, d := range tr.list {
			d.store.Load().Close()
		}
	}()
	tierOf := func(k disk.Key) int {
		if d := tr.where(k); d != nil {
			return d.n
		}
		return -1
	}
	keep, drop := 0, 1
	if corrupt {
		keep, drop = 1, 0
	}
	if n := tierOf(twice); n != keep {
		t.Fatalf("the block in both tiers is recorded in tier %d, want %d", n, keep)
	}
	if n := tierOf(once); n != 1 {
		t.Fatalf("the block in tier 1 alone is recorded in tier %d, want 1", n)
	}
	if tr.list[drop].store.Load().Has(twice) {
		t.Fatalf("tier %d still holds the copy not kept", drop)
	}
	got := make([]byte, slot)
	if _, err := tr.list[keep].store.Load().Get(context.Background(), twice, got); err != nil || !bytes.Equal(got, bytes.Repeat([]byte{byte(keep)}, slot)) {
		t.Fatalf("the copy kept in tier %d: %v, or wrong bytes", keep, err)
	}
	if keys, free := tr.list[1].store.Load().Keys(), tr.list[1].store.Load().Free(); len(keys) != 1+keep || free != 15-keep {
		t.Fatalf("tier 1 holds %v with %d slots free, want %d blocks and %d free", keys, free, 1+keep, 15-keep)
	}
	want := []int64{slot, slot}
	if corrupt {
		want = []int64{0, 2 * slot}
	}
	if got := []int64{tr.heldBytes[0], tr.heldBytes[1]}; got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("bytes counted per tier %v, want %v", got, want)
	}
	if n := tr.lru(0).Len() + tr.lru(1).Len(); n != 2 {
		t.Fatalf("%d entries in the tiers' lists, want 2", n)
	}
	if c := tr.corrupt.Load(); c != uint64(keep) {
		t.Fatalf("%d checksum failures counted, want %d", c, keep)
	}
}

// placeCopy records k, length bytes, in tier d as a copier does once its
// commit there ended (placed), and deletes the copy just committed where
// another tier holds the block (dropSecond). It says whether to announce
// it.
func placeCopy(tr *tiers, d *diskTier, k disk.Key, length int) bool {
	announce, second := place(tr, d, k, length)
	if second {
		tr.dropSecond(d, []disk.Key{k})
	}
	return announce
}

// place records k's copy just committed to d as a copier does (placed,
// after waiting for the deletes of k in d under way: placeAll), without
// announcing it nor taking announceMu, and says whether it is to be
// announced, or deleted as a second copy.
func place(tr *tiers, d *diskTier, k disk.Key, length int) (announce, second bool) {
	for {
		tr.waitDeleted(d, k)
		if announce, second, ok := tr.placed(d, k, length); ok {
			return announce, second
		}
	}
}

// A copy committed to a tier while another tier holds the block as its
// record is recorded nowhere, and placed says so rather than deleting it
// under the tiers' locks: dropSecond deletes it, the other tier's copy and
// record staying; unless the tier holds it as its record by then (the
// block moved there meanwhile), when the copy is the record's and stays.
func TestTierSecondCopyDeletedOutsideTheLocks(t *testing.T) {
	for _, tc := range []struct {
		desc  string
		moved bool // the block's record moved to the tier of the second copy before dropSecond
	}{
		{"recorded in the other tier", false},
		{"its record moved to this tier meanwhile", true},
	} {
		tr, h, d := hostOverDisk(t, 4)
		ctx := context.Background()
		k := disk.Key{Hash: 11, Tag: 1}
		data := bytes.Repeat([]byte{0x3c}, 3000)
		for _, x := range []*diskTier{d, h} {
			if err := x.store.Load().Put(ctx, k, data); err != nil {
				t.Fatal(err)
			}
		}
		if announce, second := place(tr, d, k, len(data)); !announce || second {
			t.Fatalf("%s: the first copy placed: announce %v, second %v; want true, false", tc.desc, announce, second)
		}
		announce, second := place(tr, h, k, len(data))
		if announce || !second {
			t.Fatalf("%s: a copy of a block recorded in another tier placed: announce %v, second %v; want false, true", tc.desc, announce, second)
		}
		if got := h.store.Load().Stats().Blocks; got != 1 {
			t.Fatalf("%s: placed deleted the second copy itself (%d blocks left), want it left to dropSecond", tc.desc, got)
		}
		want := d
		if tc.moved {
			tr.mu.Lock()
			tr.unrecordLocked(tr.pos[k])
			tr.recordLocked(h, k, len(data))
			tr.mu.Unlock()
			want = h
		}
		tr.dropSecond(h, []disk.Key{k})
		if tr.where(k) != want {
			t.Fatalf("%s: the block recorded in tier %v, want tier %d", tc.desc, tr.where(k), want.n)
		}
		wantHost := 0
		if tc.moved {
			wantHost = 1
		}
		if got := h.store.Load().Stats().Blocks; got != wantHost {
			t.Fatalf("%s: the host tier holds %d copies after dropSecond, want %d", tc.desc, got, wantHost)
		}
		buf := make([]byte, disk.Align)
		if n, err := d.store.Load().Get(ctx, k, buf); err != nil || !bytes.Equal(buf[:n], data) {
			t.Fatalf("%s: the disk tier's copy reads %d bytes, %v", tc.desc, n, err)
		}
	}
}
