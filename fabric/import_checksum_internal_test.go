package fabric

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// A block's sums are the same whether a lane read took them as it landed
// the block (earlySums) or verify took them after the read, alone or
// beside another read, with engine blocks of one holder page and of two:
// each equals layout.BlockSum of the block. A byte changed after the
// holder's sums were taken is refused by every path, and only its block.
func TestChecksumSamePerBlockEarlyOrAfter(t *testing.T) {
	prev := runtime.GOMAXPROCS(4) // the chunk verified alone spreads over goroutines
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	for _, k := range []int{1, 2} {
		t.Run(fmt.Sprintf("k=%d", k), func(t *testing.T) {
			const n = 6
			c := newSumChunk(t, layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 16, DType: layout.DTypeBF16}, k, n)
			set, dst, regions, blocks, leased, segs, a, es := c.set, c.dst, c.regions, c.blocks, c.leased, c.segs, c.a, c.es
			type result struct {
				mismatched []uint64
				checked    int
				sums       []uint64
				ok         []bool
			}
			run := func(early, alone bool) result {
				t.Helper()
				ch := &arrivedChunk{a: a, s: es, blocks: blocks, leased: leased, k: k, alone: alone}
				before := a.stats.checksumEarly.Load()
				if early {
					ch.early = a.newEarlySums(set, blocks, leased, k, segs)
					if ch.early == nil {
						t.Fatal("no early sums for a chunk in host memory")
					}
					ch.early.landed(segs)
					if ch.early.broken() {
						t.Fatal("early sums could not place the plan's bytes")
					}
				}
				var r result
				r.mismatched, r.checked, r.sums, r.ok = ch.verify()
				if used := a.stats.checksumEarly.Load() - before; early && used != uint64(r.checked) || !early && used != 0 {
					t.Fatalf("early=%v: %d of %d pages checked with early sums", early, used, r.checked)
				}
				return r
			}
			type path struct {
				name         string
				early, alone bool
			}
			paths := []path{{"as landed", true, false}, {"after, alone", false, true}, {"after, beside a read", false, false}}

			for _, pt := range paths {
				r := run(pt.early, pt.alone)
				if len(r.mismatched) != 0 || r.checked != n*k {
					t.Fatalf("%s: %d pages checked, %v mismatched; want %d, none", pt.name, r.checked, r.mismatched, n*k)
				}
				for b, blk := range blocks {
					want, err := layout.BlockSum(dst, regions, blk.Slot, 0, dst.PageSize)
					if err != nil {
						t.Fatal(err)
					}
					if !r.ok[b] || r.sums[b] != want {
						t.Fatalf("%s: block %d sum %016x (ok %v), want %016x", pt.name, b, r.sums[b], r.ok[b], want)
					}
				}
			}

			// One byte of block 2's first chunk changes.
			const bad = 2
			regions[0][dst.ChunkOffset(blocks[bad].Slot, 0, 0)] ^= 0x40
			var first []uint64
			for _, pt := range paths {
				r := run(pt.early, pt.alone)
				if len(r.mismatched) == 0 {
					t.Fatalf("%s: a changed byte was not refused", pt.name)
				}
				for _, h := range r.mismatched {
					if i := int(h - 1000); i/k != bad {
						t.Fatalf("%s: page %d of block %d refused, only block %d changed", pt.name, i%k, i/k, bad)
					}
				}
				for b := range blocks {
					if r.ok[b] != (b != bad) {
						t.Fatalf("%s: block %d ok %v after block %d changed", pt.name, b, r.ok[b], bad)
					}
				}
				if first == nil {
					first = r.mismatched
				} else if !slices.Equal(first, r.mismatched) {
					t.Fatalf("%s refused %v, %s %v", pt.name, r.mismatched, paths[0].name, first)
				}
			}
		})
	}
}

// sumChunk is a chunk of n engine blocks, each leased as k holder pages
// with their sums, in a host block set filled with random bytes, and the
// plan that would read them.
type sumChunk struct {
	set     *pool.BlockSet
	dst     *layout.Layout
	regions [][]byte
	blocks  []pool.Block
	leased  []transfer.LeasedBlock
	segs    []layout.Segment
	a       *Agent
	es      *sessionSet
}

func newSumChunk(tb testing.TB, model layout.ModelConfig, k, n int) *sumChunk {
	tb.Helper()
	block := uint64(model.Layers) * 2 * uint64(model.KVHeads*model.HeadDim*16) * model.DType.Size()
	_, p := hostPool(tb, 8<<20+uint64(n+10)*(block+64<<10), "checksum-test", pool.Config{ExpiryInterval: -1})
	set, err := p.NewBlockSet(&layout.Layout{Model: model, PageSize: 16, TPSize: 2, Order: layout.HND,
		Arrangement: layout.FullyContiguous, Alignment: 256, Slots: n + 10})
	if err != nil {
		tb.Fatal(err)
	}
	c := &sumChunk{set: set, dst: set.Layout(), a: &Agent{log: slog.New(slog.NewTextHandler(io.Discard, nil))},
		es: &sessionSet{engineSet: &engineSet{set: set}}}
	if c.regions, err = set.RegionBytes(); err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(k), 7))
	for _, r := range c.regions {
		for i := range r {
			r[i] = byte(rng.Uint32())
		}
	}
	if c.blocks, err = set.Allocate(n); err != nil {
		tb.Fatal(err)
	}
	// The holder's pages: page j of block b is tokens [j*page,
	// (j+1)*page) of it, at a page size of 16/k and another element
	// order.
	page := c.dst.PageSize / k
	c.leased = make([]transfer.LeasedBlock, n*k)
	src := c.dst.Clone()
	src.PageSize, src.Order, src.Slots = page, layout.NHD, n*k
	pairs := make([]layout.SlotPair, n*k)
	for i := range c.leased {
		sum, err := layout.BlockSum(c.dst, c.regions, c.blocks[i/k].Slot, (i%k)*page, page)
		if err != nil {
			tb.Fatal(err)
		}
		c.leased[i] = transfer.LeasedBlock{Hash: uint64(1000 + i), Present: true, Slot: uint64(i), Sum: sum, HasSum: true}
		pairs[i] = layout.SlotPair{Src: i, Dst: c.blocks[i/k].Slot}
	}
	plan, err := layout.NewPlan(src, c.dst, pairs)
	if err != nil {
		tb.Fatal(err)
	}
	for _, r := range plan.Ranks {
		c.segs = append(c.segs, r...)
	}
	return c
}

// BenchmarkVerifyLastChunk measures verify of a chunk of 32 engine blocks
// of 256 KiB, two holder pages each (their pages' sums and their
// whole-block sums), taken after the read: as the last chunk is (alone, spread over
// up to maxVerifyWorkers goroutines) and, the baseline in the same run,
// as any other chunk is (on one goroutine). It reports alone/one, the
// ratio.
func BenchmarkVerifyLastChunk(b *testing.B) {
	c := newSumChunk(b, layout.ModelConfig{Layers: 8, KVHeads: 8, HeadDim: 64, DType: layout.DTypeBF16}, 2, 32)
	took := map[bool]time.Duration{}
	for b.Loop() {
		for _, alone := range []bool{false, true} {
			ch := &arrivedChunk{a: c.a, s: c.es, blocks: c.blocks, leased: c.leased, k: 2, alone: alone}
			start := time.Now()
			if mismatched, _, _, _ := ch.verify(); len(mismatched) != 0 {
				b.Fatalf("%d pages mismatched", len(mismatched))
			}
			took[alone] += time.Since(start)
		}
	}
	b.ReportMetric(float64(took[false].Nanoseconds())/float64(b.N), "one-ns/op")
	b.ReportMetric(float64(took[true].Nanoseconds())/float64(b.N), "alone-ns/op")
	b.ReportMetric(float64(took[true])/float64(took[false]), "alone/one")
}

// pinnedSlots finds each named hash's slot (a hash in two slots, the
// last) whichever of the names and the slots is the fewer, and builds its
// map over the fewer.
func TestPinnedSlots(t *testing.T) {
	slots := []pool.LeasedSlot{{Slot: 0, Hash: 10}, {Slot: 1, Hash: 11}, {Slot: 2, Hash: 12}, {Slot: 3, Hash: 11}, {Slot: 4, Hash: 0}}
	want := map[uint64]int{10: 0, 11: 3, 12: 2, 0: 4}
	for _, hashes := range [][]uint64{
		nil,
		{11},
		{99},
		{0, 99},
		{12, 10, 12},
		{10, 11, 12, 0, 99, 98, 97},
	} {
		got := pinnedSlots(hashes, slots)
		if len(got) > min(len(hashes), len(slots)) {
			t.Errorf("names %v: a map of %d, more than the fewer of names and slots", hashes, len(got))
		}
		for _, x := range hashes {
			slot, ok := got[x]
			wantSlot, wantOK := want[x]
			if ok != wantOK || slot != wantSlot {
				t.Errorf("names %v: hash %d at slot %d (pinned %v), want %d (%v)", hashes, x, slot, ok, wantSlot, wantOK)
			}
		}
	}
}
