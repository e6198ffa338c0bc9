package index

// table is an open-addressing hash table from sequence hash to the holder
// bits of node ids 0..63, with linear probing. It exists because FindMatches
// is bound by memory latency: a slot holds the key and the bits side by side
// (16 bytes), so a lookup costs one cache miss where a Go map, with its
// control words, groups and directory, costs two or three.
//
// Key 0 marks an empty slot; the hash 0 itself is kept aside in zero/hasZero.
// Deletion shifts later entries of the probe run back, so there are no
// tombstones and lookups stay short.
type table struct {
	slots   []slot
	shift   uint // 64 - log2(len(slots))
	seed    uint64
	n       int // occupied slots, the zero key excluded
	zero    uint64
	hasZero bool
}

type slot struct {
	key uint64
	lo  uint64
}

const minTableSlots = 16

func newTable(seed uint64) table {
	return table{slots: make([]slot, minTableSlots), shift: 64 - 4, seed: seed | 1}
}

// home is the slot a key probes first. Peers choose the hashes, so the
// position is keyed by a per-index random seed, not by the hash alone.
func (t *table) home(key uint64) uint64 {
	return ((key ^ t.seed) * 0x9e3779b97f4a7c15) >> t.shift
}

func (t *table) len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

func (t *table) get(key uint64) (uint64, bool) {
	if key == 0 {
		return t.zero, t.hasZero
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == key {
			return s.lo, true
		}
		if s.key == 0 {
			return 0, false
		}
	}
}

func (t *table) set(key, lo uint64) {
	if key == 0 {
		t.zero, t.hasZero = lo, true
		return
	}
	if 2*(t.n+1) > len(t.slots) { // keep the load at most one half
		t.grow()
	}
	mask := uint64(len(t.slots) - 1)
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == key {
			s.lo = lo
			return
		}
		if s.key == 0 {
			*s = slot{key, lo}
			t.n++
			return
		}
	}
}

func (t *table) del(key uint64) {
	if key == 0 {
		t.zero, t.hasZero = 0, false
		return
	}
	mask := uint64(len(t.slots) - 1)
	i := t.home(key)
	for ; ; i = (i + 1) & mask {
		if t.slots[i].key == key {
			break
		}
		if t.slots[i].key == 0 {
			return
		}
	}
	// Backward-shift: move each later entry of the run into the hole if
	// the hole lies between its home and its slot.
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := t.slots[j]
		if s.key == 0 {
			break
		}
		h := t.home(s.key)
		if (j-h)&mask >= (j-i)&mask {
			t.slots[i] = s
			i = j
		}
	}
	t.slots[i] = slot{}
	t.n--
	if len(t.slots) > minTableSlots && 8*t.n < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
}

func (t *table) grow() { t.resize(2 * len(t.slots)) }

func (t *table) resize(n int) {
	old := t.slots
	t.slots = make([]slot, n)
	t.shift = uint(64 - log2(n))
	t.n = 0
	mask := uint64(n - 1)
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		for i := t.home(s.key); ; i = (i + 1) & mask {
			if t.slots[i].key == 0 {
				t.slots[i] = s
				t.n++
				break
			}
		}
	}
}

func log2(n int) int {
	k := 0
	for 1<<k < n {
		k++
	}
	return k
}

// each calls f for every key; f must not modify the table.
func (t *table) each(f func(key, lo uint64)) {
	if t.hasZero {
		f(0, t.zero)
	}
	for _, s := range t.slots {
		if s.key != 0 {
			f(s.key, s.lo)
		}
	}
}
