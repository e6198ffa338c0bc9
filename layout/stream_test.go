package layout

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// copyStream equals copy for every length and alignment of either side.
func TestCopyStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	for n := 0; n <= 700; n += 1 + n/50 {
		for so := range 20 {
			for do := range 20 {
				dst := bytes.Repeat([]byte{0xEE}, n+64)
				copyStream(dst[do:do+n], src[so:so+n])
				sfence()
				if !bytes.Equal(dst[do:do+n], src[so:so+n]) {
					t.Fatalf("n=%d src+%d dst+%d: bytes differ", n, so, do)
				}
				for i, b := range dst {
					if (i < do || i >= do+n) && b != 0xEE {
						t.Fatalf("n=%d src+%d dst+%d: byte %d outside the copy written", n, so, do, i)
					}
				}
			}
		}
	}
}

// A plan large enough to stream writes exactly what plain copies write:
// one whose pieces stream (HND), and one whose pieces are too small to
// (NHD rows), which must still be right.
func TestExecuteStreamingMatchesPlain(t *testing.T) {
	for _, tc := range tpCases {
		src, dst := llama70B(tc.srcTP, tc.srcOrd, 4), llama70B(tc.dstTP, tc.dstOrder, 4)
		p, err := NewPlan(src, dst, seqPairs(0, 0, 4))
		if err != nil {
			t.Fatal(err)
		}
		if p.Bytes() < streamMin {
			t.Fatalf("%s: plan of %d bytes does not reach the streaming size %d", tc.name, p.Bytes(), streamMin)
		}
		streams := false
		for _, segs := range p.Ranks {
			for _, s := range segs {
				streams = streams || s.Length >= streamPiece
			}
		}
		if want := tc.srcOrd == HND; streams != want {
			t.Fatalf("%s: pieces large enough to stream: %v, want %v", tc.name, streams, want)
		}
		sMem := regions(src, 0)
		rng := rand.New(rand.NewPCG(3, 4))
		for _, r := range sMem {
			for i := 0; i < len(r); i += 8 {
				r[i] = byte(rng.Uint32())
			}
		}
		streamed, plain := regions(dst, 0xAB), regions(dst, 0xAB)
		if err := Execute(p, sMem, streamed); err != nil {
			t.Fatal(err)
		}
		for r, segs := range p.Ranks {
			copyRank(segs, sMem, plain[r], false)
		}
		for r := range streamed {
			if !bytes.Equal(streamed[r], plain[r]) {
				t.Fatalf("%s: rank %d differs between streamed and plain copies", tc.name, r)
			}
		}
	}
}
