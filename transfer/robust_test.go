package transfer

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

func frameBytes(kind byte, m proto.Message) []byte {
	b, _ := proto.Marshal(m)
	out := make([]byte, headerLen, headerLen+len(b))
	out[0] = kind
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

func TestMalformedFramesKeepServing(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.regions[1] = [][]byte{make([]byte, 4096)}
	holder := newTestNode(t, ca, "holder", members, h, func(c *Config) { c.MaxMessageSize = 1 << 16 })
	reader := newTestNode(t, ca, "reader", members, nil)
	p := dialPeer(t, reader, holder)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := p.conn(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}

	oversize := make([]byte, headerLen)
	oversize[0] = byte(methodHello)
	binary.BigEndian.PutUint32(oversize[1:], 1<<16+1)
	truncated := frameBytes(byte(methodLease), &transferpb.LeaseRequest{Hashes: []uint64{1, 2, 3}, DurationMs: 10})
	truncated = truncated[:len(truncated)-3]

	for _, tc := range []struct {
		name string
		send []byte
		want Code
	}{
		{"nothing", nil, CodeInvalidRequest},
		{"half a header", []byte{1, 0}, CodeInvalidRequest},
		{"unknown method", frameBytes(99, &transferpb.HelloRequest{}), CodeInvalidRequest},
		{"hello under another name", frameBytes(byte(methodHello), &transferpb.HelloRequest{Node: "holder", Versions: []uint32{ProtocolVersion}}), CodeInvalidRequest},
		{"hello without a common version", frameBytes(byte(methodHello), &transferpb.HelloRequest{Node: "reader", Versions: []uint32{ProtocolVersion + 1}}), CodeInvalidRequest},
		{"method zero", frameBytes(0, &transferpb.HelloRequest{}), CodeInvalidRequest},
		{"over the size cap", oversize, CodeTooLarge},
		{"truncated payload", truncated, CodeInvalidRequest},
		{"not protobuf", append([]byte{byte(methodLease), 0, 0, 0, 4}, 0xff, 0xff, 0xff, 0xff), CodeInvalidRequest},
		{"read with an empty segment", frameBytes(byte(methodRead), &transferpb.ReadRequest{Segments: []*transferpb.ReadSegment{{Length: 0, Count: 1}}}), CodeInvalidRequest},
		{"read that overflows", frameBytes(byte(methodRead), &transferpb.ReadRequest{Segments: []*transferpb.ReadSegment{{SrcOffset: ^uint64(0) - 2, Length: 8, Count: 1}}}), CodeInvalidRequest},
		{"read past the region", frameBytes(byte(methodRead), &transferpb.ReadRequest{BlockSet: 1, Segments: []*transferpb.ReadSegment{{SrcOffset: 4090, Length: 8, Count: 1}}}), CodeInvalidRequest},
		{"read of a huge rank", frameBytes(byte(methodRead), &transferpb.ReadRequest{Segments: []*transferpb.ReadSegment{{SrcRank: 1 << 20, Length: 8, Count: 1}}}), CodeInvalidRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := conn.OpenStreamSync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_ = s.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := s.Write(tc.send); err != nil {
				t.Fatal(err)
			}
			s.Close()
			kind, payload, err := readFrame(s, 1<<16)
			if err != nil {
				t.Fatalf("no error frame: %v", err)
			}
			var e transferpb.Error
			if kind != statusError || proto.Unmarshal(payload, &e) != nil {
				t.Fatalf("status %d, payload %q; want an Error frame", kind, payload)
			}
			if Code(e.Code) != tc.want || e.Message == "" {
				t.Errorf("error = code %d %q, want code %d with a message", e.Code, e.Message, tc.want)
			}
			t.Logf("holder said: %s", e.Message)
			if _, err := io.ReadAll(s); err != nil {
				t.Errorf("stream not closed cleanly after the error: %v", err)
			}
		})
	}
	if st := holder.Metrics(); st.CallsFailed != 13 || st.CallsServed != 0 {
		t.Errorf("holder stats = %+v, want 13 failed calls and none served", st)
	}
	// Same connection, still serving.
	if conn.Context().Err() != nil {
		t.Fatal("the holder closed the connection")
	}
	if _, err := p.Hello(ctx, nil); err != nil {
		t.Fatalf("hello after malformed frames: %v", err)
	}
	if c2, _ := p.conn(ctx, 0); c2 != conn {
		t.Error("the connection was replaced")
	}
}

func TestStalledHandlerFailsCallInTime(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.stall = make(chan struct{})
	const size = 16 << 20 // several parts, so several stalled streams
	h.regions[1] = [][]byte{make([]byte, size)}
	leaseAll(h, 1, 1, size)
	holder := newTestNode(t, ca, "holder", members, h)
	t.Cleanup(func() { close(h.stall) }) // runs before the nodes close
	reader := newTestNode(t, ca, "reader", members, nil, func(c *Config) {
		c.CallTimeout = 300 * time.Millisecond
		c.ProgressTimeout = 300 * time.Millisecond
	})
	p := dialPeer(t, reader, holder)

	start := time.Now()
	_, err := p.Lease(context.Background(), []uint64{1}, time.Second)
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("lease: err = %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("lease failed after %v, bound is 5 s", d)
	}

	// A context deadline shorter than CallTimeout wins.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := p.Lease(ctx, []uint64{1}, time.Second); !errors.Is(err, ErrTimeout) {
		t.Errorf("lease with a context deadline: err = %v, want ErrTimeout", err)
	}

	plan := []layout.Segment{{Length: size, Count: 1}}
	start = time.Now()
	err = p.Read(context.Background(), 1, 1, plan, [][]byte{make([]byte, size)})
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("read: err = %v, want ErrTimeout", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("read failed after %v, bound is 5 s", d)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := p.Read(ctx, 1, 1, plan, [][]byte{make([]byte, size)}); !errors.Is(err, ErrTimeout) {
		t.Errorf("read with a context deadline: err = %v, want ErrTimeout", err)
	}
}

// udpProxy forwards datagrams between clients and a server until told to
// drop everything, which looks to both ends like a peer that stopped
// answering.
type udpProxy struct {
	ln        *net.UDPConn
	server    *net.UDPAddr
	forwarded atomic.Int64 // server to client bytes
	blackhole atomic.Bool
	dropAfter int64
	mu        sync.Mutex
	ups       map[string]*net.UDPConn
	wg        sync.WaitGroup
}

func newUDPProxy(t *testing.T, server net.Addr, dropAfter int64) *udpProxy {
	ln, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetReadBuffer(4 << 20)
	ln.SetWriteBuffer(4 << 20)
	p := &udpProxy{ln: ln, server: server.(*net.UDPAddr), ups: map[string]*net.UDPConn{}, dropAfter: dropAfter}
	p.wg.Add(1)
	go p.loop()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, u := range p.ups {
			u.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *udpProxy) loop() {
	defer p.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, from, err := p.ln.ReadFromUDP(buf)
		if err != nil {
			return
		}
		if p.blackhole.Load() {
			continue
		}
		p.mu.Lock()
		up, ok := p.ups[from.String()]
		if !ok {
			up, err = net.DialUDP("udp", nil, p.server)
			if err != nil {
				p.mu.Unlock()
				continue
			}
			up.SetReadBuffer(4 << 20)
			up.SetWriteBuffer(4 << 20)
			p.ups[from.String()] = up
			p.wg.Add(1)
			go p.back(up, from)
		}
		p.mu.Unlock()
		up.Write(buf[:n])
	}
}

func (p *udpProxy) back(up *net.UDPConn, client *net.UDPAddr) {
	defer p.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, err := up.Read(buf)
		if err != nil {
			return
		}
		if p.blackhole.Load() {
			continue
		}
		if p.forwarded.Add(int64(n)) > p.dropAfter {
			p.blackhole.Store(true)
		}
		p.ln.WriteToUDP(buf[:n], client)
	}
}

func TestHolderGoesSilentMidRead(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	const size = 32 << 20
	h.regions[1] = [][]byte{make([]byte, size)}
	leaseAll(h, 1, 1, size)
	holder := newTestNode(t, ca, "holder", members, h)
	proxy := newUDPProxy(t, holder.Addr(), 1<<20)
	reader := newTestNode(t, ca, "reader", members, nil, func(c *Config) {
		c.ListenAddr = "127.0.0.1:0"
		// Above QUIC's loss recovery on a loaded machine, far below the
		// idle timeout, so that it is the bound that trips.
		c.ProgressTimeout = 1500 * time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := reader.Peer(ctx, proxy.ln.LocalAddr().String(), "holder")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	start := time.Now()
	err = p.Read(context.Background(), 1, 1, []layout.Segment{{Length: size, Count: 1}}, [][]byte{make([]byte, size)})
	elapsed := time.Since(start)
	if !proxy.blackhole.Load() {
		t.Fatalf("the read finished before the proxy went silent (err %v)", err)
	}
	if !errors.Is(err, ErrTimeout) {
		t.Errorf("err = %v, want ErrTimeout", err)
	}
	// Bound: ProgressTimeout plus generous slack for a loaded machine.
	if elapsed > 8*time.Second {
		t.Errorf("read failed after %v, bound is 8 s", elapsed)
	}
	t.Logf("read failed after %v: %v", elapsed, err)
}

func TestClosedHolderFailsFast(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	holder := newTestNode(t, ca, "holder", members, newMemHandler())
	reader := newTestNode(t, ca, "reader", members, nil)
	p := dialPeer(t, reader, holder)
	holder.Close()
	start := time.Now()
	if _, err := p.Hello(context.Background(), nil); err == nil {
		t.Fatal("hello to a closed holder succeeded")
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("hello to a closed holder failed after %v", d)
	}
	reader.Close()
	if _, err := p.Hello(context.Background(), nil); !errors.Is(err, ErrClosed) {
		t.Errorf("hello from a closed node: err = %v, want ErrClosed", err)
	}
}

func TestIPv6Loopback(t *testing.T) {
	probe, err := net.ListenUDP("udp6", &net.UDPAddr{IP: net.IPv6loopback})
	if err != nil {
		t.Skipf("no IPv6 loopback on this machine: %v", err)
	}
	probe.Close()
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.regions[1] = [][]byte{make([]byte, 1<<20)}
	fill(h.regions[1][0], 5)
	leaseAll(h, 1, 1, 1<<20)
	v6 := func(c *Config) { c.ListenAddr = "[::1]:0" }
	holder := newTestNode(t, ca, "holder", members, h, v6)
	reader := newTestNode(t, ca, "reader", members, nil, v6)
	p := dialPeer(t, reader, holder)
	dst := [][]byte{make([]byte, 1<<20)}
	if err := p.Read(context.Background(), 1, 1, []layout.Segment{{Length: 1 << 20, Count: 1}}, dst); err != nil {
		t.Fatal(err)
	}
	if firstDiff(dst[0], h.regions[1][0]) >= 0 {
		t.Error("IPv6 read returned wrong bytes")
	}
}

func TestDialOnlyNode(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "client")
	holder := newTestNode(t, ca, "holder", members, newMemHandler())
	client := newTestNode(t, ca, "client", members, nil, func(c *Config) { c.ListenAddr = "" })
	if client.Addr() != nil {
		t.Fatal("dial-only node listens")
	}
	p := dialPeer(t, client, holder)
	if info, err := p.Hello(context.Background(), nil); err != nil || info.Node != "holder" {
		t.Fatalf("hello from a dial-only node = %+v, %v", info, err)
	}
}

// TestStreamsRetire makes many more calls than the holder allows streams
// at once, successes and failures of every kind: the holder must finish
// each call's stream on every path (a refusal that forgot to close it
// fails this test), or later calls wait for stream credit and time out.
func TestStreamsRetire(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.regions[1] = [][]byte{make([]byte, 1<<20)}
	leaseAll(h, 1, 1, 64<<10)
	holder := newTestNode(t, ca, "holder", members, h, func(c *Config) { c.MaxStreamsPerConn = 4 })
	reader := newTestNode(t, ca, "reader", members, nil, func(c *Config) {
		c.ConnsPerPeer, c.StreamsPerConn, c.CallTimeout = 1, 1, 2*time.Second
	})
	p := dialPeer(t, reader, holder)
	ctx := context.Background()
	dst := [][]byte{make([]byte, 1<<20)}
	for i := range 40 {
		if _, err := p.Hello(ctx, nil); err != nil {
			t.Fatalf("call %d: hello: %v", i, err)
		}
		if _, err := p.Release(ctx, 0); !errors.Is(err, ErrNotFound) {
			t.Fatalf("call %d: release: %v", i, err)
		}
		if err := p.Read(ctx, 1, 1, []layout.Segment{{Length: 64 << 10, Count: 1}}, dst); err != nil {
			t.Fatalf("call %d: read: %v", i, err)
		}
		if err := p.Read(ctx, 1, 1, []layout.Segment{{Length: 1 << 20, Count: 1}}, dst); !errors.Is(err, ErrLeaseRefused) {
			t.Fatalf("call %d: refused read: %v", i, err)
		}
	}
}

// A control call that times out on CallTimeout drops its connection, so
// that the next call dials afresh (one that runs out of its caller's
// deadline does not): a holder killed and restarted at the same address
// never answers on the old connections, which would otherwise stall
// every call until the idle timeout.
func TestTimedOutCallDropsItsConnection(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader")
	h := newMemHandler()
	h.stall = make(chan struct{}) // leases wait until it is closed
	holder := newTestNode(t, ca, "holder", members, h)
	reader := newTestNode(t, ca, "reader", members, nil, func(c *Config) {
		c.ConnsPerPeer, c.CallTimeout = 1, 300*time.Millisecond
	})
	p := dialPeer(t, reader, holder)
	conn := func() *quic.Conn {
		p.slots[0].mu.Lock()
		defer p.slots[0].mu.Unlock()
		return p.slots[0].c
	}
	first := conn()
	ctx := context.Background()
	// A caller whose own deadline passes first drops nothing: the
	// connection is shared, and the caller's hurry says nothing of it.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := p.Lease(short, []uint64{2}, time.Second); !errors.Is(err, ErrTimeout) {
		t.Fatalf("lease under a 50 ms deadline from a silent holder: %v, want ErrTimeout", err)
	}
	if first.Context().Err() != nil || conn() != first {
		t.Fatal("a call that ran out of its caller's deadline dropped the shared connection")
	}
	if _, err := p.Lease(ctx, []uint64{2}, time.Second); !errors.Is(err, ErrTimeout) {
		t.Fatalf("lease from a silent holder: %v, want ErrTimeout", err)
	}
	close(h.stall)
	if first.Context().Err() == nil {
		t.Fatal("the connection of the timed-out call is still open")
	}
	if _, err := p.Lease(ctx, []uint64{2}, time.Second); err != nil {
		t.Fatalf("lease after the timeout: %v", err)
	}
	if c := conn(); c == nil || c == first {
		t.Fatal("the call after the timeout did not dial a new connection")
	}
}
