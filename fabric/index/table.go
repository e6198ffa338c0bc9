package index

import "math/bits"

// table is an open-addressing hash table from sequence hash to a 32-bit
// holder word (see holders.go), with linear probing in Robin Hood order. It
// exists because FindMatches is bound by memory latency and the index by
// memory: a slot holds the key and the word side by side in 12 bytes, so a
// lookup costs one cache miss where a Go map, with its control words,
// groups and directory, costs two or three, and a table of single-holder
// hashes costs about 16 bytes a hash.
//
// The table keeps its load between maxLoad and about maxLoad/growth: it
// grows by a quarter, not by doubling (a doubled table is half empty), and
// maps a key to its first slot with a multiply-shift range reduction, so any
// length works. Robin Hood order (an entry never sits further from its home
// than the entry it displaced) keeps probe runs short at that load, and lets
// a miss stop as soon as it passes where the key would be.
//
// Key 0 marks an empty slot; the hash 0 itself is kept aside in zero/hasZero.
// Deletion shifts later entries of the probe run back, so there are no
// tombstones.
type table struct {
	slots   []slot
	seed    uint64
	n       int // occupied slots, the zero key excluded
	zero    uint32
	hasZero bool
}

// slot is one entry: the key in two halves, so that the slot is 12 bytes
// with 4-byte alignment, and the holder word.
type slot struct {
	klo, khi uint32
	val      uint32
}

func (s *slot) key() uint64 { return uint64(s.klo) | uint64(s.khi)<<32 }

const (
	minTableSlots = 16
	// maxLoad is the most entries a table holds per slot before it grows;
	// minLoad the fewest before it shrinks.
	maxLoad = 0.9
	minLoad = 0.3
	// growth is the factor a full table grows by; small tables double.
	growth = 1.2
)

func newTable(seed uint64) table {
	return table{slots: make([]slot, minTableSlots), seed: seed | 1}
}

// mixed spreads a key over 64 bits, a bijection keyed by the table's seed.
// Peers choose the hashes, so the position is keyed by a per-index random
// seed, not by the hash alone.
func (t *table) mixed(key uint64) uint64 {
	m := (key ^ t.seed) * 0x9e3779b97f4a7c15
	m ^= m >> 32
	return m * 0xbf58476d1ce4e5b9
}

// at is the slot of a mixed key among n: ascending in m, so that entries
// sorted by m stay sorted at any length.
func at(m uint64, n int) int {
	hi, _ := bits.Mul64(m, uint64(n))
	return int(hi)
}

// home is the slot a key probes first.
func (t *table) home(key uint64) int { return at(t.mixed(key), len(t.slots)) }

// dist is how far slot i lies past slot h, wrapping.
func (t *table) dist(h, i int) int {
	if i >= h {
		return i - h
	}
	return i + len(t.slots) - h
}

func (t *table) len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

// find returns the slot of key (not zero), or -1.
func (t *table) find(key uint64) int {
	n := len(t.slots)
	i := t.home(key)
	for d := 0; ; d++ {
		s := &t.slots[i]
		if s.klo == uint32(key) && s.khi == uint32(key>>32) {
			return i
		}
		if s.klo|s.khi == 0 || t.dist(t.home(s.key()), i) < d {
			return -1
		}
		if i++; i == n {
			i = 0
		}
	}
}

func (t *table) get(key uint64) (uint32, bool) {
	if key == 0 {
		return t.zero, t.hasZero
	}
	if i := t.find(key); i >= 0 {
		return t.slots[i].val, true
	}
	return 0, false
}

func (t *table) set(key uint64, val uint32) {
	if key == 0 {
		t.zero, t.hasZero = val, true
		return
	}
	if i := t.find(key); i >= 0 {
		t.slots[i].val = val
		return
	}
	if float64(t.n+1) > maxLoad*float64(len(t.slots)) {
		t.resize(t.grownLen())
	}
	t.insert(slot{uint32(key), uint32(key >> 32), val})
	t.n++
}

// grownLen is the length a full table grows to.
func (t *table) grownLen() int {
	if len(t.slots) < 1024 {
		return 2 * len(t.slots)
	}
	return int(float64(len(t.slots)) * growth)
}

// insert places an entry that is not in the table, Robin Hood order: it
// takes the place of the first entry nearer its own home than it is, or as
// near but with a larger mixed key. Each probe run is thus sorted by mixed
// key, which resize relies on.
func (t *table) insert(e slot) {
	n := len(t.slots)
	em := t.mixed(e.key())
	i := at(em, n)
	for d := 0; ; d++ {
		s := &t.slots[i]
		if s.klo|s.khi == 0 {
			*s = e
			return
		}
		sm := t.mixed(s.key())
		if sd := t.dist(at(sm, n), i); sd < d || sd == d && sm > em {
			e, *s = *s, e
			d, em = sd, sm
		}
		if i++; i == n {
			i = 0
		}
	}
}

func (t *table) del(key uint64) {
	if key == 0 {
		t.zero, t.hasZero = 0, false
		return
	}
	i := t.find(key)
	if i < 0 {
		return
	}
	// Backward shift: move each later entry of the run back by one until
	// an empty slot or an entry already at its home.
	n := len(t.slots)
	for {
		j := i + 1
		if j == n {
			j = 0
		}
		s := t.slots[j]
		if s.klo|s.khi == 0 || t.home(s.key()) == j {
			break
		}
		t.slots[i] = s
		i = j
	}
	t.slots[i] = slot{}
	t.n--
	if len(t.slots) > minTableSlots && float64(t.n) < minLoad*float64(len(t.slots)) {
		t.resize(max(minTableSlots, int(float64(t.n)/((maxLoad+minLoad)/2))))
	}
}

func (t *table) resize(n int) {
	old := t.slots
	t.slots = make([]slot, n)
	// Walked once round from an empty slot, the entries come in ascending
	// order of mixed key with one wrap (where the keys past the largest
	// start again from the smallest). Taken in ascending order (the part
	// after the wrap first), and since at keeps that order at any length,
	// each entry lands at its new home or just past the one placed before
	// it, with no probing. The few that run past the end are inserted
	// last, wrapping to the front as an insert does.
	e0 := 0
	for old[e0].klo|old[e0].khi != 0 { // there is an empty slot: load < 1
		e0++
	}
	var m0 uint64
	for k := 1; k <= len(old); k++ {
		if s := &old[(e0+k)%len(old)]; s.klo|s.khi != 0 {
			m0 = t.mixed(s.key())
			break
		}
	}
	next := 0
	var over []slot
	for _, low := range [2]bool{true, false} {
		for k := 1; k <= len(old); k++ {
			s := old[(e0+k)%len(old)]
			if s.klo|s.khi == 0 {
				continue
			}
			m := t.mixed(s.key())
			if (m < m0) != low {
				continue
			}
			if p := max(at(m, n), next); p < n {
				t.slots[p] = s
				next = p + 1
			} else {
				over = append(over, s)
			}
		}
	}
	for _, s := range over {
		t.insert(s)
	}
}

// bytes is the memory the table's slots take.
func (t *table) bytes() int { return 12 * len(t.slots) }

// each calls f for every key; f must not modify the table.
func (t *table) each(f func(key uint64, val uint32)) {
	if t.hasZero {
		f(0, t.zero)
	}
	for i := range t.slots {
		if s := &t.slots[i]; s.klo|s.khi != 0 {
			f(s.key(), s.val)
		}
	}
}
