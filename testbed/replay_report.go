package testbed

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/zeebo/xxh3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/testbed/report"
)

// hitRateWindow is how many requests one point of the hit-rate plot
// averages.
const hitRateWindow = 50

// ReplayRecord turns replays' results (of one trace under several
// policies, say) into one report record: what they share (nodes, the
// trace's reuse bound) as the summary, each policy's figures side by side
// in one table (a column per policy; failed imports a row per reason),
// import latencies as CDFs, and local and cluster hit rates over time,
// each point the mean of hitRateWindow requests, under the reuse bound.
func ReplayRecord(title string, results ...*ReplayResult) *report.Record {
	r := &report.Record{Title: title, Kind: "replay", Created: time.Now().UTC(), Summary: map[string]any{},
		Table: &report.Table{}, LatencyMs: map[string][]float64{}, HitRate: map[string][]report.Point{}}
	reasons := map[string]bool{}
	for _, res := range results {
		for k := range res.ImportFailuresByReason {
			reasons[k] = true
		}
	}
	for _, res := range results {
		r.Summary["nodes"] = res.Nodes
		r.Summary["trace reuse bound"] = res.ReuseBound
		r.HitRateBound = max(r.HitRateBound, res.ReuseBound)
		t, col := r.Table, res.Policy
		set := func(name, format string, v any) { t.Set(name, col, fmt.Sprintf(format, v)) }
		set("requests", "%d", res.Requests)
		set("blocks requested", "%d", res.BlocksRequested)
		set("local hit rate", "%.3f", res.LocalHitRate)
		set("cluster hit rate", "%.3f", res.ClusterHitRate)
		set("cluster hit rate / reuse bound", "%s", ratio(res.ClusterHitRate, res.ReuseBound))
		set("blocks local", "%d", res.BlocksLocal)
		set("blocks imported", "%d", res.BlocksImported)
		set("blocks computed", "%d", res.BlocksComputed)
		set("blocks computed, not cached", "%d", res.Uncached)
		set("imports", "%d", res.Imports)
		set("imports failed", "%d", res.ImportFailures)
		for _, k := range sortedKeys(reasons) {
			set("imports failed: "+k, "%d", res.ImportFailuresByReason[k])
		}
		set("import p50 (ms)", "%.3f", res.ImportP50Ms)
		set("import p99 (ms)", "%.3f", res.ImportP99Ms)
		set("bytes imported", "%d", res.BytesImported)
		for _, k := range sortedKeys(res.ByTransport) {
			set("blocks over "+k, "%d", res.ByTransport[k].Blocks)
		}
		set("prefill seconds saved", "%.3f", res.PrefillSecondsSaved)
		set("blocks verified", "%d", res.BlocksVerified)
		for _, k := range sortedKeys(res.RequestsPerNode) {
			set("requests on "+k, "%d", res.RequestsPerNode[k])
		}
		set("elapsed (s)", "%.1f", res.ElapsedSeconds)
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

// ratio writes a/b to three places, or "-" when b is zero.
func ratio(a, b float64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", a/b)
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

// ImportFailReason names, in a word, why an import brought nothing:
// "no-holder" (the index lists no node holding the blocks, e.g. their
// holder evicted them since the lookup), "holders-failed" (every holder
// tried failed), "timeout", or the gRPC code otherwise ("unavailable",
// "resource-exhausted", ...). "brought-nothing" is an answer without an
// error that brought nothing new.
func ImportFailReason(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	st, _ := status.FromError(err)
	msg := st.Message()
	switch {
	case strings.Contains(msg, "no node holds them"):
		return "no-holder"
	case strings.Contains(msg, "every holder tried failed"):
		return "holders-failed"
	case st.Code() == codes.DeadlineExceeded:
		return "timeout"
	}
	// The code's name in lower case, words joined by dashes.
	var b strings.Builder
	for i, c := range st.Code().String() {
		if i > 0 && c >= 'A' && c <= 'Z' {
			b.WriteByte('-')
		}
		b.WriteRune(c)
	}
	return strings.ToLower(b.String())
}

// ReuseBound is the highest cluster hit rate reqs allow with blocks of
// page tokens: the share of the blocks they ask for (as the replay cuts
// them: whole pages of the input) that an earlier request asked for too,
// which is what an unbounded cache that every request reaches would hit.
// Block j of a request is the same block in another when both have the
// same trace ids up to the one that ends it, as the replay's tokens are a
// function of the ids.
func ReuseBound(reqs []TraceRequest, page int) float64 {
	if page <= 0 {
		return 0
	}
	type key struct {
		prefix uint64 // hash of the ids up to the block's last
		block  int
	}
	seen := map[key]bool{}
	hit, all := 0, 0
	var buf [16]byte
	for _, r := range reqs {
		n := len(r.HashIDs) * TraceBlockTokens
		if r.InputLength > 0 {
			n = min(n, r.InputLength)
		}
		blocks := n / page
		chain := make([]uint64, len(r.HashIDs))
		h := uint64(0)
		for i, id := range r.HashIDs {
			binary.LittleEndian.PutUint64(buf[:8], h)
			binary.LittleEndian.PutUint64(buf[8:], uint64(id))
			h = xxh3.Hash(buf[:])
			chain[i] = h
		}
		for j := range blocks {
			ids := ((j+1)*page + TraceBlockTokens - 1) / TraceBlockTokens
			k := key{chain[ids-1], j}
			if seen[k] {
				hit++
			}
			seen[k] = true
			all++
		}
	}
	if all == 0 {
		return 0
	}
	return float64(hit) / float64(all)
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
