package membership

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"time"

	"github.com/hashicorp/memberlist"
)

// MaxClusterName bounds Config.ClusterName: memberlist's label, which
// carries its length in a byte.
const MaxClusterName = memberlist.LabelMaxSize

// ErrInvalidConfig is matched by every configuration error of [Start].
var ErrInvalidConfig = errors.New("membership: invalid config")

// Config configures a [Membership]. Start from [DefaultConfig] or
// [DefaultLocalConfig]; a zero duration or count takes the default named in
// its comment.
type Config struct {
	// Name is the node's name, unique in the cluster. Required.
	Name string
	// BindAddr is the IP address memberlist listens on (UDP and TCP). If
	// empty, 0.0.0.0.
	BindAddr string
	// BindPort is the port to listen on; zero picks a free one.
	BindPort int
	// AdvertiseAddr and AdvertisePort are what other nodes use to reach this
	// one, when that differs from the bind address (NAT, containers). If
	// empty or zero, memberlist derives them from the bind address.
	AdvertiseAddr string
	AdvertisePort int
	// Seeds are host:port addresses of nodes to join at start and to rejoin
	// periodically while they are not members, so that a node that started
	// before its seeds, or sat on the far side of a partition, joins by
	// itself.
	Seeds []string
	// ClusterName is memberlist's label: packets and streams of another
	// cluster are refused. At most MaxClusterName bytes. Empty means
	// unlabelled.
	ClusterName string
	// Keys is the gossip keyring, AES keys of 16, 24 or 32 bytes; the first
	// is the primary, used to encrypt. If empty, gossip is not encrypted.
	// Rotate with InstallKey, UseKey, RemoveKey on every node in turn.
	Keys [][]byte

	// Meta is the node's initial metadata; its encoding must fit 512 bytes.
	Meta Meta
	// Incarnation identifies this run of the node in its events. If zero,
	// the start time in nanoseconds, which grows across restarts.
	Incarnation uint64

	// Timings; see DefaultConfig and DefaultLocalConfig for the values and
	// why. GossipInterval: how often to gossip (memberlist's). GossipNodes:
	// to how many nodes per round. ProbeInterval, ProbeTimeout,
	// SuspicionMult: failure detection; a dead node is declared after about
	// SuspicionMult × log10(n) × ProbeInterval. PushPullInterval: full state
	// sync with one random node (memberlist scales it up past 32 nodes).
	// RetransmitMult: each broadcast is sent RetransmitMult × log10(n+1)
	// times. RejoinInterval: how often to rejoin seeds that are not members;
	// while none answers, retries back off from an eighth of it up to it.
	// FlushInterval: how long published events wait to be batched.
	// RepairInterval: how often gaps are looked for and repaired;
	// RepairDelay: how long a gap may persist before it is repaired (lets
	// reordered packets arrive). Zero takes the DefaultConfig value.
	GossipInterval   time.Duration
	GossipNodes      int
	ProbeInterval    time.Duration
	ProbeTimeout     time.Duration
	SuspicionMult    int
	PushPullInterval time.Duration
	RetransmitMult   int
	// EventRetransmitMult is RetransmitMult for event batches, which every
	// receiver relays once and which repair makes good when lost, so they
	// need fewer copies than membership news. If zero, 4.
	EventRetransmitMult int
	RejoinInterval      time.Duration
	FlushInterval       time.Duration
	RepairInterval      time.Duration
	RepairDelay         time.Duration
	// RepairTimeout bounds one repair call. If zero, 5 s.
	RepairTimeout time.Duration

	// MaxBatchBytes bounds an event batch so that it fits a gossip packet
	// with memberlist's and encryption's overheads. If zero, 1000.
	MaxBatchBytes int
	// LogSize is how many of its own recent events a node keeps to answer
	// range repairs; older gaps get a snapshot. If zero, 65536.
	LogSize int
	// MaxPending bounds the out-of-order events buffered per origin while a
	// gap is open; beyond it they are dropped and repaired. If zero, 65536.
	MaxPending int
	// MaxQueuedBatches bounds the batches waiting to be gossiped; the oldest
	// are dropped first (receivers repair them). If zero, 4096.
	MaxQueuedBatches int

	// Sink receives every origin's events, this node's own included. If
	// nil, events are numbered and gossiped but applied nowhere.
	Sink Sink
	// Repairer fetches missing events or snapshots from their origin. If
	// nil, gaps are counted but not repaired.
	Repairer Repairer
	// MemberEvents is the capacity of the channel returned by Events;
	// events are dropped (and counted) when it is full, never blocking
	// memberlist. If zero, 1024.
	MemberEvents int
	// Logger receives memberlist's log, deduplicated. If nil, slog.Default().
	Logger *slog.Logger
	// LogRepeatWindow is how long a repeated memberlist warning or error is
	// suppressed after it was logged. If zero, 10 minutes.
	LogRepeatWindow time.Duration

	// Transport carries memberlist's packets and streams instead of UDP
	// and TCP sockets on BindAddr:BindPort (the control-plane simulation
	// runs many nodes over an in-memory network). If nil, memberlist's
	// network transport. The Membership shuts it down on Close.
	Transport memberlist.Transport

	// DeadNameReclaim is how long after a member was declared dead its
	// name may come back from another address (a node killed and restarted
	// elsewhere, or on a new port); until then peers refuse it ("conflicting
	// address"). memberlist's own default never lets a dead name move, so a
	// restarted node waited until the dead record was reaped (30 s and
	// more). A live member's name is never taken over: the conflict
	// settlement above still decides between two live runs. If zero,
	// DefaultDeadNameReclaim.
	DeadNameReclaim time.Duration
}

// DefaultDeadNameReclaim is Config.DeadNameReclaim's default: long enough
// that a dead declaration's gossip has settled, short against the time a
// restarted process takes to come back.
const DefaultDeadNameReclaim = time.Second

// DefaultConfig returns timings for a LAN. Compared with memberlist's
// DefaultLANConfig: gossip every 50 ms to 4 nodes instead of 200 ms to 3,
// membership news retransmitted 8 × log10(n+1) times instead of 4 ×, and
// full syncs every 10 s instead of 30 s, because block events must reach
// every node in a fraction of a second and a missed join announcement must
// not wait half a minute. Failure detection keeps memberlist's scheme
// (suspicion multiplier 4) with probes every 700 ms instead of 1 s, so that
// a killed node is declared dead after 5 to 8 s for 16 to 64 nodes rather
// than 7 to 10 s. BENCHMARKS.md has the measured figures.
func DefaultConfig() Config {
	return Config{
		BindAddr:            "0.0.0.0",
		GossipInterval:      50 * time.Millisecond,
		GossipNodes:         4,
		ProbeInterval:       700 * time.Millisecond,
		ProbeTimeout:        350 * time.Millisecond,
		SuspicionMult:       4,
		PushPullInterval:    10 * time.Second,
		RetransmitMult:      8,
		EventRetransmitMult: 4,
		RejoinInterval:      10 * time.Second,
		FlushInterval:       10 * time.Millisecond,
		RepairInterval:      100 * time.Millisecond,
		RepairDelay:         200 * time.Millisecond,
		RepairTimeout:       5 * time.Second,
		MaxBatchBytes:       1000,
		LogSize:             1 << 16,
		MaxPending:          1 << 16,
		MaxQueuedBatches:    4096,
		MemberEvents:        1024,
		LogRepeatWindow:     10 * time.Minute,
	}
}

// DefaultLocalConfig returns timings for nodes on one host (loopback): as
// DefaultConfig, with faster full syncs and rejoins. It keeps
// DefaultConfig's probe timeout (350 ms, above the 200 ms memberlist uses
// on one host), so that many nodes sharing a few busy cores (tests under
// the race detector) are not suspected for an ack that was late to run.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.BindAddr = "127.0.0.1"
	c.PushPullInterval = time.Second
	c.RejoinInterval = time.Second
	return c
}

// withDefaults fills zero fields from DefaultConfig and validates.
func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig()
	if c.BindAddr == "" {
		c.BindAddr = d.BindAddr
	}
	setDur := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	setInt := func(v *int, def int) {
		if *v == 0 {
			*v = def
		}
	}
	setDur(&c.GossipInterval, d.GossipInterval)
	setInt(&c.GossipNodes, d.GossipNodes)
	setDur(&c.ProbeInterval, d.ProbeInterval)
	setDur(&c.ProbeTimeout, d.ProbeTimeout)
	setInt(&c.SuspicionMult, d.SuspicionMult)
	setDur(&c.PushPullInterval, d.PushPullInterval)
	setInt(&c.RetransmitMult, d.RetransmitMult)
	setInt(&c.EventRetransmitMult, d.EventRetransmitMult)
	setDur(&c.RejoinInterval, d.RejoinInterval)
	setDur(&c.FlushInterval, d.FlushInterval)
	setDur(&c.RepairInterval, d.RepairInterval)
	setDur(&c.RepairDelay, d.RepairDelay)
	setDur(&c.RepairTimeout, d.RepairTimeout)
	setInt(&c.MaxBatchBytes, d.MaxBatchBytes)
	setInt(&c.LogSize, d.LogSize)
	setInt(&c.MaxPending, d.MaxPending)
	setInt(&c.MaxQueuedBatches, d.MaxQueuedBatches)
	setInt(&c.MemberEvents, d.MemberEvents)
	setDur(&c.LogRepeatWindow, d.LogRepeatWindow)
	setDur(&c.DeadNameReclaim, DefaultDeadNameReclaim)
	if c.Incarnation == 0 {
		c.Incarnation = uint64(time.Now().UnixNano())
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	if c.Name == "" || len(c.Name) > MaxNameLen {
		return bad("Name", "%q must be 1..%d bytes", c.Name, MaxNameLen)
	}
	if len(c.ClusterName) > MaxClusterName {
		return bad("ClusterName", "%d bytes, at most %d", len(c.ClusterName), MaxClusterName)
	}
	if _, err := netip.ParseAddr(c.BindAddr); err != nil {
		return bad("BindAddr", "%q is not an IP address", c.BindAddr)
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		return bad("BindPort", "%d out of range", c.BindPort)
	}
	if c.AdvertiseAddr != "" {
		if _, err := netip.ParseAddr(c.AdvertiseAddr); err != nil {
			return bad("AdvertiseAddr", "%q is not an IP address", c.AdvertiseAddr)
		}
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return bad("AdvertisePort", "%d out of range", c.AdvertisePort)
	}
	for i, k := range c.Keys {
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return bad(fmt.Sprintf("Keys[%d]", i), "%d bytes; AES keys are 16, 24 or 32", n)
		}
	}
	for name, d := range map[string]time.Duration{
		"GossipInterval": c.GossipInterval, "ProbeInterval": c.ProbeInterval, "ProbeTimeout": c.ProbeTimeout,
		"PushPullInterval": c.PushPullInterval, "RejoinInterval": c.RejoinInterval, "FlushInterval": c.FlushInterval,
		"RepairInterval": c.RepairInterval, "RepairDelay": c.RepairDelay, "RepairTimeout": c.RepairTimeout,
		"LogRepeatWindow": c.LogRepeatWindow, "DeadNameReclaim": c.DeadNameReclaim,
	} {
		if d < 0 {
			return bad(name, "%v is negative", d)
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		return bad("ProbeTimeout", "%v must be shorter than ProbeInterval %v", c.ProbeTimeout, c.ProbeInterval)
	}
	for name, v := range map[string]int{
		"GossipNodes": c.GossipNodes, "SuspicionMult": c.SuspicionMult, "RetransmitMult": c.RetransmitMult, "EventRetransmitMult": c.EventRetransmitMult,
		"LogSize": c.LogSize, "MaxPending": c.MaxPending, "MaxQueuedBatches": c.MaxQueuedBatches, "MemberEvents": c.MemberEvents,
	} {
		if v < 0 {
			return bad(name, "%d is negative", v)
		}
	}
	if c.MaxBatchBytes < batchHeaderMax+eventMax || c.MaxBatchBytes > 64<<10 {
		return bad("MaxBatchBytes", "%d must be in [%d, 65536]", c.MaxBatchBytes, batchHeaderMax+eventMax)
	}
	return nil
}

// pushPullScaleThreshold is the most members at which memberlist does not
// scale PushPullInterval (its util.go).
const pushPullScaleThreshold = 32

// PushPullPeriod is how often each node of a cluster of members nodes
// starts a push/pull (a full state exchange over a stream) when
// PushPullInterval is interval: memberlist multiplies the interval by
// 1 + ⌈log2(members/32)⌉ past 32 members (its pushPullScale), since the
// state grows with the members. A window of this length holds one push/pull
// started by each node whatever their phases, so that it measures their
// bytes without depending on when the nodes started.
func PushPullPeriod(interval time.Duration, members int) time.Duration {
	if members <= pushPullScaleThreshold {
		return interval
	}
	return time.Duration(math.Ceil(math.Log2(float64(members))-math.Log2(pushPullScaleThreshold))+1) * interval
}
