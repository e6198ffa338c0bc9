// Package report writes what a testbed run measured twice: a JSON record,
// for tools and for comparing runs, and one self-contained HTML file whose
// plots (SVG drawn by gonum.org/v1/plot) are inlined, so that it opens in a
// browser from anywhere with nothing beside it.
//
// A record carries whichever of these it has; each present one becomes a
// plot:
//
//	field       plot
//	latency_ms  CDF of each named latency sample (the fraction axis 0..1)
//	hit_rate    hit rate over time, one line per series, with
//	            hit_rate_bound (the best the input allows) as a dashed line
//	throughput  GB/s against block size, one line per import chunk size
//	            (and against chunk size when one block size was run)
//	members     members each node sees over time, with the record's
//	            events (a partition, a heal) listed under it
package report

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// ErrEmpty is returned for a record with nothing to report.
var ErrEmpty = errors.New("report: record has no title")

// Record is one run's results.
type Record struct {
	Title   string    `json:"title"`
	Kind    string    `json:"kind"` // "replay", "scenario", "throughput"
	Created time.Time `json:"created"`
	// Summary holds the run's key figures, shown as a table.
	Summary map[string]any `json:"summary,omitempty"`
	// Table holds figures side by side, one column per series (a
	// replay's policies), shown under the summary.
	Table *Table `json:"table,omitempty"`
	// LatencyMs holds latency samples in milliseconds by name.
	LatencyMs map[string][]float64 `json:"latency_ms,omitempty"`
	// HitRate holds hit rate (0..1) over time (seconds) by series name.
	HitRate map[string][]Point `json:"hit_rate,omitempty"`
	// Throughput holds one point per (block size, chunk size) run.
	Throughput []Throughput `json:"throughput,omitempty"`
	// Members holds, per node, how many members it saw alive over time.
	Members map[string][]Point `json:"members,omitempty"`
	// Events mark moments of a scenario (seconds from its start).
	Events []Event `json:"events,omitempty"`
	// HitRateBound is the highest hit rate the run's input allows (a
	// replay's trace reuse bound), drawn on the hit-rate plot; 0 draws
	// none.
	HitRateBound float64 `json:"hit_rate_bound,omitempty"`
	// Curves are figures of one quantity against another.
	Curves []Curve `json:"curves,omitempty"`
}

// Table is figures side by side: Columns name the series, each row one
// figure with a cell per column ("" where a series has none).
type Table struct {
	Columns []string   `json:"columns"`
	Rows    []TableRow `json:"rows"`
}

// TableRow is one figure of every series.
type TableRow struct {
	Name  string   `json:"name"`
	Cells []string `json:"cells"`
}

// Set puts value in the row named name under column col, adding the row
// (after the others) and the column where they are new.
func (t *Table) Set(name, col, value string) {
	c := slices.Index(t.Columns, col)
	if c < 0 {
		t.Columns = append(t.Columns, col)
		c = len(t.Columns) - 1
	}
	i := slices.IndexFunc(t.Rows, func(r TableRow) bool { return r.Name == name })
	if i < 0 {
		t.Rows = append(t.Rows, TableRow{Name: name})
		i = len(t.Rows) - 1
	}
	for len(t.Rows[i].Cells) < len(t.Columns) {
		t.Rows[i].Cells = append(t.Rows[i].Cells, "")
	}
	t.Rows[i].Cells[c] = value
}

// Cell returns the value of row name under column col, "" where none.
func (t *Table) Cell(name, col string) string {
	c := slices.Index(t.Columns, col)
	i := slices.IndexFunc(t.Rows, func(r TableRow) bool { return r.Name == name })
	if c < 0 || i < 0 || c >= len(t.Rows[i].Cells) {
		return ""
	}
	return t.Rows[i].Cells[c]
}

// Curve is one figure of y against x, one line per series (the
// control-plane simulation plots each figure against cluster size).
type Curve struct {
	Title  string             `json:"title"`
	X      string             `json:"x"`
	Y      string             `json:"y"`
	Series map[string][]Point `json:"series"`
}

// Point is one (x, y) sample.
type Point struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

// Throughput is one transfer run.
type Throughput struct {
	BlockBytes int     `json:"block_bytes"`
	ChunkBytes int     `json:"chunk_bytes"` // the agents' --import-chunk-bytes
	GBps       float64 `json:"gbps"`
}

// Event is a labelled moment.
type Event struct {
	AtSeconds float64 `json:"at_s"`
	What      string  `json:"what"`
}

// WriteFiles writes dir/name.json and dir/name.html, making dir.
func WriteFiles(dir, name string, r *Record) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	j, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), append(j, '\n'), 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	h, err := HTML(r)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".html"), h, 0o644); err != nil {
		return fmt.Errorf("report: %w", err)
	}
	return nil
}

// ReadRecord reads a record written by WriteFiles.
func ReadRecord(path string) (*Record, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("report: %s: %w", path, err)
	}
	return &r, nil
}

// Merge draws several records on one page: one record is returned as it
// is; with several, every series and summary key is prefixed with its
// record's title, throughput points and events are pooled, and the title
// lists the records'.
func Merge(recs ...*Record) *Record {
	if len(recs) == 1 {
		return recs[0]
	}
	m := &Record{Kind: "comparison", Summary: map[string]any{}, LatencyMs: map[string][]float64{},
		HitRate: map[string][]Point{}, Members: map[string][]Point{}}
	var titles []string
	for _, r := range recs {
		titles = append(titles, r.Title)
		if r.Created.After(m.Created) {
			m.Created = r.Created
		}
		p := r.Title + ": "
		for k, v := range r.Summary {
			m.Summary[p+k] = v
		}
		for k, v := range r.LatencyMs {
			m.LatencyMs[p+k] = v
		}
		for k, v := range r.HitRate {
			m.HitRate[p+k] = v
		}
		for k, v := range r.Members {
			m.Members[p+k] = v
		}
		m.Throughput = append(m.Throughput, r.Throughput...)
		if r.Table != nil {
			if m.Table == nil {
				m.Table = &Table{}
			}
			for _, row := range r.Table.Rows {
				for c, col := range r.Table.Columns {
					if c < len(row.Cells) {
						m.Table.Set(row.Name, p+col, row.Cells[c])
					}
				}
			}
		}
		m.HitRateBound = max(m.HitRateBound, r.HitRateBound)
		for _, e := range r.Events {
			m.Events = append(m.Events, Event{AtSeconds: e.AtSeconds, What: p + e.What})
		}
	}
	m.Title = strings.Join(titles, " | ")
	return m
}

type figure struct {
	Title string
	SVG   template.HTML
}

type row struct{ Key, Value string }

var page = template.Must(template.New("report").Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8"/>
<title>{{.Title}}</title>
<style>
body { font-family: sans-serif; margin: 2em; max-width: 60em; }
table { border-collapse: collapse; }
td, th { border-bottom: 1px solid #ddd; padding: 0.2em 1em 0.2em 0; }
table.side { margin-top: 1.5em; }
table.side td + td, table.side th { text-align: right; }
figure { margin: 2em 0; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p>{{.Kind}}, {{.Created}}</p>
{{if .Rows}}<table>
{{range .Rows}}<tr><td>{{.Key}}</td><td>{{.Value}}</td></tr>
{{end}}</table>{{end}}
{{with .Table}}<table class="side">
<tr><th></th>{{range .Columns}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr><td>{{.Name}}</td>{{range .Cells}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>{{end}}
{{range .Figures}}<figure>
<figcaption>{{.Title}}</figcaption>
{{.SVG}}
</figure>
{{end}}{{if .Events}}<h2>Events</h2>
<ul>
{{range .Events}}<li>{{printf "%.1f" .AtSeconds}} s: {{.What}}</li>
{{end}}</ul>{{end}}
</body>
</html>
`))

// HTML renders the record as one self-contained page.
func HTML(r *Record) ([]byte, error) {
	if r.Title == "" {
		return nil, ErrEmpty
	}
	var figs []figure
	add := func(title string, p *plot.Plot, err error) error {
		if err != nil {
			return fmt.Errorf("report: %s: %w", title, err)
		}
		if p == nil {
			return nil
		}
		svg, err := toSVG(p)
		if err != nil {
			return fmt.Errorf("report: %s: %w", title, err)
		}
		figs = append(figs, figure{Title: title, SVG: template.HTML(svg)})
		return nil
	}
	if len(r.LatencyMs) > 0 {
		p, err := latencyCDF(r.LatencyMs)
		if err := add("Latency CDF", p, err); err != nil {
			return nil, err
		}
	}
	if len(r.HitRate) > 0 {
		p, err := hitRate(r.HitRate, r.HitRateBound)
		if err := add("Hit rate over time", p, err); err != nil {
			return nil, err
		}
	}
	if len(r.Throughput) > 0 {
		p, err := throughputByBlock(r.Throughput)
		if err := add("Throughput by block size", p, err); err != nil {
			return nil, err
		}
		p, err = throughputByChunk(r.Throughput)
		if err := add("Throughput by chunk size", p, err); err != nil {
			return nil, err
		}
	}
	if len(r.Members) > 0 {
		p, err := lines("Members seen per node", "seconds", "members alive", r.Members)
		if err := add("Members seen per node", p, err); err != nil {
			return nil, err
		}
	}
	for _, c := range r.Curves {
		p, err := lines(c.Title, c.X, c.Y, c.Series)
		if err := add(c.Title, p, err); err != nil {
			return nil, err
		}
	}
	var rows []row
	keys := make([]string, 0, len(r.Summary))
	for k := range r.Summary {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v, _ := json.Marshal(r.Summary[k])
		rows = append(rows, row{k, string(v)})
	}
	var buf bytes.Buffer
	err := page.Execute(&buf, struct {
		*Record
		Rows    []row
		Figures []figure
	}{r, rows, figs})
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	return buf.Bytes(), nil
}

// toSVG draws p and returns the svg element alone (no XML prolog), to
// inline in HTML.
func toSVG(p *plot.Plot) (string, error) {
	c := vgsvg.New(18*vg.Centimeter, 11*vg.Centimeter)
	p.Draw(draw.New(c))
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return "", err
	}
	s := buf.String()
	i := strings.Index(s, "<svg")
	if i < 0 {
		return "", errors.New("no svg element drawn")
	}
	return s[i:], nil
}

func latencyCDF(samples map[string][]float64) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Latency CDF"
	p.X.Label.Text = "milliseconds (log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Label.Text = "fraction of samples at or below"
	series := map[string][]Point{}
	for name, s := range samples {
		if len(s) == 0 {
			continue
		}
		v := slices.Clone(s)
		slices.Sort(v)
		if v[0] <= 0 {
			return nil, fmt.Errorf("%s: latency %v ms is not positive (the axis is logarithmic)", name, v[0])
		}
		pts := make([]Point, len(v))
		for i, x := range v {
			pts[i] = Point{x, float64(i+1) / float64(len(v))}
		}
		series[name] = pts
	}
	if len(series) == 0 {
		return nil, nil
	}
	if err := addLines(p, series); err != nil {
		return nil, err
	}
	// A fraction: the axis is 0..1 whatever the legend needs; the legend
	// goes bottom right, where a CDF has no line.
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = false, false
	return p, nil
}

// hitRate draws hit rates over time, with bound (the highest hit rate
// the input allows) as a dashed line when it is positive.
func hitRate(series map[string][]Point, bound float64) (*plot.Plot, error) {
	p, err := lines("Hit rate over time", "seconds", "hit rate", series)
	if err != nil || bound <= 0 {
		return p, err
	}
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for _, pts := range series {
		for _, pt := range pts {
			xmin, xmax = min(xmin, pt.X), max(xmax, pt.X)
		}
	}
	if xmin > xmax {
		xmin, xmax = 0, 1
	}
	l, err := plotter.NewLine(plotter.XYs{{X: xmin, Y: bound}, {X: xmax, Y: bound}})
	if err != nil {
		return nil, fmt.Errorf("bound: %w", err)
	}
	l.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	l.Width = vg.Points(1.5)
	p.Add(l)
	p.Legend.Add(fmt.Sprintf("reuse bound of the input (%.3f)", bound), l)
	p.Y.Min = 0
	p.Y.Max = max(p.Y.Max, bound*(1.05+0.1*float64(len(series)+1)))
	return p, nil
}

func lines(title, x, y string, series map[string][]Point) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	return p, addLines(p, series)
}

func addLines(p *plot.Plot, series map[string][]Point) error {
	names := make([]string, 0, len(series))
	for n := range series {
		names = append(names, n)
	}
	sort.Strings(names)
	for i, n := range names {
		xy := make(plotter.XYs, len(series[n]))
		for j, pt := range series[n] {
			xy[j].X, xy[j].Y = pt.X, pt.Y
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return fmt.Errorf("series %s: %w", n, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / 7)
		p.Add(l)
		p.Legend.Add(n, l)
	}
	// Room above the data for the legend, which gonum draws inside the
	// plot area; and from zero, so that rates and counts read true.
	ymax := 0.0
	for _, pts := range series {
		for _, pt := range pts {
			ymax = max(ymax, pt.Y)
		}
	}
	if ymax > 0 {
		p.Y.Min = 0
		p.Y.Max = ymax * (1.05 + 0.1*float64(len(series)))
	}
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.Add(plotter.NewGrid())
	return nil
}

func throughputByBlock(t []Throughput) (*plot.Plot, error) {
	series := map[string][]Point{}
	for _, r := range t {
		k := fmt.Sprintf("chunk %d MiB", r.ChunkBytes>>20)
		series[k] = append(series[k], Point{float64(r.BlockBytes) / 1024, r.GBps})
	}
	for k := range series {
		sort.Slice(series[k], func(i, j int) bool { return series[k][i].X < series[k][j].X })
	}
	p := plot.New()
	p.Title.Text = "Throughput by block size"
	p.X.Label.Text = "block size (KiB, log scale)"
	p.Y.Label.Text = "GB/s"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	for _, r := range t {
		if r.BlockBytes <= 0 || r.ChunkBytes <= 0 {
			return nil, fmt.Errorf("block size %d, chunk size %d: not positive", r.BlockBytes, r.ChunkBytes)
		}
	}
	return p, addLines(p, series)
}

func throughputByChunk(t []Throughput) (*plot.Plot, error) {
	series := map[string][]Point{}
	for _, r := range t {
		k := fmt.Sprintf("block %d KiB", r.BlockBytes/1024)
		series[k] = append(series[k], Point{float64(r.ChunkBytes) / (1 << 20), r.GBps})
	}
	multi := false
	for k := range series {
		sort.Slice(series[k], func(i, j int) bool { return series[k][i].X < series[k][j].X })
		multi = multi || len(series[k]) > 1
	}
	if !multi {
		return nil, nil // one chunk size per block size: the other plot says it all
	}
	p := plot.New()
	p.Title.Text = "Throughput by chunk size"
	p.X.Label.Text = "import chunk (MiB, log scale)"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	p.Y.Label.Text = "GB/s"
	return p, addLines(p, series)
}
