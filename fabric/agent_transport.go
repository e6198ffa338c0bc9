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
	cert, cas, checked, err := a.tlsIdentity()
	if err != nil {
		return err
	}
	a.useIdentity(checked)
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
	// The transport names the node in its records itself.
	tcfg.Logger = a.baseLog
	// An import fails over from a silent holder within PeerTimeout: any
	// call to it (dial, control call, read) gives up after half of it,
	// leaving the other half to start on the next holder.
	half := a.cfg.PeerTimeout / 2
	tcfg.HandshakeTimeout = half
	tcfg.CallTimeout = half
	tcfg.ProgressTimeout = half
	tcfg.IdleTimeout = 3 * a.cfg.PeerTimeout
	tcfg.MaxMessageSize = a.cfg.maxMessageSize
	tcfg.LaneAddr, tcfg.LanePlain, tcfg.LaneConns = a.cfg.LaneAddr, a.cfg.LanePlain, a.cfg.LaneConns
	tcfg.LaneMaxPending, tcfg.LaneMaxPendingPerSource = a.cfg.LaneMaxPending, a.cfg.LaneMaxPendingPerSource
	tcfg.LaneHelloTimeout = a.cfg.LaneHelloTimeout
	if tcfg.RDMA, err = a.openRDMA(); err != nil {
		return err
	}
	n, err := transfer.NewNode(tcfg)
	if err != nil {
		return fmt.Errorf("fabric: peer transport: %w", err)
	}
	a.transport = n
	return nil
}

// tlsIdentity loads the node's certificate, key and cluster CA, and checks
// them as peers will: a node whose certificate another CA issued, or that
// names another node, would show as alive and fail every call, so it does
// not start. Errors name the file, the subjects and the node.
func (a *Agent) tlsIdentity() (tls.Certificate, *x509.CertPool, *certs.Checked, error) {
	c := &a.cfg
	if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
		for _, f := range []struct{ key, path string }{{"ca_file", c.CAFile}, {"cert_file", c.CertFile}, {"key_file", c.KeyFile}} {
			if f.path == "" {
				return tls.Certificate{}, nil, nil, badSetting(f.key, "missing: the CA, certificate and key files go together")
			}
		}
		cert, pool, checked, err := certs.LoadNode(c.CAFile, c.CertFile, c.KeyFile, c.NodeName, time.Now())
		if err != nil {
			// The error names the file at fault.
			return tls.Certificate{}, nil, nil, badSettingErr(tlsFileKeys, err, "TLS identity of node %s: %v", c.NodeName, err)
		}
		return cert, pool, checked, nil
	}
	dir := c.DevCADir
	ca, created, err := certs.EnsureDevCA(dir)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("fabric: development CA in %s: %w", dir, err)
	}
	a.log.Warn("DEVELOPMENT MODE: peers are authenticated by a development CA that anyone on this machine can read; "+
		"use kvfabric certs and --ca/--cert/--key on a real cluster", "dev_ca", dir, "created", created)
	pair, err := ca.IssueNode(c.NodeName, 7*24*time.Hour)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("fabric: development certificate: %w", err)
	}
	cert, err := pair.TLSCertificate()
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	checked, err := certs.VerifyNode(cert, []*x509.Certificate{ca.Cert}, c.NodeName, time.Now())
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("fabric: development CA in %s (remove the folder to make a new one): %w", dir, err)
	}
	return cert, ca.Pool(), checked, nil
}

// useIdentity keeps the node's checked certificate and CA for its metrics,
// and logs when they expire, as a warning once less than a fifth of the
// certificate's validity (or 30 days) is left.
func (a *Agent) useIdentity(c *certs.Checked) {
	a.identity.Store(c)
	left := time.Until(c.Leaf.NotAfter)
	attrs := []any{"cert_expires", c.Leaf.NotAfter.UTC().Format(time.RFC3339), "cert_left", left.Round(time.Hour),
		"ca", c.CA.Subject.String(), "ca_expires", c.CA.NotAfter.UTC().Format(time.RFC3339)}
	if left < min(30*24*time.Hour, c.Leaf.NotAfter.Sub(c.Leaf.NotBefore)/5) {
		a.log.Warn("node certificate expires soon: renew it with kvfabric certs node", attrs...)
		return
	}
	a.log.Info("node certificate", attrs...)
}

// devCADir is where --dev keeps the CA shared by the agents of one
// machine.
func devCADir(dataDir string) string {
	return filepath.Join(filepath.Dir(filepath.Clean(dataDir)), "kvfabric-dev-ca")
}

// laneStatus describes the TCP lane the node serves, loudly when it is
// plain TCP, and counts the reads that went over QUIC instead of a lane.
func (a *Agent) laneStatus() (string, map[string]uint64) {
	m := a.transport.Metrics()
	addr := a.transport.LaneAddr()
	switch {
	case addr == nil:
		return "off", m.LaneFallbacks
	case a.transport.LanePlain():
		return "PLAIN TCP " + addr.String() + " (unencrypted)", m.LaneFallbacks
	}
	return "tls " + addr.String(), m.LaneFallbacks
}
