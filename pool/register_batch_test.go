package pool

import (
	"errors"
	"testing"

	"github.com/kvfabric/kvfabric/layout"
)

// batchOf allocates n slots and describes them as a sequence of hashes
// from first, each with the sum first+i+7 when sums.
func batchOf(t *testing.T, b *BlockSet, n int, first uint64, sums bool) []Registration {
	t.Helper()
	blks, err := b.Allocate(n)
	if err != nil {
		t.Fatal(err)
	}
	regs := make([]Registration, n)
	for i, blk := range blks {
		regs[i] = Registration{Block: blk, Hash: first + uint64(i), Sum: first + uint64(i) + 7, HasSum: sums}
	}
	return regs
}

// At the limit: one call registers MaxRegisterBatch blocks as a sequence,
// each with its sum, and queues their events as one batch that a queue
// far smaller than the batch admits whole.
func TestRegisterBatchAtLimit(t *testing.T) {
	var rec recorder
	cfg := testConfig(nil, rec.sink)
	cfg.EventBuffer = 16
	cfg.MaxEventBatch = 1 << 20
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(MaxRegisterBatch, 1, layout.FullyContiguous, 64))
	regs := batchOf(t, b, MaxRegisterBatch, 1000, true)
	// Partial and Complete slots both register.
	for i := 0; i < len(regs); i += 2 {
		if err := b.Commit(regs[i].Block); err != nil {
			t.Fatal(err)
		}
	}
	out, err := b.RegisterBatch(regs, 999)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != MaxRegisterBatch {
		t.Fatalf("registered %d of %d", len(out), MaxRegisterBatch)
	}
	for i, blk := range out {
		if blk != regs[i].Block {
			t.Fatalf("block %d: got %+v, want its own slot %+v", i, blk, regs[i].Block)
		}
		info, err := b.Slot(blk.Slot)
		if err != nil {
			t.Fatal(err)
		}
		parent := uint64(999)
		if i > 0 {
			parent = regs[i-1].Hash
		}
		if info.State != Registered || info.Hash != regs[i].Hash || info.Parent != parent || info.Users != 1 {
			t.Fatalf("block %d: %+v, want registered as %d after %d with one user", i, info, regs[i].Hash, parent)
		}
		if sum, ok := b.Sum(blk); !ok || sum != regs[i].Sum {
			t.Fatalf("block %d: sum %d, %v, want %d", i, sum, ok, regs[i].Sum)
		}
		if i > 0 && i < len(out)-1 && info.Children != 1 {
			t.Fatalf("block %d: %d children, want 1 (the next block extends it)", i, info.Children)
		}
	}
	p.Close() // flushes
	evs, dropped := rec.events()
	if dropped != 0 || len(evs) != MaxRegisterBatch {
		t.Fatalf("%d events, %d dropped; want %d, none dropped", len(evs), dropped, MaxRegisterBatch)
	}
	if len(rec.batches) != 1 {
		t.Errorf("events came in %d batches, want 1", len(rec.batches))
	}
	for i, e := range evs {
		want := Event{Seq: uint64(i + 1), Kind: EventStore, Set: b.ID(), Slot: regs[i].Block.Slot, Hash: regs[i].Hash, Parent: 999}
		if i > 0 {
			want.Parent = regs[i-1].Hash
		}
		if e != want {
			t.Fatalf("event %d = %+v, want %+v", i, e, want)
		}
	}
}

// Past the limit: refused whole, nothing changed, no events.
func TestRegisterBatchPastLimit(t *testing.T) {
	var rec recorder
	cfg := testConfig(nil, rec.sink)
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(MaxRegisterBatch+1, 1, layout.FullyContiguous, 64))
	regs := batchOf(t, b, MaxRegisterBatch+1, 1000, false)
	out, err := b.RegisterBatch(regs, 0)
	if !errors.Is(err, ErrInvalidArgument) || len(out) != 0 {
		t.Fatalf("got %d blocks, err %v; want none and ErrInvalidArgument", len(out), err)
	}
	for i, r := range regs {
		if info, _ := b.Slot(r.Block.Slot); info.State != Partial {
			t.Fatalf("block %d: %s after a refused batch, want partial", i, info.State)
		}
		if _, ok := b.Lookup(r.Hash); ok {
			t.Fatalf("block %d: hash registered after a refused batch", i)
		}
	}
	// The same blocks at the limit register.
	if out, err := b.RegisterBatch(regs[:MaxRegisterBatch], 0); err != nil || len(out) != MaxRegisterBatch {
		t.Fatalf("at the limit: %d blocks, %v", len(out), err)
	}
	p.Close()
	if evs, dropped := rec.events(); len(evs) != MaxRegisterBatch || dropped != 0 {
		t.Fatalf("%d events (%d dropped), want %d: none of the refused batch's", len(evs), dropped, MaxRegisterBatch)
	}
}

// A block refused mid-batch stops it: those before it stay registered,
// with their events; it and those after it are left for the caller.
func TestRegisterBatchStopsAtRefusal(t *testing.T) {
	for _, tc := range []struct {
		name    string
		spoil   func(t *testing.T, b *BlockSet, r *Registration)
		wantErr error
		state   State // the refused slot's state afterwards
	}{
		{"stale handle", func(t *testing.T, b *BlockSet, r *Registration) {
			if err := b.Abort(r.Block); err != nil {
				t.Fatal(err)
			}
		}, ErrStaleBlock, Reset},
		{"registered already", func(t *testing.T, b *BlockSet, r *Registration) {
			if err := b.Commit(r.Block); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Register(r.Block, 1<<40, 0); err != nil {
				t.Fatal(err)
			}
		}, ErrInvalidTransition, Registered},
		{"slot out of range", func(t *testing.T, b *BlockSet, r *Registration) {
			r.Block.Slot = b.Slots()
		}, ErrBadSlot, Partial},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rec recorder
			cfg := testConfig(nil, rec.sink)
			cfg.LowWatermark = -1
			p, b := newTestPool(t, cfg, testLayout(8, 1, layout.FullyContiguous, 64))
			regs := batchOf(t, b, 5, 100, false)
			spoiled := regs[2].Block
			tc.spoil(t, b, &regs[2])
			out, err := b.RegisterBatch(regs, 0)
			if !errors.Is(err, tc.wantErr) || len(out) != 2 {
				t.Fatalf("got %d blocks, err %v; want 2 and %v", len(out), err, tc.wantErr)
			}
			for i := range 2 {
				if info, _ := b.Slot(out[i].Slot); info.State != Registered || info.Hash != regs[i].Hash {
					t.Fatalf("block %d: %+v, want registered", i, info)
				}
			}
			if info, _ := b.Slot(spoiled.Slot); info.State != tc.state {
				t.Fatalf("refused block: %s, want %s", info.State, tc.state)
			}
			for i := 3; i < 5; i++ {
				if info, _ := b.Slot(regs[i].Block.Slot); info.State != Partial {
					t.Fatalf("block %d after the refusal: %s, want partial", i, info.State)
				}
				if err := b.Abort(regs[i].Block); err != nil {
					t.Fatalf("block %d: abort: %v", i, err)
				}
			}
			p.Close()
			evs, _ := rec.events()
			var stores []uint64
			for _, e := range evs {
				if e.Kind == EventStore && e.Hash < 1<<40 {
					stores = append(stores, e.Hash)
				}
			}
			if len(stores) != 2 || stores[0] != 100 || stores[1] != 101 {
				t.Fatalf("store events for %v, want [100 101]", stores)
			}
		})
	}
}

// A hash already registered is a duplicate, as Register makes it: the
// batch's slot is freed, the block there is referenced, no event, and its
// sum is not replaced.
func TestRegisterBatchDuplicate(t *testing.T) {
	var rec recorder
	cfg := testConfig(nil, rec.sink)
	cfg.LowWatermark = -1
	p, b := newTestPool(t, cfg, testLayout(8, 1, layout.FullyContiguous, 64))
	first := batchOf(t, b, 2, 100, true)
	had, err := b.RegisterBatch(first, 0)
	if err != nil {
		t.Fatal(err)
	}
	again := batchOf(t, b, 3, 100, true) // 100, 101 again, then 102
	for i := range again {
		again[i].Sum = 1
	}
	out, err := b.RegisterBatch(again, 0)
	if err != nil || len(out) != 3 {
		t.Fatalf("%d blocks, %v", len(out), err)
	}
	for i := range 2 {
		if out[i] != had[i] {
			t.Fatalf("block %d: %+v, want the registered %+v", i, out[i], had[i])
		}
		if info, _ := b.Slot(had[i].Slot); info.Users != 2 {
			t.Fatalf("block %d: %d users, want 2", i, info.Users)
		}
		if info, _ := b.Slot(again[i].Block.Slot); info.State != Reset {
			t.Fatalf("duplicate's own slot %d: %s, want reset", i, info.State)
		}
		if sum, _ := b.Sum(had[i]); sum != first[i].Sum {
			t.Fatalf("block %d: sum %d, want the first registration's %d", i, sum, first[i].Sum)
		}
	}
	if info, _ := b.Slot(out[2].Slot); out[2] != again[2].Block || info.Parent != 101 || info.Children != 0 {
		t.Fatalf("new block: %+v, %+v; want its own slot after 101", out[2], info)
	}
	if info, _ := b.Slot(had[1].Slot); info.Children != 1 {
		t.Fatalf("block 101: %d children, want 1", info.Children)
	}
	p.Close()
	if evs, _ := rec.events(); len(evs) != 3 {
		t.Fatalf("%d events, want 3: none for the duplicates", len(evs))
	}
	if out, err := b.RegisterBatch(nil, 0); err != nil || out != nil {
		t.Fatalf("empty batch: %v, %v", out, err)
	}
}
