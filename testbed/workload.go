package testbed

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/netbench"
	"github.com/kvfabric/kvfabric/layout"
)

// Workload is a set of token sequences that share a prefix, as prompts
// with one system prompt do.
type Workload struct {
	Sequences    int // number of sequences
	Blocks       int // blocks per sequence
	SharedPrefix int // leading blocks every sequence shares
	PageSize     int
	Seed         uint64
}

// Hashes returns each sequence's block hashes.
func (w Workload) Hashes() [][]uint64 {
	h, _ := layout.NewHasher(w.PageSize, layout.HashOptions{})
	rng := rand.New(rand.NewPCG(w.Seed, 1))
	prefix := make([]uint32, w.SharedPrefix*w.PageSize)
	for i := range prefix {
		prefix[i] = rng.Uint32N(128000)
	}
	out := make([][]uint64, w.Sequences)
	for s := range out {
		tokens := slices.Clone(prefix)
		for range (w.Blocks - w.SharedPrefix) * w.PageSize {
			tokens = append(tokens, rng.Uint32N(128000))
		}
		for _, b := range h.Sequence(tokens) {
			out[s] = append(out[s], b.Sequence)
		}
	}
	return out
}

// Unique returns the distinct blocks of the workload.
func (w Workload) Unique() int { return w.SharedPrefix + w.Sequences*(w.Blocks-w.SharedPrefix) }

// Produce stores every sequence on node as engine e: each block's bytes
// encode its sequence hash and position (internal/kvtest), so importers
// can check every byte. The blocks stay referenced by the returned
// client's engine until it is closed.
func Produce(ctx context.Context, n *Node, e client.Engine, seqs [][]uint64) (*client.Client, error) {
	c, err := n.Client(ctx)
	if err != nil {
		return nil, err
	}
	set, err := c.Register(ctx, e)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: register: %w", n.Name, err)
	}
	for i, hashes := range seqs {
		slots, err := c.Allocate(ctx, set.ID, len(hashes))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("%s: sequence %d: %w", n.Name, i, err)
		}
		for j, s := range slots {
			kvtest.Fill(set.Layout, set.Ranks, int(s), hashes[j])
		}
		if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
			c.Close()
			return nil, fmt.Errorf("%s: sequence %d: %w", n.Name, i, err)
		}
	}
	return c, nil
}

// Report is what a consumer's imports did.
type Report struct {
	Node     string
	Imports  int
	Blocks   int // blocks copied in: over the network, or locally from another engine's block set
	Bytes    uint64
	Elapsed  time.Duration   // in import calls, verification excluded
	PerBlock []time.Duration // one per block fetched: its fetch's time / its blocks
	From     map[string]int  // blocks per holder
	// Transports counts blocks by the transport their fetch reported
	// ("rdma", "quic", "rdma+quic", "local").
	Transports map[string]int
	Verified   int // blocks checked element by element
}

// GBps is the bytes moved over the time the imports took.
func (r *Report) GBps() float64 { return float64(r.Bytes) / max(float64(r.Elapsed.Nanoseconds()), 1) }

// Percentile returns the p-th quantile (0.5, 0.99) of per-block latency.
func (r *Report) Percentile(p float64) time.Duration {
	d, _ := netbench.Percentile(r.PerBlock, 100*p)
	return d
}

// Sources lists the holders blocks came from, with counts.
func (r *Report) Sources() string {
	var names []string
	for n := range r.From {
		names = append(names, n)
	}
	sort.Strings(names)
	s := ""
	for i, n := range names {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s (%d)", n, r.From[n])
	}
	return s
}

// Consume imports every sequence on node as engine e, one import per
// sequence, and checks every byte of every block against what Produce
// wrote, whatever the layouts on either side.
func Consume(ctx context.Context, n *Node, e client.Engine, seqs [][]uint64) (*Report, error) {
	c, err := n.Client(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	set, err := c.Register(ctx, e)
	if err != nil {
		return nil, fmt.Errorf("%s: register: %w", n.Name, err)
	}
	r := &Report{Node: n.Name, From: map[string]int{}, Transports: map[string]int{}}
	for i, hashes := range seqs {
		start := time.Now()
		resp, err := c.Import(ctx, set.ID, hashes)
		r.Elapsed += time.Since(start)
		if err != nil {
			return r, fmt.Errorf("%s: import of sequence %d: %w", n.Name, i, err)
		}
		r.Imports++
		if len(resp.Blocks) != len(hashes) {
			return r, fmt.Errorf("%s: sequence %d: %d of %d blocks imported: %s", n.Name, i, len(resp.Blocks), len(hashes), resp.Error)
		}
		account(r, resp.Fetches)
		for j, b := range resp.Blocks {
			if b.Hash != hashes[j] {
				return r, fmt.Errorf("%s: sequence %d block %d: got hash %d, want %d", n.Name, i, j, b.Hash, hashes[j])
			}
			if err := kvtest.Check(set.Layout, set.Ranks, int(b.Slot), hashes[j]); err != nil {
				return r, fmt.Errorf("%s: sequence %d block %d: %w", n.Name, i, j, err)
			}
			r.Verified++
		}
	}
	return r, nil
}

func account(r *Report, fetches []*fabricpb.Fetch) {
	for _, f := range fetches {
		r.Blocks += int(f.Blocks)
		r.Bytes += f.Bytes
		from := f.Node
		if f.Transport == "local" {
			from += "/local"
		}
		r.From[from] += int(f.Blocks)
		if r.Transports != nil {
			r.Transports[f.Transport] += int(f.Blocks)
		}
		if f.Blocks > 0 {
			per := time.Duration(f.Micros) * time.Microsecond / time.Duration(f.Blocks)
			for range f.Blocks {
				r.PerBlock = append(r.PerBlock, per)
			}
		}
	}
}
