package index

import (
	"hash/fnv"
	"slices"
)

// Owned slices: past the cluster size where every node can keep the whole
// index (docs/scale.md), each block hash is owned by a few members chosen by
// rendezvous hashing over the member list; events go only to a hash's
// owners, lookups ask them (with a local cache of recent answers), and
// owners hand their slice off when membership changes. Placement is that
// choice: a pure function of the member list, the same on every node that
// sees the same members, and Lookup is what a router needs of whichever
// index answers it.

// Lookup is the read side of a block index, local or owned: the holders
// of a request's leading hashes. [Index] implements it; an owned-slices
// index implements it by asking the owners of the hashes.
type Lookup interface {
	// AppendMatches appends, for every live node holding at least the
	// first hash, how many leading hashes it holds, longest first.
	AppendMatches(dst []Match, hashes []uint64) []Match
	// Name returns the node name of id, "" if it is not live.
	Name(id NodeID) string
}

var _ Lookup = (*Index)(nil)

// Placement assigns each hash to its owners among a member list, by
// rendezvous (highest random weight) hashing: a hash's owners are the
// members with the highest score mix(hash, member), so a member that joins
// or leaves moves only the hashes it gains or loses (about Replicas/N of
// them), and no two nodes with the same member list disagree.
type Placement struct {
	names    []string
	nh       []uint64 // name hashes, as names
	replicas int
}

// NewPlacement returns the placement of replicas owners per hash over
// members (names, in any order; duplicates count once). replicas is
// clamped to [1, len(members)].
func NewPlacement(members []string, replicas int) *Placement {
	names := slices.Clone(members)
	slices.Sort(names)
	names = slices.Compact(names)
	p := &Placement{names: names, nh: make([]uint64, len(names)), replicas: max(1, min(replicas, len(names)))}
	for i, n := range names {
		h := fnv.New64a()
		h.Write([]byte(n))
		p.nh[i] = h.Sum64()
	}
	return p
}

// Members returns the member list, sorted; the caller must not modify it.
func (p *Placement) Members() []string { return p.names }

// Replicas is how many owners each hash has.
func (p *Placement) Replicas() int { return p.replicas }

// AppendOwners appends the owners of hash to dst, highest score first.
// With no members it appends nothing.
func (p *Placement) AppendOwners(dst []string, hash uint64) []string {
	if len(p.names) == 0 {
		return dst
	}
	// The top replicas scores by insertion into a short sorted list:
	// replicas is a handful, members may be thousands.
	var top [8]struct {
		score uint64
		i     int
	}
	best := top[:0]
	var big []struct {
		score uint64
		i     int
	}
	if p.replicas > len(top) {
		big = make([]struct {
			score uint64
			i     int
		}, 0, p.replicas+1)
		best = big
	}
	for i, nh := range p.nh {
		s := mix(hash, nh)
		if len(best) == p.replicas && s <= best[len(best)-1].score {
			continue
		}
		j := len(best)
		if j < p.replicas {
			best = append(best, struct {
				score uint64
				i     int
			}{})
		} else {
			j--
		}
		for j > 0 && best[j-1].score < s {
			best[j] = best[j-1]
			j--
		}
		best[j].score, best[j].i = s, i
	}
	for _, b := range best {
		dst = append(dst, p.names[b.i])
	}
	return dst
}

// Owns reports whether member owns hash.
func (p *Placement) Owns(member string, hash uint64) bool {
	var buf [8]string
	return slices.Contains(p.AppendOwners(buf[:0], hash), member)
}

// HandOff returns, of hashes that member owns under from, those it must
// send to a new owner under to, with the owners under to that did not own
// them under from: what a member sends when membership changes.
func HandOff(from, to *Placement, member string, hashes []uint64) map[string][]uint64 {
	out := map[string][]uint64{}
	var was, now [8]string
	for _, h := range hashes {
		old := from.AppendOwners(was[:0], h)
		if !slices.Contains(old, member) {
			continue
		}
		for _, o := range to.AppendOwners(now[:0], h) {
			if !slices.Contains(old, o) {
				out[o] = append(out[o], h)
			}
		}
	}
	return out
}
