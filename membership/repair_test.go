package membership

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"testing"
	"time"
)

// holdings counts a snapshot's entries.
func holdings(entries []Entry) map[Entry]int {
	out := map[Entry]int{}
	for _, e := range entries {
		out[e]++
	}
	return out
}

func soloNode(t *testing.T) *Membership {
	t.Helper()
	c := &cluster{t: t, repairer: &localRepairer{nodes: map[string]*Membership{}}}
	return c.startNode(30, nil).m
}

// Every page of a snapshot describes the holdings as of its first page,
// however many events are published between pages.
func TestSnapshotPages(t *testing.T) {
	m := soloNode(t)
	for h := uint64(1); h <= 10_000; h++ {
		m.Publish(EventStore, uint32(h%3), h)
	}
	clock := fakeClock(m)
	want := holdings(m.Snapshot().Entries)
	first, err := m.SnapshotPage(0, 0, 1000)
	if err != nil || first.Seq != 10_000 || len(first.Entries) != 1000 || !first.More || first.Offset != 0 {
		t.Fatalf("first page: seq %d, %d entries, more %v, %v", first.Seq, len(first.Entries), first.More, err)
	}
	got := append([]Entry(nil), first.Entries...)
	for h := uint64(1); h <= 500; h++ { // between pages: removes and stores
		m.Publish(EventRemove, uint32(h%3), h)
		m.Publish(EventStore, 9, 1_000_000+h)
	}
	for p := first; p.More; {
		p, err = m.SnapshotPage(first.Seq, uint64(len(got)), 1000)
		if err != nil {
			t.Fatal(err)
		}
		if p.Seq != first.Seq || p.Incarnation != first.Incarnation || p.Offset != uint64(len(got)) {
			t.Fatalf("page at %d: seq %d/%d offset %d", len(got), p.Incarnation, p.Seq, p.Offset)
		}
		got = append(got, p.Entries...)
	}
	if !maps.Equal(holdings(got), want) {
		t.Fatalf("paged snapshot has %d entries unlike the %d held as of %d", len(got), len(want), first.Seq)
	}
	// A new snapshot sees what was published since, once the first is
	// too old to share.
	*clock = clock.Add(frozenShare)
	now, err := m.SnapshotPage(0, 0, 1<<20)
	if err != nil || now.Seq != 11_000 || len(now.Entries) != 10_000 || now.More {
		t.Fatalf("new snapshot: seq %d, %d entries, more %v, %v", now.Seq, len(now.Entries), now.More, err)
	}
	if _, err := m.SnapshotPage(first.Seq, 20_000, 10); err == nil || errors.Is(err, ErrRangeGone) {
		t.Errorf("page past the end: %v, want an error other than gone", err)
	}
	if _, err := m.SnapshotPage(0, 0, 0); err == nil {
		t.Error("page of 0 entries: no error")
	}
	if _, err := m.SnapshotPage(12_345, 0, 10); !errors.Is(err, ErrRangeGone) {
		t.Errorf("page of a snapshot never taken: %v, want ErrRangeGone", err)
	}
}

// lateJoiner starts node 1 after node 0 has published events stores
// without gossiping them, with the repairer set up by setup, and waits
// until node 1 indexes all of them.
func lateJoiner(t *testing.T, events int, tweak func(*Config), setup func(*localRepairer)) (*cluster, *testNode) {
	t.Helper()
	c := newCluster(t, 1, tweak)
	setup(c.repairer)
	o := c.nodes[0]
	// Nothing is gossiped: the late joiner learns of the events from the
	// state exchange of its join, and repair brings them all.
	o.m.setDrop(true)
	hashes := make([]uint64, events)
	for i := range hashes {
		hashes[i] = uint64(i) + 1
	}
	for len(hashes) > 0 {
		n := min(len(hashes), 4096)
		if _, err := o.m.Publish(EventStore, 1, hashes[:n]...); err != nil {
			t.Fatal(err)
		}
		hashes = hashes[n:]
	}
	late := c.startNode(1, tweak)
	c.nodes = append(c.nodes, late)
	waitFor(t, 60*time.Second, fmt.Sprintf("the late joiner indexes node-00's %d blocks", events), func() bool {
		return late.sink.count("node-00") == events
	})
	return c, late
}

// A late joiner after 100,000 events whose origin keeps them all catches
// up by ranges in one repair, page after page as the repairer's answers
// allow (here at most 1<<16 events each, as over the wire).
func TestLateJoinerRangePages(t *testing.T) {
	const events = 100_000
	c := newCluster(t, 1, func(c *Config) { c.LogSize = 1 << 17 })
	c.repairer.maxRange = 1 << 16
	o := c.nodes[0]
	o.m.setDrop(true)
	for h := uint64(1); h <= events; h++ {
		o.m.Publish(EventStore, 1, h)
	}
	// The repair loop stays idle: the test runs one repair itself.
	late := c.startNode(1, func(c *Config) { c.LogSize, c.RepairInterval = 1<<17, time.Hour })
	c.nodes = append(c.nodes, late)
	var job repairJob
	waitFor(t, 20*time.Second, "the late joiner learns of node-00's events", func() bool {
		late.m.mu.Lock()
		defer late.m.mu.Unlock()
		st := late.m.origins["node-00"]
		if st == nil || st.known != events {
			return false
		}
		job = repairJob{"node-00", st.inc, st.applied + 1, st.known}
		return true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	late.m.repair(ctx, job)
	if got := late.sink.count("node-00"); got != events {
		t.Fatalf("after one repair the late joiner indexes %d of %d blocks", got, events)
	}
	if m := late.m.Metrics(); m.SnapshotRepairs != 0 || m.RangeRepairs < 2 || m.Gaps != 0 {
		t.Fatalf("repairs: %d by range, %d by snapshot, %d gaps; want ranges only, at least 2, no gap", m.RangeRepairs, m.SnapshotRepairs, m.Gaps)
	}
}

// A late joiner after 100,000 events, more than the origin's log keeps,
// catches up from a snapshot fetched in pages.
func TestLateJoinerSnapshotPages(t *testing.T) {
	c, late := lateJoiner(t, 100_000, nil, func(r *localRepairer) { r.maxRange, r.page = 1<<16, 4096 })
	if m := late.m.Metrics(); m.SnapshotRepairs == 0 {
		t.Fatalf("no snapshot repair: %+v", m)
	}
	c.repairer.mu.Lock()
	pages := c.repairer.pages
	c.repairer.mu.Unlock()
	if pages < 100_000/4096 {
		t.Fatalf("%d snapshot pages for 100,000 entries in pages of 4096", pages)
	}
}

// A range the origin refuses for its size is made good by a snapshot, as
// a range it no longer keeps is.
func TestRangeTooLargeFallsBackToSnapshot(t *testing.T) {
	_, late := lateJoiner(t, 5000, nil, func(r *localRepairer) { r.maxRange, r.tooLarge = 1000, true })
	if m := late.m.Metrics(); m.SnapshotRepairs == 0 {
		t.Fatalf("no snapshot repair: %+v", m)
	}
}

// Reconcile publishes what makes the published holdings equal the ones
// given, and every node's index follows.
func TestReconcile(t *testing.T) {
	c := newCluster(t, 2, nil)
	waitFor(t, 20*time.Second, "2 nodes see each other", func() bool { return c.allSee(2) })
	o, other := c.nodes[0], c.nodes[1]
	for h := uint64(1); h <= 10; h++ {
		o.m.Publish(EventStore, 1, h)
	}
	o.m.Publish(EventStore, 1, 5) // a second copy
	held := []Entry{{5, 1}, {11, 1}, {12, 2}, {12, 2}}
	before := o.m.Metrics().EventsPublished
	if _, err := o.m.Reconcile(held); err != nil {
		t.Fatal(err)
	}
	// 9 removes of 1..10 but 5, one of 5's second copy, 2 stores.
	if got := o.m.Metrics().EventsPublished - before; got != 12 || o.m.Metrics().EventsReconciled != 12 {
		t.Fatalf("reconcile published %d events (%d counted), want 12", got, o.m.Metrics().EventsReconciled)
	}
	want := map[Entry]int{{5, 1}: 1, {11, 1}: 1, {12, 2}: 1}
	if got := holdings(o.m.Snapshot().Entries); !maps.Equal(got, want) {
		t.Fatalf("holdings after reconcile: %v, want %v", got, want)
	}
	if last, _ := o.m.Reconcile(held); last != o.m.Metrics().EventsPublished || o.m.Metrics().EventsReconciled != 12 {
		t.Fatalf("a second reconcile with the same holdings published events")
	}
	waitFor(t, 10*time.Second, "the other node indexes exactly the reconciled holdings", func() bool {
		other.sink.mu.Lock()
		defer other.sink.mu.Unlock()
		return maps.Equal(other.sink.entries["node-00"], want)
	})
}

// A node told the origin published more than it did (by a peer's state)
// learns the origin's last number from an empty range, without a
// snapshot.
func TestRepairLearnsOriginsLastFromEmptyRange(t *testing.T) {
	c := newCluster(t, 1, nil)
	o := c.nodes[0]
	for h := uint64(1); h <= 10; h++ {
		o.m.Publish(EventStore, 1, h)
	}
	late := c.startNode(1, func(c *Config) { c.RepairInterval = time.Hour })
	c.nodes = append(c.nodes, late)
	waitFor(t, 20*time.Second, "the late joiner indexes node-00's 10 blocks", func() bool {
		return late.sink.count("node-00") == 10
	})
	late.m.mu.Lock()
	st := late.m.origins["node-00"]
	st.known = 20
	j := repairJob{"node-00", st.inc, st.applied + 1, st.known}
	late.m.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	late.m.repair(ctx, j)
	late.m.mu.Lock()
	known, gap := st.known, !st.gapSince.IsZero()
	late.m.mu.Unlock()
	if m := late.m.Metrics(); known != 10 || gap || m.SnapshotRepairs != 0 || m.RepairFailures != 0 {
		t.Fatalf("after repairing 11..20 of an origin at 10: known %d, gap %v, %d snapshots, %d failures; want known 10, no gap, none",
			known, gap, m.SnapshotRepairs, m.RepairFailures)
	}
}
