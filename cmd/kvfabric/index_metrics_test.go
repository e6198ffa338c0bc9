package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// An agent in owned mode (alone: it owns every hash) exports the owned
// index's families with what happened: a put's stores sent to the owner
// and applied by it, a lookup's cache misses; status shows the mode and
// the counts.
func TestOwnedIndexMetricsExported(t *testing.T) {
	a := startScraped(t, "own1", func(c *fabric.Config, _ string) {
		c.IndexMode = fabric.IndexOwned
	})
	sock := []string{"--socket", a.EngineSocket()}
	code, out, errs := runCmd(t, "", append([]string{"put", "--generate", "8", "--tp", "1", "--layers", "2", "--head-dim", "16"}, sock...)...)
	if code != 0 {
		t.Fatalf("put: %s", errs)
	}
	hashes := strings.Split(strings.TrimSpace(out), ",")
	if len(hashes) != 8 {
		t.Fatalf("put printed %q, want 8 hashes", out)
	}
	sample := func(fams map[string]*dto.MetricFamily, name, label, value string) float64 {
		for _, m := range fams[name].GetMetric() {
			for _, l := range m.GetLabel() {
				if label == "" || (l.GetName() == label && l.GetValue() == value) {
					return m.GetCounter().GetValue() + m.GetGauge().GetValue()
				}
			}
			if label == "" {
				return m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		return -1
	}
	var fams map[string]*dto.MetricFamily
	scrape := func(what string, ok func() error) {
		t.Helper()
		fams = scrapeUntil(t, a, what, func(f map[string]*dto.MetricFamily) error {
			fams = f
			return ok()
		})
	}
	scrape("the 8 stores sent to their owner and applied", func() error {
		if s, r := sample(fams, "kvfabric_owned_index_ops_total", "direction", "sent"), sample(fams, "kvfabric_owned_index_ops_total", "direction", "received"); s != 8 || r != 8 {
			return fmt.Errorf("ops sent %v, received %v", s, r)
		}
		return nil
	})
	if code, _, errs := runCmd(t, "", append([]string{"lookup", "--hashes", strings.TrimSpace(out)}, sock...)...); code != 0 {
		t.Fatalf("lookup: %s", errs)
	}
	scrape("the lookup's cache misses", func() error {
		if v := sample(fams, "kvfabric_owned_index_cache_total", "result", "miss"); v < 8 {
			return fmt.Errorf("cache misses %v after a lookup of 8 hashes never asked", v)
		}
		return nil
	})
	for name, typ := range map[string]dto.MetricType{
		"kvfabric_index_mode":                        dto.MetricType_GAUGE,
		"kvfabric_index_mode_mismatched_members":     dto.MetricType_GAUGE,
		"kvfabric_index_events_refused_total":        dto.MetricType_COUNTER,
		"kvfabric_gossip_bytes_total":                dto.MetricType_COUNTER,
		"kvfabric_owned_index_ops_total":             dto.MetricType_COUNTER,
		"kvfabric_owned_index_op_calls_total":        dto.MetricType_COUNTER,
		"kvfabric_owned_index_lookups_total":         dto.MetricType_COUNTER,
		"kvfabric_owned_index_cache_total":           dto.MetricType_COUNTER,
		"kvfabric_owned_index_handoffs_total":        dto.MetricType_COUNTER,
		"kvfabric_owned_index_handoff_ops_total":     dto.MetricType_COUNTER,
		"kvfabric_owned_index_stream_errors_total":   dto.MetricType_COUNTER,
		"kvfabric_owned_index_stream_replaces_total": dto.MetricType_COUNTER,
	} {
		if f := fams[name]; f == nil || f.GetType() != typ {
			t.Errorf("%s: %v, want a %v", name, f, typ)
		}
	}
	if v := sample(fams, "kvfabric_index_mode", "mode", "owned/3"); v != 1 {
		t.Errorf("kvfabric_index_mode{mode=owned/3} = %v", v)
	}
	if v := sample(fams, "kvfabric_owned_index_stream_replaces_total", "", ""); v < 1 {
		t.Errorf("stream replaces %v: the owner's stream starts with one", v)
	}
	code, out, errs = runCmd(t, "", append([]string{"status"}, sock...)...)
	if code != 0 || !strings.Contains(out, "index: owned, 3 owners a hash") || !strings.Contains(out, "events: 8 sent to owners") {
		t.Fatalf("status: exit %d: %s %s", code, out, errs)
	}
}

// Status names the members in another index mode, and says nothing of it
// where there are none or the agent predates index modes.
func TestPrintIndex(t *testing.T) {
	for _, tc := range []struct {
		desc string
		s    *fabricpb.StatusResponse
		want []string
	}{
		{"from before index modes", &fabricpb.StatusResponse{}, nil},
		{"whole", &fabricpb.StatusResponse{IndexMode: "whole", GossipBytesIn: 2048, GossipBytesOut: 1024, GossipRangeRepairs: 7, GossipSnapshotRepairs: 1},
			[]string{"index: whole; gossip 2.0 KiB in, 1.0 KiB out; event gaps repaired: 7 from origins' logs, 1 by snapshot"}},
		{"a member in another mode", &fabricpb.StatusResponse{IndexMode: "whole", IndexMismatchedMembers: 1, Members: []*fabricpb.Member{
			{Node: "a", IndexMode: "whole"}, {Node: "b", IndexMode: "owned", IndexReplicas: 2, IndexMismatch: true}}},
			[]string{"MISCONFIGURED: 1 members keep the index in another mode, not used as index peers: b (owned/2)"}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			var b bytes.Buffer
			printIndex(&b, tc.s)
			if tc.want == nil && b.Len() != 0 {
				t.Fatalf("printed %q", b.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Fatalf("printed %q, want %q in it", b.String(), w)
				}
			}
		})
	}
}
