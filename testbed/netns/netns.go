// Package netns starts kvfabric clusters whose nodes are Linux network
// namespaces on one bridge, so that agents talk over a real network stack
// (veth, bridge, ARP, qdiscs) and faults can be put on the wire: partitions,
// a slow or lossy link, UDP dropped, besides killing and pausing processes.
//
// Each node is a namespace with one veth (eth0 inside) on the cluster's
// bridge, an address 10.213.0.(i+1)/24 that exists only inside the
// namespaces (the host gets no address and no route, so clusters side by
// side never meet), its own UTS namespace whose host name is the node
// name (the agent takes its name from it), a certificate from the
// cluster's test CA (kvfabric certs) and the cluster's gossip key. Agents
// run with the production (LAN) timings, not --local.
//
// Names carry the process id of the test that made them:
//
//	namespace  kvfabric-tb-PID-C-I   (C: cluster, I: node)
//	bridge     kvbPID.C
//	veth       kvPIDHEX.C.I          (host side; eth0 inside)
//
// so that [Start] can remove what a killed earlier run left behind (its
// PID no longer runs) without touching a run beside it. Everything needs
// root; [Available] says why not where it is missing.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvfabric/kvfabric/testbed"
)

// ErrNotSupported is matched (errors.Is) by a fault step that this kernel
// cannot do; the error says which facility is missing.
var ErrNotSupported = errors.New("netns: not supported by this kernel")

const (
	nsPrefix = "kvfabric-tb-"
	subnet   = "10.213.0."
	// blackholeGW is an address on the cluster's subnet that nothing owns:
	// routes via it, with a neighbour entry to an unused MAC, drop packets
	// silently on the bridge, as a real partition does (a blackhole route
	// would fail the send with EINVAL instead).
	blackholeGW  = subnet + "254"
	blackholeMAC = "02:00:00:00:00:fe"
	udpTable     = "213"
	tcpTable     = "214" // BlackholeTCP's, apart from UDP's
)

// Options configure a namespace cluster.
type Options struct {
	// Bin is the kvfabric binary. Required.
	Bin string
	// Nodes is the number of nodes. If zero, 3; at most MaxNodes.
	Nodes int
	// Pool is each agent's --pool. If empty, host=256MiB.
	Pool string
	// ExtraArgs are appended to every agent's command line. If empty,
	// none.
	ExtraArgs []string
	// Cluster is the cluster name (--cluster). If empty, testbed.
	Cluster string

	// Env is added to every agent's environment (KEY=value, as
	// testbed.Options.Env). If empty, agents inherit the driver's.
	Env []string
}

// Cluster is a set of agents, each in its own network namespace.
type Cluster struct {
	*testbed.Cluster
	id     string // PID.C
	dir    string // certificates and gossip key
	bridge string
	ns     []string
	mu     sync.Mutex
	faults map[string]bool // applied steps, for Close to report
}

var seq atomic.Int32

// Available returns nil where namespaces can be made here, or why not.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("netns: needs root to create network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return fmt.Errorf("netns: no ip command (iproute2): %w", err)
	}
	name := fmt.Sprintf("%s%d-probe", nsPrefix, os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		return fmt.Errorf("netns: ip netns add: %v: %s", err, bytes.TrimSpace(out))
	}
	return run("ip", "netns", "del", name)
}

// Start removes what killed earlier runs left, makes the namespaces, the
// bridge, a CA with a certificate per node and a gossip key, and starts
// the agents, each joining the first; it returns once every agent sees
// every other alive. On error, everything made is removed.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	if err := opts.fill(); err != nil {
		return nil, err
	}
	if err := CleanStale(); err != nil {
		return nil, err
	}
	pid := os.Getpid()
	cn := seq.Add(1)
	c := &Cluster{id: fmt.Sprintf("%d.%d", pid, cn), bridge: fmt.Sprintf("kvb%d.%d", pid, cn), faults: map[string]bool{}}
	defer func() {
		if err != nil {
			c.teardown()
		}
	}()
	if c.dir, err = os.MkdirTemp("", "kvfabric-netns-"); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if err := run("ip", "link", "add", c.bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	if err := run("ip", "link", "set", c.bridge, "up"); err != nil {
		return nil, err
	}
	names := make([]string, opts.Nodes)
	for i := range opts.Nodes {
		names[i] = fmt.Sprintf("gpu-%02d", i+1)
		if err := c.addNode(pid, int(cn), i); err != nil {
			return nil, err
		}
	}
	if err := c.makeSecrets(opts.Bin, names); err != nil {
		return nil, err
	}
	tc, err := testbed.Start(ctx, testbed.Options{
		Bin: opts.Bin, Nodes: opts.Nodes, Pool: opts.Pool, ExtraArgs: opts.ExtraArgs, Env: opts.Env,
		Name:    func(i int) string { return names[i] },
		Address: func(i int) string { return addr(i) },
		Identity: func(i int, n *testbed.Node) []string {
			d := filepath.Join(c.dir, n.Name)
			return []string{"--cluster", opts.Cluster,
				"--ca", filepath.Join(c.dir, "ca", "ca.crt"),
				"--cert", filepath.Join(d, n.Name+".crt"), "--key", filepath.Join(d, n.Name+".key"),
				"--gossip-key-file", filepath.Join(c.dir, "gossip.key")}
		},
		Launch: func(i int, argv []string) []string {
			// ip netns exec and unshare exec in place, and so does the
			// shell, so the agent keeps the pid the driver signals.
			return append([]string{"ip", "netns", "exec", c.ns[i], "unshare", "--uts", "--",
				"sh", "-c", `hostname "$0" && exec "$@"`, names[i]}, argv...)
		},
		Healthy: healthy,
	})
	if err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	c.Cluster = tc
	return c, nil
}

// MaxNodes is the most nodes a cluster has: its addresses are .1 to .250
// of one /24, and .254 is the address nothing owns that UDP blackholes
// route to.
const MaxNodes = 250

// fill sets the defaults and checks opts.
func (opts *Options) fill() error {
	if opts.Bin == "" {
		return errors.New("netns: Options.Bin is required")
	}
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Nodes < 0 || opts.Nodes > MaxNodes {
		return fmt.Errorf("netns: %d nodes: want 1..%d", opts.Nodes, MaxNodes)
	}
	if opts.Pool == "" {
		opts.Pool = "host=256MiB"
	}
	if opts.Cluster == "" {
		opts.Cluster = "testbed"
	}
	return nil
}

func addr(i int) string { return subnet + strconv.Itoa(i+1) }

func (c *Cluster) addNode(pid, cn, i int) error {
	ns := fmt.Sprintf("%s%d-%d-%d", nsPrefix, pid, cn, i+1)
	if err := run("ip", "netns", "add", ns); err != nil {
		return err
	}
	c.ns = append(c.ns, ns)
	host := fmt.Sprintf("kv%x.%x.%d", pid, cn, i+1)
	steps := [][]string{
		{"ip", "link", "add", host, "type", "veth", "peer", "name", "eth0", "netns", ns},
		{"ip", "link", "set", host, "master", c.bridge, "up"},
		{"ip", "-n", ns, "addr", "add", addr(i) + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return err
		}
	}
	return nil
}

// makeSecrets makes the cluster's CA, one certificate per node and a
// gossip key, with the binary's own commands.
func (c *Cluster) makeSecrets(bin string, names []string) error {
	ca := filepath.Join(c.dir, "ca")
	if err := run(bin, "certs", "ca", "--out", ca); err != nil {
		return err
	}
	for _, n := range names {
		if err := run(bin, "certs", "node", n, "--ca-cert", filepath.Join(ca, "ca.crt"),
			"--ca-key", filepath.Join(ca, "ca.key"), "--out", filepath.Join(c.dir, n)); err != nil {
			return err
		}
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return fmt.Errorf("netns: gossip key: %w", err)
	}
	return os.WriteFile(filepath.Join(c.dir, "gossip.key"), []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
}

// healthy is the namespace cluster's readiness: the metrics address is
// inside the namespace, out of the driver's reach, so the engine socket
// answers instead.
func healthy(ctx context.Context, n *testbed.Node) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cl, err := n.Client(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	s, err := cl.Status(ctx)
	if err != nil {
		return err
	}
	if !s.Joined {
		return errors.New("not joined")
	}
	return nil
}

// Namespace is node i's namespace name (for ip -n).
func (c *Cluster) Namespace(i int) string { return c.ns[i] }

// Addr is node i's address.
func (c *Cluster) Addr(i int) string { return addr(i) }

// Close stops every agent (paused ones too, see testbed.Node.Stop), and
// removes the namespaces, the bridge and the secrets. Safe to call twice.
func (c *Cluster) Close() error {
	var errs []error
	if c.Cluster != nil {
		// Heal first, so that the agents leave the cluster as they would.
		errs = append(errs, c.HealAll())
		errs = append(errs, c.Cluster.Close())
	}
	errs = append(errs, c.teardown())
	return errors.Join(errs...)
}

func (c *Cluster) teardown() error {
	var errs []error
	for _, ns := range c.ns {
		if err := run("ip", "netns", "del", ns); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
	}
	c.ns = nil
	if c.bridge != "" {
		if err := run("ip", "link", "del", c.bridge); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err)
		}
		c.bridge = ""
	}
	if c.dir != "" {
		errs = append(errs, os.RemoveAll(c.dir))
		c.dir = ""
	}
	return errors.Join(errs...)
}

// CleanStale removes the namespaces and bridges that runs no longer
// running left behind (a test binary killed before its cleanup).
func CleanStale() error {
	var errs []error
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("netns: ip netns list: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		rest, ok := strings.CutPrefix(name, nsPrefix)
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, "-")
		if pid, err := strconv.Atoi(pidStr); err == nil && !alive(pid) {
			if err := run("ip", "netns", "del", name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	out, err = exec.Command("ip", "-o", "link", "show", "type", "bridge").Output()
	if err != nil {
		return fmt.Errorf("netns: ip link show: %w", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		rest, ok := strings.CutPrefix(name, "kvb")
		if !ok {
			continue
		}
		pidStr, _, _ := strings.Cut(rest, ".")
		if pid, err := strconv.Atoi(pidStr); err == nil && !alive(pid) {
			if err := run("ip", "link", "del", name); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// run runs a command and returns its output in the error when it fails.
func run(argv ...string) error {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("netns: %s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// batch runs ip commands in namespace ns, one per line, in one process.
func batch(ns string, lines []string) error {
	if len(lines) == 0 {
		return nil
	}
	cmd := exec.Command("ip", "-n", ns, "-batch", "-")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("netns: ip -n %s -batch (%s): %w: %s", ns, strings.Join(lines, "; "), err, bytes.TrimSpace(out))
	}
	return nil
}
