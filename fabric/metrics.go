package fabric

import (
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
)

// counters are what the agent counts itself; the pool, membership and
// transfer count their own.
type counters struct {
	events       atomic.Uint64 // pool events seen
	eventsLost   atomic.Uint64 // pool events dropped before publishing
	imports      atomic.Uint64
	importFails  atomic.Uint64
	importBytes  atomic.Uint64
	importBlocks atomic.Uint64
	// importChunks counts chunks imported whole; leaseRenewals the
	// renewals holders granted while a chunk was being read.
	importChunks  atomic.Uint64
	leaseRenewals atomic.Uint64
	// indexEventsLost counts events of nodes that the index could not
	// give a slot and that overflowed what the sink holds for them.
	indexEventsLost atomic.Uint64
	// leaseWaits counts the times an import asked a busy holder again.
	leaseWaits atomic.Uint64
	// leasesEndedEarly counts leases released because their peer went.
	leasesEndedEarly atomic.Uint64
	inflight         atomic.Int64 // imports in progress
	leasesServed     atomic.Uint64
}

// serveHealth answers ok while the agent runs, except that a node given
// seeds to join answers 503 until it has joined once (unless AllowAlone):
// a node that cannot reach its cluster would otherwise look healthy while
// it serves alone.
func (a *Agent) serveHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	up := time.Since(a.started).Round(time.Second)
	joined, lastErr := a.members.Joined()
	switch {
	case joined:
		fmt.Fprintf(w, "ok %s up %s\n", a.cfg.NodeName, up)
	case a.cfg.AllowAlone:
		fmt.Fprintf(w, "ok %s up %s, alone: no seed of %v answered yet (allow_alone)\n", a.cfg.NodeName, up, a.cfg.Join)
	default:
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not joined %s up %s: no seed of %v answered yet", a.cfg.NodeName, up, a.cfg.Join)
		if lastErr != nil {
			fmt.Fprintf(w, "; last try: %v", lastErr)
		}
		fmt.Fprintln(w)
	}
}

// serveMetrics writes the Prometheus text format. The families are few and
// fixed, so a client library would add more than it saves.
func (a *Agent) serveMetrics(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	m := a.pool.Metrics()
	g := func(name, help string, v float64) { writeMetric(w, name, "gauge", help, v) }
	c := func(name, help string, v float64) { writeMetric(w, name, "counter", help, v) }
	g("kvfabric_pool_slots", "Slots in the pool.", float64(m.Slots))
	g("kvfabric_pool_free_slots", "Slots ready to allocate.", float64(m.Free))
	g("kvfabric_pool_active_slots", "Slots in use (writing, or registered with users or leases).", float64(m.Active))
	g("kvfabric_pool_inactive_blocks", "Registered blocks nobody uses, recyclable once nothing in use extends them.", float64(m.Inactive))
	g("kvfabric_pool_registered_blocks", "Registered blocks.", float64(m.Registered))
	g("kvfabric_pool_utilization", "Active slots over all slots.", m.Utilization)
	g("kvfabric_leases", "Live leases held by peers.", float64(m.Leases))
	g("kvfabric_leased_slots", "Slots held by at least one lease.", float64(m.Leased))
	c("kvfabric_leases_expired_total", "Leases that passed their deadline.", float64(m.LeasesExpired))
	c("kvfabric_evictions_total", "Registered blocks recycled.", float64(m.Evictions))
	c("kvfabric_pool_events_dropped_total", "Pool events the agent could not take in time.", float64(m.EventsDropped))
	for _, h := range []struct {
		name, help string
		hist       pool.Histogram
	}{
		{"kvfabric_pool_alloc_latency_seconds", "Slot allocation latency (sampled).", m.AllocLatency},
		{"kvfabric_pool_release_latency_seconds", "Slot release latency (sampled).", m.ReleaseLatency},
	} {
		writeHeader(w, h.name, "summary", h.help)
		for _, q := range []float64{0.5, 0.99} {
			writeSample(w, h.name, fmt.Sprintf(`{quantile="%g"}`, q), h.hist.Quantile(q).Seconds())
		}
	}
	c("kvfabric_import_chunks_total", "Import chunks read whole under a confirmed lease and registered.", float64(a.stats.importChunks.Load()))
	c("kvfabric_import_lease_renewals_total", "Lease renewals holders granted to reads that outlived half a term.", float64(a.stats.leaseRenewals.Load()))
	c("kvfabric_import_lease_waits_total", "Times an import asked a holder again for a lease after it answered that it was busy (at a lease cap).", float64(a.stats.leaseWaits.Load()))
	c("kvfabric_leases_ended_early_total", "Leases released before their term because the peer holding them disconnected, left or failed.", float64(a.stats.leasesEndedEarly.Load()))
	c("kvfabric_pool_events_total", "Store and remove events of the local pool.", float64(a.stats.events.Load()))
	c("kvfabric_imports_total", "Imports served to engines.", float64(a.stats.imports.Load()))
	c("kvfabric_import_failures_total", "Imports that brought less than asked.", float64(a.stats.importFails.Load()))
	c("kvfabric_import_bytes_total", "Bytes imported from peers.", float64(a.stats.importBytes.Load()))
	c("kvfabric_import_blocks_total", "Blocks imported from peers.", float64(a.stats.importBlocks.Load()))
	g("kvfabric_imports_in_flight", "Imports in progress.", float64(a.stats.inflight.Load()))
	c("kvfabric_leases_served_total", "Leases granted to peers.", float64(a.stats.leasesServed.Load()))
	c("kvfabric_pool_events_lost_total", "Pool events dropped before they could be published.", float64(a.stats.eventsLost.Load()))

	is := a.index.Metrics()
	g("kvfabric_index_hashes", "Distinct block hashes in the cluster index.", float64(is.Hashes))
	g("kvfabric_index_entries", "(hash, holder) pairs in the cluster index.", float64(is.Pairs))
	if a.sink != nil {
		g("kvfabric_index_events_held", "Events of nodes waiting for an index slot (every slot live or not yet swept).", float64(a.sink.heldEvents()))
	}
	c("kvfabric_index_events_lost_total", "Events of nodes without an index slot lost past the sink's hold limit; those nodes' blocks are missing from the index until they restart or leave.", float64(a.stats.indexEventsLost.Load()))

	ms := a.members.Metrics()
	g("kvfabric_members", "Cluster members this node sees, itself included.", float64(ms.Members))
	c("kvfabric_gossip_events_published_total", "Block events this node published.", float64(ms.EventsPublished))
	c("kvfabric_gossip_events_reconciled_total", "Block events this node published to make its published holdings match its pool after pool events were lost.", float64(ms.EventsReconciled))
	c("kvfabric_gossip_events_applied_total", "Other nodes' block events applied to the index.", float64(ms.EventsApplied))
	g("kvfabric_gossip_event_gaps", "Origins whose events are known but not yet applied (event lag).", float64(ms.Gaps))
	c("kvfabric_gossip_range_repairs_total", "Answers from an origin's log applied to close event gaps (a long gap takes several).", float64(ms.RangeRepairs))
	c("kvfabric_gossip_snapshot_repairs_total", "Event gaps repaired from the origin's snapshot.", float64(ms.SnapshotRepairs))
	c("kvfabric_gossip_repair_failures_total", "Repairs that failed.", float64(ms.RepairFailures))
	c("kvfabric_gossip_bad_messages_total", "Undecodable gossip messages dropped.", float64(ms.BadMessages))
	joined := 0.0
	if ms.Joined {
		joined = 1
	}
	g("kvfabric_gossip_joined", "1 once the node has joined its cluster (or has no seeds to join), else 0.", joined)
	c("kvfabric_gossip_join_attempts_total", "Joins of a seed tried (at start, on retry, and to heal partitions).", float64(ms.JoinAttempts))
	writeHeader(w, "kvfabric_gossip_join_failures_total", "counter", "Joins of a seed that failed, by reason.")
	for r := membership.JoinUnreachable; r <= membership.JoinOther; r++ {
		writeSample(w, "kvfabric_gossip_join_failures_total", fmt.Sprintf(`{reason="%s"}`, r), float64(ms.JoinFailuresBy[r]))
	}

	ts := a.transport.Metrics()
	c("kvfabric_peer_calls_served_total", "Control calls from peers answered.", float64(ts.CallsServed))
	c("kvfabric_peer_calls_failed_total", "Calls from peers answered with an error.", float64(ts.CallsFailed))
	writeHeader(w, "kvfabric_transfer_bytes_total", "counter", "Bytes moved by the peer transport, by transport and direction.")
	writeSample(w, "kvfabric_transfer_bytes_total", `{transport="quic",direction="served"}`, float64(ts.BytesServed))
	writeSample(w, "kvfabric_transfer_bytes_total", `{transport="quic",direction="read"}`, float64(ts.BytesRead))
	c("kvfabric_peer_reads_failed_total", "Reads from peers that failed.", float64(ts.ReadsFailed))
	g("kvfabric_peer_request_bytes", "Request bytes announced and in flight for peers (capped per peer).", float64(ts.RequestBytes))
	c("kvfabric_peer_request_budget_waits_total", "Peer requests that waited because their peer's request bytes were at the cap.", float64(ts.RequestBudgetWaits))

	if id := a.identity; id != nil {
		writeHeader(w, "kvfabric_certificate_expiry_timestamp_seconds", "gauge", "When the node's TLS certificate and its CA expire (Unix time).")
		writeSample(w, "kvfabric_certificate_expiry_timestamp_seconds", `{certificate="node"}`, float64(id.Leaf.NotAfter.Unix()))
		writeSample(w, "kvfabric_certificate_expiry_timestamp_seconds", `{certificate="ca"}`, float64(id.CA.NotAfter.Unix()))
	}
}

func writeMetric(w io.Writer, name, kind, help string, v float64) {
	writeHeader(w, name, kind, help)
	fmt.Fprintf(w, "%s %g\n", name, v)
}

func writeHeader(w io.Writer, name, kind, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
}

func writeSample(w io.Writer, name, labels string, v float64) {
	fmt.Fprintf(w, "%s%s %g\n", name, labels, v)
}
