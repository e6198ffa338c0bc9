package fabric

import "github.com/kvfabric/kvfabric/pool"

// poolRecycling sets when the engines' block sets recycle blocks. A block
// set is a cache: a block recycled ahead of need (the pool's watermarks
// keep 5 to 10 % of the slots free) is one the node no longer serves to
// its engine or its peers, for no gain but an allocation that finds its
// slots free. So without a tier below, a block is recycled only when an
// allocation needs its slot; with tiers, the watermarks are when blocks
// are copied down ahead of need, and stay (see Config.TierWatermark).
func (a *Agent) poolRecycling(c *pool.Config) {
	if a.cfg.PoolRecycleAhead && len(a.cfg.Tiers) > 0 {
		a.log.Warn("pool_recycle_ahead has no effect with tiers: blocks are copied down ahead of need by tier_watermark")
	}
	if a.cfg.PoolRecycleAhead || len(a.cfg.Tiers) > 0 {
		return
	}
	c.LowWatermark = -1 // no recycling ahead of need; Retains is every slot
}
