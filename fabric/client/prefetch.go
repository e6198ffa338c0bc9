package client

import (
	"context"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// Prefetch brings the leading blocks of hashes that the agent's disk tiers
// hold up into block set set ahead of use (cached, unreferenced), and says
// how many leading blocks are in memory now and how many it restored.
func (c *Client) Prefetch(ctx context.Context, set uint64, hashes []uint64) (*fabricpb.PrefetchResponse, error) {
	return c.api.Prefetch(ctx, &fabricpb.PrefetchRequest{BlockSet: set, Hashes: hashes})
}
