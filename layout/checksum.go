package layout

import (
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
