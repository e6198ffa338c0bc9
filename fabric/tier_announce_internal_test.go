package fabric

import (
	"container/list"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/kvfabric/kvfabric/pool/disk"
)

// At start the tiers' blocks are announced tier by tier, each tier's
// under its own block set number: the host tier's as copies in memory,
// each disk tier's under tierSetBase and its number, every block once.
func TestTierHeldByTierGroupsEachTiersBlocks(t *testing.T) {
	tr := &tiers{a: &Agent{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		pos: map[disk.Key]*list.Element{}, heldBytes: make([]int64, 3)}
	tr.list = []*diskTier{{n: 0, spec: TierSpec{Kind: tierHost}}, {n: 1, spec: TierSpec{Kind: "disk"}}, {n: 2, spec: TierSpec{Kind: "disk"}}}
	want := [][]uint64{{1, 2}, {3, 4, 5}, {6}}
	for n, hashes := range want {
		for _, h := range hashes {
			if !placeCopy(tr, tr.list[n], disk.Key{Hash: h, Tag: 1}, 100) {
				t.Fatalf("block %d in tier %d is not to be announced", h, n)
			}
		}
	}
	got := tr.heldByTier()
	if len(got) != len(want) {
		t.Fatalf("%d tiers' blocks, want %d", len(got), len(want))
	}
	for n := range want {
		slices.Sort(got[n])
		if !slices.Equal(got[n], want[n]) {
			t.Fatalf("tier %d's blocks %v, want %v", n, got[n], want[n])
		}
	}
	for n, set := range []uint32{tierHostSet, tierSetBase + 1, tierSetBase + 2} {
		if got := tr.tierSet(n); got != set {
			t.Fatalf("tier %d announced under block set %d, want %d", n, got, set)
		}
	}
}
