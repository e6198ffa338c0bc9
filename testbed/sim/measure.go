package sim

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/membership"
)

// tracker follows each stored block from its publication until every node
// live at that moment has applied it, and keeps two delay histograms: to
// one index (every application) and to every index (the last).
type tracker struct {
	shards [64]trackShard
	one    histogram
	all    histogram
}

type trackShard struct {
	mu      sync.Mutex
	pending map[uint64]*inFlight
}

type inFlight struct {
	at   time.Time
	need int
}

func (t *tracker) init() {
	for i := range t.shards {
		t.shards[i].pending = make(map[uint64]*inFlight)
	}
}

func (t *tracker) published(hashes []uint64, nodes int, at time.Time) {
	for _, h := range hashes {
		s := &t.shards[h%64]
		s.mu.Lock()
		s.pending[h] = &inFlight{at: at, need: nodes}
		s.mu.Unlock()
	}
}

func (t *tracker) applied(h uint64, now time.Time) {
	s := &t.shards[h%64]
	s.mu.Lock()
	f := s.pending[h]
	if f == nil {
		s.mu.Unlock()
		return
	}
	d := now.Sub(f.at)
	f.need--
	done := f.need <= 0
	if done {
		delete(s.pending, h)
	}
	s.mu.Unlock()
	t.one.add(d)
	if done {
		t.all.add(d)
	}
}

// inFlight reports whether h was published and has not reached every
// index yet.
func (t *tracker) inFlight(h uint64) bool {
	s := &t.shards[h%64]
	s.mu.Lock()
	_, ok := s.pending[h]
	s.mu.Unlock()
	return ok
}

// reset forgets the blocks in flight and the histograms.
func (t *tracker) reset() {
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		clear(s.pending)
		s.mu.Unlock()
	}
	t.one.reset()
	t.all.reset()
}

// histogram counts durations in buckets 5% apart, from 10 µs.
type histogram struct {
	mu sync.Mutex
	b  [400]int64
	n  int64
}

const histBase = 10 * time.Microsecond

func (h *histogram) add(d time.Duration) {
	i := 0
	if d > histBase {
		i = min(len(h.b)-1, int(math.Log(float64(d)/float64(histBase))/math.Log(1.05))+1)
	}
	h.mu.Lock()
	h.b[i]++
	h.n++
	h.mu.Unlock()
}

func (h *histogram) reset() {
	h.mu.Lock()
	h.b, h.n = [400]int64{}, 0
	h.mu.Unlock()
}

// quantile returns the q-quantile (the upper edge of its bucket), and how
// many samples there are.
func (h *histogram) quantile(q float64) (time.Duration, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		return 0, 0
	}
	want := int64(math.Ceil(q * float64(h.n)))
	var seen int64
	for i, c := range h.b {
		if seen += c; seen >= want {
			return time.Duration(float64(histBase) * math.Pow(1.05, float64(i))), h.n
		}
	}
	return 0, h.n
}

// over returns how many samples lie in buckets that start at d or past it
// (a sample past d in the bucket d falls in is not counted), and how many
// there are.
func (h *histogram) over(d time.Duration) (int64, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for i, c := range h.b {
		// Bucket i > 0 holds [10 µs × 1.05^(i-1), 10 µs × 1.05^i) (add),
		// bucket 0 up to 10 µs; the last one everything past its start.
		if i > 0 && float64(histBase)*math.Pow(1.05, float64(i-1)) >= float64(d) {
			n += c
		}
	}
	return n, h.n
}

// Counters is a snapshot of the cluster's cumulative counters.
type Counters struct {
	At                  time.Time
	CPU                 float64 // process CPU seconds
	Nodes               int     // live
	GossipIn, GossipOut int64   // bytes, summed over live nodes
	RepairIn, RepairOut int64
	DirectIn, DirectOut int64 // owned slices: calls to owners and answers
	Applied             int64 // events applied to indexes, summed
	Suspicions          int64 // of alive, reachable nodes
	FalseFailures       int64 // alive, reachable nodes declared failed
	PacketsDropped      int64 // lost to full receive buffers
	// RangeRepairs and SnapshotRepairs are the event gaps closed from an
	// origin's log and by snapshot (membership's counts), summed: a node
	// that missed a batch on gossip gets its events so, later.
	RangeRepairs, SnapshotRepairs int64
}

// Counters returns the cumulative counters now.
func (c *Cluster) Counters() Counters {
	k := Counters{At: time.Now(), CPU: cpuSeconds(), Suspicions: c.suspect.Load(), FalseFailures: c.failed.Load()}
	for _, n := range c.live() {
		k.Nodes++
		in, out := n.tr.Bytes()
		k.GossipIn += in
		k.GossipOut += out
		k.RepairIn += n.repairIn.Load()
		k.RepairOut += n.repairOut.Load()
		k.DirectIn += n.directIn.Load()
		k.DirectOut += n.directOut.Load()
		k.Applied += n.applied.Load()
		k.PacketsDropped += n.tr.dropped.Load()
		m := n.M.Metrics()
		k.RangeRepairs += int64(m.RangeRepairs)
		k.SnapshotRepairs += int64(m.SnapshotRepairs)
	}
	return k
}

// Window is what the cluster did between two Counters, per node.
type Window struct {
	Seconds float64
	Nodes   int
	// Bytes per second per node, averaged over the live nodes.
	GossipInBps, GossipOutBps, RepairInBps, RepairOutBps float64
	// DirectInBps and DirectOutBps are the owned slices' calls to owners
	// and their answers.
	DirectInBps, DirectOutBps float64
	// CPU is the process's CPU seconds per second (cores busy).
	CPU float64
	// AppliedPerNode is events applied per second per node.
	AppliedPerNode float64
	// RangeRepairsPerNode is event gaps closed from an origin's log per
	// second per node.
	RangeRepairsPerNode float64
	// CPUPerEventUs is CPU time per applied event, all of the process's
	// CPU (gossip included) charged to events, in microseconds.
	CPUPerEventUs float64
	// SuspicionsPerNodeHour and FalseFailuresPerNodeHour count
	// memberlist's suspicions and failure declarations of nodes that were
	// alive and reachable, per node and hour.
	SuspicionsPerNodeHour, FalseFailuresPerNodeHour float64
	PacketsDropped                                  int64
}

// Between returns the per-node rates from a to b.
func Between(a, b Counters) Window {
	w := Window{Seconds: b.At.Sub(a.At).Seconds(), Nodes: b.Nodes}
	if w.Seconds <= 0 || b.Nodes == 0 {
		return w
	}
	per := func(x, y int64) float64 { return float64(y-x) / w.Seconds / float64(b.Nodes) }
	w.GossipInBps, w.GossipOutBps = per(a.GossipIn, b.GossipIn), per(a.GossipOut, b.GossipOut)
	w.RepairInBps, w.RepairOutBps = per(a.RepairIn, b.RepairIn), per(a.RepairOut, b.RepairOut)
	w.DirectInBps, w.DirectOutBps = per(a.DirectIn, b.DirectIn), per(a.DirectOut, b.DirectOut)
	w.CPU = (b.CPU - a.CPU) / w.Seconds
	w.AppliedPerNode = per(a.Applied, b.Applied)
	w.RangeRepairsPerNode = per(a.RangeRepairs, b.RangeRepairs)
	if d := b.Applied - a.Applied; d > 0 {
		w.CPUPerEventUs = (b.CPU - a.CPU) / float64(d) * 1e6
	}
	hours := w.Seconds / 3600 * float64(b.Nodes)
	w.SuspicionsPerNodeHour = float64(b.Suspicions-a.Suspicions) / hours
	w.FalseFailuresPerNodeHour = float64(b.FalseFailures-a.FalseFailures) / hours
	w.PacketsDropped = b.PacketsDropped - a.PacketsDropped
	return w
}

// Delays returns the propagation delays measured since the last
// ResetDelays: p50 and p99 from a store to one index and to every index
// live at the store, and how many blocks reached every index.
func (c *Cluster) Delays() (oneP50, oneP99, allP50, allP99 time.Duration, complete int64) {
	oneP50, _ = c.track.one.quantile(0.5)
	oneP99, _ = c.track.one.quantile(0.99)
	allP50, complete = c.track.all.quantile(0.5)
	allP99, _ = c.track.all.quantile(0.99)
	return
}

// DelayToEvery returns the q-quantile of the delays from a store to every
// index live at the store, since the last ResetDelays.
func (c *Cluster) DelayToEvery(q float64) time.Duration {
	d, _ := c.track.all.quantile(q)
	return d
}

// DelaysOver returns how many blocks reached every index (since the last
// ResetDelays) and how many of those took longer than d: the few that
// some node missed on gossip and got by repair make a tail of their own,
// and where it holds about 1 % of the blocks the p99 falls into it in one
// run and short of it in the next.
func (c *Cluster) DelaysOver(d time.Duration) (over, complete int64) {
	return c.track.all.over(d)
}

// ResetDelays starts the delay measurement afresh.
func (c *Cluster) ResetDelays() { c.track.reset() }

// IndexBytes returns the mean index memory of the live nodes (bytes, as
// counted by index.Metrics) and the mean (hash, holder) pairs.
func (c *Cluster) IndexBytes() (bytes, pairs float64) {
	nodes := c.live()
	for _, n := range nodes {
		m := n.Index.Metrics()
		bytes += float64(m.Bytes)
		pairs += float64(m.Pairs)
	}
	return bytes / float64(len(nodes)), pairs / float64(len(nodes))
}

// ErrNotConverged is returned by [Cluster.WaitConverged] at its deadline.
var ErrNotConverged = errors.New("sim: cluster did not converge")

// Converged reports whether every live node sees exactly the live nodes as
// members and its index holds the ground truth (same digest and pairs).
func (c *Cluster) Converged() bool {
	nodes := c.live()
	if c.cfg.Mode == ModeOwned {
		return c.ownedConverged(nodes)
	}
	c.mu.Lock()
	want, pairs := c.truth.Digest(), c.truth.Metrics().Pairs
	c.mu.Unlock()
	for _, n := range nodes {
		if n.M.NumMembers() != len(nodes) {
			return false
		}
		if n.Index.Digest() != want || n.Index.Metrics().Pairs != pairs {
			return false
		}
	}
	return true
}

// WaitConverged polls Converged until it holds or ctx ends, and returns
// how long it took. The load should be stopped: under load the indexes
// trail the truth by the propagation delay.
func (c *Cluster) WaitConverged(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if c.Converged() {
			return time.Since(start), nil
		}
		select {
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("%w after %v: %s", ErrNotConverged, time.Since(start).Round(time.Millisecond), c.divergence())
		case <-t.C:
		}
	}
}

// divergence says how the first diverging node differs, for errors.
func (c *Cluster) divergence() string {
	nodes := c.live()
	if c.cfg.Mode == ModeOwned {
		pairs, digests := c.ownedExpected(nodes)
		for _, n := range nodes {
			if got := n.M.NumMembers(); got != len(nodes) {
				return fmt.Sprintf("%s sees %d members of %d", n.Name, got, len(nodes))
			}
			if got := n.Index.Metrics().Pairs; got != pairs[n.Name] || n.Index.Digest() != digests[n.Name] {
				return fmt.Sprintf("%s's slice holds %d pairs, owns %d; ops queued there %d", n.Name, got, pairs[n.Name], n.pub.Stats().Queued)
			}
		}
		return "converged meanwhile"
	}
	pairs := c.truth.Metrics().Pairs
	for _, n := range nodes {
		if got := n.M.NumMembers(); got != len(nodes) {
			return fmt.Sprintf("%s sees %d members of %d", n.Name, got, len(nodes))
		}
		if got := n.Index.Metrics().Pairs; got != pairs || n.Index.Digest() != c.truth.Digest() {
			var diffs []string
			for _, o := range nodes {
				tid, _ := c.truth.Lookup(o.Name)
				id, _ := n.Index.Lookup(o.Name)
				if w, g := c.truth.NodeBlocks(tid), n.Index.NodeBlocks(id); w != g {
					diffs = append(diffs, fmt.Sprintf("%s: %d of %d", o.Name, g, w))
				}
			}
			return fmt.Sprintf("%s indexes %d pairs, truth %d; by origin: %v; gaps open %d", n.Name, got, pairs, diffs, n.M.Metrics().Gaps)
		}
	}
	return "converged meanwhile"
}

// Check compares every live node's index with the ground truth block by
// block: each block that a live node holds is indexed as held by it, and
// nothing else is indexed (the pairs agree in number). It returns the
// first difference. The load must be stopped.
func (c *Cluster) Check() error {
	nodes := c.live()
	type pair struct {
		hash uint64
		node string
	}
	if c.loadStop != nil {
		return errors.New("sim: Check needs the load stopped")
	}
	if c.cfg.Mode == ModeOwned {
		return c.ownedCheck(nodes)
	}
	var want []pair
	for _, n := range nodes {
		for _, b := range n.held {
			want = append(want, pair{b.hash, n.Name})
		}
	}
	for _, n := range nodes {
		m := n.Index.Metrics()
		if m.Pairs != int64(len(want)) {
			return fmt.Errorf("sim: %s indexes %d pairs, the live nodes hold %d", n.Name, m.Pairs, len(want))
		}
		for _, p := range want {
			id, ok := n.Index.Lookup(p.node)
			if !ok {
				return fmt.Errorf("sim: %s does not index live node %s", n.Name, p.node)
			}
			if !slices.Contains(n.Index.Holders(p.hash), id) {
				return fmt.Errorf("sim: %s misses block %#x of %s", n.Name, p.hash, p.node)
			}
		}
	}
	return nil
}

// PushPullPeriod is how often each of n nodes starts a push/pull at the
// default timings (membership.DefaultConfig's, the agents' too): a window
// this long holds one push/pull of each node (membership.PushPullPeriod).
func PushPullPeriod(n int) time.Duration {
	return membership.PushPullPeriod(membership.DefaultConfig().PushPullInterval, n)
}
