package index

import (
	"errors"
	"math/bits"
	"slices"
)

// A hash's holders are one 32-bit word in its table slot, in one of three
// forms chosen by the set itself, so that the common sets cost nothing
// beyond the slot:
//
//   - bits: bit 31 and 30 clear, bits 0..29 a bitset of slots 0..29 (small
//     clusters, any number of holders);
//   - pair: bit 30 set, two slots of 12 bits (a <= b; a == b is one holder),
//     the common case in a large cluster, where most blocks have one or two
//     holders;
//   - spill: bit 31 set, a size class in bits 27..30 and an entry number in
//     bits 0..26 of the shard's spill arena, which keeps the holders as a
//     sorted list of slots (a count and up to 4<<class-1 slots of 2 bytes).
//
// A word is 0 only for no holders, and a hash with no holders is not in
// the table. The form is a function of the set (encode), so equal sets
// have equal words unless both spill.
const (
	bitsMax    = 30 // slots below this fit the bits form
	pairFlag   = 1 << 30
	spillFlag  = 1 << 31
	classShift = 27
	entryMask  = 1<<classShift - 1
	numClasses = 12 // class 11 holds 8191 slots, more than MaxNodes
	slotBits   = 12 // MaxNodes = 1 << slotBits
)

// A pair holds slots of slotBits bits: MaxNodes must not outgrow them
// (this constant fails to compile if it does), nor the count of a spilled
// list its uint16.
const _ = uint(1<<slotBits - MaxNodes)

// ErrFull is returned by [Index.Store] when a shard's spill arena has no
// entry numbers left (2^27 hashes of three or more holders in one size
// class of one shard).
var ErrFull = errors.New("index: shard full")

// arena holds the spilled holder lists of one shard. Entry e of class c is
// data[c][e<<(c+2) : (e+1)<<(c+2)]: a count, then the sorted slots. Freed
// entries are reused by the next allocation of their class.
type arena struct {
	data [numClasses][]uint16
	free [numClasses][]uint32
}

func classCap(c int) int { return 4<<c - 1 }

// classFor is the smallest class that holds n slots.
func classFor(n int) int {
	c := 0
	for classCap(c) < n {
		c++
	}
	return c
}

// list returns the slots of a spill word; valid until the arena changes.
func (a *arena) list(v uint32) []uint16 {
	c := int(v>>classShift) & 15
	e := int(v & entryMask)
	ent := a.data[c][e<<(c+2) : (e+1)<<(c+2)]
	return ent[1 : 1+int(ent[0])]
}

// alloc stores ids (sorted) in a new entry and returns its word.
func (a *arena) alloc(ids []uint16) (uint32, error) {
	c := classFor(len(ids))
	var e int
	if f := a.free[c]; len(f) > 0 {
		e = int(f[len(f)-1])
		a.free[c] = f[:len(f)-1]
	} else {
		e = len(a.data[c]) >> (c + 2)
		if e > entryMask {
			return 0, ErrFull
		}
		a.data[c] = append(a.data[c], make([]uint16, 4<<c)...)
	}
	ent := a.data[c][e<<(c+2) : (e+1)<<(c+2)]
	ent[0] = uint16(len(ids))
	copy(ent[1:], ids)
	return spillFlag | uint32(c)<<classShift | uint32(e), nil
}

func (a *arena) release(v uint32) {
	c := int(v>>classShift) & 15
	a.free[c] = append(a.free[c], v&entryMask)
}

// bytes is the memory the arena's entries take, free ones included.
func (a *arena) bytes() int {
	n := 0
	for c := range a.data {
		n += 2*cap(a.data[c]) + 4*cap(a.free[c])
	}
	return n
}

// eachHolder calls f for every slot of word v, in ascending order.
func (a *arena) eachHolder(v uint32, f func(slot int)) {
	switch {
	case v&spillFlag != 0:
		for _, s := range a.list(v) {
			f(int(s))
		}
	case v&pairFlag != 0:
		x, y := int(v&(1<<slotBits-1)), int(v>>slotBits&(1<<slotBits-1))
		f(x)
		if y != x {
			f(y)
		}
	default:
		for x := v; x != 0; x &= x - 1 {
			f(bits.TrailingZeros32(x))
		}
	}
}

// has reports whether slot holds in word v.
func (a *arena) has(v uint32, slot int) bool {
	switch {
	case v&spillFlag != 0:
		_, ok := slices.BinarySearch(a.list(v), uint16(slot))
		return ok
	case v&pairFlag != 0:
		return int(v&(1<<slotBits-1)) == slot || int(v>>slotBits&(1<<slotBits-1)) == slot
	default:
		return slot < bitsMax && v&(1<<slot) != 0
	}
}

// encode returns the word of the sorted set ids, spilling if it must.
func (a *arena) encode(ids []uint16) (uint32, error) {
	switch {
	case len(ids) == 0:
		return 0, nil
	case int(ids[len(ids)-1]) < bitsMax:
		var v uint32
		for _, s := range ids {
			v |= 1 << s
		}
		return v, nil
	case len(ids) <= 2:
		return pairFlag | uint32(ids[0]) | uint32(ids[len(ids)-1])<<slotBits, nil
	}
	return a.alloc(ids)
}

// add returns word v with slot added; added is false if it held already.
func (a *arena) add(v uint32, slot int) (nv uint32, added bool, err error) {
	if a.has(v, slot) {
		return v, false, nil
	}
	if v&(spillFlag|pairFlag) == 0 && slot < bitsMax {
		return v | 1<<slot, true, nil
	}
	if v&spillFlag != 0 {
		c := int(v>>classShift) & 15
		e := int(v & entryMask)
		ent := a.data[c][e<<(c+2) : (e+1)<<(c+2)]
		n := int(ent[0])
		if n < classCap(c) {
			i, _ := slices.BinarySearch(ent[1:1+n], uint16(slot))
			copy(ent[2+i:2+n], ent[1+i:1+n])
			ent[1+i] = uint16(slot)
			ent[0]++
			return v, true, nil
		}
	}
	var buf [8]uint16
	ids := a.appendHolders(buf[:0], v)
	i, _ := slices.BinarySearch(ids, uint16(slot))
	ids = slices.Insert(ids, i, uint16(slot))
	nv, err = a.encode(ids)
	if err != nil {
		return v, false, err
	}
	if v&spillFlag != 0 {
		a.release(v)
	}
	return nv, true, nil
}

// remove returns word v without slot; removed is false if it did not hold.
func (a *arena) remove(v uint32, slot int) (nv uint32, removed bool) {
	if !a.has(v, slot) {
		return v, false
	}
	if v&(spillFlag|pairFlag) == 0 {
		return v &^ (1 << slot), true
	}
	var buf [8]uint16
	ids := a.appendHolders(buf[:0], v)
	i, _ := slices.BinarySearch(ids, uint16(slot))
	ids = slices.Delete(ids, i, i+1)
	if v&spillFlag != 0 {
		c := int(v>>classShift) & 15
		// Stay in place unless the set fits inline or a class a quarter
		// the size, so that a set on the edge does not move every time.
		if len(ids) > 2 && int(ids[len(ids)-1]) >= bitsMax && (c == 0 || len(ids) > classCap(c-1)/2) {
			e := int(v & entryMask)
			ent := a.data[c][e<<(c+2) : (e+1)<<(c+2)]
			ent[0] = uint16(len(ids))
			copy(ent[1:], ids)
			return v, true
		}
	}
	// The smaller set goes to another class (or inline), so the old
	// entry is released only once the new one holds it.
	nv, err := a.encode(ids)
	if err != nil {
		return v, false // no entry free: the slot stays a holder
	}
	if v&spillFlag != 0 {
		a.release(v)
	}
	return nv, true
}

// appendHolders appends the slots of word v to dst, ascending.
func (a *arena) appendHolders(dst []uint16, v uint32) []uint16 {
	if v&spillFlag != 0 {
		return append(dst, a.list(v)...)
	}
	a.eachHolder(v, func(s int) { dst = append(dst, uint16(s)) })
	return dst
}

// maxHolder returns the largest slot of word v (v not 0).
func (a *arena) maxHolder(v uint32) int {
	switch {
	case v&spillFlag != 0:
		l := a.list(v)
		return int(l[len(l)-1])
	case v&pairFlag != 0:
		return int(v >> slotBits & (1<<slotBits - 1))
	default:
		return 31 - bits.LeadingZeros32(v)
	}
}

// intersect sets next to the slots of word v that are in active; next is
// as long as active.
func (a *arena) intersect(v uint32, active, next []uint64) {
	clear(next)
	if v&(spillFlag|pairFlag) == 0 {
		next[0] = active[0] & uint64(v)
		return
	}
	if v&spillFlag == 0 { // a pair; bit 30 of a spill word is its class's
		for _, s := range [2]int{int(v & (1<<slotBits - 1)), int(v >> slotBits & (1<<slotBits - 1))} {
			if w := s / 64; w < len(active) {
				next[w] |= active[w] & (1 << (s % 64))
			}
		}
		return
	}
	for _, s := range a.list(v) {
		if w := int(s) / 64; w < len(active) {
			next[w] |= active[w] & (1 << (s % 64))
		}
	}
}
