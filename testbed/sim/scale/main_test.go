package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Bad flags are refused before any node starts.
func TestFlagsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-nodes", "64,x"}, `-nodes: "x"`},
		{[]string{"-nodes", "1"}, `-nodes: "1"`},
		{[]string{"-rate", "0"}, "must be positive"},
		{[]string{"-lifetime", "-1s"}, "must be positive"},
		{[]string{"-nope"}, "flag provided but not defined"},
		{[]string{"-mode", "whole,sharded"}, `-mode: "sharded"`},
		{[]string{"-mode", "owned", "-replicas", "9"}, "-replicas 9"},
	} {
		var out, errs bytes.Buffer
		err := run(c.args, &out, &errs)
		if err == nil || !strings.Contains(err.Error()+errs.String(), c.want) {
			t.Errorf("%v: error %v (stderr %q), want %q", c.args, err, errs.String(), c.want)
		}
	}
}

// The model's curves extrapolate from the measured bytes per event: at
// 1,000 nodes of 10^5 blocks at 15 bytes a pair, 1.5 GB of index; events
// in at N·r·g; gossip capacity 112 KB/s ÷ g.
func TestModelCurves(t *testing.T) {
	m := model{rate: 333, blocks: 1e5, pairBytes: 15}
	res := []Result{{Nodes: 16, GossipPerEvent: 100}, {Nodes: 64, GossipPerEvent: 140}}
	cs := m.curves(res)
	if len(cs) != 3 {
		t.Fatalf("%d model curves, want 3", len(cs))
	}
	at := func(c int, series string, n float64) float64 {
		for _, p := range cs[c].Series[series] {
			if p.X == n {
				return p.Y
			}
		}
		t.Fatalf("curve %q series %q has no point at %v", cs[c].Title, series, n)
		return 0
	}
	near := func(what string, got, want float64) {
		if got < want*0.999 || got > want*1.001 {
			t.Errorf("%s = %v, want %v", what, got, want)
		}
	}
	near("index GB at 1000", at(0, "index", 1000), 1.5)
	near("events in MB/s at 1000", at(1, "events in", 1000), 1000*333*120/1e6)
	near("gossip capacity", at(2, "gossip capacity", 64), 4*1400/0.05/120)
	near("published at 256", at(2, "published", 256), 256*333)
	if cs := m.curves(nil); cs != nil {
		t.Errorf("curves without results: %v", cs)
	}
	r := record(res, m)
	if len(r.Curves) != 11+3 {
		t.Errorf("record has %d curves, want 14", len(r.Curves))
	}
}

// The owned slices' model: R·B·b of slice per node, flat in N; ops in at
// R·r·d and probes at (N-1)/5 s a node.
func TestOwnedModelCurves(t *testing.T) {
	m := model{rate: 333, blocks: 1e5, pairBytes: 15, replicas: 3}
	res := []Result{{Mode: "whole", Nodes: 64, GossipPerEvent: 100}, {Mode: "owned", Nodes: 64, DirectPerEvent: 80}}
	cs := m.curves(res)
	if len(cs) != 5 {
		t.Fatalf("%d model curves, want 5 (3 whole, 2 owned)", len(cs))
	}
	at := func(c int, series string, n float64) float64 {
		for _, p := range cs[c].Series[series] {
			if p.X == n {
				return p.Y
			}
		}
		t.Fatalf("curve %q series %q has no point at %v", cs[c].Title, series, n)
		return 0
	}
	if got, want := at(3, "slice", 1000), 3*1e5*15/1e9; got != want {
		t.Errorf("slice GB at 1000 = %v, want %v", got, want)
	}
	if got, want := at(3, "slice", 10000), at(3, "slice", 1000); got != want {
		t.Errorf("slice at 10,000 nodes %v, at 1,000 %v: want flat", got, want)
	}
	if got, want := at(4, "ops and probes in", 1000), (3*333*80+999.0/5*probeBytes)/1e6; got < want*0.999 || got > want*1.001 {
		t.Errorf("calls in MB/s at 1000 = %v, want %v", got, want)
	}
}

// -from renders a report from a run's printed results; a file without
// results is refused.
func TestFromResults(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "run.out")
	os.WriteFile(good, []byte("16 nodes: start: converged in 1s\n{\"nodes\":16,\"gossip_in_bytes_per_applied_event\":100}\n"), 0o644)
	bad := filepath.Join(dir, "bad.out")
	os.WriteFile(bad, []byte("{\"nodes\":0}\n"), 0o644)
	var out, errs bytes.Buffer
	if err := run([]string{"-from", good, "-report", dir}, &out, &errs); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(filepath.Join(dir, "scale.html"))
	if err != nil || !strings.Contains(string(page), "Model: whole index per node") {
		t.Fatalf("report: %v, model curves missing", err)
	}
	for _, f := range []string{bad, filepath.Join(dir, "none")} {
		if err := run([]string{"-from", f, "-report", dir}, &out, &errs); err == nil {
			t.Errorf("-from %s accepted", f)
		}
	}
}
