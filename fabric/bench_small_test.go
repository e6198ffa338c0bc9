package fabric_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

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
