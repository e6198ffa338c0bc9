package fabric_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/trace"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/netbench"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

var (
	benchImportSize = flag.Int64("kvfabric.bench.import", 64<<20,
		"bytes of KV blocks BenchmarkImport moves per iteration (1 GiB: 1073741824)")
	benchImportBatch = flag.Int("kvfabric.bench.import.batch", 16,
		"blocks per Import call in BenchmarkImport (lowered so that -kvfabric.bench.import.inflight calls fill the set)")
	benchImportInflight = flag.Int("kvfabric.bench.import.inflight", 4,
		"Import calls in flight at once in BenchmarkImport")
	benchImportOrders = flag.String("kvfabric.bench.import.orders", "HND>HND",
		"KV orders of A's and B's block sets in BenchmarkImport: HND>HND, NHD>NHD, HND>NHD or NHD>HND")
	benchImportLanePlain = flag.Bool("kvfabric.bench.import.lane-plain", false,
		"BenchmarkImport's lane is plain TCP (Config.LanePlain) rather than TLS; compare it with x-tcp")
	benchImportTrace = flag.String("kvfabric.bench.import.trace", "",
		"directory BenchmarkImport writes an execution trace of each lane and bare TLS run into (lane-N.trace, tls-N.trace, N the iteration), for go tool trace -pprof=net|sync|sched")
	benchImportTP = flag.String("kvfabric.bench.import.tp", "4>2",
		"TP sizes of A's and B's block sets in BenchmarkImport: 4>2 re-shards (8 KiB pieces, strided); 1>1 moves each 2 MiB block as one contiguous piece, as the baselines and NIXL and Mooncake do")
)

// benchTP parses -kvfabric.bench.import.tp.
func benchTP(s string) (a, b int, err error) {
	x, y, ok := strings.Cut(s, ">")
	if ok {
		a, err = strconv.Atoi(x)
	}
	if ok && err == nil {
		b, err = strconv.Atoi(y)
	}
	if !ok || err != nil || a < 1 || b < 1 || benchModel.KVHeads%a != 0 || benchModel.KVHeads%b != 0 {
		return 0, 0, fmt.Errorf("-kvfabric.bench.import.tp %q: want two TP sizes that divide %d joined by >, e.g. 4>2 or 1>1", s, benchModel.KVHeads)
	}
	return a, b, nil
}

// benchOrders parses -kvfabric.bench.import.orders.
func benchOrders(s string) (src, dst layout.KVOrder, err error) {
	orders := map[string]layout.KVOrder{"HND": layout.HND, "NHD": layout.NHD}
	a, b, ok := strings.Cut(strings.ToUpper(s), ">")
	src, dst = orders[a], orders[b]
	if !ok || src == 0 || dst == 0 {
		return 0, 0, fmt.Errorf("-kvfabric.bench.import.orders %q: want two of HND and NHD joined by >, e.g. HND>NHD", s)
	}
	return src, dst, nil
}

// benchModel is shaped like Llama 3 8B's KV cache: 2 MiB per block of 16
// tokens in bf16 (32 layers × K/V × 8 heads × 128 × 16 tokens × 2 bytes).
var benchModel = layout.ModelConfig{Layers: 32, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}

const (
	benchPage           = 16
	benchTPA, benchTPB  = 4, 2 // a real re-shard: each of B's ranks gathers two of A's
	benchIPA, benchIPB  = "127.0.0.61", "127.0.0.62"
	benchQUICServer     = "127.0.0.63"
	benchQUICClient     = "127.0.0.64"
	benchIndexDeadline  = 30 * time.Second
	benchImportDeadline = 2 * time.Minute
)

// BenchmarkImport moves KV blocks between two agents in this process
// through the whole import path: an engine on agent B imports blocks that
// an engine on agent A produced, and B's agent finds A in its index,
// leases the blocks, fetches A's layout (first time), plans the re-shard
// from A's TP 4 layout to B's TP 2 one (both HND by default, so that a
// plan piece is the two heads of one A rank: 8 KiB; NHD>NHD makes pieces
// of 512 bytes, HND>NHD of 256), reads the plan, releases the lease and
// registers the blocks. -kvfabric.bench.import.tp 1>1 makes it the same
// work as the baselines (and as NIXL's and Mooncake's runs in
// testbed/peers-bench.sh): no re-shard, each 2 MiB block one contiguous
// piece on both sides. It runs twice per iteration, on blocks of their
// own: over A's TCP lane ("lane", TLS 1.3) and over QUIC ("import"). Calls
// are of -kvfabric.bench.import.batch blocks, -kvfabric.bench.import.inflight
// at once, as an engine importing the prefixes of several requests would.
//
// In the same iteration, the same bytes move over netbench's baselines
// with the agent's transport settings: bare quic-go (as many connections
// as the agent opens to a peer, as many streams in flight as one read of
// the agent uses, the agent's windows, mutual TLS with the same CA and
// ALPN), and TLS 1.3 over TCP and raw TCP over as many connections as the
// lane opens (transfer.DefaultLaneConns), one contiguous block per
// request. It reports each one's GB/s and per-block p50/p99 (an imported
// block's latency is its Import call's); the QUIC import over bare
// quic-go as x-quic (goal ≥ 0.9); the lane over bare TLS as x-tls (goal ≥
// 0.8), over plain TCP as x-tcp and over the QUIC import as lane-x-import
// (goal ≥ 2); the process's CPU seconds per GB moved for the lane, the
// QUIC import and the quic and tls baselines (both ends of each are in
// this process); and fetch/call: the share of the Import calls' time that
// the agent spent fetching (lease, layouts, plan, read, release), as it
// reports in the response. On Linux it also reports lane-runq-s/GB and
// tls-runq-s/GB, the time per GB the process's threads waited for a core
// during those runs: a run that used fewer cores than the machine has
// while this grew was short of cores, not of work.
// -kvfabric.bench.import.trace writes an execution trace of each lane and
// bare TLS run (testbed/lanetrace.py reads them).
//
// Every iteration imports blocks B has never seen: A registers a fresh
// set of sequences (new hashes, new contents) before the timed part, and
// B's engine releases what it imported after it, so that B's next
// allocation recycles those slots as a full cache would. Otherwise B's
// second import would find the blocks at home and move nothing. Every
// imported byte is checked against what A wrote (kvtest), untimed.
//
//	go test ./fabric -run '^$' -bench Import -benchtime 3x -count 3
//	go test ./fabric -run '^$' -bench Import -benchtime 3x -count 3 -kvfabric.bench.import=1073741824
//	go test ./fabric -run '^$' -bench '^BenchmarkImport$' -kvfabric.bench.import.lane-plain -kvfabric.bench.import.tp 1>1
func BenchmarkImport(b *testing.B) {
	blockBytes := uint64(benchModel.Layers) * 2 * uint64(benchModel.KVHeads*benchModel.HeadDim*benchPage) * benchModel.DType.Size()
	nblocks := max(1, int(uint64(*benchImportSize)/blockBytes))
	inflight := max(1, *benchImportInflight)
	batch := max(1, min(*benchImportBatch, (nblocks+inflight-1)/inflight))
	size := uint64(nblocks) * blockBytes
	orderA, orderB, err := benchOrders(*benchImportOrders)
	if err != nil {
		b.Fatal(err)
	}
	tpA, tpB, err := benchTP(*benchImportTP)
	if err != nil {
		b.Fatal(err)
	}

	root, err := os.MkdirTemp("", "kvfb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(root) })
	caDir := filepath.Join(root, "ca")
	poolSpec := fmt.Sprintf("host=%d", size+size/8+64<<20)
	// A holds two sets of blocks per iteration, one for each import (over
	// the lane and over QUIC): B would find a second import of the same
	// blocks at home. A's block set holds exactly those; at the default
	// cap (half the slots per peer) B's concurrent imports would wait for
	// each other's leases; this measures the transfer path, and the caps
	// have tests of their own.
	agentA := startBenchAgentWith(b, root, caDir, "a", benchIPA, fmt.Sprintf("host=%d", 2*size+size/8+64<<20), "", func(c *fabric.Config) {
		c.MaxLeasedPerPeer = 2 * nblocks
		c.LaneAddr = benchIPA + ":0"
		c.LanePlain = *benchImportLanePlain
	})
	agentB := startBenchAgent(b, root, caDir, "b", benchIPB, poolSpec, agentA.GossipAddr())
	ca := context.Background()
	cA, cB := benchDial(b, agentA), benchDial(b, agentB)
	setA, err := cA.Register(ca, client.Engine{Name: "producer", Model: benchModel, TPSize: tpA, PageSize: benchPage, Order: orderA, Slots: 2 * nblocks})
	if err != nil {
		b.Fatal(err)
	}
	setB, err := cB.Register(ca, client.Engine{Name: "consumer", Model: benchModel, TPSize: tpB, PageSize: benchPage, Order: orderB, Slots: nblocks})
	if err != nil {
		b.Fatal(err)
	}

	// The import path as netbench transports: one Import call per batch,
	// over the lane ("lane") and over QUIC ("import"). hashes and got are
	// the running import's.
	var hashes []uint64
	hashesOf := map[string][]uint64{}
	got := make([]uint32, nblocks) // B's slot of each block
	// The agent's own account of its fetches (lease to release), against
	// the Import calls' latency: the rest is the engine API, the index
	// lookup and registering.
	var fetchMicros, callMicros atomic.Int64
	// Fetches that did not go over the transport their run is for (a
	// lane read that fell back to QUIC): counted and reported, not failed.
	var wrongTransport atomic.Int64
	importVia := func(name, want string) *netbench.Transport {
		return &netbench.Transport{
			Name: name, Parallel: inflight, Batch: batch,
			Fetch: func(ctx context.Context, _ int, first, n uint64) error {
				t0 := time.Now()
				resp, err := cB.Import(ctx, setB.ID, hashes[first:first+n])
				if err != nil {
					return err
				}
				callMicros.Add(time.Since(t0).Microseconds())
				for _, f := range resp.Fetches {
					fetchMicros.Add(int64(f.Micros))
					if f.Transport != want {
						wrongTransport.Add(1)
					}
				}
				if len(resp.Blocks) != int(n) {
					return fmt.Errorf("imported %d of %d blocks: %s", len(resp.Blocks), n, resp.Error)
				}
				for i, ref := range resp.Blocks {
					got[first+uint64(i)] = ref.Slot
				}
				return nil
			},
		}
	}
	lane, imp := importVia("lane", "tcp"), importVia("import", "quic")

	src := make([]byte, size)
	for i := 0; i < len(src); i += 8 {
		src[i] = byte(i >> 3)
	}
	dst := make([]byte, size)
	// Fault in the pages every transport writes to, B's block set and the
	// baselines' destination, before the timed runs: otherwise the first
	// transport of the first iteration pays for the page faults of each.
	for i := 0; i < len(dst); i += 4096 {
		dst[i] = 1
	}
	for slot := 0; slot < nblocks; slot++ {
		kvtest.Fill(setB.Layout, setB.Ranks, slot, 0)
	}
	// That was this process's mapping of B's set (the engine's); the
	// agent's own mapping of the same memory would still fault on its
	// first touch of each page, which the first transport to write into
	// B's set (the lane, first in each round) paid for in the first
	// iteration alone: 1 fault per 4 KiB.
	fabric.FaultInSets(agentB)
	tcfg := transfer.DefaultLocalConfig()
	serverTLS, clientTLS := benchTLS(b, caDir)
	base := netbench.Config{
		Src: src, Dst: dst, BlockBytes: blockBytes,
		Conns:     tcfg.ConnsPerPeer,
		Parallel:  tcfg.ConnsPerPeer * tcfg.StreamsPerConn,
		ServerTLS: serverTLS, ClientTLS: clientTLS,
		QUIC:     tcfg.QUICConfig(),
		ServerIP: net.ParseIP(benchQUICServer), ClientIP: net.ParseIP(benchQUICClient),
		UDPBuffer: 7 << 20, // what the agent's transport asks for
	}
	runner := &netbench.Runner{Transports: []*netbench.Transport{lane, imp}, BlockBytes: blockBytes}
	b.Cleanup(func() { runner.Close() })
	for i, mk := range []func(netbench.Config) (*netbench.Transport, error){netbench.NewQUIC, netbench.NewTLS, netbench.NewTCP} {
		cfg := base
		if i > 0 {
			// TLS and TCP over as many connections as the lane opens.
			cfg.Parallel = transfer.DefaultLaneConns
		}
		tr, err := mk(cfg)
		if err != nil {
			b.Fatal(err)
		}
		runner.Transports = append(runner.Transports, tr)
	}

	// CPU time of the whole process (both agents, or both ends of a
	// baseline) per transport, untimed hooks around each run.
	cpu := map[string]time.Duration{}
	var cpu0 time.Duration
	// And the time its threads waited for a core while runnable (Linux):
	// a run that used less than every core while this grew was short of
	// cores that other processes had, not of work.
	runq := map[string]time.Duration{}
	var runq0 time.Duration
	var traceFile *os.File // the run's execution trace, when one is asked for
	iter := 0
	var slotsA []uint32
	runner.Before = func(tr *netbench.Transport) error {
		if h, ok := hashesOf[tr.Name]; ok {
			hashes = h
			fabric.SetLaneReads(agentB, tr == lane)
		}
		// Every run starts from a collected heap: the garbage of the
		// untimed work before it (A's registrations, B's checks of the run
		// before) is not collected on its CPU.
		runtime.GC()
		if *benchImportTrace != "" && (tr == lane || tr.Name == "tls") {
			f, err := os.Create(filepath.Join(*benchImportTrace, fmt.Sprintf("%s-%d.trace", tr.Name, iter)))
			if err != nil {
				return err
			}
			if err := trace.Start(f); err != nil {
				f.Close()
				return err
			}
			traceFile = f
		}
		cpu0 = netbench.ProcessCPU()
		runq0 = processRunDelay()
		return nil
	}
	runner.After = func(tr *netbench.Transport) error {
		cpu[tr.Name] += netbench.ProcessCPU() - cpu0
		runq[tr.Name] += processRunDelay() - runq0
		if traceFile != nil {
			trace.Stop()
			err := traceFile.Close()
			traceFile = nil
			if err != nil {
				return err
			}
		}
		if tr != imp && tr != lane {
			return nil
		}
		content := 2 * iter
		if tr == lane {
			content--
		}
		for i, slot := range got {
			if err := kvtest.Check(setB.Layout, setB.Ranks, int(slot), benchContent(content, i)); err != nil {
				return fmt.Errorf("iteration %d, block %d: %w", iter, i, err)
			}
		}
		// Done with them: B's next allocation recycles these slots.
		return cB.Release(ca, setB.ID, got)
	}
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		iter++
		if slotsA != nil {
			if err := cA.Release(ca, setA.ID, slotsA); err != nil {
				b.Fatal(err)
			}
		}
		slotsA = nil
		for k, name := range []string{"lane", "import"} {
			h, s, err := benchProduce(cA, setA, 2*iter-1+k, nblocks, batch)
			if err != nil {
				b.Fatal(err)
			}
			if err := benchAwaitIndex(cB, h, batch); err != nil {
				b.Fatal(err)
			}
			hashesOf[name], slotsA = h, append(slotsA, s...)
		}
		b.StartTimer()
		// Each transport's run has benchImportDeadline.
		ctx, cancel := context.WithTimeout(ca, time.Duration(len(runner.Transports))*benchImportDeadline)
		err := runner.Round(ctx, uint64(nblocks))
		cancel()
		if err != nil {
			b.Fatal(err)
		}
	}
	runner.Report(b)
	for _, r := range []struct{ ours, base, unit string }{
		{"import", "quic", "x-quic"}, {"lane", "tls", "x-tls"}, {"lane", "tcp", "x-tcp"}, {"lane", "import", "lane-x-import"},
	} {
		x, err := runner.Ratio(r.ours, r.base)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(x, r.unit)
	}
	gb := float64(iter) * float64(size) / 1e9
	for _, name := range []string{"lane", "import", "quic", "tls", "tcp"} {
		b.ReportMetric(cpu[name].Seconds()/gb, name+"-cpu-s/GB")
	}
	if runq["lane"] > 0 {
		for _, name := range []string{"lane", "tls"} {
			b.ReportMetric(runq[name].Seconds()/gb, name+"-runq-s/GB")
		}
	}
	if c := callMicros.Load(); c > 0 {
		b.ReportMetric(float64(fetchMicros.Load())/float64(c), "fetch/call")
	}
	b.ReportMetric(float64(wrongTransport.Load()), "fallback-fetches")
	if w := wrongTransport.Load(); w > 0 {
		b.Logf("%d fetches fell back to QUIC; the importer's lane fallbacks: %v", w, agentB.Metrics().Transport.LaneFallbacks)
	}
	b.Logf("%d blocks of %d KiB (%d MiB) per transport per iteration, TP %d %v -> TP %d %v, %d blocks per Import, %d in flight; quic baseline %d conns, %d blocks in flight; tls and tcp baselines %d conns (the lane's); %d iterations; lane plain TCP: %v",
		nblocks, blockBytes>>10, size>>20, tpA, orderA, tpB, orderB, batch, inflight, base.Conns, base.Parallel, transfer.DefaultLaneConns, iter, *benchImportLanePlain)
}

// processRunDelay is the time the process's threads have waited on a
// run queue for a core so far (Linux's schedstat, summed over the threads
// alive now); 0 where the system does not say.
func processRunDelay() time.Duration {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", t.Name(), "schedstat"))
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			continue
		}
		if ns, err := strconv.ParseInt(f[1], 10, 64); err == nil {
			sum += time.Duration(ns)
		}
	}
	return sum
}

// benchContent is the kvtest id of block i of iteration iter: different
// in every iteration, so that a block left over from an earlier one fails
// the check.
func benchContent(iter, i int) uint64 { return uint64(iter)<<32 | uint64(i+1) }

// benchProduce registers nblocks fresh blocks on A's engine as
// nblocks/batch independent sequences (one per request an engine would
// import) and returns their hashes and A's slots.
func benchProduce(c *client.Client, set *client.BlockSet, iter, nblocks, batch int) ([]uint64, []uint32, error) {
	ctx := context.Background()
	slots, err := c.Allocate(ctx, set.ID, nblocks)
	if err != nil {
		return nil, nil, err
	}
	h, err := layout.NewHasher(benchPage, layout.HashOptions{Salt: fmt.Sprintf("bench-%d", iter)})
	if err != nil {
		return nil, nil, err
	}
	var hashes []uint64
	for first := 0; first < nblocks; first += batch {
		n := min(batch, nblocks-first)
		tokens := make([]uint32, benchPage*n)
		for i := range tokens {
			tokens[i] = uint32(first*benchPage + i)
		}
		var seq []uint64
		for j, blk := range h.Sequence(tokens) {
			kvtest.Fill(set.Layout, set.Ranks, int(slots[first+j]), benchContent(iter, first+j))
			seq = append(seq, blk.Sequence)
		}
		refs, err := c.RegisterBlocks(ctx, set.ID, slots[first:first+n], seq)
		if err != nil {
			return nil, nil, err
		}
		for j, r := range refs {
			if r.Duplicate {
				return nil, nil, fmt.Errorf("block %d registered as a duplicate", first+j)
			}
		}
		hashes = append(hashes, seq...)
	}
	return hashes, slots, nil
}

// benchAwaitIndex waits until B's index has A holding every sequence.
func benchAwaitIndex(c *client.Client, hashes []uint64, batch int) error {
	deadline := time.Now().Add(benchIndexDeadline)
	for first := 0; first < len(hashes); {
		n := min(batch, len(hashes)-first)
		ov, err := c.Lookup(context.Background(), hashes[first:first+n])
		if err != nil {
			return err
		}
		if len(ov) > 0 && ov[0].Node == "a" && int(ov[0].Blocks) == n {
			first += n
			continue
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("b's index does not show a holding blocks %d..%d within %v: %v", first, first+n-1, benchIndexDeadline, ov)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

func startBenchAgent(b *testing.B, root, caDir, name, ip, pools, join string) *fabric.Agent {
	return startBenchAgentWith(b, root, caDir, name, ip, pools, join, nil)
}

// startBenchAgentWith is startBenchAgent with configure applied last.
func startBenchAgentWith(b *testing.B, root, caDir, name, ip, pools, join string, configure func(*fabric.Config)) *fabric.Agent {
	c := fabric.DefaultLocalConfig()
	c.NodeName = name
	c.DataDir = filepath.Join(root, name)
	c.DevCADir = caDir
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = ip+":0", ip+":0", "off"
	c.Pools = []string{pools}
	// A shared 2-core machine moving a GiB can stall a stream for a
	// while; that is measured, not failed.
	c.PeerTimeout = 10 * time.Second
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	if join != "" {
		c.Join = []string{join}
	}
	if configure != nil {
		configure(&c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := fabric.Start(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { a.Close() })
	return a
}

func benchDial(b *testing.B, a *fabric.Agent) *client.Client {
	c, err := client.Dial(context.Background(), a.EngineSocket())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// benchTLS certifies the baselines' two ends with the agents' development
// CA and verifies them as transfer does (mutual, chain to the CA, key
// usage), so that the baselines pay the agents' handshake and ciphers.
func benchTLS(b *testing.B, caDir string) (srv, cli *tls.Config) {
	ca, _, err := certs.EnsureDevCA(caDir)
	if err != nil {
		b.Fatal(err)
	}
	cert := func(name string) tls.Certificate {
		p, err := ca.IssueNode(name, time.Hour)
		if err != nil {
			b.Fatal(err)
		}
		c, err := p.TLSCertificate()
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	pool := ca.Pool()
	verify := func(usage x509.ExtKeyUsage) func(tls.ConnectionState) error {
		return func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no peer certificate")
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}})
			return err
		}
	}
	srv = &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert("bench-server")},
		NextProtos: []string{transfer.ALPN}, ClientAuth: tls.RequireAnyClientCert,
		VerifyConnection: verify(x509.ExtKeyUsageClientAuth),
	}
	cli = &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert("bench-client")},
		NextProtos: []string{transfer.ALPN}, ServerName: "bench-server", InsecureSkipVerify: true,
		VerifyConnection: verify(x509.ExtKeyUsageServerAuth),
	}
	return srv, cli
}
