package transfer

import (
	"context"
	"errors"
	"testing"
	"time"
)

// callErr dials and makes one call, returning the first error.
func callErr(from, to *Node, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p, err := from.Peer(ctx, to.Addr().String(), name)
	if err != nil {
		return err
	}
	defer p.Close()
	_, err = p.Hello(ctx, nil)
	return err
}

func TestForeignCARefused(t *testing.T) {
	ca, other := newTestCA(t), newTestCA(t)
	members := newMembers("holder", "evil")
	h := newMemHandler()
	holder := newTestNode(t, ca, "holder", members, h)
	// evil trusts the cluster CA but its own certificate is from another.
	evil := newTestNode(t, other, "evil", members, newMemHandler(), func(c *Config) { c.CAs = ca.ca.Pool() })

	if err := callErr(evil, holder, "holder"); err == nil {
		t.Fatal("a node with a certificate from another CA got an answer")
	} else {
		t.Logf("foreign node's call: %v", err)
	}
	if n := h.calls.Load(); n != 0 {
		t.Errorf("the handler served %d calls to a foreign node", n)
	}
	// The other way round: the holder refuses evil's server certificate.
	if err := callErr(holder, evil, "evil"); err == nil {
		t.Fatal("dialing a node with a foreign certificate succeeded")
	}
}

func TestNonMemberRefused(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder")
	h := newMemHandler()
	holder := newTestNode(t, ca, "holder", members, h)
	stranger := newTestNode(t, ca, "stranger", newMembers("holder"), nil)

	if err := callErr(stranger, holder, "holder"); err == nil {
		t.Fatal("a non-member got an answer")
	} else {
		t.Logf("non-member's call: %v", err)
	}
	if n := h.calls.Load(); n != 0 {
		t.Fatalf("the handler served %d calls to a non-member", n)
	}

	// Once it joins it is served; once it leaves, its next call fails.
	members.set("stranger", true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := dialPeer(t, stranger, holder)
	if _, err := p.Hello(ctx, nil); err != nil {
		t.Fatalf("member's hello: %v", err)
	}
	members.set("stranger", false)
	if _, err := p.Hello(ctx, nil); err == nil {
		t.Fatal("a node that left was still served")
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("handler calls = %d, want 1", n)
	}
}

func TestDialChecksName(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("holder", "reader", "other")
	holder := newTestNode(t, ca, "holder", members, newMemHandler())
	reader := newTestNode(t, ca, "reader", members, nil)
	err := callErr(reader, holder, "other")
	if err == nil {
		t.Fatal("dialing holder as \"other\" succeeded")
	}
	if !errors.Is(err, ErrNotMember) {
		t.Errorf("err = %v, want ErrNotMember", err)
	}
}
