package fabric_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

func ownedMetrics(a *fabric.Agent) fabric.OwnedIndexMetrics { return a.Metrics().OwnedIndex }

// Each of the owned index's counters moves when what it counts happens:
// events sent to owners and applied by them, lookups asked and answered,
// the answer cache's hits, misses and expiries, the hand-off when a
// member joins (and the replace its slice comes in), a call that fails;
// status carries the same figures.
func TestOwnedIndexMetrics(t *testing.T) {
	const ttl = 3 * time.Second
	configure := func(_ int, c *fabric.Config) {
		c.IndexMode, c.IndexReplicas, c.IndexCacheTTL = fabric.IndexOwned, 2, ttl
	}
	agents := clusterWith(t, 3, configure)
	n1, n3 := agents[0], agents[2]
	wait.For(t, 10*time.Second, "every node places hashes over all three", func() error {
		for _, a := range agents {
			if got := fabric.IndexMembers(a); len(got) != 3 {
				return fmt.Errorf("%s places over %v", a.NodeName(), got)
			}
		}
		return nil
	})
	sum := func(f func(fabric.OwnedIndexMetrics) uint64, of ...*fabric.Agent) (s uint64) {
		for _, a := range of {
			s += f(ownedMetrics(a))
		}
		return s
	}
	received := func(m fabric.OwnedIndexMetrics) uint64 { return m.OpsReceived }
	answered := func(m fabric.OwnedIndexMetrics) uint64 { return m.LookupsAnswered }

	// 20 stores, each to its 2 owners (n1 may be one: it calls itself).
	hashes := produce(t, n1, 1, layout.HND, 20)
	wait.For(t, 20*time.Second, "n1's 40 events sent and applied by their owners", func() error {
		m := ownedMetrics(n1)
		if m.OpsSent != 40 || m.OpCalls == 0 || sum(received, agents...) != 40 {
			return fmt.Errorf("n1 sent %d events in %d calls, the owners applied %d", m.OpsSent, m.OpCalls, sum(received, agents...))
		}
		return nil
	})

	// A lookup on n3 misses the cache for every hash and asks the owners
	// other than itself; they answer. The same lookup at once hits the
	// cache and asks no one.
	lookup := func() {
		t.Helper()
		ov, err := dial(t, n3).Lookup(context.Background(), hashes)
		if err != nil || len(ov) == 0 || ov[0].Node != "n1" || ov[0].Blocks != 20 {
			t.Fatalf("n3's lookup: %v, %v; want n1 holding 20", ov, err)
		}
	}
	before, answeredBefore := ownedMetrics(n3), sum(answered, agents[:2]...)
	lookup()
	m := ownedMetrics(n3)
	asked := m.LookupsAsked - before.LookupsAsked
	if asked == 0 || asked > 2 || sum(answered, agents[:2]...)-answeredBefore != asked {
		t.Fatalf("n3 asked %d owners (want 1 or 2), n1 and n2 answered %d", asked, sum(answered, agents[:2]...)-answeredBefore)
	}
	if misses := m.Cache.Misses - before.Cache.Misses; misses < 20 || m.Cache.Hits != before.Cache.Hits {
		t.Fatalf("first lookup: %d cache misses (want 20 or more), %d hits", misses, m.Cache.Hits-before.Cache.Hits)
	}
	before = m
	lookup()
	m = ownedMetrics(n3)
	if hits := m.Cache.Hits - before.Cache.Hits; hits < 20 || m.LookupsAsked != before.LookupsAsked {
		t.Fatalf("second lookup within the TTL: %d cache hits (want 20 or more), %d owners asked", hits, m.LookupsAsked-before.LookupsAsked)
	}
	wait.For(t, 10*ttl, "a lookup past the TTL finds its answers expired", func() error {
		lookup()
		if m := ownedMetrics(n3); m.Cache.Expired < 20 {
			return fmt.Errorf("%d expiries", m.Cache.Expired)
		}
		return nil
	})

	// A join moves some of n1's hashes to n4 (each hash goes to it with
	// odds 1/2: all 20 stay put once in a million): a hand-off, with its
	// events, and n4's slice comes in a replace.
	hb := ownedMetrics(n1)
	c := testConfig(t, "n4")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.4:0", "127.0.0.4:0", "off"
	c.Join = []string{n1.GossipAddr()}
	configure(3, &c)
	c.DevCADir = devCADirOf(n1)
	n4 := startAgent(t, c)
	wait.For(t, 20*time.Second, "n1 hands n4 its share", func() error {
		m := ownedMetrics(n1)
		if m.Handoffs <= hb.Handoffs || m.HandoffOps <= hb.HandoffOps || m.StreamReplaces <= hb.StreamReplaces || ownedMetrics(n4).OpsReceived == 0 {
			return fmt.Errorf("n1: %d hand-offs, %d events, %d replaces; n4 applied %d", m.Handoffs, m.HandoffOps, m.StreamReplaces, ownedMetrics(n4).OpsReceived)
		}
		return nil
	})

	// A call to a node that is not a member fails, and counts.
	errs := ownedMetrics(n1).StreamErrors
	fabric.IndexSendOps(n1, "no-such-node", hashes[0])
	if got := ownedMetrics(n1).StreamErrors; got != errs+1 {
		t.Fatalf("stream errors %d after a failed call, want %d", got, errs+1)
	}

	// Status shows the same counts (read between two snapshots: the
	// hand-off may still be sending).
	m0 := ownedMetrics(n1)
	s, err := dial(t, n1).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m1 := ownedMetrics(n1)
	o := s.OwnedIndex
	if s.IndexMode != "owned" || s.IndexReplicas != 2 || o == nil || s.GossipBytesIn == 0 || s.GossipBytesOut == 0 {
		t.Fatalf("status: mode %q/%d, owned index %v, gossip %d/%d bytes", s.IndexMode, s.IndexReplicas, o, s.GossipBytesIn, s.GossipBytesOut)
	}
	for _, f := range []struct {
		name        string
		lo, got, hi uint64
	}{
		{"ops sent", m0.OpsSent, o.OpsSent, m1.OpsSent},
		{"op calls", m0.OpCalls, o.OpCallsSent, m1.OpCalls},
		{"ops received", m0.OpsReceived, o.OpsReceived, m1.OpsReceived},
		{"lookups asked", m0.LookupsAsked, o.LookupsAsked, m1.LookupsAsked},
		{"lookups answered", m0.LookupsAnswered, o.LookupsAnswered, m1.LookupsAnswered},
		{"cache hits", m0.Cache.Hits, o.CacheHits, m1.Cache.Hits},
		{"cache misses", m0.Cache.Misses, o.CacheMisses, m1.Cache.Misses},
		{"cache expiries", m0.Cache.Expired, o.CacheExpiries, m1.Cache.Expired},
		{"hand-offs", m0.Handoffs, o.Handoffs, m1.Handoffs},
		{"hand-off ops", m0.HandoffOps, o.HandoffOps, m1.HandoffOps},
		{"stream errors", m0.StreamErrors, o.StreamErrors, m1.StreamErrors},
		{"stream replaces", m0.StreamReplaces, o.StreamReplaces, m1.StreamReplaces},
	} {
		if f.got < f.lo || f.got > f.hi {
			t.Errorf("status: %s %d, metrics %d then %d", f.name, f.got, f.lo, f.hi)
		}
	}
	if m1.Handoffs == 0 || m1.StreamErrors == 0 {
		t.Fatalf("n1's metrics lost their counts: %+v", m1)
	}
}

// Agents of different index modes in one cluster see each other as
// members, but not as index peers, and say so: metrics, status and an
// error log. A whole-mode node's gossiped events stay out of the owned
// node's slice; owned nodes of different replica counts leave each other
// out of their placements.
func TestIndexModeMismatch(t *testing.T) {
	t.Run("whole and owned", func(t *testing.T) {
		var logs logBuffer
		agents := clusterWith(t, 3, func(i int, c *fabric.Config) {
			if i == 1 {
				c.IndexMode, c.IndexReplicas = fabric.IndexOwned, 2
			}
			if i == 0 {
				c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
			}
		})
		n1, n2, n3 := agents[0], agents[1], agents[2]
		want := map[*fabric.Agent]int{n1: 1, n2: 2, n3: 1}
		wait.For(t, 10*time.Second, "each node counts the members in another mode", func() error {
			for a, n := range want {
				if got := a.Metrics().IndexMismatchedMembers; got != n {
					return fmt.Errorf("%s counts %d, want %d", a.NodeName(), got, n)
				}
			}
			return nil
		})
		wait.For(t, 10*time.Second, "the owned node places hashes over itself alone", func() error {
			if got := fabric.IndexMembers(n2); !slices.Equal(got, []string{"n2"}) {
				return fmt.Errorf("over %v", got)
			}
			return nil
		})
		if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "another mode") || !strings.Contains(l, "peer=n2") ||
			!strings.Contains(l, "its_mode=owned/2") || !strings.Contains(l, "this_mode=whole") {
			t.Fatalf("n1 logged no error naming n2's mode:\n%s", l)
		}
		s, err := dial(t, n1).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if s.IndexMode != "whole" || s.IndexMismatchedMembers != 1 || s.OwnedIndex != nil {
			t.Fatalf("n1's status: mode %q, %d mismatched, owned index %v", s.IndexMode, s.IndexMismatchedMembers, s.OwnedIndex)
		}
		for _, m := range s.Members {
			if wantOdd := m.Node == "n2"; m.IndexMismatch != wantOdd ||
				(wantOdd && (m.IndexMode != "owned" || m.IndexReplicas != 2)) || (!wantOdd && m.IndexMode != "whole") {
				t.Fatalf("n1's status of %s: %v", m.Node, m)
			}
		}
		// n1's blocks reach n3 by gossip; n2 receives the events too, and
		// refuses them.
		hashes := produce(t, n1, 1, layout.HND, 20)
		waitHolders(t, n3, hashes, map[string]int{"n1": 20})
		wait.For(t, 20*time.Second, "n2 refuses n1's gossiped events", func() error {
			if got := n2.Metrics().IndexEventsRefused; got < 20 {
				return fmt.Errorf("%d refused", got)
			}
			return nil
		})
		if p := fabric.IndexPairs(n2); p != 0 {
			t.Fatalf("the owned node's slice holds %d pairs of a whole-mode node's events", p)
		}
	})
	t.Run("owned with different replicas", func(t *testing.T) {
		agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
			c.IndexMode, c.IndexReplicas = fabric.IndexOwned, 2+i
		})
		wait.For(t, 10*time.Second, "each node places hashes over itself alone", func() error {
			for _, a := range agents {
				if got := fabric.IndexMembers(a); !slices.Equal(got, []string{a.NodeName()}) || a.Metrics().IndexMismatchedMembers != 1 {
					return fmt.Errorf("%s places over %v, counts %d mismatched", a.NodeName(), got, a.Metrics().IndexMismatchedMembers)
				}
			}
			return nil
		})
		s, err := dial(t, agents[0]).Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(s.Members, func(m *fabricpb.Member) bool { return m.Node == "n2" })
		if i < 0 || !s.Members[i].IndexMismatch || s.Members[i].IndexReplicas != 3 {
			t.Fatalf("n1's status of n2: %v", s.Members)
		}
	})
}
