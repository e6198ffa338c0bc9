package sim

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrUnreachable is returned when a stream is dialled to a node that is
// gone or on the far side of a partition.
var ErrUnreachable = errors.New("sim: node unreachable")

// Net is an in-memory network for memberlist: packets are delivered
// through buffered channels (dropped when the receiver's is full, as a
// socket buffer would), streams are in-memory pipes. It counts every
// node's bytes in and out, and can cut the network in two.
//
// Each endpoint has an IPv4 address of its own (10.0.0.1 onwards) and the
// agents' gossip port (GossipPort), as agents do: memberlist's messages
// carry addresses and ports (pings, and every member's in each push/pull),
// so that they are as long here as between agents.
type Net struct {
	mu    sync.RWMutex
	byKey map[string]*Transport // "10.a.b.c:7946"
	next  uint32
	// side, when set, says which side of a partition each node is on;
	// packets and new streams between sides are dropped.
	side map[string]int
}

// GossipPort is every endpoint's port: the agents' gossip port.
const GossipPort = 7946

// maxEndpoints is how many endpoints a network can address in 10.0.0.0/8.
const maxEndpoints = 1<<24 - 2

// NewNet returns an empty network.
func NewNet() *Net { return &Net{byKey: make(map[string]*Transport), next: 1} }

// Transport is one node's endpoint, a memberlist.Transport.
type Transport struct {
	net      *Net
	name     string
	addr     string
	ip       net.IP
	packets  chan *memberlist.Packet
	streams  chan net.Conn
	closed   atomic.Bool
	bytesIn  atomic.Int64
	bytesOut atomic.Int64
	dropped  atomic.Int64 // packets lost to a full receive buffer
}

// packetBuffer is how many packets wait for a node's memberlist: about a
// socket buffer's worth of gossip packets.
const packetBuffer = 4096

// NewTransport returns a new endpoint named name on the network, at the
// next free address; it fails past maxEndpoints.
func (n *Net) NewTransport(name string) (*Transport, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.next > maxEndpoints {
		return nil, fmt.Errorf("sim: no address left in 10.0.0.0/8 for %s", name)
	}
	ip := net.IPv4(10, byte(n.next>>16), byte(n.next>>8), byte(n.next))
	n.next++
	t := &Transport{
		net:     n,
		name:    name,
		ip:      ip,
		addr:    net.JoinHostPort(ip.String(), strconv.Itoa(GossipPort)),
		packets: make(chan *memberlist.Packet, packetBuffer),
		streams: make(chan net.Conn, 64),
	}
	n.byKey[t.addr] = t
	return t, nil
}

// Addr is the endpoint's address, for seeds.
func (t *Transport) Addr() string { return t.addr }

// Bytes returns the bytes received and sent so far.
func (t *Transport) Bytes() (in, out int64) { return t.bytesIn.Load(), t.bytesOut.Load() }

// Partition cuts the network between the nodes named in a and the rest.
func (n *Net) Partition(a []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.side = make(map[string]int, len(a))
	for _, name := range a {
		n.side[name] = 1
	}
}

// Heal removes the partition.
func (n *Net) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.side = nil
}

// peer returns the live endpoint at addr reachable from t, or nil.
func (t *Transport) peer(addr string) *Transport {
	n := t.net
	n.mu.RLock()
	defer n.mu.RUnlock()
	d := n.byKey[addr]
	if d == nil || d.closed.Load() {
		return nil
	}
	if n.side != nil && n.side[t.name] != n.side[d.name] {
		return nil
	}
	return d
}

// FinalAdvertiseAddr implements memberlist.Transport.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	return t.ip, GossipPort, nil
}

// WriteTo implements memberlist.Transport: the packet goes to addr's
// buffer, or is lost as a datagram would be.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	now := time.Now()
	if t.closed.Load() {
		return now, nil
	}
	t.bytesOut.Add(int64(len(b)))
	d := t.peer(addr)
	if d == nil {
		return now, nil
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: &net.UDPAddr{IP: t.ip, Port: GossipPort}, Timestamp: now}
	select {
	case d.packets <- p:
		d.bytesIn.Add(int64(len(b)))
	default:
		d.dropped.Add(1)
	}
	return now, nil
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

// DialTimeout implements memberlist.Transport with an in-memory pipe whose
// bytes both ends count.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	d := t.peer(addr)
	if d == nil || t.closed.Load() {
		return nil, fmt.Errorf("%w: %s", ErrUnreachable, addr)
	}
	a, b := net.Pipe()
	ours := &countedConn{Conn: a, in: &t.bytesIn, out: &t.bytesOut}
	theirs := &countedConn{Conn: b, in: &d.bytesIn, out: &d.bytesOut}
	select {
	case d.streams <- theirs:
		return ours, nil
	case <-time.After(timeout):
		a.Close()
		b.Close()
		return nil, fmt.Errorf("%w: %s: accept timed out", ErrUnreachable, addr)
	}
}

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown implements memberlist.Transport: the endpoint stops sending
// and receiving. Its channels stay open (senders never block on them).
func (t *Transport) Shutdown() error {
	t.closed.Store(true)
	return nil
}

type countedConn struct {
	net.Conn
	in, out *atomic.Int64
}

func (c *countedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c *countedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}
