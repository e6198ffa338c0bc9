package main

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

func TestPprofFlags(t *testing.T) {
	for _, c := range []struct {
		name    string
		args    []string
		host    string // the host listened on ("loopback": any); "" for off or refused
		errHas  string // in the usage error, "" for none
		anyHost bool   // listened on all addresses
	}{
		{"off by default", nil, "", "", false},
		{"a bare port is loopback", []string{"--pprof", ":0"}, "127.0.0.1", "", false},
		{"loopback", []string{"--pprof", "127.0.0.1:0"}, "127.0.0.1", "", false},
		{"localhost", []string{"--pprof", "localhost:0"}, "loopback", "", false},
		{"all addresses refused", []string{"--pprof", "0.0.0.0:0"}, "", "not a loopback address", false},
		{"another host's IP refused", []string{"--pprof", "192.0.2.7:6060"}, "", "add --pprof-remote", false},
		{"a host name refused", []string{"--pprof", "node-7.example:6060"}, "", "give a loopback IP", false},
		{"all addresses with --pprof-remote", []string{"--pprof", "0.0.0.0:0", "--pprof-remote"}, "", "", true},
		{"no port", []string{"--pprof", "127.0.0.1"}, "", "want HOST:PORT", false},
		{"--pprof-remote alone", []string{"--pprof-remote"}, "", "without --pprof", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := flag.NewFlagSet("agent", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			p := bindPprof(fs)
			if err := fs.Parse(c.args); err != nil {
				t.Fatal(err)
			}
			ln, err := p.listen()
			if ln != nil {
				defer ln.Close()
			}
			if c.errHas != "" {
				var u *usageError
				if !errors.As(err, &u) || !strings.Contains(err.Error(), c.errHas) || ln != nil {
					t.Fatalf("listen: %v, %v; want a usage error saying %q", ln, err, c.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case c.host == "" && !c.anyHost:
				if ln != nil {
					t.Fatalf("listening on %v, want off", ln.Addr())
				}
			case c.anyHost:
				if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsUnspecified() {
					t.Fatalf("listening on %v, want every address", ln.Addr())
				}
			case c.host == "loopback":
				if ip := ln.Addr().(*net.TCPAddr).IP; !ip.IsLoopback() {
					t.Fatalf("listening on %v, want a loopback address", ln.Addr())
				}
			default:
				if ip := ln.Addr().(*net.TCPAddr).IP; ip.String() != c.host {
					t.Fatalf("listening on %v, want %s", ln.Addr(), c.host)
				}
			}
		})
	}
}

// The profiles answer: the index, a heap profile, and a CPU profile of a
// second in pprof's format (gzip); after stop, nothing listens.
func TestPprofServes(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var errs bytes.Buffer
	stop := servePprof(ln, &errs)
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return resp.StatusCode, b
	}
	if code, b := get("/"); code != http.StatusOK || !bytes.Contains(b, []byte("goroutine")) {
		t.Fatalf("/ (to the index): %d %.200q", code, b)
	}
	if code, b := get("/debug/pprof/heap?debug=1"); code != http.StatusOK || !bytes.Contains(b, []byte("heap profile")) {
		t.Fatalf("heap: %d %.200q", code, b)
	}
	if code, b := get("/debug/pprof/profile?seconds=1"); code != http.StatusOK || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
		t.Fatalf("CPU profile: %d, %d bytes beginning %.16q; want a gzip'd profile", code, len(b), b)
	}
	if code, _ := get("/elsewhere"); code != http.StatusNotFound {
		t.Fatalf("/elsewhere: %d, want 404", code)
	}
	stop()
	if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
		c.Close()
		t.Fatalf("%v still answers after stop", ln.Addr())
	}
	if errs.Len() > 0 {
		t.Fatalf("errors written: %s", errs.String())
	}
}

// The agent refuses a non-loopback --pprof before it starts (exit 2), and
// its help lists the flags.
func TestAgentPprofFlag(t *testing.T) {
	dir := t.TempDir()
	code, _, errs := runCmd(t, "", "agent", "--local", "--data-dir", filepath.Join(dir, "a"), "--pprof", "0.0.0.0:6060")
	if code != 2 || !strings.Contains(errs, "--pprof-remote") {
		t.Fatalf("agent --pprof 0.0.0.0:6060: exit %d, want 2 naming --pprof-remote: %s", code, errs)
	}
	_, _, help := runCmd(t, "", "agent", "-h")
	if !strings.Contains(help, "-pprof string") || !strings.Contains(help, "-pprof-remote") {
		t.Fatalf("agent -h does not list --pprof and --pprof-remote:\n%s", help)
	}
}
