package fabric

import (
	"context"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/pool"
)

// stagingEngine is the engine name of the block sets disk-held blocks are
// staged into for peers.
const stagingEngine = "kvfabric-tier-staging"

// stageForPeer brings up the leading blocks of a peer's lease request that
// no block set here holds in memory but a disk tier does: into a staging
// set of their layout (Config.TierStagingSlots, at most half of it per
// lease), so that the lease finds them and the read is served as usual.
// The blocks stay referenced until release is called, after the lease
// pinned them.
func (a *Agent) stageForPeer(ctx context.Context, hashes []uint64) (release func()) {
	release = func() {}
	if a.tiers == nil || len(hashes) == 0 {
		return release
	}
	for _, s := range a.engineSets() {
		if _, ok := s.set.Lookup(hashes[0]); ok {
			return release // in memory: served as it is
		}
	}
	k, ok := a.tiers.find(hashes[0])
	if !ok {
		return release
	}
	es, err := a.tiers.stagingSet(k.Tag)
	if err != nil {
		a.log.Warn("tier: no staging set for a peer's lease", "hash", k.Hash, "err", err)
		return release
	}
	blks, err := a.tiers.restore(ctx, es, hashes, 0)
	if err != nil {
		a.log.Warn("tier: staging for a peer stopped short", "staged", len(blks), "err", err)
	}
	return func() {
		for _, b := range blks {
			es.set.Release(b)
		}
	}
}

// stagingSet is the staging set of shape tag, made on first use from the
// layout the tier recorded for it.
func (t *tiers) stagingSet(tag uint64) (*engineSet, error) {
	t.mu.Lock()
	es := t.staging[tag]
	l := t.layouts[tag]
	t.mu.Unlock()
	if es != nil {
		es.mu.Lock()
		freed := es.freed
		es.mu.Unlock()
		if !freed {
			return es, nil
		}
	}
	slots := t.a.cfg.TierStagingSlots
	if slots == 0 {
		slots = DefaultTierStagingSlots
	}
	tmpl := l.Clone()
	tmpl.Slots = slots
	tmpl.Regions = nil
	es, err := t.a.blockSetFor(stagingEngine, tmpl)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	t.staging[tag] = es
	t.mu.Unlock()
	return es, nil
}

// tierStatus describes the tiers for Status.
func (a *Agent) tierStatus() []*fabricpb.Tier {
	if a.tiers == nil {
		return nil
	}
	return a.tiers.status()
}

func (t *tiers) status() []*fabricpb.Tier {
	t.mu.Lock()
	bb := t.blockBytes
	held := append([]int64(nil), t.heldBytes...)
	t.mu.Unlock()
	out := make([]*fabricpb.Tier, len(t.list))
	for i, d := range t.list {
		ts := &fabricpb.Tier{Kind: d.spec.Kind, Path: d.spec.Path, SizeBytes: d.spec.Size, BlockBytes: uint64(bb),
			Bytes: uint64(held[i]), Offloads: d.offloads.Load(), Restores: d.restores.Load(), Evictions: d.evicted.Load()}
		if st := d.store.Load(); st != nil {
			s := st.Stats()
			ts.Blocks, ts.ChecksumFailures = uint64(s.Blocks), s.Corrupt
		}
		if i == 0 { // all tiers together, as in metrics
			ts.ReadAheadBlocks, ts.ReadAheadHits, ts.ReadAheadUnused = t.ahead.restored.Load(), t.ahead.hits.Load(), t.ahead.unused.Load()
		}
		out[i] = ts
	}
	return out
}

// TierMetrics are one tier's figures (a disk tier's or the host tier's).
type TierMetrics struct {
	// Tier is its place in the tiers' order (the host tier first, then
	// the disk tiers in Config.Tiers' order), as in status; Path its
	// directory (none for the host tier).
	Tier int
	Path string
	// Blocks and Bytes are what it holds now.
	Blocks, Bytes uint64
	// Offloads counts blocks copied down; Restores blocks brought back up
	// (to engines and to staging for peers); ChecksumFailures blocks
	// dropped for failing a check on their way up; Evictions blocks
	// dropped to make room; Failures copies down that failed.
	Offloads, Restores, ChecksumFailures, Evictions, Failures uint64
	// QueueFull counts blocks refused for a full queue (all tiers
	// together, on tier 0). The blocks dropped because an allocation
	// needed their slots before their copy began are the pool's
	// (Metrics.Pool.OffloadsGivenUp).
	QueueFull uint64
	// CopiedOut counts blocks whose slots allocations took before their
	// copy began or while it was written straight from them, copied out
	// in memory then and written from there.
	CopiedOut uint64
	// RestoreTime is each block's read, check and copy into its slot.
	RestoreTime pool.Histogram

	// Kind is "disk", or "host" for the host tier (tier_host.go, no Path).
	Kind string
	// Read-ahead along sequences (all tiers together, on tier 0;
	// tier_readahead.go): ReadAhead counts blocks read ahead into engines'
	// block sets, ReadAheadHits those taken later by an engine's Acquire or
	// Import, or by a restore that waited for the read-ahead or got its copy
	// of a block it read too (an Acquire's, Import's, Lookup's or Prefetch's),
	// or got back by an engine's RegisterBlocks as duplicates, ReadAheadUnused those recycled or freed with their set before any was
	// taken (counted when the set's next read-ahead starts or the set is
	// freed: a lower bound until then).
	ReadAhead, ReadAheadHits, ReadAheadUnused uint64
}

func (t *tiers) metrics() []TierMetrics {
	t.mu.Lock()
	held := append([]int64(nil), t.heldBytes...)
	t.mu.Unlock()
	out := make([]TierMetrics, len(t.list))
	for i, d := range t.list {
		m := TierMetrics{Tier: i, Path: d.spec.Path, Bytes: uint64(held[i]), Offloads: d.offloads.Load(), Restores: d.restores.Load(),
			Evictions: d.evicted.Load(), Failures: d.failed.Load(), RestoreTime: d.restoreTime.snapshot(), Kind: d.spec.Kind}
		if st := d.store.Load(); st != nil {
			s := st.Stats()
			m.Blocks, m.ChecksumFailures = uint64(s.Blocks), s.Corrupt
		}
		if i == 0 {
			m.QueueFull = t.queueFull.Load()
			m.CopiedOut = t.taken.Load()
			m.ReadAhead, m.ReadAheadHits, m.ReadAheadUnused = t.ahead.restored.Load(), t.ahead.hits.Load(), t.ahead.unused.Load()
		}
		out[i] = m
	}
	return out
}
