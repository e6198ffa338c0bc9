package sim

import (
	"context"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/membership"
)

// Each endpoint has an address of its own at the gossip port, up to the
// last of 10.0.0.0/8; one more is refused.
func TestNetAddresses(t *testing.T) {
	n := NewNet()
	for _, want := range []string{"10.0.0.1:7946", "10.0.0.2:7946"} {
		tr, err := n.NewTransport(want)
		if err != nil {
			t.Fatalf("endpoint %s: %v", want, err)
		}
		if tr.Addr() != want {
			t.Fatalf("endpoint at %q, want %s", tr.Addr(), want)
		}
	}
	n.next = maxEndpoints
	if tr, err := n.NewTransport("last"); err != nil || tr.Addr() != "10.255.255.254:7946" {
		t.Fatalf("the last endpoint: %v", err)
	}
	if _, err := n.NewTransport("one past"); err == nil {
		t.Fatal("an endpoint past 10.255.255.254 was made")
	}
}

// Every node tells the others the metadata an agent would: its peer
// address beside its gossip address.
func TestNodesCarryAgentMeta(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Start(ctx, Config{Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitConverged(t, c, "start", 20*time.Second)
	for _, name := range c.Live() {
		for _, m := range c.Node(name).M.Members() {
			other := c.Node(m.Name)
			if want := other.tr.ip.String() + ":7947"; m.Meta.PeerAddr != want || m.Meta.Transports != membership.TransportQUIC {
				t.Fatalf("%s sees %s's metadata %+v, want peer address %s and QUIC", name, m.Name, m.Meta, want)
			}
		}
	}
}
