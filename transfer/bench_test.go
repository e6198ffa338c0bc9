package transfer

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"flag"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

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

// transport moves one block by index, contiguous for baselines.
type benchTransport struct {
	name     string
	parallel int
	fetch    func(ctx context.Context, worker int, block uint64) error
	// whole, when set, moves every block in one call instead; latency per
	// block is then not measured.
	whole func(ctx context.Context) error
	close func()
}

// run moves every block with parallel workers and returns the elapsed
// time and per-block latencies.
func (tr *benchTransport) run(ctx context.Context, nblocks uint64) (time.Duration, []time.Duration, error) {
	if tr.whole != nil {
		start := time.Now()
		err := tr.whole(ctx)
		return time.Since(start), nil, err
	}
	lat := make([]time.Duration, nblocks)
	next := make(chan uint64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	start := time.Now()
	for w := 0; w < tr.parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range next {
				t0 := time.Now()
				if err := tr.fetch(ctx, w, b); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					continue
				}
				lat[b] = time.Since(t0)
			}
		}()
	}
	for b := uint64(0); b < nblocks; b++ {
		next <- b
	}
	close(next)
	wg.Wait()
	return time.Since(start), lat, first
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

	transports := []*benchTransport{
		{name: "kvfabric", parallel: parallel, fetch: func(ctx context.Context, _ int, blk uint64) error {
			return p.Read(ctx, 1, 1, []layout.Segment{bb.segment(blk)}, [][]byte{dst})
		}},
		{name: "kvfabric-plan", whole: func(ctx context.Context) error {
			segs := make([]layout.Segment, bb.nblocks)
			for i := range segs {
				segs[i] = bb.segment(uint64(i))
			}
			return p.Read(ctx, 1, 1, segs, [][]byte{dst})
		}},
		benchQUIC(b, holder, reader, src, dst, bb, cfg.ConnsPerPeer, parallel),
		benchTCP(b, "tls", holder, reader, src, dst, bb, parallel),
		benchTCP(b, "tcp", nil, nil, src, dst, bb, parallel),
	}
	for _, tr := range transports {
		if tr.close != nil {
			defer tr.close()
		}
	}
	elapsed := map[string]time.Duration{}
	lats := map[string][]time.Duration{}
	b.ReportAllocs()
	for b.Loop() {
		for _, tr := range transports {
			clear(dst)
			d, lat, err := tr.run(ctx, bb.nblocks)
			if err != nil {
				b.Fatalf("%s: %v", tr.name, err)
			}
			elapsed[tr.name] += d
			lats[tr.name] = append(lats[tr.name], lat...)
			if tr.name == "kvfabric" || tr.name == "kvfabric-plan" {
				// Our reads are strided: check them against the source.
				for i := uint64(0); i < bb.nblocks; i += max(1, bb.nblocks/16) {
					s := bb.segment(i)
					for c := uint64(0); c < s.Count; c++ {
						so, do := s.Piece(c)
						if string(dst[do:do+s.Length]) != string(src[so:so+s.Length]) {
							b.Fatalf("kvfabric: block %d chunk %d differs", i, c)
						}
					}
				}
			}
		}
	}
	gbps := map[string]float64{}
	for _, tr := range transports {
		gbps[tr.name] = float64(size) * float64(b.N) / elapsed[tr.name].Seconds() / 1e9
		l := lats[tr.name]
		slices.Sort(l)
		b.ReportMetric(gbps[tr.name], tr.name+"-GB/s")
		if len(l) == 0 {
			continue
		}
		b.ReportMetric(float64(l[len(l)/2].Microseconds())/1e3, tr.name+"-p50-ms")
		b.ReportMetric(float64(l[len(l)*99/100].Microseconds())/1e3, tr.name+"-p99-ms")
	}
	for _, base := range []string{"quic", "tls", "tcp"} {
		b.ReportMetric(gbps["kvfabric"]/gbps[base], "kvfabric/"+base)
	}
	b.ReportMetric(gbps["kvfabric-plan"]/gbps["quic"], "kvfabric-plan/quic")
	b.Logf("%d blocks of %d KiB (%d MiB) per transport per iteration, %d conns × %d streams, %d iterations",
		bb.nblocks, bb.blockBytes()>>10, size>>20, cfg.ConnsPerPeer, cfg.StreamsPerConn, b.N)
}

// benchQUIC serves contiguous blocks over bare quic-go streams: one stream
// per block, an 8-byte block number as the request.
func benchQUIC(b *testing.B, holder, reader *Node, src, dst []byte, bb benchBlocks, conns, parallel int) *benchTransport {
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 250)})
	if err != nil {
		b.Fatal(err)
	}
	tr := &quic.Transport{Conn: uc}
	ln, err := tr.Listen(holder.serverTLS(), holder.qcfg)
	if err != nil {
		b.Fatal(err)
	}
	bs := bb.blockBytes()
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go func() {
				for {
					s, err := c.AcceptStream(context.Background())
					if err != nil {
						return
					}
					go func() {
						var req [8]byte
						if _, err := io.ReadFull(s, req[:]); err != nil {
							s.CancelWrite(1)
							return
						}
						blk := binary.BigEndian.Uint64(req[:])
						s.Write(src[blk*bs : (blk+1)*bs])
						s.Close()
					}()
				}
			}()
		}
	}()
	var cs []*quic.Conn
	var trs []*quic.Transport
	for i := 0; i < conns; i++ {
		cu, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 251)})
		if err != nil {
			b.Fatal(err)
		}
		ct := &quic.Transport{Conn: cu}
		c, err := ct.Dial(context.Background(), ln.Addr(), reader.clientTLS("holder"), reader.qcfg)
		if err != nil {
			b.Fatal(err)
		}
		cs, trs = append(cs, c), append(trs, ct)
	}
	return &benchTransport{
		name: "quic", parallel: parallel,
		fetch: func(ctx context.Context, w int, blk uint64) error {
			s, err := cs[w%len(cs)].OpenStreamSync(ctx)
			if err != nil {
				return err
			}
			var req [8]byte
			binary.BigEndian.PutUint64(req[:], blk)
			if _, err := s.Write(req[:]); err != nil {
				return err
			}
			s.Close()
			_, err = io.ReadFull(s, dst[blk*bs:(blk+1)*bs])
			return err
		},
		close: func() {
			for _, c := range cs {
				c.CloseWithError(0, "")
			}
			for _, t := range trs {
				t.Close()
			}
			ln.Close()
			tr.Close()
		},
	}
}

// benchTCP serves contiguous blocks over TCP, with TLS 1.3 when holder and
// reader are given. TCP has no streams, so each worker has its own
// connection and asks for one block at a time.
func benchTCP(b *testing.B, name string, holder, reader *Node, src, dst []byte, bb benchBlocks, parallel int) *benchTransport {
	ln, err := net.Listen("tcp", "127.0.0.252:0")
	if err != nil {
		b.Fatal(err)
	}
	if holder != nil {
		ln = tls.NewListener(ln, holder.serverTLS())
	}
	bs := bb.blockBytes()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var req [8]byte
				for {
					if _, err := io.ReadFull(c, req[:]); err != nil {
						return
					}
					blk := binary.BigEndian.Uint64(req[:])
					if _, err := c.Write(src[blk*bs : (blk+1)*bs]); err != nil {
						return
					}
				}
			}()
		}
	}()
	conns := make([]net.Conn, parallel)
	for i := range conns {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		if reader != nil {
			tc := tls.Client(c, reader.clientTLS("holder"))
			if err := tc.Handshake(); err != nil {
				b.Fatal(err)
			}
			c = tc
		}
		conns[i] = c
	}
	return &benchTransport{
		name: name, parallel: parallel,
		fetch: func(ctx context.Context, w int, blk uint64) error {
			c := conns[w]
			var req [8]byte
			binary.BigEndian.PutUint64(req[:], blk)
			if _, err := c.Write(req[:]); err != nil {
				return err
			}
			_, err := io.ReadFull(c, dst[blk*bs:(blk+1)*bs])
			return err
		},
		close: func() {
			for _, c := range conns {
				c.Close()
			}
			ln.Close()
		},
	}
}
