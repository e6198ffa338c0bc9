package fabric

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer"
)

// maxCachedLayouts bounds the layouts kept; past it the cache starts
// afresh (a node serves a handful of layouts, a cluster a few hundred).
const maxCachedLayouts = 4096

// layoutFetcher is the part of a peer that serves layouts by digest.
type layoutFetcher interface {
	Name() string
	Layouts(ctx context.Context, digests [][]byte) ([]transfer.LayoutEntry, error)
}

var _ layoutFetcher = (*transfer.Peer)(nil)

// layoutCache keeps peers' layouts by digest. A digest names a layout's
// whole canonical encoding, so an entry is never stale: a holder that
// restarts and reuses a block-set id for another layout answers leases
// with another digest, and that layout is fetched.
type layoutCache struct {
	mu sync.Mutex
	m  map[layout.Digest]*layout.Layout
}

// get returns the layout whose digest is digest, fetching it from peer
// when it is not cached. The layout is validated by decoding and must
// hash to digest.
func (c *layoutCache) get(ctx context.Context, peer layoutFetcher, digest []byte) (*layout.Layout, error) {
	var d layout.Digest
	if len(digest) != len(d) {
		return nil, fmt.Errorf("layout digest of %d bytes from %s, want %d", len(digest), peer.Name(), len(d))
	}
	copy(d[:], digest)
	c.mu.Lock()
	l := c.m[d]
	c.mu.Unlock()
	if l != nil {
		return l, nil
	}
	entries, err := peer.Layouts(ctx, [][]byte{d[:]})
	if err != nil {
		return nil, fmt.Errorf("layouts: %w", err)
	}
	for _, e := range entries {
		if !bytes.Equal(e.Digest, d[:]) {
			continue
		}
		got, err := layout.Unmarshal(e.Layout)
		if err != nil {
			return nil, fmt.Errorf("layout of block set %d: %w", e.BlockSet, err)
		}
		if got.Digest() != d {
			return nil, fmt.Errorf("layout of block set %d does not match its digest", e.BlockSet)
		}
		c.mu.Lock()
		if c.m == nil || len(c.m) >= maxCachedLayouts {
			c.m = map[layout.Digest]*layout.Layout{}
		}
		c.m[d] = got
		c.mu.Unlock()
		return got, nil
	}
	return nil, fmt.Errorf("holder %s no longer serves the layout %x it leased from", peer.Name(), d[:8])
}
