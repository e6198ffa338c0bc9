//go:build cgo && linux

package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

// The agents of these tests read each other over RDMA on softverbs, the
// software NIC: every agent is started with --rdma on and --rdma-library
// pointing at the library the test builds, all share one softverbs
// registry (the "fabric"), and each has its own control file that faults
// are written to while it runs (SOFTVERBS_CONTROL; a stall or a port
// down written to a holder's file stalls the readers reading from it).

// softverbsLib builds the software NIC once per test binary.
func softverbsLib(t *testing.T) string {
	t.Helper()
	softLib, err := softverbs.BuildShared()
	if err != nil {
		t.Fatalf("softverbs (make test installs libibverbs-dev): %v", err)
	}
	return softLib
}

// Queue-pair timeout 12 and 2 retries: a holder that does not answer
// fails a read after 3 × 4.096 µs × 2^12 ≈ 50 ms.
const (
	qpTimeout = 12
	qpRetry   = 2
)

// qpBound is how long softverbs tries an unreachable responder before it
// completes a read with retry-exceeded.
var qpBound = time.Duration(qpRetry+1) * time.Duration(4096<<qpTimeout) * time.Nanosecond

// rdmaCluster is a process cluster on softverbs with each node's control
// file.
type rdmaCluster struct {
	*Cluster
	control []string
}

// fault writes faults ("key=value,...", or "" to clear them) to node i's
// control file; softverbs reads it on every post and while a read waits.
func (c *rdmaCluster) fault(t *testing.T, i int, faults string) {
	t.Helper()
	if err := c.writeFault(i, faults); err != nil {
		t.Fatal(err)
	}
}

// writeFault writes node i's control file whole: a new file renamed over
// it, so that a reader never sees half of it.
func (c *rdmaCluster) writeFault(i int, faults string) error {
	tmp := c.control[i] + ".new"
	if err := os.WriteFile(tmp, []byte(faults), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, c.control[i])
}

// startRDMA starts n agents with RDMA on over softverbs. env, if not nil,
// adds to node i's environment; tune, if not nil, adjusts the options.
func startRDMA(t *testing.T, n int, pool string, env func(i int) []string, tune func(*Options)) *rdmaCluster {
	t.Helper()
	lib := softverbsLib(t)
	dir := t.TempDir()
	rc := &rdmaCluster{}
	for i := range n {
		f := filepath.Join(dir, fmt.Sprintf("control-%d", i+1))
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		rc.control = append(rc.control, f)
	}
	opts := Options{Bin: bin, Nodes: n, Pool: pool,
		ExtraArgs: []string{"--rdma", "on", "--rdma-library", lib,
			"--rdma-timeout", fmt.Sprint(qpTimeout), "--rdma-retry", fmt.Sprint(qpRetry)},
		Env: []string{"SOFTVERBS_REGISTRY=" + filepath.Join(dir, "registry")},
		NodeEnv: func(i int) []string {
			e := []string{"SOFTVERBS_CONTROL=" + rc.control[i]}
			if env != nil {
				e = append(e, env(i)...)
			}
			return e
		},
	}
	if tune != nil {
		tune(&opts)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	rc.Cluster = c
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range c.Nodes {
				t.Logf("%s log:\n%s", n.Name, n.Log())
			}
		}
		if err := c.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return rc
}

// rdmaReadBytes is what n's metrics say it read over transport.
func readBytes(t *testing.T, n *Node, transport string) float64 {
	t.Helper()
	v, err := metricValue(n, `kvfabric_transfer_bytes_total{direction="read",transport="`+transport+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func metric(t *testing.T, n *Node, name string) float64 {
	t.Helper()
	v, err := metricValue(n, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func fallbacks(t *testing.T, n *Node, reason string) float64 {
	t.Helper()
	return metric(t, n, `kvfabric_rdma_fallbacks_total{reason="`+reason+`"}`)
}

// TP 4 -> TP 2 between agent processes over RDMA: every byte checked,
// the import's report and the importer's metrics say rdma, and nothing
// moved over QUIC.
func TestRDMAImportAcrossProcesses(t *testing.T) {
	c := startRDMA(t, 2, "host=64MiB", nil, nil)
	holder, importer := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	w := Workload{Sequences: 2, Blocks: 12, SharedPrefix: 4, PageSize: 16, Seed: 11}
	seqs := w.Hashes()
	p, err := Produce(ctx, holder, engSlots("producer", 4, layout.HND, 64), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, importer, holder.Name, w.Unique())
	r, err := Consume(ctx, importer, engSlots("consumer", 2, layout.NHD, 64), seqs)
	if err != nil {
		t.Fatal(err)
	}
	if r.Blocks != w.Unique() || r.Verified != w.Sequences*w.Blocks || r.Transports["rdma"] != w.Unique() {
		t.Fatalf("report %+v: want %d blocks over rdma, %d verified", r, w.Unique(), w.Sequences*w.Blocks)
	}
	if got := readBytes(t, importer, "rdma"); got != float64(r.Bytes) || got == 0 {
		t.Errorf("importer's metrics: %v bytes read over rdma, the imports moved %d", got, r.Bytes)
	}
	if got := readBytes(t, importer, "quic"); got != 0 {
		t.Errorf("importer's metrics: %v bytes read over quic, want 0", got)
	}
	if v := metric(t, importer, "kvfabric_rdma_reads_total"); v < 1 {
		t.Errorf("kvfabric_rdma_reads_total %v", v)
	}
	if v := metric(t, holder, "kvfabric_rdma_queue_pairs_served"); v < 1 {
		t.Errorf("holder serves %v queue pairs", v)
	}
	for _, n := range c.Nodes {
		// Each block set's memory is registered as the set is made: some
		// of the 64 MiB pool, in whole pages.
		if v := metric(t, n, "kvfabric_rdma_registered_bytes"); v <= 0 || v > 64<<20 || int64(v)%int64(os.Getpagesize()) != 0 {
			t.Errorf("%s registered %v bytes, want its block sets' memory, in pages of its 64 MiB pool", n.Name, v)
		}
		if full := n.FullLog(); !strings.Contains(full, `msg="RDMA on"`) || !strings.Contains(full, `msg="pool registered for RDMA"`) {
			t.Errorf("%s did not log RDMA on and its registration:\n%s", n.Name, n.Log())
		}
	}
	t.Logf("%d blocks, %d bytes over rdma in %v", r.Blocks, r.Bytes, r.Elapsed.Round(time.Millisecond))
}

// checkRegistered acquires each of hashes on set and checks every byte of
// each block registered; it returns how many are registered.
func checkRegistered(t *testing.T, cl *client.Client, set *client.BlockSet, hashes []uint64) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for i, h := range hashes {
		refs, err := cl.Acquire(ctx, set.ID, []uint64{h})
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) == 0 {
			continue
		}
		n++
		if err := kvtest.Check(set.Layout, set.Ranks, int(refs[0].Slot), h); err != nil {
			t.Fatalf("registered block %d is not whole: %v", i, err)
		}
	}
	return n
}

// importOnce registers an engine on n and imports hashes once, returning
// the client, the block set and the response (or error).
func importOnce(t *testing.T, n *Node, e client.Engine, hashes []uint64) (*client.Client, *client.BlockSet, *fabricpb.ImportResponse, error) {
	t.Helper()
	ctx := context.Background()
	cl, err := n.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	set, err := cl.Register(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cl.Import(ctx, set.ID, hashes)
	return cl, set, resp, err
}

// Faults before the READs (the holder's port down, a queue pair the
// holder refuses to connect) and during them (an error completion, a
// holder that stops answering) end in a clean fallback to QUIC: the
// import brings every block, every byte is right, the import's report
// says QUIC moved it, and the importer counts and logs why. A stalled
// holder fails the read within the queue pair's bound, not the import's.
func TestRDMAFaultsFallBackToQUIC(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    func(i int) []string // per node, at start
		inject func(t *testing.T, c *rdmaCluster)
		reason string // the importer's fallback reason
		log    string // what the importer's log says
	}{
		{
			name:   "holder's port down",
			inject: func(t *testing.T, c *rdmaCluster) { c.fault(t, 0, "port_down=1") },
			reason: "read-failed", log: "retry",
		},
		{
			// An InfiniBand importer and a RoCE holder: the holder
			// refuses to connect a queue pair across link layers.
			name: "connect refused",
			env: func(i int) []string {
				if i == 1 {
					return []string{"SOFTVERBS_LINK_LAYER=infiniband"}
				}
				return nil
			},
			reason: "connect-failed", log: "link layer",
		},
		{
			name:   "read completes with an error",
			inject: func(t *testing.T, c *rdmaCluster) { c.fault(t, 1, "fail_read=1") },
			reason: "read-failed", log: "remote access error",
		},
		{
			name:   "holder stalls",
			inject: func(t *testing.T, c *rdmaCluster) { c.fault(t, 0, "stall=1") },
			reason: "read-failed", log: "retry",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Chunks of 4 blocks: the import's second chunk is leased,
			// with the holder's keys, while the first is read.
			c := startRDMA(t, 2, "host=32MiB", tc.env, func(o *Options) {
				o.ExtraArgs = append(o.ExtraArgs, "--import-chunk-bytes", "1MiB")
			})
			holder, importer := c.Nodes[0], c.Nodes[1]
			ctx := context.Background()
			w := Workload{Sequences: 1, Blocks: 12, PageSize: 16, Seed: 12}
			seqs := w.Hashes()
			p, err := Produce(ctx, holder, engSlots("producer", 4, layout.HND, 32), seqs)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			waitIndexed(t, importer, holder.Name, w.Unique())
			if tc.inject != nil {
				tc.inject(t, c)
			}
			r, err := Consume(ctx, importer, engSlots("consumer", 2, layout.NHD, 32), seqs)
			if err != nil {
				t.Fatal(err)
			}
			if r.Verified != w.Blocks || r.Transports["quic"] != w.Blocks {
				t.Fatalf("report %+v: want %d blocks over quic, all verified", r, w.Blocks)
			}
			if v := fallbacks(t, importer, tc.reason); v != 1 {
				t.Errorf("fallbacks for %s: %v, want 1", tc.reason, v)
			}
			// After the first failure the holder is read over QUIC until
			// the backoff (1 s) ends, the chunks leased ahead too: one
			// failed attempt, not one per chunk.
			if v := metric(t, importer, "kvfabric_rdma_read_failures_total") + metric(t, importer, "kvfabric_rdma_connect_failures_total"); v != 1 {
				t.Errorf("%v RDMA reads and connects failed, want 1", v)
			}
			if v := fallbacks(t, importer, "backoff"); v < 1 {
				t.Errorf("fallbacks for backoff: %v, want the later chunks", v)
			}
			if got := readBytes(t, importer, "quic"); got != float64(r.Bytes) {
				t.Errorf("importer's metrics: %v bytes read over quic, the import moved %d", got, r.Bytes)
			}
			if got := readBytes(t, importer, "rdma"); got != 0 {
				t.Errorf("importer's metrics: %v bytes read over rdma, want 0", got)
			}
			if !strings.Contains(strings.ToLower(importer.FullLog()), tc.log) {
				t.Errorf("the importer's log does not say %q", tc.log)
			}
			// A read that no answer comes to fails after the queue
			// pair's bound (50 ms), then the chunk moves over QUIC.
			if limit := 20*qpBound + 2*time.Second; r.Elapsed > limit {
				t.Errorf("the import took %v, want within %v", r.Elapsed, limit)
			}
			t.Logf("import over quic in %v (queue pair bound %v); importer log:\n%s", r.Elapsed.Round(time.Millisecond), qpBound, grepLog(importer, "rdma", "RDMA"))
		})
	}
}

// grepLog returns the lines of n's log that contain any of words.
func grepLog(n *Node, words ...string) string {
	b, _ := os.ReadFile(n.LogFile)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// A lease that expired before it was released makes the reader discard
// what it read: the holder's term is 1 s, every RDMA completion of the
// importer is delayed so that the read takes longer, and the holder is
// stopped (SIGSTOP) while the read runs, so no renewal is answered. The
// read lands whole; the release, answered once the holder goes on, says
// the lease had expired; nothing of the chunk is registered.
func TestRDMALeaseExpiredBeforeReleaseDiscards(t *testing.T) {
	c := startRDMA(t, 2, "host=32MiB", nil, func(o *Options) {
		// The importer's calls wait up to 3 s (half its peer timeout),
		// longer than the read and the stop last.
		o.NodeArgs = func(i int) []string {
			if i == 0 {
				return []string{"--lease-duration", "1s"}
			}
			return []string{"--peer-timeout", "6s"}
		}
	})
	holder, importer := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	w := Workload{Sequences: 2, Blocks: 1, PageSize: 16, Seed: 13}
	seqs := w.Hashes()
	p, err := Produce(ctx, holder, engSlots("producer", 2, layout.HND, 8), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, importer, holder.Name, w.Unique())
	e := engSlots("consumer", 1, layout.HND, 8)
	// The first block comes plainly: the queue pair is connected and the
	// holder's layout known, so that the second import needs nothing of
	// the stopped holder but its memory and, at the end, the release.
	cl, set, resp, err := importOnce(t, importer, e, seqs[0])
	if err != nil || len(resp.Blocks) != 1 || resp.Fetches[0].Transport != "rdma" {
		t.Fatalf("first import: %v, %v", resp, err)
	}
	ops := metric(t, importer, "kvfabric_rdma_work_requests_total")
	if ops < 1 {
		t.Fatalf("%v work requests for the first import", ops)
	}
	// 1.6 s of completions for the second block's read.
	c.fault(t, 1, fmt.Sprintf("delay_us=%d", int(1.6e6/ops)))
	result := importAsync(t, ctx, cl, set.ID, seqs[1])
	wait.For(t, 10*time.Second, "the holder grants the lease", func() error {
		if v, err := metricValue(holder, "kvfabric_leases"); err != nil || v == 0 {
			return fmt.Errorf("%v leases (%v)", v, err)
		}
		return nil
	})
	leased := time.Now()
	if err := holder.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	cont := func() {
		if stopped {
			holder.Signal(syscall.SIGCONT)
			stopped = false
		}
	}
	defer cont()
	wait.For(t, 10*time.Second, "the importer's RDMA read lands", func() error {
		if v, err := metricValue(importer, "kvfabric_rdma_reads_total"); err != nil || v < 2 {
			return fmt.Errorf("%v reads (%v)", v, err)
		}
		return nil
	})
	if since := time.Since(leased); since < 1100*time.Millisecond {
		t.Fatalf("the read landed %v after the lease: within its 1 s term, nothing is tested", since)
	}
	cont()
	r := result()
	why := ""
	switch {
	case r.err != nil:
		why = r.err.Error()
	case len(r.resp.Blocks) != 0:
		t.Fatalf("the import returned %d blocks read under an expired lease", len(r.resp.Blocks))
	default:
		why = r.resp.Error
	}
	if !strings.Contains(why, "lease expired before release") {
		t.Errorf("import: %q, want the expired lease named", why)
	}
	if n := checkRegistered(t, cl, set, seqs[1]); n != 0 {
		t.Errorf("%d blocks read under an expired lease are registered", n)
	}
	if v := metric(t, holder, "kvfabric_leases_expired_total"); v < 1 {
		t.Errorf("the holder counts %v expired leases", v)
	}
	if v := metric(t, importer, "kvfabric_import_chunks_total"); v != 1 {
		t.Errorf("the importer registered %v chunks, want the first import's only", v)
	}
	t.Logf("import: %s", why)
}

// A holder killed with SIGKILL while the importer reads it over RDMA:
// softverbs completes the outstanding READs with retry-exceeded after the
// queue pair's bound (the holder's process is gone), and the import fails
// over to the other holder or errors within that bound plus the time a
// QUIC call to a silent peer takes; no block that did not arrive whole is
// registered.
func TestRDMAHolderKilledMidRead(t *testing.T) {
	const peerTimeout = time.Second
	c := startRDMA(t, 3, "host=64MiB", nil, func(o *Options) { o.PeerTimeout = peerTimeout })
	killHolderMidRead(t, c, holderKill{
		seed: 14, fault: "delay_us=2000",
		// The importer connects its queue pair to the holder just before
		// its first READ, and the delayed completions keep the read going.
		reading: func(victim *Node) error {
			if v, err := metricValue(victim, "kvfabric_rdma_queue_pairs_served"); err != nil || v < 1 {
				return fmt.Errorf("%s serves %v queue pairs (%v)", victim.Name, v, err)
			}
			return nil
		},
		// The READ in flight fails after the queue pair's bound; the same
		// chunk is then asked over QUIC, which gives up on the silent
		// holder after half the peer timeout.
		bound: qpBound + peerTimeout/2, margin: 2 * time.Second,
		boundIs: fmt.Sprintf("queue pair %v, half the peer timeout %v", qpBound, peerTimeout/2),
		reads:   "RDMA", logWords: []string{"rdma", "RDMA", "fail"},
	})
}

// holderKill is what differs between the bindings in killHolderMidRead.
type holderKill struct {
	seed  uint64
	fault string // the importer's fault that slows or holds its reads, so that the kill lands in one
	// reading, if not nil, is true once the importer reads from victim:
	// the kill waits for it.
	reading func(victim *Node) error
	// The import fails over, or errors, within bound and margin of the
	// kill; boundIs says what bound is made of.
	bound, margin time.Duration
	boundIs       string
	reads         string   // the binding's reads, as the log says them
	logWords      []string // the importer's log lines worth showing
}

// killHolderMidRead: in a cluster of three, node 1 and node 2 hold 96
// blocks, node 3 imports them with slowed reads, and the holder serving
// it is killed with SIGKILL. The read in flight fails, the import fails
// over to the other holder or errors within k's bound, and every block
// registered, returned or not, is whole.
func killHolderMidRead(t *testing.T, c *rdmaCluster, k holderKill) {
	t.Helper()
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	ctx := context.Background()
	w := Workload{Sequences: 1, Blocks: 96, PageSize: 16, Seed: k.seed}
	seqs := w.Hashes()
	p, err := Produce(ctx, n1, engSlots("producer", 2, layout.HND, w.Blocks), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, n2, n1.Name, w.Unique())
	if _, err := Consume(ctx, n2, engSlots("copy", 1, layout.HND, w.Blocks), seqs); err != nil {
		t.Fatal(err)
	}
	waitIndexed(t, n3, n2.Name, w.Unique())
	c.fault(t, 2, k.fault)
	// Cleared before the nodes stop, whatever fails first: a read held
	// keeps the importer from shutting down.
	t.Cleanup(func() {
		if err := c.writeFault(2, ""); err != nil {
			t.Errorf("clear the importer's faults: %v", err)
		}
	})
	cl, err := n3.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	set, err := cl.Register(ctx, engSlots("importer", 4, layout.NHD, w.Blocks))
	if err != nil {
		t.Fatal(err)
	}
	result := importAsync(t, ctx, cl, set.ID, seqs[0])
	victim := waitServing(t, []*Node{n1, n2})
	other := n1
	if victim == n1 {
		other = n2
	}
	if k.reading != nil {
		// From the victim alone: a read held, or a queue pair served, may
		// otherwise be the other holder's.
		wait.For(t, 10*time.Second, "the importer reads from "+victim.Name+" alone", func() error {
			if err := k.reading(victim); err != nil {
				return err
			}
			if v, err := metricValue(other, "kvfabric_leases"); err != nil || v != 0 {
				return fmt.Errorf("%s serves %v leases too (%v)", other.Name, v, err)
			}
			return nil
		})
	}
	killed := time.Now()
	if err := victim.Stop(syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	c.fault(t, 2, "") // the rest at full speed, a held read let go
	r := result()
	if !r.at.After(killed) {
		t.Fatalf("the import ended before %s was killed: nothing was tested", victim.Name)
	}
	failedOver := r.at
	if r.err == nil {
		for _, f := range r.resp.Fetches {
			if f.Node != victim.Name {
				failedOver = r.at.Add(-time.Duration(f.Micros) * time.Microsecond)
			}
		}
	}
	if v := metric(t, n3, "kvfabric_rdma_read_failures_total"); v < 1 {
		t.Errorf("%v %s reads failed: the kill did not land in a read", v, k.reads)
	}
	if took := failedOver.Sub(killed); took > k.bound+k.margin {
		t.Errorf("failed over or errored %v after the kill, want within %v (%s) and %v of margin", took, k.bound, k.boundIs, k.margin)
	} else {
		t.Logf("failed over or errored %v after the kill (%s)", took.Round(time.Millisecond), k.boundIs)
	}
	brought := 0
	if r.err == nil {
		brought = len(r.resp.Blocks)
		t.Logf("import after %s was killed: %d of %d blocks; fetches %v; %s", victim.Name, brought, w.Blocks, r.resp.Fetches, r.resp.Error)
	} else {
		t.Logf("import after %s was killed: %v", victim.Name, r.err)
	}
	if n := checkRegistered(t, cl, set, seqs[0]); n < brought {
		t.Errorf("%d blocks registered, the import returned %d", n, brought)
	}
	t.Logf("importer: %s", grepLog(n3, k.logWords...))
}

// A READ that fails in the middle of an import: the chunks before it
// stay as they came over RDMA, the failed chunk and the rest come over
// QUIC, the import's report says rdma+quic, and every byte is right.
func TestRDMAReadFailsMidImport(t *testing.T) {
	c := startRDMA(t, 2, "host=32MiB", nil, func(o *Options) {
		o.ExtraArgs = append(o.ExtraArgs, "--import-chunk-bytes", "1MiB") // 4 blocks
	})
	holder, importer := c.Nodes[0], c.Nodes[1]
	ctx := context.Background()
	w := Workload{Sequences: 2, Blocks: 12, PageSize: 16, Seed: 15}
	seqs := w.Hashes()
	p, err := Produce(ctx, holder, engSlots("producer", 4, layout.HND, 32), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, importer, holder.Name, w.Unique())
	e := engSlots("consumer", 2, layout.NHD, 32)
	r, err := Consume(ctx, importer, e, seqs[:1])
	if err != nil {
		t.Fatal(err)
	}
	if r.Transports["rdma"] != w.Blocks {
		t.Fatalf("first import: %+v, want every block over rdma", r)
	}
	// The work requests of one chunk (the three are alike); the second
	// import's first request past them fails: its second chunk's first.
	perChunk := int(metric(t, importer, "kvfabric_rdma_work_requests_total")) / 3
	c.fault(t, 1, fmt.Sprintf("fail_read=%d", perChunk+1))
	r, err = Consume(ctx, importer, e, seqs[1:])
	if err != nil {
		t.Fatal(err)
	}
	if r.Verified != w.Blocks || r.Transports["rdma+quic"] != w.Blocks {
		t.Fatalf("report %+v: want %d blocks, verified, over rdma+quic", r, w.Blocks)
	}
	if v := fallbacks(t, importer, "read-failed"); v != 1 {
		t.Errorf("fallbacks for read-failed: %v, want 1", v)
	}
	if got, want := metric(t, importer, "kvfabric_import_chunks_total"), 6.0; got != want {
		t.Errorf("%v chunks registered, want %v", got, want)
	}
	rdmaBytes, quicBytes := readBytes(t, importer, "rdma"), readBytes(t, importer, "quic")
	// 16 of the 24 blocks over RDMA (the first import, and the chunk
	// before the failure), 8 over QUIC (the failed chunk, and the last,
	// leased ahead with keys but read during the backoff).
	if per := float64(r.Bytes) / float64(w.Blocks); rdmaBytes != 16*per || quicBytes != 8*per {
		t.Errorf("importer read %v bytes over rdma and %v over quic, want %v and %v", rdmaBytes, quicBytes, 16*per, 8*per)
	}
	if v := fallbacks(t, importer, "backoff"); v != 1 {
		t.Errorf("fallbacks for backoff: %v, want 1 (the last chunk)", v)
	}
}

// An agent process with --rdma on and no usable device exits with status
// 2 and one line saying why, before it joins anything.
func TestRDMAOnWithoutDeviceExits(t *testing.T) {
	lib := softverbsLib(t)
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	for _, tc := range []struct {
		name, lib string
		env       []string
		want      string
	}{
		{"no library", missing, nil, missing},
		{"port down", lib, []string{"SOFTVERBS_PORT_STATE=down"}, "none of 1 RDMA devices has port 1 active"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "agent", "--local", "--node", "n1", "--data-dir", t.TempDir(),
				"--gossip-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0", "--metrics-addr", "off", "--pool", "host=16MiB",
				"--dev-ca-dir", filepath.Join(t.TempDir(), "ca"), "--rdma", "on", "--rdma-library", tc.lib)
			cmd.Env = append(append(os.Environ(), "SOFTVERBS_REGISTRY="+filepath.Join(t.TempDir(), "registry")), tc.env...)
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("the agent started and ran (killed after 20 s):\n%s", out)
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit %v, want status 2:\n%s", err, out)
			}
			if !strings.Contains(string(out), "rdma (--rdma): on, and") || !strings.Contains(string(out), tc.want) || strings.Contains(string(out), "agent started") {
				t.Errorf("output does not name --rdma on and %q, or says the agent started:\n%s", tc.want, out)
			}
			t.Logf("exit 2: %s", lastLine(string(out)))
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
