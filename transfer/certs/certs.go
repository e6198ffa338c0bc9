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
// DefaultCAValidity).
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
		SerialNumber:          sn,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"kvfabric"}},
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
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("certs: write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return fmt.Errorf("certs: chmod %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("certs: write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("certs: sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("certs: close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("certs: rename to %s: %w", path, err)
	}
	return nil
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

// LoadPool reads a PEM file of one or more CA certificates into a pool.
func LoadPool(certPath string) (*x509.CertPool, error) {
	data, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("certs: read CA certificate: %w", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("%w: %s holds no certificate", ErrInvalid, certPath)
	}
	return p, nil
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
		return nil, fmt.Errorf("load %s, %s: %w", certPath, keyPath, err)
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

// Development file names, inside an agent's data directory.
const (
	DevCACertFile = "dev-ca.crt"
	DevCAKeyFile  = "dev-ca.key"
)

// EnsureDevCA loads the development CA from dir, or makes and saves one
// there if dir has none; created says which. Every agent of a local
// development cluster pointed at the same dir shares it.
func EnsureDevCA(dir string) (ca *CA, created bool, err error) {
	certPath, keyPath := filepath.Join(dir, DevCACertFile), filepath.Join(dir, DevCAKeyFile)
	_, certErr := os.Stat(certPath)
	_, keyErr := os.Stat(keyPath)
	if certErr == nil && keyErr == nil {
		ca, err := LoadCA(certPath, keyPath)
		return ca, false, err
	}
	if !errors.Is(certErr, os.ErrNotExist) || !errors.Is(keyErr, os.ErrNotExist) {
		return nil, false, fmt.Errorf("%w: %s and %s must both exist or both be absent", ErrInvalid, certPath, keyPath)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("certs: %w", err)
	}
	ca, err = NewDevCA()
	if err != nil {
		return nil, false, err
	}
	if err := ca.Save(certPath, keyPath); err != nil {
		return nil, false, err
	}
	return ca, true, nil
}
