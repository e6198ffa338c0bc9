package fabric_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/layout"
)

// An import is cut into chunks of even size, not whole chunks and a short
// last one: 65 blocks at most 32 a chunk are read as 22, 22 and 21, each
// registered whole and in order, byte for byte.
func TestImportCutsChunksEven(t *testing.T) {
	const n = 2*32 + 1 // 1 MiB chunks of 32 KiB blocks (testModel at TP 1)
	var (
		mu         sync.Mutex
		registered []int
	)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i != 1 {
			return
		}
		c.ImportChunkBytes = 1 << 20
		fabric.OnChunkRegistered(c, func(_ string, blocks int) {
			mu.Lock()
			registered = append(registered, blocks)
			mu.Unlock()
		})
	})
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 2 * n}
	produceAndImport(t, agents[0], agents[1], e, n)
	mu.Lock()
	defer mu.Unlock()
	if want := []int{22, 44, 65}; !slices.Equal(registered, want) {
		t.Errorf("blocks registered after each chunk: %v, want %v", registered, want)
	}
	if got := fabric.ImportChunks(agents[1]); got != 3 {
		t.Errorf("%d chunks, want 3", got)
	}
}

// The sums of a chunk that no read overlaps (an import's last) are taken
// on several goroutines, and those of one read beside the next chunk on
// one: either way every changed block is caught, wherever in the chunk,
// and none of the chunk is registered.
func TestChecksumCatchesWritesOnEveryVerifier(t *testing.T) {
	prev := runtime.GOMAXPROCS(4) // as many goroutines as verify spreads over
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	for _, tc := range []struct {
		name   string
		blocks int // 32 a chunk at most: 40 are cut into 20 and 20
	}{
		{"one chunk, verified alone", 12},
		{"first of two, verified beside the second's read", 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
				if i == 1 {
					c.ImportChunkBytes = 1 << 20
				}
			})
			holder, importer := agents[0], agents[1]
			holderEngine := client.Engine{Name: "holder", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 64}
			readerEngine := client.Engine{Name: "reader", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 64}
			hashes := sumHashes(7, tc.blocks)
			changed := []int{1, 6, 11} // one on each of three goroutines
			holdBlocks(t, holder, holderEngine, hashes, 1, changed...)
			waitHeld(t, importer, holder, uint64(tc.blocks))

			ctx := context.Background()
			c := dial(t, importer)
			set := register(t, c, readerEngine)
			resp, err := c.Import(ctx, set.ID, hashes)
			if err == nil && len(resp.GetBlocks()) > 0 {
				t.Fatalf("import of changed blocks brought %d blocks", len(resp.GetBlocks()))
			}
			why := fmt.Sprint(err, resp.GetError())
			if !strings.Contains(why, "checksum") || !strings.Contains(why, holder.NodeName()) {
				t.Fatalf("import refused for %q, want the checksum and the holder named", why)
			}
			for _, h := range hashes {
				if got, _ := c.Acquire(ctx, set.ID, []uint64{h}); len(got) != 0 {
					t.Fatalf("block %d of the refused chunk registered on the importer", h)
				}
			}
			// Only the first chunk is checked: its failure ends the import.
			firstChunk := min(tc.blocks, 20)
			wantOK := uint64(firstChunk - len(changed))
			if m := importer.Metrics(); m.ChecksumsFailed != uint64(len(changed)) || m.ChecksumsVerified != wantOK {
				t.Fatalf("importer counted %d failed and %d verified, want %d and %d", m.ChecksumsFailed, m.ChecksumsVerified, len(changed), wantOK)
			}
			if m := holder.Metrics(); m.ChecksumWithdrawn != uint64(len(changed)) {
				t.Fatalf("holder withdrew %d blocks, want %d", m.ChecksumWithdrawn, len(changed))
			}
		})
	}
}
