package fabric_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// sumHashes are the sequence hashes of n blocks of page 16 of the token
// sequence seed names.
func sumHashes(seed uint32, n int) []uint64 {
	tokens := make([]uint32, 16*n)
	for i := range tokens {
		tokens[i] = seed*1000003 + uint32(i)
	}
	h, _ := layout.NewHasher(16, layout.HashOptions{})
	var out []uint64
	for _, b := range h.Sequence(tokens) {
		out = append(out, b.Sequence)
	}
	return out
}

// holdBlocks registers hashes on a with content ids first, first+1, ...
// and, for each index in overwrite, then writes another block's bytes into
// it, as an engine with a bug would after registering.
func holdBlocks(t *testing.T, a *fabric.Agent, e client.Engine, hashes []uint64, first uint64, overwrite ...int) {
	t.Helper()
	holdChanged(t, a, e, hashes, first, func(set *client.BlockSet, slots []uint32) {
		for _, i := range overwrite {
			kvtest.Fill(set.Layout, set.Ranks, int(slots[i]), 0xbad)
		}
	})
}

// holdChanged registers hashes on a with content ids first, first+1, ...
// in a set of engine e, then has change write into their slots, as an
// engine with a bug would after registering.
func holdChanged(t *testing.T, a *fabric.Agent, e client.Engine, hashes []uint64, first uint64, change func(*client.BlockSet, []uint32)) {
	t.Helper()
	ctx := context.Background()
	c := dial(t, a)
	set := register(t, c, e)
	slots, err := c.Allocate(ctx, set.ID, len(hashes))
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		kvtest.Fill(set.Layout, set.Ranks, int(s), first+uint64(i))
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
		t.Fatal(err)
	}
	change(set, slots)
}

// waitHeld waits until on's index says holder holds n blocks.
func waitHeld(t *testing.T, on, holder *fabric.Agent, n uint64) {
	t.Helper()
	wait.For(t, 30*time.Second, fmt.Sprintf("%s indexes %d blocks of %s", on.NodeName(), n, holder.NodeName()), func() error {
		if got := agentStatus(t, on).Members[holder.NodeName()]; got != n {
			return fmt.Errorf("%d indexed", got)
		}
		return nil
	})
}

// An engine that writes into a block after registering it is caught at
// the first import: the importer (of another TP size) refuses the chunk
// and registers none of it, says why, counts it, and the holder withdraws
// the block, which leaves the index. An import that finds the bad block on
// its preferred holder falls over to another and brings every block
// byte-exact.
func TestChecksumCatchesWriteAfterRegister(t *testing.T) {
	// A holder that answers slowly on a loaded machine must not be taken
	// for a failed one: which holder serves which block is the point here.
	agents := clusterWith(t, 4, func(_ int, c *fabric.Config) { c.PeerTimeout = 10 * time.Second })
	// bad2 serves the failover case: bad, having failed an import, is
	// tried last for a while.
	bad, importer, good, bad2 := agents[0], agents[1], agents[2], agents[3]
	holderEngine := client.Engine{Name: "holder", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 32}
	readerEngine := client.Engine{Name: "reader", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 32}
	ctx := context.Background()
	c := dial(t, importer)
	set := register(t, c, readerEngine)

	// The only holder serves a changed block: nothing is registered.
	first := sumHashes(1, 3)
	holdBlocks(t, bad, holderEngine, first, 1, 1)
	waitHeld(t, importer, bad, 3)
	resp, err := c.Import(ctx, set.ID, first)
	if err == nil && len(resp.GetBlocks()) > 0 {
		t.Fatalf("import of a changed block brought %d blocks", len(resp.GetBlocks()))
	}
	why := fmt.Sprint(err, resp.GetError())
	if !strings.Contains(why, "checksum") || !strings.Contains(why, bad.NodeName()) {
		t.Fatalf("import refused for %q, want the checksum and the holder named", why)
	}
	for _, h := range first {
		if got, _ := c.Acquire(ctx, set.ID, []uint64{h}); len(got) != 0 {
			t.Fatalf("block %d of the refused chunk registered on the importer", h)
		}
	}
	if m := importer.Metrics(); m.ChecksumsFailed != 1 || m.ChecksumsVerified != 2 {
		t.Fatalf("importer counted %d failed and %d verified, want 1 and 2", m.ChecksumsFailed, m.ChecksumsVerified)
	}
	if m := bad.Metrics(); m.ChecksumWithdrawn != 1 {
		t.Fatalf("holder withdrew %d blocks, want 1", m.ChecksumWithdrawn)
	}
	waitHeld(t, importer, bad, 2) // its remove event reached the index

	// The preferred holder (the longest prefix) has a changed block; the
	// other has the first three good: the import falls over, then takes
	// the fourth from the first holder, whose other blocks are good.
	second := sumHashes(2, 4)
	holdBlocks(t, bad2, holderEngine, second, 101, 1)
	holdBlocks(t, good, holderEngine, second[:3], 101)
	waitHeld(t, importer, bad2, 4)
	waitHeld(t, importer, good, 3)
	before := importer.Metrics()
	resp, err = c.Import(ctx, set.ID, second)
	if err != nil || len(resp.GetBlocks()) != 4 {
		t.Fatalf("import with a good holder left: %v %v", resp, err)
	}
	checkImported(t, set, resp.GetBlocks(), 101)
	nodes := map[string]bool{}
	for _, f := range resp.GetFetches() {
		nodes[f.GetNode()] = true
	}
	if !nodes[good.NodeName()] || !nodes[bad2.NodeName()] {
		t.Fatalf("fetched from %v, want %s and %s", nodes, good.NodeName(), bad2.NodeName())
	}
	if m := bad2.Metrics(); m.ChecksumWithdrawn != 1 {
		t.Fatalf("the second holder withdrew %d blocks, want 1", m.ChecksumWithdrawn)
	}
	m := importer.Metrics()
	if m.ChecksumsFailed-before.ChecksumsFailed != 1 || m.ChecksumsVerified-before.ChecksumsVerified < 4 {
		t.Fatalf("importer counted %d more failed and %d more verified, want 1 and at least 4",
			m.ChecksumsFailed-before.ChecksumsFailed, m.ChecksumsVerified-before.ChecksumsVerified)
	}
}

// With checksums off, no sum is taken or checked: the changed block is
// imported as it is (what the checksums are there to prevent).
func TestChecksumsOff(t *testing.T) {
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) { c.NoChecksums = true })
	holder, importer := agents[0], agents[1]
	e := client.Engine{Name: "e", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 8}
	hashes := sumHashes(3, 2)
	holdBlocks(t, holder, e, hashes, 1, 1)
	waitHeld(t, importer, holder, 2)
	c := dial(t, importer)
	set := register(t, c, e)
	resp, err := c.Import(context.Background(), set.ID, hashes)
	if err != nil || len(resp.GetBlocks()) != 2 {
		t.Fatalf("import: %v %v", resp, err)
	}
	if err := kvtest.Check(set.Layout, set.Ranks, int(resp.GetBlocks()[1].GetSlot()), 0xbad); err != nil {
		t.Fatalf("the changed block, imported unchecked: %v", err)
	}
	if m := importer.Metrics(); m.ChecksumsFailed != 0 || m.ChecksumsVerified != 0 {
		t.Fatalf("checksums off, yet %d verified and %d failed", m.ChecksumsVerified, m.ChecksumsFailed)
	}
}

// A block changed after registration is not copied into another block set
// of the same node either: the copy stops before it, the block is
// withdrawn, and with no other holder the rest is missing, never wrong.
func TestChecksumCatchesLocalCopy(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx := context.Background()
	hashes := sumHashes(4, 3)
	holdBlocks(t, a, client.Engine{Name: "writer", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 8}, hashes, 1, 1)
	c := dial(t, a)
	set := register(t, c, client.Engine{Name: "reader", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 8})
	resp, err := c.Import(ctx, set.ID, hashes)
	if n := len(resp.GetBlocks()); n != 1 {
		t.Fatalf("import past a changed block: %d blocks (%v), want the one before it", n, err)
	}
	checkImported(t, set, resp.GetBlocks(), 1)
	if got, _ := c.Acquire(ctx, set.ID, hashes[1:2]); len(got) != 0 {
		t.Fatal("the changed block was registered in the reader's set")
	}
	if m := a.Metrics(); m.ChecksumsFailed != 1 || m.ChecksumWithdrawn != 1 || m.ChecksumsVerified != 1 {
		t.Fatalf("verified %d, failed %d, withdrew %d; want 1, 1 and 1", m.ChecksumsVerified, m.ChecksumsFailed, m.ChecksumWithdrawn)
	}
}

// The content checksum reads each KV head from the first rank that holds
// it; where a layout holds a head on several ranks (MLA at TP 2), the
// other copies are checked against it too. An engine that registers a
// block whose ranks differ is refused for it; a holder whose replica
// changed after registration (rank 1's copy, which the sum does not
// read) is caught at the first import: the importer, whose rank 1 reads
// the holder's rank 1, refuses the chunk and registers none of it, and
// the holder, told, finds its copies differ and withdraws the block.
func TestChecksumCatchesAReplicaThatDiffers(t *testing.T) {
	agents := clusterWith(t, 2, func(_ int, c *fabric.Config) { c.PeerTimeout = 10 * time.Second })
	holder, importer := agents[0], agents[1]
	mla := layout.ModelConfig{Layers: 2, KVHeads: 1, HeadDim: 64, DType: layout.DTypeBF16, MLA: true}
	e := client.Engine{Name: "mla", Model: mla, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 32}
	ctx := context.Background()
	hc := dial(t, holder)
	hset := register(t, hc, e)
	// flipSecond changes rank 1's copy of the second block, which the sum
	// does not read.
	flipSecond := func(set *client.BlockSet, slots []uint32) {
		set.Ranks[1][set.Layout.ChunkOffset(int(slots[1]), 1, 0)+5] ^= 0x40
	}

	// Registered with its replicas differing: refused, the others taken.
	slots, err := hc.Allocate(ctx, hset.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		kvtest.Fill(hset.Layout, hset.Ranks, int(s), 900+uint64(i))
	}
	flipSecond(hset, slots)
	resp, err := hc.API().RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: hset.ID, Slots: slots, Hashes: sumHashes(9, 2)})
	if err != nil {
		t.Fatal(err)
	}
	if r := resp.Results[1]; r.Outcome != fabricpb.Outcome_OUTCOME_REFUSED || !strings.Contains(r.Reason, "copies of a head differ") {
		t.Fatalf("a block whose ranks differ: %v %q, want refused naming the copies", r.Outcome, r.Reason)
	}
	if r := resp.Results[0]; r.Outcome != fabricpb.Outcome_OUTCOME_REGISTERED {
		t.Fatalf("the block alike on both ranks: %v %q", r.Outcome, r.Reason)
	}

	// Changed on rank 1 after registration: the import refuses it.
	hashes := sumHashes(10, 3)
	holdChanged(t, holder, e, hashes, 1, flipSecond)
	waitHeld(t, importer, holder, 4)
	c := dial(t, importer)
	set := register(t, c, e)
	got, err := c.Import(ctx, set.ID, hashes)
	if err == nil && len(got.GetBlocks()) > 1 {
		t.Fatalf("import of a block whose replica changed brought %d blocks", len(got.GetBlocks()))
	}
	if why := fmt.Sprint(err, got.GetError()); !strings.Contains(why, "checksum") {
		t.Fatalf("import refused for %q, want the checksum named", why)
	}
	for _, h := range hashes[1:] {
		if refs, _ := c.Acquire(ctx, set.ID, []uint64{h}); len(refs) != 0 {
			t.Fatalf("block %x registered on the importer", h)
		}
	}
	if m := importer.Metrics(); m.ChecksumsFailed != 1 {
		t.Fatalf("importer counted %d failed checks, want 1", m.ChecksumsFailed)
	}
	wait.For(t, 30*time.Second, "the holder withdrew the block", func() error {
		if m := holder.Metrics(); m.ChecksumWithdrawn != 1 {
			return fmt.Errorf("%d withdrawn", m.ChecksumWithdrawn)
		}
		return nil
	})

	// Copied into another set of the holder's node: either the copy reads
	// each head from its first rank (then every block lands right), or it
	// stops before the block and withdraws it; never a block that differs.
	local := sumHashes(11, 3)
	holdChanged(t, holder, e, local, 201, flipSecond)
	other := e
	other.Name, other.Order = "mla-reader", layout.HND // another set: a copy, not a look-up
	rset := register(t, hc, other)
	if rset.ID == hset.ID {
		t.Fatal("the reader shares the writer's block set: nothing is copied")
	}
	lresp, err := hc.Import(ctx, rset.ID, local)
	n := len(lresp.GetBlocks())
	t.Logf("the local copy brought %d blocks", n)
	if n != 3 && n != 1 {
		t.Fatalf("a local copy past a block whose replica changed: %d blocks (%v), want 3 or the one before it", n, err)
	}
	checkImported(t, rset, lresp.GetBlocks(), 201)
	for i, b := range lresp.GetBlocks() {
		if err := layout.ReplicasMatch(rset.Layout, rset.Ranks, int(b.Slot), 0, 16); err != nil {
			t.Fatalf("block %d copied: %v", i, err)
		}
	}
	if m := holder.Metrics(); n == 1 && m.ChecksumWithdrawn != 2 {
		t.Fatalf("holder withdrew %d blocks after the local copy stopped, want 2", m.ChecksumWithdrawn)
	}
}
