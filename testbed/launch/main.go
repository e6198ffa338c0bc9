// Command launch starts a kvfabric cluster on real hosts over SSH, checks it
// and stops it. It needs only ssh on this machine and a POSIX shell on the
// hosts; it copies the binary, a cluster CA's node certificates and a gossip
// key to each host, so nothing need be installed there.
//
//	go run ./testbed/launch -hosts hosts.txt -bin bin/kvfabric up      # start, wait until every node sees every other
//	go run ./testbed/launch -hosts hosts.txt check                     # blocks put on the first host, imported and checked on every other
//	go run ./testbed/launch -hosts hosts.txt status                    # each node's members
//	go run ./testbed/launch -hosts hosts.txt down                      # SIGTERM every agent (they leave), wait for them
//
// The host list has one host a line: the ssh destination ([user@]host,
// with :port when not 22), then optionally the node name (default: the
// host) and the address the agent listens on and peers dial (default: the
// host). Blank lines and # comments are skipped:
//
//	root@gpu-node-01            gpu-node-01
//	root@10.0.0.12:2222         gpu-node-02   10.0.0.12
//
// Every agent joins the first host's. The certificates and gossip key are
// kept under -state, made on the first up and reused after.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Host is one line of the host list.
type Host struct {
	Dest string // [user@]host, for ssh
	Port int    // ssh port; zero: ssh's default
	Node string // node name
	Addr string // address the agent listens on
}

// MaxHosts bounds the host list: a cluster of a few hundred nodes holds the
// whole index on each (docs/architecture.md, Not built); past that is not what this
// launcher is for.
const MaxHosts = 1024

// ParseHosts reads a host list.
func ParseHosts(r io.Reader) ([]Host, error) {
	var out []Host
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	line := 0
	for sc.Scan() {
		line++
		text, _, _ := strings.Cut(sc.Text(), "#")
		f := strings.Fields(text)
		if len(f) == 0 {
			continue
		}
		if len(f) > 3 {
			return nil, fmt.Errorf("launch: hosts line %d: %d fields (want destination [node [address]])", line, len(f))
		}
		h := Host{Dest: f[0]}
		if d, p, ok := strings.Cut(f[0], ":"); ok {
			port, err := strconv.Atoi(p)
			if err != nil || port < 1 || port > 65535 {
				return nil, fmt.Errorf("launch: hosts line %d: port %q is not in 1..65535", line, p)
			}
			h.Dest, h.Port = d, port
		}
		bare := h.Dest[strings.LastIndex(h.Dest, "@")+1:]
		if bare == "" || strings.HasPrefix(h.Dest, "-") {
			return nil, fmt.Errorf("launch: hosts line %d: destination %q has no host", line, f[0])
		}
		h.Node, h.Addr = bare, bare
		if len(f) > 1 {
			h.Node = f[1]
		}
		if len(f) > 2 {
			h.Addr = f[2]
		}
		for _, s := range []string{h.Node, h.Addr} {
			if strings.ContainsAny(s, "'\"`$\\;&|<>(){} \t") || strings.HasPrefix(s, "-") {
				return nil, fmt.Errorf("launch: hosts line %d: %q is not a node name or address", line, s)
			}
		}
		if prev, ok := seen[h.Node]; ok {
			return nil, fmt.Errorf("launch: hosts line %d: node %s already on line %d (node names are unique in a cluster)", line, h.Node, prev)
		}
		seen[h.Node] = line
		out = append(out, h)
		if len(out) > MaxHosts {
			return nil, fmt.Errorf("launch: hosts line %d: more than %d hosts", line, MaxHosts)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("launch: hosts: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("launch: hosts: no hosts")
	}
	return out, nil
}

type launcher struct {
	hosts   []Host
	bin     string
	state   string
	remote  string
	cluster string
	pool    string
	sshOpts []string
	timeout time.Duration
	out     io.Writer
}

// dir is the host's folder: one per node, so that hosts sharing a file
// system (as the tests' namespaces do) keep apart.
func (l *launcher) dir(h Host) string { return l.remote + "/" + h.Node }

func (l *launcher) ssh(ctx context.Context, h Host, stdin io.Reader, script string) (string, error) {
	args := []string{"-o", "BatchMode=yes", "-o", "ConnectTimeout=10"}
	if h.Port != 0 {
		args = append(args, "-p", strconv.Itoa(h.Port))
	}
	args = append(args, l.sshOpts...)
	args = append(args, h.Dest, script)
	cmd := exec.CommandContext(ctx, "ssh", args...)
	cmd.Stdin = stdin
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("launch: %s (%s): %w: %s", h.Node, h.Dest, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// copyTo writes a local file to the host through ssh's standard input.
func (l *launcher) copyTo(ctx context.Context, h Host, local, remote string, mode os.FileMode) error {
	f, err := os.Open(local)
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	defer f.Close()
	_, err = l.ssh(ctx, h, f, fmt.Sprintf("cat > '%s.tmp' && chmod %o '%s.tmp' && mv '%s.tmp' '%s'", remote, mode, remote, remote, remote))
	return err
}

// credentials makes the cluster CA, a certificate per node and the gossip
// key under the state folder, keeping what is there.
func (l *launcher) credentials(ctx context.Context) error {
	if err := os.MkdirAll(l.state, 0o700); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	ca := filepath.Join(l.state, "ca.crt")
	run := func(args ...string) error {
		out, err := exec.CommandContext(ctx, l.bin, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("launch: kvfabric %s: %w: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	if _, err := os.Stat(ca); err != nil {
		if err := run("certs", "ca", "--out", l.state); err != nil {
			return err
		}
	}
	for _, h := range l.hosts {
		if _, err := os.Stat(filepath.Join(l.state, h.Node+".crt")); err == nil {
			continue
		}
		if err := run("certs", "node", h.Node, "--ca-cert", ca, "--ca-key", filepath.Join(l.state, "ca.key"), "--out", l.state); err != nil {
			return err
		}
	}
	key := filepath.Join(l.state, "gossip.key")
	if _, err := os.Stat(key); err != nil {
		b := make([]byte, 32)
		rand.Read(b)
		if err := os.WriteFile(key, []byte(base64.StdEncoding.EncodeToString(b)+"\n"), 0o600); err != nil {
			return fmt.Errorf("launch: %w", err)
		}
	}
	return nil
}

func hostPort(addr string, port int) string { return net.JoinHostPort(addr, strconv.Itoa(port)) }

func (l *launcher) up(ctx context.Context) error {
	if l.bin == "" {
		return errors.New("launch: up needs -bin, the kvfabric binary for the hosts")
	}
	if err := l.credentials(ctx); err != nil {
		return err
	}
	seed := hostPort(l.hosts[0].Addr, 7946)
	for i, h := range l.hosts {
		d := l.dir(h)
		if _, err := l.ssh(ctx, h, nil, fmt.Sprintf("mkdir -p '%s/data' && chmod 700 '%s'", d, d)); err != nil {
			return err
		}
		for _, f := range []struct {
			local, remote string
			mode          os.FileMode
		}{
			{l.bin, "kvfabric", 0o755}, {filepath.Join(l.state, "ca.crt"), "ca.crt", 0o644},
			{filepath.Join(l.state, h.Node+".crt"), "node.crt", 0o644}, {filepath.Join(l.state, h.Node+".key"), "node.key", 0o600},
			{filepath.Join(l.state, "gossip.key"), "gossip.key", 0o600},
		} {
			if err := l.copyTo(ctx, h, f.local, d+"/"+f.remote, f.mode); err != nil {
				return err
			}
		}
		args := []string{"agent", "--node", h.Node, "--cluster", l.cluster,
			"--gossip-addr", hostPort(h.Addr, 7946), "--peer-addr", hostPort(h.Addr, 7947), "--metrics-addr", hostPort(h.Addr, 7948),
			"--ca", "ca.crt", "--cert", "node.crt", "--key", "node.key", "--gossip-key-file", "gossip.key",
			"--data-dir", d + "/data", "--pool", l.pool}
		if i > 0 {
			args = append(args, "--join", seed)
		}
		// Detached from the ssh session: its own session, no terminal,
		// output to a log beside it.
		script := fmt.Sprintf("cd '%s' && if [ -f agent.pid ] && kill -0 $(cat agent.pid) 2>/dev/null; then echo running; exit 0; fi; "+
			"setsid ./kvfabric %s > agent.log 2>&1 < /dev/null & echo $! > agent.pid", d, strings.Join(args, " "))
		out, err := l.ssh(ctx, h, nil, script)
		if err != nil {
			return err
		}
		if strings.TrimSpace(out) == "running" {
			fmt.Fprintf(l.out, "%s: already running on %s\n", h.Node, h.Dest)
			continue
		}
		fmt.Fprintf(l.out, "%s: started on %s\n", h.Node, h.Dest)
	}
	return l.waitMembers(ctx)
}

type member struct {
	Node  string `json:"node"`
	State string `json:"state"`
}

func (l *launcher) members(ctx context.Context, h Host) ([]string, error) {
	d := l.dir(h)
	out, err := l.ssh(ctx, h, nil, fmt.Sprintf("'%s/kvfabric' members --socket '%s/data/engine.sock' --json", d, d))
	if err != nil {
		return nil, err
	}
	var ms []member
	if err := json.Unmarshal([]byte(out), &ms); err != nil {
		return nil, fmt.Errorf("launch: %s: members: %w: %q", h.Node, err, out)
	}
	var alive []string
	for _, m := range ms {
		if m.State == "alive" {
			alive = append(alive, m.Node)
		}
	}
	return alive, nil
}

// waitMembers polls every node until it sees every host alive.
func (l *launcher) waitMembers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	for _, h := range l.hosts {
		for {
			alive, err := l.members(ctx, h)
			if err == nil && len(alive) == len(l.hosts) {
				fmt.Fprintf(l.out, "%s: sees %d members alive\n", h.Node, len(alive))
				break
			}
			select {
			case <-ctx.Done():
				logTail, _ := l.ssh(context.Background(), h, nil, fmt.Sprintf("tail -n 15 '%s/agent.log'", l.dir(h)))
				return fmt.Errorf("launch: %s sees %v (%v), want %d members: %w\n%s", h.Node, alive, err, len(l.hosts), ctx.Err(), logTail)
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// check puts blocks on the first host and has every other import them and
// check every byte.
func (l *launcher) check(ctx context.Context) error {
	first := l.hosts[0]
	d := l.dir(first)
	engine := "--layers 2 --kv-heads 8 --head-dim 128 --page-size 16"
	out, err := l.ssh(ctx, first, nil, fmt.Sprintf("'%s/kvfabric' put --socket '%s/data/engine.sock' %s --generate 64 --seed %d --json", d, d, engine, time.Now().UnixNano()%1e9))
	if err != nil {
		return err
	}
	hashes, err := putHashes(out)
	if err != nil {
		return fmt.Errorf("launch: %s: put: %w", first.Node, err)
	}
	list := make([]string, len(hashes))
	for i, h := range hashes {
		list[i] = strconv.FormatUint(h, 10)
	}
	fmt.Fprintf(l.out, "%s: put %d blocks\n", first.Node, len(hashes))
	for _, h := range l.hosts[1:] {
		d := l.dir(h)
		script := fmt.Sprintf("'%s/kvfabric' get --socket '%s/data/engine.sock' %s --hashes %s --verify --out /dev/null", d, d, engine, strings.Join(list, ","))
		// The index reaches h by gossip: retry until it has.
		deadline := time.Now().Add(l.timeout)
		for {
			_, err := l.ssh(ctx, h, nil, script)
			if err == nil {
				fmt.Fprintf(l.out, "%s: imported and verified %d blocks\n", h.Node, len(hashes))
				break
			}
			if time.Now().After(deadline) {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(500 * time.Millisecond):
			}
		}
	}
	return nil
}

// putHashes reads the sequence hashes kvfabric put --json prints
// ({"block_set": "N", "hashes": ["H", ...]}: strings, as every --json of
// kvfabric writes them, so that no JSON reader rounds them through a
// float64).
func putHashes(out string) ([]uint64, error) {
	var v struct {
		Hashes []string `json:"hashes"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		return nil, fmt.Errorf("%w: %q", err, out)
	}
	if len(v.Hashes) == 0 {
		return nil, fmt.Errorf("no hashes in %q", out)
	}
	hashes := make([]uint64, len(v.Hashes))
	for i, h := range v.Hashes {
		var err error
		if hashes[i], err = strconv.ParseUint(h, 10, 64); err != nil {
			return nil, fmt.Errorf("hash %d of put's answer: %w", i, err)
		}
	}
	return hashes, nil
}

func (l *launcher) status(ctx context.Context) error {
	var errs []error
	for _, h := range l.hosts {
		alive, err := l.members(ctx, h)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(l.out, "%s: %d alive: %s\n", h.Node, len(alive), strings.Join(alive, " "))
	}
	return errors.Join(errs...)
}

// down stops every agent with SIGTERM (they leave the cluster), waits up
// to 15 s each, then SIGKILLs; with clean it also removes the hosts'
// folders.
func (l *launcher) down(ctx context.Context, clean bool) error {
	var errs []error
	for i := len(l.hosts) - 1; i >= 0; i-- {
		h := l.hosts[i]
		d := l.dir(h)
		script := fmt.Sprintf(`cd '%s' 2>/dev/null || exit 0; if [ -f agent.pid ]; then p=$(cat agent.pid); kill -TERM $p 2>/dev/null; `+
			`i=0; while kill -0 $p 2>/dev/null && [ $i -lt 150 ]; do sleep 0.1; i=$((i+1)); done; `+
			`if kill -0 $p 2>/dev/null; then kill -KILL $p; echo killed; else echo stopped; fi; rm -f agent.pid; fi`, d)
		if clean {
			script += fmt.Sprintf("; rm -rf '%s'", d)
		}
		out, err := l.ssh(ctx, h, nil, script)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(l.out, "%s: %s\n", h.Node, strings.TrimSpace(out))
	}
	return errors.Join(errs...)
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("launch", flag.ContinueOnError)
	hostsFile := fs.String("hosts", "", "the host list (required)")
	bin := fs.String("bin", "", "the kvfabric binary to copy to the hosts (for up; it also makes the certificates)")
	state := fs.String("state", "kvfabric-launch", "local folder for the cluster CA, node certificates and gossip key")
	remote := fs.String("remote-dir", "/tmp/kvfabric-launch", "folder on each host (a node's files go in REMOTE/NODE)")
	cluster := fs.String("cluster", "kvfabric-testbed", "cluster name (gossip label)")
	pool := fs.String("pool", "host=1GiB", "each agent's --pool")
	timeout := fs.Duration("timeout", 2*time.Minute, "how long up waits for the cluster to form, and check for imports")
	clean := fs.Bool("clean", false, "down: also remove each host's folder")
	var sshOpts multiFlag
	fs.Var(&sshOpts, "ssh-option", "an ssh option, as ssh -o takes it (repeatable), e.g. -ssh-option IdentityFile=~/.ssh/lab")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: launch -hosts FILE [flags] up|check|status|down")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("launch: want one command (up, check, status, down), got %q", fs.Args())
	}
	if *hostsFile == "" {
		return errors.New("launch: -hosts is required")
	}
	if strings.ContainsAny(*remote, "'\n") || !strings.HasPrefix(*remote, "/") {
		return fmt.Errorf("launch: -remote-dir %q: want an absolute path without quotes", *remote)
	}
	if *timeout <= 0 {
		return fmt.Errorf("launch: -timeout %v is not positive", *timeout)
	}
	f, err := os.Open(*hostsFile)
	if err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	hosts, err := ParseHosts(f)
	f.Close()
	if err != nil {
		return err
	}
	if _, err := exec.LookPath("ssh"); err != nil {
		return fmt.Errorf("launch: %w (install the OpenSSH client)", err)
	}
	l := &launcher{hosts: hosts, bin: *bin, state: *state, remote: strings.TrimRight(*remote, "/"), cluster: *cluster,
		pool: *pool, timeout: *timeout, out: stdout}
	for _, o := range sshOpts {
		l.sshOpts = append(l.sshOpts, "-o", o)
	}
	ctx := context.Background()
	switch fs.Arg(0) {
	case "up":
		return l.up(ctx)
	case "check":
		return l.check(ctx)
	case "status":
		return l.status(ctx)
	case "down":
		return l.down(ctx, *clean)
	}
	return fmt.Errorf("launch: unknown command %q (want up, check, status or down)", fs.Arg(0))
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
