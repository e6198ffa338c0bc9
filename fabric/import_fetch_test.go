package fabric_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// pipelineHolder makes agent 0 a holder that holds its first lease's
// release until a read under another lease has arrived (or 10 s passed),
// then answers it with valid; agent 1 imports in 1 MiB chunks (32 blocks
// of testModel at TP 1). overlapped says whether that read came while the
// release waited.
type pipelineHolder struct {
	first      atomic.Uint64
	otherRead  chan struct{}
	once       sync.Once
	overlapped atomic.Bool
}

func (h *pipelineHolder) configure(valid bool) func(int, *fabric.Config) {
	h.otherRead = make(chan struct{})
	return func(i int, c *fabric.Config) {
		if i != 0 {
			c.ImportChunkBytes = 1 << 20
			return
		}
		fabric.BeforeServeRead(c, func(_ string, lease uint64) {
			if !h.first.CompareAndSwap(0, lease) && lease != h.first.Load() {
				h.once.Do(func() { close(h.otherRead) })
			}
		})
		fabric.BeforeServeRelease(c, func(_ string, lease uint64) bool {
			if lease != h.first.Load() {
				return true
			}
			select {
			case <-h.otherRead:
				h.overlapped.Store(true)
			case <-time.After(10 * time.Second):
			}
			return valid
		})
	}
}

// The next chunk is read while the previous one's lease is being
// released: the release's round trip is off the read path. Every block
// arrives whole and in order.
func TestImportReadsNextChunkWhileReleasing(t *testing.T) {
	const n = 3 * 32
	var h pipelineHolder
	agents := clusterWith(t, 2, h.configure(true))
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 2 * n}
	produceAndImport(t, agents[0], agents[1], e, n)
	if !h.overlapped.Load() {
		t.Fatal("the second chunk was not read while the first chunk's release was under way")
	}
	if got := fabric.ImportChunks(agents[1]); got != 3 {
		t.Errorf("%d chunks, want 3", got)
	}
}

// A chunk read while the chunk before it fails to release (the holder
// says its lease expired) is not registered either: the import keeps
// nothing, says why, and every slot it took is free again.
func TestImportDiscardsChunkReadWhileEarlierReleaseFails(t *testing.T) {
	const n = 3 * 32
	var h pipelineHolder
	agents := clusterWith(t, 2, h.configure(false))
	n1, n2 := agents[0], agents[1]
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 2 * n}
	hashes := produceBlocks(t, n1, n2, e, n)

	ctx := context.Background()
	c := dial(t, n2)
	e.Name, e.Slots = "importer", n
	set := register(t, c, e)
	// Nothing imported: the call itself fails, with the reason.
	resp, err := c.Import(ctx, set.ID, hashes)
	if err == nil || !strings.Contains(err.Error(), "lease expired") {
		t.Fatalf("import whose first release said expired: %d blocks, error %v; want none and the reason", len(resp.GetBlocks()), err)
	}
	if !h.overlapped.Load() {
		t.Fatal("the second chunk was not read while the first chunk's release was under way")
	}
	// Every slot of the importer's set is free: the first chunk's and the
	// second's were given back.
	if _, err := c.Allocate(ctx, set.ID, n); err != nil {
		t.Fatalf("allocating all %d slots after the failed import: %v", n, err)
	}
}

// A chunk whose release gets no answer within the import's time (the
// holder stalled on it) is not left pinned on the holder for the lease's
// term: the release is tried again in the background, and the holder's
// lease ends as soon as it answers.
func TestImportReleaseWithNoAnswerIsTriedAgain(t *testing.T) {
	var stalled atomic.Bool
	unstall := make(chan struct{})
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		// Leases far longer than the test's wait: only a release ends one.
		c.LeaseDuration = fabric.MaxLeaseDuration
		if i != 0 {
			return
		}
		fabric.BeforeServeRelease(c, func(string, uint64) bool {
			if stalled.CompareAndSwap(false, true) {
				select { // the first release: no answer until the test ends
				case <-unstall:
				case <-time.After(time.Minute):
				}
			}
			return true
		})
	})
	t.Cleanup(func() { close(unstall) }) // before the agents stop: the stalled release ends
	holder, importer := agents[0], agents[1]
	e := client.Engine{Name: "producer", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 64}
	hashes := produceBlocks(t, holder, importer, e, 8)
	ctx := context.Background()
	c := dial(t, importer)
	e.Name = "importer"
	set := register(t, c, e)
	_, err := c.API().Import(ctx, &fabricpb.ImportRequest{BlockSet: set.ID, Hashes: hashes, TimeoutMs: 2000})
	if err == nil {
		t.Fatal("an import whose release got no answer succeeded")
	}
	if !stalled.Load() {
		t.Fatal("the holder saw no release")
	}
	hc := dial(t, holder)
	wait.For(t, 30*time.Second, "the holder's lease released by a later try", func() error {
		st, err := hc.Status(ctx)
		if err != nil {
			return err
		}
		if st.Leases != 0 {
			return fmt.Errorf("%d leases held", st.Leases)
		}
		return nil
	})
}
