package fabric

import (
	"context"
	"fmt"
	"sync"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/transfer"
)

// layoutCache keeps peers' layouts, per block set, until the peer's
// layout-set digest changes.
type layoutCache struct {
	mu    sync.Mutex
	peers map[string]peerLayouts
}

type peerLayouts struct {
	digest uint64 // the member's layout-set digest these came with
	sets   map[uint64]*layout.Layout
}

func (c *layoutCache) forget(peer string) {
	c.mu.Lock()
	delete(c.peers, peer)
	c.mu.Unlock()
}

// get returns a peer's layout of blockSet, fetching the peer's layouts
// when they are not cached for its current digest. Every layout is
// validated by decoding; its digest must match the one sent.
func (c *layoutCache) get(ctx context.Context, peer *transfer.Peer, m membership.Member, blockSet uint64) (*layout.Layout, error) {
	c.mu.Lock()
	pl, ok := c.peers[m.Name]
	c.mu.Unlock()
	if ok && pl.digest == m.Meta.LayoutDigest {
		if l := pl.sets[blockSet]; l != nil {
			return l, nil
		}
	}
	entries, err := peer.Layouts(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("layouts: %w", err)
	}
	pl = peerLayouts{digest: m.Meta.LayoutDigest, sets: map[uint64]*layout.Layout{}}
	for _, e := range entries {
		l, err := layout.Unmarshal(e.Layout)
		if err != nil {
			return nil, fmt.Errorf("layout of block set %d: %w", e.BlockSet, err)
		}
		if d := l.Digest(); string(d[:]) != string(e.Digest) {
			return nil, fmt.Errorf("layout of block set %d does not match its digest", e.BlockSet)
		}
		pl.sets[e.BlockSet] = l
	}
	c.mu.Lock()
	if c.peers == nil {
		c.peers = map[string]peerLayouts{}
	}
	c.peers[m.Name] = pl
	c.mu.Unlock()
	l := pl.sets[blockSet]
	if l == nil {
		return nil, fmt.Errorf("holder has no layout for its block set %d", blockSet)
	}
	return l, nil
}
