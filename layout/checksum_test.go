package layout_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
)

func sumLayout(m layout.ModelConfig, page, tp int, order layout.KVOrder, arr layout.Arrangement, align uint64) (*layout.Layout, [][]byte) {
	l := &layout.Layout{Model: m, PageSize: page, TPSize: tp, Order: order, Arrangement: arr, Alignment: align, Slots: 3}
	l.Regions = make([]layout.Region, tp)
	for r := range l.Regions {
		l.Regions[r] = layout.Region{Base: 1 << 30 * uint64(r+1), Kind: layout.Host}
	}
	size := l.Strides().Region
	ranks := make([][]byte, tp)
	for r := range l.Regions {
		l.Regions[r].Size = size
		ranks[r] = make([]byte, size)
		for i := range ranks[r] {
			ranks[r][i] = byte(r*31 + i) // padding differs from layout to layout
		}
	}
	if err := l.Validate(); err != nil {
		panic(err)
	}
	return l, ranks
}

// One block's sum is the same in every layout that holds it (TP size, KV
// order, arrangement, alignment, heads replicated), and changes with any
// element: it can be checked by a reader of another layout.
func TestBlockSumIsLayoutIndependent(t *testing.T) {
	models := map[string]layout.ModelConfig{
		"gqa": {Layers: 3, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16},
		"mla": {Layers: 2, KVHeads: 1, HeadDim: 16, DType: layout.DTypeBF16, MLA: true},
	}
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			var want uint64
			first := true
			for _, tp := range []int{1, 2, 4, 8} {
				for _, order := range []layout.KVOrder{layout.NHD, layout.HND} {
					for _, arr := range []layout.Arrangement{layout.FullyContiguous, layout.LayerSeparate} {
						for _, align := range []uint64{1, 256} {
							desc := fmt.Sprintf("tp %d order %v arrangement %v align %d", tp, order, arr, align)
							l, ranks := sumLayout(m, 4, tp, order, arr, align)
							kvtest.Fill(l, ranks, 1, 42)
							got, err := layout.BlockSum(l, ranks, 1, 0, 4)
							if err != nil {
								t.Fatalf("%s: %v", desc, err)
							}
							if first {
								want, first = got, false
							} else if got != want {
								t.Fatalf("%s: sum %x, another layout of the same block says %x", desc, got, want)
							}
							// Any element: the last of the last rank's shard.
							kvtest.Fill(l, ranks, 1, 43)
							other, _ := layout.BlockSum(l, ranks, 1, 0, 4)
							if other == want {
								t.Fatalf("%s: another block, the same sum", desc)
							}
						}
					}
				}
			}
		})
	}
}

// A block of 8 tokens made of two pages of 4 has, for tokens [4, 8), the
// sum of the second page.
func TestBlockSumOfPages(t *testing.T) {
	m := layout.ModelConfig{Layers: 2, KVHeads: 2, HeadDim: 8, DType: layout.DTypeF32}
	big, bigRanks := sumLayout(m, 8, 2, layout.NHD, layout.FullyContiguous, 64)
	small, smallRanks := sumLayout(m, 4, 1, layout.HND, layout.LayerSeparate, 1)
	kvtest.FillTokens(big, bigRanks, 0, 7, 0)
	kvtest.FillTokens(small, smallRanks, 2, 7, 4)
	want, err := layout.BlockSum(small, smallRanks, 2, 0, 4)
	if err != nil {
		t.Fatal(err)
	}
	got, err := layout.BlockSum(big, bigRanks, 0, 4, 4)
	if err != nil || got != want {
		t.Fatalf("tokens 4..7 of the big block: %x %v, the small page says %x", got, err, want)
	}
	if head, _ := layout.BlockSum(big, bigRanks, 0, 0, 4); head == want {
		t.Fatal("tokens 0..3 have the sum of tokens 4..7")
	}
	// A flipped byte of one element changes the page's sum.
	off := big.ChunkOffset(0, 1, 1) + 4*1*8*4 // layer 1, V, token 4 (one head per rank)
	bigRanks[1][off] ^= 1
	if got, _ := layout.BlockSum(big, bigRanks, 0, 4, 4); got == want {
		t.Fatal("a flipped byte left the sum as it was")
	}
}

// BlockSum refuses what is not in the layout: at the limits and one past.
func TestBlockSumBounds(t *testing.T) {
	m := layout.ModelConfig{Layers: 1, KVHeads: 2, HeadDim: 4, DType: layout.DTypeF16}
	l, ranks := sumLayout(m, 4, 2, layout.HND, layout.FullyContiguous, 1)
	if _, err := layout.BlockSum(l, ranks, 2, 3, 1); err != nil {
		t.Fatalf("last slot, last token: %v", err)
	}
	for _, c := range []struct {
		desc               string
		slot, first, count int
		ranks              [][]byte
	}{
		{"slot past the last", 3, 0, 4, ranks},
		{"negative slot", -1, 0, 4, ranks},
		{"tokens past the page", 0, 1, 4, ranks},
		{"no tokens", 0, 0, 0, ranks},
		{"a rank missing", 0, 0, 4, ranks[:1]},
		{"a short region", 0, 0, 4, [][]byte{ranks[0], ranks[1][:len(ranks[1])-1]}},
	} {
		if _, err := layout.BlockSum(l, c.ranks, c.slot, c.first, c.count); !errors.Is(err, layout.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", c.desc, err)
		}
	}
}

// BenchmarkBlockSum measures the checksum of 2 MiB blocks (Llama 3 8B's
// shape, TP 2) in both KV orders against copying the same bytes (the
// least a read of them costs), and reports the ratio. HND-TP1 is a block
// that is one contiguous run, hashed in place.
func BenchmarkBlockSum(b *testing.B) {
	m := layout.ModelConfig{Layers: 32, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	for _, c := range []struct {
		name  string
		order layout.KVOrder
		tp    int
	}{{"HND", layout.HND, 2}, {"NHD", layout.NHD, 2}, {"HND-TP1", layout.HND, 1}} {
		b.Run(c.name, func(b *testing.B) {
			l, ranks := sumLayout(m, 16, c.tp, c.order, layout.FullyContiguous, 4096)
			st := l.Strides()
			dst := make([]byte, st.Block)
			var sumT, copyT time.Duration
			b.SetBytes(int64(c.tp) * int64(st.Block))
			b.ReportAllocs()
			for b.Loop() {
				t0 := time.Now()
				if _, err := layout.BlockSum(l, ranks, 1, 0, 16); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				for r := range ranks {
					copy(dst, ranks[r][st.Block:2*st.Block])
				}
				copyT += time.Since(t1)
				sumT += t1.Sub(t0)
			}
			b.ReportMetric(float64(sumT)/float64(copyT), "x-memcpy")
			b.ReportMetric(float64(c.tp)*float64(st.Block)*float64(b.N)/sumT.Seconds()/1e9, "sum-GB/s")
		})
	}
}

// The sum's value is part of the wire: holders and readers of different
// versions compare it. These are the values of kvtest's contents for one
// block and one run of its tokens, taken in every path BlockSum has (one
// run hashed in place, runs through the streaming hasher, rows of NHD).
func TestBlockSumGolden(t *testing.T) {
	m := layout.ModelConfig{Layers: 3, KVHeads: 4, HeadDim: 64, DType: layout.DTypeBF16}
	const whole, tokens12 = uint64(0x68526d5421b7ff49), uint64(0x26fea374b2a060a2)
	for _, tp := range []int{1, 2, 4} {
		for _, order := range []layout.KVOrder{layout.HND, layout.NHD} {
			for _, arr := range []layout.Arrangement{layout.FullyContiguous, layout.LayerSeparate} {
				desc := fmt.Sprintf("tp %d order %v arrangement %v", tp, order, arr)
				l, ranks := sumLayout(m, 16, tp, order, arr, 1)
				kvtest.Fill(l, ranks, 1, 42)
				if got, err := layout.BlockSum(l, ranks, 1, 0, 16); err != nil || got != whole {
					t.Errorf("%s: whole block: %#x %v, want %#x", desc, got, err, whole)
				}
				if got, err := layout.BlockSum(l, ranks, 1, 1, 2); err != nil || got != tokens12 {
					t.Errorf("%s: tokens 1 and 2: %#x %v, want %#x", desc, got, err, tokens12)
				}
			}
		}
	}
}

// BlockSum reads each KV head from the first rank holding it; where a
// layout holds a head on several ranks (MLA at TP 2 and more, more ranks
// than heads), ReplicasMatch checks every other copy against that one:
// every byte of a replica's data changed is found, though the block's
// sum does not change, and a layout with no replicas is never refused.
func TestReplicasMatchFindsEveryByteOfAReplica(t *testing.T) {
	models := map[string]layout.ModelConfig{
		"gqa": {Layers: 2, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16},
		"mla": {Layers: 2, KVHeads: 1, HeadDim: 16, DType: layout.DTypeBF16, MLA: true},
	}
	for name, m := range models {
		for _, tp := range []int{1, 2, 4, 8} {
			for _, order := range []layout.KVOrder{layout.NHD, layout.HND} {
				for _, arr := range []layout.Arrangement{layout.FullyContiguous, layout.LayerSeparate} {
					desc := fmt.Sprintf("%s tp %d order %v arrangement %v", name, tp, order, arr)
					l, ranks := sumLayout(m, 4, tp, order, arr, 64)
					wantReplicas := tp > 1 && (m.MLA || tp > m.KVHeads)
					if l.Replicated() != wantReplicas {
						t.Fatalf("%s: Replicated %v", desc, l.Replicated())
					}
					// The bytes of slot 1 on each rank: those that another
					// content changes.
					kvtest.Fill(l, ranks, 1, 43)
					other := make([][]byte, tp)
					for r := range ranks {
						other[r] = append([]byte(nil), ranks[r]...)
					}
					kvtest.Fill(l, ranks, 1, 42)
					if err := layout.ReplicasMatch(l, ranks, 1, 0, 4); err != nil {
						t.Fatalf("%s: a block written alike on every rank: %v", desc, err)
					}
					sum, _ := layout.BlockSum(l, ranks, 1, 0, 4)
					found := 0
					for r := range ranks {
						for i := range ranks[r] {
							if ranks[r][i] == other[r][i] {
								continue
							}
							ranks[r][i] ^= 0x5a
							err := layout.ReplicasMatch(l, ranks, 1, 0, 4)
							now, _ := layout.BlockSum(l, ranks, 1, 0, 4)
							ranks[r][i] ^= 0x5a
							if now != sum {
								continue // a byte BlockSum reads: the sum catches it
							}
							found++
							if !errors.Is(err, layout.ErrReplicasDiffer) {
								t.Fatalf("%s: rank %d byte %d changed, unseen by the sum: %v, want ErrReplicasDiffer", desc, r, i, err)
							}
						}
					}
					if wantReplicas != (found > 0) {
						t.Fatalf("%s: %d bytes the sum does not read; replicas %v", desc, found, wantReplicas)
					}
				}
			}
		}
	}
}

// ReplicasMatch over some tokens checks those tokens only: a replica
// differing in a token outside them is not refused.
func TestReplicasMatchOfPages(t *testing.T) {
	m := layout.ModelConfig{Layers: 2, KVHeads: 1, HeadDim: 8, DType: layout.DTypeF32, MLA: true}
	l, ranks := sumLayout(m, 8, 2, layout.HND, layout.FullyContiguous, 64)
	kvtest.Fill(l, ranks, 0, 7)
	// Token 6 of rank 1's latent in layer 0: past the first page of 4.
	off := l.ChunkOffset(0, 0, 0) + 6*8*4
	ranks[1][off] ^= 1
	if err := layout.ReplicasMatch(l, ranks, 0, 0, 4); err != nil {
		t.Fatalf("tokens [0, 4): %v", err)
	}
	if err := layout.ReplicasMatch(l, ranks, 0, 4, 4); !errors.Is(err, layout.ErrReplicasDiffer) {
		t.Fatalf("tokens [4, 8): %v, want ErrReplicasDiffer", err)
	}
	if err := layout.ReplicasMatch(l, ranks, 0, 4, 5); !errors.Is(err, layout.ErrInvalid) {
		t.Fatalf("tokens [4, 9) of a page of 8: %v, want ErrInvalid", err)
	}
}

// BenchmarkReplicasMatch measures what checking every rank's copy of a
// replicated block adds to its checksum, which reads one copy: a block of
// DeepSeek-V3's MLA shape (61 layers, a latent of 576 bf16, 64 tokens) at
// TP 2 and 8, BlockSum and ReplicasMatch in turn on the same block.
// x-sum is the check's time over the sum's.
func BenchmarkReplicasMatch(b *testing.B) {
	m := layout.ModelConfig{Layers: 61, KVHeads: 1, HeadDim: 576, DType: layout.DTypeBF16, MLA: true}
	for _, tp := range []int{2, 8} {
		b.Run(fmt.Sprintf("TP%d", tp), func(b *testing.B) {
			l, ranks := sumLayout(m, 64, tp, layout.NHD, layout.FullyContiguous, 4096)
			kvtest.Fill(l, ranks, 1, 5)
			var sumT, checkT time.Duration
			b.SetBytes(int64(tp) * int64(l.Strides().Block))
			for b.Loop() {
				t0 := time.Now()
				if _, err := layout.BlockSum(l, ranks, 1, 0, 64); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := layout.ReplicasMatch(l, ranks, 1, 0, 64); err != nil {
					b.Fatal(err)
				}
				checkT += time.Since(t1)
				sumT += t1.Sub(t0)
			}
			b.ReportMetric(float64(checkT)/float64(sumT), "x-sum")
		})
	}
}
