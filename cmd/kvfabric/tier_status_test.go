package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// printTiers shows each tier's row and the read-ahead counts of the first
// tier (all tiers together), not the others' zeros; no tiers, nothing.
func TestPrintTiersReadAhead(t *testing.T) {
	var out bytes.Buffer
	printTiers(&out, []*fabricpb.Tier{
		{Kind: "host", SizeBytes: 64 << 20, ReadAheadBlocks: 40, ReadAheadHits: 31, ReadAheadUnused: 7},
		{Kind: "disk", Path: "/nvme/tier", SizeBytes: 1 << 30},
	})
	got := out.String()
	for _, want := range []string{"\nhost ", "\ndisk ", "/nvme/tier", "read ahead: 40 blocks, 31 hits, 7 unused\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("status's tiers %q: no %q", got, want)
		}
	}
	if n := strings.Count(got, "read ahead:"); n != 1 {
		t.Errorf("status's tiers %q: %d read-ahead lines; want 1", got, n)
	}
	out.Reset()
	printTiers(&out, nil)
	if out.Len() != 0 {
		t.Errorf("no tiers printed %q", out.String())
	}
}
