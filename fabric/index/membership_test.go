package index_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/membership"
)

// indexSink feeds membership's replicated events into an Index, as the agent
// does.
type indexSink struct{ ix *index.Index }

func (s indexSink) Apply(events []membership.Event) {
	id, err := s.ix.Node(events[0].Origin, events[0].Incarnation)
	if errors.Is(err, index.ErrStaleIncarnation) {
		return
	}
	if err != nil {
		panic(err) // MaxNodes nodes in a test: a bug
	}
	for _, e := range events {
		if e.Kind == membership.EventStore {
			s.ix.Store(id, e.Hash)
		} else {
			s.ix.Remove(id, e.Hash)
		}
	}
}

func (s indexSink) Drop(origin string) {
	if s.ix.DropName(origin) {
		s.ix.Sweep() // in the callback: a test's index is small
	}
}

// repairer reaches origins in this process.
type repairer struct {
	mu    sync.Mutex
	nodes map[string]*membership.Membership
}

func (r *repairer) node(origin string) (*membership.Membership, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.nodes[origin]; m != nil {
		return m, nil
	}
	return nil, fmt.Errorf("no node %q", origin)
}

func (r *repairer) Events(_ context.Context, origin string, inc, from, to uint64) ([]membership.Event, error) {
	m, err := r.node(origin)
	if err != nil {
		return nil, err
	}
	return m.EventRange(inc, from, to)
}

func (r *repairer) Snapshot(_ context.Context, origin string) (membership.HoldingsSnapshot, error) {
	m, err := r.node(origin)
	if err != nil {
		return membership.HoldingsSnapshot{}, err
	}
	return m.Snapshot(), nil
}

type agent struct {
	m  *membership.Membership
	ix *index.Index
}

func startAgents(tb testing.TB, n int) []*agent {
	tb.Helper()
	rep := &repairer{nodes: map[string]*membership.Membership{}}
	var seeds []string
	agents := make([]*agent, n)
	for i := range agents {
		ix, _ := index.New(index.DefaultConfig())
		cfg := membership.DefaultLocalConfig()
		cfg.Name = fmt.Sprintf("agent-%02d", i)
		cfg.BindAddr = fmt.Sprintf("127.0.0.%d", 100+i)
		cfg.Seeds = seeds
		cfg.Sink = indexSink{ix}
		cfg.Repairer = rep
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		m, err := membership.Start(ctx, cfg)
		cancel()
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { m.Close() })
		rep.mu.Lock()
		rep.nodes[cfg.Name] = m
		rep.mu.Unlock()
		if i == 0 {
			seeds = []string{m.Addr().String()}
		}
		agents[i] = &agent{m, ix}
	}
	waitTrue(tb, 20*time.Second, "agents see each other", func() bool {
		for _, a := range agents {
			if a.m.NumMembers() != n {
				return false
			}
		}
		return true
	})
	return agents
}

func waitTrue(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	wait.For(tb, timeout, what, func() error {
		if !cond() {
			return errNotYet
		}
		return nil
	})
}

var errNotYet = errors.New("not yet")

func holdsEverywhere(agents []*agent, origin string, hash uint64) bool {
	for _, a := range agents {
		id, ok := a.ix.Lookup(origin)
		if !ok || !slices.Contains(a.ix.Holders(hash), id) {
			return false
		}
	}
	return true
}

// TestIndexesFollowMembership wires the index to membership as the agent
// does: a chain stored on one node is matched on every node, and a node
// that leaves is dropped from every index.
func TestIndexesFollowMembership(t *testing.T) {
	agents := startAgents(t, 4)
	chain := []uint64{11, 12, 13, 14}
	agents[1].m.Publish(membership.EventStore, 1, chain...)
	agents[2].m.Publish(membership.EventStore, 1, chain[:2]...)
	waitTrue(t, 10*time.Second, "chains in every index", func() bool {
		return holdsEverywhere(agents, "agent-01", 14) && holdsEverywhere(agents, "agent-02", 12)
	})
	digest := agents[0].ix.Digest()
	for _, a := range agents {
		got := a.ix.FindMatches(chain)
		if len(got) != 2 || a.ix.Name(got[0].Node) != "agent-01" || got[0].Blocks != 4 ||
			a.ix.Name(got[1].Node) != "agent-02" || got[1].Blocks != 2 {
			t.Fatalf("%s: FindMatches = %v", a.m.Name(), got)
		}
		if a.ix.Digest() != digest {
			t.Fatalf("%s: digest %x, agent-00 has %x", a.m.Name(), a.ix.Digest(), digest)
		}
	}
	agents[1].m.Close()
	waitTrue(t, 10*time.Second, "agent-01 dropped", func() bool {
		for _, a := range []*agent{agents[0], agents[2], agents[3]} {
			if len(a.ix.FindMatches(chain)) != 1 {
				return false
			}
		}
		return true
	})
}

// BenchmarkPropagation measures the time from a store on one agent to its
// presence in all 16 indexes (p50, p99), through gossip. The baseline in the
// same run is a UDP datagram sent straight to each of 15 loopback sockets:
// the floor for reaching 15 nodes, without gossip rounds.
func BenchmarkPropagation(b *testing.B) {
	agents := startAgents(b, 16)
	var hash uint64 = 1 << 40
	measure := func(b *testing.B, publish func(origin *agent, h uint64)) (p50, p99 time.Duration) {
		b.Helper()
		var lat []time.Duration
		i := 0
		for b.Loop() {
			origin := agents[i%len(agents)]
			i++
			hash++
			start := time.Now()
			publish(origin, hash)
			wait.Every(b, 200*time.Microsecond, 10*time.Second, "store reaches every index", func() error {
				if !holdsEverywhere(agents, origin.m.Name(), hash) {
					return errNotYet
				}
				return nil
			})
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		p50, p99 = lat[len(lat)/2], lat[len(lat)*99/100]
		b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
		b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
		return p50, p99
	}
	var base time.Duration
	b.Run("baseline=udp-fanout", func(b *testing.B) {
		// 15 receivers on loopback, each datagram acknowledged through a
		// channel: the floor for getting a message to 15 nodes.
		var conns []*net.UDPConn
		got := make(chan struct{}, 1024)
		for i := range 15 {
			c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, byte(150+i))})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			conns = append(conns, c)
			go func() {
				buf := make([]byte, 2048)
				for {
					if _, _, err := c.ReadFromUDP(buf); err != nil {
						return
					}
					got <- struct{}{}
				}
			}()
		}
		src, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 149)})
		if err != nil {
			b.Fatal(err)
		}
		defer src.Close()
		msg := make([]byte, 64)
		var lat []time.Duration
		for b.Loop() {
			start := time.Now()
			for _, c := range conns {
				src.WriteToUDP(msg, c.LocalAddr().(*net.UDPAddr))
			}
			for range conns {
				select {
				case <-got:
				case <-time.After(time.Second):
					b.Fatal("datagram lost")
				}
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		base = lat[len(lat)/2]
		b.ReportMetric(float64(base.Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	})
	b.Run("gossip", func(b *testing.B) {
		p50, _ := measure(b, func(origin *agent, h uint64) { origin.m.Publish(membership.EventStore, 1, h) })
		if base > 0 {
			b.ReportMetric(float64(p50)/float64(base), "p50-x-baseline")
		}
	})
}
