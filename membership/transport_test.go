package membership

import (
	"testing"
	"time"
)

// TestGossipBytesCounted checks that a node counts the bytes memberlist
// carries for it: both nodes count some once joined, and the receiver's
// count grows by at least what the events it applied take on the wire.
func TestGossipBytesCounted(t *testing.T) {
	c := newCluster(t, 2, nil)
	waitFor(t, 10*time.Second, "both nodes see each other", func() bool { return c.allSee(2) })
	a, b := c.nodes[0], c.nodes[1]
	for _, n := range c.nodes {
		waitFor(t, 10*time.Second, n.m.cfg.Name+" counts gossip both ways", func() bool {
			m := n.m.Metrics()
			return m.GossipBytesIn > 0 && m.GossipBytesOut > 0
		})
	}
	before := b.m.Metrics().GossipBytesIn
	const events = 500
	hashes := make([]uint64, events)
	for i := range hashes {
		hashes[i] = 0x8000_0000_0000_0000 | uint64(i)*0x9e37_79b9 // 8 bytes each on the wire
	}
	if _, err := a.m.Publish(EventStore, 1, hashes...); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the receiver applies every event", func() bool { return b.sink.count(a.m.cfg.Name) == events })
	// Each event is a kind byte and its hash, at least.
	if grew := b.m.Metrics().GossipBytesIn - before; grew < events*9 {
		t.Fatalf("gossip bytes in grew by %d for %d events applied, want at least %d", grew, events, events*9)
	}
	if out := a.m.Metrics().GossipBytesOut; out < events*9 {
		t.Fatalf("the origin sent %d gossip bytes for %d events, want at least %d", out, events, events*9)
	}
}

// TestGossipTransportClosesTwice checks that the counting transport stops
// cleanly, twice, while packets still arrive.
func TestGossipTransportClosesTwice(t *testing.T) {
	c := newCluster(t, 2, nil)
	waitFor(t, 10*time.Second, "both nodes see each other", func() bool { return c.allSee(2) })
	ct := c.nodes[1].m.counting
	if ct == nil {
		t.Fatal("a node on memberlist's UDP transport has no counting transport")
	}
	if err := c.nodes[1].m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := ct.Shutdown(); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
}
