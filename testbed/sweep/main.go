// Command sweep measures import throughput between two agents on loopback
// over block sizes (page sizes of one model) and import chunk sizes, every
// byte checked, and writes the record and the HTML report with its
// throughput plots.
//
//	go run ./testbed/sweep -pages 4,16,64 -chunks-mib 1,8,64 -report out/
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/testbed"
	"github.com/kvfabric/kvfabric/testbed/report"
)

func ints(s, name string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("sweep: -%s: %q is not a positive integer", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("sweep", flag.ContinueOnError)
	pages := fs.String("pages", "4,16,64", "page sizes in tokens (4 layers, 8 KV heads, head dim 128, bf16: 16 KiB a token)")
	chunks := fs.String("chunks-mib", "1,8,64", "the agents' import chunk sizes in MiB")
	mib := fs.Int("mib", 64, "MiB imported per run")
	bin := fs.String("bin", "", "kvfabric binary (if empty, built from ./cmd/kvfabric)")
	dir := fs.String("report", "", "folder for sweep.json and sweep.html (if empty, a new one in the temporary directory, named on standard error)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ps, err := ints(*pages, "pages")
	if err != nil {
		return err
	}
	cs, err := ints(*chunks, "chunks-mib")
	if err != nil {
		return err
	}
	for i := range cs {
		cs[i] <<= 20
	}
	if *mib <= 0 {
		return fmt.Errorf("sweep: -mib %d is not positive", *mib)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	if *bin == "" {
		b, remove, err := testbed.BuildBinary(ctx)
		if err != nil {
			return err
		}
		defer remove()
		*bin = b
	}
	pts, err := testbed.Sweep(ctx, testbed.SweepOptions{Bin: *bin, PageSizes: ps, ChunkBytes: cs, Bytes: *mib << 20})
	if err != nil {
		return err
	}
	for _, p := range pts {
		fmt.Fprintf(stdout, "block %6d KiB  chunk %3d MiB  %.3f GB/s\n", p.BlockBytes>>10, p.ChunkBytes>>20, p.GBps)
	}
	rec := &report.Record{Title: fmt.Sprintf("import throughput, %d MiB a run", *mib), Kind: "throughput",
		Created: time.Now().UTC(), Throughput: pts, Summary: map[string]any{"pages": ps, "chunk_bytes": cs}}
	if *dir == "" {
		if *dir, err = os.MkdirTemp("", "kvfabric-sweep-"); err != nil {
			return err
		}
	}
	if err := report.WriteFiles(*dir, "sweep", rec); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "sweep: report in %s\n", filepath.Join(*dir, "sweep.html"))
	return nil
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
