package fabric

import (
	"fmt"

	"github.com/kvfabric/kvfabric/layout"
)

// pages names the blocks an import wants both as the engine names them
// and as a holder names them. A holder whose page is 1/k of the engine's
// holds each engine block as k consecutive pages of its own, named by
// hashes of those pages: engine block i is src[i*k : (i+1)*k]. With k = 1
// the two names are the same.
type pages struct {
	dst []uint64 // the engine's sequence hashes
	src []uint64 // the holder's; len(src) == k*len(dst)
	k   int
}

// samePages names hashes at the engine's own page size.
func samePages(hashes []uint64) pages { return pages{dst: hashes, src: hashes, k: 1} }

// blocks is how many engine blocks p names.
func (p pages) blocks() int { return len(p.dst) }

// slice returns engine blocks [i, j) of p.
func (p pages) slice(i, j int) pages {
	return pages{dst: p.dst[i:j], src: p.src[i*p.k : j*p.k], k: p.k}
}

// tokenSource is an import asked for by token ids: what the agent needs to
// name the same tokens at a holder's smaller page size.
type tokenSource struct {
	ids  []uint32
	opts layout.HashOptions
}

// smallerPages calls each with the names of dst, the engine blocks
// numbered from from in the sequence ts hashes at page tokens a page, at
// every page size that divides page, largest first, until each returns
// false. Each size is hashed only when it is reached.
func (ts *tokenSource) smallerPages(page, from int, dst []uint64, each func(pages) bool) error {
	n := len(dst)
	tokens := ts.ids[:(from+n)*page]
	for k := 2; k <= page; k++ {
		if page%k != 0 {
			continue
		}
		h, err := layout.NewHasher(page/k, ts.opts)
		if err != nil {
			return fmt.Errorf("page size %d: %w", page/k, err)
		}
		seq := h.Sequence(tokens)
		src := make([]uint64, n*k)
		for i := range src {
			src[i] = seq[from*k+i].Sequence
		}
		if !each(pages{dst: dst, src: src, k: k}) {
			return nil
		}
	}
	return nil
}
