package membership

import (
	"net/netip"
	"testing"
	"time"
)

// A node killed without a leave and restarted at another address is taken
// back by its peers once its old run is declared dead, not after the dead
// record is reaped: memberlist refuses a live or suspect name's move, and
// without a reclaim time a dead one's too, until it forgets the name.
func TestKilledNodeBackAtNewAddress(t *testing.T) {
	c := newCluster(t, 3, nil)
	waitFor(t, 20*time.Second, "3 nodes see each other", func() bool { return c.allSee(3) })
	victim := c.nodes[2]
	victim.m.shutdown(false) // as SIGKILL: no leave
	killed := time.Now()
	re := c.startNode(2, func(cfg *Config) { cfg.BindAddr = "127.0.0.40" })
	c.nodes[2] = re
	want := re.m.Addr()
	if want == victim.m.Addr() {
		t.Fatalf("restart at the same address %v", want)
	}
	re.m.Publish(EventStore, 1, 77)
	// Dead detection takes SuspicionMult × log10(n) × ProbeInterval (about
	// 3 s here); 25 s is generous on loaded cores and well short of the
	// 30 s memberlist keeps a dead record before it lets the name go.
	took := waitFor(t, 25*time.Second, "peers take node-02 at its new address", func() bool {
		for _, x := range c.nodes[:2] {
			if got, ok := x.m.memberAddr("node-02"); !ok || got != want {
				return false
			}
			if !x.sink.has("node-02", 77) {
				return false
			}
		}
		return true
	})
	t.Logf("killed node back at %v after %v (%v after the kill)", want, took, time.Since(killed))
	for _, x := range c.nodes[:2] {
		if x.m.NumMembers() != 3 {
			t.Errorf("%s sees %d members", x.m.Name(), x.m.NumMembers())
		}
	}
}

func (m *Membership) memberAddr(name string) (netip.AddrPort, bool) {
	for _, mb := range m.Members() {
		if mb.Name == name {
			return mb.Addr, true
		}
	}
	return netip.AddrPort{}, false
}
