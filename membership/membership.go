package membership

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrClosed is returned by calls on a closed Membership.
var ErrClosed = errors.New("membership: closed")

// ErrNoKeyring is returned by key rotation calls when gossip is not
// encrypted.
var ErrNoKeyring = errors.New("membership: gossip is not encrypted")

// Membership is one node's view of the cluster and its end of event
// replication. All methods are safe for concurrent use.
type Membership struct {
	cfg   Config
	log   *slog.Logger
	ml    *memberlist.Memberlist
	queue *memberlist.TransmitLimitedQueue
	keys  *memberlist.Keyring

	events chan MemberEvent
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
	once   sync.Once

	mu        sync.Mutex
	meta      []byte
	seq       uint64
	ownLog    []Event // ring: event s at (s-1) % len
	own       map[Entry]uint32
	unflushed []Event
	origins   map[string]*originState
	alive     map[string]bool
	// members are copies of the other members, taken in memberlist's
	// callbacks: memberlist's own Node values change under its lock, so
	// they are never read outside it.
	members map[string]Member
	// departed are members that left or failed, until they come back or
	// departedKept passes, for operators asking who is missing.
	departed map[string]DepartedMember
	self     netip.AddrPort
	// leaving holds the nodes that said bye: memberlist reports a leave and
	// a failure through the same callback, without saying which.
	leaving map[string]bool

	metrics counters
	snaps   snapshotCache // snapshots being paged to peers
	// joined is set once a seed answered or another node joined this one;
	// lastJoinErr is the latest failed join (under joinMu).
	joined      atomic.Bool
	joinMu      sync.Mutex
	lastJoinErr error
	// merged is set once a peer's push/pull state was taken, synced once
	// the node first caught up with it (see Synced).
	merged, synced atomic.Bool
	// conflicts carries members seen under this node's name, from the
	// conflict delegate to settleConflict; conflict is set once, when this
	// node must yield, and conflicted closed then. See conflict.go.
	conflicts  chan Member
	conflictMu sync.Mutex
	conflict   error
	conflicted chan struct{}
	// dropBatch, if set (by tests), drops own batches before they are
	// queued, to exercise repair.
	dropBatch atomic.Pointer[func(firstSeq uint64) bool]
	// counting is the transport memberlist runs on, when membership made
	// it (Config.Transport nil): it counts gossip's bytes.
	counting *countingTransport
}

type counters struct {
	published, applied                            atomic.Uint64
	batchesSent, batchesReceived, batchesRelayed  atomic.Uint64
	badMessages, rangeRepairs, snapshotRepairs    atomic.Uint64
	repairFailures, restarts, memberEventsDropped atomic.Uint64
	joinAttempts, joinFailures                    atomic.Uint64
	reconciled                                    atomic.Uint64
	resyncs                                       atomic.Uint64
	joinFailuresBy                                [numJoinReasons]atomic.Uint64
}

// MemberEventKind says what happened to a member.
type MemberEventKind uint8

// Member event kinds.
const (
	MemberJoin   MemberEventKind = iota + 1 // joined, or came back
	MemberUpdate                            // changed its metadata
	MemberLeave                             // left gracefully
	MemberFail                              // declared dead
)

func (k MemberEventKind) String() string {
	switch k {
	case MemberJoin:
		return "join"
	case MemberUpdate:
		return "update"
	case MemberLeave:
		return "leave"
	case MemberFail:
		return "fail"
	}
	return fmt.Sprintf("MemberEventKind(%d)", uint8(k))
}

// Member is a node of the cluster.
type Member struct {
	Name string
	// Addr is the node's memberlist address.
	Addr netip.AddrPort
	// Meta is the node's metadata; zero if it could not be decoded (MetaErr
	// says why).
	Meta    Meta
	MetaErr error
}

// MemberEvent is a change of membership, delivered on [Membership.Events].
type MemberEvent struct {
	Kind   MemberEventKind
	Member Member
}

// Start creates the node's memberlist, joins the configured seeds and
// starts gossiping. A failed join is not returned: it is logged with its
// reason (a warning while the node is alone), counted, and retried with a
// backoff up to RejoinInterval; [Membership.Joined] says when it worked.
// ctx bounds the initial join.
func Start(ctx context.Context, cfg Config) (*Membership, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.Meta.Incarnation = cfg.Incarnation
	meta, err := cfg.Meta.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("membership: node %s: %w", cfg.Name, err)
	}
	m := &Membership{
		cfg:      cfg,
		log:      cfg.Logger.With("node", cfg.Name),
		events:   make(chan MemberEvent, cfg.MemberEvents),
		meta:     meta,
		ownLog:   make([]Event, cfg.LogSize),
		own:      make(map[Entry]uint32),
		origins:  make(map[string]*originState),
		alive:    make(map[string]bool),
		members:  make(map[string]Member),
		departed: make(map[string]DepartedMember),
		leaving:  make(map[string]bool),

		conflicts:  make(chan Member, 1),
		conflicted: make(chan struct{}),
	}
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = cfg.AdvertisePort
	mc.Label = cfg.ClusterName
	mc.Transport = cfg.Transport
	mc.GossipInterval = cfg.GossipInterval
	mc.GossipNodes = cfg.GossipNodes
	mc.ProbeInterval = cfg.ProbeInterval
	mc.ProbeTimeout = cfg.ProbeTimeout
	mc.SuspicionMult = cfg.SuspicionMult
	mc.PushPullInterval = cfg.PushPullInterval
	mc.RetransmitMult = cfg.RetransmitMult
	mc.TCPTimeout = max(time.Second, 2*cfg.ProbeTimeout)
	mc.DeadNodeReclaimTime = cfg.DeadNameReclaim
	mc.DelegateProtocolVersion = wireVersion
	mc.DelegateProtocolMin = wireVersion
	mc.DelegateProtocolMax = wireVersion
	if len(cfg.Keys) > 0 {
		kr, err := memberlist.NewKeyring(cfg.Keys[1:], cfg.Keys[0])
		if err != nil {
			return nil, fmt.Errorf("%w: Keys: %v", ErrInvalidConfig, err)
		}
		mc.Keyring = kr
		m.keys = kr
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	// One logger for memberlist and its transport, so that a line
	// repeated by either is suppressed in one place.
	mc.Logger = log.New(newLogWriter(m.log, cfg.LogRepeatWindow), "", 0)
	if cfg.Transport == nil {
		// memberlist's own transport, counting the bytes gossip costs;
		// opened last, after every check that may refuse the config, so
		// that a refusal leaves no socket bound.
		ct, port, err := newCountingTransport(cfg.BindAddr, cfg.BindPort, mc.Logger)
		if err != nil {
			return nil, fmt.Errorf("membership: node %s: start memberlist on %s:%d: %w", cfg.Name, cfg.BindAddr, cfg.BindPort, err)
		}
		if cfg.BindPort == 0 {
			mc.BindPort, mc.AdvertisePort = port, port
		}
		mc.Transport, m.counting = ct, ct
	}
	mc.Delegate = (*delegate)(m)
	mc.Events = (*eventDelegate)(m)
	mc.Conflict = (*conflictDelegate)(m)
	m.queue = &memberlist.TransmitLimitedQueue{NumNodes: m.numMembers, RetransmitMult: cfg.EventRetransmitMult}
	ml, err := memberlist.Create(mc)
	if err != nil {
		if m.counting != nil {
			m.counting.Shutdown()
		}
		return nil, fmt.Errorf("membership: node %s: start memberlist on %s:%d: %w", cfg.Name, cfg.BindAddr, cfg.BindPort, err)
	}
	local := ml.LocalNode()
	a, _ := netip.AddrFromSlice(local.Addr)
	m.mu.Lock()
	m.ml = ml
	m.self = netip.AddrPortFrom(a.Unmap(), local.Port)
	m.mu.Unlock()

	failed := false
	if len(cfg.Seeds) > 0 {
		joined := make(chan struct{})
		go func() {
			defer close(joined)
			failed = m.rejoin()
		}()
		select {
		case <-joined:
		case <-ctx.Done():
			ml.Shutdown()
			<-joined
			return nil, fmt.Errorf("membership: node %s: join: %w", cfg.Name, ctx.Err())
		}
	}
	// The join's state exchange shows any member already running under
	// this name. Stop without a leave: a leave names the other node too.
	if err := m.refuseTakenName(); err != nil {
		ml.Shutdown()
		return nil, err
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	// Not in wg: it stops the node, which waits for wg.
	go m.watchConflicts(loopCtx)
	m.every(loopCtx, cfg.FlushInterval, func(context.Context) { m.flush() })
	m.every(loopCtx, cfg.RepairInterval, m.repairGaps)
	m.wg.Add(1)
	go m.joinLoop(loopCtx, failed)
	if len(cfg.Seeds) > 0 {
		m.wg.Add(1)
		go m.settle(loopCtx)
	}
	return m, nil
}

func (m *Membership) numMembers() int {
	m.mu.Lock()
	ml := m.ml
	m.mu.Unlock()
	if ml == nil {
		return 1
	}
	return ml.NumMembers()
}

func (m *Membership) every(ctx context.Context, d time.Duration, f func(context.Context)) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		t := time.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				f(ctx)
			}
		}
	}()
}

// settle repeats the full state exchange with the seeds a few times in the
// first seconds after start. When many nodes start at once, each learns from
// its join only the nodes that joined before it, and news of later ones
// travels by gossip, which reaches a given node with high probability but
// not always; the seeds, which every joiner contacted, know them all, so a
// few more exchanges with them close what gossip missed without waiting for
// the periodic push/pull.
func (m *Membership) settle(ctx context.Context) {
	defer m.wg.Done()
	for d := settleFirst; d <= settleLast; d *= 2 {
		// Jitter: nodes started together must not all call the seeds at
		// the same instant.
		wait := d/2 + rand.N(d)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		if _, err := m.ml.Join(m.cfg.Seeds); err != nil {
			m.log.Debug("membership: settling with seeds", "err", err)
		}
	}
}

// The settle exchanges run about 250 ms, then 500 ms, 1 s and 2 s after the
// previous one, each jittered by ±50 %.
const (
	settleFirst = 250 * time.Millisecond
	settleLast  = 2 * time.Second
)

// Events returns the channel of membership changes. It is never closed;
// when full, events are dropped and counted in Metrics.
func (m *Membership) Events() <-chan MemberEvent { return m.events }

// Name returns the node's name.
func (m *Membership) Name() string { return m.cfg.Name }

// Incarnation returns this run's event incarnation.
func (m *Membership) Incarnation() uint64 { return m.cfg.Incarnation }

// Addr returns the address memberlist listens on (useful with port 0).
func (m *Membership) Addr() netip.AddrPort {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.self
}

// Members returns the members that are alive or suspected, this node
// included, in no particular order.
func (m *Membership) Members() []Member {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Member, 0, len(m.members)+1)
	self := Member{Name: m.cfg.Name, Addr: m.self}
	self.MetaErr = self.Meta.UnmarshalBinary(m.meta)
	out = append(out, self)
	for _, mb := range m.members {
		out = append(out, mb)
	}
	return out
}

// DepartedMember is a member that left or failed.
type DepartedMember struct {
	Member
	// Kind is MemberLeave or MemberFail.
	Kind MemberEventKind
	// Since is when this node saw it go.
	Since time.Time
}

// departedKept is how long a departed member is listed; maxDeparted bounds
// how many are (pod churn would otherwise grow the list without end).
const (
	departedKept = 10 * time.Minute
	maxDeparted  = 1024
)

// Departed returns the members that left or failed within departedKept and
// have not come back, oldest first.
func (m *Membership) Departed() []DepartedMember {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pruneDepartedLocked(time.Now())
	out := make([]DepartedMember, 0, len(m.departed))
	for _, d := range m.departed {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DepartedMember) int { return a.Since.Compare(b.Since) })
	return out
}

func (m *Membership) noteDepartedLocked(mb Member, kind MemberEventKind, now time.Time) {
	m.pruneDepartedLocked(now)
	if len(m.departed) >= maxDeparted {
		oldest := ""
		for name, d := range m.departed {
			if oldest == "" || d.Since.Before(m.departed[oldest].Since) {
				oldest = name
			}
		}
		delete(m.departed, oldest)
	}
	m.departed[mb.Name] = DepartedMember{Member: mb, Kind: kind, Since: now}
}

func (m *Membership) pruneDepartedLocked(now time.Time) {
	for name, d := range m.departed {
		if now.Sub(d.Since) > departedKept {
			delete(m.departed, name)
		}
	}
}

// Member returns the member called name, this node included, and whether
// it is a current member.
func (m *Membership) Member(name string) (Member, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if name == m.cfg.Name {
		self := Member{Name: m.cfg.Name, Addr: m.self}
		self.MetaErr = self.Meta.UnmarshalBinary(m.meta)
		return self, true
	}
	mb, ok := m.members[name]
	return mb, ok
}

// NumMembers returns the number of alive members, this node included.
func (m *Membership) NumMembers() int { return m.ml.NumMembers() }

func toMember(n *memberlist.Node) Member {
	a, _ := netip.AddrFromSlice(n.Addr)
	mb := Member{Name: n.Name, Addr: netip.AddrPortFrom(a.Unmap(), n.Port)}
	mb.MetaErr = mb.Meta.UnmarshalBinary(n.Meta)
	return mb
}

// SetMeta replaces the node's metadata and gossips it; ctx bounds the wait
// for the update to be sent (one second if ctx has no deadline). The
// incarnation is this run's whatever meta says.
func (m *Membership) SetMeta(ctx context.Context, meta Meta) error {
	if m.closed.Load() {
		return ErrClosed
	}
	meta.Incarnation = m.cfg.Incarnation
	b, err := meta.MarshalBinary()
	if err != nil {
		return err
	}
	m.mu.Lock()
	m.meta = b
	m.mu.Unlock()
	timeout := time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	return m.ml.UpdateNode(timeout)
}

// InstallKey adds a gossip key without using it to encrypt yet. Rotation:
// install the new key on every node, then UseKey on every node, then
// RemoveKey the old one.
func (m *Membership) InstallKey(key []byte) error {
	if m.keys == nil {
		return ErrNoKeyring
	}
	return m.keys.AddKey(key)
}

// UseKey makes an installed key the one used to encrypt.
func (m *Membership) UseKey(key []byte) error {
	if m.keys == nil {
		return ErrNoKeyring
	}
	return m.keys.UseKey(key)
}

// Keys returns the installed keys, the primary first.
func (m *Membership) Keys() ([][]byte, error) {
	if m.keys == nil {
		return nil, ErrNoKeyring
	}
	return m.keys.GetKeys(), nil
}

// RemoveKey removes a key that is not the primary.
func (m *Membership) RemoveKey(key []byte) error {
	if m.keys == nil {
		return ErrNoKeyring
	}
	return m.keys.RemoveKey(key)
}

// Leave announces a graceful departure and waits, within ctx (one second
// without a deadline), for the announcement to go out. Other nodes drop this
// node's entries at once rather than after failure detection.
func (m *Membership) Leave(ctx context.Context) error {
	if m.closed.Load() {
		return ErrClosed
	}
	timeout := time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	m.sayBye()
	return m.ml.Leave(timeout)
}

// sayBye tells every member, best effort, that this node is leaving, so that
// they report a leave rather than a failure. It addresses them from this
// node's own copy of the member list: the nodes memberlist.Members returns
// are memberlist's live records, which its gossip rewrites in place (a
// member back at a new address) while they are read.
func (m *Membership) sayBye() {
	bye := appendBye(nil, m.cfg.Name, m.cfg.Incarnation)
	for _, mb := range m.Members() {
		if mb.Name == m.cfg.Name || !mb.Addr.IsValid() {
			continue
		}
		// The protocol versions memberlist speaks, so that the message
		// goes as to any member (with its checksum).
		to := &memberlist.Node{Name: mb.Name, Addr: mb.Addr.Addr().AsSlice(), Port: mb.Addr.Port(),
			PMin: memberlist.ProtocolVersionMin, PMax: memberlist.ProtocolVersionMax, PCur: memberlist.ProtocolVersionMax}
		m.ml.SendBestEffort(to, bye)
	}
}

// Close leaves the cluster gracefully (bounded to one second) and stops
// everything. It is safe to call more than once.
func (m *Membership) Close() error {
	return m.shutdown(true)
}

// shutdown stops the node, announcing the departure if leave; without it,
// the others find the node dead as if it had crashed.
func (m *Membership) shutdown(leave bool) error {
	var err error
	m.once.Do(func() {
		if leave && m.Err() == nil {
			m.sayBye()
			if lerr := m.ml.Leave(time.Second); lerr != nil {
				m.log.Warn("membership: leave", "err", lerr)
			}
		}
		m.closed.Store(true)
		if m.cancel != nil {
			m.cancel()
		}
		m.wg.Wait()
		err = m.ml.Shutdown()
	})
	return err
}

// Metrics is a snapshot of a node's membership and replication counters.
type Metrics struct {
	Members             int
	EventsPublished     uint64
	EventsApplied       uint64 // others' events applied to the Sink
	EventsReconciled    uint64 // own events published by Reconcile
	BatchesSent         uint64
	BatchesReceived     uint64
	BatchesRelayed      uint64
	BadMessages         uint64 // undecodable batches or state from peers
	RangeRepairs        uint64 // answers of the origin's log applied; a long gap takes several
	SnapshotRepairs     uint64
	RepairFailures      uint64
	Restarts            uint64 // origins seen with a new incarnation
	Gaps                int    // origins with events known but not applied
	MemberEventsDropped uint64
	JoinAttempts        uint64 // joins of one seed tried
	JoinFailures        uint64
	// JoinFailuresBy counts JoinFailures by reason.
	JoinFailuresBy   map[JoinReason]uint64
	Joined           bool // see Membership.Joined
	QueuedBroadcasts int

	// Resyncs counts origins repaired from scratch because the Sink lost
	// events it had been handed (Resync).
	Resyncs uint64

	// GossipBytesIn and GossipBytesOut are the bytes memberlist received
	// and sent (packets' payloads, streams' bytes: probes, gossip,
	// push/pull, event batches), apart from the peer transport's; zero
	// where Config.Transport was given (the transport counts).
	GossipBytesIn, GossipBytesOut uint64
}

// Metrics returns a snapshot of the counters.
func (m *Membership) Metrics() Metrics {
	c := &m.metrics
	mt := Metrics{
		Members:             m.ml.NumMembers(),
		EventsPublished:     c.published.Load(),
		EventsApplied:       c.applied.Load(),
		EventsReconciled:    c.reconciled.Load(),
		BatchesSent:         c.batchesSent.Load(),
		BatchesReceived:     c.batchesReceived.Load(),
		BatchesRelayed:      c.batchesRelayed.Load(),
		BadMessages:         c.badMessages.Load(),
		RangeRepairs:        c.rangeRepairs.Load(),
		SnapshotRepairs:     c.snapshotRepairs.Load(),
		RepairFailures:      c.repairFailures.Load(),
		Restarts:            c.restarts.Load(),
		Resyncs:             c.resyncs.Load(),
		MemberEventsDropped: c.memberEventsDropped.Load(),
		JoinAttempts:        c.joinAttempts.Load(),
		JoinFailures:        c.joinFailures.Load(),
		QueuedBroadcasts:    m.queue.NumQueued(),
		JoinFailuresBy:      make(map[JoinReason]uint64, numJoinReasons-1),
	}
	for r := JoinUnreachable; r < numJoinReasons; r++ {
		mt.JoinFailuresBy[r] = c.joinFailuresBy[r].Load()
	}
	mt.Joined, _ = m.Joined()
	if m.counting != nil {
		mt.GossipBytesIn, mt.GossipBytesOut = m.counting.bytes()
	}
	m.mu.Lock()
	for _, st := range m.origins {
		if !st.gapSince.IsZero() {
			mt.Gaps++
		}
	}
	m.mu.Unlock()
	return mt
}

// delegate is memberlist's Delegate; its methods are called from
// memberlist's goroutines and must not block.
type delegate Membership

func (d *delegate) NodeMeta(limit int) []byte {
	m := (*Membership)(d)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.meta // checked against the limit when set
}

func (d *delegate) NotifyMsg(b []byte) {
	m := (*Membership)(d)
	switch {
	case len(b) >= 2 && b[0] == wireVersion && b[1] == msgBatch:
		m.receiveBatch(b)
	case len(b) >= 2 && b[0] == wireVersion && b[1] == msgBye:
		name, _, err := decodeBye(b)
		if err != nil {
			m.metrics.badMessages.Add(1)
			return
		}
		m.mu.Lock()
		if name != m.cfg.Name && m.alive[name] {
			m.leaving[name] = true
		}
		m.mu.Unlock()
	default:
		m.metrics.badMessages.Add(1)
	}
}

func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.queue.GetBroadcasts(overhead, limit)
}

func (d *delegate) LocalState(join bool) []byte {
	return appendState(nil, (*Membership)(d).localMarks())
}

func (d *delegate) MergeRemoteState(buf []byte, join bool) {
	m := (*Membership)(d)
	marks, err := decodeState(buf)
	if err != nil {
		m.metrics.badMessages.Add(1)
		m.log.Debug("membership: dropping bad push/pull state", "err", err)
		return
	}
	m.mergeMarks(marks)
}

// eventDelegate is memberlist's EventDelegate.
type eventDelegate Membership

func (d *eventDelegate) NotifyJoin(n *memberlist.Node) { (*Membership)(d).memberChanged(n, MemberJoin) }
func (d *eventDelegate) NotifyUpdate(n *memberlist.Node) {
	(*Membership)(d).memberChanged(n, MemberUpdate)
}

// NotifyLeave is called for leaves and failures alike (memberlist does not
// set n.State here); memberChanged tells them apart by the bye.
func (d *eventDelegate) NotifyLeave(n *memberlist.Node) {
	(*Membership)(d).memberChanged(n, MemberFail)
}

func (m *Membership) memberChanged(n *memberlist.Node, kind MemberEventKind) {
	if n.Name == m.cfg.Name {
		return
	}
	mb := toMember(n)
	if mb.MetaErr != nil {
		m.log.Warn("membership: bad metadata from peer", "peer", n.Name, "err", mb.MetaErr)
	}
	m.mu.Lock()
	switch kind {
	case MemberJoin, MemberUpdate:
		m.joined.Store(true) // another node reached us: we are in a cluster
		m.alive[n.Name] = true
		m.members[n.Name] = mb
		delete(m.departed, n.Name)
		delete(m.leaving, n.Name)
		if mb.MetaErr == nil {
			// A new incarnation in the metadata means the node restarted:
			// drop its old entries now rather than at its first event.
			if st := m.origins[n.Name]; st != nil && mb.Meta.Incarnation > st.inc {
				m.originLocked(n.Name, mb.Meta.Incarnation)
			}
		}
	case MemberLeave, MemberFail:
		if m.leaving[n.Name] {
			kind = MemberLeave
		}
		delete(m.leaving, n.Name)
		delete(m.alive, n.Name)
		delete(m.members, n.Name)
		delete(m.origins, n.Name)
		m.noteDepartedLocked(mb, kind, time.Now())
		if m.cfg.Sink != nil {
			m.cfg.Sink.Drop(n.Name)
		}
	}
	m.mu.Unlock()
	select {
	case m.events <- MemberEvent{Kind: kind, Member: mb}:
	default:
		m.metrics.memberEventsDropped.Add(1)
	}
}
