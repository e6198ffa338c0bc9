package membership

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"testing"
	"time"
)

// fakeClock makes m's snapshot cache read the time from the returned
// pointer. Calls to SnapshotPage must then come from the test's goroutine.
func fakeClock(m *Membership) *time.Time {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m.snaps.mu.Lock()
	m.snaps.now = func() time.Time { return now }
	m.snaps.mu.Unlock()
	return &now
}

// holdingsModel follows an origin's holdings event by event, so that the
// holdings as of any Seq can be checked: each hash is stored once and
// removed at most once.
type holdingsModel struct {
	stored, removed map[uint64]uint64 // hash: Seq of its store, of its remove
	live            []uint64          // hashes held now, in no order
	next            uint64            // the next hash to store
}

// publish publishes a remove of a held hash or a store of a new one, and
// returns its Seq.
func (h *holdingsModel) publish(t *testing.T, m *Membership, remove bool) uint64 {
	t.Helper()
	if remove && len(h.live) > 0 {
		hash := h.live[len(h.live)-1]
		h.live = h.live[:len(h.live)-1]
		seq, err := m.Publish(EventRemove, 1, hash)
		if err != nil {
			t.Fatal(err)
		}
		h.removed[hash] = seq
		return seq
	}
	h.next++
	seq, err := m.Publish(EventStore, 1, h.next)
	if err != nil {
		t.Fatal(err)
	}
	h.stored[h.next], h.live = seq, append(h.live, h.next)
	return seq
}

func (h *holdingsModel) at(seq uint64) map[Entry]int {
	out := map[Entry]int{}
	for hash, s := range h.stored {
		if r, ok := h.removed[hash]; s <= seq && (!ok || r > seq) {
			out[Entry{Hash: hash, BlockSet: 1}] = 1
		}
	}
	return out
}

// snapshotReader pages one snapshot after another from an origin, one
// request per turn, as a resynchronising node does.
type snapshotReader struct {
	seq, offset uint64
	entries     []Entry
	started     time.Time // of the first page of the snapshot being read
	turns       int       // this snapshot's, from its first ask
	done        int       // snapshots assembled
	restarts    int       // snapshots dropped under the reader (ErrRangeGone)
	busy        int       // first pages refused with ErrSnapshotBusy
	maxTurns    int       // the most turns one snapshot took
}

// readersInterleaved runs readers against an origin that publishes an
// event before every request, each reader asking in turn, until each has
// assembled rounds snapshots. Every snapshot must equal the holdings as of
// its Seq and be at most frozenShare older than its first page; no reader
// may be made to start again, and none may take more than maxTurns of its
// turns for one snapshot.
func readersInterleaved(t *testing.T, seed uint64, readers, rounds, maxTurns int) (busy int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 1))
	m := soloNode(t)
	now := fakeClock(m)
	model := &holdingsModel{stored: map[uint64]uint64{}, removed: map[uint64]uint64{}}
	for range 1000 + rng.IntN(1000) {
		model.publish(t, m, false)
	}
	type moment struct {
		at  time.Time
		seq uint64
	}
	var history []moment // the origin's Seq over time
	rs := make([]snapshotReader, readers)
	for turn := 0; ; turn++ {
		i := turn % readers
		r := &rs[i]
		if r.done == rounds {
			finished := true
			for _, x := range rs {
				finished = finished && x.done == rounds
			}
			if finished {
				break
			}
			continue
		}
		// A step of at most 200 ms: a reader asks again well within
		// frozenInUse of its last page.
		*now = now.Add(time.Duration(rng.IntN(200)) * time.Millisecond)
		history = append(history, moment{*now, model.publish(t, m, rng.IntN(3) == 0)})
		r.turns++
		if r.turns > maxTurns {
			t.Fatalf("seed %d: reader %d takes more than %d turns for snapshot %d (%d restarts, %d refused as busy)",
				seed, i, maxTurns, r.done+1, r.restarts, r.busy)
		}
		p, err := m.SnapshotPage(r.seq, r.offset, 50+rng.IntN(150))
		if n := len(m.snaps.frozen); n > frozenKept {
			t.Fatalf("seed %d: %d snapshots kept, past frozenKept %d", seed, n, frozenKept)
		}
		switch {
		case errors.Is(err, ErrSnapshotBusy) && r.offset == 0:
			r.busy++
			busy++
			continue
		case errors.Is(err, ErrRangeGone) && r.offset > 0:
			r.restarts++
			t.Fatalf("seed %d: reader %d: snapshot as of %d dropped at entry %d: %v", seed, i, r.seq, r.offset, err)
		case err != nil:
			t.Fatalf("seed %d: reader %d: page %d/%d: %v", seed, i, r.seq, r.offset, err)
		}
		if r.offset == 0 {
			r.seq, r.started = p.Seq, *now
		} else if p.Seq != r.seq || p.Offset != r.offset {
			t.Fatalf("seed %d: reader %d: page of %d at %d, asked for %d at %d", seed, i, p.Seq, p.Offset, r.seq, r.offset)
		}
		r.entries = append(r.entries, p.Entries...)
		r.offset += uint64(len(p.Entries))
		if p.More {
			continue
		}
		if got, want := holdings(r.entries), model.at(r.seq); !maps.Equal(got, want) {
			t.Fatalf("seed %d: reader %d: snapshot as of %d has %d entries unlike the %d held then", seed, i, r.seq, len(got), len(want))
		}
		// The origin's Seq frozenShare before the first page: the
		// snapshot is no older.
		var floor uint64
		for _, h := range history {
			if r.started.Sub(h.at) >= frozenShare {
				floor = h.seq
			}
		}
		if r.seq < floor {
			t.Fatalf("seed %d: reader %d: snapshot as of %d, started when %d was over %v old", seed, i, r.seq, floor, frozenShare)
		}
		r.maxTurns = max(r.maxTurns, r.turns)
		r.done++
		r.seq, r.offset, r.entries, r.turns = 0, 0, nil, 0
	}
	for i, r := range rs {
		t.Logf("seed %d: reader %d: %d snapshots, %d refused as busy, %d restarts, at most %d turns each", seed, i, r.done, r.busy, r.restarts, r.maxTurns)
	}
	return busy
}

// Readers resynchronising together from an origin that keeps publishing
// each finish every snapshot, never dropped under them, within a bound of
// turns: past frozenKept a new snapshot is refused as busy rather than
// evicting one being read, and a young snapshot is shared.
func TestSnapshotReadersProgress(t *testing.T) {
	// A snapshot of at most 2500 entries in pages of at least 50 takes
	// at most 50 pages. A refused reader waits for a kept copy to fall
	// out of use: new readers stop joining it frozenShare after it was
	// frozen, they read it in 50 turns and it is out of use frozenInUse
	// later. With 6 readers and steps of 100 ms on average, that is
	// about 90 turns of the waiting reader; 400 leaves a wide margin.
	seeds := 10
	if *long {
		seeds = 200
	}
	var busy int
	for seed := range uint64(seeds) {
		for _, readers := range []int{3, 4, 6} {
			busy += readersInterleaved(t, seed, readers, 5, 400)
		}
	}
	if busy == 0 {
		t.Error("no first page was refused as busy: the test does not reach frozenKept")
	}
}

// At the limits: a snapshot frozen just under frozenShare ago is shared
// although events were published since, one frozenShare old is not; with
// frozenKept snapshots kept, each read just under frozenInUse ago, a new
// one is refused as busy, and one read frozenInUse ago is evicted for it;
// one unread for frozenIdle is let go. A snapshot of the current holdings
// is shared at any age.
func TestSnapshotLimits(t *testing.T) {
	m := soloNode(t)
	clock := fakeClock(m)
	for h := uint64(1); h <= 100; h++ {
		m.Publish(EventStore, 1, h)
	}
	first := func() (SnapshotPage, error) { return m.SnapshotPage(0, 0, 10) }
	next := func(seq uint64) error { _, err := m.SnapshotPage(seq, 10, 10); return err }
	kept := func() int {
		m.snaps.mu.Lock()
		defer m.snaps.mu.Unlock()
		return len(m.snaps.frozen)
	}
	a, err := first()
	if err != nil || a.Seq != 100 {
		t.Fatalf("first snapshot: seq %d, %v", a.Seq, err)
	}
	t0 := *clock // a is frozen
	m.Publish(EventStore, 1, 101)
	*clock = t0.Add(frozenShare - 1)
	if p, err := first(); err != nil || p.Seq != a.Seq || kept() != 1 {
		t.Fatalf("published since a snapshot %v old: seq %d, %v, %d kept; want it shared", frozenShare-1, p.Seq, err, kept())
	}
	*clock = t0.Add(frozenShare)
	c, err := first()
	if err != nil || c.Seq != 101 || kept() != frozenKept {
		t.Fatalf("a snapshot %v old: seq %d, %v, %d kept; want a new one as of 101", frozenShare, c.Seq, err, kept())
	}
	cRead := *clock
	m.Publish(EventStore, 1, 102)
	aRead := t0.Add(frozenShare - 1)
	*clock = aRead.Add(frozenInUse - 1) // c is past frozenShare, both in use
	if _, err := first(); !errors.Is(err, ErrSnapshotBusy) || kept() != frozenKept {
		t.Fatalf("%d snapshots each read under %v ago: %v, %d kept; want ErrSnapshotBusy", frozenKept, frozenInUse, err, kept())
	}
	*clock = aRead.Add(frozenInUse)
	d, err := first()
	if err != nil || d.Seq != 102 || kept() != frozenKept {
		t.Fatalf("a snapshot read %v ago: seq %d, %v, %d kept; want a new one as of 102 in its place", frozenInUse, d.Seq, err, kept())
	}
	if err := next(a.Seq); !errors.Is(err, ErrRangeGone) {
		t.Fatalf("page of the evicted snapshot: %v, want ErrRangeGone", err)
	}
	if err := next(c.Seq); err != nil || clock.Sub(cRead) >= frozenInUse {
		t.Fatalf("page of the snapshot read %v ago: %v", clock.Sub(cRead), err)
	}
	cLast := *clock
	*clock = cLast.Add(1)
	if err := next(d.Seq); err != nil {
		t.Fatal(err)
	}
	// c unread for just under frozenIdle is kept; for frozenIdle, let go.
	*clock = cLast.Add(frozenIdle - 1)
	if err := next(d.Seq); err != nil || kept() != 2 {
		t.Fatalf("a snapshot unread for %v: %d kept, %v; want it kept", frozenIdle-1, kept(), err)
	}
	*clock = cLast.Add(frozenIdle)
	if err := next(d.Seq); err != nil || kept() != 1 {
		t.Fatalf("a snapshot unread for %v: %d kept, %v; want it let go", frozenIdle, kept(), err)
	}
	if err := next(c.Seq); !errors.Is(err, ErrRangeGone) {
		t.Fatalf("page of a snapshot unread for %v: %v, want ErrRangeGone", frozenIdle, err)
	}
	*clock = clock.Add(frozenShare)
	if p, err := first(); err != nil || p.Seq != d.Seq || kept() != 1 {
		t.Fatalf("nothing published since a snapshot past frozenShare: seq %d, %v, %d kept; want it shared", p.Seq, err, kept())
	}
	*clock = clock.Add(frozenIdle)
	if err := next(d.Seq); !errors.Is(err, ErrRangeGone) {
		t.Fatalf("page of a snapshot unread for %v: %v, want ErrRangeGone", frozenIdle, err)
	}
}

// A node given a snapshot older than what it knows the origin published
// (a young one the origin shares) still knows what it lacks, and catches
// up from the snapshot's Seq by range.
func TestSharedSnapshotThenRange(t *testing.T) {
	c := newCluster(t, 1, func(c *Config) { c.LogSize = 256 })
	c.repairer.page = 100
	o := c.nodes[0]
	o.m.setDrop(true)
	fakeClock(o.m) // the clock stands still: a frozen snapshot stays young
	for h := uint64(1); h <= 1000; h++ {
		o.m.Publish(EventStore, 1, h)
	}
	if p, err := o.m.SnapshotPage(0, 0, 10); err != nil || p.Seq != 1000 {
		t.Fatalf("first page: seq %d, %v", p.Seq, err)
	}
	for h := uint64(1001); h <= 1100; h++ {
		o.m.Publish(EventStore, 1, h)
	}
	// The repair loop stays idle: the test runs the repairs itself.
	late := c.startNode(1, func(c *Config) { c.LogSize, c.RepairInterval = 256, time.Hour })
	c.nodes = append(c.nodes, late)
	job := func() (j repairJob, err error) {
		late.m.mu.Lock()
		defer late.m.mu.Unlock()
		st := late.m.origins["node-00"]
		if st == nil {
			return j, errors.New("node-00 is not known")
		}
		return repairJob{"node-00", st.inc, st.applied + 1, st.known}, nil
	}
	var j repairJob
	waitFor(t, 20*time.Second, "the late joiner learns of node-00's 1100 events", func() bool {
		var err error
		j, err = job()
		return err == nil && j.to == 1100
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	late.m.repair(ctx, j) // the range is gone: the shared snapshot as of 1000
	if got := late.sink.count("node-00"); got != 1000 || late.m.Metrics().SnapshotRepairs != 1 {
		t.Fatalf("after the first repair the late joiner indexes %d blocks (%+v); want the snapshot's 1000", got, late.m.Metrics())
	}
	if j, _ = job(); j.from != 1001 || j.to != 1100 {
		t.Fatalf("after a snapshot as of 1000 the late joiner lacks %d..%d, want 1001..1100", j.from, j.to)
	}
	late.m.repair(ctx, j)
	if got := late.sink.count("node-00"); got != 1100 || late.m.Metrics().RangeRepairs == 0 {
		t.Fatalf("after the range repair the late joiner indexes %d of 1100 blocks (%+v)", got, late.m.Metrics())
	}
}
