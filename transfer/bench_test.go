package transfer

import (
	"context"
	"flag"
	"fmt"
	"net"
	"testing"

	"github.com/kvfabric/kvfabric/internal/netbench"
	"github.com/kvfabric/kvfabric/layout"
)

var (
	benchSize    = flag.Int64("kvfabric.bench.size", 64<<20, "bytes moved per transport per iteration of BenchmarkTransfer (e.g. 1073741824)")
	benchConns   = flag.Int("kvfabric.bench.conns", 0, "connections per peer in BenchmarkTransfer (0: Config default)")
	benchStreams = flag.Int("kvfabric.bench.streams", 0, "streams per connection in BenchmarkTransfer (0: Config default)")
	benchWindow  = flag.Uint64("kvfabric.bench.window", 0, "stream receive window in BenchmarkTransfer (0: Config default)")
	benchMinPart = flag.Uint64("kvfabric.bench.minpart", 0, "Config.MinStreamBytes in BenchmarkTransfer (0: default)")
	benchChunk   = flag.Int64("kvfabric.bench.chunk", 32<<10, "bytes per (layer, K/V) chunk of a benchmark block; a block is 64 chunks")
)

// benchBlocks describes the benchmark's block set: layer-separate, so a
// block is 64 chunks (32 layers × K/V) at a stride of one layer's worth
// of slots, as layout lays out a real KV cache.
type benchBlocks struct {
	nblocks, chunk, chunks uint64
}

func (bb benchBlocks) blockBytes() uint64 { return bb.chunk * bb.chunks }

func (bb benchBlocks) segment(b uint64) layout.Segment {
	stride := bb.nblocks * bb.chunk
	return layout.Segment{SrcOffset: b * bb.chunk, DstOffset: b * bb.chunk, Length: bb.chunk, Count: bb.chunks, SrcStride: stride, DstStride: stride}
}

// BenchmarkTransfer moves -kvfabric.bench.size bytes of blocks between two
// nodes on loopback with kvfabric reads, and the same bytes, block by
// block, with the same parallelism over bare quic-go streams (same
// connections, windows and TLS), TLS 1.3 over TCP and raw TCP. The four
// run interleaved in each iteration so that a noisy machine slows them
// alike; it reports each one's GB/s and per-block p50/p99 and our ratio to
// each baseline.
//
//	go test ./transfer -run '^$' -bench Transfer -benchtime 3x -kvfabric.bench.size 1073741824
func BenchmarkTransfer(b *testing.B) {
	bb := benchBlocks{chunk: uint64(*benchChunk), chunks: 64}
	bb.nblocks = max(1, uint64(*benchSize)/bb.blockBytes())
	size := bb.nblocks * bb.blockBytes()
	src := make([]byte, size)
	fill(src, 7)
	dst := make([]byte, size)

	ca := newTestCA(b)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.regions[1] = [][]byte{src}
	leaseAll(h, 1, 1, size)
	opt := func(c *Config) {
		c.ConnsPerPeer, c.StreamsPerConn, c.StreamReceiveWindow = *benchConns, *benchStreams, *benchWindow
		c.MinStreamBytes = *benchMinPart
	}
	holder := newTestNode(b, ca, "holder", members, h, opt)
	reader := newTestNode(b, ca, "reader", members, nil, opt)
	p := dialPeer(b, reader, holder)
	cfg := reader.cfg
	parallel := cfg.ConnsPerPeer * cfg.StreamsPerConn
	ctx := context.Background()
	// Open every connection before timing.
	for i := 0; i < cfg.ConnsPerPeer; i++ {
		if _, err := p.conn(ctx, i); err != nil {
			b.Fatal(err)
		}
	}

	whole := func(ctx context.Context, n uint64) error {
		segs := make([]layout.Segment, n)
		for i := range segs {
			segs[i] = bb.segment(uint64(i))
		}
		return p.Read(ctx, 1, 1, segs, [][]byte{dst})
	}
	ours := []*netbench.Transport{
		{Name: "kvfabric", Parallel: parallel, Fetch: func(ctx context.Context, _ int, blk, _ uint64) error {
			return p.Read(ctx, 1, 1, []layout.Segment{bb.segment(blk)}, [][]byte{dst})
		}},
		{Name: "kvfabric-plan", Whole: whole},
	}
	base := netbench.Config{
		Src: src, Dst: dst, BlockBytes: bb.blockBytes(), Parallel: parallel, Conns: cfg.ConnsPerPeer,
		ServerTLS: holder.serverTLS(), ClientTLS: reader.clientTLS("holder"), QUIC: holder.qcfg,
		ServerIP: net.IPv4(127, 0, 0, 250), ClientIP: net.IPv4(127, 0, 0, 251),
	}
	runner := &netbench.Runner{Transports: ours, BlockBytes: bb.blockBytes()}
	defer runner.Close()
	for _, mk := range []func(netbench.Config) (*netbench.Transport, error){netbench.NewQUIC, netbench.NewTLS, netbench.NewTCP} {
		tr, err := mk(base)
		if err != nil {
			b.Fatal(err)
		}
		runner.Transports = append(runner.Transports, tr)
	}
	runner.Before = func(*netbench.Transport) error { clear(dst); return nil }
	runner.After = func(tr *netbench.Transport) error {
		if tr.Name != "kvfabric" && tr.Name != "kvfabric-plan" {
			return nil
		}
		// Our reads are strided: check them against the source.
		for i := uint64(0); i < bb.nblocks; i += max(1, bb.nblocks/16) {
			s := bb.segment(i)
			for c := uint64(0); c < s.Count; c++ {
				so, do := s.Piece(c)
				if string(dst[do:do+s.Length]) != string(src[so:so+s.Length]) {
					return fmt.Errorf("block %d chunk %d differs", i, c)
				}
			}
		}
		return nil
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := runner.Round(ctx, bb.nblocks); err != nil {
			b.Fatal(err)
		}
	}
	runner.Report(b)
	ratios := [][2]string{{"kvfabric", "quic"}, {"kvfabric", "tls"}, {"kvfabric", "tcp"}, {"kvfabric-plan", "quic"}}
	for _, r := range ratios {
		x, err := runner.Ratio(r[0], r[1])
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(x, r[0]+"/"+r[1])
	}
	b.Logf("%d blocks of %d KiB (%d MiB) per transport per iteration, %d conns × %d streams, %d iterations",
		bb.nblocks, bb.blockBytes()>>10, size>>20, cfg.ConnsPerPeer, cfg.StreamsPerConn, b.N)
}
