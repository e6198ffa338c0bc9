package fabric_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
)

// Over the lane (TLS and plain), the importer sums each block as the read
// lands its last byte, and checks every page with those sums before it
// registers anything: a whole import is checked page for page that way,
// and a block changed after registration is still refused, nothing of its
// chunk registered.
func TestChecksumOverLaneTakenAsBlocksLand(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			agents := clusterWith(t, 2, laneOn(plain))
			holder, importer := agents[0], agents[1]
			// A re-shard (TP 2 NHD to TP 1 HND): each block lands in many
			// pieces. The read is one part (under laneMinPart); blocks
			// that span parts are TestChecksumOverLaneAcrossParts'.
			holderEngine := client.Engine{Name: "holder", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 64}
			readerEngine := client.Engine{Name: "reader", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 64}
			ctx := context.Background()
			c := dial(t, importer)
			set := register(t, c, readerEngine)

			good := sumHashes(5, 24)
			holdBlocks(t, holder, holderEngine, good, 1)
			waitHeld(t, importer, holder, 24)
			resp, err := c.Import(ctx, set.ID, good)
			if err != nil || len(resp.GetBlocks()) != len(good) {
				t.Fatalf("import: %v %v", resp, err)
			}
			for _, f := range resp.GetFetches() {
				if f.GetTransport() != "tcp" {
					t.Fatalf("fetched over %s, want tcp", f.GetTransport())
				}
			}
			checkImported(t, set, resp.GetBlocks(), 1)
			m := importer.Metrics()
			if early := fabric.ChecksumsEarly(importer); m.ChecksumsVerified != uint64(len(good)) || early != m.ChecksumsVerified || m.ChecksumsFailed != 0 {
				t.Fatalf("verified %d pages, %d of them with sums taken as they landed, %d failed; want %d, all, none",
					m.ChecksumsVerified, early, m.ChecksumsFailed, len(good))
			}

			bad := sumHashes(6, 3)
			holdBlocks(t, holder, holderEngine, bad, 101, 1)
			waitHeld(t, importer, holder, 27)
			resp, err = c.Import(ctx, set.ID, bad)
			if err == nil && len(resp.GetBlocks()) > 0 {
				t.Fatalf("import of a changed block brought %d blocks", len(resp.GetBlocks()))
			}
			if why := fmt.Sprint(err, resp.GetError()); !strings.Contains(why, "checksum") {
				t.Fatalf("import refused for %q, want the checksum named", why)
			}
			for _, h := range bad {
				if got, _ := c.Acquire(ctx, set.ID, []uint64{h}); len(got) != 0 {
					t.Fatalf("block %d of the refused chunk registered on the importer", h)
				}
			}
			m = importer.Metrics()
			if early := fabric.ChecksumsEarly(importer); m.ChecksumsFailed != 1 || m.ChecksumsVerified != uint64(len(good))+2 || early != uint64(len(good))+3 {
				t.Fatalf("after the changed block: %d failed, %d verified, %d with early sums; want 1, %d, %d",
					m.ChecksumsFailed, m.ChecksumsVerified, early, len(good)+2, len(good)+3)
			}
		})
	}
}

// checksumModel's blocks are 24 KiB (3 layers), which the lane's 1 MiB
// parts do not divide: many blocks land in two parts, on two connections.
var checksumModel = layout.ModelConfig{Layers: 3, KVHeads: 8, HeadDim: 16, DType: layout.DTypeBF16}

// A block whose bytes come in several parts of a lane read is summed once
// its last part has landed, not its first: imports of 300 blocks cut into
// parts that end mid-block, a re-shard and engine blocks of two holder
// pages, every page checked with sums taken as they landed.
func TestChecksumOverLaneAcrossParts(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			agents := clusterWith(t, 2, laneOn(plain))
			holder, importer := agents[0], agents[1]
			ctx := context.Background()
			c := dial(t, importer)
			checkEarly := func(what string, pages uint64) {
				t.Helper()
				m := importer.Metrics()
				if early := fabric.ChecksumsEarly(importer); m.ChecksumsVerified != pages || early != pages || m.ChecksumsFailed != 0 {
					t.Fatalf("%s: verified %d pages, %d early, %d failed; want %d, all, none", what, m.ChecksumsVerified, early, m.ChecksumsFailed, pages)
				}
			}
			onTheLane := func(resp interface{ GetFetches() []*fabricpb.Fetch }) {
				t.Helper()
				for _, f := range resp.GetFetches() {
					if f.GetTransport() != "tcp" {
						t.Fatalf("fetched over %s, want tcp", f.GetTransport())
					}
				}
			}

			// TP 2 NHD to TP 1 HND.
			set := register(t, c, client.Engine{Name: "reader", Model: checksumModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 400})
			good := sumHashes(5, 300)
			holdBlocks(t, holder, client.Engine{Name: "holder", Model: checksumModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 400}, good, 1)
			waitHeld(t, importer, holder, 300)
			resp, err := c.Import(ctx, set.ID, good)
			if err != nil || len(resp.GetBlocks()) != len(good) {
				t.Fatalf("import: %v %v", resp, err)
			}
			onTheLane(resp)
			checkImported(t, set, resp.GetBlocks(), 1)
			checkEarly("re-shard", 300)

			// Holder pages of 16 tokens into engine blocks of 32.
			tokens := make([]uint32, 16*300)
			for i := range tokens {
				tokens[i] = uint32(i*13 + 5)
			}
			storeTokens(t, holder, importer, client.Engine{Name: "p16", Model: checksumModel, TPSize: 2, PageSize: 16, Order: layout.HND, Slots: 320}, tokens, 7)
			waitHeld(t, importer, holder, 600)
			set = register(t, c, client.Engine{Name: "p32", Model: checksumModel, TPSize: 1, PageSize: 32, Order: layout.NHD, Arrangement: layout.LayerSeparate, Slots: 160})
			tr, err := c.ImportTokens(ctx, set.ID, tokens, "m", "")
			if err != nil || len(tr.Blocks) != 150 || tr.Error != "" {
				t.Fatalf("import: %v %v", tr, err)
			}
			onTheLane(tr)
			for i, b := range tr.Blocks {
				if err := kvtest.CheckTokens(set.Layout, set.Ranks, int(b.Slot), 7, i*32); err != nil {
					t.Fatalf("block %d: %v", i, err)
				}
			}
			checkEarly("pages of 16 into blocks of 32", 600)
		})
	}
}
