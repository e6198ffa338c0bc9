package fabric_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/transfer"
)

// importVia imports hashes on a under TP tp, every byte checked, and returns
// the transport each of its fetches names.
func importVia(t *testing.T, a *fabric.Agent, tp int, order layout.KVOrder, hashes []uint64) []string {
	t.Helper()
	_, _, resp := importChecked(t, a, fmt.Sprintf("consumer-tp%d", tp), tp, order, hashes)
	var via []string
	for _, f := range resp.Fetches {
		via = append(via, f.Transport)
	}
	return via
}

// laneOn serves a lane on the agent's peer address's host.
func laneOn(plain bool) func(i int, c *fabric.Config) {
	return func(i int, c *fabric.Config) {
		host, _, _ := net.SplitHostPort(c.PeerAddr)
		c.LaneAddr, c.LanePlain = net.JoinHostPort(host, "0"), plain
	}
}

func waitIndexed(t *testing.T, reader *fabric.Agent, holder string, n uint64) {
	t.Helper()
	wait.For(t, 5*time.Second, reader.NodeName()+" indexes "+holder+"'s blocks", func() error {
		if got := agentStatus(t, reader).Members[holder]; got != n {
			return fmt.Errorf("%s indexes %d blocks of %s", reader.NodeName(), got, holder)
		}
		return nil
	})
}

// waitServed waits until holder counts as served, by the transports
// together as well as in all, the bytes an importer read from it, and
// returns its transport counters then. A holder counts a read once its
// answer's last byte is written, and the importer may have read that
// byte, finished its import and returned before the holder's goroutine
// runs again: a snapshot taken at once may count none of it.
func waitServed(t *testing.T, holder *fabric.Agent, read uint64) transfer.Metrics {
	t.Helper()
	var hm transfer.Metrics
	wait.For(t, 10*time.Second, holder.NodeName()+" counts the bytes it served", func() error {
		hm = holder.Metrics().Transport
		if hm.BytesServed < read || hm.BytesServedLane+hm.BytesServedQUIC < read {
			return fmt.Errorf("%d bytes served, %d over the lane, %d over quic; the importer read %d",
				hm.BytesServed, hm.BytesServedLane, hm.BytesServedQUIC, read)
		}
		return nil
	})
	return hm
}

// TP 4 -> TP 2 between in-process agents over the lane, TLS and plain:
// byte for byte, the fetch says tcp, every byte counted as the lane's,
// and status names the lane (loudly when plain).
func TestImportOverLane(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			agents := clusterWith(t, 2, laneOn(plain))
			n1, n2 := agents[0], agents[1]
			hashes := produce(t, n1, 4, layout.HND, 20)
			waitIndexed(t, n2, "n1", 20)
			if via := importVia(t, n2, 2, layout.NHD, hashes); len(via) != 1 || via[0] != "tcp" {
				t.Fatalf("fetches over %v, want one over tcp", via)
			}
			m := n2.Metrics()
			if m.ImportBytes == 0 || m.Transport.BytesReadLane != m.Transport.BytesRead || m.Transport.BytesReadQUIC != 0 {
				t.Errorf("importer: %d bytes imported, %d read, %d over the lane, %d over quic",
					m.ImportBytes, m.Transport.BytesRead, m.Transport.BytesReadLane, m.Transport.BytesReadQUIC)
			}
			if lane, quic := chunks(m.ImportChunkTimeLane), chunks(m.ImportChunkTime); lane == 0 || quic != 0 {
				t.Errorf("importer's chunk times: %d over the lane, %d over quic; want all over the lane", lane, quic)
			}
			if hm := waitServed(t, n1, m.Transport.BytesRead); hm.BytesServed == 0 || hm.BytesServed != m.Transport.BytesRead || hm.BytesServedLane != hm.BytesServed || hm.BytesServedQUIC != 0 {
				t.Errorf("holder: %d bytes served, %d over the lane, %d over quic; the importer read %d",
					hm.BytesServed, hm.BytesServedLane, hm.BytesServedQUIC, m.Transport.BytesRead)
			}
			s, err := dial(t, n1).Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			want := "tls "
			if plain {
				want = "PLAIN TCP "
			}
			if !strings.HasPrefix(s.Lane, want) {
				t.Errorf("holder's status says lane %q, want it to start %q", s.Lane, want)
			}
		})
	}
}

// A holder whose lane cannot be reached (it listens on another address
// than the one peers know it by) is read over QUIC within the import, and
// the importer counts why.
func TestImportLaneUnreachableFallsBackToQUIC(t *testing.T) {
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		if i == 0 {
			c.LaneAddr = "127.0.0.201:0"
		}
	})
	n1, n2 := agents[0], agents[1]
	hashes := produce(t, n1, 4, layout.HND, 8)
	waitIndexed(t, n2, "n1", 8)
	if via := importVia(t, n2, 2, layout.HND, hashes); len(via) != 1 || via[0] != "quic" {
		t.Fatalf("fetches over %v, want one over quic", via)
	}
	m := n2.Metrics()
	if m.Transport.LaneFallbacks[transfer.LaneFallbackConnect] == 0 {
		t.Errorf("importer's lane fallbacks: %v, want a connect failure", m.Transport.LaneFallbacks)
	}
	if lane, quic := chunks(m.ImportChunkTimeLane), chunks(m.ImportChunkTime); lane != 0 || quic == 0 {
		t.Errorf("importer's chunk times: %d over the lane, %d over quic; want all over quic", lane, quic)
	}
	if hm := waitServed(t, n1, m.Transport.BytesRead); hm.BytesServed == 0 || hm.BytesServed != m.Transport.BytesRead || hm.BytesServedQUIC != hm.BytesServed || hm.BytesServedLane != 0 {
		t.Errorf("holder: %d bytes served, %d over the lane, %d over quic; the importer read %d",
			hm.BytesServed, hm.BytesServedLane, hm.BytesServedQUIC, m.Transport.BytesRead)
	}
	s, err := dial(t, n2).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.Lane != "off" || s.LaneFallbacks[transfer.LaneFallbackConnect] == 0 {
		t.Errorf("importer's status: lane %q, fallbacks %v", s.Lane, s.LaneFallbacks)
	}
}

func TestLaneConfig(t *testing.T) {
	for _, tc := range []struct {
		name  string
		set   func(c *fabric.Config)
		field string
	}{
		{"lane_conns past the limit", func(c *fabric.Config) { c.LaneConns = transfer.MaxLaneConns + 1 }, "lane_conns"},
		{"negative lane_conns", func(c *fabric.Config) { c.LaneConns = -1 }, "lane_conns"},
		{"plain without an address", func(c *fabric.Config) { c.LanePlain = true }, "lane_plain"},
		{"bad address", func(c *fabric.Config) { c.LaneAddr = "nowhere" }, "lane_addr"},
		{"negative lane_max_pending", func(c *fabric.Config) { c.LaneMaxPending = -1 }, "lane_max_pending"},
		{"lane_max_pending past the limit", func(c *fabric.Config) { c.LaneMaxPending = fabric.MaxLanePending + 1 }, "lane_max_pending"},
		{"negative lane_max_pending_per_source", func(c *fabric.Config) { c.LaneMaxPendingPerSource = -1 }, "lane_max_pending_per_source"},
		{"lane_max_pending_per_source past the limit", func(c *fabric.Config) { c.LaneMaxPendingPerSource = fabric.MaxLanePending + 1 }, "lane_max_pending_per_source"},
		{"lane_hello_timeout under its floor", func(c *fabric.Config) { c.LaneHelloTimeout = time.Millisecond }, "lane_hello_timeout"},
		{"lane_hello_timeout past its ceiling", func(c *fabric.Config) { c.LaneHelloTimeout = fabric.MaxLaneHelloTimeout + time.Second }, "lane_hello_timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, "n1")
			tc.set(&c)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := fabric.Start(ctx, c)
			if err == nil {
				a.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("error %q does not name %s", err, tc.field)
			}
		})
	}
	c := testConfig(t, "n1")
	c.LaneAddr, c.LaneConns = "127.0.0.1:0", transfer.MaxLaneConns
	c.LaneMaxPending, c.LaneMaxPendingPerSource, c.LaneHelloTimeout = fabric.MaxLanePending, 1, fabric.MinLaneHelloTimeout
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a, err := fabric.Start(ctx, c)
	if err != nil {
		t.Fatalf("lane_conns at the limit: %v", err)
	}
	a.Close()
}

// chunks is how many chunk times h recorded.
func chunks(h pool.Histogram) (n uint64) {
	for _, c := range h.Counts {
		n += c
	}
	return n
}
