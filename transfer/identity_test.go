package transfer

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// servedSerial dials n as peer name would and returns the serial number of
// the certificate n presents.
func servedSerial(t *testing.T, from, n *Node, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := quic.DialAddr(ctx, n.Addr().String(), from.clientTLS(name), from.qcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseWithError(0, "")
	return c.ConnectionState().TLS.PeerCertificates[0].SerialNumber.String()
}

// A new identity is presented on the connections made after SetIdentity;
// a certificate for another node is refused and the old one kept.
func TestSetIdentity(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("a", "b")
	first := ca.cert(t, "a")
	a := newTestNode(t, ca, "a", members, newMemHandler(), func(c *Config) { c.Certificate = first })
	b := newTestNode(t, ca, "b", members, nil)
	if got, want := servedSerial(t, b, a, "a"), first.Leaf.SerialNumber.String(); got != want {
		t.Fatalf("serves serial %s, want the first certificate's %s", got, want)
	}
	renewed := ca.cert(t, "a")
	if err := a.SetIdentity(renewed, ca.ca.Pool()); err != nil {
		t.Fatal(err)
	}
	if got, want := servedSerial(t, b, a, "a"), renewed.Leaf.SerialNumber.String(); got != want {
		t.Fatalf("after SetIdentity serves serial %s, want the renewed certificate's %s", got, want)
	}
	if err := a.SetIdentity(ca.cert(t, "b"), ca.ca.Pool()); !errors.Is(err, ErrConfig) {
		t.Fatalf("a certificate naming b for node a: err = %v, want ErrConfig", err)
	}
	if got, want := servedSerial(t, b, a, "a"), renewed.Leaf.SerialNumber.String(); got != want {
		t.Fatalf("after a refused identity serves %s, want the renewed certificate's %s still", got, want)
	}
	// A peer under a new CA is trusted once the CAs are replaced.
	other := newTestCA(t)
	c := newTestNode(t, other, "b", members, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := quic.DialAddr(ctx, a.Addr().String(), c.clientTLS("a"), c.qcfg); err == nil {
		t.Fatal("a peer certified by another CA was let in")
	}
	if err := a.SetIdentity(other.cert(t, "a"), other.ca.Pool()); err != nil {
		t.Fatal(err)
	}
	servedSerial(t, c, a, "a") // fails the test if the handshake does
}
