package fabric

import (
	"fmt"
	"math/bits"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// counters are what the agent counts itself; the pool, membership and
// transfer count their own.
type counters struct {
	events      atomic.Uint64 // pool events seen
	eventsLost  atomic.Uint64 // pool events dropped before publishing
	imports     atomic.Uint64
	importFails atomic.Uint64
	importBytes atomic.Uint64
	// importBytesRDMA is the part of importBytes that moved over RDMA.
	importBytesRDMA atomic.Uint64
	importBlocks    atomic.Uint64
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
	// checksumVerified and checksumFailed count the holder pages an
	// import checked against their content checksums, and those that
	// failed; checksumWithdrawn the blocks this node withdrew because
	// their bytes changed after registration; checksumClaimsRefused the
	// hashes peers' releases named as failing that were refused unchecked
	// (see Metrics.ChecksumClaimsRefused).
	checksumVerified, checksumFailed, checksumWithdrawn, checksumClaimsRefused atomic.Uint64
	// leaseRenewalsRefused counts the live leases past MaxLeaseAge a
	// renewal was refused to, each once.
	leaseRenewalsRefused atomic.Uint64

	// importTime is each Import call's duration, chunkTime each chunk's
	// from lease to registration, leaseHold how long a lease this node
	// granted lived (until released, or its peer went).
	importTime, chunkTime, leaseHold latency
	// chunkTimeRDMA and chunkTimeLane are chunkTime of the chunks that
	// moved over RDMA and over a TCP lane (chunkTime holds those over
	// QUIC).
	chunkTimeRDMA, chunkTimeLane latency

	orphans orphanCounters
	// demotionsDropped counts the marks for cluster-aware eviction that
	// found demoteLoop's queue full.
	demotionsDropped atomic.Uint64
	// setJoins counts the Registers that joined a block set by its join
	// token (engine_join.go).
	setJoins atomic.Uint64

	// indexEventsRefused counts gossip events not applied because their
	// origin keeps the index in another mode (cluster_index_mode.go).
	indexEventsRefused atomic.Uint64

	// checksumEarly counts the holder pages of checksumVerified and
	// checksumFailed whose sums were taken as a lane read landed them.
	checksumEarly atomic.Uint64
}

// serveHealth answers ok while the agent runs, except that a node given
// seeds to join answers 503 until it has joined once (unless AllowAlone):
// a node that cannot reach its cluster would otherwise look healthy while
// it serves alone. A joined node answers 503 while notReady says why.
func (a *Agent) serveHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	up := time.Since(a.started).Round(time.Second)
	joined, lastErr := a.members.Joined()
	switch {
	case joined:
		if reason := a.notReady(); reason != "" {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready %s up %s: %s\n", a.cfg.NodeName, up, reason)
			return
		}
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

// latency counts durations in power-of-two buckets of nanoseconds, as
// pool.Histogram does, safely from any goroutine.
type latency struct {
	counts [64]atomic.Uint64
	sum    atomic.Int64 // nanoseconds
}

func (l *latency) record(d time.Duration) {
	d = max(d, 0)
	l.counts[bits.Len64(uint64(d))].Add(1)
	l.sum.Add(int64(d))
}

// snapshot copies l; counts read a moment apart may disagree by the
// durations recorded meanwhile.
func (l *latency) snapshot() pool.Histogram {
	var h pool.Histogram
	for i := range l.counts {
		h.Counts[i] = l.counts[i].Load()
	}
	h.Sum = time.Duration(l.sum.Load())
	return h
}

// Metrics is a snapshot of what the agent and the libraries under it
// count. The agent counts; the program that runs it exports (cmd/kvfabric
// turns this into Prometheus metrics).
type Metrics struct {
	Node string
	// Joined says the node has joined its cluster (or has no seeds).
	Joined bool

	Pool       pool.Metrics
	Index      index.Metrics
	Membership membership.Metrics
	Transport  transfer.Metrics
	// RDMA counts reads over RDMA and fallbacks to QUIC; RDMAEnabled says
	// whether the node has RDMA at all.
	RDMA        transfer.RDMAMetrics
	RDMAEnabled bool

	// MembersLeft and MembersFailed are the members that left or failed
	// in the last minutes and have not come back.
	MembersLeft, MembersFailed int

	// IndexEventsHeld are events of nodes waiting for an index slot;
	// IndexEventsLost those lost past the hold limit (their nodes are
	// resynchronised: Membership.Resyncs).
	IndexEventsHeld int
	IndexEventsLost uint64

	// PoolEvents are the pool's store and remove events seen;
	// PoolEventsLost those it dropped before they were published.
	PoolEvents, PoolEventsLost uint64

	// Imports served to engines, those that brought less than asked, and
	// those in progress; the blocks and bytes brought from peers, and the
	// chunks they came in.
	Imports, ImportFailures     uint64
	ImportsInFlight             int64
	ImportBlocks, ImportBytes   uint64
	ImportBytesRDMA             uint64 // the part of ImportBytes that moved over RDMA
	ImportChunks                uint64
	ImportLeaseRenewals         uint64 // renewals holders granted to long reads
	ImportLeaseWaits            uint64 // leases asked again of a busy holder
	ImportTime, ImportChunkTime pool.Histogram
	// ImportChunkTimeRDMA and ImportChunkTimeLane are ImportChunkTime of
	// the chunks moved over RDMA and over a TCP lane; ImportChunkTime
	// holds those over QUIC.
	ImportChunkTimeRDMA, ImportChunkTimeLane pool.Histogram

	// LeasesServed counts leases granted to peers; LeasesEndedEarly those
	// released because their peer went; LeaseHold how long they lived.
	LeasesServed, LeasesEndedEarly uint64
	LeaseHold                      pool.Histogram
	// LeaseRenewalsRefused counts the leases older than this node's
	// MaxLeaseAge it refused a renewal to while they were live, each once
	// however often it was asked again.
	LeaseRenewalsRefused uint64

	// Certificates are the TLS certificates in use and when they expire.
	Certificates []CertificateExpiry

	// ChecksumsVerified counts the blocks (holder pages) imports checked
	// against their content checksums and found good, ChecksumsFailed
	// those that did not match (refused, never registered), and
	// ChecksumWithdrawn the blocks this node withdrew, told of a mismatch,
	// because their bytes changed after registration.
	ChecksumsVerified, ChecksumsFailed, ChecksumWithdrawn uint64
	// ChecksumClaimsRefused counts the hashes a peer's release named as
	// failing their checksums, under a lease of that peer's still in this
	// node's book, that were refused unchecked: each the lease had not
	// pinned or named a second time, or every one when the pool's lease
	// had ended or an earlier release of the lease had its claims checked
	// (taken up). Claims under a lease the book no longer has, or another
	// peer's, are ignored uncounted; a pinned block withdrawn since is not
	// refused.
	ChecksumClaimsRefused uint64

	// EngineRequestBytes are the bytes of engine requests being served
	// (as charged against EngineRequestMemory); EngineRequestsRefused the
	// requests refused for passing that bound or the session's.
	EngineRequestBytes    int64
	EngineRequestsRefused uint64
	// EngineSessions are the engine sessions open (their streams, those
	// yet to send their first request included); EngineSessionsRefused
	// the streams refused past EngineSessionsPerProcess (Process) and
	// past EngineSessions (Total).
	EngineSessions        int
	EngineSessionsRefused SessionsRefused
	// EngineSetJoins counts the Registers that joined a block set by its
	// join token (an engine's other processes).
	EngineSetJoins uint64

	// PeerDialFailures counts dials of members that failed,
	// PeerAuthFailures those that failed authentication (a certificate
	// from another CA, a node that is not a member); PeersAuthenticated
	// and PeersUnauthenticated are the current members whose last dial
	// did and did not authenticate (members never dialed are in neither).
	PeerDialFailures, PeerAuthFailures       uint64
	PeersAuthenticated, PeersUnauthenticated int
	// Ready is /healthz's answer: joined, and notReady gives no reason.
	Ready bool

	// Orphans are the block sets kept as caches after their engines.
	Orphans OrphanMetrics
	// DemotionsDropped counts the blocks whose mark for cluster-aware
	// eviction (Pool.Demoted: held by other nodes too) was dropped, the
	// queue to the pool being full.
	DemotionsDropped uint64
	// Tiers are the disk tiers' figures, in configured order.
	Tiers []TierMetrics

	// IndexMode is this node's index mode ("whole", or "owned/" and its
	// owners a hash); IndexMismatchedMembers the current members in
	// another mode (not used as index peers), IndexEventsRefused the
	// gossip events not applied for that reason.
	IndexMode              string
	IndexMismatchedMembers int
	IndexEventsRefused     uint64
	// OwnedIndex counts the owned-slices index's traffic; zero in whole
	// mode.
	OwnedIndex OwnedIndexMetrics
}

// SessionsRefused counts the engine session streams refused, by the bound
// they would have passed.
type SessionsRefused struct {
	Process, Total uint64
}

// CertificateExpiry names a certificate ("node" or "ca") and its end.
type CertificateExpiry struct {
	Name     string
	NotAfter time.Time
}

// Metrics returns a snapshot of the agent's counters and its libraries'.
// Safe to call from any goroutine once Start has returned.
func (a *Agent) Metrics() Metrics {
	st := &a.stats
	m := Metrics{
		Node:                a.cfg.NodeName,
		Pool:                a.pool.Metrics(),
		Index:               a.index.Metrics(),
		Membership:          a.members.Metrics(),
		Transport:           a.transport.Metrics(),
		IndexEventsLost:     st.indexEventsLost.Load(),
		PoolEvents:          st.events.Load(),
		PoolEventsLost:      st.eventsLost.Load(),
		Imports:             st.imports.Load(),
		ImportFailures:      st.importFails.Load(),
		ImportsInFlight:     st.inflight.Load(),
		ImportBlocks:        st.importBlocks.Load(),
		ImportBytes:         st.importBytes.Load(),
		ImportBytesRDMA:     st.importBytesRDMA.Load(),
		ImportChunks:        st.importChunks.Load(),
		ImportLeaseRenewals: st.leaseRenewals.Load(),
		ImportLeaseWaits:    st.leaseWaits.Load(),
		ImportTime:          st.importTime.snapshot(),
		ImportChunkTime:     st.chunkTime.snapshot(),
		ImportChunkTimeRDMA: st.chunkTimeRDMA.snapshot(),
		ImportChunkTimeLane: st.chunkTimeLane.snapshot(),
		LeasesServed:        st.leasesServed.Load(),
		LeasesEndedEarly:    st.leasesEndedEarly.Load(),
		LeaseHold:           st.leaseHold.snapshot(),
		ChecksumsVerified:   st.checksumVerified.Load(),
		ChecksumsFailed:     st.checksumFailed.Load(),
		ChecksumWithdrawn:   st.checksumWithdrawn.Load(),
	}
	m.ChecksumClaimsRefused = st.checksumClaimsRefused.Load()
	m.LeaseRenewalsRefused = st.leaseRenewalsRefused.Load()
	m.Joined = m.Membership.Joined
	m.RDMA, m.RDMAEnabled = a.transport.RDMAMetrics()
	for _, d := range a.members.Departed() {
		if d.Kind == membership.MemberLeave {
			m.MembersLeft++
		} else {
			m.MembersFailed++
		}
	}
	if a.sink != nil {
		m.IndexEventsHeld = a.sink.heldEvents()
	}
	m.PeerDialFailures, m.PeerAuthFailures = a.health.dialFailures.Load(), a.health.authFailures.Load()
	for _, mb := range a.members.Members() {
		if l, ok := a.health.link(mb.Name); ok && mb.Name != a.cfg.NodeName && !l.At.IsZero() {
			if l.Authenticated {
				m.PeersAuthenticated++
			} else {
				m.PeersUnauthenticated++
			}
		}
	}
	m.Ready = m.Joined && a.notReady() == ""
	m.Orphans = a.orphanMetrics()
	m.DemotionsDropped = a.stats.demotionsDropped.Load()
	m.EngineSetJoins = a.stats.setJoins.Load()
	if a.reqBudget != nil {
		m.EngineRequestBytes, m.EngineRequestsRefused = a.reqBudget.snapshot()
	}
	if a.sessCount != nil {
		m.EngineSessions, m.EngineSessionsRefused.Process, m.EngineSessionsRefused.Total = a.sessCount.snapshot()
	}
	if id := a.identity.Load(); id != nil {
		m.Certificates = []CertificateExpiry{{"node", id.Leaf.NotAfter}, {"ca", id.CA.NotAfter}}
	}
	if a.tiers != nil {
		m.Tiers = a.tiers.metrics()
	}
	m.IndexMode = a.indexModeMeta().String()
	m.IndexMismatchedMembers = a.indexMismatches()
	m.IndexEventsRefused = st.indexEventsRefused.Load()
	if a.owned != nil {
		m.OwnedIndex = a.owned.metrics()
	}
	return m
}
