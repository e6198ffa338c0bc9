package fabric

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// Content checksums (Config.NoChecksums turns them off). A block an engine
// registers in host memory gets layout.BlockSum of its bytes; a lease
// carries it; the importer checks every block it read against it once the
// bytes are in its slots and before it registers them, whatever transport
// carried them (the check is here, not in a transport). A block that fails
// is not registered: the chunk fails over to another holder, the failure is
// counted and logged with both node names, and the release tells the
// holder, which checks the block again itself and withdraws it (its remove
// event takes it out of every index). Blocks whose sum cannot be taken
// (device memory) go unchecked.

// errChecksum says that bytes read from a holder did not match the
// checksums it gave: the holder is to blame, and another may serve them.
var errChecksum = errors.New("fabric: content checksum mismatch")

// blockSum is the checksum of tokens [first, first+count) of slot in set,
// or false when the set is not in host memory.
func blockSum(set *pool.BlockSet, slot, first, count int) (uint64, bool) {
	regions, err := set.RegionBytes()
	if err != nil {
		return 0, false
	}
	sum, err := layout.BlockSum(set.Layout(), regions, slot, first, count)
	return sum, err == nil
}

// takeSum is the checksum of a whole block about to be registered, when
// checksums are on and the set is in host memory.
func (es *engineSet) takeSum(slot int) (uint64, bool) {
	if !es.sums {
		return 0, false
	}
	return blockSum(es.set, slot, 0, es.set.Layout().PageSize)
}

// verify checks the chunk's blocks, now in its slots, against the sums of
// the holder's pages that the lease gave. It returns the holder's hashes
// that failed, how many pages it checked, and each engine block's sum
// where every page of it had one that matched (ok), to record on
// registration.
func (ch *arrivedChunk) verify() (mismatched []uint64, checked int, sums []uint64, ok []bool) {
	if ch.a.cfg.NoChecksums {
		return nil, 0, nil, nil
	}
	set := ch.s.set
	regions, err := set.RegionBytes()
	if err != nil {
		return nil, 0, nil, nil // device memory
	}
	l := set.Layout()
	k := max(ch.k, 1)
	page := l.PageSize / k
	sums, ok = make([]uint64, len(ch.blocks)), make([]bool, len(ch.blocks))
	for i := range ok {
		ok[i] = true
	}
	for i, lb := range ch.leased {
		b := i / k
		if !lb.HasSum {
			ok[b] = false
			continue
		}
		got, err := layout.BlockSum(l, regions, ch.blocks[b].Slot, (i%k)*page, page)
		if err != nil {
			ok[b] = false
			continue
		}
		checked++
		if got != lb.Sum {
			mismatched = append(mismatched, lb.Hash)
			ok[b] = false
		}
		if k == 1 {
			sums[b] = got
		}
	}
	if k > 1 {
		for b := range sums {
			if ok[b] {
				sums[b], ok[b] = blockSum(set, ch.blocks[b].Slot, 0, l.PageSize)
			}
		}
	}
	return mismatched, checked, sums, ok
}

// Mismatched checks the blocks a reader says failed their checksums, in
// every block set that holds them, against the sums taken at registration,
// and withdraws those whose bytes no longer match. A claim is never taken
// on trust: only the reader's own lease may carry one, and a block whose
// bytes still match stays.
func (h *peerService) Mismatched(ctx context.Context, peer string, id uint64, hashes []uint64) {
	if err := h.owned(peer, id); err != nil {
		return
	}
	a := h.a
	for _, es := range a.engineSets() {
		for _, x := range hashes {
			b, ok := es.set.Lookup(x)
			if !ok {
				continue
			}
			want, ok := es.set.Sum(b)
			if !ok {
				continue
			}
			got, ok := blockSum(es.set, b.Slot, 0, es.set.Layout().PageSize)
			if !ok || got == want {
				continue
			}
			if err := es.set.Withdraw(b); err != nil {
				continue // recycled meanwhile
			}
			a.stats.checksumWithdrawn.Add(1)
			a.log.Error("block changed after it was registered: withdrawn (an engine wrote into it after registering it)",
				"peer", peer, "hash", x, "set", es.set.ID(), "slot", b.Slot, "engine", es.engine,
				"sum", fmt.Sprintf("%016x", want), "now", fmt.Sprintf("%016x", got))
		}
	}
}

// checkCopies checks blocks copied from another block set of this node
// (from, into to) against the sums their engine's registration took, and
// returns how many leading ones match; the first that does not is
// withdrawn from its set. sums and summed receive the sums checked, for
// registration.
func (a *Agent) checkCopies(src, dst *pool.BlockSet, from, to []pool.Block, sums []uint64, summed []bool) int {
	if a.cfg.NoChecksums {
		return len(from)
	}
	for i := range from {
		want, ok := src.Sum(from[i])
		if !ok {
			continue
		}
		got, ok := blockSum(dst, to[i].Slot, 0, dst.Layout().PageSize)
		if !ok {
			continue
		}
		if got != want {
			a.stats.checksumFailed.Add(1)
			if src.Withdraw(from[i]) == nil {
				a.stats.checksumWithdrawn.Add(1)
			}
			a.log.Error("block changed after it was registered: not copied, withdrawn (an engine wrote into it after registering it)",
				"set", src.ID(), "slot", from[i].Slot, "to_set", dst.ID(), "sum", fmt.Sprintf("%016x", want), "now", fmt.Sprintf("%016x", got))
			return i
		}
		a.stats.checksumVerified.Add(1)
		sums[i], summed[i] = got, true
	}
	return len(from)
}

var _ transfer.MismatchReporter = (*peerService)(nil)
