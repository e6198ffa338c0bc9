package membership

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
)

var long = flag.Bool("kvfabric.long", false, "run the slow suites (64-agent convergence)")

// mapSink is the obvious Sink: each origin's entries with their copies.
type mapSink struct {
	mu      sync.Mutex
	entries map[string]map[Entry]int
}

func newMapSink() *mapSink { return &mapSink{entries: make(map[string]map[Entry]int)} }

func (s *mapSink) Apply(events []Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range events {
		m := s.entries[e.Origin]
		if m == nil {
			m = make(map[Entry]int)
			s.entries[e.Origin] = m
		}
		k := Entry{e.Hash, e.BlockSet}
		if e.Kind == EventStore {
			m[k]++
		} else if m[k]--; m[k] <= 0 {
			delete(m, k)
		}
	}
}

func (s *mapSink) Drop(origin string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.entries, origin)
}

func (s *mapSink) has(origin string, hash uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.entries[origin] {
		if k.Hash == hash {
			return true
		}
	}
	return false
}

func (s *mapSink) count(origin string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries[origin])
}

// digest is order independent over (origin, entry, copies).
func (s *mapSink) digest() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var d uint64
	for o, m := range s.entries {
		for k, n := range m {
			h := fnv.New64a()
			fmt.Fprintf(h, "%s/%d/%d/%d", o, k.Hash, k.BlockSet, n)
			d += h.Sum64()
		}
	}
	return d
}

// localRepairer reaches origins in the same process.
type localRepairer struct {
	mu      sync.Mutex
	nodes   map[string]*Membership
	noRange bool // answer every range with ErrRangeGone, forcing snapshots
	calls   int
	// As a transport would: tooLarge refuses ranges of more than
	// maxRange events with ErrRangeTooLarge, else maxRange (if not zero)
	// cuts answers short; page (if not zero) fetches snapshots in pages
	// of that many entries.
	maxRange uint64
	tooLarge bool
	page     int
	pages    int // snapshot pages fetched
}

func (r *localRepairer) get(origin string) (*Membership, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	m := r.nodes[origin]
	if m == nil || m.closed.Load() {
		return nil, fmt.Errorf("no such node %q", origin)
	}
	return m, nil
}

func (r *localRepairer) Events(ctx context.Context, origin string, inc, from, to uint64) ([]Event, error) {
	m, err := r.get(origin)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	noRange, maxRange, tooLarge := r.noRange, r.maxRange, r.tooLarge
	r.mu.Unlock()
	if noRange {
		return nil, ErrRangeGone
	}
	if maxRange > 0 && to-from+1 > maxRange {
		if tooLarge {
			return nil, fmt.Errorf("%w: %d events", ErrRangeTooLarge, to-from+1)
		}
		to = from + maxRange - 1
	}
	return m.EventRange(inc, from, to)
}

func (r *localRepairer) Snapshot(ctx context.Context, origin string) (HoldingsSnapshot, error) {
	m, err := r.get(origin)
	if err != nil {
		return HoldingsSnapshot{}, err
	}
	r.mu.Lock()
	page := r.page
	r.mu.Unlock()
	if page == 0 {
		return m.Snapshot(), nil
	}
	var s HoldingsSnapshot
	for seq, offset := uint64(0), uint64(0); ; {
		p, err := m.SnapshotPage(seq, offset, page)
		if err != nil {
			return HoldingsSnapshot{}, err
		}
		r.mu.Lock()
		r.pages++
		r.mu.Unlock()
		s.Origin, s.Incarnation, s.Seq = p.Origin, p.Incarnation, p.Seq
		s.Entries = append(s.Entries, p.Entries...)
		if !p.More {
			return s, nil
		}
		seq, offset = p.Seq, offset+uint64(len(p.Entries))
	}
}

// logCapture counts slog records.
type logCapture struct {
	mu      sync.Mutex
	records []string
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }
func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.records = append(c.records, r.Level.String()+" "+r.Message)
	return nil
}
func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

func (c *logCapture) matching(level, substr string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, r := range c.records {
		if strings.HasPrefix(r, level) && strings.Contains(r, substr) {
			n++
		}
	}
	return n
}

type testNode struct {
	m    *Membership
	sink *mapSink
	logs *logCapture
}

type cluster struct {
	t        testing.TB
	nodes    []*testNode
	repairer *localRepairer
	seeds    []string
}

func testConfig(name string, ip int) Config {
	c := DefaultLocalConfig()
	c.Name = name
	c.BindAddr = fmt.Sprintf("127.0.0.%d", ip)
	return c
}

// startNode starts node i (address 127.0.0.(10+i)) with the cluster's seeds.
func (c *cluster) startNode(i int, tweak func(*Config)) *testNode {
	c.t.Helper()
	cfg := testConfig(fmt.Sprintf("node-%02d", i), 10+i)
	cfg.Seeds = c.seeds
	n := &testNode{sink: newMapSink(), logs: &logCapture{}}
	cfg.Sink = n.sink
	cfg.Repairer = c.repairer
	cfg.Logger = slog.New(n.logs)
	if tweak != nil {
		tweak(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := Start(ctx, cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", cfg.Name, err)
	}
	c.t.Cleanup(func() { m.shutdown(false) })
	n.m = m
	c.repairer.mu.Lock()
	c.repairer.nodes[cfg.Name] = m
	c.repairer.mu.Unlock()
	if len(c.seeds) == 0 {
		c.seeds = []string{m.Addr().String()}
	}
	return n
}

func newCluster(t testing.TB, n int, tweak func(*Config)) *cluster {
	c := &cluster{t: t, repairer: &localRepairer{nodes: map[string]*Membership{}}}
	for i := 0; i < n; i++ {
		c.nodes = append(c.nodes, c.startNode(i, tweak))
	}
	return c
}

// live returns the nodes that were not stopped.
func (c *cluster) live() []*testNode {
	var out []*testNode
	for _, n := range c.nodes {
		if !n.m.closed.Load() {
			out = append(out, n)
		}
	}
	return out
}

func (c *cluster) allSee(n int) bool {
	for _, x := range c.live() {
		if x.m.NumMembers() != n {
			return false
		}
	}
	return true
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	return wait.For(t, timeout, what, func() error {
		if !cond() {
			return errNotYet
		}
		return nil
	})
}

var errNotYet = errors.New("not yet")

func (c *cluster) everyoneHas(origin string, hash uint64) bool {
	for _, x := range c.live() {
		if !x.sink.has(origin, hash) {
			return false
		}
	}
	return true
}

func (c *cluster) nobodyHas(origin string) bool {
	for _, x := range c.live() {
		if x.sink.count(origin) != 0 {
			return false
		}
	}
	return true
}

func (c *cluster) digestsAgree() bool {
	live := c.live()
	d := live[0].sink.digest()
	for _, x := range live[1:] {
		if x.sink.digest() != d {
			return false
		}
	}
	return true
}

func TestClusterOfSixteen(t *testing.T) {
	const n = 16
	c := newCluster(t, n, nil)
	took := waitFor(t, 20*time.Second, "all 16 nodes see each other", func() bool { return c.allSee(n) })
	t.Logf("16 nodes see each other %v after the last start", took)

	t.Run("store reaches every index", func(t *testing.T) {
		o := c.nodes[3]
		if _, err := o.m.Publish(EventStore, 1, 101, 102, 103); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "every node has node-03's store", func() bool { return c.everyoneHas("node-03", 103) })
		if _, err := o.m.Publish(EventRemove, 1, 102); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "every node applied node-03's remove", func() bool {
			for _, x := range c.live() {
				if x.sink.has("node-03", 102) || x.sink.count("node-03") != 2 {
					return false
				}
			}
			return true
		})
	})

	t.Run("dropped broadcast is repaired by range", func(t *testing.T) {
		o := c.nodes[5]
		o.m.setDrop(true)
		o.m.Publish(EventStore, 2, 201)
		o.m.flush()
		o.m.setDrop(false)
		o.m.Publish(EventStore, 2, 202) // its batch reveals the gap
		waitFor(t, 10*time.Second, "every node has node-05's dropped and later events", func() bool {
			return c.everyoneHas("node-05", 201) && c.everyoneHas("node-05", 202)
		})
		var repairs uint64
		for _, x := range c.live() {
			repairs += x.m.Metrics().RangeRepairs
		}
		if repairs == 0 {
			t.Fatal("the dropped event arrived without any range repair")
		}
	})

	t.Run("dropped last broadcast is repaired through push/pull", func(t *testing.T) {
		o := c.nodes[6]
		o.m.setDrop(true)
		o.m.Publish(EventStore, 2, 301)
		o.m.flush()
		o.m.setDrop(false)
		// No further events: only push/pull's marks tell the others.
		waitFor(t, 20*time.Second, "every node has node-06's dropped event", func() bool { return c.everyoneHas("node-06", 301) })
	})

	t.Run("late joiner converges", func(t *testing.T) {
		late := c.startNode(n, nil)
		c.nodes = append(c.nodes, late)
		waitFor(t, 20*time.Second, "the late joiner's index matches everyone's", func() bool {
			return c.allSee(n+1) && late.sink.has("node-03", 101) && c.digestsAgree()
		})
	})

	t.Run("killed member is dropped from every index", func(t *testing.T) {
		o := c.nodes[3]
		o.m.shutdown(false)
		took := waitFor(t, 30*time.Second, "node-03's entries dropped everywhere", func() bool {
			return c.nobodyHas("node-03") && c.allSee(n)
		})
		t.Logf("killed member dropped from every index after %v", took)
	})

	t.Run("member that leaves is dropped at once", func(t *testing.T) {
		o := c.nodes[5]
		if err := o.m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := o.m.Close(); err != nil { // idempotent
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "node-05 dropped everywhere", func() bool { return c.nobodyHas("node-05") && c.allSee(n-1) })
	})
}

func TestRestartReplacesEntries(t *testing.T) {
	c := newCluster(t, 4, nil)
	waitFor(t, 20*time.Second, "4 nodes see each other", func() bool { return c.allSee(4) })
	o := c.nodes[2]
	o.m.Publish(EventStore, 1, 11, 12)
	waitFor(t, 10*time.Second, "stores spread", func() bool { return c.everyoneHas("node-02", 12) })
	addr := o.m.Addr()
	o.m.shutdown(false)
	// Same name and address, a new run: its old blocks are gone.
	re := c.startNode(2, func(cfg *Config) { cfg.BindPort = int(addr.Port()) })
	c.nodes[2] = re
	re.m.Publish(EventStore, 1, 21)
	waitFor(t, 30*time.Second, "every node holds only the new run's entries", func() bool {
		for _, x := range c.live() {
			if x.sink.has("node-02", 11) || !x.sink.has("node-02", 21) || x.sink.count("node-02") != 1 {
				return false
			}
		}
		return true
	})
}

func TestSnapshotRepair(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.LogSize = 4 })
	waitFor(t, 20*time.Second, "3 nodes see each other", func() bool { return c.allSee(3) })
	o := c.nodes[0]
	o.m.setDrop(true)
	for h := uint64(1); h <= 10; h++ { // more than the log keeps
		o.m.Publish(EventStore, 7, h)
	}
	o.m.Publish(EventRemove, 7, 3)
	o.m.flush()
	o.m.setDrop(false)
	if _, err := o.m.EventRange(o.m.Incarnation(), 1, 11); !errors.Is(err, ErrRangeGone) {
		t.Fatalf("EventRange past the log = %v, want ErrRangeGone", err)
	}
	if _, err := o.m.EventRange(o.m.Incarnation()+1, 8, 11); !errors.Is(err, ErrRangeGone) {
		t.Fatalf("EventRange of another incarnation = %v, want ErrRangeGone", err)
	}
	o.m.Publish(EventStore, 7, 11)
	waitFor(t, 20*time.Second, "every node has node-00's 10 blocks", func() bool {
		for _, x := range c.live() {
			if x.sink.count("node-00") != 10 || x.sink.has("node-00", 3) {
				return false
			}
		}
		return true
	})
	var snaps uint64
	for _, x := range c.live() {
		snaps += x.m.Metrics().SnapshotRepairs
	}
	if snaps == 0 {
		t.Fatal("no snapshot repair happened although the range was gone")
	}
}

func TestWrongKeyOrLabelNeverJoins(t *testing.T) {
	key := []byte("0123456789abcdef")
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.Keys = [][]byte{key}
		cfg.ClusterName = "prod"
	})
	waitFor(t, 20*time.Second, "3 nodes see each other", func() bool { return c.allSee(3) })
	fast := func(cfg *Config) { cfg.RejoinInterval = 100 * time.Millisecond }
	badKey := c.startNode(10, func(cfg *Config) {
		fast(cfg)
		cfg.Keys = [][]byte{[]byte("fedcba9876543210")}
		cfg.ClusterName = "prod"
	})
	badLabel := c.startNode(11, func(cfg *Config) {
		fast(cfg)
		cfg.Keys = [][]byte{key}
		cfg.ClusterName = "staging"
	})
	seed := c.nodes[0]
	waitFor(t, 20*time.Second, "both intruders tried to join at least 5 times", func() bool {
		return badKey.m.Metrics().JoinAttempts >= 5 && badLabel.m.Metrics().JoinAttempts >= 5 &&
			seed.logs.matching("ERROR", "decrypt") >= 1 && seed.logs.matching("ERROR", "label") >= 1
	})
	for _, bad := range []*testNode{badKey, badLabel} {
		if got := bad.m.NumMembers(); got != 1 {
			t.Errorf("%s sees %d members, want only itself", bad.m.Name(), got)
		}
	}
	for _, x := range c.nodes[:3] {
		if got := x.m.NumMembers(); got != 3 {
			t.Errorf("%s sees %d members, want 3", x.m.Name(), got)
		}
	}
	if n := seed.logs.matching("ERROR", "decrypt"); n != 1 {
		t.Errorf("the seed logged the wrong key %d times, want once:\n%s", n, strings.Join(seed.logs.records, "\n"))
	}
	if n := seed.logs.matching("ERROR", "label"); n != 1 {
		t.Errorf("the seed logged the wrong label %d times, want once:\n%s", n, strings.Join(seed.logs.records, "\n"))
	}
}

// setDrop makes the node drop (or stop dropping) its own batches.
func (m *Membership) setDrop(drop bool) {
	if !drop {
		m.dropBatch.Store(nil)
		return
	}
	f := func(uint64) bool { return true }
	m.dropBatch.Store(&f)
}

func slogNew(h slog.Handler) *slog.Logger { return slog.New(h) }

func itoa(i int) string { return fmt.Sprint(i) }
