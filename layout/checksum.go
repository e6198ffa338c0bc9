package layout

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"
)

// BlockSum is the content checksum of a block, or of a run of its tokens:
// xxh3-64 of its elements in one canonical order, whatever layout holds
// them, so that a holder and a reader of any TP size, KV order,
// arrangement or alignment agree on it:
//
//	for layer in 0..layers-1
//	  for plane in K, V (the latent alone for MLA)
//	    for head in 0..kv_heads-1 (each head once, from the first rank
//	                                holding it)
//	      for token in first..first+count-1
//	        the head_dim elements of (layer, plane, token, head), as stored
//
// ranks are the regions of l's ranks (rank r's region at ranks[r]). A
// block of one layout made of k pages of another is checked page by page:
// page j of it is tokens [j*P, (j+1)*P) with P the other's page size.
//
// Every path that moves blocks (QUIC, RDMA, a TCP lane, a disk tier) takes
// and checks this same sum; the reader checks it after the bytes landed
// and before the block is registered, whatever carried them.
func BlockSum(l *Layout, ranks [][]byte, slot, first, count int) (uint64, error) {
	if len(ranks) != l.TPSize {
		return 0, fmt.Errorf("%w: %d rank regions for TP %d", ErrInvalid, len(ranks), l.TPSize)
	}
	if slot < 0 || slot >= l.Slots || first < 0 || count < 1 || first+count > l.PageSize {
		return 0, fmt.Errorf("%w: slot %d tokens [%d, +%d) outside %d slots of %d tokens", ErrInvalid, slot, first, count, l.Slots, l.PageSize)
	}
	st := l.Strides()
	for r, b := range ranks {
		if uint64(len(b)) < st.Region {
			return 0, fmt.Errorf("%w: rank %d region of %d bytes, the layout needs %d", ErrInvalid, r, len(b), st.Region)
		}
	}
	heads, per := l.Model.KVHeads, l.HeadsPerRank()
	// The rank that holds each head first, and where in its chunk.
	rankOf := make([]int, heads)
	for h := range rankOf {
		rankOf[h] = -1
	}
	for r := l.TPSize - 1; r >= 0; r-- {
		for i := range per {
			rankOf[l.FirstHead(r)+i] = r
		}
	}
	planes := 2
	if l.Model.MLA {
		planes = 1
	}
	esz := l.Model.DType.Size()
	row := uint64(l.Model.HeadDim) * esz // one (token, head)
	page := uint64(l.PageSize)
	// The elements go to the hash in runs of what is contiguous in one
	// rank's memory, each hashed in place but for a block's worth
	// (sumHasher); a block that is one run (TP 1, HND, a whole page,
	// FullyContiguous) is hashed in one call, with the same value.
	var (
		h       sumHasher // the zero one is a fresh one
		written bool
	)
	run := struct {
		rank       int
		start, end uint64
	}{rank: -1}
	add := func(r int, off, n uint64) {
		if r == run.rank && off == run.end {
			run.end += n
			return
		}
		if run.rank >= 0 {
			h.write(ranks[run.rank][run.start:run.end])
			written = true
		}
		run.rank, run.start, run.end = r, off, off+n
	}
	for layer := range l.Model.Layers {
		for p := range planes {
			base := l.ChunkOffset(slot, layer, p)
			for head := range heads {
				r := rankOf[head]
				lh := uint64(head - l.FirstHead(r))
				if l.Order == HND {
					add(r, base+(lh*page+uint64(first))*row, uint64(count)*row)
					continue
				}
				for t := uint64(first); t < uint64(first+count); t++ {
					add(r, base+(t*uint64(per)+lh)*row, row)
				}
			}
		}
	}
	last := ranks[run.rank][run.start:run.end]
	if !written {
		return xxh3.Hash(last), nil
	}
	h.write(last)
	return h.sum64(), nil
}

// ErrReplicasDiffer says that the copies of a KV head on two ranks of one
// block differ: the block has no one content, and BlockSum, which reads
// each head once, does not see it.
var ErrReplicasDiffer = errors.New("layout: the ranks' copies of a head differ")

// Replicated says whether l holds some KV head on more than one rank (MLA
// at TP 2 or more, or more ranks than KV heads), where BlockSum reads the
// first rank's copy only and ReplicasMatch checks the others.
func (l *Layout) Replicated() bool {
	return l.TPSize > 1 && (l.Model.MLA || l.TPSize > l.Model.KVHeads)
}

// ReplicasMatch checks that every copy of every KV head of tokens [first,
// first+count) of slot, on each rank that holds one, is byte for byte the
// copy of the first rank that holds it (the one BlockSum reads), so that
// a block whose sum matched is the same on every rank. It returns nil at
// once where l replicates no head, ErrReplicasDiffer naming the first
// difference, or ErrInvalid for arguments BlockSum refuses too.
func ReplicasMatch(l *Layout, ranks [][]byte, slot, first, count int) error {
	if !l.Replicated() {
		return nil
	}
	if len(ranks) != l.TPSize {
		return fmt.Errorf("%w: %d rank regions for TP %d", ErrInvalid, len(ranks), l.TPSize)
	}
	if slot < 0 || slot >= l.Slots || first < 0 || count < 1 || first+count > l.PageSize {
		return fmt.Errorf("%w: slot %d tokens [%d, +%d) outside %d slots of %d tokens", ErrInvalid, slot, first, count, l.Slots, l.PageSize)
	}
	st := l.Strides()
	for r, b := range ranks {
		if uint64(len(b)) < st.Region {
			return fmt.Errorf("%w: rank %d region of %d bytes, the layout needs %d", ErrInvalid, r, len(b), st.Region)
		}
	}
	per := l.HeadsPerRank()
	planes := 2
	if l.Model.MLA {
		planes = 1
	}
	row := uint64(l.Model.HeadDim) * l.Model.DType.Size()
	page := uint64(l.PageSize)
	// same says whether head lha of a chunk at base in rank region a holds
	// what head lhb of the chunk at base in b does, over the tokens: one
	// run in HND, a row per token in NHD (ranks lay their chunks out alike).
	same := func(a []byte, lha uint64, b []byte, lhb uint64, base uint64) bool {
		if l.Order == HND {
			oa, ob, n := base+(lha*page+uint64(first))*row, base+(lhb*page+uint64(first))*row, uint64(count)*row
			return bytes.Equal(a[oa:oa+n], b[ob:ob+n])
		}
		for t := uint64(first); t < uint64(first+count); t++ {
			oa, ob := base+(t*uint64(per)+lha)*row, base+(t*uint64(per)+lhb)*row
			if !bytes.Equal(a[oa:oa+row], b[ob:ob+row]) {
				return false
			}
		}
		return true
	}
	// The rank each head is first held by, as BlockSum reads it.
	firstOf := make([]int, l.Model.KVHeads)
	for r := l.TPSize - 1; r >= 0; r-- {
		for i := range per {
			firstOf[l.FirstHead(r)+i] = r
		}
	}
	for layer := range l.Model.Layers {
		for p := range planes {
			base := l.ChunkOffset(slot, layer, p)
			for r := range l.TPSize {
				for i := range per {
					head := l.FirstHead(r) + i
					f := firstOf[head]
					if f == r {
						continue
					}
					if !same(ranks[f], uint64(head-l.FirstHead(f)), ranks[r], uint64(i), base) {
						return fmt.Errorf("%w: layer %d plane %d head %d of slot %d: rank %d's copy is not rank %d's",
							ErrReplicasDiffer, layer, p, head, slot, r, f)
					}
				}
			}
		}
	}
	return nil
}
