package main

import (
	"fmt"
	"io"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// printTiers shows the tiers under the pool (the host tier, then the disk
// tiers), if there are any, and the blocks read ahead from them (all
// tiers together): read ahead, taken (hits), recycled or freed untaken
// (unused).
func printTiers(w io.Writer, tiers []*fabricpb.Tier) {
	if len(tiers) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := table(w)
	fmt.Fprintln(tw, "TIER\tPATH\tSIZE\tBLOCKS\tHELD\tBLOCK ROOM\tOFFLOADS\tRESTORES\tEVICTIONS\tCHECKSUM FAILURES")
	for _, t := range tiers {
		room := "-"
		if t.BlockBytes > 0 {
			room = bytesString(t.BlockBytes)
		}
		path := t.Path
		if path == "" {
			path = "-" // the host tier
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\n", t.Kind, path, bytesString(t.SizeBytes), t.Blocks,
			bytesString(t.Bytes), room, t.Offloads, t.Restores, t.Evictions, t.ChecksumFailures)
	}
	tw.Flush()
	// Read-ahead along sequences: all tiers together, on the first.
	r := tiers[0]
	fmt.Fprintf(w, "read ahead: %d blocks, %d hits, %d unused\n", r.ReadAheadBlocks, r.ReadAheadHits, r.ReadAheadUnused)
}
