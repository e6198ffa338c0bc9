package fabric

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
)

// tierHolds counts, per holder and hash, the copies the holder announced
// under a disk tier's block set number (tierSetBase + n): beside the
// index's count of all its copies, it tells whether a holder has a block
// in memory or on disk only. Imports prefer holders with the blocks in
// memory (candidates), and Lookup's fetch estimate adds a restore per
// disk-held block. Only the whole index (gossip) carries block set
// numbers; in owned mode the owners keep the same count from their
// streams' disk ops (index.OpStoreDisk) and answer lookups with it
// (Agent.findHolders).
//
// Safe for concurrent use; the zero value is ready.
type tierHolds struct {
	n atomic.Int64 // entries in m: none is the common case, and costs nothing

	mu    sync.Mutex
	m     map[tierHoldKey]uint32
	swept int // len(m) after the last sweep
}

type tierHoldKey struct {
	hash uint64
	node index.NodeID
}

// tierSweepMin is the fewest entries past which tierHolds drops those of
// dropped nodes and of blocks gone: a sweep runs when the map has doubled
// since the last, so its cost is spread over the events that grew it.
const tierSweepMin = 4096

// note counts e, an event the index applied to node id.
func (h *tierHolds) note(ix *index.Index, id index.NodeID, e membership.Event) {
	if e.BlockSet < tierSetBase {
		return
	}
	k := tierHoldKey{e.Hash, id}
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.Kind == membership.EventStore {
		if h.m == nil {
			h.m = map[tierHoldKey]uint32{}
		}
		h.m[k]++
		if len(h.m) > 2*h.swept+tierSweepMin {
			h.sweepLocked(ix)
		}
	} else if n := h.m[k]; n > 1 {
		h.m[k] = n - 1
	} else {
		delete(h.m, k) // a remove may race a sweep: never below zero
	}
	h.n.Store(int64(len(h.m)))
}

// sweepLocked drops the entries the index no longer backs (the node was
// dropped, or its copies removed) and caps the rest at the index's count.
func (h *tierHolds) sweepLocked(ix *index.Index) {
	for k, n := range h.m {
		switch c := ix.Copies(k.hash, k.node); {
		case c == 0:
			delete(h.m, k)
		case int(n) > c:
			h.m[k] = uint32(c)
		}
	}
	h.swept = len(h.m)
}

// onDisk counts the hashes of which node id holds disk copies only.
func (h *tierHolds) onDisk(ix *index.Index, id index.NodeID, hashes []uint64) int {
	if h.n.Load() == 0 {
		return 0
	}
	disk := 0
	for _, hash := range hashes {
		h.mu.Lock()
		n := h.m[tierHoldKey{hash, id}]
		h.mu.Unlock()
		if n > 0 && ix.Copies(hash, id) <= int(n) {
			disk++
		}
	}
	return disk
}

// tierRestoreBytesPerS is the restore rate assumed of a holder's disk
// tier while this node has restored nothing from tiers of its own: a
// conservative rate for one NVMe drive's reads.
const tierRestoreBytesPerS = 1 << 30

// tierRestoreCost is how long restoring blocks of bytes each from a disk
// tier takes: at the rate this node's own tiers measured (bytes restored
// over the time each block's restore took: a bound, as restores overlap),
// else at tierRestoreBytesPerS.
func (a *Agent) tierRestoreCost(blocks int, bytes uint64) time.Duration {
	rate := float64(tierRestoreBytesPerS)
	if t := a.tiers; t != nil {
		t.mu.Lock()
		bb := t.blockBytes
		t.mu.Unlock()
		var n uint64
		var took time.Duration
		for _, d := range t.list {
			s := d.restoreTime.snapshot()
			for _, c := range s.Counts {
				n += c
			}
			took += s.Sum
		}
		if n > 0 && took > 0 && bb > 0 {
			rate = float64(n) * float64(bb) / took.Seconds()
		}
	}
	return time.Duration(float64(blocks) * float64(bytes) / rate * float64(time.Second))
}

// fetchEstimate is Lookup's estimate of bringing hashes (the leading ones
// peer holds) here, perBlock bytes each: the link's cost (links.estimate),
// plus a restore for each block peer holds on disk only (as onDisk
// counts). With nothing measured of any link it stays zero and
// estimateNone.
func (a *Agent) fetchEstimate(peer string, hashes []uint64, perBlock uint64, onDisk diskOnly) (time.Duration, string, string) {
	d, basis, transport := a.links.estimate(peer, uint64(len(hashes))*perBlock)
	if basis == estimateNone {
		return d, basis, transport
	}
	if id, ok := a.index.Lookup(peer); ok {
		if disk := onDisk(id, hashes); disk > 0 {
			d += a.tierRestoreCost(disk, perBlock)
		}
	}
	return d, basis, transport
}
