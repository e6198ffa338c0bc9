package transfer

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
)

// PeerGone is told when a peer's last connection closes, once, and not
// while the peer still has a connection open.
func TestPeerGone(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("a", "b", "c")
	var mu sync.Mutex
	var gone []string
	a := newTestNode(t, ca, "a", members, newMemHandler(), func(c *Config) {
		c.PeerGone = func(peer string) {
			mu.Lock()
			gone = append(gone, peer)
			mu.Unlock()
		}
	})
	b := newTestNode(t, ca, "b", members, nil)
	c := newTestNode(t, ca, "c", members, nil)
	ctx := context.Background()
	p1 := dialPeer(t, b, a)
	p2 := dialPeer(t, b, a)
	p3 := dialPeer(t, c, a)
	for _, p := range []*Peer{p1, p2, p3} {
		if _, err := p.Hello(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	goneList := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), gone...)
	}
	p1.Close()
	// p2's connections are still open: b is not gone. c's go after p1's;
	// once a has told of c, it has seen p1's close too.
	p3.Close()
	wait.For(t, 10*time.Second, "a is told that c is gone", func() error {
		if g := goneList(); len(g) == 0 {
			return fmt.Errorf("no PeerGone yet")
		}
		return nil
	})
	if _, err := p2.Hello(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if g := goneList(); len(g) != 1 || g[0] != "c" {
		t.Fatalf("PeerGone calls %v after c closed and b kept one connection, want [c]", g)
	}
	p2.Close()
	wait.For(t, 10*time.Second, "a is told that b is gone", func() error {
		if g := goneList(); len(g) != 2 || g[1] != "b" {
			return fmt.Errorf("PeerGone calls: %v", g)
		}
		return nil
	})
}
