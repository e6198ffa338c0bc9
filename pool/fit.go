package pool

import (
	"slices"

	"github.com/kvfabric/kvfabric/layout"
)

// FitsFreeing says whether NewBlockSetOn(tmpl, place) would find room
// were the block sets freed given back first (ReclaimBlockSet), without
// freeing them or carving anything: for a caller that frees sets only
// where that makes room for the new one. A set with retired slots gives
// back no memory when freed (it is withheld), and an id of no set (0, or
// one freed) none either. The answer holds until the pool's sets change. The
// error is NewBlockSetOn's for a layout or placement it refuses.
func (p *Pool) FitsFreeing(tmpl *layout.Layout, place []int, freed ...SetID) (bool, error) {
	l, place, err := p.setLayout(tmpl, place)
	if err != nil {
		return false, err
	}
	st := l.Strides()
	align := max(l.Alignment, p.page)
	p.mu.RLock()
	defer p.mu.RUnlock()
	var back []cut
	for _, id := range freed {
		if id == 0 || uint64(id) > uint64(len(p.sets)) || p.sets[id-1] == nil {
			continue
		}
		b := p.sets[id-1]
		b.mu.Lock()
		if b.retired == 0 {
			back = append(back, b.cuts...)
		}
		b.mu.Unlock()
	}
	for a, ar := range p.arenas {
		n := 0
		for _, pa := range place {
			if pa == a {
				n++
			}
		}
		if n == 0 {
			continue
		}
		// A copy of the arena, given back the freed sets' memory in it.
		c := &arena{storage: ar.storage, next: ar.next, holes: slices.Clone(ar.holes)}
		for _, ct := range back {
			if ct.arena == a {
				c.addHole(ct.span)
			}
		}
		if _, _, ok := c.place(align, st.Region, n); !ok {
			return false, nil
		}
	}
	return true, nil
}
