package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// printIndex shows how the node keeps the block index, what the owned
// index did, gossip's bytes and the event gaps repaired, and any member
// in another index mode.
func printIndex(w io.Writer, s *fabricpb.StatusResponse) {
	if s.IndexMode == "" {
		return // an agent from before index modes were reported
	}
	mode := s.IndexMode
	if mode == "owned" {
		mode = fmt.Sprintf("owned, %d owners a hash", s.IndexReplicas)
	}
	fmt.Fprintf(w, "index: %s; gossip %s in, %s out; event gaps repaired: %d from origins' logs, %d by snapshot\n", mode,
		bytesString(s.GossipBytesIn), bytesString(s.GossipBytesOut), s.GossipRangeRepairs, s.GossipSnapshotRepairs)
	if o := s.OwnedIndex; o != nil {
		fmt.Fprintf(w, "  events: %d sent to owners in %d calls, %d received as owner; lookups: %d asked of owners, %d answered\n",
			o.OpsSent, o.OpCallsSent, o.OpsReceived, o.LookupsAsked, o.LookupsAnswered)
		fmt.Fprintf(w, "  answer cache: %d hits, %d misses, %d expired; hand-offs: %d (%d events re-sent); streams: %d errors, %d started afresh\n",
			o.CacheHits, o.CacheMisses, o.CacheExpiries, o.Handoffs, o.HandoffOps, o.StreamErrors, o.StreamReplaces)
	}
	if s.IndexMismatchedMembers > 0 {
		var odd []string
		for _, m := range s.Members {
			if m.IndexMismatch {
				x := m.IndexMode
				if x == "owned" {
					x = fmt.Sprintf("owned/%d", m.IndexReplicas)
				}
				odd = append(odd, m.Node+" ("+x+")")
			}
		}
		fmt.Fprintf(w, "  MISCONFIGURED: %d members keep the index in another mode, not used as index peers: %s\n",
			s.IndexMismatchedMembers, strings.Join(odd, ", "))
	}
	fmt.Fprintln(w)
}
