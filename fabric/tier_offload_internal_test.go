package fabric

import (
	"container/list"
	"context"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/pool/disk"
)

// A block on disk is found at once, though a copy down of its hash (from
// another set) is queued and never ends; one not on disk waits for its
// pending copy until the context ends.
func TestTierWhereWaitFindsDiskBlockWithoutWaiting(t *testing.T) {
	d := &diskTier{n: 0}
	tr := &tiers{list: []*diskTier{d}, lru: list.New(), pos: map[disk.Key]*list.Element{},
		pending: map[uint64]*pendingCopy{}, done: make(chan struct{})}
	onDisk := disk.Key{Hash: 7, Tag: 1}
	notOnDisk := disk.Key{Hash: 8, Tag: 1}
	tr.pos[onDisk] = tr.lru.PushBack(&tierEntry{tier: 0, key: onDisk, length: 4096})
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
