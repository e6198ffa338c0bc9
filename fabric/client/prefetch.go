package client

import (
	"context"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// Prefetch brings the leading blocks of hashes up into block set set ahead
// of use (cached, unreferenced): those the agent's disk tiers hold, then
// those that follow from other nodes. It says how many leading blocks are
// in memory now, how many it restored from disk and how many it imported.
func (c *Client) Prefetch(ctx context.Context, set uint64, hashes []uint64) (*fabricpb.PrefetchResponse, error) {
	return c.api.Prefetch(ctx, &fabricpb.PrefetchRequest{BlockSet: set, Hashes: hashes})
}
