package index

import (
	"sync"
	"sync/atomic"
)

// DiskCopies counts, per hash and holder, the copies the holder announced
// on a disk tier: beside the index's count of all the holder's copies, it
// tells whether the holder has a hash in memory or on disk only. The whole
// index fills it from gossip (events under a disk tier's block set number),
// an owned slice from its streams' disk ops (OpStoreDisk, OpRemoveDisk).
// Entries of holders dropped since, and of hashes gone, are swept when the
// map has doubled since the last sweep, so a sweep's cost is spread over
// the stores that grew it.
//
// Safe for concurrent use; the zero value is ready.
type DiskCopies struct {
	n atomic.Int64 // entries in m: none is the common case, and costs nothing

	mu    sync.Mutex
	m     map[diskKey]uint32
	swept int // len(m) after the last sweep
}

type diskKey struct {
	hash uint64
	id   NodeID
}

// diskSweepMin is the fewest entries past which DiskCopies sweeps.
const diskSweepMin = 4096

// Store counts a disk copy of hash at holder id; ix is the index whose
// copies a sweep checks the counts against.
func (d *DiskCopies) Store(ix *Index, id NodeID, hash uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[diskKey]uint32{}
	}
	d.m[diskKey{hash, id}]++
	if len(d.m) > 2*d.swept+diskSweepMin {
		for k, n := range d.m {
			switch c := ix.Copies(k.hash, k.id); {
			case c == 0:
				delete(d.m, k)
			case int(n) > c:
				d.m[k] = uint32(c)
			}
		}
		d.swept = len(d.m)
	}
	d.n.Store(int64(len(d.m)))
}

// Remove uncounts a disk copy of hash at holder id; a remove of a copy
// never counted (it raced a sweep) leaves no negative count behind.
func (d *DiskCopies) Remove(id NodeID, hash uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := diskKey{hash, id}
	if n := d.m[k]; n > 1 {
		d.m[k] = n - 1
	} else {
		delete(d.m, k)
	}
	d.n.Store(int64(len(d.m)))
}

// Forget drops every disk copy of hash at holder id.
func (d *DiskCopies) Forget(id NodeID, hash uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, diskKey{hash, id})
	d.n.Store(int64(len(d.m)))
}

// DiskOnly says whether holder id has every copy of hash on disk.
func (d *DiskCopies) DiskOnly(ix *Index, id NodeID, hash uint64) bool {
	if d.n.Load() == 0 {
		return false
	}
	d.mu.Lock()
	n := d.m[diskKey{hash, id}]
	d.mu.Unlock()
	return n > 0 && ix.Copies(hash, id) <= int(n)
}

// CountDiskOnly counts the hashes of which holder id has disk copies only.
// It takes the lock once for all of hashes and asks the index for the
// copies of those with disk copies alone, outside it.
func (d *DiskCopies) CountDiskOnly(ix *Index, id NodeID, hashes []uint64) int {
	if d.n.Load() == 0 || len(hashes) == 0 {
		return 0
	}
	disk := make([]uint32, len(hashes))
	d.mu.Lock()
	for i, h := range hashes {
		disk[i] = d.m[diskKey{h, id}]
	}
	d.mu.Unlock()
	c := 0
	for i, h := range hashes {
		if disk[i] > 0 && ix.Copies(h, id) <= int(disk[i]) {
			c++
		}
	}
	return c
}

// Len is how many (hash, holder) entries are counted.
func (d *DiskCopies) Len() int { return int(d.n.Load()) }
