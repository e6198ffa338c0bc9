package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer"
)

// tinyModel has blocks of 512 bytes (4 KiB with the engine API's
// alignment), so that tens of thousands of them fit a test's memory.
var tinyModel = layout.ModelConfig{Layers: 1, KVHeads: 1, HeadDim: 8, DType: layout.DTypeF16}

// registerBatch bounds the blocks of one RegisterBlocks call of
// produceBlocks.
const registerBatch = 4096

// produceBlocks registers n blocks with content ids 1..n in a new block set
// of e on a, and waits until on indexes all of them. It returns their
// sequence hashes.
func produceBlocks(t *testing.T, a, on *fabric.Agent, e client.Engine, n int) []uint64 {
	t.Helper()
	ctx := context.Background()
	c := dial(t, a)
	set := register(t, c, e)
	tokens := make([]uint32, e.PageSize*n)
	for i := range tokens {
		tokens[i] = uint32(i*7 + 3)
	}
	h, _ := layout.NewHasher(e.PageSize, layout.HashOptions{})
	var hashes []uint64
	for _, b := range h.Sequence(tokens) {
		hashes = append(hashes, b.Sequence)
	}
	for from := 0; from < n; from += registerBatch {
		to := min(from+registerBatch, n)
		slots, err := c.Allocate(ctx, set.ID, to-from)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range slots {
			kvtest.Fill(set.Layout, set.Ranks, int(s), uint64(from+i+1))
		}
		if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes[from:to]); err != nil {
			t.Fatal(err)
		}
	}
	wait.For(t, 60*time.Second, fmt.Sprintf("%s indexes %s's %d blocks", on.NodeName(), a.NodeName(), n), func() error {
		if got := agentStatus(t, on).Members[a.NodeName()]; got != uint64(n) {
			return fmt.Errorf("%d indexed", got)
		}
		return nil
	})
	return hashes
}

// produceAndImport produces n blocks of e on from (produceBlocks), imports
// all of them on to into a new block set of e's layout, and checks that
// every block arrived with every byte.
func produceAndImport(t *testing.T, from, to *fabric.Agent, e client.Engine, n int) {
	t.Helper()
	hashes := produceBlocks(t, from, to, e, n)
	c := dial(t, to)
	e.Name = "importer"
	set := register(t, c, e)
	resp, err := c.Import(context.Background(), set.ID, hashes)
	if err != nil || len(resp.Blocks) != n {
		t.Fatalf("import of %d blocks: %v, %d blocks (%s)", n, err, len(resp.GetBlocks()), resp.GetError())
	}
	checkImported(t, set, resp.Blocks, 1)
}

// checkImported checks that blocks hold content ids first, first+1, ...
func checkImported(t *testing.T, set *client.BlockSet, blocks []*fabricpb.BlockRef, first uint64) {
	t.Helper()
	for i, b := range blocks {
		if err := kvtest.Check(set.Layout, set.Ranks, int(b.Slot), first+uint64(i)); err != nil {
			t.Fatalf("block %d (slot %d): %v", i, b.Slot, err)
		}
	}
}

// An import of as many blocks as the engine API allows (65,536) moves in
// chunks that fit the lease limit, byte for byte; one block more is
// refused before anything moves.
func TestImportAtEngineLimit(t *testing.T) {
	const n = 1 << 16 // the engine API's limit on one request
	const slots = n + 1
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		c.Pools = []string{"host=300MiB"}
		// The test checks that a healthy holder is not blamed, not how
		// soon a dead one is: the 1 s of the other tests is too short for
		// a peer call of a 4,096-block chunk on two loaded cores.
		c.PeerTimeout = 10 * time.Second
	})
	n1, n2 := agents[0], agents[1]
	e := client.Engine{Name: "long", Model: tinyModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: slots}
	hashes := produceBlocks(t, n1, n2, e, n)

	ctx := context.Background()
	c := dial(t, n2)
	e.Name = "long-importer"
	set := register(t, c, e)
	if _, err := c.Import(ctx, set.ID, append(hashes, 1)); code(err) != codes.InvalidArgument {
		t.Fatalf("import of %d hashes: %v, want InvalidArgument", n+1, err)
	}
	start := time.Now()
	resp, err := c.Import(ctx, set.ID, hashes)
	if err != nil {
		t.Fatalf("import of %d blocks: %v", n, err)
	}
	elapsed := time.Since(start)
	if len(resp.Blocks) != n {
		t.Fatalf("import of %d blocks brought %d: %s", n, len(resp.Blocks), resp.Error)
	}
	checkImported(t, set, resp.Blocks, 1)
	chunks := (n + transfer.MaxLeaseBlocks - 1) / transfer.MaxLeaseBlocks
	if got := fabric.ImportChunks(n2); got != uint64(chunks) {
		t.Errorf("import of %d blocks took %d chunks, want %d of at most %d blocks", n, got, chunks, transfer.MaxLeaseBlocks)
	}
	if fabric.Suspect(n2, "n1") {
		t.Errorf("a healthy holder became a suspect: %q %v", resp.Error, resp.Fetches)
	}
	t.Logf("%d blocks in %d chunks in %v (%.0f blocks/s)", n, chunks, elapsed, float64(n)/elapsed.Seconds())
}

// A holder that dies in the middle of an import leaves the importer with
// every chunk that arrived whole before, verified byte for byte, and an
// error for the rest.
func TestImportKeepsWholeChunksWhenHolderDies(t *testing.T) {
	const (
		perChunk  = 32           // 1 MiB chunks of 32 KiB blocks (testModel at TP 1)
		n         = 6 * perChunk // whole chunks: an import's are cut even
		keepAfter = 2
	)
	var holder atomic.Pointer[fabric.Agent]
	var closeOnce sync.Once
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i != 1 {
			return
		}
		c.ImportChunkBytes = 1 << 20
		fabric.OnChunkRegistered(c, func(_ string, blocks int) {
			if blocks >= keepAfter*perChunk {
				closeOnce.Do(func() { holder.Load().Close() })
			}
		})
	})
	n1, n2 := agents[0], agents[1]
	holder.Store(n1)
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 256}
	hashes := produceBlocks(t, n1, n2, e, n)

	ctx := context.Background()
	c := dial(t, n2)
	e.Name = "importer"
	set := register(t, c, e)
	resp, err := c.Import(ctx, set.ID, hashes)
	if err != nil {
		t.Fatalf("import whose holder died after %d chunks: %v (want the chunks read, and an error in the response)", keepAfter, err)
	}
	if len(resp.Blocks) != keepAfter*perChunk || resp.Error == "" {
		t.Fatalf("import whose holder died after %d chunks of %d kept %d blocks (error %q), want %d and an error",
			keepAfter, perChunk, len(resp.Blocks), resp.Error, keepAfter*perChunk)
	}
	checkImported(t, set, resp.Blocks, 1)
}

// A read that outlives the holder's lease term renews the lease and
// arrives whole; the holder grants its own term, not the importer's.
func TestImportRenewsLeaseForLongRead(t *testing.T) {
	var stall sync.Once
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		// Silent peers are given long enough for the stalled read.
		c.PeerTimeout = 20 * time.Second
		if i == 0 {
			c.LeaseDuration = time.Second
			fabric.BeforeServeRead(c, func(string, uint64) {
				stall.Do(func() { time.Sleep(2500 * time.Millisecond) })
			})
		} else {
			c.LeaseDuration = time.Minute
		}
	})
	n1, n2 := agents[0], agents[1]
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 16}
	hashes := produceBlocks(t, n1, n2, e, 8)
	ctx := context.Background()
	c := dial(t, n2)
	e.Name, e.Order = "importer", layout.HND
	set := register(t, c, e)
	resp, err := c.Import(ctx, set.ID, hashes)
	if err != nil || len(resp.Blocks) != len(hashes) {
		t.Fatalf("import whose read outlived the 1 s lease twice over: %v %v", resp, err)
	}
	checkImported(t, set, resp.Blocks, 1)
	// A 1 s term renewed at half term over a 2.5 s read: at least 3.
	if got := fabric.LeaseRenewals(n2); got < 3 {
		t.Errorf("%d lease renewals during a 2.5 s read under a 1 s term, want at least 3", got)
	}
}

// A renewal the holder refuses, its lease past --max-lease-age, fails the
// read under it as any lost lease does: the import falls over to another
// holder, comes back for the block only the first one holds under a new
// lease, and brings every block byte-exact. Renewals up to the max age
// were granted. With a 4 s term and a 3 s max age the stalled read's
// lease is renewed at 2 s (granted if it comes up to 1 s late) and at 4 s
// (refused, and counted if it comes before the lease ends at 6 s): wide
// margins on loaded cores, about 4 s in all.
func TestImportFailsOverPastMaxLeaseAge(t *testing.T) {
	var stalled atomic.Uint64 // the first lease read under on the holder
	unblock := make(chan struct{})
	agents := clusterWith(t, 3, func(i int, c *fabric.Config) {
		// Only the refused renewal ends the stalled read.
		c.PeerTimeout = 60 * time.Second
		if i == 0 {
			c.LeaseDuration, c.MaxLeaseAge = 4*time.Second, 3*time.Second
			fabric.BeforeServeRead(c, func(_ string, lease uint64) {
				if stalled.CompareAndSwap(0, lease) || stalled.Load() == lease {
					<-unblock
				}
			})
		}
	})
	t.Cleanup(func() { close(unblock) }) // before the agents close
	stalling, importer, other := agents[0], agents[1], agents[2]
	e := client.Engine{Name: "holder", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 16}
	hashes := sumHashes(5, 8)
	holdBlocks(t, stalling, e, hashes, 1)
	holdBlocks(t, other, e, hashes[:7], 1)
	waitHeld(t, importer, stalling, 8)
	waitHeld(t, importer, other, 7)
	c := dial(t, importer)
	e.Name, e.TPSize, e.Order = "importer", 1, layout.HND
	set := register(t, c, e)
	resp, err := c.Import(context.Background(), set.ID, hashes)
	if err != nil || len(resp.GetBlocks()) != len(hashes) {
		t.Fatalf("import past a refused renewal: %v %v", resp, err)
	}
	checkImported(t, set, resp.GetBlocks(), 1)
	nodes := map[string]bool{}
	for _, f := range resp.GetFetches() {
		nodes[f.GetNode()] = true
	}
	if !nodes[stalling.NodeName()] || !nodes[other.NodeName()] {
		t.Errorf("fetched from %v, want %s and %s", nodes, stalling.NodeName(), other.NodeName())
	}
	if got := stalling.Metrics().LeaseRenewalsRefused; got != 1 {
		t.Errorf("the holder refused %d renewals, want the stalled read's 1", got)
	}
	if got := fabric.LeaseRenewals(importer); got < 1 {
		t.Errorf("%d renewals granted before the max lease age, want at least 1", got)
	}
}

// A holder refusing what the import itself asked for (blocks of another
// page size) is not blamed: it stays first in line for other imports.
func TestImportRefusalIsNotTheHoldersFault(t *testing.T) {
	agents := cluster(t, 2)
	n1, n2 := agents[0], agents[1]
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 16}
	hashes := produceBlocks(t, n1, n2, e, 4)
	ctx := context.Background()
	c := dial(t, n2)
	e.Name, e.PageSize = "page32", 32
	set := register(t, c, e)
	_, err := c.Import(ctx, set.ID, hashes)
	if err == nil {
		t.Fatal("import of page-16 blocks into a page-32 block set by their page-16 hashes succeeded")
	}
	if fabric.Suspect(n2, "n1") {
		t.Errorf("the holder is a suspect after refusing a page mismatch the importer caused (%v)", err)
	}
}

// Concurrent imports from a holder whose lease cap for this node is below
// what they ask for together all complete: a lease past the cap is cut to
// what fits, a refused one is asked again as the others' leases end, and
// the busy holder is not blamed.
func TestImportsWaitForRoomUnderLeaseCap(t *testing.T) {
	const (
		importers = 4
		each      = 16
		capPeer   = 8
	)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i == 0 {
			c.MaxLeasedPerPeer = capPeer
		}
		// A refused lease is asked again for up to PeerTimeout, while the
		// other importers' reads end: on two loaded cores that can take
		// longer than the 1 s of the other tests.
		c.PeerTimeout = 10 * time.Second
	})
	n1, n2 := agents[0], agents[1]
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.HND, Slots: 128}
	hashes := produceBlocks(t, n1, n2, e, importers*each)
	ctx := context.Background()
	c := dial(t, n2)
	e.Name = "importer"
	set := register(t, c, e)
	errs := make(chan error, importers)
	for i := range importers {
		go func() {
			resp, err := c.Import(ctx, set.ID, hashes[i*each:(i+1)*each])
			if err == nil && len(resp.Blocks) != each {
				err = fmt.Errorf("importer %d brought %d of %d blocks: %s", i, len(resp.Blocks), each, resp.Error)
			}
			if err == nil {
				for j, b := range resp.Blocks {
					if err = kvtest.Check(set.Layout, set.Ranks, int(b.Slot), uint64(i*each+j+1)); err != nil {
						break
					}
				}
			}
			errs <- err
		}()
	}
	// Every importer is waited for before the test fails: the set's memory
	// is unmapped at cleanup, under any importer still checking it.
	var failed []error
	for range importers {
		if err := <-errs; err != nil {
			failed = append(failed, err)
		}
	}
	if len(failed) > 0 {
		t.Fatal(errors.Join(failed...))
	}
	if fabric.Suspect(n2, "n1") {
		t.Error("a holder at its lease cap became a suspect")
	}
}

// A holder whose per-peer lease cap is one chunk, or between one and two,
// serves a long import whole: the lease taken ahead is cut to what fits
// (or waits), and the import goes on with the same holder, which is not
// blamed.
func TestImportUnderAChunkSizedLeaseCap(t *testing.T) {
	const (
		n        = 400
		perChunk = 32 // 1 MiB chunks of 32 KiB blocks (testModel at TP 1)
	)
	for _, capPeer := range []int{perChunk, perChunk + 8} {
		t.Run(fmt.Sprintf("cap=%d", capPeer), func(t *testing.T) {
			agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
				c.MaxLeasedPerPeer = capPeer
				c.ImportChunkBytes = 1 << 20
				// Each chunk's lease waits for the one before it to be
				// released; on two loaded cores that can outlast the 1 s
				// of the other tests.
				c.PeerTimeout = 10 * time.Second
			})
			n1, n2 := agents[0], agents[1]
			e := client.Engine{Name: "producer", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 512}
			produceAndImport(t, n1, n2, e, n)
			if fabric.Suspect(n2, "n1") {
				t.Error("a holder at its lease cap became a suspect")
			}
		})
	}
}
