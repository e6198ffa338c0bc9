package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// A put past its block set copies blocks down to the disk tier: the
// tier's families are exported per tier, and status shows the tier.
func TestTierMetricsAndStatus(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvftier")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var running atomic.Pointer[fabric.Agent]
	c := fabric.DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = "tier1", filepath.Join(dir, "d"), filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	c.Pools = []string{"host=64MiB"}
	c.Tiers = []string{"disk=" + filepath.Join(dir, "tier") + ":64MiB"}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c.MetricsHandler = metricsHandler(&running)
	a, err := fabric.Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	running.Store(a)
	sock := []string{"--socket", a.EngineSocket()}
	engine := []string{"--tp", "1", "--layers", "2", "--head-dim", "16", "--slots", "64"}
	if code, _, errs := runCmd(t, "", append(append([]string{"put", "--generate", "200"}, sock...), engine...)...); code != 0 {
		t.Fatalf("put: %s", errs)
	}
	var fams map[string]*dto.MetricFamily
	wait.For(t, 10*time.Second, "the tier's offloads exported", func() error {
		resp, err := http.Get("http://" + a.MetricsAddr() + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		if fams, err = p.TextToMetricFamilies(resp.Body); err != nil {
			t.Fatalf("the exposition does not parse: %v", err)
		}
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
	} {
		f := fams[name]
		if f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want a %v", name, f, typ)
		}
	}
	if b := fams["kvfabric_tier_blocks"].Metric[0].GetGauge().GetValue(); b < 200-64 {
		t.Errorf("kvfabric_tier_blocks %v, want %d or more", b, 200-64)
	}
	code, out, errs := runCmd(t, "", append([]string{"status"}, sock...)...)
	if code != 0 || !strings.Contains(out, "CHECKSUM FAILURES") || !strings.Contains(out, filepath.Join(dir, "tier")) {
		t.Fatalf("status: exit %d: %s %s", code, out, errs)
	}
}
