package membership

import (
	"context"
	"testing"
	"time"
)

// gatedRepairer fails every repair until opened, as an origin that cannot
// be reached yet.
type gatedRepairer struct {
	*localRepairer
	open chan struct{}
}

func (g gatedRepairer) wait(ctx context.Context) error {
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g gatedRepairer) Events(ctx context.Context, origin string, inc, from, to uint64) ([]Event, error) {
	if err := g.wait(ctx); err != nil {
		return nil, err
	}
	return g.localRepairer.Events(ctx, origin, inc, from, to)
}

func (g gatedRepairer) Snapshot(ctx context.Context, origin string) (HoldingsSnapshot, error) {
	if err := g.wait(ctx); err != nil {
		return HoldingsSnapshot{}, err
	}
	return g.localRepairer.Snapshot(ctx, origin)
}

// A node that joins a cluster whose members published before it came is
// not synced until repair brought their events; then it is, and stays so.
func TestSyncedAfterFirstRepair(t *testing.T) {
	c := newCluster(t, 2, nil)
	waitFor(t, 20*time.Second, "2 nodes see each other", func() bool { return c.allSee(2) })
	for _, n := range c.nodes {
		if ok, _ := n.m.Synced(); !ok {
			t.Fatalf("%s: not synced in a cluster with nothing published", n.m.Name())
		}
	}
	c.nodes[0].m.Publish(EventStore, 1, 1, 2, 3)
	c.nodes[1].m.Publish(EventStore, 1, 4)
	waitFor(t, 10*time.Second, "events spread", func() bool { return c.everyoneHas("node-00", 3) && c.everyoneHas("node-01", 4) })
	// Retransmissions over, so that only repair can bring the events to a
	// node that joins now.
	waitFor(t, 20*time.Second, "broadcast queues empty", func() bool {
		return c.nodes[0].m.Metrics().QueuedBroadcasts == 0 && c.nodes[1].m.Metrics().QueuedBroadcasts == 0
	})

	gate := gatedRepairer{localRepairer: c.repairer, open: make(chan struct{})}
	opened := false
	open := func() {
		if !opened {
			opened = true
			close(gate.open)
		}
	}
	t.Cleanup(open)
	late := c.startNode(2, func(cfg *Config) {
		cfg.Repairer = gate
		cfg.RepairTimeout = 200 * time.Millisecond
	})
	c.nodes = append(c.nodes, late)
	// Joined, with the seed's state taken: gaps are open for both origins
	// and stay open while repairs fail.
	if joined, _ := late.m.Joined(); !joined {
		t.Fatal("not joined after Start")
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if ok, behind := late.m.Synced(); ok || behind == 0 {
			t.Fatalf("synced=%v with %d origins behind while no repair can succeed", ok, behind)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if late.sink.has("node-00", 3) {
		t.Fatal("the late node has node-00's block without a repair: the test proves nothing")
	}
	open()
	waitFor(t, 20*time.Second, "the late node synced", func() bool { ok, _ := late.m.Synced(); return ok })
	if !late.sink.has("node-00", 3) || !late.sink.has("node-01", 4) {
		t.Fatal("synced before the sink holds every origin's blocks")
	}
	// Later gaps do not take readiness back.
	late.m.mu.Lock()
	late.m.origins["node-00"].gapSince = time.Now()
	late.m.mu.Unlock()
	if ok, _ := late.m.Synced(); !ok {
		t.Fatal("a later gap made the node unsynced again")
	}
}

// Resync fetches an origin's events again from the start: a Sink that lost
// them (here: forgot the origin) gets every entry back, removes applied in
// order, and the other origins are left alone.
func TestResyncRefetchesOneOrigin(t *testing.T) {
	c := newCluster(t, 3, nil)
	waitFor(t, 20*time.Second, "3 nodes see each other", func() bool { return c.allSee(3) })
	c.nodes[0].m.Publish(EventStore, 1, 1, 2, 3)
	c.nodes[0].m.Publish(EventRemove, 1, 2)
	c.nodes[1].m.Publish(EventStore, 1, 9)
	x := c.nodes[2]
	waitFor(t, 10*time.Second, "events applied", func() bool {
		return x.sink.count("node-00") == 2 && x.sink.has("node-01", 9)
	})
	before := x.sink.digest()
	x.sink.Drop("node-00")
	if x.m.Resync("node-99") {
		t.Fatal("resync of a node that is not a member")
	}
	if !x.m.Resync("node-00") {
		t.Fatal("resync of a member refused")
	}
	waitFor(t, 20*time.Second, "node-00's entries back", func() bool {
		return x.sink.has("node-00", 1) && x.sink.has("node-00", 3)
	})
	if x.sink.has("node-00", 2) || x.sink.count("node-00") != 2 {
		t.Fatalf("after the resync node-00 has %d entries (2 present: %v)", x.sink.count("node-00"), x.sink.has("node-00", 2))
	}
	if got := x.sink.digest(); got != before {
		t.Fatalf("sink digest %x after the resync, %x before the loss", got, before)
	}
	if m := x.m.Metrics(); m.Resyncs != 1 {
		t.Fatalf("%d resyncs counted, want 1", m.Resyncs)
	}
}
