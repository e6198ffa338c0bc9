package fabric

import (
	"bytes"
	"encoding/base64"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/transfer/certs"
)

// Reload puts a renewed certificate and a rotated gossip keyring in use,
// refuses a certificate from another CA while keeping the one in use, and
// the node stays in its cluster throughout.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	path := func(name string) string { return filepath.Join(dir, name) }
	ca, err := certs.NewCA("cluster CA", 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(ca *certs.CA, validFor time.Duration) {
		t.Helper()
		p, err := ca.IssueNode("h1", validFor)
		if err != nil {
			t.Fatal(err)
		}
		os.Remove(path("h1.crt"))
		os.Remove(path("h1.key"))
		if err := p.Save(path("h1.crt"), path("h1.key")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(path("ca.crt"), ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	issue(ca, 24*time.Hour)
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	writeKeys := func(keys ...[]byte) {
		var lines []string
		for _, k := range keys {
			lines = append(lines, base64.StdEncoding.EncodeToString(k))
		}
		if err := os.WriteFile(path("gossip.key"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeKeys(k1)
	a := startHolder(t, func(c *Config) {
		c.Dev = false
		c.CAFile, c.CertFile, c.KeyFile, c.GossipKeyFile = path("ca.crt"), path("h1.crt"), path("h1.key"), path("gossip.key")
	})
	expires := func() time.Duration { return time.Until(a.Metrics().Certificates[0].NotAfter).Round(time.Hour) }
	if got := expires(); got != 24*time.Hour {
		t.Fatalf("certificate expires in %v, want 24h", got)
	}

	// A renewed certificate and a rotation that adds a key and makes it primary.
	issue(ca, 48*time.Hour)
	writeKeys(k2, k1)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := expires(); got != 48*time.Hour {
		t.Errorf("after reload the certificate expires in %v, want the renewed one's 48h", got)
	}
	keys, err := a.members.Keys()
	if err != nil || len(keys) != 2 || !bytes.Equal(keys[0], k2) {
		t.Errorf("keyring after reload: %d keys (%v); want 2, k2 first", len(keys), err)
	}

	// The old key is dropped from the file: it leaves the keyring.
	writeKeys(k2)
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if keys, _ := a.members.Keys(); len(keys) != 1 || !bytes.Equal(keys[0], k2) {
		t.Errorf("keyring after dropping k1: %d keys", len(keys))
	}

	// A certificate from another CA is refused, naming why; the renewed
	// one stays in use.
	other, err := certs.NewCA("other CA", 30*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue(other, 72*time.Hour)
	err = a.Reload()
	if err == nil || !strings.Contains(err.Error(), "TLS identity not reloaded") || !strings.Contains(err.Error(), "other CA") {
		t.Fatalf("reload with another CA's certificate: %v", err)
	}
	if !errors.Is(err, ErrConfig) || !errors.Is(err, certs.ErrInvalid) {
		t.Errorf("reload with another CA's certificate: %v; want it to match ErrConfig and its cause, certs.ErrInvalid", err)
	}
	if got := expires(); got != 48*time.Hour {
		t.Errorf("after a refused reload the certificate expires in %v, want the one in use (48h)", got)
	}

	// A gossip key file that is gone is refused with the error that says
	// so; the keys in use stay.
	issue(ca, 48*time.Hour)
	if err := os.Remove(path("gossip.key")); err != nil {
		t.Fatal(err)
	}
	var se *SettingError
	if err := a.Reload(); !errors.As(err, &se) || se.Key != "gossip_key_file" || !errors.Is(err, ErrConfig) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("reload without the gossip key file: %v; want a SettingError about gossip_key_file matching ErrConfig and fs.ErrNotExist", err)
	}
	if keys, _ := a.members.Keys(); len(keys) != 1 || !bytes.Equal(keys[0], k2) {
		t.Errorf("keyring after a refused reload: %d keys, want k2 alone", len(keys))
	}
}
