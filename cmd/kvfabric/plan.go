package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/kvfabric/kvfabric/layout"
)

func runPlan(e *env, args []string) error {
	fs := newFlags(e, "plan", "--src FILE --dst FILE [--blocks N]", `
Reads two layouts (protobuf JSON, as in examples/layouts) and prints what
importing blocks from the source layout into the destination layout costs,
per destination rank: the source ranks read, the copy descriptors (a strided
descriptor counts once), the contiguous pieces they expand to, the bytes,
and the smallest and largest piece. Source slots 0..N-1 go to destination
slots in order; with different page sizes, blocks are grouped by the ratio.`)
	srcFile := fs.String("src", "", "source (holder) layout, protobuf JSON")
	dstFile := fs.String("dst", "", "destination (importer) layout, protobuf JSON")
	blocks := fs.Int("blocks", 0, "source blocks to plan (0: as many as both layouts hold)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *srcFile == "" || *dstFile == "" {
		return usagef("--src and --dst are required")
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	if *blocks < 0 {
		return usagef("--blocks %d: must not be negative", *blocks)
	}
	src, err := readLayout(*srcFile)
	if err != nil {
		return err
	}
	dst, err := readLayout(*dstFile)
	if err != nil {
		return err
	}
	pairs, err := sequentialPairs(src, dst, *blocks)
	if err != nil {
		return err
	}
	p, err := layout.NewPlan(src, dst, pairs)
	if err != nil {
		return err
	}
	srcBlocks := map[int]bool{}
	for _, pr := range pairs {
		srcBlocks[pr.Src] = true
	}
	fmt.Fprintf(e.stdout, "%d source blocks (page %d, TP %d, %v) -> destination (page %d, TP %d, %v): %s\n",
		len(srcBlocks), src.PageSize, src.TPSize, src.Order, dst.PageSize, dst.TPSize, dst.Order, bytesString(p.Bytes()))
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DST RANK\tSRC RANKS\tSEGMENTS\tPIECES\tBYTES\tSMALLEST\tLARGEST\t")
	for _, s := range p.Summary() {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%s\t%s\t%s\t\n", s.DstRank, s.SrcRanks, s.Segments, s.Pieces,
			bytesString(s.Bytes), bytesString(s.MinPiece), bytesString(s.MaxPiece))
	}
	return tw.Flush()
}

// readLayout reads a layout file named on the command line; a file that
// is missing or invalid is the caller's mistake (exit status 2).
func readLayout(path string) (*layout.Layout, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, usagef("%v", err)
	}
	l, err := layout.ParseJSON(b)
	if err != nil {
		return nil, usagef("%s: %v", path, err)
	}
	return l, nil
}

// sequentialPairs maps the first n source slots onto destination slots in
// order, grouped by the page ratio.
func sequentialPairs(src, dst *layout.Layout, n int) ([]layout.SlotPair, error) {
	sp, dp := src.PageSize, dst.PageSize
	// Source blocks per destination block, or its inverse.
	fit := min(src.Slots, dst.Slots)
	if dp > sp {
		fit = min(src.Slots, dst.Slots*(dp/sp))
		fit -= fit % (dp / sp)
	} else if sp > dp {
		fit = min(src.Slots, dst.Slots/(sp/dp))
	}
	if n == 0 {
		n = fit
	}
	if n > fit {
		return nil, usagef("--blocks %d: the layouts hold at most %d (source %d slots, destination %d slots)", n, fit, src.Slots, dst.Slots)
	}
	if dp > sp && n%(dp/sp) != 0 {
		return nil, usagef("--blocks %d: not a multiple of %d (destination page %d, source page %d)", n, dp/sp, dp, sp)
	}
	var pairs []layout.SlotPair
	for s := range n {
		switch {
		case dp > sp:
			pairs = append(pairs, layout.SlotPair{Src: s, Dst: s / (dp / sp)})
		case sp > dp:
			for j := range sp / dp {
				pairs = append(pairs, layout.SlotPair{Src: s, Dst: s*(sp/dp) + j})
			}
		default:
			pairs = append(pairs, layout.SlotPair{Src: s, Dst: s})
		}
	}
	return pairs, nil
}

func bytesString(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
