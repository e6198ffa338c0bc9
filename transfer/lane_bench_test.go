package transfer

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/netbench"
	"github.com/kvfabric/kvfabric/layout"
)

var (
	benchLanePlain    = flag.Bool("kvfabric.bench.lane.plain", false, "BenchmarkLane over a plain TCP lane (against raw TCP) instead of TLS")
	benchLaneBatch    = flag.Int("kvfabric.bench.lane.batch", 16, "blocks of 2 MiB per lane read in BenchmarkLane (an import chunk's worth)")
	benchLaneInflight = flag.Int("kvfabric.bench.lane.inflight", 4, "lane reads at once in BenchmarkLane")
	benchLaneConns    = flag.Int("kvfabric.bench.lane.conns", 0, "Config.LaneConns in BenchmarkLane (0: the default), and the baselines' connections")
)

// BenchmarkLane moves -kvfabric.bench.size bytes of 2 MiB blocks between
// two nodes on loopback over the holder's TCP lane, and the same bytes
// over TLS 1.3 over TCP and raw TCP (netbench) with as many connections as
// the lane opens, interleaved in each iteration. The lane reads
// -kvfabric.bench.lane.batch contiguous blocks per Read (one import
// chunk's read, without the import's lease, checksums and registration),
// -kvfabric.bench.lane.inflight at once; the baselines fetch one block per
// request, back to back on each connection. It reports each one's GB/s and
// CPU seconds per GB (the whole process: both ends live in it), and the
// lane over its baseline: x-tls, or with -kvfabric.bench.lane.plain x-tcp.
//
//	go test ./transfer -run '^$' -bench '^BenchmarkLane$' -benchtime 3x -kvfabric.bench.size 1073741824 [-kvfabric.bench.lane.plain]
func BenchmarkLane(b *testing.B) {
	const blockBytes = 2 << 20
	nblocks := max(1, uint64(*benchSize)/blockBytes)
	size := nblocks * blockBytes
	src := make([]byte, size)
	fill(src, 7)
	dst := make([]byte, size)

	ca := newTestCA(b)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.regions[1] = [][]byte{src}
	leaseAll(h, 1, 1, size)
	conns := *benchLaneConns
	holder := newTestNode(b, ca, "holder", members, h, withLane(*benchLanePlain))
	reader := newTestNode(b, ca, "reader", members, nil, withLaneConns(conns))
	p := dialPeer(b, reader, holder)
	conns = reader.cfg.LaneConns
	ctx := context.Background()
	read := func(ctx context.Context, first, n uint64) error {
		seg := layout.Segment{SrcOffset: first * blockBytes, DstOffset: first * blockBytes, Length: n * blockBytes, Count: 1}
		via, err := p.ReadVia(ctx, 1, 1, []layout.Segment{seg}, [][]byte{dst})
		if err == nil && via != TransportTCP {
			err = fmt.Errorf("read went over %s, not the lane", via)
		}
		return err
	}
	// Open the lane's connections before timing.
	if err := read(ctx, 0, min(nblocks, uint64(conns))); err != nil {
		b.Fatal(err)
	}
	lane := &netbench.Transport{Name: "lane", Parallel: max(1, *benchLaneInflight), Batch: max(1, *benchLaneBatch),
		Fetch: func(ctx context.Context, _ int, first, n uint64) error { return read(ctx, first, n) }}
	base := netbench.Config{
		Src: src, Dst: dst, BlockBytes: blockBytes, Parallel: conns, Conns: conns,
		ServerTLS: holder.serverTLS(), ClientTLS: reader.clientTLS("holder"),
		ServerIP: net.IPv4(127, 0, 0, 250), ClientIP: net.IPv4(127, 0, 0, 251),
	}
	baseName, mk := "tls", netbench.NewTLS
	if *benchLanePlain {
		baseName, mk = "tcp", netbench.NewTCP
	}
	bt, err := mk(base)
	if err != nil {
		b.Fatal(err)
	}
	runner := &netbench.Runner{Transports: []*netbench.Transport{lane, bt}, BlockBytes: blockBytes}
	defer runner.Close()
	cpu := map[string]time.Duration{}
	var cpuAt time.Duration
	runner.Before = func(*netbench.Transport) error { clear(dst); cpuAt = netbench.ProcessCPU(); return nil }
	runner.After = func(tr *netbench.Transport) error {
		cpu[tr.Name] += netbench.ProcessCPU() - cpuAt
		if !bytes.Equal(dst, src) {
			return fmt.Errorf("%s: the destination differs from the source", tr.Name)
		}
		return nil
	}
	for b.Loop() {
		if err := runner.Round(ctx, nblocks); err != nil {
			b.Fatal(err)
		}
	}
	runner.Report(b)
	for _, name := range []string{"lane", baseName} {
		if r := runner.Result(name); r.Bytes > 0 {
			b.ReportMetric(cpu[name].Seconds()/(float64(r.Bytes)/1e9), name+"-cpu-s/GB")
		}
	}
	x, err := runner.Ratio("lane", baseName)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(x, "x-"+baseName)
	b.Logf("%d blocks of 2 MiB (%d MiB) per transport per iteration; lane: %d blocks per read, %d reads at once, %d connections, plain %v; %s baseline: %d connections",
		nblocks, size>>20, *benchLaneBatch, *benchLaneInflight, conns, *benchLanePlain, baseName, conns)
}
