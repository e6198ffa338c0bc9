package fabric

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
)

// maxHoldersTried bounds the holders one import asks, so that a cluster
// that keeps failing cannot keep an import busy past its deadline anyway.
const maxHoldersTried = 8

// importResult is what an import brought.
type importResult struct {
	refs    []*fabricpb.BlockRef
	fetches []*fabricpb.Fetch
	err     error // why the rest is missing: an *importError
}

// errNoHolder says that no node holds the blocks.
var errNoHolder = errors.New("no node holds them")

// errHoldersFailed says that holders were tried and each failed.
var errHoldersFailed = errors.New("every holder tried failed")

// localError marks a failure of this node's own part of an import (its
// slots, its memory, registration): another holder would fail the same
// way, and the holder is not to blame.
type localError struct{ err error }

func (e localError) Error() string { return e.err.Error() }
func (e localError) Unwrap() error { return e.err }

// importError says which blocks an import did not bring and why; it
// unwraps to what decided the failure (errNoHolder, errHoldersFailed, a
// localError, the context's error).
type importError struct {
	msg   string
	cause error
}

func (e *importError) Error() string { return e.msg }
func (e *importError) Unwrap() error { return e.cause }

// importBlocks brings the blocks of hashes into s, the longest prefix it
// can, and references them for the engine: first what is here already,
// then from another engine's block set on this node, then from holders,
// longest prefix first, then least load.
func (a *Agent) importBlocks(ctx context.Context, s *engineSet, hashes []uint64) importResult {
	a.stats.imports.Add(1)
	a.stats.inflight.Add(1)
	defer a.stats.inflight.Add(-1)
	var res importResult
	var failures []string
	var cause error
	tried := 0
	for len(res.refs) < len(hashes) {
		// What is here (imported by us or by a concurrent import).
		for _, h := range hashes[len(res.refs):] {
			b, ok := s.set.Acquire(h)
			if !ok {
				break
			}
			s.hold(b)
			res.refs = append(res.refs, &fabricpb.BlockRef{Hash: h, Slot: uint32(b.Slot)})
		}
		rest := hashes[len(res.refs):]
		if len(rest) == 0 {
			break
		}
		if cause = ctx.Err(); cause != nil {
			break
		}
		// Another import of this node is bringing the next block: wait
		// for it and take what it brought, rather than move it twice.
		f, mine := a.flights.claim(s.set.ID(), rest[0])
		if !mine {
			select {
			case <-f.done:
				continue
			case <-ctx.Done():
				cause = ctx.Err()
			}
			break
		}
		parent := parentOf(hashes, len(res.refs))
		refs, fetch, err := a.fromLocal(s, rest, parent)
		if len(refs) == 0 && err == nil {
			refs, fetch, err = a.importFromHolders(ctx, s, rest, parent, &tried, &failures)
		}
		a.flights.finish(s.set.ID(), rest[0], f)
		res.refs = append(res.refs, refs...)
		if fetch != nil {
			res.fetches = append(res.fetches, fetch)
		}
		if err != nil || len(refs) == 0 {
			cause = err
			break
		}
	}
	if len(res.refs) < len(hashes) {
		a.stats.importFails.Add(1)
		if cause == nil {
			cause = errHoldersFailed
		}
		if !errors.Is(cause, errHoldersFailed) {
			failures = append(failures, cause.Error())
		}
		res.err = &importError{
			msg: fmt.Sprintf("blocks %d..%d of %d (from hash %d) not imported: %s", len(res.refs), len(hashes)-1, len(hashes),
				hashes[len(res.refs)], strings.Join(failures, "; ")),
			cause: cause,
		}
	}
	return res
}

// parentOf returns the sequence hash before block i, 0 for the first.
func parentOf(hashes []uint64, i int) uint64 {
	if i == 0 {
		return 0
	}
	return hashes[i-1]
}

// importFromHolders fetches the leading blocks of rest from the best
// holder that serves them, trying the next when a holder fails. Blocks
// registered before a failure are returned with it: they are the
// engine's. A local failure or the end of ctx stops the search.
func (a *Agent) importFromHolders(ctx context.Context, s *engineSet, rest []uint64, parent uint64, tried *int, failures *[]string) ([]*fabricpb.BlockRef, *fabricpb.Fetch, error) {
	cands := a.candidates(rest)
	if len(cands) == 0 {
		return nil, nil, errNoHolder
	}
	for _, c := range cands {
		if *tried >= maxHoldersTried {
			return nil, nil, fmt.Errorf("%w (%d tried)", errHoldersFailed, *tried)
		}
		*tried++
		start := time.Now()
		refs, bytes, err := a.fetch(ctx, c.member, s, rest[:c.blocks], parent)
		var fetch *fabricpb.Fetch
		if len(refs) > 0 {
			fetch = &fabricpb.Fetch{Node: c.member.Name, Transport: "quic", Blocks: uint32(len(refs)), Bytes: bytes, Micros: uint64(time.Since(start).Microseconds())}
		}
		var local localError
		if err == nil || len(refs) > 0 || errors.As(err, &local) || ctx.Err() != nil {
			return refs, fetch, err
		}
		a.suspects.add(c.member.Name, 2*a.cfg.PeerTimeout+suspectFor)
		a.log.Warn("import from holder failed", "peer", c.member.Name, "blocks", c.blocks, "err", err)
		*failures = append(*failures, fmt.Sprintf("%s: %v", c.member.Name, err))
	}
	return nil, nil, errHoldersFailed
}

type candidate struct {
	member  membership.Member
	blocks  int
	load    float64
	suspect bool
}

// candidates are the members holding a prefix of hashes: longest prefix
// first, then least loaded (every holder is reached over QUIC today, so
// transport cost does not separate them yet).
func (a *Agent) candidates(hashes []uint64) []candidate {
	matches := a.index.FindMatches(hashes)
	var out []candidate
	for _, m := range matches {
		name := a.index.Name(m.Node)
		if name == a.cfg.NodeName {
			continue
		}
		mem, ok := a.member(name)
		if !ok || mem.Meta.PeerAddr == "" {
			continue
		}
		// Load in steps of a tenth: holders whose loads differ by less
		// are equally good, and take turns.
		load := math.Floor(10 * (mem.Meta.Load.KVUsage + float64(mem.Meta.Load.Imports)))
		out = append(out, candidate{member: mem, blocks: m.Blocks, load: load})
	}
	// Holders that just failed an import go last, until failure detection
	// has had time to decide about them; then the longest prefix, then
	// the least load.
	for i := range out {
		out[i].suspect = a.suspects.has(out[i].member.Name)
	}
	sort.SliceStable(out, func(i, j int) bool {
		x, y := out[i], out[j]
		if x.suspect != y.suspect {
			return y.suspect
		}
		if x.blocks != y.blocks {
			return x.blocks > y.blocks
		}
		return x.load < y.load
	})
	// Holders equally good take turns, so that imports spread over them
	// between two load reports.
	tied := 0
	for tied < len(out) && out[tied].suspect == out[0].suspect && out[tied].blocks == out[0].blocks && out[tied].load == out[0].load {
		tied++
	}
	if tied > 1 {
		k := int(a.turn.Add(1) % uint64(tied))
		slices.Reverse(out[:k])
		slices.Reverse(out[k:tied])
		slices.Reverse(out[:tied])
	}
	return out
}

// fetch imports the leading blocks of hashes that holder still has into
// new slots of s. A slot is registered only when every byte of the plan
// arrived and the holder confirmed that the lease never expired; on any
// failure the slots are freed and nothing is registered.
func (a *Agent) fetch(ctx context.Context, holder membership.Member, s *engineSet, hashes []uint64, parent uint64) ([]*fabricpb.BlockRef, uint64, error) {
	peer, err := a.peers.get(ctx, a.transport, holder.Name, holder.Meta.PeerAddr)
	if err != nil {
		return nil, 0, err
	}
	lease, err := peer.Lease(ctx, hashes, a.cfg.LeaseDuration)
	if err != nil {
		return nil, 0, fmt.Errorf("lease: %w", err)
	}
	released := false
	defer func() {
		if !released && lease.ID != 0 {
			// Give the lease back without making the import wait: the
			// holder may be the reason we are failing, and its lease
			// expires by itself anyway.
			a.background(func() {
				rctx, cancel := context.WithTimeout(context.Background(), a.cfg.PeerTimeout)
				peer.Release(rctx, lease.ID)
				cancel()
			})
		}
	}()
	if len(lease.Blocks) != len(hashes) {
		return nil, 0, fmt.Errorf("lease answered %d blocks for %d hashes", len(lease.Blocks), len(hashes))
	}
	// The leading blocks present, in one block set.
	k := 0
	for k < len(hashes) && lease.Blocks[k].Present && lease.Blocks[k].Hash == hashes[k] &&
		lease.Blocks[k].BlockSet == lease.Blocks[0].BlockSet {
		k++
	}
	if k == 0 || lease.ID == 0 {
		return nil, 0, errors.New("holder no longer has the blocks")
	}
	src, err := a.layouts.get(ctx, peer, holder, lease.Blocks[0].BlockSet)
	if err != nil {
		return nil, 0, err
	}
	dst := s.set.Layout()
	if src.PageSize != dst.PageSize {
		return nil, 0, fmt.Errorf("holder's page size %d differs from ours (%d): its blocks are named by other hashes", src.PageSize, dst.PageSize)
	}
	blocks, err := s.set.Allocate(k)
	if err != nil {
		return nil, 0, localError{fmt.Errorf("local slots: %w", err)}
	}
	registered := false
	defer func() {
		if !registered {
			for _, b := range blocks {
				s.set.Abort(b)
			}
		}
	}()
	pairs := make([]layout.SlotPair, k)
	for i := range k {
		slot := lease.Blocks[i].Slot
		if slot >= uint64(src.Slots) {
			return nil, 0, fmt.Errorf("lease names slot %d of a block set of %d", slot, src.Slots)
		}
		pairs[i] = layout.SlotPair{Src: int(slot), Dst: blocks[i].Slot}
	}
	plan, err := layout.NewPlan(src, dst, pairs)
	if err != nil {
		return nil, 0, err
	}
	regions, err := s.set.RegionBytes()
	if err != nil {
		return nil, 0, localError{err}
	}
	var segs []layout.Segment
	for _, r := range plan.Ranks {
		segs = append(segs, r...)
	}
	if err := peer.Read(ctx, lease.ID, lease.Blocks[0].BlockSet, segs, regions); err != nil {
		return nil, 0, fmt.Errorf("read: %w", err)
	}
	valid, err := peer.Release(ctx, lease.ID)
	released = true
	if err != nil {
		return nil, 0, fmt.Errorf("release: %w", err)
	}
	if !valid {
		return nil, 0, errors.New("lease expired before release: the bytes are not trusted")
	}
	refs, err := s.registerFilled(blocks, hashes, parent)
	registered = true
	a.stats.importBytes.Add(plan.Bytes())
	a.stats.importBlocks.Add(uint64(len(refs)))
	if err != nil {
		return refs, plan.Bytes(), localError{err}
	}
	return refs, plan.Bytes(), nil
}

// registerFilled commits and registers blocks, whose bytes are in place,
// under hashes (in order, after parent), referencing each for the engine.
// On an error the blocks already registered are kept and returned, and
// the rest are freed.
func (s *engineSet) registerFilled(blocks []pool.Block, hashes []uint64, parent uint64) ([]*fabricpb.BlockRef, error) {
	refs := make([]*fabricpb.BlockRef, 0, len(blocks))
	for i, b := range blocks {
		err := s.set.Commit(b)
		var reg pool.Block
		if err == nil {
			reg, err = s.set.Register(b, hashes[i], parent)
		}
		if err != nil {
			for _, rest := range blocks[i:] {
				s.set.Abort(rest)
			}
			return refs, err
		}
		s.hold(reg)
		refs = append(refs, &fabricpb.BlockRef{Hash: hashes[i], Slot: uint32(reg.Slot), Duplicate: reg.Slot != b.Slot})
		parent = hashes[i]
	}
	return refs, nil
}

// fromLocal copies the leading blocks of hashes that another of this
// node's block sets holds (an engine with another layout of the same
// model) into s. It returns no blocks, and no error, when none holds them.
func (a *Agent) fromLocal(s *engineSet, hashes []uint64, parent uint64) ([]*fabricpb.BlockRef, *fabricpb.Fetch, error) {
	dst := s.set.Layout()
	for _, o := range a.engineSets() {
		src := o.set.Layout()
		if o == s || src.Model != dst.Model || src.PageSize != dst.PageSize {
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
		refs, bytes, err := copyBlocks(o.set, s, held, hashes[:len(held)], parent)
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
func copyBlocks(src *pool.BlockSet, s *engineSet, from []pool.Block, hashes []uint64, parent uint64) ([]*fabricpb.BlockRef, uint64, error) {
	blocks, err := s.set.Allocate(len(from))
	if err != nil {
		return nil, 0, fmt.Errorf("local slots: %w", err)
	}
	pairs := make([]layout.SlotPair, len(from))
	for i := range from {
		pairs[i] = layout.SlotPair{Src: from[i].Slot, Dst: blocks[i].Slot}
	}
	plan, err := layout.NewPlan(src.Layout(), s.set.Layout(), pairs)
	if err == nil {
		var srcMem, dstMem [][]byte
		if srcMem, err = src.RegionBytes(); err == nil {
			if dstMem, err = s.set.RegionBytes(); err == nil {
				err = layout.Execute(plan, srcMem, dstMem)
			}
		}
	}
	if err != nil {
		for _, b := range blocks {
			s.set.Abort(b)
		}
		return nil, 0, err
	}
	refs, err := s.registerFilled(blocks, hashes, parent)
	return refs, plan.Bytes(), err
}
