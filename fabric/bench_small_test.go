package fabric_test

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/netbench"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer"
)

// BenchmarkImportSmallBlocks imports 65,536 blocks of 512 bytes (the
// engine API's largest request, of tinyModel's blocks) in one Import call
// per iteration: the cost per block of leasing, planning, reading,
// releasing and registering in chunks of transfer.MaxLeaseBlocks, rather
// than the cost per byte that BenchmarkImport measures.
//
// In the same iteration, bare quic-go (netbench, the agent's settings)
// moves the same payload as one request per chunk. It reports blocks/s of
// both and import's throughput over the baseline's as x-quic: what is left
// after the per-block work, beyond moving the bytes.
//
//	go test ./fabric -run '^$' -bench ImportSmallBlocks -benchtime 3x -count 3
func BenchmarkImportSmallBlocks(b *testing.B) {
	const n = 1 << 16
	st := (&layout.Layout{Model: tinyModel, PageSize: 16, TPSize: 1, Order: layout.HND, Arrangement: layout.FullyContiguous, Alignment: 4096, Slots: 1}).Strides()
	payload := st.Shard // bytes of one block a read moves

	root, err := os.MkdirTemp("", "kvfb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(root) })
	caDir := filepath.Join(root, "ca")
	pools := fmt.Sprintf("host=%d", 2*n*st.Block+64<<20)
	agentA := startBenchAgent(b, root, caDir, "a", benchIPA, pools, "")
	agentB := startBenchAgent(b, root, caDir, "b", benchIPB, pools, agentA.GossipAddr())
	ctx := context.Background()
	cA, cB := benchDial(b, agentA), benchDial(b, agentB)
	e := client.Engine{Name: "producer", Model: tinyModel, TPSize: 1, PageSize: benchPage, Order: layout.HND, Slots: n}
	setA, err := cA.Register(ctx, e)
	if err != nil {
		b.Fatal(err)
	}
	e.Name = "consumer"
	setB, err := cB.Register(ctx, e)
	if err != nil {
		b.Fatal(err)
	}

	// The baseline: the same payload in one request per chunk.
	chunk := uint64(transfer.MaxLeaseBlocks) * payload
	src, dst := make([]byte, n*payload), make([]byte, n*payload)
	tcfg := transfer.DefaultLocalConfig()
	serverTLS, clientTLS := benchTLS(b, caDir)
	quic, err := netbench.NewQUIC(netbench.Config{
		Src: src, Dst: dst, BlockBytes: chunk,
		Conns: tcfg.ConnsPerPeer, Parallel: tcfg.ConnsPerPeer * tcfg.StreamsPerConn,
		ServerTLS: serverTLS, ClientTLS: clientTLS, QUIC: tcfg.QUICConfig(),
		ServerIP: net.ParseIP(benchQUICServer), ClientIP: net.ParseIP(benchQUICClient),
		UDPBuffer: 7 << 20,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { quic.Close() })

	var (
		imported, baseline time.Duration
		slotsA             []uint32
		iter               int
	)
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		iter++
		if slotsA != nil {
			if err := cA.Release(ctx, setA.ID, slotsA); err != nil {
				b.Fatal(err)
			}
		}
		var hashes []uint64
		if hashes, slotsA, err = benchProduce(cA, setA, iter, n, transfer.MaxLeaseBlocks); err != nil {
			b.Fatal(err)
		}
		if err := benchAwaitIndex(cB, hashes, transfer.MaxLeaseBlocks); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()

		t0 := time.Now()
		resp, err := cB.Import(ctx, setB.ID, hashes)
		imported += time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if len(resp.Blocks) != n {
			b.Fatalf("imported %d of %d blocks: %s", len(resp.Blocks), n, resp.Error)
		}
		qctx, cancel := context.WithTimeout(ctx, benchImportDeadline)
		took, _, err := quic.Run(qctx, uint64(n)*payload/chunk)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		baseline += took

		b.StopTimer()
		got := make([]uint32, n)
		for i, r := range resp.Blocks {
			if err := kvtest.Check(setB.Layout, setB.Ranks, int(r.Slot), benchContent(iter, i)); err != nil {
				b.Fatalf("iteration %d, block %d: %v", iter, i, err)
			}
			got[i] = r.Slot
		}
		if err := cB.Release(ctx, setB.ID, got); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	blocks := float64(n * iter)
	b.ReportMetric(blocks/imported.Seconds(), "blocks/s")
	b.ReportMetric(blocks/baseline.Seconds(), "quic-blocks/s")
	b.ReportMetric(baseline.Seconds()/imported.Seconds(), "x-quic")
	b.SetBytes(int64(n * payload))
}

var benchLaneSmallBlocks = flag.Int("kvfabric.bench.small.blocks", 1<<14,
	"64 KiB blocks BenchmarkImportSmallBlocksLane imports per iteration (65536 moves 4 GiB and needs about 17 GiB of memory)")

// BenchmarkImportSmallBlocksLane imports -kvfabric.bench.small.blocks
// blocks of 64 KiB (one layer of a 16-token block of Llama 3 8B: 8 KV
// heads of 128, bf16) over the TCP lane in one Import call, and in the
// same iteration the same bytes as 2 MiB blocks (all 32 layers) in one
// call: the per-block cost of an import (lease, plan, read requests,
// registration, events, index) shows as small blocks' throughput over
// large blocks' (x-large; the goal is 0.6 at 65,536 blocks).
//
//	go test ./fabric -run '^$' -bench ImportSmallBlocksLane -benchtime 2x -count 3
func BenchmarkImportSmallBlocksLane(b *testing.B) {
	small := layout.ModelConfig{Layers: 1, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	large := small
	large.Layers = 32
	nSmall := *benchLaneSmallBlocks
	nLarge := max(1, nSmall/large.Layers)
	blockSmall := uint64(2 * 8 * 128 * benchPage * 2)
	size := uint64(nSmall) * blockSmall

	root, err := os.MkdirTemp("", "kvfb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(root) })
	caDir := filepath.Join(root, "ca")
	pools := fmt.Sprintf("host=%d", 2*size+size/4+64<<20)
	agentA := startBenchAgentWith(b, root, caDir, "a", benchIPA, pools, "", func(c *fabric.Config) {
		c.LaneAddr = benchIPA + ":0"
		c.MaxLeasedPerPeer = 2 * nSmall
	})
	agentB := startBenchAgent(b, root, caDir, "b", benchIPB, pools, agentA.GossipAddr())
	ctx := context.Background()
	cA, cB := benchDial(b, agentA), benchDial(b, agentB)
	type side struct {
		name    string
		n       int
		setA    *client.BlockSet
		setB    *client.BlockSet
		took    time.Duration
		hashes  []uint64
		slotsA  []uint32
		content int
	}
	sides := []*side{{name: "small", n: nSmall}, {name: "large", n: nLarge}}
	for _, s := range sides {
		m := small
		if s.name == "large" {
			m = large
		}
		e := client.Engine{Name: "producer-" + s.name, Model: m, TPSize: 1, PageSize: benchPage, Order: layout.HND, Slots: s.n}
		if s.setA, err = cA.Register(ctx, e); err != nil {
			b.Fatal(err)
		}
		e.Name = "consumer-" + s.name
		if s.setB, err = cB.Register(ctx, e); err != nil {
			b.Fatal(err)
		}
		// Fault the pages in before the timed imports write them.
		for slot := 0; slot < s.n; slot++ {
			kvtest.Fill(s.setB.Layout, s.setB.Ranks, slot, 0)
		}
	}
	iter, fallbacks := 0, 0
	for b.Loop() {
		b.StopTimer()
		iter++
		for k, s := range sides {
			s.content = 2*iter - 1 + k // a salt and contents of its own
			if s.slotsA != nil {
				if err := cA.Release(ctx, s.setA.ID, s.slotsA); err != nil {
					b.Fatal(err)
				}
			}
			if s.hashes, s.slotsA, err = benchProduce(cA, s.setA, s.content, s.n, min(s.n, transfer.MaxLeaseBlocks)); err != nil {
				b.Fatal(err)
			}
			if err := benchAwaitIndex(cB, s.hashes, min(s.n, transfer.MaxLeaseBlocks)); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		for _, s := range sides {
			t0 := time.Now()
			resp, err := cB.Import(ctx, s.setB.ID, s.hashes)
			s.took += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			if len(resp.Blocks) != s.n {
				b.Fatalf("%s: imported %d of %d blocks: %s", s.name, len(resp.Blocks), s.n, resp.Error)
			}
			for _, f := range resp.Fetches {
				if f.Transport != "tcp" {
					fallbacks++ // a lane read that fell back to QUIC
				}
			}
			b.StopTimer()
			got := make([]uint32, s.n)
			for i, r := range resp.Blocks {
				if err := kvtest.Check(s.setB.Layout, s.setB.Ranks, int(r.Slot), benchContent(s.content, i)); err != nil {
					b.Fatalf("%s: iteration %d, block %d: %v", s.name, iter, i, err)
				}
				got[i] = r.Slot
			}
			if err := cB.Release(ctx, s.setB.ID, got); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	gb := float64(iter) * float64(size) / 1e9
	for _, s := range sides {
		b.ReportMetric(gb/s.took.Seconds(), s.name+"-GB/s")
	}
	b.ReportMetric(float64(iter*nSmall)/sides[0].took.Seconds(), "small-blocks/s")
	b.ReportMetric(sides[1].took.Seconds()/sides[0].took.Seconds(), "x-large")
	b.ReportMetric(float64(fallbacks), "fallback-fetches")
	b.Logf("%d blocks of %d KiB against %d of %d KiB over the lane, %d iterations", nSmall, blockSmall>>10, nLarge, 32*blockSmall>>10, iter)
}
