package certs

import (
	"crypto/x509"
	"errors"
	"os"
	"path/filepath"
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
