package fabric

import (
	"context"
	"errors"
	"time"

	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/disk"
)

// The engine API's side of the disk tiers: Allocate takes the slots of
// blocks being copied down rather than wait for the disk (the pool's
// OffloadGiveUp; a block not yet read is copied out in memory, take),
// Acquire and Lookup restore the blocks a
// disk tier holds (Import does in importBlocks, fromTier), and Lookup says
// where this node holds each block.

// Tier names in LookupResponse.local_tiers.
const (
	tierNone = ""
	tierDisk = "disk"
)

// allocate is BlockSet.Allocate for an engine: with disk tiers, an
// allocation that finds the slots it needs being read by copies down
// waits for those reads (in memory, never the disk), within the import
// timeout; one that finds them held by the set's read-ahead ends the
// read-ahead and tries again (tiers.allocate).
func (a *Agent) allocate(ctx context.Context, es *engineSet, n int) ([]pool.Block, error) {
	if a.tiers == nil {
		return es.set.Allocate(n)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.ImportTimeout)
	defer cancel()
	return a.tiers.allocate(ctx, es, n)
}

// allocateNow is BlockSet.Allocate for an import's slots: it waits for no
// copy down, but one that falls short while the set's read-ahead holds
// slots (pool.AllocError.Spare, or one under way that holds its blocks
// referenced) ends the read-ahead, waits for it within ctx and the import
// timeout, and tries again: after each read-ahead that ended, there or
// meanwhile (it may have ended just before it looked: yieldAhead).
func (a *Agent) allocateNow(ctx context.Context, es *engineSet, n int) ([]pool.Block, error) {
	if a.tiers == nil {
		return es.set.Allocate(n)
	}
	seen := a.tiers.aheadEnds(es)
	blks, err := es.set.Allocate(n)
	var ae *pool.AllocError
	if err == nil || !errors.As(err, &ae) {
		return blks, err
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.ImportTimeout)
	defer cancel()
	for a.tiers.yieldAhead(ctx, es, ae, &seen) {
		if blks, err = es.set.Allocate(n); err == nil || !errors.As(err, &ae) {
			break
		}
	}
	return blks, err
}

// restoreRun restores the run of hashes from i that a disk tier holds
// into s, for Acquire: the blocks come referenced, for the session to
// hold. A failure is logged and ends the run; what is not restored is
// missing, as it would be without the tier.
func (a *Agent) restoreRun(ctx context.Context, s *sessionSet, hashes []uint64, i int) []pool.Block {
	if a.tiers == nil {
		return nil
	}
	parent := uint64(0)
	if i > 0 {
		parent = hashes[i-1]
	}
	blks, err := a.tiers.restore(ctx, s.engineSet, hashes[i:], parent)
	if err != nil {
		a.log.Warn("tier: restore stopped short", "set", s.set.ID(), "restored", len(blks), "err", err)
	}
	// What follows is read ahead by Acquire once it has taken them.
	return blks
}

// localTiers says, for each hash, which tier of this node holds it for
// es's layout: the pool's kind (host, pinned or device), "host" (the
// host tier), "disk", or "". With restore, the first run of blocks it
// answers "disk" or "host" is restored into es meanwhile, left cached
// there (unreferenced), and what follows it is read ahead, so that the
// Acquire or Import that follows finds it in memory; neither the answer
// nor the restore waits for a copy down under way: a block whose copy has
// not ended is "" and is not restored (an Acquire or Import restores it
// once its copy ends). Without restore (Lookup's no_restore: a look-up
// that only counts), nothing is brought up or read ahead, and a block not
// in es whose copy down is under way is answered where it is once that
// copy ends (whereWait), waiting for it within a.tiers.countWait(ctx): the answer
// says where each block will be once the copies down under way end, not
// "" for a block in flight between the set and a tier. The answer names
// the tier each block was found in.
func (a *Agent) localTiers(ctx context.Context, es *engineSet, hashes []uint64, restore bool) []string {
	out := make([]string, len(hashes))
	var tag uint64
	if a.tiers != nil {
		tag = shapeTag(es.set.Layout())
	}
	where := a.tierOf
	if !restore && a.tiers != nil {
		wctx, cancel := a.tiers.countWait(ctx)
		defer cancel()
		where = func(k disk.Key) *diskTier { return a.tiers.whereWait(wctx, k) }
	}
	restoreFrom := -1
	for i, h := range hashes {
		if _, ok := es.set.Lookup(h); ok {
			out[i] = a.poolKind
			if a.poolKind == "" {
				out[i] = "device"
			}
			continue
		}
		if d := where(disk.Key{Hash: h, Tag: tag}); d != nil {
			out[i] = d.spec.Kind // "disk", or "host" for the host tier
			if restoreFrom < 0 {
				restoreFrom = i
			}
			continue
		}
		out[i] = tierNone
	}
	if restore && restoreFrom >= 0 {
		parent := uint64(0)
		if restoreFrom > 0 {
			parent = hashes[restoreFrom-1]
		}
		end := restoreFrom
		for end < len(hashes) && (out[end] == tierDisk || out[end] == tierHost) {
			end++
		}
		blks, err := a.tiers.restoreNow(ctx, es, hashes[restoreFrom:end], parent)
		if err != nil {
			a.log.Warn("tier: restore on look-up stopped short", "set", es.set.ID(), "restored", len(blks), "err", err)
		}
		for _, b := range blks {
			es.set.Release(b)
		}
		if len(blks) > 0 {
			a.tiers.readAheadAfter(es, hashes[restoreFrom+len(blks)-1])
		}
	}
	return out
}

// noDeadlineCountWait bounds a look-up's wait for copies down under way
// where its call has no deadline. A copy down is a write to this node's
// own tier: one not ended in 10 s is held up (a failing or saturated
// disk, a copy held back), and a caller that set no deadline is answered
// then, the blocks still in flight "", rather than never. Not
// PeerTimeout: that bounds a silent peer, not a local disk, and at its
// default of 2 s would cut short waits a busy disk still ends.
const noDeadlineCountWait = 10 * time.Second

// countWait bounds a look-up's wait for copies down under way (localTiers
// without restore): ctx, ended a tenth of its time left early where it
// has a deadline, so that the answer, which then leaves out the blocks
// whose copies have not ended, reaches a caller before its deadline does
// (a wait to the deadline itself would leave the caller no answer), and
// ended after noDeadlineCountWait where it has none.
func (t *tiers) countWait(ctx context.Context) (context.Context, context.CancelFunc) {
	dl, ok := ctx.Deadline()
	if !ok {
		limit := noDeadlineCountWait
		if d := t.countWaitCap.Load(); d != 0 {
			limit = time.Duration(d)
		}
		return context.WithTimeout(ctx, limit)
	}
	return context.WithDeadline(ctx, dl.Add(-time.Until(dl)/10))
}
