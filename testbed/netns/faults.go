package netns

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Partition cuts every node of a off from every node of b, both ways,
// silently (packets are dropped on the bridge, as a failed switch port
// drops them: senders see no error). Nodes in neither set keep reaching
// both. A node in both sets is refused.
func (c *Cluster) Partition(a, b []int) error {
	if err := c.checkNodes(a, b); err != nil {
		return err
	}
	for _, x := range a {
		for _, y := range b {
			if x == y {
				return fmt.Errorf("netns: node %d is on both sides of the partition", x)
			}
		}
	}
	for _, side := range [2][2][]int{{a, b}, {b, a}} {
		for _, x := range side[0] {
			var lines []string
			for _, y := range side[1] {
				lines = append(lines, fmt.Sprintf("neigh replace %s lladdr %s dev eth0 nud permanent", addr(y), blackholeMAC))
			}
			if err := batch(c.ns[x], lines); err != nil {
				return err
			}
			c.mark(fmt.Sprintf("partition %d", x))
		}
	}
	return nil
}

// HealAll removes every partition: each namespace forgets its neighbour
// entries and resolves its peers again.
func (c *Cluster) HealAll() error {
	var errs []error
	for i, ns := range c.ns {
		if !c.marked(fmt.Sprintf("partition %d", i)) {
			continue
		}
		if err := run("ip", "-n", ns, "neigh", "flush", "dev", "eth0", "nud", "permanent"); err != nil {
			errs = append(errs, err)
			continue
		}
		c.unmark(fmt.Sprintf("partition %d", i))
	}
	return errors.Join(errs...)
}

// Kill crashes node i (SIGKILL) and waits for it to exit.
func (c *Cluster) Kill(i int) error {
	if err := c.checkNodes([]int{i}); err != nil {
		return err
	}
	return c.Nodes[i].Stop(syscall.SIGKILL, 10*time.Second)
}

// Restart starts node i again (after Kill or Stop) under the same name,
// address and certificate, and waits until it serves.
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.checkNodes([]int{i}); err != nil {
		return err
	}
	if c.Nodes[i].Running() {
		return fmt.Errorf("netns: %s is running; stop it first", c.name(i))
	}
	return c.StartNode(ctx, i)
}

// Pause stops node i's process (SIGSTOP): it holds its sockets and
// answers nothing, as a node in a long GC pause or swapped out does.
func (c *Cluster) Pause(i int) error {
	if err := c.checkNodes([]int{i}); err != nil {
		return err
	}
	return c.Nodes[i].Signal(syscall.SIGSTOP)
}

// Resume continues a paused node (SIGCONT).
func (c *Cluster) Resume(i int) error {
	if err := c.checkNodes([]int{i}); err != nil {
		return err
	}
	return c.Nodes[i].Signal(syscall.SIGCONT)
}

// Link is what [Cluster.Shape] puts on a node's outgoing traffic. The
// zero Link changes nothing.
type Link struct {
	// Delay is added to every packet. If zero, none. Needs netem.
	Delay time.Duration
	// Jitter varies Delay by up to this much. If zero, none. Needs netem.
	Jitter time.Duration
	// Loss is the fraction of packets dropped, 0..1. If zero, none. Needs
	// netem.
	Loss float64
	// RateBitsPerSec caps the link. If zero, no cap. Uses tbf.
	RateBitsPerSec uint64
}

// Shape puts l on node i's link (its eth0, so its outgoing packets),
// replacing what was there. Delay, jitter and loss need the kernel's
// netem qdisc and a rate the tbf qdisc; where the kernel lacks the one
// needed, Shape changes nothing and returns an error matching
// ErrNotSupported that names it.
func (c *Cluster) Shape(i int, l Link) error {
	if err := c.checkNodes([]int{i}); err != nil {
		return err
	}
	if l.Loss < 0 || l.Loss > 1 || l.Delay < 0 || l.Jitter < 0 {
		return fmt.Errorf("netns: link %+v: loss must be 0..1 and times not negative", l)
	}
	if l.Jitter > 0 && l.Delay == 0 {
		return fmt.Errorf("netns: link %+v: jitter without a delay", l)
	}
	if err := c.ClearShape(i); err != nil {
		return err
	}
	ns := c.ns[i]
	netem := l.Delay > 0 || l.Loss > 0
	tbf := []string{"tbf", "rate", strconv.FormatUint(l.RateBitsPerSec, 10) + "bit",
		// A burst of at least one full frame, else tbf drops every packet.
		"burst", strconv.FormatUint(max(l.RateBitsPerSec/8/100, 16*1024), 10), "latency", "500ms"}
	switch {
	case netem:
		args := []string{"-n", ns, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "netem"}
		if l.Delay > 0 {
			args = append(args, "delay", usec(l.Delay))
			if l.Jitter > 0 {
				args = append(args, usec(l.Jitter))
			}
		}
		if l.Loss > 0 {
			args = append(args, "loss", strconv.FormatFloat(100*l.Loss, 'f', -1, 64)+"%")
		}
		if err := tcRun("netem", args...); err != nil {
			return err
		}
		if l.RateBitsPerSec > 0 {
			if err := tcRun("tbf", append([]string{"-n", ns, "qdisc", "add", "dev", "eth0", "parent", "1:1", "handle", "10:"}, tbf...)...); err != nil {
				c.ClearShape(i)
				return err
			}
		}
	case l.RateBitsPerSec > 0:
		if err := tcRun("tbf", append([]string{"-n", ns, "qdisc", "add", "dev", "eth0", "root"}, tbf...)...); err != nil {
			return err
		}
	default:
		return nil
	}
	c.mark(fmt.Sprintf("shape %d", i))
	return nil
}

// ClearShape removes what Shape put on node i's link.
func (c *Cluster) ClearShape(i int) error {
	if err := c.checkNodes([]int{i}); err != nil {
		return err
	}
	out, err := exec.Command("ip", "netns", "exec", c.ns[i], "tc", "qdisc", "del", "dev", "eth0", "root").CombinedOutput()
	// Deleting the default qdisc is refused with one of these; there was
	// nothing to clear.
	if err != nil && !strings.Contains(string(out), "Cannot delete qdisc with handle of zero") &&
		!strings.Contains(string(out), "RTNETLINK answers: No such file or directory") {
		return fmt.Errorf("netns: tc qdisc del on %s: %w: %s", c.name(i), err, strings.TrimSpace(string(out)))
	}
	c.unmark(fmt.Sprintf("shape %d", i))
	return nil
}

// Qdiscs returns tc's listing of node i's link, to check what is on it.
func (c *Cluster) Qdiscs(i int) (string, error) {
	out, err := exec.Command("ip", "netns", "exec", c.ns[i], "tc", "qdisc", "show", "dev", "eth0").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("netns: tc qdisc show: %w: %s", err, out)
	}
	return string(out), nil
}

func tcRun(kind string, args ...string) error {
	// tc's -n is not ip's: run it through ip netns exec.
	ns := args[1]
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "tc"}, args[2:]...)...).CombinedOutput()
	if err == nil {
		return nil
	}
	if strings.Contains(string(out), "Specified qdisc kind is unknown") || strings.Contains(string(out), "Unknown qdisc") {
		return fmt.Errorf("%w: the kernel has no %s qdisc (sch_%s): tc said %q", ErrNotSupported, kind, kind, strings.TrimSpace(string(out)))
	}
	return fmt.Errorf("netns: tc %s: %w: %s", strings.Join(args[2:], " "), err, strings.TrimSpace(string(out)))
}

func usec(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) + "us" }

// BlackholeUDP silently drops the UDP that node i sends to or from port
// (0: all UDP), until [Cluster.RestoreUDP]. With the agents' peer port
// (7947) it cuts QUIC, peer control and data, and leaves gossip (7946)
// alone. Policy routing does it (ip rule ipproto/sport/dport), so no
// packet filter is needed.
func (c *Cluster) BlackholeUDP(i, port int) error { return c.blackhole("udp", udpTable, i, port) }

// RestoreUDP undoes BlackholeUDP on node i.
func (c *Cluster) RestoreUDP(i int) error { return c.restore("udp", udpTable, i) }

// BlackholeTCP is BlackholeUDP for TCP: with an agent's --lane-addr port it
// cuts the TCP data lane and leaves QUIC and gossip alone. A connection
// being opened sees no answer at all (no reset), as behind a firewall that
// drops.
func (c *Cluster) BlackholeTCP(i, port int) error { return c.blackhole("tcp", tcpTable, i, port) }

// RestoreTCP undoes BlackholeTCP on node i.
func (c *Cluster) RestoreTCP(i int) error { return c.restore("tcp", tcpTable, i) }

func (c *Cluster) blackhole(proto, table string, i, port int) error {
	if err := c.checkNodes([]int{i}); err != nil {
		return err
	}
	if port < 0 || port > 65535 {
		return fmt.Errorf("netns: port %d: want 0..65535", port)
	}
	if c.marked(fmt.Sprintf("%s %d", proto, i)) {
		return fmt.Errorf("netns: %s of %s is already blackholed", strings.ToUpper(proto), c.name(i))
	}
	lines := []string{
		fmt.Sprintf("neigh replace %s lladdr %s dev eth0 nud permanent", blackholeGW, blackholeMAC),
		fmt.Sprintf("route replace %s0/24 via %s dev eth0 table %s", subnet, blackholeGW, table),
	}
	if port == 0 {
		lines = append(lines, fmt.Sprintf("rule add ipproto %s lookup %s", proto, table))
	} else {
		lines = append(lines, fmt.Sprintf("rule add ipproto %s dport %d lookup %s", proto, port, table),
			fmt.Sprintf("rule add ipproto %s sport %d lookup %s", proto, port, table))
	}
	if err := batch(c.ns[i], lines); err != nil {
		return err
	}
	c.mark(fmt.Sprintf("%s %d", proto, i))
	return nil
}

func (c *Cluster) restore(proto, table string, i int) error {
	if err := c.checkNodes([]int{i}); err != nil {
		return err
	}
	if !c.marked(fmt.Sprintf("%s %d", proto, i)) {
		return nil
	}
	// Deleting the table's route leaves the rules pointing at an empty
	// table, which falls through to main; then the rules go.
	out, err := exec.Command("ip", "-n", c.ns[i], "rule", "show", "table", table).Output()
	if err != nil {
		return fmt.Errorf("netns: ip rule show: %w", err)
	}
	lines := []string{"route flush table " + table}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pref, _, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		lines = append(lines, "rule del pref "+strings.TrimSpace(pref))
	}
	if err := batch(c.ns[i], lines); err != nil {
		return err
	}
	c.unmark(fmt.Sprintf("%s %d", proto, i))
	return nil
}

func (c *Cluster) checkNodes(sets ...[]int) error {
	for _, s := range sets {
		for _, i := range s {
			if i < 0 || i >= len(c.ns) {
				return fmt.Errorf("netns: node index %d: the cluster has %d nodes", i, len(c.ns))
			}
		}
	}
	return nil
}

func (c *Cluster) mark(k string) {
	c.mu.Lock()
	c.faults[k] = true
	c.mu.Unlock()
}

func (c *Cluster) unmark(k string) {
	c.mu.Lock()
	delete(c.faults, k)
	c.mu.Unlock()
}

func (c *Cluster) marked(k string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.faults[k]
}

// name is node i's name for messages.
func (c *Cluster) name(i int) string {
	if c.Cluster != nil && i < len(c.Nodes) {
		return c.Nodes[i].Name
	}
	return c.ns[i]
}
