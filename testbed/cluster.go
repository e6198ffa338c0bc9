// Package testbed starts real kvfabric clusters, agents as processes of the
// built binary, and drives workloads against them through the engine
// client. The demo (testbed/demo, `make demo`) and the end-to-end tests
// use it.
//
// A local cluster puts each node on its own loopback address
// (127.B.C.i, one random B.C per cluster so that clusters started side by
// side do not meet) with fixed ports, a shared development CA, and
// everything under one temporary directory that Close removes.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/kvfabric/kvfabric/fabric/client"
)

// Options configure a local cluster.
type Options struct {
	// Bin is the kvfabric binary. Required.
	Bin string
	// Nodes is the number of agents. If zero, 3.
	Nodes int
	// Pool is each agent's --pool. If empty, host=512MiB.
	Pool string
	// PeerTimeout is each agent's --peer-timeout. If zero, the default.
	PeerTimeout time.Duration
	// ExtraArgs are appended to every agent's command line.
	ExtraArgs []string
	// Env is added to every agent's environment (KEY=value), after the
	// driver's own; a node's Node.Env comes after it. If empty, agents
	// inherit the driver's environment only.
	Env []string
	// NodeArgs and NodeEnv, if set, give node i (from 0) arguments and
	// environment of its own, kept in its Node.Args and Node.Env.
	NodeArgs, NodeEnv func(i int) []string

	// The hooks below let another kind of cluster (testbed/netns: nodes in
	// network namespaces) reuse this one's process handling.

	// Name names node i. If nil, node1, node2, ...
	Name func(i int) string
	// Address is node i's IP address, where it binds gossip (port 7946),
	// the peer transport (7947) and metrics (7948). If nil, 127.B.C.(i+1).
	Address func(i int) string
	// Identity is node i's flags that name and authenticate it. If nil,
	// --local --node NAME --dev-ca-dir ROOT/ca: loopback timings and a
	// development CA shared by the cluster.
	Identity func(i int, n *Node) []string
	// Launch wraps node i's command line (the binary first), for instance
	// to run it inside a network namespace; it must exec the agent so that
	// signals reach it. If nil, the binary runs as is.
	Launch func(i int, argv []string) []string
	// Healthy returns nil once node n serves. If nil, once its /healthz
	// answers 200 and its engine socket exists.
	Healthy func(ctx context.Context, n *Node) error
}

// Cluster is a set of agent processes on loopback.
type Cluster struct {
	opts  Options
	Root  string
	Nodes []*Node
	net   string // "127.B.C."
}

// Node is one agent process.
type Node struct {
	Name                     string
	Gossip, Peer, Metrics    string
	DataDir, Socket, LogFile string
	// Args and Env are this node's own additions to Options.ExtraArgs and
	// Options.Env, read at each StartNode; set them before starting it.
	Args, Env []string
	cmd       *exec.Cmd
	exited    chan error
}

// Start starts the agents one after another, each joining the first, and
// waits until every agent serves its engine socket and sees every other.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Nodes == 0 {
		opts.Nodes = 3
	}
	if opts.Pool == "" {
		opts.Pool = "host=512MiB"
	}
	root, err := os.MkdirTemp("", "kvfabric-cluster-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: opts, Root: root, net: fmt.Sprintf("127.%d.%d.", 10+rand.IntN(200), 1+rand.IntN(250))}
	for i := range opts.Nodes {
		n := &Node{Name: fmt.Sprintf("node%d", i+1)}
		if opts.Name != nil {
			n.Name = opts.Name(i)
		}
		ip := c.net + fmt.Sprint(i+1)
		if opts.Address != nil {
			ip = opts.Address(i)
		}
		n.Gossip, n.Peer, n.Metrics = ip+":7946", ip+":7947", ip+":7948"
		n.DataDir = filepath.Join(root, n.Name)
		n.Socket = filepath.Join(n.DataDir, "engine.sock")
		n.LogFile = filepath.Join(root, n.Name+".log")
		if opts.NodeArgs != nil {
			n.Args = opts.NodeArgs(i)
		}
		if opts.NodeEnv != nil {
			n.Env = opts.NodeEnv(i)
		}
		c.Nodes = append(c.Nodes, n)
	}
	for i := range c.Nodes {
		if err := c.StartNode(ctx, i); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.WaitMembers(ctx, c.Nodes, len(c.Nodes)); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// StartNode starts node i (again, after Stop) and waits for its socket.
func (c *Cluster) StartNode(ctx context.Context, i int) error {
	n := c.Nodes[i]
	args := []string{c.opts.Bin, "agent"}
	if c.opts.Identity != nil {
		args = append(args, c.opts.Identity(i, n)...)
	} else {
		args = append(args, "--local", "--node", n.Name, "--dev-ca-dir", filepath.Join(c.Root, "ca"))
	}
	args = append(args, "--data-dir", n.DataDir,
		"--gossip-addr", n.Gossip, "--peer-addr", n.Peer, "--metrics-addr", n.Metrics,
		"--pool", c.opts.Pool,
		"--dumpable") // softverbs and softcuda read agents' memory from other processes
	if i > 0 {
		args = append(args, "--join", c.Nodes[0].Gossip)
	}
	if c.opts.PeerTimeout > 0 {
		args = append(args, "--peer-timeout", c.opts.PeerTimeout.String())
	}
	args = append(args, c.opts.ExtraArgs...)
	args = append(args, n.Args...)
	log, err := os.OpenFile(n.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	if c.opts.Launch != nil {
		args = c.opts.Launch(i, args)
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	if len(c.opts.Env) > 0 || len(n.Env) > 0 {
		cmd.Env = append(append(os.Environ(), c.opts.Env...), n.Env...)
	}
	// Its own process group, so that a terminal's ^C reaches the driver
	// only, and the driver stops the agents in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", n.Name, err)
	}
	n.cmd = cmd
	n.exited = make(chan error, 1)
	go func() { n.exited <- cmd.Wait(); log.Close() }()
	return c.waitHealthy(ctx, n)
}

func (c *Cluster) waitHealthy(ctx context.Context, n *Node) error {
	healthy := c.opts.Healthy
	if healthy == nil {
		healthy = httpHealthy
	}
	for {
		if healthy(ctx, n) == nil {
			return nil
		}
		select {
		case err := <-n.exited:
			n.exited <- err // for Running and Stop
			return fmt.Errorf("%s exited at start (%v): %s", n.Name, err, tail(n.LogFile))
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy: %w: %s", n.Name, ctx.Err(), tail(n.LogFile))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func httpHealthy(ctx context.Context, n *Node) error {
	hc := http.Client{Timeout: time.Second}
	resp, err := hc.Get("http://" + n.Metrics + "/healthz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("healthz: %s", resp.Status)
	}
	_, err = os.Stat(n.Socket)
	return err
}

// WaitMembers waits until each of nodes sees want members.
func (c *Cluster) WaitMembers(ctx context.Context, nodes []*Node, want int) error {
	for _, n := range nodes {
		for {
			got, err := n.members(ctx)
			if err == nil && len(got) == want {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s sees %v, want %d members: %w", n.Name, got, want, ctx.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func (n *Node) members(ctx context.Context) ([]string, error) {
	c, err := n.Client(ctx)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	s, err := c.Status(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range s.Members {
		if m.State == "alive" { // status also lists members gone lately
			out = append(out, m.Node)
		}
	}
	return out, nil
}

// Client connects to the node's engine socket.
func (n *Node) Client(ctx context.Context) (*client.Client, error) {
	return client.Dial(ctx, n.Socket)
}

// Running reports whether the node's process is running.
func (n *Node) Running() bool {
	if n.cmd == nil {
		return false
	}
	select {
	case err := <-n.exited:
		n.exited <- err
		return false
	default:
		return true
	}
}

// Signal sends sig to the node's process (SIGSTOP and SIGCONT pause and
// resume it).
func (n *Node) Signal(sig syscall.Signal) error {
	if !n.Running() {
		return fmt.Errorf("%s is not running", n.Name)
	}
	return n.cmd.Process.Signal(sig)
}

// Stop sends sig and waits for the process to exit, at most d, then kills
// it. SIGTERM makes an agent leave the cluster gracefully; SIGKILL is a
// crash. A paused agent (SIGSTOP) is continued after sig, so that it acts
// on it.
func (n *Node) Stop(sig syscall.Signal, d time.Duration) error {
	if !n.Running() {
		return nil
	}
	n.cmd.Process.Signal(sig)
	n.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case err := <-n.exited:
		n.exited <- err
		var ee *exec.ExitError
		if sig == syscall.SIGKILL && errors.As(err, &ee) {
			return nil
		}
		return err
	case <-time.After(d):
		n.cmd.Process.Kill()
		err := <-n.exited
		n.exited <- err
		return fmt.Errorf("%s did not stop within %v after %v: killed", n.Name, d, sig)
	}
}

// Close stops every agent gracefully (killing those that hang) and
// removes the cluster's directory, leaving nothing behind.
func (c *Cluster) Close() error {
	var errs []error
	for i := len(c.Nodes) - 1; i >= 0; i-- {
		if err := c.Nodes[i].Stop(syscall.SIGTERM, 10*time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, os.RemoveAll(c.Root))
	return errors.Join(errs...)
}

// WaitIndexed waits until n's index has holder holding every block of
// hashes (Lookup's overlap), or ctx ends.
func (n *Node) WaitIndexed(ctx context.Context, holder string, hashes []uint64) error {
	cl, err := n.Client(ctx)
	if err != nil {
		return err
	}
	defer cl.Close()
	held := 0
	for {
		ov, err := cl.Lookup(ctx, hashes)
		if err != nil {
			return fmt.Errorf("%s: lookup: %w", n.Name, err)
		}
		for _, o := range ov {
			if o.Node == holder {
				held = int(o.Blocks)
			}
		}
		if held == len(hashes) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s indexes %d of %s's %d blocks: %w", n.Name, held, holder, len(hashes), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Log returns the last lines of a node's log, for failure messages.
func (n *Node) Log() string { return tail(n.LogFile) }

// FullLog returns the node's whole log, for tests that look for a line in
// it: what an agent logs at start scrolls out of Log as it works.
func (n *Node) FullLog() string {
	b, _ := os.ReadFile(n.LogFile)
	return string(b)
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return strings.Join(lines, "\n")
}
