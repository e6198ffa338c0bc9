package discover

import (
	"fmt"
	"strings"
)

// MaxSummary is the most bytes Summary returns: node metadata has 512 bytes
// for everything, and the GPUs get this much of it.
const MaxSummary = 64

// Summary is the compact form node metadata carries: each model with its
// count and memory, in order of first appearance, e.g.
// "8xNVIDIA H100 80GB HBM3/80G". Longer than MaxSummary, the names are
// dropped for the models' counts and memory ("8x80G,4x40G"), and if that
// is still too long it is cut to MaxSummary bytes ending in "+".
func Summary(gpus []GPU) string {
	type group struct {
		name  string
		gib   uint64
		count int
	}
	var groups []*group
	index := map[string]*group{}
	for _, g := range gpus {
		gib := (g.MemoryTotal + 1<<29) >> 30
		key := fmt.Sprintf("%s/%d", g.Name, gib)
		if gr, ok := index[key]; ok {
			gr.count++
			continue
		}
		gr := &group{name: g.Name, gib: gib, count: 1}
		index[key] = gr
		groups = append(groups, gr)
	}
	long, short := make([]string, len(groups)), make([]string, len(groups))
	for i, gr := range groups {
		long[i] = fmt.Sprintf("%dx%s/%dG", gr.count, gr.name, gr.gib)
		short[i] = fmt.Sprintf("%dx%dG", gr.count, gr.gib)
	}
	if s := strings.Join(long, ","); len(s) <= MaxSummary {
		return s
	}
	s := strings.Join(short, ",")
	if len(s) <= MaxSummary {
		return s
	}
	return s[:MaxSummary-1] + "+"
}
