package netns

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/testbed"
)

// lanePort is the TCP lane's port in these tests.
const lanePort = 7949

// importVia imports hashes on r, checks every byte, and returns the
// transports of its fetches.
func (r *reader) importVia(ctx context.Context, hashes []uint64) ([]string, error) {
	resp, err := r.cl.Import(ctx, r.set.ID, hashes)
	if err != nil {
		return nil, err
	}
	if len(resp.Blocks) != len(hashes) {
		return nil, fmt.Errorf("%d of %d blocks: %s", len(resp.Blocks), len(hashes), resp.Error)
	}
	for j, b := range resp.Blocks {
		if err := kvtest.Check(r.set.Layout, r.set.Ranks, int(b.Slot), hashes[j]); err != nil {
			return nil, fmt.Errorf("%w: block %d: %w", errCorrupt, j, err)
		}
	}
	var via []string
	for _, f := range resp.Fetches {
		via = append(via, f.Transport)
	}
	return via, nil
}

// Agents as processes in their namespaces import over the TCP lane, every
// byte checked; with the lane's port blackholed on the reader (SYNs
// dropped, no reset) an import falls back to QUIC within the import
// timeout; once the port is open again and the lane's backoff has passed,
// imports go over the lane again.
func TestLaneBlackholeFallsBackToQUIC(t *testing.T) {
	const importTO = 30 * time.Second // the agents' default --import-timeout
	c := start(t, Options{Nodes: 2, ExtraArgs: []string{"--lane-addr", fmt.Sprintf(":%d", lanePort)}})
	ctx := ctxFor(t, 5*time.Minute)
	w := testbed.Workload{Sequences: 160, Blocks: 4, PageSize: 16, Seed: 25}
	hashes := w.Hashes()
	p, err := testbed.Produce(ctx, c.Nodes[0], tiny("producer", 160*4), hashes)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	waitBlocks(t, c, 1, c.Nodes[0].Name, uint64(w.Unique()))
	r, err := newReader(ctx, c.Nodes[1], tiny("reader", 160*4))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	via, err := r.importVia(ctx, hashes[0])
	if err != nil || len(via) != 1 || via[0] != "tcp" {
		t.Fatalf("import over the open lane: via %v, err %v; want tcp", via, err)
	}
	if err := c.BlackholeTCP(1, lanePort); err != nil {
		t.Fatal(err)
	}
	// The reader's lane connections from the first import are still
	// open; they carry nothing now. The next reads stall on them, then
	// on the dials of new ones, and fall back to QUIC.
	start := time.Now()
	via, err = r.importVia(ctx, hashes[1])
	took := time.Since(start)
	if err != nil {
		t.Fatalf("import with the lane blackholed: %v (after %v)", err, took)
	}
	if len(via) == 0 || via[len(via)-1] != "quic" {
		t.Errorf("import with the lane blackholed came over %v, want quic", via)
	}
	if took > importTO {
		t.Errorf("import with the lane blackholed took %v, past the import timeout %v", took, importTO)
	}
	t.Logf("fell back to QUIC in %v", took)
	// While the lane is backed off, imports go straight to QUIC.
	start = time.Now()
	via, err = r.importVia(ctx, hashes[2])
	if err != nil || len(via) != 1 || via[0] != "quic" {
		t.Fatalf("import during the lane's backoff: via %v, err %v", via, err)
	}
	t.Logf("an import during the backoff took %v", time.Since(start))
	if err := c.RestoreTCP(1); err != nil {
		t.Fatal(err)
	}
	k := 3
	wait.Every(t, 500*time.Millisecond, 60*time.Second, "an import over the lane after it opened", func() error {
		if k >= len(hashes) {
			t.Fatal("ran out of sequences")
		}
		via, err := r.importVia(ctx, hashes[k])
		k++
		if err != nil {
			return err
		}
		if len(via) != 1 || via[0] != "tcp" {
			return fmt.Errorf("came over %v", via)
		}
		return nil
	})
}

// A reader paused (SIGSTOP) while it imports over the lane stalls its
// lane connections mid-stream: the holder's writes block, and its leases
// still end within the lease duration plus the expiry sweep. Once the
// reader continues, its import call returns, without a wrong byte.
func TestLaneStalledReaderHoldsNoLeasePastItsTerm(t *testing.T) {
	const (
		ttl   = 2 * time.Second // --lease-duration
		sweep = time.Second     // the pool's lease expiry interval
		slack = 3 * time.Second // polling and the status call on loaded cores
	)
	c := start(t, Options{Nodes: 2, Pool: "host=512MiB",
		ExtraArgs: []string{"--lane-addr", fmt.Sprintf(":%d", lanePort), "--lease-duration", ttl.String(), "--peer-timeout", "10s"}})
	rec := testbed.NewScenarioRecord("lane-reader-paused", variant(), 2)
	defer save(t, rec)
	ctx := ctxFor(t, 5*time.Minute)
	w := testbed.Workload{Sequences: 1, Blocks: 400, PageSize: 16, Seed: 26}
	hashes := w.Hashes()
	p, err := testbed.Produce(ctx, c.Nodes[0], eng("producer", 512), hashes)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	// A slow link, so that the import is still moving when its reader
	// stops.
	if err := c.Shape(0, Link{RateBitsPerSec: 200_000_000}); err != nil {
		t.Fatal(err)
	}
	waitBlocks(t, c, 1, c.Nodes[0].Name, uint64(w.Unique()))
	r, err := newReader(ctx, c.Nodes[1], eng("reader", 512))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	done := make(chan error, 1)
	go func() {
		via, err := r.importVia(ctx, hashes[0])
		t.Logf("the paused reader's import: via %v, err %v", via, err)
		done <- err
	}()
	waitLeased(t, c, []int{0})
	if err := c.Pause(1); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	wait.For(t, 30*time.Second, "the holder's leases released", func() error {
		v, err := look(c.Nodes[0])
		if err != nil {
			return err
		}
		if v.leases != 0 {
			return fmt.Errorf("%d leases held", v.leases)
		}
		return nil
	})
	released := time.Since(paused)
	if released > ttl+sweep+slack {
		t.Errorf("leases released %v after the reader stopped, over TTL %v + sweep %v (+%v slack)", released, ttl, sweep, slack)
	}
	t.Logf("leases released %v after the reader stopped", released)
	if err := c.Resume(1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if errors.Is(err, errCorrupt) {
			t.Fatal(err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the paused reader's import call did not return")
	}
}
