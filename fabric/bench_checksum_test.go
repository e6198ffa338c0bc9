package fabric_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
)

// BenchmarkImportChecksums measures what content checksums cost an
// import: two pairs of agents in this process, one with checksums (the
// default) and one with NoChecksums, import the same
// -kvfabric.bench.import bytes (64 MiB by default) of benchModel blocks,
// TP 4 to TP 2 over QUIC, in batches of 16 blocks 4 at a time, in every
// iteration one after the other. It reports each pair's import time and
// on/off, the ratio (the holder's sum at registration is not in it: it is
// the engine's RegisterBlocks call).
func BenchmarkImportChecksums(b *testing.B) {
	blockBytes := uint64(benchModel.Layers) * 2 * uint64(benchModel.KVHeads*benchModel.HeadDim*benchPage) * benchModel.DType.Size()
	nblocks := max(1, int(uint64(*benchImportSize)/blockBytes))
	const batch, inflight = 16, 4
	size := uint64(nblocks) * blockBytes
	root, err := os.MkdirTemp("", "kvfbc")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(root) })
	caDir := filepath.Join(root, "ca")
	poolSpec := fmt.Sprintf("host=%d", size+size/8+64<<20)
	type pair struct {
		name   string
		cA, cB *client.Client
		setA   *client.BlockSet
		setB   *client.BlockSet
		slotsA []uint32
		took   time.Duration
	}
	mk := func(name, ipA, ipB string, off bool) *pair {
		dir := filepath.Join(root, name)
		conf := func(c *fabric.Config) { c.MaxLeasedPerPeer, c.NoChecksums = nblocks, off }
		a := startBenchAgentWith(b, dir, caDir, "a", ipA, poolSpec, "", conf)
		bb := startBenchAgentWith(b, dir, caDir, "b", ipB, poolSpec, a.GossipAddr(), func(c *fabric.Config) { c.NoChecksums = off })
		p := &pair{name: name, cA: benchDial(b, a), cB: benchDial(b, bb)}
		ctx := context.Background()
		if p.setA, err = p.cA.Register(ctx, client.Engine{Name: "producer", Model: benchModel, TPSize: benchTPA, PageSize: benchPage, Order: layout.HND, Slots: nblocks}); err != nil {
			b.Fatal(err)
		}
		if p.setB, err = p.cB.Register(ctx, client.Engine{Name: "consumer", Model: benchModel, TPSize: benchTPB, PageSize: benchPage, Order: layout.HND, Slots: nblocks}); err != nil {
			b.Fatal(err)
		}
		return p
	}
	on := mk("on", "127.0.0.71", "127.0.0.72", false)
	off := mk("off", "127.0.0.73", "127.0.0.74", true)
	iter := 0
	run := func(p *pair) {
		ctx := context.Background()
		if p.slotsA != nil {
			if err := p.cA.Release(ctx, p.setA.ID, p.slotsA); err != nil {
				b.Fatal(err)
			}
		}
		var hashes []uint64
		if hashes, p.slotsA, err = benchProduce(p.cA, p.setA, iter, nblocks, batch); err != nil {
			b.Fatal(err)
		}
		if err := benchAwaitIndex(p.cB, hashes, batch); err != nil {
			b.Fatal(err)
		}
		got := make([]uint32, nblocks)
		start := time.Now()
		var wg sync.WaitGroup
		errs := make(chan error, (nblocks+batch-1)/batch)
		sem := make(chan struct{}, inflight)
		for first := 0; first < nblocks; first += batch {
			n := min(batch, nblocks-first)
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				resp, err := p.cB.Import(ctx, p.setB.ID, hashes[first:first+n])
				if err == nil && len(resp.Blocks) != n {
					err = fmt.Errorf("%s: imported %d of %d blocks: %s", p.name, len(resp.Blocks), n, resp.Error)
				}
				if err != nil {
					errs <- err
					return
				}
				for i, r := range resp.Blocks {
					got[first+i] = r.Slot
				}
			})
		}
		wg.Wait()
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
		p.took += time.Since(start)
		if err := p.cB.Release(ctx, p.setB.ID, got); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(2 * size))
	for b.Loop() {
		iter++
		run(on)
		run(off)
	}
	n := float64(iter)
	b.ReportMetric(on.took.Seconds()*1e3/n, "ms-on")
	b.ReportMetric(off.took.Seconds()*1e3/n, "ms-off")
	b.ReportMetric(on.took.Seconds()/off.took.Seconds(), "on/off")
	b.Logf("%d blocks of %d KiB (%d MiB) per import, TP %d -> TP %d, %d iterations", nblocks, blockBytes>>10, size>>20, benchTPA, benchTPB, iter)
}
