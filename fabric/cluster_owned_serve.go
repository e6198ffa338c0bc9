package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/transfer"
)

var _ transfer.IndexHandler = (*peerService)(nil)

// IndexCall serves the owned-slices index's calls: a peer's block events
// for the hashes this node owns, and lookups of them. A peer named as this
// node is refused: this node's own calls are served in process (o.call),
// never over the network, and its own stores are exempt from
// --index-max-node-blocks, so a certificate in its name issued to another
// node, or shared, would otherwise store without that bound.
func (s *peerService) IndexCall(ctx context.Context, peer string, payload []byte) ([]byte, error) {
	o := s.a.owned
	if o == nil {
		return nil, fmt.Errorf("%w: this node keeps the whole index (index_mode whole), not owned slices", transfer.ErrUnavailable)
	}
	if peer == s.a.cfg.NodeName {
		return nil, fmt.Errorf("%w: an index call over the network from a peer named %q, this node's own name: its own calls never come over the network (is its certificate issued to, or shared with, another node?)", transfer.ErrInvalidRequest, peer)
	}
	if f := s.a.cfg.hooks.beforeServeIndex; f != nil {
		if err := f(payload); err != nil {
			return nil, err
		}
	}
	return o.serve(ctx, peer, payload)
}

func (o *ownedIndex) serve(ctx context.Context, peer string, payload []byte) ([]byte, error) {
	slice := o.slice.Load()
	if slice == nil {
		return nil, fmt.Errorf("%w: the index is starting", transfer.ErrUnavailable)
	}
	if err := o.a.indexPeerErr(peer); err != nil {
		return nil, fmt.Errorf("%w: %w", transfer.ErrUnavailable, err)
	}
	switch payload[0] {
	case ownedCallOps:
		c, err := decodeOpsCall(payload)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", transfer.ErrInvalidRequest, err)
		}
		return applyOps(slice, peer, c, &o.stats.opsReceived, o.a.sink.refused)
	case ownedCallLookup, ownedCallLookupTiers:
		hashes, err := decodeLookupCall(payload)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", transfer.ErrInvalidRequest, err)
		}
		if peer != o.a.cfg.NodeName {
			o.stats.lookupsAnswered.Add(1)
		}
		return appendLookupAnswer(nil, slice.HolderTiers(hashes), payload[0] == ownedCallLookupTiers), nil
	}
	return nil, fmt.Errorf("%w: index call of unknown kind %d", transfer.ErrInvalidRequest, payload[0])
}

// applyOps applies an origin's ops to this node's slice, and answers
// ansReplace where the slice cannot continue the origin's stream.
// applied counts the ops applied. Stores the slice refused because the
// origin holds the most hashes it keeps for one node go to refused, and
// the call is answered applied: the stream goes on without them.
func applyOps(slice *index.Slice, origin string, c index.OpsCall, applied *atomic.Uint64, refused func(origin string, err error)) ([]byte, error) {
	n, err := slice.Apply(origin, c)
	applied.Add(uint64(n))
	if errors.Is(err, index.ErrNodeFull) {
		refused(origin, err)
		err = nil
	}
	switch {
	case errors.Is(err, index.ErrReplaceNeeded):
		return []byte{ansReplace}, nil
	case err != nil:
		return nil, fmt.Errorf("%w: %w", transfer.ErrUnavailable, err)
	}
	return []byte{ansApplied}, nil
}
