package report

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// figures parses page as XML (the report is written well formed, so a
// strict parser reads it whole) and returns, per figure caption, the
// number of SVG path and text elements its plot drew.
func figures(t *testing.T, page []byte) map[string][2]int {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(page))
	dec.Strict = true
	dec.AutoClose = nil
	dec.Entity = xml.HTMLEntity
	out := map[string][2]int{}
	var caption string
	var inCaption bool
	depth := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("report is not well formed: %v", err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			depth++
			switch e.Name.Local {
			case "figcaption":
				inCaption = true
			case "path", "text":
				c := out[caption]
				if e.Name.Local == "path" {
					c[0]++
				} else {
					c[1]++
				}
				out[caption] = c
			}
		case xml.EndElement:
			depth--
			if e.Name.Local == "figcaption" {
				inCaption = false
			}
		case xml.CharData:
			if inCaption {
				caption = strings.TrimSpace(string(e))
			}
		}
	}
	if depth != 0 {
		t.Fatalf("unbalanced elements: depth %d at the end", depth)
	}
	delete(out, "")
	return out
}

func fullRecord() *Record {
	r := &Record{Title: "everything", Kind: "scenario", Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Summary:   map[string]any{"requests": 3, "policy": "kv-aware", "by_transport": map[string]int{"quic": 4}},
		LatencyMs: map[string][]float64{"import": {3, 1, 2, 10}, "lease": {0.5, 0.7}},
		HitRate:   map[string][]Point{"local": {{1, 0.2}, {2, 0.5}}, "cluster": {{1, 0.3}, {2, 0.6}}},
		Members:   map[string][]Point{"node1": {{0, 8}, {10, 4}, {130, 8}}, "node5": {{0, 8}, {10, 4}, {140, 8}}},
		Events:    []Event{{10, "partition 4/4 <a&b>"}, {130, "heal"}},
	}
	for _, bs := range []int{64 << 10, 256 << 10, 1 << 20} {
		for _, cs := range []int{1 << 20, 8 << 20, 64 << 20} {
			r.Throughput = append(r.Throughput, Throughput{BlockBytes: bs, ChunkBytes: cs, GBps: float64(bs>>10) / 100 * float64(cs>>20) / 8})
		}
	}
	return r
}

func TestHTMLHoldsEveryPlot(t *testing.T) {
	page, err := HTML(fullRecord())
	if err != nil {
		t.Fatal(err)
	}
	figs := figures(t, page)
	want := []string{"Latency CDF", "Hit rate over time", "Throughput by block size", "Throughput by chunk size", "Members seen per node"}
	if len(figs) != len(want) {
		t.Fatalf("figures %v, want %v", figs, want)
	}
	for _, w := range want {
		// Axes, lines and legend are paths; titles, ticks and legend
		// labels are text: a plot that drew nothing has neither.
		if c := figs[w]; c[0] < 5 || c[1] < 5 {
			t.Fatalf("figure %q drew %d paths and %d texts", w, c[0], c[1])
		}
	}
	s := string(page)
	// Self-contained: nothing fetched from elsewhere.
	for _, ref := range []string{"<script", "<link", "src=", "@import"} {
		if strings.Contains(s, ref) {
			t.Fatalf("report refers to outside content (%s)", ref)
		}
	}
	// Legends name the series; events are escaped.
	for _, w := range []string{"node5", "chunk 64 MiB", "block 256 KiB", "lease", "partition 4/4 &lt;a&amp;b&gt;", "kv-aware"} {
		if !strings.Contains(s, w) {
			t.Fatalf("report lacks %q", w)
		}
	}
}

// One chunk size per block size: the chunk-size plot would be one point a
// line, so only the block-size plot is drawn; a record with nothing to
// plot is a page with its table.
func TestHTMLOnlyWhatTheRecordHas(t *testing.T) {
	r := &Record{Title: "blocks", Throughput: []Throughput{{4096, 1 << 20, 1}, {65536, 1 << 20, 3}}}
	page, err := HTML(r)
	if err != nil {
		t.Fatal(err)
	}
	if figs := figures(t, page); len(figs) != 1 || figs["Throughput by block size"][0] == 0 {
		t.Fatalf("figures %v", figs)
	}
	page, err = HTML(&Record{Title: "bare", Summary: map[string]any{"x": 1}})
	if err != nil {
		t.Fatal(err)
	}
	if figs := figures(t, page); len(figs) != 0 || bytes.Contains(page, []byte("<svg")) {
		t.Fatalf("figures %v in a record without samples", figs)
	}
	if _, err := HTML(&Record{}); !errors.Is(err, ErrEmpty) {
		t.Fatalf("untitled record: %v", err)
	}
	if _, err := HTML(&Record{Title: "bad", Throughput: []Throughput{{0, 1 << 20, 1}}}); err == nil || !strings.Contains(err.Error(), "block size 0") {
		t.Fatalf("block size 0: %v", err)
	}
}

func TestWriteFilesRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	r := fullRecord()
	if err := WriteFiles(dir, "run", r); err != nil {
		t.Fatal(err)
	}
	back, err := ReadRecord(filepath.Join(dir, "run.json"))
	if err != nil {
		t.Fatal(err)
	}
	if back.Title != r.Title || len(back.Throughput) != 9 || back.Members["node5"][2].X != 140 || !back.Created.Equal(r.Created) {
		t.Fatalf("read back %+v", back)
	}
	page, err := os.ReadFile(filepath.Join(dir, "run.html"))
	if err != nil {
		t.Fatal(err)
	}
	if len(figures(t, page)) != 5 {
		t.Fatal("written page lacks its figures")
	}
	if _, err := ReadRecord(filepath.Join(dir, "run.html")); err == nil {
		t.Fatal("an HTML file read as a record")
	}
}

// A table puts series side by side: a column each, a row per figure, in
// the order set; merged records keep their columns apart by title; the
// page shows it as one table with a header of the columns.
func TestTableSideBySide(t *testing.T) {
	tb := &Table{}
	tb.Set("requests", "random", "50")
	tb.Set("requests", "kv-aware", "50")
	tb.Set("local hit rate", "kv-aware", "0.610")
	tb.Set("local hit rate", "random", "0.220")
	if got := tb.Columns; len(got) != 2 || got[0] != "random" || got[1] != "kv-aware" {
		t.Fatalf("columns %v", got)
	}
	if tb.Cell("local hit rate", "random") != "0.220" || tb.Cell("local hit rate", "kv-aware") != "0.610" || tb.Cell("nope", "random") != "" {
		t.Fatalf("cells %+v", tb.Rows)
	}
	page, err := HTML(&Record{Title: "t", Table: tb})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<tr><th></th><th>random</th><th>kv-aware</th></tr>", "<tr><td>local hit rate</td><td>0.220</td><td>0.610</td></tr>"} {
		if !strings.Contains(string(page), want) {
			t.Fatalf("page lacks %q:\n%s", want, page)
		}
	}
	figures(t, page) // well formed
	m := Merge(&Record{Title: "a", Table: tb, HitRateBound: 0.5}, &Record{Title: "b", Table: tb, HitRateBound: 0.7})
	if len(m.Table.Columns) != 4 || m.Table.Cell("requests", "b: kv-aware") != "50" || m.HitRateBound != 0.7 {
		t.Fatalf("merged table %+v, bound %v", m.Table, m.HitRateBound)
	}
}

// A CDF's fraction axis is 0..1 whatever the number of series (the legend
// does not stretch it).
func TestLatencyCDFAxis(t *testing.T) {
	samples := map[string][]float64{}
	for i := range 5 {
		samples[string(rune('a'+i))] = []float64{1, 2, float64(3 + i)}
	}
	p, err := latencyCDF(samples)
	if err != nil {
		t.Fatal(err)
	}
	if p.Y.Min != 0 || p.Y.Max != 1 {
		t.Fatalf("CDF axis %v..%v, want 0..1", p.Y.Min, p.Y.Max)
	}
}

// The hit-rate plot draws the bound as one more line, in its legend, and
// keeps it inside the axis; without a bound, nothing more is drawn.
func TestHitRateBound(t *testing.T) {
	series := map[string][]Point{"cluster": {{1, 0.2}, {2, 0.3}}}
	bounded, err := hitRate(series, 0.8)
	if err != nil {
		t.Fatal(err)
	}
	if bounded.Y.Max < 0.8 || bounded.Y.Min != 0 {
		t.Fatalf("axis %v..%v does not hold the bound 0.8", bounded.Y.Min, bounded.Y.Max)
	}
	page, err := HTML(&Record{Title: "t", HitRate: series, HitRateBound: 0.8})
	if err != nil || !strings.Contains(string(page), "reuse bound of the input (0.800)") {
		t.Fatalf("page without the bound's label (%v)", err)
	}
	plain, err := HTML(&Record{Title: "t", HitRate: series})
	if err != nil || strings.Contains(string(plain), "reuse bound") {
		t.Fatalf("page without a bound draws one (%v)", err)
	}
}

// Each curve is a figure of its own, titled, with its series in the legend.
func TestHTMLCurves(t *testing.T) {
	r := &Record{Title: "scale", Kind: "simulation", Curves: []Curve{
		{Title: "Index memory per node", X: "nodes", Y: "bytes", Series: map[string][]Point{"bytes/pair": {{64, 15}, {256, 15.2}}}},
		{Title: "Propagation delay", X: "nodes", Y: "ms", Series: map[string][]Point{"p50": {{64, 90}, {256, 120}}, "p99": {{64, 200}, {256, 400}}}},
	}}
	page, err := HTML(r)
	if err != nil {
		t.Fatal(err)
	}
	figs := figures(t, page)
	for _, w := range []string{"Index memory per node", "Propagation delay"} {
		if c := figs[w]; c[0] < 5 || c[1] < 5 {
			t.Fatalf("figure %q drew %d paths and %d texts (figures %v)", w, c[0], c[1], figs)
		}
	}
	if len(figs) != 2 || !strings.Contains(string(page), "p99") {
		t.Fatalf("figures %v", figs)
	}
}
