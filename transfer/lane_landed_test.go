package transfer

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// A lane read tells Landed of every byte of the plan exactly once, each
// part only once its bytes are in dst; a read that does not go over the
// lane tells it of nothing.
func TestLaneLanded(t *testing.T) {
	const size = 8 << 20
	for _, plain := range []bool{false, true} {
		name := "tls"
		if plain {
			name = "plain"
		}
		t.Run(name, func(t *testing.T) {
			_, _, p, src := laneSetup(t, size, plain)
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			rng := rand.New(rand.NewPCG(seed, 0))
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			segs, sizes := stridedPlan(rng, size)
			dst := [][]byte{make([]byte, sizes[0]+4096), make([]byte, sizes[1]+4096)}
			want := [][]byte{make([]byte, len(dst[0])), make([]byte, len(dst[1]))}
			execLocal(segs, src, want)
			var (
				mu     sync.Mutex
				told   = [][]int{make([]int, len(dst[0])), make([]int, len(dst[1]))}
				early  []string
				called int
			)
			landed := func(part []layout.Segment) {
				mu.Lock()
				defer mu.Unlock()
				called++
				for _, sg := range part {
					for i := uint64(0); i < sg.Count; i++ {
						_, off := sg.Piece(i)
						d, w := dst[sg.DstRank][off:off+sg.Length], want[sg.DstRank][off:off+sg.Length]
						if j := firstDiff(d, w); j >= 0 && len(early) < 3 {
							early = append(early, "piece not in dst when told")
						}
						for k := off; k < off+sg.Length; k++ {
							told[sg.DstRank][k]++
						}
					}
				}
			}
			via, err := p.ReadViaLanded(ctx, 5, 9, segs, dst, landed)
			if err != nil || via != TransportTCP {
				t.Fatalf("read over %s: %v", via, err)
			}
			if len(early) > 0 {
				t.Fatalf("landed was told of bytes before they arrived: %v", early)
			}
			if called < 2 {
				t.Errorf("landed called %d times for a read of %d segments: want one call per part, at least 2", called, len(segs))
			}
			// Every byte of the plan once, nothing else.
			inPlan := [][]int{make([]int, len(dst[0])), make([]int, len(dst[1]))}
			for _, sg := range segs {
				for i := uint64(0); i < sg.Count; i++ {
					_, off := sg.Piece(i)
					for k := off; k < off+sg.Length; k++ {
						inPlan[sg.DstRank][k]++
					}
				}
			}
			for r := range told {
				for k := range told[r] {
					if told[r][k] != inPlan[r][k] {
						t.Fatalf("rank %d byte %d: landed told of it %d times, the plan writes it %d times", r, k, told[r][k], inPlan[r][k])
					}
				}
				if i := firstDiff(dst[r], want[r]); i >= 0 {
					t.Fatalf("rank %d differs first at byte %d", r, i)
				}
			}

			// Over QUIC (lane reads off), landed is not called.
			p.n.SetLaneReads(false)
			defer p.n.SetLaneReads(true)
			called = 0
			via, err = p.ReadViaLanded(ctx, 5, 9, segs, dst, landed)
			if err != nil || via != TransportQUIC {
				t.Fatalf("read over %s: %v", via, err)
			}
			if called != 0 {
				t.Errorf("landed called %d times for a read over QUIC", called)
			}
		})
	}
}
