// Command render turns report records (the JSON that replays and scenarios
// write) into one self-contained HTML page with plots; several records are
// drawn together, each series named after its record.
//
//	go run ./testbed/report/render -out compare.html run1/replay.json run2/replay.json
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvfabric/kvfabric/testbed/report"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("render", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "report.html", "the HTML file to write")
	title := fs.String("title", "", "the page's title (if empty, the records' titles)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("render: no record files given")
	}
	var recs []*report.Record
	for _, p := range fs.Args() {
		r, err := report.ReadRecord(p)
		if err != nil {
			return err
		}
		recs = append(recs, r)
	}
	merged := report.Merge(recs...)
	if *title != "" {
		merged.Title = *title
	}
	page, err := report.HTML(merged)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, page, 0o644); err != nil {
		return fmt.Errorf("render: %w", err)
	}
	return nil
}
