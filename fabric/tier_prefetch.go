package fabric

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/pool"
)

// Prefetch brings the leading blocks of a sequence that this node's disk
// tiers hold up into the engine's block set ahead of use: the blocks the
// set holds already are counted, then the run that follows on disk is
// restored, at most half the slots the set keeps (so that a prefetch never
// pushes out more than it brings), and left cached, unreferenced.
func (e *engineServer) Prefetch(ctx context.Context, req *fabricpb.PrefetchRequest) (*fabricpb.PrefetchResponse, error) {
	s, err := e.setFor(ctx, req.GetBlockSet())
	if err != nil {
		return nil, err
	}
	hashes, err := requestHashes(req.GetHashes(), req.GetTokens(), s.set.Layout().PageSize, -1)
	if err != nil {
		return nil, err
	}
	if len(hashes) == 0 || len(hashes) > maxRequestBlocks {
		return nil, status.Errorf(codes.InvalidArgument, "hashes: %d blocks (want 1..%d)", len(hashes), maxRequestBlocks)
	}
	out := &fabricpb.PrefetchResponse{}
	// Referenced until the end, so that the slots the restores take are
	// not those of the sequence's own blocks.
	var held []pool.Block
	defer func() {
		for _, b := range held {
			s.set.Release(b)
		}
	}()
	i := 0
	for i < len(hashes) {
		b, ok := s.set.Acquire(hashes[i])
		if !ok {
			break
		}
		held = append(held, b)
		i++
	}
	out.InMemory = uint32(i)
	if e.a.tiers == nil {
		return out, nil
	}
	budget := max(1, s.set.Retains()/2)
	for i < len(hashes) && int(out.Restored) < budget {
		parent := uint64(0)
		if i > 0 {
			parent = hashes[i-1]
		}
		run := hashes[i:min(len(hashes), i+budget-int(out.Restored))]
		blks, err := e.a.tiers.restore(ctx, s.engineSet, run, parent)
		held = append(held, blks...)
		i += len(blks)
		out.Restored += uint32(len(blks))
		out.InMemory += uint32(len(blks))
		if err != nil {
			out.Error = err.Error()
			break
		}
		if len(blks) == 0 {
			break
		}
	}
	return out, nil
}
