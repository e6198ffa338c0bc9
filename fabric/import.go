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
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
)

// maxHoldersTried bounds the holder failures one import takes, so that a
// cluster that keeps failing cannot keep an import busy past its deadline
// anyway. Holders that serve part of an import count nothing: the import
// goes on while it moves.
const maxHoldersTried = 8

// importResult is what an import brought.
type importResult struct {
	refs    []*fabricpb.BlockRef
	fetches []*fabricpb.Fetch
	err     error // why the rest is missing: an *importError
	// here[i]: refs[i] was in the set already (or brought by another
	// import of this node), not brought by this one.
	here []bool
}

// errNoHolder says that no node holds the blocks.
var errNoHolder = errors.New("no node holds them")

// errSessionGone says that the session an import was for ended (or
// dropped the set) while it ran: what it brought was given back, and it
// brings no more.
var errSessionGone = errors.New("the session ended during the import")

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
// longest prefix first, then least load. An import asked for by tokens
// (ts not nil) also looks, where no holder has the next block at the
// engine's page size, for holders of smaller pages that divide it.
func (a *Agent) importBlocks(ctx context.Context, s *sessionSet, hashes []uint64, ts *tokenSource) importResult {
	defer func(start time.Time) { a.stats.importTime.record(time.Since(start)) }(time.Now())
	a.stats.imports.Add(1)
	a.stats.inflight.Add(1)
	defer a.stats.inflight.Add(-1)
	var res importResult
	var failures []string
	var cause error
	tried := 0
	for len(res.refs) < len(hashes) {
		// What is here (imported by us or by a concurrent import, or read
		// ahead from a tier: then what follows it there is read ahead next).
		ahead := false
		for _, h := range hashes[len(res.refs):] {
			b, ok := s.set.Acquire(h)
			if !ok {
				break
			}
			if !s.hold(b) {
				cause = errSessionGone
				break
			}
			ahead = a.aheadUsed(s.engineSet, h, b) // held: the engine's now
			res.refs = append(res.refs, &fabricpb.BlockRef{Hash: h, Slot: uint32(b.Slot)})
			res.here = append(res.here, true)
		}
		if cause != nil {
			break
		}
		if ahead {
			a.readAheadAfter(s.engineSet, res.refs[len(res.refs)-1].GetHash())
		}
		rest := hashes[len(res.refs):]
		if len(rest) == 0 {
			break
		}
		if cause = ctx.Err(); cause != nil {
			break
		}
		// Nothing more for a session that ended meanwhile (a restore
		// from a tier, say, hands it blocks it gives back at once).
		if s.gone() != nil {
			cause = errSessionGone
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
		refs, fetch, err := a.fromLocal(ctx, s, rest, parent)
		if len(refs) == 0 && err == nil {
			refs, fetch, err = a.fromTier(ctx, s, rest, parent)
		}
		if len(refs) == 0 && err == nil {
			refs, fetch, err = a.importFromHolders(ctx, s, samePages(rest), parent, &tried, &failures)
		}
		if len(refs) == 0 && errors.Is(err, errNoHolder) && ts != nil {
			refs, fetch, err = a.importSmallerPages(ctx, s, ts, len(res.refs), rest, parent, &tried, &failures)
		}
		a.flights.finish(s.set.ID(), rest[0], f)
		res.refs = append(res.refs, refs...)
		res.here = append(res.here, make([]bool, len(refs))...)
		if fetch != nil {
			res.fetches = append(res.fetches, fetch)
		}
		if err != nil || len(refs) == 0 {
			cause = err
			break
		}
	}
	if len(res.refs) < len(hashes) {
		if cause == nil {
			cause = errHoldersFailed
		}
		// An import whose session ended stopped; it did not fail.
		if !errors.Is(cause, errSessionGone) {
			a.stats.importFails.Add(1)
		}
		if !errors.Is(cause, errHoldersFailed) || len(failures) == 0 {
			// Every failure says why, even one no holder reported.
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

// importSmallerPages imports the leading blocks of rest, engine blocks
// numbered from from in the sequence ts names, from holders whose page
// divides the engine's, trying the largest such page that some holder
// serves at least one whole engine block of.
func (a *Agent) importSmallerPages(ctx context.Context, s *sessionSet, ts *tokenSource, from int, rest []uint64, parent uint64, tried *int, failures *[]string) ([]*fabricpb.BlockRef, *fabricpb.Fetch, error) {
	var (
		refs  []*fabricpb.BlockRef
		fetch *fabricpb.Fetch
		err   = errNoHolder
	)
	herr := ts.smallerPages(s.set.Layout().PageSize, from, rest, func(want pages) bool {
		refs, fetch, err = a.importFromHolders(ctx, s, want, parent, tried, failures)
		return errors.Is(err, errNoHolder) && len(refs) == 0
	})
	if herr != nil {
		return nil, nil, localError{herr}
	}
	return refs, fetch, err
}

// importFromHolders fetches the leading blocks of want from the best
// holder that serves them, trying the next when a holder fails. Blocks
// registered before a failure are returned with it: they are the
// engine's. A local failure or the end of ctx stops the search.
func (a *Agent) importFromHolders(ctx context.Context, s *sessionSet, want pages, parent uint64, tried *int, failures *[]string) ([]*fabricpb.BlockRef, *fabricpb.Fetch, error) {
	cands := a.candidates(want.src, want.k)
	if len(cands) == 0 {
		return nil, nil, errNoHolder
	}
	for _, c := range cands {
		if *tried >= maxHoldersTried {
			return nil, nil, fmt.Errorf("%w (%d tried)", errHoldersFailed, *tried)
		}
		start := time.Now()
		refs, bytes, via, err := a.fetch(ctx, c.member, s, want.slice(0, c.blocks), parent)
		var fetch *fabricpb.Fetch
		if len(refs) > 0 {
			fetch = &fabricpb.Fetch{Node: c.member.Name, Transport: via, Blocks: uint32(len(refs)), Bytes: bytes, Micros: uint64(time.Since(start).Microseconds())}
		}
		var local localError
		if err == nil || errors.As(err, &local) || ctx.Err() != nil {
			return refs, fetch, err
		}
		*tried++ // a holder that failed; one that served counts nothing
		// A refusal this import caused says nothing about the holder's
		// health; any other failure sends it to the back of the queue.
		var req requestError
		if !errors.As(err, &req) {
			a.suspects.add(c.member.Name, 2*a.cfg.PeerTimeout+suspectFor)
		}
		a.log.Warn("import from holder failed", "peer", c.member.Name, "blocks", c.blocks, "kept", len(refs), "err", err)
		*failures = append(*failures, fmt.Sprintf("%s: %v", c.member.Name, err))
		if len(refs) > 0 {
			// Keep the chunks that arrived whole; the caller looks for
			// holders of the rest.
			return refs, fetch, nil
		}
	}
	return nil, nil, errHoldersFailed
}

type candidate struct {
	member  membership.Member
	blocks  int // whole engine blocks it holds
	disk    int // of its pages of those, how many it holds on disk only
	load    float64
	suspect bool
}

// candidates are the members holding a prefix of hashes, the holder's
// pages of which k make one engine block: longest prefix first, then
// fewest of them on a disk tier only (tier_holders.go), then least loaded (every holder is reached over QUIC today, so transport
// cost does not separate them yet). Members that hold less than one whole
// engine block are left out.
func (a *Agent) candidates(hashes []uint64, k int) []candidate {
	matches, onDisk := a.findHolders(hashes)
	var out []candidate
	for _, m := range matches {
		if m.Blocks < k {
			continue
		}
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
		c := candidate{member: mem, blocks: m.Blocks / k, load: load}
		c.disk = onDisk(m.Node, hashes[:c.blocks*k])
		out = append(out, c)
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
		if x.disk != y.disk {
			return x.disk < y.disk // memory before a restore from disk
		}
		return x.load < y.load
	})
	// Holders equally good take turns, so that imports spread over them
	// between two load reports.
	tied := 0
	for tied < len(out) && out[tied].suspect == out[0].suspect && out[tied].blocks == out[0].blocks &&
		out[tied].disk == out[0].disk && out[tied].load == out[0].load {
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

// registerFilled commits and registers blocks, whose bytes are in place,
// under hashes (in order, after parent), referencing each for the engine.
// On an error the blocks already registered are kept and returned, and
// the rest are freed.
//
// Each block gets a content checksum: sums[i] where summed[i] (checked
// already), else one taken here when checksums are on. The blocks go to
// the pool in batches of pool.MaxRegisterBatch: one hold of the set's
// lock, one batch of events and one update of the session's references
// each, not one per block.
func (s *sessionSet) registerFilled(blocks []pool.Block, hashes []uint64, parent uint64, sums []uint64, summed []bool) ([]*fabricpb.BlockRef, error) {
	refs := make([]*fabricpb.BlockRef, 0, len(blocks))
	regs := make([]pool.Registration, 0, min(len(blocks), pool.MaxRegisterBatch))
	for first := 0; first < len(blocks); first += pool.MaxRegisterBatch {
		batch := blocks[first:min(len(blocks), first+pool.MaxRegisterBatch)]
		regs = regs[:0]
		for j, b := range batch {
			i := first + j
			r := pool.Registration{Block: b, Hash: hashes[i]}
			if i < len(summed) && summed[i] {
				r.Sum, r.HasSum = sums[i], true
			} else {
				r.Sum, r.HasSum = s.takeSum(b.Slot)
			}
			regs = append(regs, r)
		}
		got, err := s.set.RegisterBatch(regs, parent)
		if !s.holdAll(got) {
			// The session ended: got is given back; the rest is not
			// registered.
			for _, rest := range blocks[first+len(got):] {
				s.set.Abort(rest)
			}
			return refs, errSessionGone
		}
		for j, reg := range got {
			refs = append(refs, &fabricpb.BlockRef{Hash: hashes[first+j], Slot: uint32(reg.Slot), Duplicate: reg.Slot != batch[j].Slot})
		}
		if err != nil {
			for _, rest := range blocks[first+len(got):] {
				s.set.Abort(rest)
			}
			return refs, err
		}
		parent = hashes[first+len(batch)-1]
	}
	return refs, nil
}
