package fabric

import (
	"bytes"
	"container/list"
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// belowSet is a pool of one block set of 4 slots, its slots registered as
// blocks 1 to 4 (each a sequence of its own), block 1 the least recently
// used, with block 1 alone marked as copied below; and tiers over it, of
// one tier (a host tier where host, else a disk tier) holding block 1's
// copy, recorded, without workers. With offloading, block 1 is not marked
// but its copy down is under way (offered to the pool's Offload hook).
// The set keeps no free slots in reserve (no low watermark), so that
// AllocateSpare takes block 1's slot where it may.
func belowSet(t *testing.T, host, offloading bool) (*tiers, *pool.BlockSet, disk.Key) {
	t.Helper()
	cfg := pool.Config{ExpiryInterval: -1, LowWatermark: -1}
	if offloading {
		cfg.Offload = func(_ *pool.BlockSet, _ pool.Block, hash, _ uint64) bool { return hash == 1 }
	}
	_, p := hostPool(t, 8<<20, "below-test", cfg)
	set, err := p.NewBlockSet(belowLayout(4))
	if err != nil {
		t.Fatal(err)
	}
	blks, err := set.Allocate(4)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range blks {
		reg, err := set.RegisterBatch([]pool.Registration{{Block: b, Hash: uint64(i + 1), Below: i == 0 && !offloading}}, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := set.Release(reg[0]); err != nil {
			t.Fatal(err)
		}
	}
	a := &Agent{pool: p, sets: map[pool.SetID]*engineSet{set.ID(): {set: set}}}
	tr := &tiers{a: a, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 1), blockBytes: disk.Align, ctx: context.Background()}
	d := &diskTier{n: 0, spec: TierSpec{Kind: "disk"}}
	if host {
		mem, err := disk.NewMem(disk.MemConfig{Bytes: 4 * disk.Align, SlotBytes: disk.Align})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { mem.Close() })
		d.spec.Kind = tierHost
		d.store.Store(mem)
	} else {
		st, err := disk.Open(disk.Config{Dir: t.TempDir(), Bytes: 4 * disk.Align, SlotBytes: disk.Align, Buffered: true, Logger: tr.log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		d.store.Store(st)
	}
	tr.list = []*diskTier{d}
	k := disk.Key{Hash: 1, Tag: shapeTag(set.Layout())}
	if err := d.store.Load().Put(context.Background(), k, bytes.Repeat([]byte{7}, 1000)); err != nil {
		t.Fatal(err)
	}
	placeCopy(tr, d, k, disk.Align)
	if offloading {
		if n := set.CopyDown(); n != 1 {
			t.Fatalf("%d copies down under way, want block 1's", n)
		}
	} else if !set.Below(mustLookup(t, set, 1)) {
		t.Fatal("block 1 is not marked as copied below")
	}
	return tr, set, k
}

// restoreSet is belowSet's tiers, their first tier d and block k, with a
// second block set of the same shape (other) for restores to read into.
func restoreSet(t *testing.T, host bool) (tr *tiers, d *diskTier, other *pool.BlockSet, k disk.Key) {
	t.Helper()
	tr, _, k = belowSet(t, host, false)
	other, err := tr.a.pool.NewBlockSet(belowLayout(2))
	if err != nil {
		t.Fatal(err)
	}
	return tr, tr.list[0], other, k
}

// belowLayout is a small layout of slots slots: a block of 1 KiB, which
// with its trailer fits a tier slot of disk.Align.
// hostPool is a pool over host storage of size bytes, both closed when
// the test ends.
func hostPool(tb testing.TB, size uint64, name string, cfg pool.Config) (pool.Storage, *pool.Pool) {
	tb.Helper()
	storage, err := pool.NewHostStorage(pool.HostConfig{Size: size, Name: name})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { storage.Close() })
	p, err := pool.New(storage, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return storage, p
}

func belowLayout(slots int) *layout.Layout {
	return &layout.Layout{Model: layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 16, DType: layout.DTypeBF16},
		PageSize: 16, TPSize: 1, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 256, Slots: slots}
}

func mustLookup(t *testing.T, set *pool.BlockSet, hash uint64) pool.Block {
	t.Helper()
	b, ok := set.Lookup(hash)
	if !ok {
		t.Fatalf("block %d is not in the set", hash)
	}
	return b
}

// A tier that drops a block's copy (evicts it, from a disk tier or from
// host memory) clears the copied-below mark of the block in memory before
// the copy goes: a set that recycles right after the store dropped it,
// with room to spare (AllocateSpare: only blocks with a copy below), keeps
// the block, its only copy on the node, rather than drop it as copied.
func TestTierDropClearsBelowFirst(t *testing.T) {
	for _, host := range []bool{false, true} {
		name := "disk"
		if host {
			name = "host"
		}
		t.Run(name, func(t *testing.T) {
			tr, set, k := belowSet(t, host, false)
			d := tr.list[0]
			ran := false
			f := func(dd *diskTier, kk disk.Key) {
				if dd != d || kk != k {
					return
				}
				ran = true
				if _, err := set.AllocateSpare(4, 0); err != nil {
					t.Errorf("spare slots after the copy went: %v", err)
				}
			}
			tr.afterDrop.Store(&f)
			tr.mu.Lock()
			e := tr.pos[k]
			tr.mu.Unlock()
			if !tr.evict(e) {
				t.Fatal("the block's copy was not evicted")
			}
			if !ran {
				t.Fatal("the tier dropped no copy of the block")
			}
			if tr.where(k) != nil {
				t.Fatal("the tier still records the block it evicted")
			}
			b, ok := set.Lookup(k.Hash)
			if !ok {
				t.Fatal("the block is on neither the tier nor in memory: recycled as copied below after its copy went")
			}
			if set.Below(b) {
				t.Fatal("the block is still marked as copied below after the tier dropped its copy")
			}
		})
	}
}

// A copy down that ends after the tier dropped the block's copy (it found
// the block recorded there and wrote nothing, or a drop took what it
// wrote) does not mark the block as copied below: recycling with room to
// spare keeps it. While the tier holds the copy, it does.
func TestTierCopyDownEndedAfterDropNotBelow(t *testing.T) {
	for _, dropped := range []bool{false, true} {
		tr, set, k := belowSet(t, false, true)
		b := mustLookup(t, set, 1)
		if dropped {
			tr.mu.Lock()
			e := tr.pos[k]
			tr.mu.Unlock()
			if !tr.evict(e) {
				t.Fatal("the block's copy was not evicted")
			}
		}
		if err := tr.offloaded(&offloadJob{set: set, blk: b, hash: k.Hash}, copied{ok: true, key: k}); err != nil {
			t.Fatal(err)
		}
		if got := set.Below(b); got == dropped {
			t.Fatalf("copy dropped %v: the block marked copied below %v, want %v", dropped, got, !dropped)
		}
		if _, err := set.AllocateSpare(4, 0); err != nil {
			t.Fatal(err)
		}
		if _, ok := set.Lookup(k.Hash); ok == !dropped {
			t.Fatalf("copy dropped %v: the block in memory after spare slots were taken: %v, want %v", dropped, ok, dropped)
		}
	}
}

// A second copy deleted from a tier (dropSecond: another tier holds the
// block) while a commit of the block to that tier ends is recorded
// nowhere: the delete may have taken the commit's copy, and a record of it
// would name a tier without the block, copied below on its strength.
func TestTierSecondCopyDeleteTakesACommitUnrecorded(t *testing.T) {
	tr, h, d := hostOverDisk(t, 4)
	ctx := context.Background()
	k := disk.Key{Hash: 5, Tag: 1}
	data := bytes.Repeat([]byte{0x5a}, 3000)
	for _, x := range []*diskTier{h, d} {
		if err := x.store.Load().Put(ctx, k, data); err != nil {
			t.Fatal(err)
		}
	}
	placeCopy(tr, h, k, disk.Align)
	ran := false
	done := make(chan struct{})
	f := func(dd *diskTier, kk disk.Key) {
		if dd != d || kk != k || ran {
			return
		}
		ran = true
		// Meanwhile the host tier's copy went, and a commit of the block
		// to d, written before the delete, ends (placed waits for the
		// delete to end).
		tr.evict(tr.lru(h.n).Front())
		go func() {
			defer close(done)
			placeCopy(tr, d, k, disk.Align)
		}()
	}
	tr.afterDrop.Store(&f)
	tr.dropSecond(d, []disk.Key{k})
	if !ran {
		t.Fatal("the second copy was not deleted")
	}
	waitClosed(t, done, "the commit placed")
	tr.mu.Lock()
	held := tr.heldLocked(k)
	tr.mu.Unlock()
	stored := d.store.Load().(*disk.Store).Has(k)
	if held && !stored {
		t.Fatalf("the block is recorded in tier %d, which does not hold it", d.n)
	}
}

// A restore that finds a tier's copy corrupt (the store drops it as it
// reads it) clears the copied-below mark of the sets holding the block at
// once, not when the record is forgotten: spare-slot recycling meanwhile
// keeps the block. So does one whose read the tiers' own checks find
// corrupt (belowSet's copy is of the wrong length) where the store holds
// no copy by the drop (gone after the read: dropCopyGen marks the record
// as lostCopy does), in host memory and on disk.
func TestTierCorruptCopyClearsBelowAtOnce(t *testing.T) {
	for _, tc := range []struct {
		desc       string
		host, gone bool // gone: the copy goes after the read, else the store's check drops it
	}{
		{"dropped by the store", true, false},
		{"gone after the read/host", true, true},
		{"gone after the read/disk", false, true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			tr, set, k := belowSet(t, tc.host, false)
			d := tr.list[0]
			other, err := tr.a.pool.NewBlockSet(belowLayout(2)) // the same shape: restored into
			if err != nil {
				t.Fatal(err)
			}
			if !tc.gone {
				if !d.store.Load().(*disk.MemStore).CorruptForTest(k, 10, 0x40) {
					t.Fatal("the tier's copy was not corrupted")
				}
			} else {
				ran := false
				f := func(dd *diskTier, kk disk.Key, rerr error) {
					if dd != d || kk != k || ran {
						return
					}
					ran = true
					if rerr != nil {
						t.Errorf("the store's read of the copy: %v, want it read whole", rerr)
					}
					if err := d.store.Load().Delete(k); err != nil {
						t.Error(err)
					}
				}
				tr.afterRead.Store(&f)
				defer func() {
					tr.afterRead.Store(nil)
					if !ran {
						t.Error("the block was not read")
					}
				}()
			}
			find := func(_ context.Context, k disk.Key) *diskTier { return tr.where(k) }
			alloc := func(_ context.Context, s *pool.BlockSet, n int) ([]pool.Block, error) { return s.Allocate(n) }
			var lost []disk.Key
			var belowThen []bool
			forget := func(f tierFound) { // not forgotten: the marks cleared before
				lost = append(lost, f.k)
				if b, ok := set.Lookup(f.k.Hash); ok {
					belowThen = append(belowThen, set.Below(b))
				}
			}
			blks, _, err := tr.restoreRun(context.Background(), &engineSet{set: other}, []uint64{k.Hash}, 0, find, alloc, forget, false)
			if len(blks) != 0 || !errors.Is(err, disk.ErrCorrupt) {
				t.Fatalf("restore of a corrupt copy: %d blocks, %v; want none, ErrCorrupt", len(blks), err)
			}
			if len(lost) != 1 || lost[0] != k {
				t.Fatalf("blocks lost: %v, want %v", lost, k)
			}
			if len(belowThen) != 1 || belowThen[0] {
				t.Fatalf("the block marked as copied below when its record was handed to be forgotten: %v, want [false]", belowThen)
			}
			if got := tr.recordIn(d, k); got == nil || !got.Value.(*tierEntry).gone {
				t.Fatal("the record of the copy gone is not marked gone")
			}
			if set.Below(mustLookup(t, set, k.Hash)) {
				t.Fatal("the block is marked as copied below after the tier lost its copy")
			}
			if _, err := set.AllocateSpare(4, 0); err != nil {
				t.Fatal(err)
			}
			mustLookup(t, set, k.Hash)
		})
	}
}

// A host-tier copy that the host store drops as a move down reads it (its
// checksum failed) goes nowhere: the block in memory is no longer marked
// as copied below, the record is forgotten, and nothing is written to the
// disk tier for it.
func TestHostMoveDownDropsACorruptCopy(t *testing.T) {
	tr, set, k := belowSet(t, true, false)
	h := tr.list[0]
	st, err := disk.Open(disk.Config{Dir: t.TempDir(), Bytes: 4 * disk.Align, SlotBytes: disk.Align, Buffered: true, Logger: tr.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d := &diskTier{n: 1, spec: TierSpec{Kind: "disk"}}
	d.store.Store(st)
	tr.list = append(tr.list, d)
	tr.heldBytes = append(tr.heldBytes, 0)
	if !h.store.Load().(*disk.MemStore).CorruptForTest(k, 10, 0x40) {
		t.Fatal("the host tier's copy was not corrupted")
	}
	if got := tr.moveDown(h, 1); got != 1 {
		t.Fatalf("%d blocks left the host tier, want the corrupt one", got)
	}
	if tr.corrupt.Load() != 1 {
		t.Fatalf("%d checksum failures, want 1", tr.corrupt.Load())
	}
	if set.Below(mustLookup(t, set, k.Hash)) {
		t.Fatal("the block is marked as copied below after its only copy below was found corrupt")
	}
	tr.mu.Lock()
	_, recorded := tr.pos[k]
	tr.mu.Unlock()
	if recorded {
		t.Fatal("the corrupt copy's record is kept")
	}
	if s := st.Stats(); st.Has(k) || s.Puts != 0 || s.Blocks != 0 {
		t.Fatalf("the disk tier holds the block %v, after %d puts, %d blocks; want nothing written", st.Has(k), s.Puts, s.Blocks)
	}
}
