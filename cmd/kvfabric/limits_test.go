package main

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// notAfter reads the expiry of the PEM certificate in file.
func notAfter(t *testing.T, file string) time.Time {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", file)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return c.NotAfter
}

// certs --days: a CA and a node certificate of the most days are valid
// that long (the node's cut to the CA's expiry), and a day more, or none,
// is a usage error naming the flag; so is a count of days whose validity
// overflows a time.Duration, which once wrapped round to the default.
func TestCertsDaysLimits(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca")
	start := time.Now()
	if code, _, errs := runCmd(t, "", "certs", "ca", "--out", ca, "--days", fmt.Sprint(maxCertDays)); code != 0 {
		t.Fatalf("certs ca --days %d: exit %d: %s", maxCertDays, code, errs)
	}
	want := start.Add(maxCertDays * 24 * time.Hour)
	caExpiry := notAfter(t, filepath.Join(ca, "ca.crt"))
	if d := caExpiry.Sub(want); d < -time.Hour || d > time.Hour {
		t.Fatalf("certs ca --days %d: expires %v, want about %v", maxCertDays, caExpiry, want)
	}
	node := []string{"certs", "node", "n1", "--ca-cert", filepath.Join(ca, "ca.crt"), "--ca-key", filepath.Join(ca, "ca.key"), "--out", filepath.Join(dir, "nodes")}
	if code, _, errs := runCmd(t, "", append(node, "--days", fmt.Sprint(maxCertDays))...); code != 0 {
		t.Fatalf("certs node --days %d: exit %d: %s", maxCertDays, code, errs)
	}
	if got := notAfter(t, filepath.Join(dir, "nodes", "n1.crt")); !got.Equal(caExpiry) {
		t.Fatalf("certs node --days %d: expires %v, want the CA's expiry %v", maxCertDays, got, caExpiry)
	}
	for _, days := range []int{maxCertDays + 1, 0, -1, 200000} {
		for _, args := range [][]string{
			{"certs", "ca", "--out", filepath.Join(dir, fmt.Sprint("ca", days))},
			append(node[:len(node):len(node)], "--out", filepath.Join(dir, fmt.Sprint("nodes", days))),
		} {
			args = append(args, "--days", fmt.Sprint(days))
			code, _, errs := runCmd(t, "", args...)
			if want := fmt.Sprintf("--days %d: want 1..%d", days, maxCertDays); code != 2 || !strings.Contains(errs, want) {
				t.Errorf("%v: exit %d, %q; want 2 and %q", args, code, errs, want)
			}
		}
	}
}
