package testbed

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

var bin string

// TestMain builds the binary the tests run as agent processes.
func TestMain(m *testing.M) {
	MainWithBinary(&bin, m.Run)
}

var model = layout.ModelConfig{Layers: 8, KVHeads: 8, HeadDim: 64, DType: layout.DTypeBF16}

func eng(name string, tp int, order layout.KVOrder) client.Engine {
	return engSlots(name, tp, order, 512)
}

// engSlots is eng with a block set of slots slots.
func engSlots(name string, tp int, order layout.KVOrder, slots int) client.Engine {
	return client.Engine{Name: name, Model: model, TPSize: tp, PageSize: 16, Order: order, Slots: slots}
}

func start(t *testing.T, n int) *Cluster {
	t.Helper()
	return startWithPool(t, n, "host=256MiB")
}

// startWithPool starts n agents with pool as each one's --pool.
func startWithPool(t *testing.T, n int, pool string) *Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Start(ctx, Options{Bin: bin, Nodes: n, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
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
	return c
}

func waitIndexed(t *testing.T, n *Node, holder string, want int) {
	t.Helper()
	wait.For(t, 10*time.Second, fmt.Sprintf("%s indexes %d blocks of %s", n.Name, want, holder), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		cl, err := n.Client(ctx)
		if err != nil {
			return err
		}
		defer cl.Close()
		s, err := cl.Status(ctx)
		if err != nil {
			return err
		}
		for _, m := range s.Members {
			if m.Node == holder && m.State == "alive" {
				if int(m.Blocks) != want {
					return fmt.Errorf("%d indexed", m.Blocks)
				}
				return nil
			}
		}
		return fmt.Errorf("%s is not a member", holder)
	})
}

// TP 4 -> TP 2 across processes, every byte checked.
func TestImportAcrossProcesses(t *testing.T) {
	c := start(t, 3)
	ctx := context.Background()
	w := Workload{Sequences: 4, Blocks: 12, SharedPrefix: 4, PageSize: 16, Seed: 1}
	seqs := w.Hashes()
	p, err := Produce(ctx, c.Nodes[0], eng("producer", 4, layout.HND), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, c.Nodes[1], "node1", w.Unique())
	r, err := Consume(ctx, c.Nodes[1], eng("consumer", 2, layout.NHD), seqs)
	if err != nil {
		t.Fatal(err)
	}
	if r.Blocks != w.Unique() || r.Verified != w.Sequences*w.Blocks || r.From["node1"] != w.Unique() {
		t.Fatalf("report %+v: want %d blocks from node1, %d verified", r, w.Unique(), w.Sequences*w.Blocks)
	}
}

// A holder killed with SIGKILL in the middle of an import: the import
// fails over to the other holder or errors within 4 s, and no block that
// did not arrive whole is ever registered.
func TestHolderKilledMidImport(t *testing.T) {
	// 1,200 blocks of 256 KiB (300 MB), so that the import is still
	// moving when its holder is killed, on any machine.
	c := startWithPool(t, 3, "host=400MiB")
	ctx := context.Background()
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	w := Workload{Sequences: 1, Blocks: 1200, PageSize: 16, Seed: 2}
	seqs := w.Hashes()
	p, err := Produce(ctx, n1, engSlots("producer", 2, layout.HND, w.Blocks), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, n2, "node1", w.Unique())
	if _, err := Consume(ctx, n2, engSlots("copy", 1, layout.HND, w.Blocks), seqs); err != nil {
		t.Fatal(err)
	}
	waitIndexed(t, n3, "node2", w.Unique())

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
	// Kill whichever holder is serving, once bytes are flowing.
	victim := waitServing(t, []*Node{n1, n2})
	killed := time.Now()
	if err := victim.Stop(syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	r := result()
	// Failing over is done when the fetch from the surviving holder
	// starts (its own duration is the bytes moving); without a failover,
	// when the import returns its error.
	failedOver := r.at
	if r.err == nil {
		for _, f := range r.resp.Fetches {
			if f.Node != victim.Name {
				failedOver = r.at.Add(-time.Duration(f.Micros) * time.Microsecond)
			}
		}
	}
	if !r.at.After(killed) {
		t.Fatalf("the import ended before %s was killed: nothing was tested", victim.Name)
	}
	// Blocks may have come from the victim: the chunks it served whole
	// before the kill are kept. Every registered block is checked below.
	// Failing over takes about PeerTimeout/2 (1 s); the bound leaves room
	// for two loaded cores.
	if took := failedOver.Sub(killed); took > 4*time.Second {
		t.Errorf("import failed over or errored %v after the holder was killed (want within 4 s)", took)
	} else {
		t.Logf("failed over or errored %v after the kill", took.Round(time.Millisecond))
	}
	brought := 0
	if r.err == nil {
		brought = len(r.resp.Blocks)
		t.Logf("import after %s was killed: %d of %d blocks; fetches %v; %s", victim.Name, brought, len(seqs[0]), r.resp.Fetches, r.resp.Error)
	} else {
		t.Logf("import after %s was killed: %v", victim.Name, r.err)
	}
	// Every block the importer registered, returned or not, is whole.
	for i, h := range seqs[0] {
		refs, err := cl.Acquire(ctx, set.ID, []uint64{h})
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) == 0 {
			if i < brought {
				t.Fatalf("block %d was returned but is not registered", i)
			}
			continue
		}
		if err := kvtest.Check(set.Layout, set.Ranks, int(refs[0].Slot), h); err != nil {
			t.Fatalf("registered block %d is not whole: %v", i, err)
		}
	}
}

// waitServing returns the first of nodes whose metrics show a lease
// served with bytes on the way.
func waitServing(t *testing.T, nodes []*Node) *Node {
	t.Helper()
	var serving *Node
	wait.For(t, 10*time.Second, "a holder serves a lease", func() error {
		for _, n := range nodes {
			if v, err := metricValue(n, "kvfabric_leases"); err == nil && v > 0 {
				serving = n
				return nil
			}
		}
		return errors.New("no lease live")
	})
	return serving
}

// An importer killed with SIGKILL in the middle of an import: the holder
// ends its leases when the importer's connections go silent or membership
// declares it dead, well before their 30 s term.
func TestImporterKilledMidImport(t *testing.T) {
	// 2,000 blocks of 256 KiB: half a gigabyte, so that the import is
	// still moving when the importer is killed, on any machine.
	c := startWithPool(t, 2, "host=640MiB")
	ctx := context.Background()
	holder, importer := c.Nodes[0], c.Nodes[1]
	w := Workload{Sequences: 1, Blocks: 2000, PageSize: 16, Seed: 3}
	seqs := w.Hashes()
	p, err := Produce(ctx, holder, engSlots("producer", 2, layout.HND, w.Blocks), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, importer, holder.Name, w.Unique())
	cl, err := importer.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	set, err := cl.Register(ctx, engSlots("importer", 4, layout.NHD, w.Blocks))
	if err != nil {
		t.Fatal(err)
	}
	go cl.Import(ctx, set.ID, seqs[0]) // cut short by the kill
	waitServing(t, []*Node{holder})
	killed := time.Now()
	if err := importer.Stop(syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if v, err := metricValue(holder, "kvfabric_leases"); err != nil || v == 0 {
		t.Fatalf("no lease live on the holder right after the kill (%v, %v): the import ended first, nothing was tested", v, err)
	}
	wait.For(t, 20*time.Second, "the holder ends the killed importer's leases", func() error {
		v, err := metricValue(holder, "kvfabric_leases")
		if err != nil {
			return err
		}
		if v != 0 {
			return fmt.Errorf("%v leases live", v)
		}
		return nil
	})
	early, err := metricValue(holder, "kvfabric_leases_ended_early_total")
	if err != nil || early < 1 {
		t.Fatalf("leases ended early: %v, %v; want at least 1 (not expiry)", early, err)
	}
	if took := time.Since(killed); took > 15*time.Second {
		t.Errorf("the holder's leases ended %v after the importer was killed: not well before their 30 s term", took)
	} else {
		t.Logf("the holder's leases ended %v after the importer was killed (term 30 s)", took.Round(100*time.Millisecond))
	}
}

// metricValue reads one sample of n's metrics, named as exposed (labels
// included, as name{k="v"}); a missing sample or an unreachable agent is
// an error, never a zero.
func metricValue(n *Node, name string) (float64, error) {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.Get("http://" + n.Metrics + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var f float64
			if _, err := fmt.Sscan(v, &f); err != nil {
				return 0, fmt.Errorf("%s: %q: %v", name, v, err)
			}
			return f, nil
		}
	}
	return 0, fmt.Errorf("%s: no such sample in %s's metrics", name, n.Name)
}

// An agent whose certificate comes from another CA gets nothing from the
// cluster's agents, and they keep serving.
func TestPeerFromAnotherCARefused(t *testing.T) {
	c := start(t, 2)
	ctx := context.Background()
	w := Workload{Sequences: 1, Blocks: 8, PageSize: 16, Seed: 3}
	seqs := w.Hashes()

	// A third agent joins the gossip (which is not encrypted here) with
	// its own development CA. It joins before the blocks are stored, so
	// that it learns of them from their gossiped events: a node that
	// joins later catches up through the peer channel, which refuses it.
	rogue := &Cluster{opts: c.opts, Root: c.Root, net: c.net, Nodes: []*Node{{Name: "rogue"}}}
	rn := rogue.Nodes[0]
	ip := c.net + "9"
	rn.Gossip, rn.Peer, rn.Metrics = ip+":7946", ip+":7947", ip+":7948"
	rn.DataDir = filepath.Join(c.Root, "rogue")
	rn.Socket = filepath.Join(rn.DataDir, "engine.sock")
	rn.LogFile = filepath.Join(c.Root, "rogue.log")
	rogue.opts.ExtraArgs = []string{"--join", c.Nodes[0].Gossip, "--dev-ca-dir", filepath.Join(c.Root, "rogue-ca")}
	// It is never ready: it authenticates to no peer, and its /healthz
	// says so; it has started once it says that.
	rogue.opts.Healthy = func(ctx context.Context, n *Node) error {
		hc := http.Client{Timeout: time.Second}
		resp, err := hc.Get("http://" + n.Metrics + "/healthz")
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "cannot authenticate") {
			return fmt.Errorf("healthz: %s %q, want 503 naming the failed authentication", resp.Status, body)
		}
		_, err = os.Stat(n.Socket)
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := rogue.StartNode(startCtx, 0); err != nil {
		t.Fatal(err)
	}
	defer rn.Stop(syscall.SIGTERM, 5*time.Second)
	if err := c.WaitMembers(startCtx, []*Node{rn}, 3); err != nil {
		t.Fatal(err)
	}
	p, err := Produce(ctx, c.Nodes[0], eng("producer", 1, layout.HND), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, rn, "node1", w.Unique())

	_, err = Consume(ctx, rn, eng("thief", 1, layout.HND), seqs)
	if err == nil {
		t.Fatal("an agent with another CA's certificate imported blocks")
	}
	t.Logf("refused as expected: %v", err)
	if s := status.Code(err); s != codes.Unavailable {
		t.Errorf("code %v, want Unavailable", s)
	}
	if !strings.Contains(rn.Log(), "certificate") && !strings.Contains(err.Error(), "certificate") {
		t.Errorf("neither the error nor the log names the certificate: %v", err)
	}
	// The cluster's own node still imports, once it has indexed them.
	waitIndexed(t, c.Nodes[1], "node1", w.Unique())
	if _, err := Consume(ctx, c.Nodes[1], eng("friend", 1, layout.NHD), seqs); err != nil {
		t.Fatalf("the legitimate node could not import: %v", err)
	}
}

// Malformed requests on the engine API and garbage on the peer and gossip
// ports get errors, and the agent keeps serving.
func TestMalformedInputKeepsServing(t *testing.T) {
	c := start(t, 1)
	n := c.Nodes[0]
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(4, 4))

	// Raw garbage on the engine socket.
	for range 20 {
		conn, err := net.Dial("unix", n.Socket)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1+rng.IntN(4096))
		for i := range buf {
			buf[i] = byte(rng.Uint32())
		}
		conn.Write(buf)
		conn.Close()
	}
	// Well-formed gRPC with bad contents.
	gc, err := grpc.NewClient("unix://"+n.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer gc.Close()
	api := fabricpb.NewEngineClient(gc)
	// A valid block set, so that requests on it reach the checks they aim
	// at rather than failing at the block set look-up.
	reg, err := api.Register(ctx, &fabricpb.RegisterRequest{Engine: "probe", Model: model.Proto(), TpSize: 1, PageSize: 16, KvOrder: 2, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	set := reg.BlockSet
	bad := []func() error{
		func() error { _, err := api.Register(ctx, &fabricpb.RegisterRequest{}); return err },
		func() error {
			_, err := api.Register(ctx, &fabricpb.RegisterRequest{Model: model.Proto(), TpSize: 1 << 30, PageSize: 16})
			return err
		},
		func() error {
			_, err := api.Allocate(ctx, &fabricpb.AllocateRequest{BlockSet: 77, Count: 1})
			return err
		},
		func() error { _, err := api.Import(ctx, &fabricpb.ImportRequest{BlockSet: set}); return err },
		func() error {
			_, err := api.Import(ctx, &fabricpb.ImportRequest{BlockSet: set, Hashes: make([]uint64, 1<<17)})
			return err
		},
		func() error {
			_, err := api.Allocate(ctx, &fabricpb.AllocateRequest{BlockSet: set, Count: 9})
			return err
		},
		func() error {
			_, err := api.Lookup(ctx, &fabricpb.LookupRequest{Tokens: &fabricpb.Tokens{Ids: []uint32{1}}, BlockSize: 1 << 20})
			return err
		},
		func() error {
			_, err := api.RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set, Slots: []uint32{1 << 31}, Hashes: []uint64{1}})
			return err
		},
	}
	for i, call := range bad {
		err := call()
		if !n.Running() {
			b, _ := os.ReadFile(n.LogFile)
			t.Fatalf("agent exited after bad request %d (%v):\n%s", i, err, b)
		}
		if code := status.Code(err); code == codes.OK || code == codes.Unknown || code == codes.Internal {
			t.Errorf("bad request %d: %v (want a precise error code)", i, err)
		}
	}
	// Garbage datagrams on the QUIC and gossip ports.
	for _, addr := range []string{n.Peer, n.Gossip} {
		conn, err := net.Dial("udp", addr)
		if err != nil {
			t.Fatal(err)
		}
		for range 200 {
			buf := make([]byte, 1+rng.IntN(1400))
			for i := range buf {
				buf[i] = byte(rng.Uint32())
			}
			conn.Write(buf)
		}
		conn.Close()
	}
	// Still serving, and the process never died.
	cl, err := n.Client(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := cl.Status(ctx); err != nil {
		t.Fatalf("agent stopped serving: %v", err)
	}
	if !n.Running() {
		t.Fatal("agent exited")
	}
	w := Workload{Sequences: 1, Blocks: 4, PageSize: 16, Seed: 5}
	if p, err := Produce(ctx, n, eng("after", 1, layout.HND), w.Hashes()); err != nil {
		t.Fatalf("agent cannot store after bad input: %v", err)
	} else {
		p.Close()
	}
}

// An agent whose TLS files do not fit together refuses to start, with an
// error that names the file and what is wrong, instead of joining and
// failing every call.
func TestBadCertificatesRefusedAtStart(t *testing.T) {
	dir := t.TempDir()
	path := func(n string) string { return filepath.Join(dir, n) }
	kv := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("kvfabric %v: %v\n%s", args, err, out)
		}
	}
	kv("certs", "ca", "--out", path("cluster"), "--name", "prod CA")
	kv("certs", "ca", "--out", path("other"), "--name", "staging CA")
	kv("certs", "node", "n1", "--ca-cert", path("cluster/ca.crt"), "--ca-key", path("cluster/ca.key"), "--out", path("cluster"))
	kv("certs", "node", "n1", "--ca-cert", path("other/ca.crt"), "--ca-key", path("other/ca.key"), "--out", path("other"))
	for _, tc := range []struct {
		name           string
		node, ca, cert string
		want           []string
	}{
		{"certificate from another CA", "n1", "cluster/ca.crt", "other/n1.crt",
			[]string{path("other/n1.crt"), `issued by "CN=staging CA`, `not the cluster CA "CN=prod CA`}},
		{"node certificate given as the CA", "n1", "cluster/n1.crt", "cluster/n1.crt",
			[]string{path("cluster/n1.crt"), "is not a CA certificate"}},
		{"certificate of another node", "n2", "cluster/ca.crt", "cluster/n1.crt",
			[]string{path("cluster/n1.crt"), `names node "n1", but this node is "n2"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			key := strings.TrimSuffix(tc.cert, ".crt") + ".key"
			cmd := exec.CommandContext(ctx, bin, "agent", "--local", "--node", tc.node, "--data-dir", data,
				"--gossip-addr", "127.0.0.1:0", "--peer-addr", "127.0.0.1:0", "--metrics-addr", "off", "--pool", "host=16MiB",
				"--ca", path(tc.ca), "--cert", path(tc.cert), "--key", path(key))
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("the agent started and ran (killed after 20 s):\n%s", out)
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() == 0 {
				t.Fatalf("exit %v, want a non-zero exit:\n%s", err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not say %q:\n%s", w, out)
				}
			}
			if strings.Contains(string(out), "agent started") {
				t.Errorf("the agent said it started:\n%s", out)
			}
			t.Logf("exit %d: %s", ee.ExitCode(), strings.TrimSpace(string(out)))
		})
	}
}

// syncBuffer collects a process's output.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An agent that cannot join (unreachable seed, wrong gossip key, wrong
// cluster name) says why at WARN, counts the tries, and is not healthy,
// instead of running alone in silence.
func TestJoinMistakesAreLoud(t *testing.T) {
	dir := t.TempDir()
	keyFile := func(name string, b byte) string {
		p := filepath.Join(dir, name)
		k := make([]byte, 16)
		for i := range k {
			k[i] = b + byte(i)
		}
		if err := os.WriteFile(p, []byte(base64.StdEncoding.EncodeToString(k)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good, bad := keyFile("good.key", 1), keyFile("bad.key", 100)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Start(ctx, Options{Bin: bin, Nodes: 1, Pool: "host=16MiB", ExtraArgs: []string{"--cluster", "prod", "--gossip-key-file", good}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	seed := c.Nodes[0].Gossip
	for i, tc := range []struct {
		name, join, cluster, key, reason string
	}{
		{"unreachable seed", c.net + "99:7946", "prod", good, "unreachable"},
		{"wrong gossip key", seed, "prod", bad, "wrong_key"},
		{"wrong cluster name", seed, "staging", good, "no_answer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := c.net + fmt.Sprint(20+i)
			data := t.TempDir()
			var out syncBuffer
			cmd := exec.Command(bin, "agent", "--local", "--node", fmt.Sprintf("lost%d", i), "--data-dir", data,
				"--dev-ca-dir", filepath.Join(c.Root, "ca"), "--gossip-addr", ip+":7946", "--peer-addr", ip+":7947",
				"--metrics-addr", ip+":7948", "--pool", "host=16MiB",
				"--join", tc.join, "--cluster", tc.cluster, "--gossip-key-file", tc.key)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				cmd.Process.Signal(syscall.SIGTERM)
				cmd.Wait()
				if t.Failed() {
					t.Logf("agent output:\n%s", out.String())
				}
			}()
			hc := http.Client{Timeout: time.Second}
			var code int
			var body string
			wait.For(t, 15*time.Second, "/healthz answers and the agent warns with the reason", func() error {
				if resp, err := hc.Get("http://" + ip + ":7948/healthz"); err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					code, body = resp.StatusCode, string(b)
				}
				warned := strings.Contains(out.String(), "level=WARN msg=\"membership: cannot join seed; retrying\"") &&
					strings.Contains(out.String(), "reason="+tc.reason)
				if code == 0 || !warned {
					return fmt.Errorf("/healthz %d %q, warned with reason %s: %v", code, body, tc.reason, warned)
				}
				return nil
			})
			if code != http.StatusServiceUnavailable || !strings.Contains(body, "not joined") || !strings.Contains(body, tc.join) {
				t.Errorf("/healthz: %d %q; want 503 not joined, naming %s", code, body, tc.join)
			}
			if v, err := metricValue(&Node{Name: "agent", Metrics: ip + ":7948"}, `kvfabric_gossip_join_failures_total{reason="`+tc.reason+`"}`); err != nil || v < 1 {
				t.Errorf("join failures with reason %s: %v, %v", tc.reason, v, err)
			}
			t.Logf("/healthz: %s", strings.TrimSpace(body))
		})
	}
}

// SIGHUP reloads an agent's identity (here, the development certificate it
// issues itself) and it goes on serving, in its cluster; before, SIGHUP
// ended the process without a leave.
func TestSIGHUPReloads(t *testing.T) {
	c := start(t, 2)
	n := c.Nodes[1]
	if err := n.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the agent logs its reload", func() error {
		if !strings.Contains(n.Log(), `msg="reloaded the TLS identity and gossip keys"`) {
			return errors.New("no reload logged")
		}
		return nil
	})
	if !n.Running() {
		t.Fatalf("%s exited on SIGHUP:\n%s", n.Name, n.Log())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitMembers(ctx, c.Nodes, 2); err != nil {
		t.Fatalf("after SIGHUP: %v", err)
	}
	// New connections use the reloaded identity: an import still works.
	w := Workload{Sequences: 1, Blocks: 4, PageSize: 16, Seed: 5}
	seqs := w.Hashes()
	p, err := Produce(ctx, c.Nodes[0], eng("producer", 1, layout.HND), seqs)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitIndexed(t, n, c.Nodes[0].Name, w.Unique())
	if _, err := Consume(ctx, n, eng("consumer", 2, layout.NHD), seqs); err != nil {
		t.Fatalf("import after SIGHUP: %v", err)
	}
}

// importResult is what an import started by importAsync came to, and when
// it returned.
type importResult struct {
	resp *fabricpb.ImportResponse
	err  error
	at   time.Time
}

// importAsync imports hashes into block set set through cl on a goroutine
// of its own; the function it returns waits for the result, failing the
// test if the import has not returned within 20 s.
func importAsync(t *testing.T, ctx context.Context, cl *client.Client, set uint64, hashes []uint64) func() importResult {
	done := make(chan importResult, 1)
	go func() {
		resp, err := cl.Import(ctx, set, hashes)
		done <- importResult{resp, err, time.Now()}
	}()
	return func() importResult {
		t.Helper()
		select {
		case r := <-done:
			return r
		case <-time.After(20 * time.Second):
			t.Fatal("import did not return")
			return importResult{}
		}
	}
}
