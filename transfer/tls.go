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

// serverTLS asks every client for a certificate and verifies it ourselves
// (the stdlib's check has no hook for membership).
func (n *Node) serverTLS() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{n.cfg.Certificate},
		NextProtos:   []string{ALPN},
		ClientAuth:   tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			err := verifyPeer(cs, n.cfg.CAs, x509.ExtKeyUsageClientAuth, "", n.cfg.Members)
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
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{n.cfg.Certificate},
		NextProtos:         []string{ALPN},
		ServerName:         peerName,
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return verifyPeer(cs, n.cfg.CAs, x509.ExtKeyUsageServerAuth, peerName, n.cfg.Members)
		},
	}
}
