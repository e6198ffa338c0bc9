package main

import (
	"fmt"
	"math"
	"math/bits"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvfabric/kvfabric/pool"
)

// A scrape of a running agent parses with Prometheus's own parser and
// carries every family, with the types and values of what happened.
func TestMetricsExposition(t *testing.T) {
	a := startScraped(t, "met1", nil)
	if code, _, errs := runCmd(t, "", "put", "--socket", a.EngineSocket(), "--generate", "8", "--tp", "1", "--layers", "2", "--head-dim", "16"); code != 0 {
		t.Fatalf("put: %s", errs)
	}

	// Pool events reach the publisher on its own goroutine: scrape until
	// the 8 stores are counted.
	fams := scrapeUntil(t, a, "the 8 stores published", func(fams map[string]*dto.MetricFamily) error {
		f := fams["kvfabric_gossip_events_published_total"]
		if f == nil || len(f.Metric) != 1 || f.Metric[0].GetCounter().GetValue() != 8 {
			return fmt.Errorf("published: %v", f)
		}
		return nil
	})
	want := map[string]dto.MetricType{
		"kvfabric_build_info":                           dto.MetricType_GAUGE,
		"kvfabric_pool_slots":                           dto.MetricType_GAUGE,
		"kvfabric_pool_registered_blocks":               dto.MetricType_GAUGE,
		"kvfabric_pool_alloc_duration_seconds":          dto.MetricType_HISTOGRAM,
		"kvfabric_pool_release_duration_seconds":        dto.MetricType_HISTOGRAM,
		"kvfabric_leases":                               dto.MetricType_GAUGE,
		"kvfabric_imports_total":                        dto.MetricType_COUNTER,
		"kvfabric_import_duration_seconds":              dto.MetricType_HISTOGRAM,
		"kvfabric_import_chunk_duration_seconds":        dto.MetricType_HISTOGRAM,
		"kvfabric_lease_hold_duration_seconds":          dto.MetricType_HISTOGRAM,
		"kvfabric_leases_ended_early_total":             dto.MetricType_COUNTER,
		"kvfabric_checksum_claims_refused_total":        dto.MetricType_COUNTER,
		"kvfabric_lease_renewals_refused_total":         dto.MetricType_COUNTER,
		"kvfabric_index_stores_refused_total":           dto.MetricType_COUNTER,
		"kvfabric_lane_pending_connections":             dto.MetricType_GAUGE,
		"kvfabric_lane_pending_refused_total":           dto.MetricType_COUNTER,
		"kvfabric_lane_handshake_failures_total":        dto.MetricType_COUNTER,
		"kvfabric_lane_accept_errors_total":             dto.MetricType_COUNTER,
		"kvfabric_engine_set_joins_total":               dto.MetricType_COUNTER,
		"kvfabric_engine_sessions":                      dto.MetricType_GAUGE,
		"kvfabric_engine_sessions_refused_total":        dto.MetricType_COUNTER,
		"kvfabric_index_entries":                        dto.MetricType_GAUGE,
		"kvfabric_index_events_held":                    dto.MetricType_GAUGE,
		"kvfabric_members":                              dto.MetricType_GAUGE,
		"kvfabric_members_gone":                         dto.MetricType_GAUGE,
		"kvfabric_gossip_joined":                        dto.MetricType_GAUGE,
		"kvfabric_gossip_join_failures_total":           dto.MetricType_COUNTER,
		"kvfabric_gossip_events_published_total":        dto.MetricType_COUNTER,
		"kvfabric_transfer_bytes_total":                 dto.MetricType_COUNTER,
		"kvfabric_peer_request_bytes":                   dto.MetricType_GAUGE,
		"kvfabric_certificate_expiry_timestamp_seconds": dto.MetricType_GAUGE,
		"go_goroutines":                                 dto.MetricType_GAUGE,
		"process_resident_memory_bytes":                 dto.MetricType_GAUGE,
	}
	for name, typ := range want {
		f, ok := fams[name]
		if !ok {
			t.Errorf("no family %s", name)
			continue
		}
		if f.GetType() != typ {
			t.Errorf("%s is a %v, want a %v", name, f.GetType(), typ)
		}
	}
	value := func(name string) float64 {
		f := fams[name]
		if f == nil || len(f.Metric) != 1 {
			t.Fatalf("%s: want one sample", name)
		}
		m := f.Metric[0]
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		default:
			return m.GetGauge().GetValue()
		}
	}
	if v := value("kvfabric_pool_registered_blocks"); v != 8 {
		t.Errorf("kvfabric_pool_registered_blocks = %v after put --generate 8", v)
	}
	if v := value("kvfabric_gossip_events_published_total"); v != 8 {
		t.Errorf("kvfabric_gossip_events_published_total = %v after 8 blocks stored", v)
	}
	if v := value("kvfabric_gossip_joined"); v != 1 {
		t.Errorf("kvfabric_gossip_joined = %v for a node with no seeds", v)
	}
	// Labels carry what a family is split by.
	if n := len(fams["kvfabric_gossip_join_failures_total"].GetMetric()); n != 4 {
		t.Errorf("join failures by %d reasons, want 4", n)
	}
	if n := len(fams["kvfabric_engine_sessions_refused_total"].GetMetric()); n != 2 {
		t.Errorf("sessions refused by %d bounds, want 2", n)
	}
	if n := len(fams["kvfabric_certificate_expiry_timestamp_seconds"].GetMetric()); n != 2 {
		t.Errorf("%d certificates' expiry, want the node's and the CA's", n)
	}
	// A histogram's buckets are cumulative and end at its count.
	h := fams["kvfabric_pool_alloc_duration_seconds"].GetMetric()[0].GetHistogram()
	var prev uint64
	for _, b := range h.GetBucket() {
		if b.GetCumulativeCount() < prev || b.GetCumulativeCount() > h.GetSampleCount() {
			t.Fatalf("bucket le=%g has %d after %d, of %d in all", b.GetUpperBound(), b.GetCumulativeCount(), prev, h.GetSampleCount())
		}
		prev = b.GetCumulativeCount()
	}
}

// A Prometheus bucket counts durations up to and including its bound, so
// bucket i's bound is 2^i - 1 ns: a duration of exactly 2^i ns counts in
// the next one. The shortest bucket takes everything under it, durations
// past the longest count only in +Inf, and the sum is kept.
func TestHistogramBuckets(t *testing.T) {
	var h pool.Histogram
	for _, d := range []time.Duration{
		500 * time.Nanosecond,
		3 * time.Microsecond,
		4096 * time.Nanosecond, // exactly 2^12 ns
		2 * time.Second,
		time.Duration(1) << 41, // past 2^40 ns
	} {
		h.Counts[bits.Len64(uint64(d))]++
		h.Sum += d
	}
	ch := make(chan prometheus.Metric, 1)
	exporter{ch}.histogram("x_seconds", "x", h)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	hist := m.GetHistogram()
	wantSum := (500*time.Nanosecond + 3*time.Microsecond + 4096*time.Nanosecond + 2*time.Second + time.Duration(1)<<41).Seconds()
	if hist.GetSampleCount() != 5 || math.Abs(hist.GetSampleSum()-wantSum) > 1e-6 {
		t.Fatalf("count %d, sum %v; want 5 and %v", hist.GetSampleCount(), hist.GetSampleSum(), wantSum)
	}
	le := func(i int) float64 { return (math.Ldexp(1, i) - 1) / 1e9 }
	want := map[float64]uint64{
		le(10): 1, // 1.023 µs: the 500 ns
		le(11): 1,
		le(12): 2, // 4.095 µs: and the 3 µs, not the 4.096 µs
		le(13): 3, // and the 4.096 µs
		le(30): 3,
		le(31): 4, // and the 2 s
		le(40): 4, // the 2^41 ns counts only in +Inf
	}
	got := map[float64]uint64{}
	for _, b := range hist.GetBucket() {
		got[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	for bound, n := range want {
		if got[bound] != n {
			t.Errorf("bucket le=%g: %d, want %d", bound, got[bound], n)
		}
	}
	if len(got) != 31 {
		t.Errorf("%d buckets, want 31 (2^10 to 2^40 ns)", len(got))
	}
}
