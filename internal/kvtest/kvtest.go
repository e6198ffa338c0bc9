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

// rows calls fn for every row of slot in the layout's regions: the
// HeadDim elements of one (rank, layer, plane, token, head), which lie
// side by side in either order, as the bytes of regions[rank] they take.
// fn returns false to stop. A call per row rather than per element keeps
// the tests that fill and check hundreds of megabytes (under the race
// detector, which instruments every call) from spending minutes here.
func rows(l *layout.Layout, regions [][]byte, slot int, fn func(rank, layer, plane, tok, head int, row []byte) bool) {
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
						off := base + in*es
						if !fn(r, layer, p, tok, first+lh, regions[r][off:off+hd*es:off+hd*es]) {
							return
						}
					}
				}
			}
		}
	}
}

// fillRow writes the row of (id, layer, plane, tok, head): each element
// the low es bytes of its Value, little-endian.
func fillRow(row []byte, es int, id uint64, layer, plane, tok, head int) {
	switch es {
	case 1:
		for d := range row {
			row[d] = byte(Value(id, layer, plane, tok, head, d))
		}
	case 2:
		for d := range len(row) / 2 {
			binary.LittleEndian.PutUint16(row[2*d:], uint16(Value(id, layer, plane, tok, head, d)))
		}
	case 4:
		for d := range len(row) / 4 {
			binary.LittleEndian.PutUint32(row[4*d:], uint32(Value(id, layer, plane, tok, head, d)))
		}
	default:
		var v [8]byte
		for d := range len(row) / es {
			binary.LittleEndian.PutUint64(v[:], Value(id, layer, plane, tok, head, d))
			copy(row[d*es:(d+1)*es], v[:es])
		}
	}
}

// checkRow returns the first dim of row that does not hold what fillRow
// writes there, or -1.
func checkRow(row []byte, es int, id uint64, layer, plane, tok, head int) int {
	switch es {
	case 1:
		for d := range row {
			if row[d] != byte(Value(id, layer, plane, tok, head, d)) {
				return d
			}
		}
	case 2:
		for d := range len(row) / 2 {
			if binary.LittleEndian.Uint16(row[2*d:]) != uint16(Value(id, layer, plane, tok, head, d)) {
				return d
			}
		}
	case 4:
		for d := range len(row) / 4 {
			if binary.LittleEndian.Uint32(row[4*d:]) != uint32(Value(id, layer, plane, tok, head, d)) {
				return d
			}
		}
	default:
		var v [8]byte
		for d := range len(row) / es {
			binary.LittleEndian.PutUint64(v[:], Value(id, layer, plane, tok, head, d))
			if string(row[d*es:(d+1)*es]) != string(v[:es]) {
				return d
			}
		}
	}
	return -1
}

// want is the bytes fillRow writes for one element.
func want(es int, id uint64, layer, plane, tok, head, dim int) []byte {
	var v [8]byte
	binary.LittleEndian.PutUint64(v[:], Value(id, layer, plane, tok, head, dim))
	return v[:es]
}

// Fill writes logical block id into slot: regions[r] is rank r's region.
func Fill(l *layout.Layout, regions [][]byte, slot int, id uint64) {
	es := int(l.Model.DType.Size())
	rows(l, regions, slot, func(rank, layer, plane, tok, head int, row []byte) bool {
		fillRow(row, es, id, layer, plane, tok, head)
		return true
	})
}

// Check verifies that slot holds logical block id, and says where not.
func Check(l *layout.Layout, regions [][]byte, slot int, id uint64) error {
	es := int(l.Model.DType.Size())
	var err error
	rows(l, regions, slot, func(rank, layer, plane, tok, head int, row []byte) bool {
		if d := checkRow(row, es, id, layer, plane, tok, head); d >= 0 {
			err = fmt.Errorf("slot %d rank %d layer %d plane %d token %d head %d dim %d: got %x, want %x (block %d)",
				slot, rank, layer, plane, tok, head, d, row[d*es:(d+1)*es], want(es, id, layer, plane, tok, head, d), id)
			return false
		}
		return true
	})
	return err
}

// FillTokens writes into slot the tokens first..first+PageSize-1 of
// logical sequence seq: an element's content depends on its token's place
// in the sequence, not in the block, so that blocks of one page size can
// be checked against blocks of another made from the same tokens.
func FillTokens(l *layout.Layout, regions [][]byte, slot int, seq uint64, first int) {
	es := int(l.Model.DType.Size())
	rows(l, regions, slot, func(rank, layer, plane, tok, head int, row []byte) bool {
		fillRow(row, es, seq, layer, plane, first+tok, head)
		return true
	})
}

// CheckTokens verifies that slot holds the tokens first..first+PageSize-1
// of logical sequence seq, as FillTokens writes them, and says where not.
func CheckTokens(l *layout.Layout, regions [][]byte, slot int, seq uint64, first int) error {
	es := int(l.Model.DType.Size())
	var err error
	rows(l, regions, slot, func(rank, layer, plane, tok, head int, row []byte) bool {
		if d := checkRow(row, es, seq, layer, plane, first+tok, head); d >= 0 {
			err = fmt.Errorf("slot %d rank %d layer %d plane %d token %d (of the sequence %d) head %d dim %d: got %x, want %x",
				slot, rank, layer, plane, tok, first+tok, head, d, row[d*es:(d+1)*es], want(es, seq, layer, plane, first+tok, head, d))
			return false
		}
		return true
	})
	return err
}
