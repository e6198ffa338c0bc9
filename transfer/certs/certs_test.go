package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCARoundTrip(t *testing.T) {
	dir := t.TempDir()
	ca, err := NewCA("cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := ca.Save(certPath, keyPath); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{keyPath: 0o600, certPath: 0o644} {
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s mode %v, want %v", filepath.Base(path), st.Mode().Perm(), want)
		}
	}
	loaded, err := LoadCA(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	// A certificate issued by the loaded CA verifies against the original.
	pair, err := loaded.IssueNode("node-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	np, nk := filepath.Join(dir, "n.crt"), filepath.Join(dir, "n.key")
	if err := pair.Save(np, nk); err != nil {
		t.Fatal(err)
	}
	back, err := LoadPair(np, nk)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := back.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(tc.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pool, err := LoadPool(certPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, usage := range []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
			t.Errorf("verify for usage %v: %v", usage, err)
		}
	}
	if name, err := NodeName(leaf); err != nil || name != "node-1" {
		t.Errorf("NodeName = %q, %v", name, err)
	}
	if !leaf.NotAfter.Before(ca.Cert.NotAfter.Add(time.Second)) {
		t.Error("node certificate outlives its CA")
	}
}

func TestRefusals(t *testing.T) {
	dir := t.TempDir()
	a, _ := NewCA("a", time.Hour)
	b, _ := NewCA("b", time.Hour)
	if err := a.Save(filepath.Join(dir, "a.crt"), filepath.Join(dir, "a.key")); err != nil {
		t.Fatal(err)
	}
	if err := b.Save(filepath.Join(dir, "b.crt"), filepath.Join(dir, "b.key")); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(filepath.Join(dir, "a.crt"), filepath.Join(dir, "b.key")); !errors.Is(err, ErrInvalid) {
		t.Errorf("mismatched CA key: err = %v, want ErrInvalid", err)
	}
	pair, _ := a.IssueNode("n", time.Hour)
	pair.Save(filepath.Join(dir, "n.crt"), filepath.Join(dir, "n.key"))
	if _, err := LoadCA(filepath.Join(dir, "n.crt"), filepath.Join(dir, "n.key")); !errors.Is(err, ErrInvalid) {
		t.Errorf("node certificate as CA: err = %v, want ErrInvalid", err)
	}
	os.WriteFile(filepath.Join(dir, "junk"), []byte("not pem"), 0o600)
	if _, err := LoadPool(filepath.Join(dir, "junk")); !errors.Is(err, ErrInvalid) {
		t.Errorf("junk pool: err = %v", err)
	}
	if _, err := LoadPair(filepath.Join(dir, "n.crt"), filepath.Join(dir, "junk")); !errors.Is(err, ErrInvalid) {
		t.Errorf("junk key: err = %v", err)
	}
	for _, name := range []string{"", "has space", "slash/y", string(make([]byte, 254))} {
		if _, err := a.IssueNode(name, time.Hour); !errors.Is(err, ErrInvalid) {
			t.Errorf("IssueNode(%q): err = %v, want ErrInvalid", name, err)
		}
	}
	dev, err := NewDevCA()
	if err != nil {
		t.Fatal(err)
	}
	if dev.Cert.Subject.CommonName != DevCAName || dev.Cert.NotAfter.After(time.Now().Add(DevValidity)) {
		t.Errorf("dev CA %q until %v", dev.Cert.Subject.CommonName, dev.Cert.NotAfter)
	}
}

func TestEnsureDevCA(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	a, created, err := EnsureDevCA(dir)
	if err != nil || !created {
		t.Fatalf("first EnsureDevCA: created %v, err %v", created, err)
	}
	b, created, err := EnsureDevCA(dir)
	if err != nil || created {
		t.Fatalf("second EnsureDevCA: created %v, err %v", created, err)
	}
	if !a.Cert.Equal(b.Cert) {
		t.Error("second call made a different CA")
	}
	if a.Cert.Subject.CommonName != DevCAName {
		t.Errorf("dev CA named %q", a.Cert.Subject.CommonName)
	}
	os.Remove(filepath.Join(dir, DevCAKeyFile))
	if _, _, err := EnsureDevCA(dir); !errors.Is(err, ErrInvalid) {
		t.Errorf("half a CA: err = %v, want ErrInvalid", err)
	}
}

// Agents started together with one development CA directory share one CA:
// exactly one of them makes it, and the files always match.
func TestEnsureDevCAConcurrent(t *testing.T) {
	const rounds, agents = 10, 8
	for r := range rounds {
		dir := filepath.Join(t.TempDir(), "ca")
		var (
			wg      sync.WaitGroup
			start   = make(chan struct{})
			cas     = make([]*CA, agents)
			created = make([]bool, agents)
			errs    = make([]error, agents)
		)
		for i := range agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				cas[i], created[i], errs[i] = EnsureDevCA(dir)
			}()
		}
		close(start)
		wg.Wait()
		makers := 0
		for i := range agents {
			if errs[i] != nil {
				t.Fatalf("round %d: agent %d: %v", r, i, errs[i])
			}
			if created[i] {
				makers++
			}
			if !cas[i].Cert.Equal(cas[0].Cert) {
				t.Fatalf("round %d: agents 0 and %d got different development CAs", r, i)
			}
		}
		if makers != 1 {
			t.Fatalf("round %d: %d agents say they made the CA, want 1", r, makers)
		}
		onDisk, err := LoadCA(filepath.Join(dir, DevCACertFile), filepath.Join(dir, DevCAKeyFile))
		if err != nil || !onDisk.Cert.Equal(cas[0].Cert) {
			t.Fatalf("round %d: the CA on disk is not the one the agents use (%v)", r, err)
		}
	}
}

func TestVerifyNode(t *testing.T) {
	ca, err := NewCA("cluster CA", 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCA("other CA", 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	tlsCert := func(ca *CA, name string) tls.Certificate {
		p, err := ca.IssueNode(name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		c, err := p.TLSCertificate()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// A server-only certificate, as another tool might make.
	serverOnly := func() tls.Certificate {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "n1"}, DNSNames: []string{"n1"},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
		if err != nil {
			t.Fatal(err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}()
	now := time.Now()
	for _, tc := range []struct {
		name string
		cert tls.Certificate
		cas  []*x509.Certificate
		node string
		now  time.Time
		want []string // in the error; none means success
	}{
		{"good", tlsCert(ca, "n1"), []*x509.Certificate{ca.Cert}, "n1", now, nil},
		{"good with the old and new CA", tlsCert(ca, "n1"), []*x509.Certificate{other.Cert, ca.Cert}, "n1", now, nil},
		{"another CA's certificate", tlsCert(other, "n1"), []*x509.Certificate{ca.Cert}, "n1", now, []string{`issued by "CN=other CA`, `cluster CA "CN=cluster CA`}},
		{"names another node", tlsCert(ca, "n2"), []*x509.Certificate{ca.Cert}, "n1", now, []string{`names node "n2"`, `this node is "n1"`}},
		{"expired", tlsCert(ca, "n1"), []*x509.Certificate{ca.Cert}, "n1", now.Add(90 * time.Minute), []string{`"n1" expired at`}},
		{"not yet valid", tlsCert(ca, "n1"), []*x509.Certificate{ca.Cert}, "n1", now.Add(-time.Hour), []string{"not valid before"}},
		{"no client authentication", serverOnly, []*x509.Certificate{ca.Cert}, "n1", now, []string{"client authentication"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := VerifyNode(tc.cert, tc.cas, tc.node, tc.now)
			if tc.want == nil {
				if err != nil || !got.CA.Equal(ca.Cert) || got.Leaf.Subject.CommonName != tc.node {
					t.Fatalf("VerifyNode = %+v, %v; want success chaining to the cluster CA", got, err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			t.Log(err)
		})
	}
}

func TestLoadNodeRefusals(t *testing.T) {
	dir := t.TempDir()
	ca, _ := NewCA("cluster CA", time.Hour)
	other, _ := NewCA("other CA", time.Hour)
	path := func(n string) string { return filepath.Join(dir, n) }
	if err := ca.Save(path("ca.crt"), path("ca.key")); err != nil {
		t.Fatal(err)
	}
	if err := other.Save(path("other.crt"), path("other.key")); err != nil {
		t.Fatal(err)
	}
	n1, _ := ca.IssueNode("n1", time.Hour)
	n1.Save(path("n1.crt"), path("n1.key"))
	rogue, _ := other.IssueNode("n1", time.Hour)
	rogue.Save(path("rogue.crt"), path("rogue.key"))
	both, _ := os.ReadFile(path("ca.crt"))
	otherPEM, _ := os.ReadFile(path("other.crt"))
	os.WriteFile(path("bundle.crt"), append(otherPEM, both...), 0o644)
	n1PEM, _ := os.ReadFile(path("n1.crt"))
	os.WriteFile(path("mixed.crt"), append(both, n1PEM...), 0o644)

	if _, _, c, err := LoadNode(path("ca.crt"), path("n1.crt"), path("n1.key"), "n1", time.Now()); err != nil || c.CA.Subject.CommonName != "cluster CA" {
		t.Fatalf("good files: %v", err)
	}
	if _, _, _, err := LoadNode(path("bundle.crt"), path("n1.crt"), path("n1.key"), "n1", time.Now()); err != nil {
		t.Fatalf("a bundle of two CAs: %v", err)
	}
	for _, tc := range []struct {
		name         string
		ca, crt, key string
		node         string
		want1, want2 string
	}{
		{"node certificate as the CA", "n1.crt", "n1.crt", "n1.key", "n1", path("n1.crt"), `(subject "CN=n1,O=kvfabric", issued by "CN=cluster CA,OU=ca-`},
		{"a node certificate in the CA bundle", "mixed.crt", "n1.crt", "n1.key", "n1", path("mixed.crt") + ": certificate 2", "is not a CA certificate"},
		{"certificate of another CA", "ca.crt", "rogue.crt", "rogue.key", "n1", path("rogue.crt"), `issued by "CN=other CA,OU=ca-`},
		{"certificate of another node", "ca.crt", "n1.crt", "n1.key", "n2", path("n1.crt"), `names node "n1", but this node is "n2"`},
		{"key of another certificate", "ca.crt", "n1.crt", "rogue.key", "n1", path("rogue.key"), "private key does not match"},
		{"missing CA", "nope.crt", "n1.crt", "n1.key", "n1", path("nope.crt"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, _, err := LoadNode(path(tc.ca), path(tc.crt), path(tc.key), tc.node, time.Now())
			if err == nil {
				t.Fatal("LoadNode succeeded")
			}
			for _, w := range []string{tc.want1, tc.want2} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}
