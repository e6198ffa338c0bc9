package fabric

import (
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// The copy plans of parts staged through pinned memory (splitParts'
// parts, each at most a staging buffer): serving a peer's read out of the
// device pool (stageOut), an import into it (readStagedOn), and the disk
// tiers' copies of a device slot down and up (deviceSlots) all pack a
// part's pieces one after another in the staging buffer, in order.

// downParts is each part's plan out of the device regions into staging:
// each segment's pieces from its SrcRank and SrcOffset, packed from the
// buffer's start.
func downParts(parts [][]layout.Segment) []cuda.Part {
	downs := make([]cuda.Part, len(parts))
	for k, part := range parts {
		plan := &layout.Plan{Ranks: make([][]layout.Segment, 1)}
		var at uint64
		for _, s := range part {
			plan.Ranks[0] = append(plan.Ranks[0], layout.Segment{SrcRank: s.SrcRank, SrcOffset: s.SrcOffset, DstOffset: at,
				Length: s.Length, Count: s.Count, SrcStride: s.SrcStride, DstStride: s.Length})
			at += s.Bytes()
		}
		downs[k] = cuda.Part{Bytes: at, Plan: plan}
	}
	return downs
}

// upParts is each part's plan out of staging, packed from the buffer's
// start, into the device regions (ranks of them): each segment's pieces
// to its DstRank and DstOffset.
func upParts(parts [][]layout.Segment, ranks int) []cuda.Part {
	ups := make([]cuda.Part, len(parts))
	for k, part := range parts {
		plan := &layout.Plan{Ranks: make([][]layout.Segment, ranks)}
		var at uint64
		for _, s := range part {
			plan.Ranks[s.DstRank] = append(plan.Ranks[s.DstRank], layout.Segment{DstRank: s.DstRank, SrcOffset: at, DstOffset: s.DstOffset,
				Length: s.Length, Count: s.Count, SrcStride: s.Length, DstStride: s.DstStride})
			at += s.Bytes()
		}
		ups[k] = cuda.Part{Bytes: at, Plan: plan}
	}
	return ups
}
