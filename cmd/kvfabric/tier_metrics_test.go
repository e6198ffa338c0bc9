package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvfabric/kvfabric/fabric"
)

// A put past its block set copies blocks down to the disk tier: the
// tier's families are exported per tier, and status shows the tier.
func TestTierMetricsAndStatus(t *testing.T) {
	var tierDir string
	a := startScraped(t, "tier1", func(c *fabric.Config, dir string) {
		tierDir = filepath.Join(dir, "tier")
		c.Tiers = []string{"disk=" + tierDir + ":64MiB"}
	})
	sock := []string{"--socket", a.EngineSocket()}
	engine := []string{"--tp", "1", "--layers", "2", "--head-dim", "16", "--slots", "64"}
	if code, _, errs := runCmd(t, "", append(append([]string{"put", "--generate", "200"}, sock...), engine...)...); code != 0 {
		t.Fatalf("put: %s", errs)
	}
	fams := scrapeUntil(t, a, "the tier's offloads exported", func(fams map[string]*dto.MetricFamily) error {
		f := fams["kvfabric_tier_offloads_total"]
		if f == nil || len(f.Metric) != 1 || f.Metric[0].GetCounter().GetValue() < 200-64 {
			return fmt.Errorf("offloads: %v", f)
		}
		return nil
	})
	for name, typ := range map[string]dto.MetricType{
		"kvfabric_tier_blocks":                   dto.MetricType_GAUGE,
		"kvfabric_tier_bytes":                    dto.MetricType_GAUGE,
		"kvfabric_tier_restores_total":           dto.MetricType_COUNTER,
		"kvfabric_tier_checksum_failures_total":  dto.MetricType_COUNTER,
		"kvfabric_tier_evictions_total":          dto.MetricType_COUNTER,
		"kvfabric_tier_restore_duration_seconds": dto.MetricType_HISTOGRAM,
		"kvfabric_tier_queue_full_total":         dto.MetricType_COUNTER,
		"kvfabric_tier_offload_skipped_total":    dto.MetricType_COUNTER,
	} {
		f := fams[name]
		if f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want a %v", name, f, typ)
		}
	}
	// The blocks given up for allocations are the pool's one count (the
	// put has ended: no allocation gives up more).
	if f := fams["kvfabric_tier_offload_skipped_total"]; f != nil && len(f.Metric) == 1 {
		if got, want := f.Metric[0].GetCounter().GetValue(), float64(a.Metrics().Pool.OffloadsGivenUp); got != want {
			t.Errorf("kvfabric_tier_offload_skipped_total %v, want the pool's OffloadsGivenUp %v", got, want)
		}
	}
	if b := fams["kvfabric_tier_blocks"].Metric[0].GetGauge().GetValue(); b < 200-64 {
		t.Errorf("kvfabric_tier_blocks %v, want %d or more", b, 200-64)
	}
	code, out, errs := runCmd(t, "", append([]string{"status"}, sock...)...)
	if code != 0 || !strings.Contains(out, "CHECKSUM FAILURES") || !strings.Contains(out, tierDir) {
		t.Fatalf("status: exit %d: %s %s", code, out, errs)
	}
}
