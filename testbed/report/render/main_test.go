package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/testbed/report"
)

func TestRenderTwoRecords(t *testing.T) {
	dir := t.TempDir()
	a := &report.Record{Title: "run a", LatencyMs: map[string][]float64{"import": {1, 2, 3}}}
	b := &report.Record{Title: "run b", LatencyMs: map[string][]float64{"import": {2, 4, 8}},
		Members: map[string][]report.Point{"node1": {{X: 0, Y: 8}, {X: 5, Y: 4}, {X: 60, Y: 8}}}}
	for _, r := range []*report.Record{a, b} {
		if err := report.WriteFiles(dir, strings.ReplaceAll(r.Title, " ", "-"), r); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "both.html")
	if err := run([]string{"-out", out, filepath.Join(dir, "run-a.json"), filepath.Join(dir, "run-b.json")}, new(bytes.Buffer)); err != nil {
		t.Fatal(err)
	}
	page, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	s := string(page)
	for _, want := range []string{"run a | run b", "run a: import", "run b: import", "run b: node1", "Members seen per node", "Latency CDF"} {
		if !strings.Contains(s, want) {
			t.Fatalf("page lacks %q", want)
		}
	}
	if n := strings.Count(s, "<svg"); n != 2 {
		t.Fatalf("%d plots, want the CDF and the members", n)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no record files"},
		{[]string{filepath.Join(dir, "missing.json")}, "no such file"},
		{[]string{out}, "report: " + out},
	} {
		if err := run(c.args, new(bytes.Buffer)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.args, err, c.want)
		}
	}
}
