package fabric

import (
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
)

// noteTierEvent counts in d an event the whole index applied to node id,
// when it names a disk tier's block set (tierSetBase + n; the host tier's,
// tierHostSet, is below it: a copy in memory, as a pool set's): beside the
// index's count of all the node's copies, d then tells whether it has a
// block in memory or on disk only. Imports prefer holders with the blocks
// in memory (candidates), and Lookup's fetch estimate adds a restore per
// disk-held block. Only the whole index (gossip) carries block set
// numbers; in owned mode the owners keep the same count from their
// streams' disk ops (index.OpStoreDisk) and answer lookups with it
// (Agent.findHolders).
func noteTierEvent(d *index.DiskCopies, ix *index.Index, id index.NodeID, e membership.Event) {
	if e.BlockSet < tierSetBase {
		return
	}
	if e.Kind == membership.EventStore {
		d.Store(ix, id, e.Hash)
	} else {
		d.Remove(id, e.Hash)
	}
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
