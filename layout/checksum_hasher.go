package layout

import (
	"sync"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// xxh3's streaming Hasher copies every byte written to it through a
// buffer of one block and one stripe (1,088 bytes), except most of its
// first write, which it hashes in place: a copy per byte that, on a block
// just read from the network, costs several times the hash itself. A
// block's canonical order is contiguous in runs of many kilobytes (one
// rank's heads of a layer's plane), so sumHasher feeds each long run to
// the Hasher as a first write would be: it completes the buffered block
// with the run's head (a copy of at most a block), empties the buffer and
// lets the Hasher take the run's whole blocks in place. The value is the
// Hasher's, byte for byte.
//
// Emptying the buffer needs the Hasher's count of buffered bytes, which
// it does not export: hasherFields mirrors its fields. inPlaceOK checks,
// on the first sum, that the mirror has the Hasher's size and that runs
// fed this way hash as xxh3.Hash hashes them whole; where either fails
// (another version of xxh3), every run goes through Write as before.

const (
	xxStripe = 64
	xxBlock  = 1024
	xxBuf    = xxBlock + xxStripe // the Hasher's buffer
)

// hasherFields is xxh3.Hasher's memory layout (zeebo/xxh3 v1.1.0).
type hasherFields struct {
	acc  [8]uint64
	blk  uint64
	len  uint64 // bytes buffered in buf
	key  unsafe.Pointer
	buf  [xxBuf]byte
	seed uint64
}

// sumHasher is an xxh3.Hasher fed as the package comment says.
type sumHasher struct{ h xxh3.Hasher }

var inPlaceOK = sync.OnceValue(func() bool {
	return unsafe.Sizeof(xxh3.Hasher{}) == unsafe.Sizeof(hasherFields{}) && inPlaceAgrees()
})

// write adds p to the hash.
func (s *sumHasher) write(p []byte) {
	if inPlaceOK() {
		s.writeInPlace(p)
		return
	}
	s.h.Write(p)
}

// writeInPlace adds p, its whole blocks hashed in place where it is long
// enough to hold one past the buffer's top-up.
func (s *sumHasher) writeInPlace(p []byte) {
	f := (*hasherFields)(unsafe.Pointer(&s.h))
	for {
		if f.key == nil || f.len == 0 {
			// A first write (or an empty buffer, which only a first
			// write leaves): the Hasher takes p's blocks in place.
			s.h.Write(p)
			return
		}
		// n bytes of p fill the buffer; one more makes the Hasher
		// take the buffered block and keep its last stripe and that
		// byte, the 65 bytes of the stream before p[n+1:].
		n := xxBuf - int(f.len)
		if len(p) < n+1+xxBuf {
			s.h.Write(p) // too short to save a copy
			return
		}
		s.h.Write(p[:n+1])
		if n < xxStripe {
			// The kept stripe began in the buffer, not in p: go round
			// once more from a buffer of 65 bytes.
			p = p[n+1:]
			continue
		}
		// The buffered 65 bytes are p[n-64 : n+1]: forget them and
		// write them again from p, as a first write would take them.
		f.len = 0
		s.h.Write(p[n-xxStripe:])
		return
	}
}

func (s *sumHasher) sum64() uint64 { return s.h.Sum64() }

// inPlaceAgrees says whether runs fed by writeInPlace hash as the whole
// does with xxh3.Hash, for lengths around each of the Hasher's edges.
func inPlaceAgrees() bool {
	data := make([]byte, 6*xxBuf+7)
	for i := range data {
		data[i] = byte(i*131 + i>>7)
	}
	for _, first := range []int{0, 1, 63, 64, 65, 1000, 1023, 1024, 1025, 1087, 1088, 1089, 2200} {
		for _, second := range []int{1, 64, 1089, 1090, 2176, 2177, 2300, 3000} {
			for _, third := range []int{0, 1, 65, 1088, 1500} {
				end := first + second + third
				if end > len(data) {
					continue
				}
				var s sumHasher
				s.writeInPlace(data[:first])
				s.writeInPlace(data[first : first+second])
				s.writeInPlace(data[first+second : end])
				if s.sum64() != xxh3.Hash(data[:end]) {
					return false
				}
			}
		}
	}
	return true
}
