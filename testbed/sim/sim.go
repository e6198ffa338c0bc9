// Package sim runs the control plane of many kvfabric nodes in one process:
// membership with memberlist's real protocol over an in-memory network
// ([Net]), event replication, and the global block index of every node,
// with no data path. A load generator stores and removes blocks on every
// node at a set rate, and the cluster keeps the ground truth (what every
// live node has published) to check each index against. It measures what
// the control plane costs as the cluster grows: index memory, gossip and
// repair bytes, CPU per event, propagation delay from a store to every
// index, convergence after joins, failures and a partition, and the
// false suspicions memberlist raises under load.
//
// Each node is what an agent runs of the control plane: a
// [membership.Membership] whose Sink applies every origin's events to the
// node's own [index.Index] (the agent's indexSink, less its waiting room
// for nodes past index.MaxNodes, which the simulation never reaches) and
// whose Repairer asks the origin in the same process, as the peer
// transport would ask it over the network.
package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/membership"
)

// ErrInvalidConfig is matched by every configuration error of [Start].
var ErrInvalidConfig = errors.New("sim: invalid config")

// Config configures a [Cluster].
type Config struct {
	// Nodes is the number of nodes started. Required, at least 1.
	Nodes int
	// StoreRate is how many blocks every node stores per second while the
	// load runs. If zero, no load.
	StoreRate float64
	// Lifetime is how long a stored block stays before its node removes
	// it. If zero, blocks stay.
	Lifetime time.Duration
	// Membership holds the timings every node runs with; its zero fields
	// take membership.DefaultConfig's. Name, BindAddr, Seeds, Transport,
	// Sink, Repairer and Logger are the simulation's; a zero Meta is each
	// node's an agent's would be (its peer address, QUIC, a layout digest).
	Membership membership.Config
	// Seed seeds the block hashes. If zero, 1.
	Seed uint64
	// Mode is the index design run: ModeWhole (every node indexes every
	// event, replicated by gossip) or ModeOwned (each hash indexed by
	// Replicas owners, events sent to them directly: index.Publisher and
	// index.Slice). If empty, ModeWhole.
	Mode string
	// Replicas is the owners of each hash in ModeOwned. If zero, 3.
	Replicas int

	// GossipKey, if set, encrypts every node's gossip with this AES key
	// (16, 24 or 32 bytes) and ClusterName labels it, as agents run with
	// --gossip-key-file and --cluster, so that the simulation's bytes
	// compare with theirs. If empty, gossip is plain and unlabelled
	// (Membership's Keys and ClusterName, if set, stay).
	GossipKey   []byte
	ClusterName string

	// KeepInFlight keeps a block past its Lifetime while it is still on
	// its way to an index (stored less than ResetDelays ago and not yet
	// applied by every node live at its store), and removes the next
	// oldest block due or not in its place, as an agent's block set
	// recycles its least recently used block and keeps one its engine
	// uses: the removes keep their rate and no remove chases a store
	// that is being timed. If false, every block goes at its Lifetime.
	KeepInFlight bool
}

// Index designs (Config.Mode).
const (
	ModeWhole = "whole"
	ModeOwned = "owned"
)

// Cluster is a running simulation.
type Cluster struct {
	cfg Config
	net *Net

	mu    sync.Mutex
	nodes map[string]*Node
	order []string // names in start order, dead ones included
	seeds []string
	// truth holds what every live node has published, as an index, so
	// that a node's index is checked against it by Digest and Pairs.
	truth *index.Index
	rng   *rand.Rand

	track   tracker
	suspect atomic.Int64 // suspicions of nodes that were alive and reachable
	failed  atomic.Int64 // members declared failed while alive and reachable

	loadStop chan struct{}
	loadDone chan struct{}
	stopping sync.WaitGroup // nodes closing in the background
}

// Node is one simulated node.
type Node struct {
	Name  string
	M     *membership.Membership
	Index *index.Index
	tr    *Transport

	repairIn, repairOut atomic.Int64
	applied             atomic.Int64
	dead                atomic.Bool

	// ModeOwned: the node's side of the streams, and the bytes its calls
	// to owners and their answers take on the wire.
	pub                 *index.Publisher
	slice               *index.Slice
	directIn, directOut atomic.Int64
	wake                chan struct{}

	// Own blocks, oldest first, with their store times, for removal after
	// Lifetime; the load goroutine alone touches them.
	held []heldBlock
}

type heldBlock struct {
	hash uint64
	at   time.Time
}

// Start starts cfg.Nodes nodes: the first is the seed of all, the rest
// join it at once, in parallel.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	if cfg.Nodes < 1 {
		return nil, fmt.Errorf("%w: Nodes %d, need at least 1", ErrInvalidConfig, cfg.Nodes)
	}
	if cfg.StoreRate < 0 || cfg.Lifetime < 0 {
		return nil, fmt.Errorf("%w: StoreRate %v and Lifetime %v must not be negative", ErrInvalidConfig, cfg.StoreRate, cfg.Lifetime)
	}
	if cfg.Seed == 0 {
		cfg.Seed = 1
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeWhole
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	if cfg.Mode != ModeWhole && cfg.Mode != ModeOwned {
		return nil, fmt.Errorf("%w: Mode %q is not %s or %s", ErrInvalidConfig, cfg.Mode, ModeWhole, ModeOwned)
	}
	if cfg.Replicas < 1 || cfg.Replicas > index.MaxReplicas {
		return nil, fmt.Errorf("%w: Replicas %d not in 1..%d", ErrInvalidConfig, cfg.Replicas, index.MaxReplicas)
	}
	truth, _ := index.New(index.DefaultConfig())
	c := &Cluster{
		cfg:   cfg,
		net:   NewNet(),
		nodes: make(map[string]*Node),
		truth: truth,
		rng:   rand.New(rand.NewPCG(cfg.Seed, 0x5eed)),
	}
	c.track.init()
	if _, err := c.Join(ctx, 1); err != nil {
		return nil, err
	}
	if cfg.Nodes > 1 {
		if _, err := c.Join(ctx, cfg.Nodes-1); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Join starts k more nodes, joining the first node, in parallel, and
// returns their names.
func (c *Cluster) Join(ctx context.Context, k int) ([]string, error) {
	c.mu.Lock()
	names := make([]string, k)
	for i := range names {
		names[i] = fmt.Sprintf("sim-%04d", len(c.order))
		c.order = append(c.order, names[i])
	}
	seeds := slices.Clone(c.seeds)
	c.mu.Unlock()
	nodes := make([]*Node, k)
	errs := make([]error, k)
	var wg sync.WaitGroup
	// Starting a few at a time keeps the first seconds of a large
	// cluster from being one burst of thousands of joins.
	sem := make(chan struct{}, 32)
	for i, name := range names {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			nodes[i], errs[i] = c.startNode(ctx, name, seeds)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, n := range nodes {
			if n != nil {
				n.M.Close()
			}
		}
		return nil, err
	}
	c.mu.Lock()
	for _, n := range nodes {
		c.nodes[n.Name] = n
		c.truth.ID(n.Name)
	}
	if len(c.seeds) == 0 {
		c.seeds = []string{nodes[0].tr.Addr()}
	}
	c.mu.Unlock()
	return names, nil
}

func (c *Cluster) startNode(ctx context.Context, name string, seeds []string) (*Node, error) {
	n := &Node{Name: name}
	n.Index, _ = index.New(index.Config{Shards: 4})
	tr, err := c.net.NewTransport(name)
	if err != nil {
		return nil, err
	}
	n.tr = tr
	mc := c.cfg.Membership
	if mc.Meta == (membership.Meta{}) {
		mc.Meta = agentMeta(tr)
	}
	if len(c.cfg.GossipKey) > 0 {
		mc.Keys = [][]byte{c.cfg.GossipKey}
	}
	if c.cfg.ClusterName != "" {
		mc.ClusterName = c.cfg.ClusterName
	}
	mc.Name = name
	mc.BindAddr = "127.0.0.1"
	mc.BindPort = 0
	mc.Seeds = seeds
	mc.Transport = n.tr
	mc.Sink = &sink{c: c, n: n}
	mc.Repairer = &repairer{c: c, n: n}
	mc.Logger = slog.New(&suspicionCounter{c: c, self: name})
	m, err := membership.Start(ctx, mc)
	if err != nil {
		return nil, fmt.Errorf("sim: start %s: %w", name, err)
	}
	n.M = m
	if c.cfg.Mode == ModeOwned {
		n.pub = index.NewPublisher(name, c.cfg.Replicas, 0)
		n.slice = index.NewSlice(n.Index, func(o string) {
			if n.Index.DropName(o) {
				n.Index.Sweep()
			}
		})
		n.wake = make(chan struct{}, 1)
		go c.ownedLoop(n)
	}
	go func() { // memberlist's news, drained as the agent's memberLoop does
		for {
			select {
			case ev := <-m.Events():
				if ev.Kind == membership.MemberFail && c.reachable(name, ev.Member.Name) {
					c.failed.Add(1)
				}
			case <-m.Stopped():
				return
			}
		}
	}()
	return n, nil
}

// agentPeerPort is the agents' peer transport port, which their metadata
// names.
const agentPeerPort = 7947

// agentMeta is the metadata an agent sends while it has no engine (fabric's
// Agent.meta): its peer address (the gossip host, the peer port), QUIC,
// the digest of its layouts. Every push/pull carries every member's, and
// every alive message its node's, so that their bytes are an agent's.
// Load and incarnation are varints; the digest, 8 bytes, is any value.
func agentMeta(tr *Transport) membership.Meta {
	return membership.Meta{
		PeerAddr:     net.JoinHostPort(tr.ip.String(), strconv.Itoa(agentPeerPort)),
		Transports:   membership.TransportQUIC,
		LayoutDigest: 0x9ae16a3b2f90404f,
	}
}

// live returns the nodes not killed or departed, in start order.
func (c *Cluster) live() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*Node, 0, len(c.nodes))
	for _, name := range c.order {
		if n := c.nodes[name]; n != nil && !n.dead.Load() {
			out = append(out, n)
		}
	}
	return out
}

// Live returns the names of the live nodes, in start order.
func (c *Cluster) Live() []string {
	var out []string
	for _, n := range c.live() {
		out = append(out, n.Name)
	}
	return out
}

// Node returns the live node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := c.nodes[name]; n != nil && !n.dead.Load() {
		return n
	}
	return nil
}

// reachable reports whether a and b, both alive, can talk.
func (c *Cluster) reachable(a, b string) bool {
	c.mu.Lock()
	nb := c.nodes[b]
	c.mu.Unlock()
	if nb == nil || nb.dead.Load() {
		return false
	}
	c.net.mu.RLock()
	defer c.net.mu.RUnlock()
	return c.net.side == nil || c.net.side[a] == c.net.side[b]
}

// Kill stops a node without a leave, as a crash does: the others detect
// the failure. Its blocks leave the ground truth at once.
func (c *Cluster) Kill(name string) error { return c.stop(name, false) }

// Leave makes a node leave gracefully.
func (c *Cluster) Leave(name string) error { return c.stop(name, true) }

func (c *Cluster) stop(name string, leave bool) error {
	c.mu.Lock()
	n := c.nodes[name]
	if n == nil || n.dead.Load() {
		c.mu.Unlock()
		return fmt.Errorf("sim: no live node %q", name)
	}
	n.dead.Store(true) // the load generator stops publishing for it
	c.truth.DropName(name)
	c.truth.Sweep()
	c.mu.Unlock()
	if leave {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := n.M.Leave(ctx)
		c.stopping.Go(func() { n.M.Close() })
		return err
	}
	// A crash: the endpoint goes silent first, so that the goodbye Close
	// says reaches nobody, and the others detect a failure.
	n.tr.Shutdown()
	c.stopping.Go(func() { n.M.Close() })
	return nil
}

// Partition cuts the named nodes off from the rest; Heal joins them.
func (c *Cluster) Partition(names []string) { c.net.Partition(names) }

// Heal removes the partition.
func (c *Cluster) Heal() { c.net.Heal() }

// Close stops the load and every node.
func (c *Cluster) Close() {
	c.StopLoad()
	var wg sync.WaitGroup
	for _, n := range c.live() {
		n.dead.Store(true)
		wg.Go(func() { n.M.Close() })
	}
	wg.Wait()
	c.stopping.Wait()
}

// StartLoad starts storing (and, with a Lifetime, removing) blocks on every
// live node at the configured rate, until StopLoad.
func (c *Cluster) StartLoad() {
	if c.cfg.StoreRate <= 0 || c.loadStop != nil {
		return
	}
	c.loadStop, c.loadDone = make(chan struct{}), make(chan struct{})
	go c.loadLoop(c.loadStop, c.loadDone)
}

// StopLoad stops the load and waits for its last events to be published.
func (c *Cluster) StopLoad() {
	if c.loadStop == nil {
		return
	}
	close(c.loadStop)
	<-c.loadDone
	c.loadStop = nil
}

// loadTick is how often the load generator publishes.
const loadTick = 20 * time.Millisecond

func (c *Cluster) loadLoop(stop, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(loadTick)
	defer t.Stop()
	c.mu.Lock()
	p := newPacer(c.cfg.StoreRate, c.rng.Uint64())
	c.mu.Unlock()
	last := time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			// A tick's time is when it was due: the first may be due
			// before last was read, if this goroutine started late.
			if !now.After(last) {
				continue
			}
			dt := now.Sub(last).Seconds()
			last = now
			for _, n := range c.live() {
				c.step(n, now, p.due(n.Name, dt))
			}
		}
	}
}

// pacer says how many stores each node owes at its rate, tick by tick.
// Each node's stores start at a random point of its first period, as an
// agent's engine's do: were every node's debt to start at zero, they
// would all store in the same tick, a burst of N stores once a period
// that gossip carries one behind the other, where engines spread theirs
// (against 64 agents the simulation's median delay to every index was
// 1.08 to 1.32 times theirs).
type pacer struct {
	rate float64
	rng  *rand.Rand
	owed map[string]float64
}

func newPacer(rate float64, seed uint64) *pacer {
	return &pacer{rate: rate, rng: rand.New(rand.NewPCG(seed, 0x9ace)), owed: map[string]float64{}}
}

// due adds dt seconds of node's rate to its debt and returns the whole
// stores it now owes.
func (p *pacer) due(node string, dt float64) int {
	o, ok := p.owed[node]
	if !ok {
		o = p.rng.Float64()
	}
	o += p.rate * dt
	k := int(o)
	p.owed[node] = o - float64(k)
	return k
}

// step publishes k new stores of node n, and the removes of its blocks
// past their lifetime, and records them in the ground truth.
func (c *Cluster) step(n *Node, now time.Time, k int) {
	var gone []uint64
	if c.cfg.Lifetime > 0 {
		i := 0
		for i < len(n.held) && now.Sub(n.held[i].at) >= c.cfg.Lifetime {
			i++
		}
		if due := i; c.cfg.KeepInFlight && due > 0 {
			// As many removes, of the oldest blocks that every index
			// has; the ones still in flight stay, oldest first.
			var kept []heldBlock
			for i = 0; i < len(n.held) && len(gone) < due; i++ {
				if b := n.held[i]; c.track.inFlight(b.hash) {
					kept = append(kept, b)
				} else {
					gone = append(gone, b.hash)
				}
			}
			n.held = append(kept, n.held[i:]...)
		} else {
			for _, b := range n.held[:i] {
				gone = append(gone, b.hash)
			}
			n.held = n.held[i:]
		}
	}
	fresh := make([]uint64, k)
	c.mu.Lock()
	for i := range fresh {
		fresh[i] = c.rng.Uint64() | 1 // never 0: every hash is a real block
	}
	id, ok := c.truth.Lookup(n.Name)
	c.mu.Unlock()
	if !ok || n.dead.Load() {
		return
	}
	if c.cfg.Mode == ModeOwned {
		c.stepOwned(n, id, now, gone, fresh)
		return
	}
	if len(gone) > 0 {
		if _, err := n.M.Publish(membership.EventRemove, 1, gone...); err == nil {
			c.truth.Remove(id, gone...)
		}
	}
	if k > 0 {
		c.track.published(fresh, len(c.live()), now)
		if _, err := n.M.Publish(membership.EventStore, 1, fresh...); err == nil {
			c.truth.Store(id, fresh...)
			for _, h := range fresh {
				n.held = append(n.held, heldBlock{h, now})
			}
		}
	}
}

// sink applies one node's replicated events to its index, as the agent's
// indexSink does.
type sink struct {
	c *Cluster
	n *Node
}

func (s *sink) Apply(events []membership.Event) {
	if len(events) == 0 {
		return
	}
	id, err := s.n.Index.Node(events[0].Origin, events[0].Incarnation)
	if err != nil {
		return // a stale run's events; the simulation never fills the index
	}
	now := time.Now()
	for _, e := range events {
		if e.Kind == membership.EventStore {
			s.n.Index.Store(id, e.Hash)
			s.c.track.applied(e.Hash, now)
		} else {
			s.n.Index.Remove(id, e.Hash)
		}
	}
	s.n.applied.Add(int64(len(events)))
}

// Drop retires the origin's id and sweeps at once: the simulated indexes
// are small, and the agent's sweeper goroutine would do the same pass.
func (s *sink) Drop(origin string) {
	if s.n.Index.DropName(origin) {
		s.n.Index.Sweep()
	}
}

// repairer asks origins in the same process, counting the bytes the
// answers would take on the wire.
type repairer struct {
	c *Cluster
	n *Node
}

// maxRepairEvents is how many events one range answer carries, as a peer
// transport's frame limit would cut it.
const maxRepairEvents = 8192

func (r *repairer) origin(name string) (*Node, error) {
	if !r.c.reachable(r.n.Name, name) {
		return nil, fmt.Errorf("%w: %s", ErrUnreachable, name)
	}
	o := r.c.Node(name)
	if o == nil {
		return nil, fmt.Errorf("%w: %s", ErrUnreachable, name)
	}
	return o, nil
}

func (r *repairer) Events(ctx context.Context, origin string, inc, from, to uint64) ([]membership.Event, error) {
	o, err := r.origin(origin)
	if err != nil {
		return nil, err
	}
	to = min(to, from+maxRepairEvents-1)
	evs, err := o.M.EventRange(inc, from, to)
	if err != nil || len(evs) == 0 {
		return evs, err
	}
	b, err := membership.AppendBatch(nil, evs)
	if err != nil {
		return nil, err
	}
	r.n.repairIn.Add(int64(len(b)))
	o.repairOut.Add(int64(len(b)))
	return evs, nil
}

// snapshotEntryBytes is an entry's size in a snapshot page: a hash and a
// one-byte block set.
const snapshotEntryBytes = 9

func (r *repairer) Snapshot(ctx context.Context, origin string) (membership.HoldingsSnapshot, error) {
	o, err := r.origin(origin)
	if err != nil {
		return membership.HoldingsSnapshot{}, err
	}
	var s membership.HoldingsSnapshot
	for seq, offset := uint64(0), uint64(0); ; {
		p, err := o.M.SnapshotPage(seq, offset, 1<<16)
		if err != nil {
			return membership.HoldingsSnapshot{}, err
		}
		s.Origin, s.Incarnation, s.Seq = p.Origin, p.Incarnation, p.Seq
		s.Entries = append(s.Entries, p.Entries...)
		if !p.More {
			break
		}
		seq, offset = p.Seq, offset+uint64(len(p.Entries))
	}
	b := int64(len(s.Entries)) * snapshotEntryBytes
	r.n.repairIn.Add(b)
	o.repairOut.Add(b)
	return s, nil
}

// suspicionCounter is a node's log: it counts memberlist's suspicions and
// failure declarations of nodes that were alive and reachable, and
// discards the rest.
type suspicionCounter struct {
	c    *Cluster
	self string
}

func (h *suspicionCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *suspicionCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *suspicionCounter) WithGroup(string) slog.Handler            { return h }
func (h *suspicionCounter) Handle(_ context.Context, r slog.Record) error {
	if rest, ok := strings.CutPrefix(r.Message, "Suspect "); ok {
		name, _, _ := strings.Cut(rest, " ")
		if h.c.reachable(h.self, name) {
			h.c.suspect.Add(1)
		}
	}
	return nil
}

// cpuSeconds is the process's user and system CPU time so far.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
