package fabric

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
)

// fromLocal copies the leading blocks of hashes that another of this
// node's block sets holds (an engine with another layout of the same
// model) into s, within ctx (the import's). It returns no blocks, and no
// error, when none holds them.
func (a *Agent) fromLocal(ctx context.Context, s *sessionSet, hashes []uint64, parent uint64) ([]*fabricpb.BlockRef, *fabricpb.Fetch, error) {
	dst := s.set.Layout()
	for _, o := range a.engineSets() {
		src := o.set.Layout()
		if o == s.engineSet || src.Model != dst.Model || src.PageSize != dst.PageSize {
			continue
		}
		// References keep the source blocks from being recycled while
		// they are copied.
		var held []pool.Block
		for _, h := range hashes {
			b, ok := o.set.Acquire(h)
			if !ok {
				break
			}
			held = append(held, b)
		}
		if len(held) == 0 {
			continue
		}
		start := time.Now()
		refs, bytes, err := a.copyBlocks(ctx, o.set, s, held, hashes[:len(held)], parent)
		for _, b := range held {
			o.set.Release(b)
		}
		f := &fabricpb.Fetch{Node: a.cfg.NodeName, Transport: "local", Blocks: uint32(len(refs)), Bytes: bytes, Micros: uint64(time.Since(start).Microseconds())}
		if err != nil {
			err = localError{fmt.Errorf("copy from block set %d: %w", o.set.ID(), err)}
		}
		return refs, f, err
	}
	return nil, nil, nil
}

// copyBlocks copies src's blocks into new slots of s and registers them.
func (a *Agent) copyBlocks(ctx context.Context, src *pool.BlockSet, s *sessionSet, from []pool.Block, hashes []uint64, parent uint64) ([]*fabricpb.BlockRef, uint64, error) {
	blocks, err := a.allocateNow(ctx, s.engineSet, len(from))
	if err != nil {
		return nil, 0, fmt.Errorf("local slots: %w", err)
	}
	pairs := make([]layout.SlotPair, len(from))
	for i := range from {
		pairs[i] = layout.SlotPair{Src: from[i].Slot, Dst: blocks[i].Slot}
	}
	plan, err := layout.NewPlan(src.Layout(), s.set.Layout(), pairs)
	if err == nil && a.host == nil {
		err = a.copyOnDevice(plan, src.Layout(), s.set.Layout())
	} else if err == nil {
		var srcMem, dstMem [][]byte
		if srcMem, err = src.RegionBytes(); err == nil {
			if dstMem, err = s.set.RegionBytes(); err == nil {
				err = layout.Execute(plan, srcMem, dstMem)
			}
		}
	}
	if err != nil {
		if errors.Is(err, errSlotUnsynced) {
			// A copy into them may still land: out of use for good, as a
			// staged import's and a restore's are.
			for _, b := range blocks {
				if rerr := s.set.Retire(b); rerr != nil {
					a.log.Error("local copy: device slot not retired", "set", s.set.ID(), "slot", b.Slot, "err", rerr)
				}
			}
			a.log.Warn("local copy: device slots retired: a copy into them may still land", "set", s.set.ID(), "slots", len(blocks))
			return nil, 0, err
		}
		for _, b := range blocks {
			s.set.Abort(b)
		}
		return nil, 0, err
	}
	// A block whose bytes changed since its engine registered it stops
	// the copy there: the blocks before it are registered, and the rest
	// are looked for elsewhere.
	n := len(blocks)
	sums, summed := make([]uint64, n), make([]bool, n)
	if a.host != nil {
		n = a.checkCopies(src, s.set, from, blocks, sums, summed)
		for _, b := range blocks[n:] {
			s.set.Abort(b)
		}
	}
	refs, err := s.registerFilled(blocks[:n], hashes[:n], parent, sums, summed)
	return refs, plan.Bytes(), err
}
