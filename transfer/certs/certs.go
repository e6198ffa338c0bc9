// Package certs makes and loads the certificates of a kvfabric cluster: one
// cluster CA, and one certificate per node whose subject common name and DNS
// subject alternative name are the node's name. Peers authenticate each
// other with these over mutual TLS (see package transfer).
//
// Keys are ECDSA P-256. Private keys are written with mode 0600 and never
// logged. An ephemeral development CA ([NewDevCA]) lives only in memory
// unless the caller saves it, and says in its name that it is for
// development.
package certs

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrInvalid is matched by errors about unusable certificate material.
var ErrInvalid = errors.New("certs: invalid certificate material")

// Default validity periods.
const (
	DefaultCAValidity   = 10 * 365 * 24 * time.Hour
	DefaultNodeValidity = 365 * 24 * time.Hour
	// DevValidity bounds an ephemeral development CA and its certificates.
	DevValidity = 7 * 24 * time.Hour
)

// DevCAName is the common name of development CAs; it is meant to be seen
// in logs and in `openssl x509 -text`.
const DevCAName = "kvfabric development CA (not for production)"

// CA is a cluster certificate authority: its certificate and signing key.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM is Cert in PEM form, ready to be written or shared.
	CertPEM []byte
}

// Pair is a node certificate and its private key in PEM form.
type Pair struct {
	CertPEM []byte
	KeyPEM  []byte
}

// TLSCertificate parses p into a tls.Certificate.
func (p *Pair) TLSCertificate() (tls.Certificate, error) {
	c, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return c, nil
}

func serial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// NewCA makes a self-signed CA named name, valid for validFor (if zero,
// DefaultCAValidity). Its subject also carries an organizational unit
// unique to this CA ("ca-" and 16 hex digits of its serial number), so
// that two CAs of the same name are told apart wherever subjects are
// printed (a certificate of one refused by the other names both).
func NewCA(name string, validFor time.Duration) (*CA, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty CA name", ErrInvalid)
	}
	if validFor <= 0 {
		validFor = DefaultCAValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generate CA key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, fmt.Errorf("certs: serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject: pkix.Name{CommonName: name, Organization: []string{"kvfabric"},
			OrganizationalUnit: []string{fmt.Sprintf("ca-%016x", new(big.Int).Rsh(sn, 63).Uint64())}},
		NotBefore:             now.Add(-5 * time.Minute), // tolerate clock skew between nodes
		NotAfter:              now.Add(validFor),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certs: create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("certs: parse CA certificate: %w", err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// NewDevCA makes an ephemeral CA for a local development cluster, valid
// for DevValidity. Its name says it is not for production.
func NewDevCA() (*CA, error) { return NewCA(DevCAName, DevValidity) }

// ValidNodeName reports whether name can name a node in a certificate: 1 to
// 253 bytes of letters, digits, '-', '.' and '_'.
func ValidNodeName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("%w: node name length %d not in [1, 253]", ErrInvalid, len(name))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		default:
			return fmt.Errorf("%w: node name %q has character %q at %d", ErrInvalid, name, c, i)
		}
	}
	return nil
}

// IssueNode makes a certificate for node name signed by ca, usable both as
// a TLS server and client certificate, valid for validFor (if zero,
// DefaultNodeValidity, cut to the CA's own expiry).
func (ca *CA) IssueNode(name string, validFor time.Duration) (*Pair, error) {
	if err := ValidNodeName(name); err != nil {
		return nil, err
	}
	if validFor <= 0 {
		validFor = DefaultNodeValidity
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("certs: generate node key: %w", err)
	}
	sn, err := serial()
	if err != nil {
		return nil, fmt.Errorf("certs: serial: %w", err)
	}
	now := time.Now()
	notAfter := now.Add(validFor)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: sn,
		Subject:      pkix.Name{CommonName: name, Organization: []string{"kvfabric"}},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certs: create node certificate for %q: %w", name, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("certs: marshal node key: %w", err)
	}
	return &Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// Pool returns a certificate pool holding only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Save writes the CA certificate (mode 0644) and key (mode 0600).
func (ca *CA) Save(certPath, keyPath string) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return fmt.Errorf("certs: marshal CA key: %w", err)
	}
	return writePair(certPath, keyPath, ca.CertPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
}

// Save writes the node certificate (mode 0644) and key (mode 0600).
func (p *Pair) Save(certPath, keyPath string) error {
	return writePair(certPath, keyPath, p.CertPEM, p.KeyPEM)
}

func writePair(certPath, keyPath string, certPEM, keyPEM []byte) error {
	if err := writeFile(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	return writeFile(certPath, certPEM, 0o644)
}

// writeFile writes through a temporary file and a rename so that a reader
// never sees half a key, and so that the mode holds even if path existed
// with a looser one.
func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp, err := writeTemp(path, data, mode)
	if err != nil {
		return err
	}
	defer os.Remove(tmp) // no-op after a successful rename
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("certs: rename to %s: %w", path, err)
	}
	return nil
}

// writeTemp writes data, synced, to a new temporary file beside path and
// returns its name.
func writeTemp(path string, data []byte, mode os.FileMode) (string, error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return "", fmt.Errorf("certs: write %s: %w", path, err)
	}
	tmp := f.Name()
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(tmp)
		return "", err
	}
	if err := f.Chmod(mode); err != nil {
		return fail(fmt.Errorf("certs: chmod %s: %w", tmp, err))
	}
	if _, err := f.Write(data); err != nil {
		return fail(fmt.Errorf("certs: write %s: %w", tmp, err))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("certs: sync %s: %w", tmp, err))
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("certs: close %s: %w", tmp, err)
	}
	return tmp, nil
}

// LoadCA reads a CA certificate and key written by [CA.Save].
func LoadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("certs: read CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("certs: read CA key: %w", err)
	}
	cert, err := parseCert(certPEM, certPath)
	if err != nil {
		return nil, err
	}
	if !cert.IsCA {
		return nil, fmt.Errorf("%w: %s is not a CA certificate", ErrInvalid, certPath)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("%w: %s holds no PEM block", ErrInvalid, keyPath)
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, keyPath, err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%w: %s: key cannot sign", ErrInvalid, keyPath)
	}
	// A key that does not match the certificate would issue certificates
	// that nobody can verify; refuse it here, where the cause is clear.
	if pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(cert.PublicKey) {
		return nil, fmt.Errorf("%w: %s does not match %s", ErrInvalid, keyPath, certPath)
	}
	return &CA{Cert: cert, Key: signer, CertPEM: certPEM}, nil
}

// LoadCAs reads a PEM file of one or more cluster CA certificates (more
// than one while a CA is being replaced). Each must be a CA certificate:
// basic constraints CA:TRUE and, when it states key usages, allowed to sign
// certificates. A node certificate given as the CA would make every peer's
// handshake fail; it is refused here, where the cause is plain.
func LoadCAs(certPath string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("certs: read CA certificate: %w", err)
	}
	var cas []*x509.Certificate
	for i := 1; ; i++ {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: certificate %d: %v", ErrInvalid, certPath, i, err)
		}
		if err := checkCA(c); err != nil {
			return nil, fmt.Errorf("%w: %s: certificate %d %w", ErrInvalid, certPath, i, err)
		}
		cas = append(cas, c)
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf("%w: %s holds no certificate", ErrInvalid, certPath)
	}
	return cas, nil
}

// checkCA says why c cannot be a CA, if it cannot.
func checkCA(c *x509.Certificate) error {
	switch {
	case !c.BasicConstraintsValid || !c.IsCA:
		return fmt.Errorf("(subject %q, issued by %q) is not a CA certificate (no basic constraints CA:TRUE): "+
			"give the cluster CA's certificate, not a node's", c.Subject.String(), c.Issuer.String())
	case c.KeyUsage != 0 && c.KeyUsage&x509.KeyUsageCertSign == 0:
		return fmt.Errorf("(subject %q) is a CA certificate whose key usage does not allow signing certificates", c.Subject.String())
	}
	return nil
}

// LoadPool reads a PEM file of one or more CA certificates (see [LoadCAs])
// into a pool.
func LoadPool(certPath string) (*x509.CertPool, error) {
	cas, err := LoadCAs(certPath)
	if err != nil {
		return nil, err
	}
	p := x509.NewCertPool()
	for _, c := range cas {
		p.AddCert(c)
	}
	return p, nil
}

// Checked is a node's TLS identity after [VerifyNode]: its certificate and
// the CA it chains to.
type Checked struct {
	Leaf *x509.Certificate
	CA   *x509.Certificate
}

// VerifyNode checks, before a node uses them, what its peers will check:
// that the certificate is valid at now, chains to one of cas for both
// server and client authentication, and names node. Errors name the
// subjects involved; the caller adds the files.
func VerifyNode(cert tls.Certificate, cas []*x509.Certificate, node string, now time.Time) (*Checked, error) {
	if len(cert.Certificate) == 0 {
		return nil, fmt.Errorf("%w: no certificate", ErrInvalid)
	}
	chain := make([]*x509.Certificate, len(cert.Certificate))
	for i, der := range cert.Certificate {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, fmt.Errorf("%w: certificate %d of the chain: %v", ErrInvalid, i+1, err)
		}
		chain[i] = c
	}
	leaf := chain[0]
	what := fmt.Sprintf("certificate %q", leaf.Subject.CommonName)
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("%w: %s expired at %s", ErrInvalid, what, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("%w: %s is not valid before %s (is the clock right?)", ErrInvalid, what, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	name, err := NodeName(leaf)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, what, err)
	}
	if name != node {
		return nil, fmt.Errorf("%w: %s names node %q, but this node is %q: peers would refuse every call", ErrInvalid, what, name, node)
	}
	roots := x509.NewCertPool()
	var subjects []string
	for _, c := range cas {
		roots.AddCert(c)
		subjects = append(subjects, c.Subject.String())
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	var root *x509.Certificate
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		chains, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage}})
		if err != nil {
			var ua x509.UnknownAuthorityError
			if errors.As(err, &ua) {
				return nil, fmt.Errorf("%w: %s was issued by %q, which is not the cluster CA %q: "+
					"peers would refuse every connection (issue the certificate with that CA, or give its issuer as the CA)",
					ErrInvalid, what, leaf.Issuer.String(), strings.Join(subjects, `", "`))
			}
			return nil, fmt.Errorf("%w: %s does not verify against the cluster CA %q for %s: %v",
				ErrInvalid, what, strings.Join(subjects, `", "`), usageName(usage), err)
		}
		c := chains[0]
		root = c[len(c)-1]
	}
	return &Checked{Leaf: leaf, CA: root}, nil
}

func usageName(u x509.ExtKeyUsage) string {
	if u == x509.ExtKeyUsageServerAuth {
		return "server authentication"
	}
	return "client authentication"
}

// LoadNode loads and checks a node's TLS identity from files: the cluster
// CA (see [LoadCAs]), and the node's certificate and key, which must match
// and pass [VerifyNode] for node. Errors name the file at fault.
func LoadNode(caPath, certPath, keyPath, node string, now time.Time) (tls.Certificate, *x509.CertPool, *Checked, error) {
	cas, err := LoadCAs(caPath)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	pair, err := LoadPair(certPath, keyPath)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	cert, err := pair.TLSCertificate()
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("%s, %s: %w", certPath, keyPath, err)
	}
	checked, err := VerifyNode(cert, cas, node, now)
	if err != nil {
		return tls.Certificate{}, nil, nil, fmt.Errorf("%s (CA %s): %w", certPath, caPath, err)
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	return cert, pool, checked, nil
}

// LoadPair reads a node certificate and key written by [Pair.Save].
func LoadPair(certPath, keyPath string) (*Pair, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("certs: read node certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("certs: read node key: %w", err)
	}
	p := &Pair{CertPEM: certPEM, KeyPEM: keyPEM}
	if _, err := p.TLSCertificate(); err != nil {
		return nil, fmt.Errorf("certs: load %s, %s: %w", certPath, keyPath, err)
	}
	return p, nil
}

func parseCert(data []byte, name string) (*x509.Certificate, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%w: %s holds no CERTIFICATE block", ErrInvalid, name)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, name, err)
	}
	return c, nil
}

// NodeName returns the node a verified certificate names: its subject
// common name, which must also be one of its DNS names when it has any.
func NodeName(c *x509.Certificate) (string, error) {
	name := c.Subject.CommonName
	if err := ValidNodeName(name); err != nil {
		return "", fmt.Errorf("certificate common name: %w", err)
	}
	if len(c.DNSNames) == 0 {
		return name, nil
	}
	for _, d := range c.DNSNames {
		if d == name {
			return name, nil
		}
	}
	return "", fmt.Errorf("%w: certificate common name %q is not among its DNS names %q", ErrInvalid, name, c.DNSNames)
}

// Development file names, in the directory an agent keeps its development
// CA in (fabric's DevCADir: by default kvfabric-dev-ca beside its data
// directory).
const (
	DevCACertFile = "dev-ca.crt"
	DevCAKeyFile  = "dev-ca.key"
)

// EnsureDevCA loads the development CA from dir, or makes and saves one
// there if dir has none; created says which. Every agent of a local
// development cluster pointed at the same dir shares it, also agents that
// start at the same moment: the key is published with a hard link, which
// only one of them can make, and the others wait for its certificate and
// load the winner's CA.
func EnsureDevCA(dir string) (ca *CA, created bool, err error) {
	certPath, keyPath := filepath.Join(dir, DevCACertFile), filepath.Join(dir, DevCAKeyFile)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("certs: development CA: %w", err)
	}
	switch certOK, keyOK := exists(certPath), exists(keyPath); {
	case certOK && keyOK:
		ca, err := LoadCA(certPath, keyPath)
		return ca, false, err
	case certOK:
		// The key is published first, so this is not a CA being made.
		return nil, false, fmt.Errorf("%w: %s exists without %s: remove it to make a new development CA", ErrInvalid, certPath, keyPath)
	case keyOK:
		ca, err := waitDevCA(certPath, keyPath)
		return ca, false, err
	}
	ca, err = NewDevCA()
	if err != nil {
		return nil, false, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(ca.Key)
	if err != nil {
		return nil, false, fmt.Errorf("certs: marshal CA key: %w", err)
	}
	won, err := publish(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
	if err != nil {
		return nil, false, err
	}
	if !won {
		ca, err := waitDevCA(certPath, keyPath)
		return ca, false, err
	}
	if won, err = publish(certPath, ca.CertPEM, 0o644); err != nil {
		return nil, false, err
	}
	if !won {
		return nil, false, fmt.Errorf("%w: %s appeared while this agent made the development CA: remove %s and %s", ErrInvalid, certPath, certPath, keyPath)
	}
	return ca, true, nil
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// devCAWait bounds how long an agent waits for another to finish writing
// the development CA it is making (a few milliseconds when all is well).
const devCAWait = 10 * time.Second

// waitDevCA loads the development CA that another agent is writing, once
// its certificate is there.
func waitDevCA(certPath, keyPath string) (*CA, error) {
	deadline := time.Now().Add(devCAWait)
	for !exists(certPath) {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%w: %s has been without %s for %v: an agent died while making the development CA; remove %s",
				ErrInvalid, keyPath, certPath, devCAWait, keyPath)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return LoadCA(certPath, keyPath)
}

// publish writes data to path whole or not at all, and only if path does
// not exist: through a temporary file and a hard link, which fails when
// path exists. won is false when another writer got there first.
func publish(path string, data []byte, mode os.FileMode) (won bool, err error) {
	tmp, err := writeTemp(path, data, mode)
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp)
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("certs: publish %s: %w", path, err)
	}
	return true, nil
}
