package main

import (
	"fmt"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvfabric/kvfabric/fabric"
)

// A host tier's families carry kind="host" and no path, and status
// shows its row first.
func TestHostTierMetricsAndStatus(t *testing.T) {
	a := startScraped(t, "hosttier", func(c *fabric.Config, dir string) {
		c.Tiers = []string{"host=16MiB"}
	})
	sock := []string{"--socket", a.EngineSocket()}
	engine := []string{"--tp", "1", "--layers", "2", "--head-dim", "16", "--slots", "64"}
	if code, _, errs := runCmd(t, "", append(append([]string{"put", "--generate", "200"}, sock...), engine...)...); code != 0 {
		t.Fatalf("put: %s", errs)
	}
	scrapeUntil(t, a, "the host tier's offloads exported", func(fams map[string]*dto.MetricFamily) error {
		f := fams["kvfabric_tier_offloads_total"]
		if f == nil || len(f.Metric) != 1 || f.Metric[0].GetCounter().GetValue() < 200-64 {
			return fmt.Errorf("offloads: %v", f)
		}
		labels := map[string]string{}
		for _, l := range f.Metric[0].Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["kind"] != "host" || labels["path"] != "" {
			return fmt.Errorf("labels %v, want kind host, no path", labels)
		}
		return nil
	})
	code, out, errs := runCmd(t, "", append([]string{"status"}, sock...)...)
	if code != 0 || !strings.Contains(out, "CHECKSUM FAILURES") || !strings.Contains(out, "\nhost ") {
		t.Fatalf("status: exit %d: %s %s", code, out, errs)
	}
}
