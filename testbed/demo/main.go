// Command demo runs kvfabric's demonstration: a three-node cluster on this
// machine's loopback, blocks stored by a TP 4 engine on node 1, imported by
// a TP 2 engine on node 2 and a TP 8 engine on node 3 with every byte
// checked against the re-sharding, then node 1 stopped and node 3
// importing the blocks it lacks from node 2 alone (and copying locally
// those it holds under another layout). `make demo` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/testbed"
)

func main() {
	bin := flag.String("bin", "bin/kvfabric", "the kvfabric binary")
	sequences := flag.Int("sequences", 12, "sequences stored on node 1")
	blocks := flag.Int("blocks", 32, "blocks per sequence")
	prefix := flag.Int("shared-prefix", 8, "leading blocks all sequences share (a system prompt)")
	layers := flag.Int("layers", 16, "model layers (8 KV heads, head dim 128, bf16, 16 tokens per block)")
	keep := flag.Bool("keep", false, "keep the cluster's logs (printed path) instead of removing them")
	flag.Parse()
	if err := run(*bin, *sequences, *blocks, *prefix, *layers, *keep); err != nil {
		fmt.Fprintf(os.Stderr, "\ndemo failed: %v\n", err)
		os.Exit(1)
	}
}

func step(format string, args ...any) { fmt.Printf("\n==> "+format+"\n", args...) }

// withLane has an agent serve the TCP data lane on its peer address's host
// (a free port, which readers learn over QUIC), so that blocks between
// nodes move over TLS on TCP, as they do on a cluster without RDMA.
func withLane(_ int, args []string) []string {
	for k := 0; k+1 < len(args); k++ {
		if args[k] == "--peer-addr" {
			host, _, err := net.SplitHostPort(args[k+1])
			if err == nil {
				return append(args, "--lane-addr", net.JoinHostPort(host, "0"))
			}
		}
	}
	return args
}

func run(bin string, sequences, blocks, prefix, layers int, keep bool) (err error) {
	if sequences < 1 || blocks < 1 || prefix < 0 || prefix > blocks || layers < 1 {
		return errors.New("need sequences >= 1, blocks >= 1, 0 <= shared-prefix <= blocks, layers >= 1")
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%s: %w (make build)", bin, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	began := time.Now()

	w := testbed.Workload{Sequences: sequences, Blocks: blocks, SharedPrefix: prefix, PageSize: 16, Seed: 2026}
	model := layout.ModelConfig{Layers: layers, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	blockBytes := uint64(layers) * 2 * 8 * 128 * 2 * 16
	slots := w.Unique() + 16
	poolMiB := (2*uint64(slots)*blockBytes)>>20 + 64

	step("starting 3 agents on loopback (development CA, %d MiB host pools)", poolMiB)
	c, err := testbed.Start(ctx, testbed.Options{Bin: bin, Nodes: 3, Pool: fmt.Sprintf("host=%dMiB", poolMiB), Launch: withLane})
	if err != nil {
		return err
	}
	defer func() {
		if keep {
			fmt.Printf("\nlogs kept in %s\n", c.Root)
			for _, n := range c.Nodes {
				n.Stop(syscall.SIGTERM, 10*time.Second)
			}
			return
		}
		if cerr := c.Close(); cerr != nil && err == nil {
			err = cerr
		}
		fmt.Printf("\nstopped every agent and removed %s\n", c.Root)
	}()
	n1, n2, n3 := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	for _, n := range c.Nodes {
		fmt.Printf("    %s  gossip %s  peer (QUIC) %s  metrics http://%s/metrics\n", n.Name, n.Gossip, n.Peer, n.Metrics)
	}

	seqs := w.Hashes()
	step("node1: a TP 4 (HND) engine stores %d sequences of %d blocks sharing a %d-block prefix: %d blocks of %s (Llama-like: %d layers, 8 KV heads, head dim 128, bf16)",
		sequences, blocks, prefix, w.Unique(), size(blockBytes), layers)
	producer, err := testbed.Produce(ctx, n1, engine("producer", model, 4, layout.HND, slots), seqs)
	if err != nil {
		return err
	}
	defer producer.Close()
	if err := waitIndexed(ctx, []*testbed.Node{n2, n3}, n1.Name, w.Unique()); err != nil {
		return err
	}
	fmt.Printf("    node2 and node3 index %d blocks on node1 (store events gossiped)\n", w.Unique())
	if err := showLookup(ctx, n2, seqs[0]); err != nil {
		return err
	}

	var reports []*phase
	step("node2: a TP 2 (NHD) engine imports every sequence; every element checked against the re-sharding")
	r, err := testbed.Consume(ctx, n2, engine("consumer-tp2", model, 2, layout.NHD, slots), seqs)
	if err != nil {
		return err
	}
	reports = append(reports, &phase{"node2 TP 2 NHD <- node1 TP 4 HND", r})
	show(r)

	half := seqs[:(len(seqs)+1)/2]
	step("node3: a TP 8 (HND) engine imports the first %d sequences from node1 and node2", len(half))
	if err := waitIndexed(ctx, []*testbed.Node{n3}, n2.Name, w.Unique()); err != nil {
		return err
	}
	r, err = testbed.Consume(ctx, n3, engine("consumer-tp8", model, 8, layout.HND, slots), half)
	if err != nil {
		return err
	}
	reports = append(reports, &phase{"node3 TP 8 HND <- both", r})
	show(r)

	step("stopping node1 (SIGTERM: it leaves the cluster)")
	if err := n1.Stop(syscall.SIGTERM, 10*time.Second); err != nil {
		return err
	}
	if err := c.WaitMembers(ctx, []*testbed.Node{n2, n3}, 2); err != nil {
		return err
	}
	fmt.Println("    node2 and node3 see 2 members; node1's blocks are out of their indexes")

	step("node3: a second engine (TP 2, HND) imports every sequence: what node3 holds is copied locally, the rest comes from node2, the only holder left")
	r, err = testbed.Consume(ctx, n3, engine("consumer-tp2-hnd", model, 2, layout.HND, slots), seqs)
	if err != nil {
		return err
	}
	reports = append(reports, &phase{"node3 TP 2 HND <- node2, own TP 8", r})
	show(r)
	if r.From[n2.Name] == 0 {
		return fmt.Errorf("node3 imported nothing from node2 after node1 stopped: %s", r.Sources())
	}
	for from := range r.From {
		if strings.HasPrefix(from, n1.Name) {
			return fmt.Errorf("node3 imported from %s after node1 stopped", from)
		}
	}

	step("summary (every block verified element by element; between nodes the TCP lane, TLS 1.3 with mutual authentication, NAME/local a copy between engines of one node)")
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "IMPORT\tFROM\tBLOCKS IN\tBYTES\tGB/s\tp50/block\tp99/block\tVERIFIED\t")
	for _, p := range reports {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%.2f\t%v\t%v\t%d\t\n", p.name, p.r.Sources(), p.r.Blocks, size(p.r.Bytes),
			p.r.GBps(), p.r.Percentile(0.5).Round(10*time.Microsecond), p.r.Percentile(0.99).Round(10*time.Microsecond), p.r.Verified)
	}
	tw.Flush()
	fmt.Printf("\ndemo passed in %v\n", time.Since(began).Round(100*time.Millisecond))
	return nil
}

type phase struct {
	name string
	r    *testbed.Report
}

func engine(name string, m layout.ModelConfig, tp int, order layout.KVOrder, slots int) client.Engine {
	return client.Engine{Name: name, Model: m, TPSize: tp, PageSize: 16, Order: order, Slots: slots}
}

func show(r *testbed.Report) {
	fmt.Printf("    %d imports, %d blocks (%s) brought in from %s over %s: %.2f GB/s, per block p50 %v p99 %v; %d blocks verified\n",
		r.Imports, r.Blocks, size(r.Bytes), r.Sources(), transports(r), r.GBps(), r.Percentile(0.5).Round(10*time.Microsecond),
		r.Percentile(0.99).Round(10*time.Microsecond), r.Verified)
}

// transports names the transports that brought r's blocks ("tcp" is the
// lane) with their block counts.
func transports(r *testbed.Report) string {
	names := make([]string, 0, len(r.Transports))
	for t := range r.Transports {
		names = append(names, t)
	}
	sort.Strings(names)
	for i, t := range names {
		names[i] = fmt.Sprintf("%s (%d)", t, r.Transports[t])
	}
	return strings.Join(names, ", ")
}

// waitIndexed waits until each node's index holds want blocks of holder.
func waitIndexed(ctx context.Context, nodes []*testbed.Node, holder string, want int) error {
	for _, n := range nodes {
		for {
			got, err := indexed(ctx, n, holder)
			if err == nil && got == want {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s indexes %d blocks of %s, want %d: %w", n.Name, got, holder, want, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func indexed(ctx context.Context, n *testbed.Node, holder string) (int, error) {
	c, err := n.Client(ctx)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	s, err := c.Status(ctx)
	if err != nil {
		return 0, err
	}
	for _, m := range s.Members {
		if m.Node == holder && m.State == "alive" {
			return int(m.Blocks), nil
		}
	}
	return 0, nil
}

func showLookup(ctx context.Context, n *testbed.Node, hashes []uint64) error {
	c, err := n.Client(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	ov, err := c.Lookup(ctx, hashes)
	if err != nil {
		return err
	}
	var parts []string
	for _, o := range ov {
		parts = append(parts, fmt.Sprintf("%s %d blocks (score %.2f)", o.Node, o.Blocks, o.Score))
	}
	fmt.Printf("    lookup of sequence 0 on node2: %s\n", strings.Join(parts, ", "))
	return nil
}

func size(n uint64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", n>>10)
}
