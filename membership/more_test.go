package membership

import (
	"context"
	"net"
	"testing"
	"time"
)

// drainEvents collects what arrived on a node's event channel so far.
func drainEvents(m *Membership) []MemberEvent {
	var out []MemberEvent
	for {
		select {
		case e := <-m.Events():
			out = append(out, e)
		default:
			return out
		}
	}
}

func TestMemberEvents(t *testing.T) {
	c := newCluster(t, 4, nil)
	waitFor(t, 20*time.Second, "4 nodes see each other", func() bool { return c.allSee(4) })
	watcher := c.nodes[0].m
	var seen []MemberEvent
	has := func(kind MemberEventKind, name string) bool {
		seen = append(seen, drainEvents(watcher)...)
		for _, e := range seen {
			if e.Kind == kind && e.Member.Name == name {
				return true
			}
		}
		return false
	}
	waitFor(t, 5*time.Second, "join events for the other three", func() bool {
		return has(MemberJoin, "node-01") && has(MemberJoin, "node-02") && has(MemberJoin, "node-03")
	})

	meta := Meta{PeerAddr: "127.0.0.12:7000", Transports: TransportQUIC, LayoutDigest: 99, Load: Load{KVUsage: 0.25, Waiting: 4}}
	if err := c.nodes[2].m.SetMeta(context.Background(), meta); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "node-00 sees node-02's new metadata", func() bool {
		if !has(MemberUpdate, "node-02") {
			return false
		}
		for _, mb := range watcher.Members() {
			if mb.Name == "node-02" {
				return mb.MetaErr == nil && mb.Meta.LayoutDigest == 99 && mb.Meta.Load.Waiting == 4 &&
					mb.Meta.Incarnation == c.nodes[2].m.Incarnation()
			}
		}
		return false
	})

	c.nodes[1].m.Close()
	waitFor(t, 5*time.Second, "a leave event for node-01", func() bool { return has(MemberLeave, "node-01") })
	c.nodes[3].m.shutdown(false)
	waitFor(t, 30*time.Second, "a fail event for node-03", func() bool { return has(MemberFail, "node-03") })
}

// TestSeedThatStartsLater: a node whose seed is down at start joins it when
// it comes up, by the periodic rejoin, as after a partition heals.
func TestSeedThatStartsLater(t *testing.T) {
	// Find a free port for the seed, then let it go.
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 40)})
	if err != nil {
		t.Fatal(err)
	}
	seedAddr := l.Addr().(*net.TCPAddr)
	l.Close()
	c := &cluster{t: t, repairer: &localRepairer{nodes: map[string]*Membership{}}, seeds: []string{seedAddr.String()}}
	early := c.startNode(1, func(cfg *Config) { cfg.RejoinInterval = 100 * time.Millisecond })
	if early.m.NumMembers() != 1 {
		t.Fatalf("the early node sees %d members with its seed down", early.m.NumMembers())
	}
	seed := c.startNode(0, func(cfg *Config) {
		cfg.BindAddr = "127.0.0.40"
		cfg.BindPort = seedAddr.Port
		cfg.Seeds = nil
	})
	c.nodes = []*testNode{seed, early}
	waitFor(t, 10*time.Second, "the early node joined its late seed", func() bool { return c.allSee(2) })
}

// TestKeyRotation rotates the gossip key on a running cluster: install the
// new key everywhere, use it everywhere, remove the old one. The cluster
// stays whole, and a node that knows only the new key joins.
func TestKeyRotation(t *testing.T) {
	oldKey, newKey := []byte("0123456789abcdef"), []byte("ABCDEFGHIJKLMNOP")
	c := newCluster(t, 3, func(cfg *Config) { cfg.Keys = [][]byte{oldKey} })
	waitFor(t, 20*time.Second, "3 nodes see each other", func() bool { return c.allSee(3) })
	for _, step := range []func(*Membership) error{
		func(m *Membership) error { return m.InstallKey(newKey) },
		func(m *Membership) error { return m.UseKey(newKey) },
		func(m *Membership) error { return m.RemoveKey(oldKey) },
	} {
		for _, n := range c.nodes {
			if err := step(n.m); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.nodes = append(c.nodes, c.startNode(3, func(cfg *Config) { cfg.Keys = [][]byte{newKey} }))
	waitFor(t, 20*time.Second, "4 nodes see each other after rotation", func() bool { return c.allSee(4) })
	c.nodes[0].m.Publish(EventStore, 1, 5)
	waitFor(t, 10*time.Second, "events flow under the new key", func() bool { return c.everyoneHas("node-00", 5) })

	plain := newCluster(t, 1, nil)
	if err := plain.nodes[0].m.InstallKey(newKey); err != ErrNoKeyring {
		t.Fatalf("InstallKey without encryption = %v, want ErrNoKeyring", err)
	}
}

func TestPublishAndRangeRefuseBadInput(t *testing.T) {
	c := newCluster(t, 1, nil)
	m := c.nodes[0].m
	if _, err := m.Publish(EventKind(9), 1, 1); err == nil {
		t.Fatal("Publish accepted kind 9")
	}
	if _, err := m.EventRange(m.Incarnation(), 0, 5); err == nil {
		t.Fatal("EventRange accepted a range starting at 0")
	}
	m.Publish(EventStore, 1, 1, 2)
	evs, err := m.EventRange(m.Incarnation(), 2, 100)
	if err != nil || len(evs) != 1 || evs[0].Seq != 2 {
		t.Fatalf("EventRange(2, 100) = %+v, %v; want event 2 alone", evs, err)
	}
	m.Close()
	if _, err := m.Publish(EventStore, 1, 3); err != ErrClosed {
		t.Fatalf("Publish after Close = %v, want ErrClosed", err)
	}
}
