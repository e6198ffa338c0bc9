package fabric

import (
	"fmt"
	"testing"
)

func TestEvenChunks(t *testing.T) {
	for _, tc := range []struct{ n, per, want int }{
		{n: 1, per: 12, want: 12},
		{n: 12, per: 12, want: 12},  // at the bound: one chunk
		{n: 13, per: 12, want: 7},   // one past: 7 and 6, not 12 and 1
		{n: 25, per: 12, want: 9},   // 9, 9, 7, not 12, 12, 1
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
	// Every cut: no chunk over per, no more chunks than per needs, and the
	// last short of the others by fewer blocks than there are chunks.
	for per := 1; per <= 40; per++ {
		for n := 1; n <= 300; n++ {
			size := min(evenChunks(n, per), n) // fetch's first chunk
			chunks := (n + size - 1) / size
			last := n - (chunks-1)*size
			if size > per || chunks != (n+per-1)/per || last < 1 || size-last >= chunks {
				t.Fatalf("%d blocks at most %d a chunk: %d chunks of %d, the last %d", n, per, chunks, size, last)
			}
		}
	}
}
