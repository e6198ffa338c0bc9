// Package kvtest writes and checks KV blocks whose every element encodes
// what it is: (block, layer, K/V, token, head, dim). A block written under
// one layout and read under another, through any plan or transport, is
// checked element by element, so a wrong head slice, token order or rank
// shows up as the element it displaced.
package kvtest

import (
	"encoding/binary"
	"fmt"

	"github.com/kvfabric/kvfabric/layout"
)

// Value is the content of one element of logical block id.
func Value(block uint64, layer, plane, tok, head, dim int) uint64 {
	x := block*0x9e3779b97f4a7c15 ^ uint64(layer)<<40 ^ uint64(plane)<<36 ^ uint64(tok)<<24 ^ uint64(head)<<12 ^ uint64(dim)
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	return x ^ x>>29
}

// each calls fn for every element of slot in the layout's regions.
func each(l *layout.Layout, slot int, fn func(rank, layer, plane, tok, head, dim int, off uint64)) {
	es := l.Model.DType.Size()
	hpr := l.HeadsPerRank()
	planes := 2
	if l.Model.MLA {
		planes = 1
	}
	hd := uint64(l.Model.HeadDim)
	for r := range l.TPSize {
		first := l.FirstHead(r)
		for layer := range l.Model.Layers {
			for p := range planes {
				base := l.ChunkOffset(slot, layer, p)
				for lh := range hpr {
					for tok := range l.PageSize {
						var in uint64
						if l.Order == layout.NHD {
							in = (uint64(tok)*uint64(hpr) + uint64(lh)) * hd
						} else {
							in = (uint64(lh)*uint64(l.PageSize) + uint64(tok)) * hd
						}
						for d := range l.Model.HeadDim {
							fn(r, layer, p, tok, first+lh, d, base+(in+uint64(d))*es)
						}
					}
				}
			}
		}
	}
}

// Fill writes logical block id into slot: regions[r] is rank r's region.
func Fill(l *layout.Layout, regions [][]byte, slot int, id uint64) {
	es := l.Model.DType.Size()
	var v [8]byte
	each(l, slot, func(rank, layer, plane, tok, head, dim int, off uint64) {
		binary.LittleEndian.PutUint64(v[:], Value(id, layer, plane, tok, head, dim))
		copy(regions[rank][off:off+es], v[:es])
	})
}

// Check verifies that slot holds logical block id, and says where not.
func Check(l *layout.Layout, regions [][]byte, slot int, id uint64) error {
	es := l.Model.DType.Size()
	var v [8]byte
	var err error
	each(l, slot, func(rank, layer, plane, tok, head, dim int, off uint64) {
		if err != nil {
			return
		}
		binary.LittleEndian.PutUint64(v[:], Value(id, layer, plane, tok, head, dim))
		if got := regions[rank][off : off+es]; string(got) != string(v[:es]) {
			err = fmt.Errorf("slot %d rank %d layer %d plane %d token %d head %d dim %d: got %x, want %x (block %d)",
				slot, rank, layer, plane, tok, head, dim, got, v[:es], id)
		}
	})
	return err
}

// FillTokens writes into slot the tokens first..first+PageSize-1 of
// logical sequence seq: an element's content depends on its token's place
// in the sequence, not in the block, so that blocks of one page size can
// be checked against blocks of another made from the same tokens.
func FillTokens(l *layout.Layout, regions [][]byte, slot int, seq uint64, first int) {
	es := l.Model.DType.Size()
	var v [8]byte
	each(l, slot, func(rank, layer, plane, tok, head, dim int, off uint64) {
		binary.LittleEndian.PutUint64(v[:], Value(seq, layer, plane, first+tok, head, dim))
		copy(regions[rank][off:off+es], v[:es])
	})
}

// CheckTokens verifies that slot holds the tokens first..first+PageSize-1
// of logical sequence seq, as FillTokens writes them, and says where not.
func CheckTokens(l *layout.Layout, regions [][]byte, slot int, seq uint64, first int) error {
	es := l.Model.DType.Size()
	var v [8]byte
	var err error
	each(l, slot, func(rank, layer, plane, tok, head, dim int, off uint64) {
		if err != nil {
			return
		}
		binary.LittleEndian.PutUint64(v[:], Value(seq, layer, plane, first+tok, head, dim))
		if got := regions[rank][off : off+es]; string(got) != string(v[:es]) {
			err = fmt.Errorf("slot %d rank %d layer %d plane %d token %d (of the sequence %d) head %d dim %d: got %x, want %x",
				slot, rank, layer, plane, tok, first+tok, head, dim, got, v[:es])
		}
	})
	return err
}
