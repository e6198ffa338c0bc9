package fabric

import (
	"fmt"
	"slices"
	"testing"
)

func TestEvenChunks(t *testing.T) {
	for _, tc := range []struct{ n, per, want int }{
		{n: 1, per: 12, want: 12},
		{n: 12, per: 12, want: 12},  // at the bound: one chunk
		{n: 13, per: 12, want: 7},   // one past: 7 and 6, not 12 and 1
		{n: 25, per: 12, want: 9},   // 9, then 16 left: 8, 8
		{n: 133, per: 12, want: 12}, // 12 chunks: 12 then 11 of 11, not 11 of 12 and 1
		{n: 100, per: 12, want: 12}, // 9 chunks: 12 then 88 left, 11 each
		{n: 24, per: 12, want: 12},  // whole chunks stay as they are
		{n: 200, per: 32, want: 29}, // 7 chunks
		{n: 5, per: 1, want: 1},
		{n: 5, per: 0, want: 0}, // nothing to even out
	} {
		t.Run(fmt.Sprintf("%d/%d", tc.n, tc.per), func(t *testing.T) {
			if got := evenChunks(tc.n, tc.per); got != tc.want {
				t.Errorf("evenChunks(%d, %d) = %d, want %d", tc.n, tc.per, got, tc.want)
			}
		})
	}
	// Every cut, each chunk sized from what is left as fetch does: no
	// chunk over per, no more chunks than per needs, none empty, and no
	// two differing by more than one block.
	for per := 1; per <= 40; per++ {
		for n := 1; n <= 300; n++ {
			var sizes []int
			for off := 0; off < n; {
				size := min(evenChunks(n-off, per), n-off)
				if size < 1 || size > per {
					t.Fatalf("%d blocks at most %d a chunk: a chunk of %d at %d", n, per, size, off)
				}
				sizes = append(sizes, size)
				off += size
			}
			if len(sizes) != (n+per-1)/per || slices.Max(sizes)-slices.Min(sizes) > 1 {
				t.Fatalf("%d blocks at most %d a chunk: chunks %v", n, per, sizes)
			}
		}
	}
}
