package testbed

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/testbed/report"
)

// SweepOptions configure a throughput sweep.
type SweepOptions struct {
	// Bin is the kvfabric binary. Required.
	Bin string
	// Model is the engines' model config; block size is set by the page
	// size. If zero, 4 layers, 8 KV heads, head dim 128, bf16 (16 KiB a
	// token).
	Model layout.ModelConfig
	// PageSizes are the block sizes to run, in tokens. Required.
	PageSizes []int
	// ChunkBytes are the agents' --import-chunk-bytes to run. Required.
	ChunkBytes []int
	// Bytes is how much one run imports. If zero, 64 MiB.
	Bytes int
}

// Sweep runs one import per (page size, chunk size) between two fresh
// agents on loopback, every byte checked, and returns the throughput of
// each, for the report's throughput plots.
func Sweep(ctx context.Context, o SweepOptions) ([]report.Throughput, error) {
	if o.Bin == "" || len(o.PageSizes) == 0 || len(o.ChunkBytes) == 0 {
		return nil, errors.New("testbed: sweep: Bin, PageSizes and ChunkBytes are required")
	}
	if o.Model == (layout.ModelConfig{}) {
		o.Model = layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeBF16}
	}
	if o.Bytes <= 0 {
		o.Bytes = 64 << 20
	}
	var out []report.Throughput
	for _, page := range o.PageSizes {
		blockBytes := int(o.Model.BlockBytes(page))
		blocks := max(o.Bytes/blockBytes, 1)
		pool := fmt.Sprintf("host=%dMiB", (3*blocks*blockBytes)>>20+64)
		for _, chunk := range o.ChunkBytes {
			c, err := Start(ctx, Options{Bin: o.Bin, Nodes: 2, Pool: pool, ExtraArgs: []string{"--import-chunk-bytes", strconv.Itoa(chunk)}})
			if err != nil {
				return out, fmt.Errorf("testbed: sweep: page %d, chunk %d: %w", page, chunk, err)
			}
			gbps, err := sweepOne(ctx, c, o.Model, page, blocks)
			c.Close()
			if err != nil {
				return out, fmt.Errorf("testbed: sweep: page %d, chunk %d: %w", page, chunk, err)
			}
			out = append(out, report.Throughput{BlockBytes: blockBytes, ChunkBytes: chunk, GBps: gbps})
		}
	}
	return out, nil
}

func sweepOne(ctx context.Context, c *Cluster, m layout.ModelConfig, page, blocks int) (float64, error) {
	w := Workload{Sequences: 1, Blocks: blocks, PageSize: page, Seed: uint64(page)}
	seqs := w.Hashes()
	e := client.Engine{Name: "sweep", Model: m, TPSize: 1, PageSize: page, Order: layout.HND, Slots: blocks + 8}
	p, err := Produce(ctx, c.Nodes[0], e, seqs)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	if err := c.Nodes[1].WaitIndexed(ctx, c.Nodes[0].Name, seqs[0]); err != nil {
		return 0, err
	}
	r, err := Consume(ctx, c.Nodes[1], e, seqs)
	if err != nil {
		return 0, err
	}
	if r.Verified != blocks {
		return 0, fmt.Errorf("%d of %d blocks verified", r.Verified, blocks)
	}
	return r.GBps(), nil
}
