package main

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/internal/buildinfo"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// metricsHandler serves the Prometheus metrics of the agent agent points
// to (none until it is set: the agent serves /metrics from the moment it
// listens, before Start returns), with Go, process and build metrics.
func metricsHandler(agent *atomic.Pointer[fabric.Agent]) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		agentCollector{agent},
	)
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "kvfabric_build_info",
		Help:        "Always 1: the version of kvfabric and of Go it was built with, as labels.",
		ConstLabels: prometheus.Labels{"version": buildinfo.Version(), "goversion": buildinfo.GoVersion()},
	})
	build.Set(1)
	reg.MustRegister(build)
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// agentCollector turns the agent's Metrics snapshot into Prometheus
// metrics, once per scrape: the agent and its libraries count, this
// exports. It describes nothing ahead (an unchecked collector), because
// some families have labels only the snapshot knows.
type agentCollector struct{ agent *atomic.Pointer[fabric.Agent] }

func (agentCollector) Describe(chan<- *prometheus.Desc) {}

func (c agentCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.agent.Load()
	if a == nil {
		return
	}
	m := a.Metrics()
	e := exporter{ch}

	p := m.Pool
	e.gauge("kvfabric_pool_slots", "Slots in the pool.", float64(p.Slots))
	e.gauge("kvfabric_pool_free_slots", "Slots ready to allocate.", float64(p.Free))
	e.gauge("kvfabric_pool_active_slots", "Slots in use (writing, or registered with users or leases).", float64(p.Active))
	e.gauge("kvfabric_pool_inactive_blocks", "Registered blocks nobody uses, recyclable once nothing in use extends them.", float64(p.Inactive))
	e.gauge("kvfabric_pool_registered_blocks", "Registered blocks.", float64(p.Registered))
	e.gauge("kvfabric_pool_utilization", "Active slots over all slots.", p.Utilization)
	e.gauge("kvfabric_pool_retired_slots", "Slots out of use for good: a device copy into them could not be confirmed and may still land.", float64(p.Retired))
	e.gauge("kvfabric_pool_withheld_bytes", "Memory that retired slots keep out of use: their share of the block sets held, all the memory of sets freed with them (given to no other set while the agent runs).", float64(p.WithheldBytes))
	e.gauge("kvfabric_leases", "Live leases held by peers.", float64(p.Leases))
	e.gauge("kvfabric_leased_slots", "Slots held by at least one lease.", float64(p.Leased))
	e.counter("kvfabric_leases_expired_total", "Leases that passed their deadline.", float64(p.LeasesExpired))
	e.counter("kvfabric_evictions_total", "Registered blocks recycled.", float64(p.Evictions))
	e.counter("kvfabric_pool_events_dropped_total", "Pool events the agent could not take in time.", float64(p.EventsDropped))
	e.histogram("kvfabric_pool_alloc_duration_seconds", "Slot allocation latency (one allocation in 16, sampled).", p.AllocLatency)
	e.histogram("kvfabric_pool_release_duration_seconds", "Slot release latency (one release in 16, sampled).", p.ReleaseLatency)

	e.counter("kvfabric_pool_events_total", "Store and remove events of the local pool.", float64(m.PoolEvents))
	e.counter("kvfabric_pool_events_lost_total", "Pool events dropped before they could be published (then reconciled).", float64(m.PoolEventsLost))
	e.counter("kvfabric_imports_total", "Imports served to engines.", float64(m.Imports))
	e.counter("kvfabric_import_failures_total", "Imports that brought less than asked.", float64(m.ImportFailures))
	e.gauge("kvfabric_imports_in_flight", "Imports in progress.", float64(m.ImportsInFlight))
	e.counter("kvfabric_import_bytes_total", "Bytes imported from peers.", float64(m.ImportBytes))
	e.counter("kvfabric_import_blocks_total", "Blocks imported from peers.", float64(m.ImportBlocks))
	e.counter("kvfabric_import_chunks_total", "Import chunks read whole under a confirmed lease and registered.", float64(m.ImportChunks))
	e.counter("kvfabric_import_lease_renewals_total", "Lease renewals holders granted to reads that outlived half a term.", float64(m.ImportLeaseRenewals))
	e.counter("kvfabric_import_lease_waits_total", "Times an import asked a holder again for a lease after it answered that it was busy (at a lease cap).", float64(m.ImportLeaseWaits))
	e.histogram("kvfabric_import_duration_seconds", "Import calls from engines, from the call to its answer.", m.ImportTime)
	e.histogram("kvfabric_import_chunk_duration_seconds", "Import chunks, from asking for the lease to registering the blocks, by transport.", m.ImportChunkTime, "transport", "quic")
	e.histogram("kvfabric_import_chunk_duration_seconds", "Import chunks, from asking for the lease to registering the blocks, by transport.", m.ImportChunkTimeRDMA, "transport", "rdma")
	e.histogram("kvfabric_import_chunk_duration_seconds", "Import chunks, from asking for the lease to registering the blocks, by transport.", m.ImportChunkTimeLane, "transport", "tcp")
	e.counter("kvfabric_leases_served_total", "Leases granted to peers.", float64(m.LeasesServed))
	e.counter("kvfabric_leases_ended_early_total", "Leases released before their term because the peer holding them disconnected, left or failed.", float64(m.LeasesEndedEarly))
	e.counter("kvfabric_lease_renewals_refused_total", "Leases a renewal was refused to because the lease was older than --max-lease-age, each counted once, while it was live; the lease ended with its term.", float64(m.LeaseRenewalsRefused))
	e.histogram("kvfabric_lease_hold_duration_seconds", "How long leases granted to peers lived, until released or their peer went.", m.LeaseHold)
	e.counter("kvfabric_import_checksums_verified_total", "Imported blocks whose bytes matched the content checksum their holder gave.", float64(m.ChecksumsVerified))
	e.counter("kvfabric_import_checksums_failed_total", "Imported blocks whose bytes did not match their content checksum: refused, never registered.", float64(m.ChecksumsFailed))
	e.counter("kvfabric_checksum_withdrawn_blocks_total", "Blocks this node withdrew because their bytes changed after registration (found by an importer's checksum).", float64(m.ChecksumWithdrawn))
	e.counter("kvfabric_checksum_claims_refused_total", "Hashes a peer's release named as failing their checksums, under its own lease still in this node's lease book, that were refused unchecked: each the lease had not pinned or that was named a second time, or all of them when the lease had ended or an earlier release of it had its claims checked. Claims under a lease the book no longer had, or under another peer's, are ignored and not counted; a pinned block withdrawn since is not refused.", float64(m.ChecksumClaimsRefused))

	e.gauge("kvfabric_orphan_block_sets", "Block sets kept past their grace period as caches of engines that are gone.", float64(m.Orphans.Sets))
	e.gauge("kvfabric_orphan_blocks", "Registered blocks in block sets kept as caches of engines that are gone.", float64(m.Orphans.Blocks))
	e.gauge("kvfabric_orphan_bytes", "Bytes of the registered blocks in block sets kept as caches of engines that are gone.", float64(m.Orphans.Bytes))
	e.counter("kvfabric_orphan_adoptions_total", "Block sets kept after their engines that a new engine session took up, with their blocks.", float64(m.Orphans.Adoptions))
	e.gauge("kvfabric_pool_demoted_blocks", "Registered blocks other live nodes hold too, recycled before those only this node holds.", float64(p.Demoted))
	e.counter("kvfabric_demotions_dropped_total", "Blocks whose mark for cluster-aware eviction was dropped, the queue to the pool being full.", float64(m.DemotionsDropped))
	e.counter("kvfabric_orphans_reclaimed_total", "Block sets kept after their engines that were freed because a new block set needed the memory.", float64(m.Orphans.Reclaimed))

	e.gauge("kvfabric_engine_request_bytes", "Bytes of engine requests being served, as charged against engine_request_memory.", float64(m.EngineRequestBytes))
	e.counter("kvfabric_engine_requests_refused_total", "Engine requests refused RESOURCE_EXHAUSTED for passing the bound on requests in flight (in total or per session).", float64(m.EngineRequestsRefused))
	e.gauge("kvfabric_engine_sessions", "Engine sessions open, counted against engine_sessions (their streams, those yet to send their first request included).", float64(m.EngineSessions))
	e.counter("kvfabric_engine_sessions_refused_total", "Engine sessions refused RESOURCE_EXHAUSTED, by the bound they would have passed: one process's (engine_sessions_per_process) or all processes' (engine_sessions).", float64(m.EngineSessionsRefused.Process), "bound", "process")
	e.counter("kvfabric_engine_sessions_refused_total", "Engine sessions refused RESOURCE_EXHAUSTED, by the bound they would have passed: one process's (engine_sessions_per_process) or all processes' (engine_sessions).", float64(m.EngineSessionsRefused.Total), "bound", "total")
	e.counter("kvfabric_engine_set_joins_total", "Registers that joined a block set by its join token (an engine's other processes).", float64(m.EngineSetJoins))

	e.counter("kvfabric_peer_dial_failures_total", "Dials of members over the peer transport that failed.", float64(m.PeerDialFailures))
	e.counter("kvfabric_peer_auth_failures_total", "Dials of members that failed authentication (a certificate from another CA, expired, or of a node that is not a member).", float64(m.PeerAuthFailures))
	e.gauge("kvfabric_peers", "Current members by whether this node's last dial authenticated to them.", float64(m.PeersAuthenticated), "authenticated", "true")
	e.gauge("kvfabric_peers", "Current members by whether this node's last dial authenticated to them.", float64(m.PeersUnauthenticated), "authenticated", "false")
	ready := 0.0
	if m.Ready {
		ready = 1
	}
	e.gauge("kvfabric_ready", "1 when /healthz answers ok: joined, authenticated to a peer, and synced once since the start.", ready)

	ix := m.Index
	e.gauge("kvfabric_index_hashes", "Distinct block hashes in the cluster index.", float64(ix.Hashes))
	e.gauge("kvfabric_index_entries", "(hash, holder) pairs in the cluster index.", float64(ix.Pairs))
	e.gauge("kvfabric_index_events_held", "Events of nodes waiting for an index slot (every slot live or not yet swept).", float64(m.IndexEventsHeld))
	e.counter("kvfabric_index_stores_refused_total", "Block stores of other holders not indexed because the index held the most hashes it keeps for one node (--index-max-node-blocks), every holder's together.", float64(ix.Refused))
	e.counter("kvfabric_index_events_lost_total", "Events of nodes without an index slot lost past the sink's hold limit; those nodes are resynchronised (kvfabric_gossip_resyncs_total).", float64(m.IndexEventsLost))

	ms := m.Membership
	e.gauge("kvfabric_members", "Cluster members this node sees, itself included.", float64(ms.Members))
	e.gauge("kvfabric_members_gone", "Members that left or failed in the last 10 minutes and have not come back, by state.", float64(m.MembersLeft), "state", "left")
	e.gauge("kvfabric_members_gone", "Members that left or failed in the last 10 minutes and have not come back, by state.", float64(m.MembersFailed), "state", "failed")
	e.counter("kvfabric_gossip_events_published_total", "Block events this node published.", float64(ms.EventsPublished))
	e.counter("kvfabric_gossip_events_reconciled_total", "Block events this node published to make its published holdings match its pool after pool events were lost.", float64(ms.EventsReconciled))
	e.counter("kvfabric_gossip_resyncs_total", "Nodes whose block events were fetched again from the start because the index lost events held for them.", float64(ms.Resyncs))
	e.counter("kvfabric_gossip_events_applied_total", "Other nodes' block events applied to the index.", float64(ms.EventsApplied))
	e.gauge("kvfabric_gossip_event_gaps", "Origins whose events are known but not yet applied (event lag).", float64(ms.Gaps))
	e.counter("kvfabric_gossip_range_repairs_total", "Answers from an origin's log applied to close event gaps (a long gap takes several).", float64(ms.RangeRepairs))
	e.counter("kvfabric_gossip_snapshot_repairs_total", "Event gaps repaired from the origin's snapshot.", float64(ms.SnapshotRepairs))
	e.counter("kvfabric_gossip_repair_failures_total", "Repairs that failed.", float64(ms.RepairFailures))
	e.counter("kvfabric_gossip_bad_messages_total", "Undecodable gossip messages dropped.", float64(ms.BadMessages))
	e.gauge("kvfabric_gossip_joined", "1 once the node has joined its cluster (or has no seeds to join), else 0.", boolFloat(m.Joined))
	e.counter("kvfabric_gossip_join_attempts_total", "Joins of a seed tried (at start, on retry, and to heal partitions).", float64(ms.JoinAttempts))
	for r := membership.JoinUnreachable; r <= membership.JoinOther; r++ {
		e.counter("kvfabric_gossip_join_failures_total", "Joins of a seed that failed, by reason.", float64(ms.JoinFailuresBy[r]), "reason", r.String())
	}

	ts := m.Transport
	e.counter("kvfabric_peer_calls_served_total", "Control calls from peers answered.", float64(ts.CallsServed))
	e.counter("kvfabric_peer_calls_failed_total", "Calls from peers answered with an error.", float64(ts.CallsFailed))
	e.counter("kvfabric_transfer_bytes_total", "Bytes moved by the peer transport, by transport and direction.", float64(ts.BytesServedQUIC), "transport", "quic", "direction", "served")
	e.counter("kvfabric_transfer_bytes_total", "Bytes moved by the peer transport, by transport and direction.", float64(ts.BytesServedLane), "transport", "tcp", "direction", "served")
	rd := m.RDMA
	e.counter("kvfabric_transfer_bytes_total", "Bytes moved by the peer transport, by transport and direction.", float64(ts.BytesReadQUIC), "transport", "quic", "direction", "read")
	e.counter("kvfabric_transfer_bytes_total", "Bytes moved by the peer transport, by transport and direction.", float64(rd.Bytes), "transport", "rdma", "direction", "read")
	e.gauge("kvfabric_rdma_enabled", "1 when this node reads and serves over RDMA, else 0 (the agent's log says why).", boolFloat(m.RDMAEnabled))
	if m.RDMAEnabled {
		e.gauge("kvfabric_rdma_binding", "1, labelled with what moves RDMA reads: verbs, or ofi: and libfabric's provider.", 1, "binding", rd.Binding)
		e.counter("kvfabric_rdma_reads_total", "Reads from peers completed over RDMA.", float64(rd.Reads))
		e.counter("kvfabric_rdma_read_failures_total", "RDMA reads that failed (and were read again over QUIC).", float64(rd.ReadFailures))
		e.counter("kvfabric_rdma_work_requests_total", "RDMA READ work requests posted.", float64(rd.Ops))
		e.counter("kvfabric_rdma_scatter_entries_total", "Scatter-list entries of the RDMA READs posted.", float64(rd.SGEs))
		e.counter("kvfabric_rdma_read_cpu_seconds_total", "CPU time spent posting the RDMA READs of completed reads and polling their completions.", rd.ReadCPU.Seconds())
		e.counter("kvfabric_rdma_connects_total", "Queue pairs connected to peers to read from.", float64(rd.Connects))
		e.counter("kvfabric_rdma_connect_failures_total", "Queue-pair connections to peers that failed.", float64(rd.ConnectFailures))
		e.gauge("kvfabric_rdma_queue_pairs_served", "Queue pairs peers read this node's memory on.", float64(rd.QPsServed))
		e.gauge("kvfabric_rdma_registered_bytes", "Memory registered with the RDMA devices.", float64(rd.RegisteredBytes))
		if strings.HasPrefix(rd.Binding, "ofi:") {
			e.counter("kvfabric_rdma_endpoint_reopens_total", "libfabric endpoints opened in place of one that closed itself (a read given up with requests in flight).", float64(rd.EndpointReopens))
			e.counter("kvfabric_rdma_endpoint_reopen_failures_total", "Attempts to reopen a libfabric endpoint that failed.", float64(rd.EndpointReopenFailures))
		}
		for _, d := range rd.Devices {
			e.counter("kvfabric_rdma_device_read_bytes_total", "Bytes RDMA reads moved into memory registered with each RDMA device.", float64(d.ReadBytes), "device", d.Name)
			e.gauge("kvfabric_rdma_device_registered_bytes", "Memory registered with each RDMA device.", float64(d.Registered), "device", d.Name)
		}
		for _, r := range transfer.FallbackReasons {
			e.counter("kvfabric_rdma_fallbacks_total", "Reads that went over QUIC although RDMA is on, by reason.", float64(rd.Fallbacks[r]), "reason", r)
		}
	}
	e.counter("kvfabric_transfer_bytes_total", "Bytes moved by the peer transport, by transport and direction.", float64(ts.BytesReadLane), "transport", "tcp", "direction", "read")
	e.gauge("kvfabric_lane_plain", "1 when the TCP lane this node serves is plain TCP (unencrypted), else 0.", boolFloat(ts.LanePlain))
	e.counter("kvfabric_lane_connects_total", "TCP lane connections opened to peers.", float64(ts.LaneConnects))
	e.counter("kvfabric_lane_connect_failures_total", "TCP lane connections to peers that failed (dial, handshake, token).", float64(ts.LaneConnectFailures))
	e.counter("kvfabric_lane_refused_total", "TCP lane connections from peers refused after the TLS handshake, or on a plain lane after the accept: token, name, membership, connection cap, a first frame that is not a hello, a hello late or missing, the lane closing at shutdown.", float64(ts.LaneRefused))
	e.gauge("kvfabric_lane_pending_connections", "Connections to this node's TCP lane not yet admitted (TLS handshake and token under way).", float64(ts.LanePending))
	e.counter("kvfabric_lane_pending_refused_total", "Connections to this node's TCP lane closed as soon as accepted for passing the bounds on those not yet admitted (in total or per source address): a connection flood.", float64(ts.LanePendingRefused))
	e.counter("kvfabric_lane_handshake_failures_total", "Connections to this node's TCP lane whose TLS handshake failed or did not finish within the hello timeout (bad certificate, scanner, stalled flood).", float64(ts.LaneHandshakeFailures))
	e.counter("kvfabric_lane_accept_errors_total", "Failed accepts on this node's TCP lane listener (out of descriptors, buffers or memory); it accepts again after a wait of 5 ms doubling to 1 s.", float64(ts.LaneAcceptErrors))
	for _, r := range transfer.LaneFallbackReasons {
		e.counter("kvfabric_lane_fallbacks_total", "Reads that went over QUIC where the TCP lane was on, by reason.", float64(ts.LaneFallbacks[r]), "reason", r)
	}
	e.counter("kvfabric_peer_reads_failed_total", "Reads from peers that failed.", float64(ts.ReadsFailed))
	e.gauge("kvfabric_peer_request_bytes", "Request bytes announced and in flight for peers (capped per peer).", float64(ts.RequestBytes))
	e.counter("kvfabric_peer_request_budget_waits_total", "Peer requests that waited because their peer's request bytes were at the cap.", float64(ts.RequestBudgetWaits))
	e.gauge("kvfabric_peer_handshakes", "Incoming peer handshakes in progress.", float64(ts.Handshakes))
	e.gauge("kvfabric_peer_handshakes_peak", "The most incoming peer handshakes in progress at once since the start.", float64(ts.HandshakesPeak))
	e.gauge("kvfabric_peer_incoming_connections", "Incoming peer connections, handshaking or established.", float64(ts.Conns))
	e.counter("kvfabric_peer_connections_refused_total", "Incoming peer connections refused at their first packet for passing the bounds on handshakes and connections (in total or per source address): a handshake flood.", float64(ts.ConnsRefused))
	e.counter("kvfabric_peer_address_validations_total", "Incoming handshakes asked to validate their source address (a QUIC Retry) because many were in progress.", float64(ts.AddressValidations))

	for _, tm := range m.Tiers {
		tier := []string{"tier", fmt.Sprint(tm.Tier), "path", tm.Path, "kind", tm.Kind}
		e.gauge("kvfabric_tier_blocks", "Blocks a tier (disk or host) holds.", float64(tm.Blocks), tier...)
		e.gauge("kvfabric_tier_bytes", "Bytes a tier (disk or host) holds.", float64(tm.Bytes), tier...)
		e.counter("kvfabric_tier_offloads_total", "Blocks copied down to a tier (disk or host) instead of being recycled away, and blocks moved down to a disk tier from the host tier.", float64(tm.Offloads), tier...)
		e.counter("kvfabric_tier_restores_total", "Blocks restored from a tier (disk or host) into pool slots (for engines, or staged for peers).", float64(tm.Restores), tier...)
		e.counter("kvfabric_tier_checksum_failures_total", "Blocks of a tier (disk or host) that failed a check on their way up: dropped, never served.", float64(tm.ChecksumFailures), tier...)
		e.counter("kvfabric_tier_evictions_total", "Blocks a tier (disk or host) dropped to make room for newer ones.", float64(tm.Evictions), tier...)
		e.counter("kvfabric_tier_offload_failures_total", "Copies down that failed (the block was recycled as without a tier).", float64(tm.Failures), tier...)
		e.histogram("kvfabric_tier_restore_duration_seconds", "Restore of one block from a tier (disk or host): read, checks and copy into its slot.", tm.RestoreTime, tier...)
		if tm.Tier == 0 {
			e.counter("kvfabric_tier_queue_full_total", "Blocks the disk tiers' queue had no room for (recycled without a copy when their slot was needed).", float64(tm.QueueFull))
			e.counter("kvfabric_tier_offload_skipped_total", "Blocks dropped instead of copied down because an allocation needed their slots before their copy began (allocations never wait for the disk).", float64(m.Pool.OffloadsGivenUp), "reason", "slot_needed")
			e.counter("kvfabric_tier_read_ahead_blocks_total", "Blocks read ahead along a sequence from the tiers into an engine's block set after a restore (--tier-read-ahead).", float64(tm.ReadAhead))
			e.counter("kvfabric_tier_read_ahead_hits_total", "Blocks read ahead that an engine's Acquire, Import, Lookup or Prefetch then took, or got back as duplicates of blocks it registered (Lookup and Prefetch only where they waited for the read-ahead or got its copy of a block they read too).", float64(tm.ReadAheadHits))
			e.counter("kvfabric_tier_read_ahead_unused_total", "Blocks read ahead that were recycled, or freed with their block set, before anything took them (counted at the set's next read-ahead or its freeing).", float64(tm.ReadAheadUnused))
		}
	}
	indexMetrics(e, m)
	for _, cert := range m.Certificates {
		e.gauge("kvfabric_certificate_expiry_timestamp_seconds", "When the node's TLS certificate and its CA expire (Unix time).",
			float64(cert.NotAfter.Unix()), "certificate", cert.Name)
	}
}

// exporter sends const metrics; labels are name, value pairs.
type exporter struct{ ch chan<- prometheus.Metric }

func (e exporter) send(kind prometheus.ValueType, name, help string, v float64, labels []string) {
	names, values := splitLabels(labels)
	e.ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, names, nil), kind, v, values...)
}

func (e exporter) gauge(name, help string, v float64, labels ...string) {
	e.send(prometheus.GaugeValue, name, help, v, labels)
}

func (e exporter) counter(name, help string, v float64, labels ...string) {
	e.send(prometheus.CounterValue, name, help, v, labels)
}

// Histogram buckets: the power-of-two nanosecond buckets of pool.Histogram
// from 2^10 ns (about 1 µs) to 2^40 ns (about 18 min); shorter durations
// fall in the first, longer ones only in +Inf.
const (
	firstBucket = 10
	lastBucket  = 40
)

// histogram exports h, whose bucket i counts durations under 2^i ns, as a
// Prometheus histogram in seconds. A Prometheus bucket counts durations up
// to and including its bound, so bucket i's bound is 2^i - 1 ns.
func (e exporter) histogram(name, help string, h pool.Histogram, labels ...string) {
	names, values := splitLabels(labels)
	buckets := make(map[float64]uint64, lastBucket-firstBucket+1)
	var below, count uint64
	for i, n := range h.Counts {
		count += n
		if i <= firstBucket {
			below += n
		}
	}
	cum := below
	for i := firstBucket; i <= lastBucket; i++ {
		if i > firstBucket {
			cum += h.Counts[i]
		}
		buckets[(math.Ldexp(1, i)-1)/float64(time.Second)] = cum
	}
	e.ch <- prometheus.MustNewConstHistogram(prometheus.NewDesc(name, help, names, nil), count, h.Sum.Seconds(), buckets, values...)
}

func splitLabels(pairs []string) (names, values []string) {
	for i := 0; i+1 < len(pairs); i += 2 {
		names = append(names, pairs[i])
		values = append(values, pairs[i+1])
	}
	return names, values
}

func boolFloat(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// indexMetrics exports the index mode's figures: the members in another
// mode, and the owned-slices index's traffic (in owned mode only), and
// gossip's own bytes.
func indexMetrics(e exporter, m fabric.Metrics) {
	e.gauge("kvfabric_index_mode", "1, labelled with this node's index mode: whole, or owned/ and its owners a hash.", 1, "mode", m.IndexMode)
	e.gauge("kvfabric_index_mode_mismatched_members", "Current members whose index mode (--index-mode, --index-replicas) differs from this node's: not used as index peers. Above 0, the cluster is misconfigured.", float64(m.IndexMismatchedMembers))
	e.counter("kvfabric_index_events_refused_total", "Gossip block events not applied to this node's index because their origin keeps the index in another mode.", float64(m.IndexEventsRefused))
	e.counter("kvfabric_gossip_bytes_total", "Bytes memberlist carried (probes, gossip, push/pull, event batches), apart from the peer transport's, by direction.", float64(m.Membership.GossipBytesIn), "direction", "in")
	e.counter("kvfabric_gossip_bytes_total", "Bytes memberlist carried (probes, gossip, push/pull, event batches), apart from the peer transport's, by direction.", float64(m.Membership.GossipBytesOut), "direction", "out")
	if m.IndexMode == fabric.IndexWhole {
		return
	}
	o := m.OwnedIndex
	e.counter("kvfabric_owned_index_ops_total", "Block events of the owned-slices index: sent to the hashes' owners (in calls they applied), and applied as an owner.", float64(o.OpsSent), "direction", "sent")
	e.counter("kvfabric_owned_index_ops_total", "Block events of the owned-slices index: sent to the hashes' owners (in calls they applied), and applied as an owner.", float64(o.OpsReceived), "direction", "received")
	e.counter("kvfabric_owned_index_op_calls_total", "Calls that carried block events to owners and were applied.", float64(o.OpCalls))
	e.counter("kvfabric_owned_index_lookups_total", "Lookup calls of the owned-slices index: asked of owners, and answered as an owner.", float64(o.LookupsAsked), "direction", "asked")
	e.counter("kvfabric_owned_index_lookups_total", "Lookup calls of the owned-slices index: asked of owners, and answered as an owner.", float64(o.LookupsAnswered), "direction", "answered")
	e.counter("kvfabric_owned_index_cache_total", "Hashes looked up in the cache of owners' recent answers, by result: hit, miss (none), expired (older than --index-cache-ttl).", float64(o.Cache.Hits), "result", "hit")
	e.counter("kvfabric_owned_index_cache_total", "Hashes looked up in the cache of owners' recent answers, by result: hit, miss (none), expired (older than --index-cache-ttl).", float64(o.Cache.Misses), "result", "miss")
	e.counter("kvfabric_owned_index_cache_total", "Hashes looked up in the cache of owners' recent answers, by result: hit, miss (none), expired (older than --index-cache-ttl).", float64(o.Cache.Expired), "result", "expired")
	e.counter("kvfabric_owned_index_handoffs_total", "Member list changes that moved this node's hashes between owners.", float64(o.Handoffs))
	e.counter("kvfabric_owned_index_handoff_ops_total", "Block events queued by hand-offs: stores re-sent to new owners, forgets to old ones.", float64(o.HandoffOps))
	e.counter("kvfabric_owned_index_stream_errors_total", "Calls of block events to owners that failed (sent again after a backoff).", float64(o.StreamErrors))
	e.counter("kvfabric_owned_index_stream_replaces_total", "Streams to owners started afresh with this node's holdings: an owner asked for its slice again, or a member new to the list got its slice.", float64(o.StreamReplaces))
}
