package main

import (
	"context"
	"io"
	"log/slog"
	"math"
	"math/bits"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/pool"
)

// A scrape of a running agent parses with Prometheus's own parser and
// carries every family, with the types and values of what happened.
func TestMetricsExposition(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvfmet")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var running atomic.Pointer[fabric.Agent]
	c := fabric.DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = "met1", filepath.Join(dir, "d"), filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	c.Pools = []string{"host=64MiB"}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c.MetricsHandler = metricsHandler(&running)
	a, err := fabric.Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	running.Store(a)
	if code, _, errs := runCmd(t, "", "put", "--socket", a.EngineSocket(), "--generate", "8", "--tp", "1", "--layers", "2", "--head-dim", "16"); code != 0 {
		t.Fatalf("put: %s", errs)
	}

	resp, err := http.Get("http://" + a.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the exposition does not parse: %v", err)
	}
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

// Durations under 2^i ns count in the bucket of 2^i ns and every one above
// it; the shortest bucket takes everything under it, and the sum is kept.
func TestHistogramBuckets(t *testing.T) {
	var h pool.Histogram
	for _, d := range []time.Duration{500 * time.Nanosecond, 3 * time.Microsecond, 2 * time.Second} {
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
	if hist.GetSampleCount() != 3 || math.Abs(hist.GetSampleSum()-2.0000035) > 1e-9 {
		t.Fatalf("count %d, sum %v; want 3 and 2.0000035", hist.GetSampleCount(), hist.GetSampleSum())
	}
	want := map[float64]uint64{
		math.Ldexp(1, 10) / 1e9: 1, // 1.024 µs: the 500 ns
		math.Ldexp(1, 11) / 1e9: 1,
		math.Ldexp(1, 12) / 1e9: 2, // 4.096 µs: and the 3 µs
		math.Ldexp(1, 30) / 1e9: 2, // 1.07 s
		math.Ldexp(1, 31) / 1e9: 3, // 2.15 s: and the 2 s
		math.Ldexp(1, 40) / 1e9: 3,
	}
	got := map[float64]uint64{}
	for _, b := range hist.GetBucket() {
		got[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	for le, n := range want {
		if got[le] != n {
			t.Errorf("bucket le=%g: %d, want %d", le, got[le], n)
		}
	}
	if len(got) != 31 {
		t.Errorf("%d buckets, want 31 (2^10 to 2^40 ns)", len(got))
	}
}
