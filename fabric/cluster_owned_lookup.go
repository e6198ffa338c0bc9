package fabric

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
)

// diskOnly counts the hashes of which holder id has copies on a disk tier
// only, of those a query matched.
type diskOnly func(id index.NodeID, hashes []uint64) int

// findHolders is the index's answer to a prefix query, whichever the
// index mode (the whole index here, or the owners' slices asked), and
// what the index knows of the holders' tiers: in whole mode the copies
// announced under a disk tier's set number (tier_holders.go), in owned
// mode the owners' answers.
func (a *Agent) findHolders(hashes []uint64) ([]index.Match, diskOnly) {
	if a.owned == nil {
		return a.index.FindMatches(hashes), func(id index.NodeID, hs []uint64) int { return a.tierHeld.CountDiskOnly(a.index, id, hs) }
	}
	ms, disk := a.owned.findMatches(hashes)
	return ms, func(id index.NodeID, hs []uint64) int {
		d := disk[a.index.Name(id)]
		n := 0
		for i := range min(len(hs), len(d)) {
			if d[i] {
				n++
			}
		}
		return n
	}
}

// lookupChunk is how many hashes of a query are asked of the owners
// before the holders so far are intersected: a prefix no node holds stops
// the query there.
const lookupChunk = 256

// findMatches asks the owners of hashes who holds them, a chunk at a
// time, and answers as [index.Index.FindMatches] does. Each hash is asked
// of all its owners, and their answers are merged, so that an owner that
// has not received its slice yet (it just joined) does not hide holders;
// an owner that does not answer is left out. Answers are cached for the
// configured TTL. It returns too, per holder matched, which of its
// leading hashes it holds on a disk tier only (an owner that names a
// holder in memory wins over one that does not know yet).
func (o *ownedIndex) findMatches(hashes []uint64) ([]index.Match, map[string][]bool) {
	place := o.pub.Placement()
	if len(hashes) == 0 || place == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(o.a.ctx, o.a.cfg.PeerTimeout)
	defer cancel()
	var active map[string]int // holder -> leading hashes held
	disk := map[string][]bool{}
	for base := 0; base < len(hashes); base += lookupChunk {
		chunk := hashes[base:min(base+lookupChunk, len(hashes))]
		got := o.ask(ctx, place, chunk)
		for i, hs := range got {
			if base+i == 0 {
				active = make(map[string]int, len(hs))
				for _, h := range hs {
					active[h.Name] = 0
				}
			}
			live := 0
			for _, x := range hs { // each holder once (ask merges the owners' answers)
				if n, ok := active[x.Name]; ok && n == base+i {
					active[x.Name] = n + 1
					disk[x.Name] = append(disk[x.Name], x.DiskOnly)
					live++
				}
			}
			if live == 0 {
				return o.matches(active), disk
			}
		}
	}
	return o.matches(active), disk
}

// mergeHolders adds to hs, the holders of a hash that owners named, those
// another owner names (each holder once in an answer, as decoded): each
// holder once, in memory where any owner knows of a copy in memory. In
// time linear in both: an owner may name thousands.
func mergeHolders(hs, more []index.Holder) []index.Holder {
	if len(hs) == 0 {
		return append(hs, more...)
	}
	at := make(map[string]int, len(hs))
	for k, h := range hs {
		at[h.Name] = k
	}
	for _, h := range more {
		switch k, ok := at[h.Name]; {
		case !ok:
			at[h.Name] = len(hs)
			hs = append(hs, h)
		case !h.DiskOnly:
			hs[k].DiskOnly = false // an owner that knows of a copy in memory
		}
	}
	return hs
}

// ask returns the holders of each of hashes, from the cache or the owners.
func (o *ownedIndex) ask(ctx context.Context, place *index.Placement, hashes []uint64) [][]index.Holder {
	out := make([][]index.Holder, len(hashes))
	now := time.Now()
	need := map[string][]int{} // owner -> indexes into hashes
	var owners [index.MaxReplicas]string
	for i, h := range hashes {
		if hs, ok := o.cache.Get(h, now); ok {
			out[i] = hs
			continue
		}
		for _, w := range place.AppendOwners(owners[:0], h) {
			need[w] = append(need[w], i)
		}
	}
	if len(need) == 0 {
		return out
	}
	var mu sync.Mutex
	answered := make([]bool, len(hashes))
	var wg sync.WaitGroup
	for w, idx := range need {
		wg.Go(func() {
			qs := make([]uint64, len(idx))
			for j, i := range idx {
				qs[j] = hashes[i]
			}
			var got [][]index.Holder
			if w == o.a.cfg.NodeName {
				got = o.slice.Load().HolderTiers(qs)
			} else {
				var err error
				if got, err = o.lookup(w, qs); err != nil {
					o.a.log.Debug("index lookup: an owner did not answer", "peer", w, "err", err)
					return
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for j, i := range idx {
				answered[i] = true
				out[i] = mergeHolders(out[i], got[j])
			}
		})
	}
	wg.Wait()
	for i, h := range hashes {
		if answered[i] {
			if out[i] == nil {
				out[i] = []index.Holder{}
			}
			o.cache.Put(h, out[i], now)
		}
	}
	return out
}

// matches turns holder names and their leading hashes into the index's
// matches, longest first: members only, named in the local index (which
// gives ids to the holders an owner told of).
func (o *ownedIndex) matches(active map[string]int) []index.Match {
	var out []index.Match
	for name, n := range active {
		if n == 0 || !o.a.isMember(name) {
			continue
		}
		id, err := o.a.index.ID(name)
		if err != nil {
			continue
		}
		out = append(out, index.Match{Node: id, Blocks: n})
	}
	slices.SortFunc(out, func(x, y index.Match) int {
		if x.Blocks != y.Blocks {
			return y.Blocks - x.Blocks
		}
		return int(uint32(x.Node)) - int(uint32(y.Node))
	})
	return out
}
