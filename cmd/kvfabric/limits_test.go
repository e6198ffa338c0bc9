package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
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

// certs node certifies a name of the agent's most bytes (128), and refuses
// one more as the agent does, where a certificate's limit (253 bytes) let
// it make a certificate no agent could use.
func TestCertsNodeNameLimit(t *testing.T) {
	dir := t.TempDir()
	ca := filepath.Join(dir, "ca")
	if code, _, errs := runCmd(t, "", "certs", "ca", "--out", ca); code != 0 {
		t.Fatalf("certs ca: exit %d: %s", code, errs)
	}
	node := func(name string) (int, string) {
		code, _, errs := runCmd(t, "", "certs", "node", name, "--ca-cert", filepath.Join(ca, "ca.crt"), "--ca-key", filepath.Join(ca, "ca.key"), "--out", filepath.Join(dir, "nodes"))
		return code, errs
	}
	at := strings.Repeat("n", fabric.MaxNodeName)
	if code, errs := node(at); code != 0 {
		t.Fatalf("certs node with a name of %d bytes: exit %d: %s", len(at), code, errs)
	}
	if _, err := os.Stat(filepath.Join(dir, "nodes", at+".crt")); err != nil {
		t.Fatal(err)
	}
	past := at + "n"
	want := fmt.Sprintf("kvfabric certs: node name %q must be 1 to 128 letters, digits, '-', '.' or '_' (it is the name in the node's certificate)\n", past)
	if code, errs := node(past); code != 2 || errs != want {
		t.Fatalf("certs node with a name of %d bytes: exit %d, %q; want 2 and %q", len(past), code, errs, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "nodes", past+".crt")); !os.IsNotExist(err) {
		t.Fatalf("certs node wrote a certificate for a name of %d bytes: %v", len(past), err)
	}
}

// The client commands' flags that bound what the command itself makes:
// each at its limit gets as far as the agent (here none: exit 1), and one
// past it is a usage error naming the flag, before anything is made.
func TestClientFlagLimits(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	block := strings.Repeat("7 ", 65536) // one block of the largest page size, on standard input
	for _, tc := range []struct {
		args  []string
		stdin string
		want  string // "" for accepted
	}{
		{[]string{"put", "--generate", "1048576", "--page-size", "1"}, "", ""},
		{[]string{"put", "--generate", "1048577"}, "", "--generate 1048577: want 1..1048576"},
		{[]string{"put", "--generate", "-1"}, "", "--generate -1"},
		// Given as 0, not taken as left out: it read token ids from
		// standard input and put them.
		{[]string{"put", "--generate", "0"}, strings.Repeat("7 ", 16), "--generate 0: want 1..1048576"},
		{[]string{"put", "--generate=0", "--page-size", "1"}, "7", "--generate 0: want 1..1048576"},
		{[]string{"put", "--generate", "1", "--page-size", "65536"}, "", ""},
		// At most 2^24 tokens: 1048576 blocks of 65536 made 2^36 (256 GiB).
		{[]string{"put", "--generate", "256", "--page-size", "65536"}, "", ""},
		{[]string{"put", "--generate", "257", "--page-size", "65536"}, "", "--generate 257: at most 256 blocks of --page-size 65536 tokens (16777216 tokens in all)"},
		{[]string{"put", "--generate", "1", "--page-size", "65537"}, "", "--page-size 65537"},
		{[]string{"put", "--generate", "2", "--page-size", "0"}, "", "--page-size 0"},
		// Checked before --generate makes the tokens: a negative count of
		// them was a panic.
		{[]string{"put", "--generate", "2", "--page-size", "-1"}, "", "--page-size -1"},
		// The engine flags, at a layout's bounds and one past them: the
		// request's fields are unsigned 32-bit, and 2^32+1 layers went as
		// one.
		{[]string{"put", "--generate", "1", "--layers", "4096"}, "", ""},
		{[]string{"put", "--generate", "1", "--layers", "4097"}, "", "--layers 4097: must be 1..4096"},
		{[]string{"put", "--generate", "1", "--layers", "0"}, "", "--layers 0: must be 1..4096"},
		{[]string{"put", "--generate", "1", "--layers", "4294967297"}, "", "--layers 4294967297: must be 1..4096"},
		{[]string{"put", "--generate", "1", "--kv-heads", "4096"}, "", ""},
		{[]string{"put", "--generate", "1", "--kv-heads", "4097"}, "", "--kv-heads 4097: must be 1..4096"},
		{[]string{"put", "--generate", "1", "--kv-heads", "-1"}, "", "--kv-heads -1: must be 1..4096"},
		{[]string{"put", "--generate", "1", "--head-dim", "65536"}, "", ""},
		{[]string{"put", "--generate", "1", "--head-dim", "65537"}, "", "--head-dim 65537: must be 1..65536"},
		{[]string{"put", "--generate", "1", "--tp", "1024"}, "", ""},
		{[]string{"put", "--generate", "1", "--tp", "1025"}, "", "--tp 1025: must be 1..1024"},
		{[]string{"put", "--generate", "1", "--tp", "0"}, "", "--tp 0: must be 1..1024"},
		{[]string{"put", "--generate", "1", "--slots", "67108864"}, "", ""},
		{[]string{"put", "--generate", "1", "--slots", "67108865"}, "", "--slots 67108865: must be 0..67108864"},
		{[]string{"put", "--generate", "2", "--slots", "4294967298"}, "", "--slots 4294967298: must be 0..67108864"},
		{[]string{"put", "--generate", "1", "--slots", "-1"}, "", "--slots -1: must be 0..67108864"},
		{[]string{"import", "--tp", "1025", "--hashes", "1"}, "", "--tp 1025: must be 1..1024"},
		{[]string{"get", "--layers", "4294967297", "--out", os.DevNull, "--hashes", "1"}, "", "--layers 4294967297: must be 1..4096"},
		{[]string{"import", "--page-size", "65536"}, block, ""},
		{[]string{"import", "--page-size", "65537", "1"}, "", "--page-size 65537: must be 1..65536"},
		{[]string{"get", "--page-size", "0", "--out", os.DevNull, "1"}, "", "--page-size 0: must be 1..65536"},
		{[]string{"lookup", "--block-size", "1", "1"}, "", ""},
		// An empty entry of --hashes was dropped: 1,,2 named two blocks.
		{[]string{"lookup", "--hashes", "1, 2,3"}, "", ""},
		{[]string{"lookup", "--hashes", "1,,2"}, "", `--hashes: entry 1 of "1,,2" is empty`},
		{[]string{"get", "--out", os.DevNull, "--hashes", "1,2,"}, "", `--hashes: entry 2 of "1,2," is empty`},
		{[]string{"lookup", "--block-size", "0", "1"}, "", "--block-size 0: must be 1..65536"},
		{[]string{"hash", "--block-size", "65537", "1"}, "", "--block-size 65537: must be 1..65536"},
		// A bound already past failed every call with the context's error,
		// naming no flag, where an agent was there.
		{[]string{"status", "--timeout", "1ns"}, "", ""},
		{[]string{"status", "--timeout", "0s"}, "", `invalid value "0s" for flag -timeout: must be positive`},
		{[]string{"members", "--timeout", "-1s"}, "", `invalid value "-1s" for flag -timeout: must be positive`},
		{[]string{"lookup", "--timeout", "1", "1"}, "", `invalid value "1" for flag -timeout: not a duration such as 30s`},
	} {
		args := append([]string{tc.args[0], "--socket", sock}, tc.args[1:]...)
		if tc.args[0] == "hash" {
			args = tc.args
		}
		code, _, errs := runCmd(t, tc.stdin, args...)
		switch {
		case tc.want == "" && (code != 1 || !strings.Contains(errs, "is the agent running")):
			t.Errorf("%v: exit %d, %q; want it accepted, and no agent found", tc.args, code, errs)
		case tc.want != "" && (code != 2 || !strings.Contains(errs, tc.want)):
			t.Errorf("%v: exit %d, %q; want 2 and %q", tc.args, code, errs, tc.want)
		}
	}
}

// put --timeout 0s is refused as its flags are parsed, not once it has
// read its tokens: with standard input that never ends (a terminal no one
// types at) it waited for it before refusing.
func TestClientTimeoutRefusedBeforeInput(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close() // ends a read that should not have begun
	var stdout, stderr bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(&env{stdin: r, stdout: &stdout, stderr: &stderr}, []string{"put", "--socket", filepath.Join(t.TempDir(), "none.sock"), "--timeout", "0s"})
	}()
	select {
	case code := <-done:
		if want := `invalid value "0s" for flag -timeout: must be positive`; code != 2 || !strings.Contains(stderr.String(), want) {
			t.Fatalf("exit %d, %q; want 2 and %q", code, stderr.String(), want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("put --timeout 0s still running after 10s: it waits for standard input before refusing the flag")
	}
}

// plan --blocks: as many as both layouts hold, and not one more.
func TestPlanBlocksLimit(t *testing.T) {
	ex := "../../examples/layouts/"
	plan := []string{"plan", "--src", ex + "llama70b-tp4-hnd.json", "--dst", ex + "llama70b-tp2-hnd.json", "--blocks"}
	if code, out, errs := runCmd(t, "", append(plan, "1024")...); code != 0 || !strings.HasPrefix(out, "1024 source blocks") {
		t.Fatalf("--blocks 1024: exit %d, %q %s", code, out, errs)
	}
	for n, want := range map[string]string{"1025": "--blocks 1025: the layouts hold at most 1024", "-1": "--blocks -1: must not be negative"} {
		if code, _, errs := runCmd(t, "", append(plan, n)...); code != 2 || !strings.Contains(errs, want) {
			t.Errorf("--blocks %s: exit %d, %q; want 2 and %q", n, code, errs, want)
		}
	}
}
