package fabric_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
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
			// pieces, from several parts of the read.
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
