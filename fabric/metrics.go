package fabric

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync/atomic"
	"time"
)

// stats are the agent's own counters; the pool keeps its own.
type stats struct {
	events       atomic.Uint64 // pool events seen
	eventsLost   atomic.Uint64 // pool events dropped before publishing
	imports      atomic.Uint64
	importFails  atomic.Uint64
	importBytes  atomic.Uint64
	importBlocks atomic.Uint64
	inflight     atomic.Int64 // imports in progress
	leasesServed atomic.Uint64
}

func (a *Agent) serveHealth(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "ok %s up %s\n", a.cfg.NodeName, time.Since(a.started).Round(time.Second))
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
	g("kvfabric_pool_inactive_blocks", "Registered blocks nobody uses, recyclable.", float64(m.Inactive))
	g("kvfabric_pool_registered_blocks", "Registered blocks.", float64(m.Registered))
	g("kvfabric_pool_utilization", "Active slots over all slots.", m.Utilization)
	g("kvfabric_leases", "Live leases held by peers.", float64(m.Leases))
	g("kvfabric_leased_slots", "Slots held by at least one lease.", float64(m.Leased))
	c("kvfabric_leases_expired_total", "Leases that passed their deadline.", float64(m.LeasesExpired))
	c("kvfabric_evictions_total", "Registered blocks recycled.", float64(m.Evictions))
	c("kvfabric_pool_events_dropped_total", "Pool events the agent could not take in time.", float64(m.EventsDropped))
	for _, q := range []float64{0.5, 0.99} {
		writeSample(w, "kvfabric_pool_alloc_latency_seconds", fmt.Sprintf(`{quantile="%g"}`, q), m.AllocLatency.Quantile(q).Seconds())
		writeSample(w, "kvfabric_pool_release_latency_seconds", fmt.Sprintf(`{quantile="%g"}`, q), m.ReleaseLatency.Quantile(q).Seconds())
	}
	c("kvfabric_pool_events_total", "Store and remove events of the local pool.", float64(a.stats.events.Load()))
	c("kvfabric_imports_total", "Imports served to engines.", float64(a.stats.imports.Load()))
	c("kvfabric_import_failures_total", "Imports that brought less than asked.", float64(a.stats.importFails.Load()))
	c("kvfabric_import_bytes_total", "Bytes imported from peers.", float64(a.stats.importBytes.Load()))
	for _, extra := range a.extraMetrics() {
		writeMetric(w, extra.name, extra.kind, extra.help, extra.value)
	}
}

type metric struct {
	name, kind, help string
	value            float64
}

// extraMetrics are the figures of the parts wired in after the pool.
func (a *Agent) extraMetrics() []metric {
	var out []metric
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

func writeMetric(w io.Writer, name, kind, help string, v float64) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n%s %g\n", name, help, name, kind, name, v)
}

func writeSample(w io.Writer, name, labels string, v float64) {
	fmt.Fprintf(w, "%s%s %g\n", name, labels, v)
}
