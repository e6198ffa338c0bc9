package fabric

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/pool"
)

// Prefetch brings the leading blocks of a sequence up into the engine's
// block set ahead of use: the blocks the set holds already are counted,
// then the run that follows on this node's disk tiers is restored, then
// the blocks after it are imported as Import would (from this node's
// other sets, then from other nodes), together at most half the slots the
// set keeps (so that a prefetch never pushes out more than it brings),
// and left cached, unreferenced. Where the set's read-ahead under way
// brings up the leading blocks of the run, the restore waits for it and
// takes them from the set: they count in Restored (and as read-ahead
// hits) though this call read none of them.
func (e *engineServer) Prefetch(ctx context.Context, req *fabricpb.PrefetchRequest) (*fabricpb.PrefetchResponse, error) {
	s, err := e.setFor(ctx, req.GetBlockSet())
	if err != nil {
		return nil, err
	}
	hashes, err := requestHashes(req.GetHashes(), req.GetTokens(), s.set.Layout().PageSize, -1)
	if err != nil {
		return nil, err
	}
	if len(hashes) == 0 || len(hashes) > MaxRequestBlocks {
		return nil, status.Errorf(codes.InvalidArgument, "hashes: %d blocks (want 1..%d)", len(hashes), MaxRequestBlocks)
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
	budget := max(1, s.set.Retains()/2)
	for e.a.tiers != nil && i < len(hashes) && int(out.Restored) < budget {
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
			return out, nil
		}
		if len(blks) == 0 {
			break
		}
	}
	if i == len(hashes) || int(out.Restored) >= budget {
		return out, nil
	}
	// The rest from elsewhere, as Import brings it: the leading i blocks
	// (held here) are taken as they are, so the blocks imported chain on
	// them.
	end := min(len(hashes), i+budget-int(out.Restored))
	ctx, cancel := context.WithTimeout(ctx, e.a.cfg.ImportTimeout)
	defer cancel()
	res := e.a.importBlocks(ctx, s, hashes[:end], nil)
	for _, r := range res.refs {
		if b, err := s.drop(int(r.GetSlot())); err == nil {
			s.set.Release(b)
		}
	}
	if n := len(res.refs) - i; n > 0 {
		out.Imported = uint32(n)
		out.InMemory += uint32(n)
	}
	// A session that ended meanwhile learns it from its stream.
	if res.err != nil && !errors.Is(res.err, errNoHolder) && !errors.Is(res.err, errSessionGone) {
		out.Error = res.err.Error()
	}
	return out, nil
}
