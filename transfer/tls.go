package transfer

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/kvfabric/kvfabric/transfer/certs"
)

// verifyPeer checks a peer's chain against the CA, and its node name:
// against want when dialing, against Members always.
func verifyPeer(cs tls.ConnectionState, cas *x509.CertPool, usage x509.ExtKeyUsage, want string, members Members) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("transfer: peer presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: cas, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("transfer: peer certificate: %w", err)
	}
	name, err := certs.NodeName(leaf)
	if err != nil {
		return fmt.Errorf("transfer: peer certificate: %w", err)
	}
	if want != "" && name != want {
		return fmt.Errorf("%w: dialed %q, certificate names %q", ErrNotMember, want, name)
	}
	if !members.IsMember(name) {
		return fmt.Errorf("%w: %q", ErrNotMember, name)
	}
	return nil
}

// identity is the node's certificate and the CAs it trusts. A dialed
// connection reads it once; an accepted one reads the certificate and the
// CAs at two moments of its handshake, so a swap in between may give it
// the old certificate and the new CAs (or the reverse), which a rotation
// that keeps both CAs trusted meanwhile makes harmless.
type identity struct {
	cert tls.Certificate
	cas  *x509.CertPool
}

// SetIdentity replaces the node's certificate and the CAs it verifies peers
// against, for connections made from now on (live ones keep theirs). The
// certificate must name the node, as at start.
func (n *Node) SetIdentity(cert tls.Certificate, cas *x509.CertPool) error {
	if cas == nil {
		return configErr("CAs is nil")
	}
	if err := checkCertificate(cert, n.cfg.NodeName); err != nil {
		return err
	}
	n.ident.Store(&identity{cert: cert, cas: cas})
	return nil
}

// serverTLS asks every client for a certificate and verifies it ourselves
// (the stdlib's check has no hook for membership). The certificate and CAs
// are read at each handshake, so that SetIdentity takes effect.
func (n *Node) serverTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return &n.ident.Load().cert, nil
		},
		NextProtos: []string{ALPN},
		ClientAuth: tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			err := verifyPeer(cs, n.ident.Load().cas, x509.ExtKeyUsageClientAuth, "", n.cfg.Members)
			if err != nil {
				// The peer only learns "bad certificate"; the reason is
				// for our operator.
				claimed := ""
				if len(cs.PeerCertificates) > 0 {
					claimed = cs.PeerCertificates[0].Subject.CommonName
				}
				n.log.Info("transfer: refused a connection", "claimed_peer", claimed, "err", err)
			}
			return err
		},
	}
}

// clientTLS verifies the holder's chain and that it is the node named.
// InsecureSkipVerify only turns off the stdlib's hostname check, which
// would need node names to be resolvable; VerifyConnection does the whole
// check instead, and runs regardless.
func (n *Node) clientTLS(peerName string) *tls.Config {
	id := n.ident.Load()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &id.cert, nil
		},
		NextProtos:         []string{ALPN},
		ServerName:         peerName,
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs, id.cas, x509.ExtKeyUsageServerAuth, peerName, n.cfg.Members)
		},
	}
}
