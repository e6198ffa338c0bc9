package fabric_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer"
)

// firstDatagramConn sends each connection's first datagram only and never
// delivers an answer: a QUIC client on it abandons every handshake after
// its Initial, as a flood of half-open handshakes does.
type firstDatagramConn struct {
	net.PacketConn
	mu   sync.Mutex
	seen map[string]bool
}

func (c *firstDatagramConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	// Long header: flags, version (4), DCID length, DCID.
	if len(b) < 7 || b[0]&0x80 == 0 || len(b) < 6+int(b[5]) {
		return len(b), nil
	}
	dcid := string(b[6 : 6+int(b[5])])
	c.mu.Lock()
	first := !c.seen[dcid]
	c.seen[dcid] = true
	c.mu.Unlock()
	if !first {
		return len(b), nil
	}
	return c.PacketConn.WriteTo(b, addr)
}

func (c *firstDatagramConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		if _, _, err := c.PacketConn.ReadFrom(b); err != nil {
			return 0, nil, err
		}
	}
}

// floodEvery spaces the flood's dials, about 400 a second in all: past
// the holder's bound of 16 handshakes per source (each kept until its
// handshake timeout, seconds), every dial is refused, so the pace is the
// refusals'. floodDialFor is how long a dial lives: long enough for its
// first packet to leave on two loaded cores. Unpaced, with dials given up
// after 20 ms, the dialers ran flat out in the test's own process, beside
// both agents; loaded, most dials were given up before their first
// packet left, so the flood took far longer to make its refusals while
// its runnable dialers kept the agents' gossip from answering probes in
// time, and a member was suspected.
const (
	floodEvery   = 2500 * time.Microsecond
	floodDialFor = 250 * time.Millisecond
)

// handshakeFlood dials a peer port from one source address, over and
// over, abandoning every handshake after its first packet.
type handshakeFlood struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	dials   atomic.Uint64
	started time.Time
	elapsed time.Duration
}

// startHandshakeFlood floods to from source (an IP) with dialers dialing
// in a loop, until the returned flood's end is called (also when the test
// ends).
func startHandshakeFlood(t *testing.T, source, to string, dialers int) *handshakeFlood {
	t.Helper()
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(source)})
	if err != nil {
		t.Fatalf("flood source %s: %v", source, err)
	}
	dst, err := net.ResolveUDPAddr("udp", to)
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: &firstDatagramConn{PacketConn: uc, seen: map[string]bool{}}}
	f := &handshakeFlood{stop: make(chan struct{}), started: time.Now()}
	tlsConf := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{transfer.ALPN}}
	pace := time.NewTicker(floodEvery)
	for range dialers {
		f.wg.Go(func() {
			for {
				select {
				case <-f.stop:
					return
				case <-pace.C:
				}
				ctx, cancel := context.WithTimeout(context.Background(), floodDialFor)
				tr.Dial(ctx, dst, tlsConf, &quic.Config{HandshakeIdleTimeout: time.Second})
				cancel()
				f.dials.Add(1)
			}
		})
	}
	t.Cleanup(func() {
		f.end()
		pace.Stop()
		tr.Close()
		uc.Close()
	})
	return f
}

// end stops the flood and waits for its dialers; safe to call twice.
func (f *handshakeFlood) end() {
	select {
	case <-f.stop:
		return
	default:
	}
	close(f.stop)
	f.wg.Wait()
	f.elapsed = time.Since(f.started)
}

// A flood of abandoned QUIC handshakes from one source at a holder's peer
// port, lasting the whole test: a node joins the holder under it and
// imports from it byte for byte, gossip suspects neither node and keeps
// both alive, and the holder's engine API answers Register and Lookup;
// the holder refuses the flood at its bounds, counts it in its metrics and
// logs it.
func TestHandshakeFloodKeepsImportsGossipAndEngineServed(t *testing.T) {
	// quic-go warns once that the flood's wrapped socket takes no buffer sizes.
	t.Setenv("QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING", "true")
	root, err := os.MkdirTemp("", "kvff")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	logs := map[string]*logBuffer{}
	start := func(i int, join []string) *fabric.Agent {
		c := fabric.DefaultLocalConfig()
		c.NodeName = fmt.Sprintf("n%d", i)
		c.DataDir = filepath.Join(root, c.NodeName)
		c.DevCADir = filepath.Join(root, "ca")
		ip := fmt.Sprintf("127.0.0.%d", i)
		c.GossipAddr, c.PeerAddr, c.MetricsAddr = ip+":0", ip+":0", "off"
		c.Pools = []string{"host=64MiB"}
		// Wide: CI runs the flood's dialers and both agents on two cores.
		c.PeerTimeout = 10 * time.Second
		logs[c.NodeName] = &logBuffer{}
		c.Logger = slog.New(slog.NewTextHandler(logs[c.NodeName], &slog.HandlerOptions{Level: slog.LevelInfo}))
		c.Join = join
		return startAgent(t, c)
	}
	n1 := start(1, nil)
	hashes := produce(t, n1, 2, layout.HND, 20)
	var peerAddr string
	st, err := dial(t, n1).Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range st.Members {
		if m.Node == "n1" {
			peerAddr = m.PeerAddr
		}
	}
	if peerAddr == "" {
		t.Fatalf("n1's status names no peer address of its own: %v", st.Members)
	}

	// Enough dialers for the pace with each dial alive floodDialFor.
	flood := startHandshakeFlood(t, "127.0.0.200", peerAddr, int(floodDialFor/floodEvery)+28)
	wait.For(t, 60*time.Second, "n1 refuses the flood's handshakes", func() error {
		if m := n1.Metrics().Transport; m.ConnsRefused < 16 {
			return fmt.Errorf("%d refused after %d dials", m.ConnsRefused, flood.dials.Load())
		}
		return nil
	})
	refusedBefore := n1.Metrics().Transport.ConnsRefused

	// n2 joins under the flood: its first handshake with n1 meets it.
	n2 := start(2, []string{n1.GossipAddr()})
	wait.For(t, 60*time.Second, "n1 and n2 see each other alive", func() error {
		for _, a := range []*fabric.Agent{n1, n2} {
			if got := len(agentStatus(t, a).Members); got != 2 {
				return fmt.Errorf("%s sees %d members alive", a.NodeName(), got)
			}
		}
		return nil
	})
	// Both nodes' views of each other, watched while the flood lasts.
	watchers := map[*fabric.Agent]*client.Client{n1: newClient(t, n1), n2: newClient(t, n2)}
	var (
		watchMu  sync.Mutex
		notAlive []string
		looks    = map[*fabric.Agent]int{}
		watchWG  sync.WaitGroup
	)
	watchStop := make(chan struct{})
	for a, c := range watchers {
		watchWG.Go(func() {
			for {
				select {
				case <-watchStop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				s, err := c.Status(ctx)
				cancel()
				alive := 0
				for _, m := range s.GetMembers() {
					if m.State == "alive" {
						alive++
					}
				}
				watchMu.Lock()
				looks[a]++
				if err != nil || alive != 2 {
					notAlive = append(notAlive, fmt.Sprintf("%s: %d members alive, status error %v", a.NodeName(), alive, err))
				}
				watchMu.Unlock()
			}
		})
	}
	stopWatch := func() {
		select {
		case <-watchStop:
		default:
			close(watchStop)
			watchWG.Wait()
		}
	}
	t.Cleanup(stopWatch)

	waitLookup(t, dial(t, n2), hashes)
	began := time.Now()
	if from := consume(t, n2, 4, layout.NHD, hashes); len(from) != 1 || from[0] != "n1" {
		t.Fatalf("n2 imported from %v, want n1", from)
	}
	importTook := time.Since(began)
	if importTook > 60*time.Second {
		t.Fatalf("the import under the flood took %v", importTook)
	}

	// The holder's engine API, on a session dialed under the flood.
	began = time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := newClient(t, n1)
	set, err := c.Register(ctx, client.Engine{Name: "late", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 16})
	if err != nil {
		t.Fatalf("register on n1 under the flood: %v", err)
	}
	if set.ID == 0 || len(set.Ranks) != 1 {
		t.Fatalf("register on n1 under the flood: set %d with %d ranks", set.ID, len(set.Ranks))
	}
	ov, err := c.Lookup(ctx, hashes)
	if err != nil || len(ov) == 0 || int(ov[0].Blocks) != len(hashes) {
		t.Fatalf("lookup on n1 under the flood: %v %v", ov, err)
	}
	engineTook := time.Since(began)

	// Gossip goes on under the flood for thousands more handshakes, and
	// rounds of probes, any of which could suspect a starved node.
	wait.For(t, 180*time.Second, "the flood goes on while the watchers look", func() error {
		refused := n1.Metrics().Transport.ConnsRefused - refusedBefore
		watchMu.Lock()
		defer watchMu.Unlock()
		if refused < 3000 || looks[n1] < 30 || looks[n2] < 30 {
			return fmt.Errorf("%d refused since n2 joined; watchers looked %d and %d times", refused, looks[n1], looks[n2])
		}
		return nil
	})
	stopWatch()
	refusedDuring := n1.Metrics().Transport.ConnsRefused - refusedBefore
	lookedN1, lookedN2 := looks[n1], looks[n2]
	flood.end()
	dials := flood.dials.Load()
	m1, m2 := n1.Metrics(), n2.Metrics()
	t.Logf("flood: %d abandoned handshakes from one source in %v (%.0f/s); n1 refused %d (%d while n2 joined, imported and n1 answered its engine), peak %d in progress, %d asked to validate; import %v, engine calls %v; membership looked at %d and %d times",
		dials, flood.elapsed.Round(time.Millisecond), float64(dials)/flood.elapsed.Seconds(), m1.Transport.ConnsRefused, refusedDuring,
		m1.Transport.HandshakesPeak, m1.Transport.AddressValidations, importTook.Round(time.Millisecond), engineTook.Round(time.Millisecond), lookedN1, lookedN2)
	if m1.Transport.HandshakesPeak > transfer.DefaultMaxHandshakesPerSource+8 {
		t.Errorf("n1 held %d handshakes at once under a one-source flood (bound %d per source)",
			m1.Transport.HandshakesPeak, transfer.DefaultMaxHandshakesPerSource)
	}
	watchMu.Lock()
	if len(notAlive) > 0 {
		t.Errorf("membership under the flood: %d views short of 2 members alive, first: %s", len(notAlive), notAlive[0])
	}
	watchMu.Unlock()
	for _, m := range []fabric.Metrics{m1, m2} {
		if m.MembersFailed != 0 || m.MembersLeft != 0 {
			t.Errorf("%s saw %d members fail and %d leave under the flood", m.Node, m.MembersFailed, m.MembersLeft)
		}
	}
	for name, l := range logs {
		for _, line := range strings.Split(l.String(), "\n") {
			if strings.Contains(line, "Suspect") || strings.Contains(line, "suspect") {
				t.Errorf("%s's log under the flood: %s", name, line)
			}
		}
	}
	if !strings.Contains(logs["n1"].String(), "connection refused: too many handshakes") ||
		!strings.Contains(logs["n1"].String(), "source=127.0.0.200") {
		t.Errorf("n1 did not log the flood it refused from 127.0.0.200")
	}
}
