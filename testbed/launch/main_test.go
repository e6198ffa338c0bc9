package main

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/testbed"
)

var bin string

// TestMain builds the binary the launchers start.
func TestMain(m *testing.M) {
	testbed.MainWithBinary(&bin, m.Run)
}

var long = flag.Bool("kvfabric.long", false, "run the launcher on three namespace hosts instead of two")

func TestParseHosts(t *testing.T) {
	hosts, err := ParseHosts(strings.NewReader(`
# lab
root@gpu-node-01            gpu-node-01
root@10.0.0.12:2222         gpu-node-02   10.0.0.12   # a comment
10.0.0.13
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []Host{{"root@gpu-node-01", 0, "gpu-node-01", "gpu-node-01"}, {"root@10.0.0.12", 2222, "gpu-node-02", "10.0.0.12"},
		{"10.0.0.13", 0, "10.0.0.13", "10.0.0.13"}}
	if fmt.Sprint(hosts) != fmt.Sprint(want) {
		t.Fatalf("got %v, want %v", hosts, want)
	}
	for _, c := range []struct{ desc, in, want string }{
		{"empty", "# nothing\n\n", "no hosts"},
		{"too many fields", "a b c d", "4 fields"},
		{"bad port", "a:0", "port \"0\""},
		{"port past range", "a:65536", "port \"65536\""},
		{"no host", "root@ n", "has no host"},
		{"option as host", "-oProxyCommand=x", "has no host"},
		{"shell in node name", "a n;rm", "not a node name"},
		{"duplicate node", "a n\nb n", "node n already on line 1"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			if _, err := ParseHosts(strings.NewReader(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an error naming %q", err, c.want)
			}
		})
	}
	// At the host limit and past it.
	var b strings.Builder
	for i := range MaxHosts {
		fmt.Fprintf(&b, "h%d\n", i)
	}
	if hs, err := ParseHosts(strings.NewReader(b.String())); err != nil || len(hs) != MaxHosts {
		t.Fatalf("%d hosts: %v", MaxHosts, err)
	}
	b.WriteString("one-more\n")
	if _, err := ParseHosts(strings.NewReader(b.String())); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("%d hosts: %v", MaxHosts+1, err)
	}
}

func TestFlagsRefused(t *testing.T) {
	hosts := filepath.Join(t.TempDir(), "hosts")
	os.WriteFile(hosts, []byte("a\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"up"}, "-hosts is required"},
		{[]string{"-hosts", hosts}, "want one command"},
		{[]string{"-hosts", hosts, "reboot"}, "unknown command \"reboot\""},
		{[]string{"-hosts", hosts, "-remote-dir", "rel", "up"}, "absolute path"},
		{[]string{"-hosts", hosts, "-remote-dir", "/tmp/x'y", "up"}, "without quotes"},
		{[]string{"-hosts", hosts, "-timeout", "0s", "up"}, "not positive"},
		{[]string{"-hosts", hosts, "up"}, "needs -bin"},
		{[]string{"-hosts", "/nonexistent/hosts", "up"}, "no such file"},
	} {
		if err := run(c.args, new(bytes.Buffer)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error naming %q", c.args, err, c.want)
		}
	}
}

func TestPutHashesKeepsEveryBit(t *testing.T) {
	got, err := putHashes(`{"block_set":"1","hashes":["6313541203411246116","18446744073709551615"]}`)
	if err != nil || len(got) != 2 || got[0] != 6313541203411246116 || got[1] != 1<<64-1 {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{`{"hashes":[]}`, `{"hashes":["18446744073709551616"]}`, `{"hashes":[12]}`, `{"hashes":["-1"]}`} {
		if _, err := putHashes(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}

// needs returns why the SSH test cannot run here, or "".
func needs() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	for _, p := range []string{"ip", "ssh", "ssh-keygen", "/usr/sbin/sshd"} {
		if _, err := exec.LookPath(p); err != nil {
			return p + " is not installed (apt-get install openssh-server openssh-client iproute2)"
		}
	}
	return ""
}

func sh(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// The launcher against sshd in network namespaces on a bridge, each a host
// with its own address: up (copy, certificates, start, wait for every
// member), status, check (blocks put on the first host, imported and
// verified byte by byte on the others over the namespaces' network), down.
// Two hosts by default (about 30 s here, most of it copying the binary
// and the agents leaving), three with -kvfabric.long.
func TestLaunchOverSSHInNamespaces(t *testing.T) {
	if why := needs(); why != "" {
		t.Skip("SSH launcher test cannot run here: " + why)
	}
	dir := t.TempDir()
	x := 100 + rand.IntN(150)
	bridge := fmt.Sprintf("kvl%d", x)
	subnet := fmt.Sprintf("10.250.%d.", x)
	sh(t, "ip", "link", "add", bridge, "type", "bridge")
	t.Cleanup(func() { exec.Command("ip", "link", "del", bridge).Run() })
	sh(t, "ip", "addr", "add", subnet+"1/24", "dev", bridge)
	sh(t, "ip", "link", "set", bridge, "up")

	sh(t, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, "id"))
	pub, _ := os.ReadFile(filepath.Join(dir, "id.pub"))
	os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600)
	sh(t, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, "host_key"))
	os.MkdirAll("/run/sshd", 0o755) // sshd's privilege separation folder

	n := 2
	if *long {
		n = 3
	}
	var hosts strings.Builder
	for i := 1; i <= n; i++ {
		ns := fmt.Sprintf("kvl-%d-%d", x, i)
		veth := fmt.Sprintf("kvl%dv%d", x, i)
		addr := fmt.Sprintf("%s%d", subnet, i+1)
		sh(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
		sh(t, "ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
		sh(t, "ip", "link", "set", veth, "master", bridge, "up")
		sh(t, "ip", "netns", "exec", ns, "ip", "addr", "add", addr+"/24", "dev", "eth0")
		sh(t, "ip", "netns", "exec", ns, "ip", "link", "set", "eth0", "up")
		sh(t, "ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
		cfg := filepath.Join(dir, ns+".sshd_config")
		os.WriteFile(cfg, fmt.Appendf(nil, "ListenAddress %s\nHostKey %s\nAuthorizedKeysFile %s\nPermitRootLogin prohibit-password\n"+
			"UsePAM no\nStrictModes no\nPidFile none\n", addr, filepath.Join(dir, "host_key"), filepath.Join(dir, "authorized_keys")), 0o600)
		sshd := exec.Command("ip", "netns", "exec", ns, "/usr/sbin/sshd", "-D", "-e", "-f", cfg)
		var log bytes.Buffer
		sshd.Stdout, sshd.Stderr = &log, &log
		if err := sshd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			sshd.Process.Kill()
			sshd.Wait()
			if t.Failed() {
				t.Logf("sshd in %s:\n%s", ns, log.String())
			}
		})
		fmt.Fprintf(&hosts, "root@%s node%d\n", addr, i)
	}
	hostsFile := filepath.Join(dir, "hosts")
	os.WriteFile(hostsFile, []byte(hosts.String()), 0o644)
	remote := filepath.Join(dir, "remote")
	common := []string{"-hosts", hostsFile, "-state", filepath.Join(dir, "state"), "-remote-dir", remote, "-pool", "host=128MiB",
		"-timeout", "60s", "-ssh-option", "IdentityFile=" + filepath.Join(dir, "id"),
		"-ssh-option", "UserKnownHostsFile=/dev/null", "-ssh-option", "StrictHostKeyChecking=no", "-ssh-option", "LogLevel=ERROR"}
	launch := func(args ...string) string {
		t.Helper()
		var out bytes.Buffer
		began := time.Now()
		err := run(append(append([]string{}, common...), args...), &out)
		t.Logf("launch %s (%.1f s):\n%s", strings.Join(args, " "), time.Since(began).Seconds(), out.String())
		if err != nil {
			t.Fatalf("launch %s: %v", strings.Join(args, " "), err)
		}
		return out.String()
	}
	// sshd answers once it listens.
	wait.For(t, 20*time.Second, "sshd in every namespace", func() error {
		var out bytes.Buffer
		return run(append(append([]string{}, common...), "down"), &out)
	})
	t.Cleanup(func() {
		var out bytes.Buffer
		if err := run(append(append([]string{}, common...), "down"), &out); err != nil {
			t.Logf("down at cleanup: %v", err)
		}
		if t.Failed() {
			for i := 1; i <= n; i++ {
				b, _ := os.ReadFile(filepath.Join(remote, fmt.Sprintf("node%d", i), "agent.log"))
				t.Logf("node%d agent log:\n%s", i, b)
			}
		}
	})

	out := launch("-bin", bin, "up")
	var names []string
	for i := 1; i <= n; i++ {
		names = append(names, fmt.Sprintf("node%d", i))
		if !strings.Contains(out, fmt.Sprintf("node%d: sees %d members alive", i, n)) {
			t.Fatalf("up: node%d does not see %d members", i, n)
		}
	}
	// The agents listen on their namespaces' addresses, not loopback.
	out = launch("status")
	if strings.Count(out, fmt.Sprintf("%d alive: %s", n, strings.Join(names, " "))) != n {
		t.Fatalf("status: %s", out)
	}
	// A second up finds the agents running and starts none.
	out = launch("-bin", bin, "up")
	if strings.Count(out, "already running") != n {
		t.Fatalf("second up: %s", out)
	}
	out = launch("check")
	if strings.Count(out, "imported and verified 64 blocks") != n-1 {
		t.Fatalf("check: %s", out)
	}
	out = launch("-clean", "down")
	if strings.Count(out, "stopped") != n {
		t.Fatalf("down: %s (want every agent stopped by SIGTERM, none killed)", out)
	}
	if _, err := os.Stat(filepath.Join(remote, "node1")); !os.IsNotExist(err) {
		t.Fatalf("down -clean left node1's folder: %v", err)
	}
}
