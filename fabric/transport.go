package fabric

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"path/filepath"
	"time"

	"github.com/kvfabric/kvfabric/transfer"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

// startTransport starts the QUIC peer transport with the node's TLS
// identity: the configured files, or a development CA shared through the
// data dir's parent with --dev.
func (a *Agent) startTransport() error {
	cert, cas, err := a.tlsIdentity()
	if err != nil {
		return err
	}
	tcfg := transfer.DefaultConfig()
	if a.cfg.Local {
		tcfg = transfer.DefaultLocalConfig()
	}
	tcfg.NodeName = a.cfg.NodeName
	tcfg.ListenAddr = a.cfg.PeerAddr
	tcfg.Certificate = cert
	tcfg.CAs = cas
	tcfg.Members = transfer.MemberFunc(a.isMember)
	tcfg.Handler = a.service
	tcfg.PeerGone = func(peer string) { a.service.peerGone(peer, "its connections closed") }
	tcfg.Logger = a.log
	// An import fails over from a silent holder within PeerTimeout: any
	// call to it (dial, control call, read) gives up after half of it,
	// leaving the other half to start on the next holder.
	half := a.cfg.PeerTimeout / 2
	tcfg.HandshakeTimeout = half
	tcfg.CallTimeout = half
	tcfg.ProgressTimeout = half
	tcfg.IdleTimeout = 3 * a.cfg.PeerTimeout
	tcfg.MaxMessageSize = a.cfg.maxMessageSize
	n, err := transfer.NewNode(tcfg)
	if err != nil {
		return fmt.Errorf("fabric: peer transport: %w", err)
	}
	a.transport = n
	return nil
}

func (a *Agent) tlsIdentity() (tls.Certificate, *x509.CertPool, error) {
	c := &a.cfg
	if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
		pair, err := certs.LoadPair(c.CertFile, c.KeyFile)
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("fabric: node certificate: %w", err)
		}
		cert, err := pair.TLSCertificate()
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("fabric: node certificate: %w", err)
		}
		cas, err := certs.LoadPool(c.CAFile)
		if err != nil {
			return tls.Certificate{}, nil, fmt.Errorf("fabric: cluster CA: %w", err)
		}
		return cert, cas, nil
	}
	dir := c.DevCADir
	ca, created, err := certs.EnsureDevCA(dir)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("fabric: development CA in %s: %w", dir, err)
	}
	a.log.Warn("DEVELOPMENT MODE: peers are authenticated by a development CA that anyone on this machine can read; "+
		"use kvfabric certs and --ca/--cert/--key on a real cluster", "dev_ca", dir, "created", created)
	pair, err := ca.IssueNode(c.NodeName, 7*24*time.Hour)
	if err != nil {
		return tls.Certificate{}, nil, fmt.Errorf("fabric: development certificate: %w", err)
	}
	cert, err := pair.TLSCertificate()
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return cert, ca.Pool(), nil
}

// devCADir is where --dev keeps the CA shared by the agents of one
// machine.
func devCADir(dataDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), "kvfabric-dev-ca")
}
