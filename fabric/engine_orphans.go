package fabric

import (
	"sync/atomic"
	"time"
)

// A cache that outlives its engine. When the grace period of a block set
// no session uses runs out (Config.BlockSetGrace), a set that still holds
// registered blocks is not freed but kept as an orphan: its blocks stay in
// the pool, announced to the cluster, served to peers and evictable, and
// the next engine of its layout takes the set up with them (an adoption;
// reusableSet, under the isolation rules of engine_memory.go: only once
// every process the set's memory was handed to has exited, and the slots
// it allocates there come zeroed). An orphan is the first thing freed
// when a new block set needs memory (freeIdleSets), whatever the quota of
// the engine that made it: that engine is gone. A set that holds no
// registered block is freed at the grace period as before, and
// Config.NoOrphanCache frees every set then. With a disk tier, an orphan's
// blocks are also copied down when it is kept (BlockSet.CopyDown), so
// that they outlive a restart.

// orphanCounters count what orphans went through; part of counters.
type orphanCounters struct {
	// adoptions: orphans taken up by a new session; reclaimed: orphans
	// freed because a new block set needed their memory.
	adoptions, reclaimed atomic.Uint64
}

// keepAsOrphanLocked decides, when es's grace period ran out, whether to
// keep it as an orphan instead of freeing it, and marks it so. es.mu is
// held.
func (a *Agent) keepAsOrphanLocked(es *engineSet) bool {
	if a.cfg.NoOrphanCache {
		return false
	}
	if es.orphaned {
		return true
	}
	if es.set.Metrics().Registered == 0 {
		return false // nothing cached: the memory is better free
	}
	es.orphaned = true
	if es.freeTimer != nil {
		es.freeTimer.Stop()
		es.freeTimer = nil
	}
	copying := 0
	if a.tiers != nil {
		// Its blocks go down too, kept in memory all the same: a cache that
		// outlives its engine then outlives a restart of the agent.
		copying = es.set.CopyDown()
	}
	a.log.Info("block set kept as a cache after its engine", "set", es.set.ID(), "engine", es.engine,
		"blocks", es.set.Metrics().Registered, "copying_down", copying, "idle", time.Since(es.idleSince).Round(time.Millisecond))
	return true
}

// adoptLocked records that a session takes up es; an orphan stops being
// one. es.mu is held.
func (a *Agent) adoptLocked(es *engineSet) {
	if !es.orphaned {
		return
	}
	es.orphaned = false
	es.adoptions++
	a.stats.orphans.adoptions.Add(1)
	a.log.Info("cached block set taken up by a new engine session", "set", es.set.ID(), "engine", es.engine,
		"blocks", es.set.Metrics().Registered)
}

// OrphanMetrics are the block sets kept after their engines (see
// Config.NoOrphanCache).
type OrphanMetrics struct {
	// Sets, Blocks and Bytes are the orphans now: the sets, their
	// registered blocks, and those blocks' bytes (every rank's shard).
	Sets, Blocks int
	Bytes        uint64
	// Adoptions counts orphans taken up by a new engine session;
	// Reclaimed those freed because a new block set needed the memory.
	Adoptions, Reclaimed uint64
}

func (a *Agent) orphanMetrics() OrphanMetrics {
	m := OrphanMetrics{Adoptions: a.stats.orphans.adoptions.Load(), Reclaimed: a.stats.orphans.reclaimed.Load()}
	for _, es := range a.engineSets() {
		es.mu.Lock()
		orphan := es.orphaned && !es.freed
		es.mu.Unlock()
		if !orphan {
			continue
		}
		l := es.set.Layout()
		n := es.set.Metrics().Registered
		m.Sets++
		m.Blocks += n
		m.Bytes += uint64(n) * l.Strides().Shard * uint64(l.TPSize)
	}
	return m
}
