package fabric_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// storeTokens registers the full pages of tokens in e's block set on a,
// page i holding the tokens of sequence seq from i×PageSize on, and waits
// until on indexes them. It returns the set.
func storeTokens(t *testing.T, a, on *fabric.Agent, e client.Engine, tokens []uint32, seq uint64) *client.BlockSet {
	t.Helper()
	ctx := context.Background()
	c := dial(t, a)
	set := register(t, c, e)
	h, _ := layout.NewHasher(e.PageSize, layout.HashOptions{Salt: "m"})
	var hashes []uint64
	for _, b := range h.Sequence(tokens) {
		hashes = append(hashes, b.Sequence)
	}
	slots, err := c.Allocate(ctx, set.ID, len(hashes))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		kvtest.FillTokens(set.Layout, set.Ranks, int(s), seq, i*e.PageSize)
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, fmt.Sprintf("%s indexes %s's %d blocks", on.NodeName(), a.NodeName(), len(hashes)), func() error {
		if got := agentStatus(t, on).Members[a.NodeName()]; got < uint64(len(hashes)) {
			return fmt.Errorf("%d indexed", got)
		}
		return nil
	})
	return set
}

// A page-32 engine imports by tokens from a page-16 holder: each of its
// pages is assembled from two of the holder's, across TP sizes and KV
// orders, and registered under the engine's own hashes, every element
// checked. A trailing half page is not imported, and an engine whose page
// no holder's divides gets nothing.
func TestImportAcrossPageSizesByTokens(t *testing.T) {
	agents := cluster(t, 2)
	n1, n2 := agents[0], agents[1]
	model := layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16}
	tokens := make([]uint32, 16*41) // 41 pages of 16: 20 of 32 and a half
	for i := range tokens {
		tokens[i] = uint32(i*13 + 5)
	}
	storeTokens(t, n1, n2, client.Engine{Name: "p16", Model: model, TPSize: 4, PageSize: 16, Order: layout.HND, Slots: 64}, tokens, 7)

	ctx := context.Background()
	c := dial(t, n2)
	set := register(t, c, client.Engine{Name: "p32", Model: model, TPSize: 2, PageSize: 32, Order: layout.NHD, Slots: 64})
	resp, err := c.ImportTokens(ctx, set.ID, tokens, "m", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Blocks) != 20 || resp.Error != "" {
		t.Fatalf("imported %d of 20 pages of 32: %s", len(resp.Blocks), resp.Error)
	}
	h32, _ := layout.NewHasher(32, layout.HashOptions{Salt: "m"})
	want := h32.Sequence(tokens)
	for i, b := range resp.Blocks {
		if b.Hash != want[i].Sequence {
			t.Fatalf("block %d registered as %x, want the engine's hash %x", i, b.Hash, want[i].Sequence)
		}
		if err := kvtest.CheckTokens(set.Layout, set.Ranks, int(b.Slot), 7, i*32); err != nil {
			t.Fatalf("block %d: %v", i, err)
		}
	}
	if len(resp.Fetches) != 1 || resp.Fetches[0].Node != "n1" || resp.Fetches[0].Blocks != 20 {
		t.Errorf("fetches %v, want 20 blocks from n1", resp.Fetches)
	}
	// Registered under the engine's hashes: asking again by hash finds
	// them here.
	got, err := c.Import(ctx, set.ID, []uint64{want[0].Sequence, want[19].Sequence})
	if err != nil || len(got.Blocks) < 1 {
		t.Fatalf("import of the engine's own hashes after: %v %v", got, err)
	}

	// Page 24 is not a multiple of 16: no holder serves it.
	set24 := register(t, c, client.Engine{Name: "p24", Model: model, TPSize: 2, PageSize: 24, Order: layout.HND, Slots: 64})
	if _, err := c.ImportTokens(ctx, set24.ID, tokens, "m", ""); code(err) != codes.NotFound {
		t.Fatalf("page-24 import: %v, want NotFound", err)
	}
	// Another salt names other blocks.
	if _, err := c.ImportTokens(ctx, set.ID, tokens[:64], "other", ""); code(err) != codes.NotFound {
		t.Fatalf("import under another salt: %v, want NotFound", err)
	}
	// Fewer tokens than one page, and hashes with tokens, are refused.
	if _, err := c.ImportTokens(ctx, set.ID, tokens[:31], "m", ""); code(err) != codes.InvalidArgument {
		t.Fatalf("import of 31 tokens into pages of 32: %v, want InvalidArgument", err)
	}
}

// Lookup with the engine's block set estimates, per holder, how long
// bringing its matched blocks here would take: nothing before any import
// from it, then from what the imports measured.
func TestLookupEstimatesFetchTime(t *testing.T) {
	// No silent peers here: the first import's dial and handshake get the
	// default time, not the tests' 1 s (half of it per dial), which a
	// loaded machine under the race detector has exceeded.
	agents := clusterWith(t, 2, func(_ int, c *fabric.Config) { c.PeerTimeout = fabric.DefaultPeerTimeout * 5 })
	n1, n2 := agents[0], agents[1]
	hashes := produce(t, n1, 4, layout.HND, 20)
	wait.For(t, 10*time.Second, "n2 indexes n1's blocks", func() error {
		if got := agentStatus(t, n2).Members["n1"]; got != 20 {
			return fmt.Errorf("%d indexed", got)
		}
		return nil
	})
	ctx := context.Background()
	c := dial(t, n2)
	set := register(t, c, client.Engine{Name: "consumer", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 64})
	perBlock := set.Layout.Strides().Shard * 2
	lookup := func() *fabricpb.Overlap {
		t.Helper()
		resp, err := c.API().Lookup(ctx, &fabricpb.LookupRequest{Hashes: hashes, BlockSet: set.ID})
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range resp.Overlaps {
			if o.Node == "n1" {
				return o
			}
		}
		t.Fatalf("no overlap for n1 in %v", resp.Overlaps)
		return nil
	}
	if o := lookup(); o.Blocks != 20 || o.FetchBytes != 20*perBlock || o.Estimate != "none" || o.FetchEstimateUs != 0 {
		t.Fatalf("before any import: %v, want 20 blocks of %d bytes and no estimate", o, perBlock)
	}
	resp, err := c.Import(ctx, set.ID, hashes[:10])
	if err != nil || len(resp.Blocks) != 10 || len(resp.Fetches) != 1 {
		t.Fatalf("import: %v %v", resp, err)
	}
	took := time.Duration(resp.Fetches[0].Micros) * time.Microsecond
	o := lookup()
	if o.Estimate != "measured" || o.Transport != "quic" || o.FetchEstimateUs == 0 {
		t.Fatalf("after an import: %v, want an estimate measured over quic", o)
	}
	// The estimate is for the 20 blocks n1 holds: about twice the 10 just
	// imported; wide margins, for loaded machines.
	est := time.Duration(o.FetchEstimateUs) * time.Microsecond
	if est > 40*took || est < took/20 {
		t.Errorf("estimate %v for 20 blocks after 10 took %v", est, took)
	}
	// Without a block set there is no size to estimate from.
	plain, err := c.Lookup(ctx, hashes)
	if err != nil || plain[0].FetchEstimateUs != 0 || plain[0].Estimate != "" {
		t.Fatalf("lookup without a block set: %v %v", plain, err)
	}
	// An unknown block set is an error naming it.
	if _, err := c.API().Lookup(ctx, &fabricpb.LookupRequest{Hashes: hashes, BlockSet: 999}); code(err) != codes.NotFound {
		t.Fatalf("lookup with block set 999: %v, want NotFound", err)
	}
}
