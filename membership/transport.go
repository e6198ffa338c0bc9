package membership

import (
	"fmt"
	"log"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// countingTransport is memberlist's UDP and TCP transport, counting the
// bytes it carries: what gossip costs on the wire, apart from anything
// else the node sends (the peer transport's connections). Packets count
// their payload (memberlist's message, encrypted and labelled as sent),
// streams every byte read and written.
type countingTransport struct {
	nt      *memberlist.NetTransport
	packets chan *memberlist.Packet
	streams chan net.Conn
	in, out atomic.Uint64
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
}

var _ memberlist.NodeAwareTransport = (*countingTransport)(nil)

// newCountingTransport listens on addr:port as memberlist would (port 0:
// a free port, tried up to 10 times, for TCP and UDP alike), and returns
// the transport and the port it bound.
func newCountingTransport(addr string, port int, logger *log.Logger) (*countingTransport, int, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{addr}, BindPort: port, Logger: logger}
	tries := 1
	if port == 0 {
		tries = 10 // TCP picks the port, and UDP may find it taken
	}
	var nt *memberlist.NetTransport
	var err error
	for range tries {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	if err != nil {
		return nil, 0, fmt.Errorf("gossip transport: %w", err)
	}
	if port == 0 {
		port = nt.GetAutoBindPort()
	}
	t := &countingTransport{nt: nt, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), stop: make(chan struct{})}
	t.wg.Add(2)
	go t.forwardPackets()
	go t.forwardStreams()
	return t, port, nil
}

func (t *countingTransport) forwardPackets() {
	defer t.wg.Done()
	for {
		select {
		case p := <-t.nt.PacketCh():
			t.in.Add(uint64(len(p.Buf)))
			select {
			case t.packets <- p:
			case <-t.stop:
				return
			}
		case <-t.stop:
			return
		}
	}
}

func (t *countingTransport) forwardStreams() {
	defer t.wg.Done()
	for {
		select {
		case c := <-t.nt.StreamCh():
			select {
			case t.streams <- &countingConn{Conn: c, t: t}:
			case <-t.stop:
				c.Close()
				return
			}
		case <-t.stop:
			return
		}
	}
}

// bytes returns the bytes received and sent so far.
func (t *countingTransport) bytes() (in, out uint64) { return t.in.Load(), t.out.Load() }

func (t *countingTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.nt.FinalAdvertiseAddr(ip, port)
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	at, err := t.nt.WriteToAddress(b, a)
	if err == nil {
		t.out.Add(uint64(len(b)))
	}
	return at, err
}

func (t *countingTransport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *countingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *countingTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	c, err := t.nt.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, t: t}, nil
}

func (t *countingTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown stops the listeners and the forwarding; safe to call twice.
func (t *countingTransport) Shutdown() error {
	var err error
	t.once.Do(func() {
		close(t.stop)
		t.wg.Wait()
		// The listeners hand on what they read before they stop: take it
		// until they have.
		done := make(chan struct{})
		go func() {
			defer close(done)
			err = t.nt.Shutdown()
		}()
		for {
			select {
			case <-t.nt.PacketCh():
			case c := <-t.nt.StreamCh():
				c.Close()
			case <-done:
				return
			}
		}
	})
	return err
}

// countingConn counts a stream's bytes into its transport.
type countingConn struct {
	net.Conn
	t *countingTransport
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.t.in.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.t.out.Add(uint64(n))
	return n, err
}
