package fabric

import (
	"fmt"
	"os"
)

// FaultInSets reads a byte of every page of a's own mappings of its host
// block sets and returns their sum (so that the reads stay). An engine
// fills a set through a mapping of its own of the same memory file, so its
// writes leave the agent's mapping without page table entries: the agent's
// first touch of each page faults. A benchmark calls this before its timed
// runs, as a long-running agent has touched its pool's pages long before.
func FaultInSets(a *Agent) int {
	page := os.Getpagesize()
	var sum int
	for _, es := range a.engineSets() {
		regions, err := es.set.RegionBytes()
		if err != nil {
			continue // device memory
		}
		for _, r := range regions {
			for i := 0; i < len(r); i += page {
				sum += int(r[i])
			}
		}
	}
	return sum
}

// ChecksumsEarly is how many holder pages a's imports checked with sums
// taken as a lane read landed them.
func ChecksumsEarly(a *Agent) uint64 { return a.stats.checksumEarly.Load() }

// IdleSetKept says whether a's block set id is idle, its grace period
// over, and kept rather than freed.
func IdleSetKept(a *Agent, id uint64) bool {
	for _, es := range a.engineSets() {
		if uint64(es.set.ID()) != id {
			continue
		}
		es.mu.Lock()
		defer es.mu.Unlock()
		return len(es.users) == 0 && !es.freed && es.freeTimer == nil
	}
	return false
}

// LeaseCaps is the most blocks one peer, and all peers together, may hold
// leased on a now.
func LeaseCaps(a *Agent) (perPeer, total int) { return a.service.leaseCaps() }

// RetireSlot allocates one slot of a's block set id and retires it, as a
// device copy whose stream could not be synchronised leaves its slot.
func RetireSlot(a *Agent, id uint64) error {
	for _, es := range a.engineSets() {
		if uint64(es.set.ID()) != id {
			continue
		}
		blks, err := es.set.Allocate(1)
		if err != nil {
			return err
		}
		return es.set.Retire(blks[0])
	}
	return fmt.Errorf("block set %d: not on %s", id, a.NodeName())
}
