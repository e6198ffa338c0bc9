package testbed

import (
	"time"

	"github.com/kvfabric/kvfabric/testbed/report"
)

// hitRateWindow is how many requests one point of the hit-rate plot
// averages.
const hitRateWindow = 50

// ReplayRecord turns replays' results (of one trace under several
// policies, say) into one report record: their figures as the summary
// (prefixed with the policy when there are several), import latencies as
// CDFs, and local and cluster hit rates over time, each point the mean of
// hitRateWindow requests.
func ReplayRecord(title string, results ...*ReplayResult) *report.Record {
	r := &report.Record{Title: title, Kind: "replay", Created: time.Now().UTC(), Summary: map[string]any{},
		LatencyMs: map[string][]float64{}, HitRate: map[string][]report.Point{}}
	for _, res := range results {
		prefix := ""
		if len(results) > 1 {
			prefix = res.Policy + " "
		}
		for k, v := range map[string]any{
			"policy": res.Policy, "nodes": res.Nodes, "requests": res.Requests, "blocks_requested": res.BlocksRequested,
			"local_hit_rate": res.LocalHitRate, "cluster_hit_rate": res.ClusterHitRate, "blocks_imported": res.BlocksImported,
			"bytes_imported": res.BytesImported, "import_p50_ms": res.ImportP50Ms, "import_p99_ms": res.ImportP99Ms,
			"by_transport": res.ByTransport, "prefill_seconds_saved": res.PrefillSecondsSaved, "elapsed_seconds": res.ElapsedSeconds,
			"blocks_verified": res.BlocksVerified, "requests_per_node": res.RequestsPerNode,
			"import_failures": res.ImportFailures, "blocks_uncached": res.Uncached,
		} {
			r.Summary[prefix+k] = v
		}
		if lat := res.ImportLatencies(); len(lat) > 0 {
			r.LatencyMs["import ("+res.Policy+")"] = lat
		}
		local, cluster := hitRates(res.Timeline, hitRateWindow)
		if len(local) > 0 {
			r.HitRate["local ("+res.Policy+")"] = local
			r.HitRate["cluster ("+res.Policy+")"] = cluster
		}
	}
	return r
}

// hitRates averages local and cluster hit rates over consecutive windows
// of w requests, each point at its window's last completion.
func hitRates(tl []RequestRecord, w int) (local, cluster []report.Point) {
	for i := 0; i < len(tl); i += w {
		end := min(i+w, len(tl))
		var blocks, l, c int
		for _, r := range tl[i:end] {
			blocks += r.Blocks
			l += r.Local
			c += r.Local + r.Imported
		}
		if blocks == 0 {
			continue
		}
		at := tl[end-1].AtMs / 1000
		local = append(local, report.Point{X: at, Y: float64(l) / float64(blocks)})
		cluster = append(cluster, report.Point{X: at, Y: float64(c) / float64(blocks)})
	}
	return local, cluster
}
