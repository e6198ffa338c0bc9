package fabric

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/transfer"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

// The defaults and bounds of the duration settings, which DefaultConfig,
// validation and the command line's help all read through
// durationSettings.
const (
	DefaultLeaseDuration = 30 * time.Second
	// MinLeaseDuration and MaxLeaseDuration bound what holders grant
	// (pool's default MaxLeaseDuration; the wire carries milliseconds).
	MinLeaseDuration = time.Second
	MaxLeaseDuration = 5 * time.Minute
	// DefaultMaxLeaseAge is how old a lease may be and still be renewed:
	// far past what a chunk's lease lives in an import (leased while the
	// chunk before it is read, held while it is read and released, each
	// call bounded by PeerTimeout and the whole import by ImportTimeout,
	// 2 s and 30 s by default), short enough that no peer keeps blocks
	// pinned here for good. MaxLeaseAgeCeiling bounds the setting.
	DefaultMaxLeaseAge = 10 * time.Minute
	MaxLeaseAgeCeiling = 24 * time.Hour

	DefaultImportTimeout = 30 * time.Second
	// MinImportTimeout and MaxImportTimeout bound ImportTimeout, which
	// bounds a whole import (all holders tried; Prefetch's too) and the
	// tiers' work for an engine (a read-ahead run, an allocation that waits
	// for copies down): below 100 ms no import of a chunk over a network,
	// nor a read from disk, can count on finishing; an hour is far past the
	// longest import (the 65,536 blocks of one request at gigabytes a
	// second), and past it a stuck import only holds its slots longer. An
	// engine's import call that gives its own timeout (timeout_ms) is
	// bounded by that instead, shorter or longer, and by the call's
	// deadline.
	MinImportTimeout = 100 * time.Millisecond
	MaxImportTimeout = time.Hour

	DefaultPeerTimeout = 2 * time.Second
	// MinPeerTimeout and MaxPeerTimeout bound PeerTimeout. Each call to a
	// peer (a dial with its TLS handshake, a control call, a read's
	// progress) gives up after half of it, so half the floor is
	// MinLaneHelloTimeout, what a handshake and a hello need. It also
	// bounds an owned index's calls, a holder's checks of a release's
	// checksum claims and how long a failed holder is passed over, and the
	// QUIC connection to a silent peer closes after three times it: past
	// five minutes a silent peer is gone, not slow, and waiting longer on
	// it only holds imports up and keeps a holder's checks running.
	MinPeerTimeout = 2 * MinLaneHelloTimeout
	MaxPeerTimeout = 5 * time.Minute

	DefaultBlockSetGrace = 30 * time.Second
	MaxBlockSetGrace     = 24 * time.Hour

	DefaultSessionKeepalive = 5 * time.Second

	// MinLaneHelloTimeout and MaxLaneHelloTimeout bound LaneHelloTimeout
	// (default transfer.DefaultLaneHelloTimeout): a TLS handshake and a
	// hello need a few round trips, and a deadline long past that only
	// lets a flood hold its places longer.
	MinLaneHelloTimeout = 100 * time.Millisecond
	MaxLaneHelloTimeout = time.Minute
)

// MaxNodeName bounds Config.NodeName, and the name kvfabric certs node
// certifies, which are otherwise what certs.ValidNodeName allows a
// certificate's name (up to 253 bytes).
const MaxNodeName = 128

// MaxLanePending bounds LaneMaxPending and LaneMaxPendingPerSource.
const MaxLanePending = 1 << 16

// The bounds of ImportChunkBytes: below a megabyte a chunk's control
// calls cost more than its bytes; above a few gigabytes one chunk pins a
// holder's memory for seconds.
const (
	minImportChunk = 1 << 20
	maxImportChunk = 4 << 30
)

// The bounds of SessionKeepalive: below 100 ms a loaded engine's keepalive
// is late for no fault of its own; above 10 min a dead engine's slots stay
// taken for longer than anyone would wait.
const (
	MinSessionKeepalive = 100 * time.Millisecond
	MaxSessionKeepalive = 10 * time.Minute
)

// ErrConfig is matched by every configuration error.
var ErrConfig = errors.New("fabric: invalid configuration")

// SettingError is a configuration error about one setting: its file key,
// with an entry's index for an entry of a list ("tiers[1]"), and what is
// wrong with it. It matches ErrConfig and reads "fabric: invalid
// configuration: KEY: WHY", so that a program that takes the setting
// another way (cmd/kvfabric's flags) can name it as it was given. Settings
// that go together are refused together, Key listing theirs with ", "
// between ("ca_file, cert_file, key_file"). Validation refuses what it
// can see; Start refuses so what it finds as it starts (a pool the
// machine cannot hold, the TLS and gossip key files, rdma=on without
// RDMA), and Err is then the error that refused it, if any (a file that
// does not read, RDMA that cannot be opened), which Why names too.
type SettingError struct {
	Key, Why string
	Err      error
}

// tlsFileKeys are the keys of the TLS files, refused together where none
// is given without Dev, and where loading and checking them as one
// identity fails (a file that does not read, a certificate of another
// CA), the error naming the file at fault.
const tlsFileKeys = "ca_file, cert_file, key_file"

func (e *SettingError) Error() string { return fmt.Sprintf("%v: %s: %s", ErrConfig, e.Key, e.Why) }

// Unwrap returns ErrConfig and Err, if any, so that errors.Is and
// errors.As match either, as for an error made with
// fmt.Errorf("%w: ...: %w", ErrConfig, err).
func (e *SettingError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrConfig}
	}
	return []error{ErrConfig, e.Err}
}

// Setting is the setting's file key without an entry's index ("tiers" of
// "tiers[1]"). Where the error is about settings that go together, it is
// Key, their keys with ", " between.
func (e *SettingError) Setting() string {
	key, _, _ := strings.Cut(e.Key, "[")
	return key
}

// ValidNodeName reports whether name can name a node: 1 to MaxNodeName
// letters, digits, '-', '.' or '_'. Its certificate (kvfabric certs node)
// carries it, and peers read it from there.
func ValidNodeName(name string) error {
	if len(name) > MaxNodeName || certs.ValidNodeName(name) != nil {
		return fmt.Errorf("%q must be 1 to %d letters, digits, '-', '.' or '_' (it is the name in the node's certificate)", name, MaxNodeName)
	}
	return nil
}

// badSetting returns a SettingError about the setting of key.
func badSetting(key, format string, args ...any) error {
	return &SettingError{Key: key, Why: fmt.Sprintf(format, args...)}
}

// badSettingErr returns a SettingError about the setting of key refused by
// err, which the format names.
func badSettingErr(key string, err error, format string, args ...any) error {
	return &SettingError{Key: key, Why: fmt.Sprintf(format, args...), Err: err}
}

// Config configures an Agent. Every field says what its zero value means;
// DefaultConfig spells the defaults out for a cluster node and
// DefaultLocalConfig for agents sharing one machine on loopback. The same
// fields are read from a JSON config file (LoadConfigFile) and set by the
// flags of `kvfabric agent`.
type Config struct {
	// NodeName is this node's name in the cluster, and the name its TLS
	// certificate must carry: 1 to MaxNodeName letters, digits, '-', '.'
	// or '_'. If empty, the host name.
	NodeName string `json:"node_name,omitempty"`
	// DataDir holds the engine socket (where EngineSocket does not name
	// another place); Dev's CA is kept beside it, in DevCADir's default,
	// and the pool's memory is anonymous or in MemoryDir, never here. If
	// empty, /var/lib/kvfabric.
	DataDir string `json:"data_dir,omitempty"`

	// GossipAddr is the IP:port gossip binds (UDP and TCP): an IP address,
	// as memberlist resolves no names. If empty, 0.0.0.0:7946.
	GossipAddr string `json:"gossip_addr,omitempty"`
	// GossipAdvertise is the IP:port other nodes reach gossip at: an IP
	// address, neither unspecified (0.0.0.0, ::) nor with port 0, which
	// no node can reach. If empty, GossipAddr, or the first private
	// address when that is a wildcard.
	GossipAdvertise string `json:"gossip_advertise,omitempty"`
	// Join lists gossip addresses of nodes to join; they are retried
	// periodically, so a healed partition heals by itself. If empty, this
	// node starts a cluster and waits for others.
	Join []string `json:"join,omitempty"`
	// AllowAlone makes /healthz answer ok while no seed of Join has
	// answered: the node serves alone until one does. If false, a node
	// with seeds answers 503 "not joined" until it has joined once.
	AllowAlone bool `json:"allow_alone,omitempty"`
	// ClusterName labels every gossip packet; nodes of other clusters are
	// ignored. At most membership.MaxClusterName (255) bytes, memberlist's
	// label. If empty, "kvfabric".
	ClusterName string `json:"cluster_name,omitempty"`
	// GossipKeyFile holds the gossip encryption keys, one base64 key (16, 24
	// or 32 bytes) per line, the first one used to encrypt. If empty, gossip
	// is not encrypted, which is logged as a warning.
	GossipKeyFile string `json:"gossip_key_file,omitempty"`

	// PeerAddr is the host:port the QUIC peer transport listens on (UDP).
	// If empty, 0.0.0.0:7947.
	PeerAddr string `json:"peer_addr,omitempty"`
	// PeerAdvertise is the host:port peers dial, neither an unspecified IP
	// nor port 0. If empty, derived like GossipAdvertise.
	PeerAdvertise string `json:"peer_advertise,omitempty"`
	// CAFile, CertFile and KeyFile are the cluster CA and this node's
	// certificate and key (PEM), from `kvfabric certs`. Required unless Dev.
	CAFile   string `json:"ca_file,omitempty"`
	CertFile string `json:"cert_file,omitempty"`
	KeyFile  string `json:"key_file,omitempty"`
	// Dev makes or reuses a development CA in DevCADir and certifies this node with
	// it: for a local development cluster only. Ignored when the TLS files
	// are given. Always written, as Local is, so that false read back over
	// DefaultLocalConfig stays false.
	Dev bool `json:"dev"`
	// DevCADir is where Dev keeps the development CA; the agents of one
	// local cluster share it. If empty, a kvfabric-dev-ca folder beside
	// DataDir.
	DevCADir string `json:"dev_ca_dir,omitempty"`

	// EngineSocket is the unix socket of the engine API; its companion
	// EngineSocket+".fd" hands out pool memory descriptors. At most
	// MaxEngineSocket (104) bytes, so that both fit a unix socket's path.
	// If empty, DataDir/engine.sock.
	EngineSocket string `json:"engine_socket,omitempty"`
	// EngineSocketMode is the octal permission of the engine socket, its
	// companion and the named memory file: 0600, 0620, 0640 or 0660 (the
	// owner always reads and writes; others never get access). If empty,
	// 0600. Where it grants the group access, the directories the agent
	// makes on the way to the socket (DataDir by default) are 0710 and
	// EngineSocketGroup's, so that the group's engines reach the socket;
	// one there already that the group cannot search is named in a
	// warning at start.
	EngineSocketMode string `json:"engine_socket_mode,omitempty"`
	// EngineSocketGroup is the group (name or numeric id) that owns the
	// engine socket, its companion and the named memory file, so that
	// engines running as another user in it can connect when the mode
	// grants the group access. If empty, the agent's group.
	EngineSocketGroup string `json:"engine_socket_group,omitempty"`
	// MemoryDir, when set, makes the pool's memory a named file in this
	// directory (e.g. a Kubernetes hostPath shared with engine pods), which
	// engines may open instead of receiving the descriptor; the file is
	// removed when the agent stops; each rank of a block set is a file of
	// its own there, with a name engines are told and cannot list (the
	// directory is made 0711). If empty, the memory is an anonymous
	// memory file, reachable through the descriptor socket only.
	MemoryDir string `json:"memory_dir,omitempty"`
	// MetricsAddr is the host:port of the HTTP /metrics and /healthz
	// endpoints. If empty, 127.0.0.1:7948; "off" disables them.
	MetricsAddr string `json:"metrics_addr,omitempty"`

	// Pools sizes the memory the agent owns, one entry per pool:
	//
	//	host=SIZE        shareable host memory (SIZE such as 4GiB)
	//	pinned=SIZE      host memory page-locked through the CUDA driver
	//	                 (cuMemHostRegister) where it loads, else with mlock
	//	device=AMOUNT    GPU memory on every GPU of the node
	//	device:N=AMOUNT  GPU memory on GPU N (its CUDA index) only
	//
	// AMOUNT is a SIZE or a fraction of the GPU's free memory at start,
	// written with a point (device=0.5; 0 < fraction <= 1). A SIZE is at
	// least MinPoolBytes (1MiB), and a host or pinned pool at most the
	// machine's memory (and the file system of MemoryDir). At most one host
	// or pinned entry; device entries name each GPU once. Engines' block
	// sets are carved from the device pools when the node has a GPU, TP
	// rank r on the r-th pool modulo their number, or where the engine's
	// Register places it, else from the host or pinned entry (host=1GiB
	// when there is none). Without
	// a CUDA driver or a GPU the device entries are left out and the agent
	// says so once. If empty, a host pool of 1 GiB.
	Pools []string `json:"pools,omitempty"`
	// CUDALibrary is the CUDA driver library to load for device and pinned
	// pools. If empty, the environment's KVFABRIC_CUDA_LIB, then
	// libcuda.so.1.
	CUDALibrary string `json:"cuda_library,omitempty"`
	// BlockSetSlots is the slots of a block set made for an engine that
	// asks for none, at most layout.MaxSlots. If zero, as many as a
	// quarter of the pool holds.
	BlockSetSlots int `json:"block_set_slots,omitempty"`
	// BlockSetGrace is how long a block set no engine session uses keeps
	// its cached blocks before the agent frees it (or keeps it as a cache
	// of the engine that is gone: see NoOrphanCache); a Register that
	// needs its memory frees it at once. At most MaxBlockSetGrace. If
	// zero, DefaultBlockSetGrace.
	BlockSetGrace time.Duration `json:"block_set_grace,omitempty"`
	// SessionKeepalive is how long an engine session may stay silent
	// before the agent ends it and gives back what it held (an engine that
	// exits or drops its connection ends at once). MinSessionKeepalive to
	// MaxSessionKeepalive. If zero, DefaultSessionKeepalive.
	SessionKeepalive time.Duration `json:"session_keepalive,omitempty"`

	// LeaseDuration is how long a holder keeps blocks for an importer,
	// MinLeaseDuration to MaxLeaseDuration. If zero, DefaultLeaseDuration.
	LeaseDuration time.Duration `json:"lease_duration,omitempty"`
	// MaxLeaseAge is how long renewals may keep a lease this node granted
	// alive: a renewal asked for once the lease is older than it is
	// refused, naming it, and the lease ends with the term it has (so it
	// lives at most MaxLeaseAge and one LeaseDuration); the importer fails
	// the read over to another holder. MinLeaseDuration to
	// MaxLeaseAgeCeiling. If zero, DefaultMaxLeaseAge.
	MaxLeaseAge time.Duration `json:"max_lease_age,omitempty"`
	// MaxLeasedPerPeer bounds the blocks one peer may hold leased on this
	// node at once; a lease past it is cut to what fits, or refused as
	// unavailable when nothing does. If zero, half of the slots of this
	// node's block sets.
	MaxLeasedPerPeer int `json:"max_leased_per_peer,omitempty"`
	// MaxLeased bounds the blocks all peers together may hold leased on
	// this node. If zero, three quarters of the slots of its block sets.
	MaxLeased int `json:"max_leased,omitempty"`
	// ImportTimeout bounds one import, all holders tried, and the tiers'
	// work for an engine (read-ahead, waits for copies down); an engine's
	// import that asks for longer (ImportRequest.timeout_ms) is cut to it.
	// MinImportTimeout to MaxImportTimeout. If zero, DefaultImportTimeout.
	ImportTimeout time.Duration `json:"import_timeout,omitempty"`
	// ImportChunkBytes bounds the bytes of one chunk of an import: an
	// import leases, reads, releases and registers a chunk at a time (at
	// most transfer.MaxLeaseBlocks blocks, however small), leasing the next
	// while it reads the current one. 1 MiB to 4 GiB. If zero, 64 MiB.
	ImportChunkBytes int64 `json:"import_chunk_bytes,omitempty"`
	// PeerTimeout bounds how long a silent peer can hold up an import
	// before it fails over to another holder or fails: each dial, control
	// call and read to a peer gives up after half of it. MinPeerTimeout
	// to MaxPeerTimeout. If zero, DefaultPeerTimeout.
	PeerTimeout time.Duration `json:"peer_timeout,omitempty"`

	// RDMA is auto, on or off. auto reads over RDMA from holders that
	// offer it when this node has a usable RDMA device, over QUIC
	// otherwise, and says once at start why RDMA is off when it is; on
	// refuses to start without a usable device; off never uses RDMA. If
	// empty, auto.
	RDMA string `json:"rdma,omitempty"`
	// RDMADevice names the RDMA device every pool is registered with and
	// reads go through (e.g. mlx5_0). If empty, for device pools the
	// device nearest each GPU in PCI topology (a NIC per GPU where the node
	// has them), else the first device with an active port.
	RDMADevice string `json:"rdma_device,omitempty"`
	// RDMAPort is the device's port, 1..255. If zero, 1.
	RDMAPort int `json:"rdma_port,omitempty"`
	// RDMALibrary is libibverbs' path. If empty, the environment's
	// KVFABRIC_IBVERBS_LIB, then libibverbs.so.1.
	RDMALibrary string `json:"rdma_library,omitempty"`
	// RDMATimeout is the queue pairs' ACK timeout exponent, 1..31 (each
	// try waits 4.096 µs × 2^n), and RDMARetry how many tries follow the
	// first, 1..7: a dead holder fails a read after about (RDMARetry+1) ×
	// 4.096 µs × 2^RDMATimeout. If zero, 14 and 7 (about 0.5 s).
	RDMATimeout int `json:"rdma_timeout,omitempty"`
	RDMARetry   int `json:"rdma_retry,omitempty"`

	// LogLevel is debug, info, warn or error. If empty, info.
	LogLevel string `json:"log_level,omitempty"`
	// LogFormat is text (key=value) or json (one object a line, for log
	// collectors). If empty, text.
	LogFormat string `json:"log_format,omitempty"`
	// Logger receives the agent's logs. If nil, a logger on standard error
	// in LogFormat at LogLevel. Either way, identical records at info and
	// above are written once per 10 s, the next one saying how many were
	// left out (repeated=N). Not read from files.
	Logger *slog.Logger `json:"-"`
	// MetricsHandler serves /metrics beside /healthz on MetricsAddr. If
	// nil, /metrics is not served: the agent counts (Agent.Metrics) and the
	// program that runs it exports, as cmd/kvfabric does with Prometheus.
	// Not read from files.
	MetricsHandler http.Handler `json:"-"`
	// Local selects loopback timings for gossip (DefaultLocalConfig).
	Local bool `json:"local"`

	// hooks are set by tests before Start, so that every goroutine of
	// the agent sees them without further synchronisation.
	hooks testHooks

	// maxMessageSize, for tests, caps peer frames below the transport's
	// default so that paging shows at small sizes. If zero, the
	// transport's default.
	maxMessageSize uint32

	// NoChecksums turns content checksums off: blocks registered in host
	// memory get none, and imports check none. If false, every block an
	// engine registers in host memory gets one (layout.BlockSum), leases
	// carry it, and an import refuses a block whose bytes do not match
	// (counted, logged, and the holder withdraws the block).
	NoChecksums bool `json:"no_checksums,omitempty"`

	// EngineRequestMemory bounds the engine requests being served at once,
	// in bytes (twice each request's encoded size): a request that would
	// pass it fails RESOURCE_EXHAUSTED at once, naming the bound. At least
	// MinEngineRequestMemory (128 MiB: one of the largest requests). If
	// zero, DefaultEngineRequestMemory (512 MiB).
	EngineRequestMemory int64 `json:"engine_request_memory,omitempty"`
	// EngineSessionRequestMemory is the same bound for one session's
	// requests (calls naming no session share one),
	// MinEngineRequestMemory to EngineRequestMemory. If zero,
	// DefaultEngineSessionRequestMemory (256 MiB) or EngineRequestMemory
	// if smaller.
	EngineSessionRequestMemory int64 `json:"engine_session_request_memory,omitempty"`
	// EngineSessions bounds the engine sessions open at once (OpenSession
	// streams, those yet to send their first SessionRequest included),
	// 1..MaxEngineSessions: one past it fails RESOURCE_EXHAUSTED at once,
	// naming the bound and how many are open. If zero,
	// DefaultEngineSessions (1,024).
	EngineSessions int `json:"engine_sessions,omitempty"`
	// EngineSessionsPerProcess is the same bound for one engine process
	// (by SO_PEERCRED), 1..EngineSessions. Sessions of a process the
	// agent cannot name (pid 0: off Linux, or an engine in a PID
	// namespace the agent's does not show) count only against
	// EngineSessions, as they may be of many processes. If zero,
	// DefaultEngineSessionsPerProcess (64) or EngineSessions if smaller.
	EngineSessionsPerProcess int `json:"engine_sessions_per_process,omitempty"`

	// EngineQuota bounds the pool bytes the block sets made for one engine
	// (by the name it registers under) may take; a Register past it first
	// frees that engine's idle sets (none where the new set alone is past
	// it), then fails RESOURCE_EXHAUSTED naming the quota. Room for a new
	// set is made by freeing idle sets of the engine itself or of engines
	// over their quota, never those of an engine within it. At least
	// MinEngineQuota (1 MiB). If zero, a fair share: the pool divided
	// among the engines that have block sets.
	EngineQuota int64 `json:"engine_quota,omitempty"`

	// LaneAddr is the host:port of the TCP data lane (TLS 1.3 with the
	// node's certificate), which readers use for block data where RDMA is
	// not there and fall back to QUIC from; port 0 picks a free port, which
	// readers learn over QUIC. If empty, the node serves no lane and is
	// read over QUIC (or RDMA); it still reads over other nodes' lanes.
	LaneAddr string `json:"lane_addr,omitempty"`
	// LanePlain makes the lane plain TCP without TLS, for a network that
	// is private already: block data crosses it unencrypted (the agent
	// warns at start and status says so); connections are still
	// authorized by one-time tokens over the authenticated QUIC channel.
	LanePlain bool `json:"lane_plain,omitempty"`
	// LaneConns is how many lane connections this node opens to one
	// holder, 1..16; a chunk's read is spread over them. If zero, 4.
	LaneConns int `json:"lane_conns,omitempty"`
	// LaneMaxPending and LaneMaxPendingPerSource bound the connections to
	// this node's lane not yet admitted (TLS handshake and hello with its
	// token under way), in total and per source IP, 1..MaxLanePending: a
	// connection past either is closed as soon as it is accepted, before
	// any TLS work. Agents behind one address (a NAT, SNAT) share the
	// per-source bound. If zero, transfer.DefaultLaneMaxPending (256) and
	// transfer.DefaultLaneMaxPendingPerSource (32).
	LaneMaxPending          int `json:"lane_max_pending,omitempty"`
	LaneMaxPendingPerSource int `json:"lane_max_pending_per_source,omitempty"`
	// LaneHelloTimeout bounds a lane connection's TLS handshake and hello
	// from its accept: one without a good hello by then is closed. This
	// node's own lane connections to holders are given as long (or half
	// PeerTimeout, if less) from the dial to the holder's answer, and past
	// it the read goes over QUIC: the agents of a cluster share the
	// setting, so that a reader gives up no later than its holder would
	// close the connection. If zero, transfer.DefaultLaneHelloTimeout
	// (3 s); MinLaneHelloTimeout to MaxLaneHelloTimeout.
	LaneHelloTimeout time.Duration `json:"lane_hello_timeout,omitempty"`

	// Fabric is what moves RDMA reads: verbs (libibverbs: InfiniBand,
	// RoCE), ofi (libfabric: EFA, Slingshot's cxi), auto (verbs where
	// libibverbs has a usable device, else libfabric with its cxi, efa or
	// verbs provider) or off (QUIC and the lane only). RDMA still says
	// whether RDMA is tried at all, and whether its absence is an error.
	// If empty, auto.
	Fabric string `json:"fabric,omitempty"`
	// FabricProvider names libfabric's provider: cxi, efa, verbs, or tcp
	// and shm (slower than the lane, used only when named). If empty,
	// cxi, then efa, then verbs.
	FabricProvider string `json:"fabric_provider,omitempty"`
	// FabricAddr is the address libfabric's endpoint binds to, for the
	// providers that take one (tcp: one of this node's IP addresses). If
	// empty, the provider's default.
	FabricAddr string `json:"fabric_addr,omitempty"`

	// NoOrphanCache frees a block set BlockSetGrace after its last engine
	// session ends, its registered blocks with it. If false, a set that
	// still holds registered blocks then stays as a cache of the engine
	// that is gone (orphaned): its blocks stay announced, served to peers
	// and evictable, the next engine of its layout (once every process its
	// memory was handed to has exited) takes it up with its blocks, and
	// the agent frees it, before any set an engine may come back for, as
	// soon as a new block set needs its memory.
	NoOrphanCache bool `json:"no_orphan_cache,omitempty"`
	// NoClusterEviction makes the pool recycle blocks by use alone. If
	// false, among the blocks it may recycle, those other live nodes also
	// hold (by the index) go before those only this node holds.
	NoClusterEviction bool `json:"no_cluster_eviction,omitempty"`
	// Tiers are the disk tiers under the pools (tier_config.go), one
	// entry per tier, "disk=PATH:SIZE": blocks the pool would recycle are
	// copied there first, restored on use, served to peers, and found
	// again after a restart. If empty, none: a recycled block is gone.
	// One entry may be "host=SIZE": a host-memory tier above the disk
	// tiers (tier_host.go), not kept across restarts.
	Tiers []string `json:"tiers,omitempty"`
	// TierWatermark is the fraction of a block set's slots in use past
	// which its least recently used blocks are copied down ahead of need.
	// If zero, 0.90 (0.85 over device pools); in (0, 1].
	TierWatermark float64 `json:"tier_watermark,omitempty"`
	// TierQueue bounds the blocks waiting to be copied down; a block that
	// finds it full is recycled without a copy when its slot is needed.
	// It bounds too the blocks copied out into memory of their own when an
	// allocation takes their slots before their copies begin (a block's
	// bytes each). If zero, DefaultTierQueue; at most MaxTierQueue.
	TierQueue int `json:"tier_queue,omitempty"`
	// TierStagingSlots is the host slots that disk-held blocks are staged
	// into for peers when no engine block set of their layout is here. If
	// zero, DefaultTierStagingSlots; at most MaxTierStagingSlots.
	TierStagingSlots int `json:"tier_staging_slots,omitempty"`
	// TierBlockBytes is the room of one block on a disk tier, rounded up
	// to 4 KiB; larger blocks are not copied down. If zero, the size of
	// the first block a tier takes, recorded in its directory.
	TierBlockBytes int64 `json:"tier_block_bytes,omitempty"`
	// TierInFlight is the fraction of a block set's slots that may wait
	// for or be under a copy to the disk tiers at once. Past it, blocks
	// recycled for an allocation are dropped as without a tier, so that
	// an engine writing faster than the disk loses some blocks rather than
	// wait in Allocate. If zero, 0.25; 1: no block is dropped while a tier
	// has room, and Allocate waits for copies instead.
	TierInFlight float64 `json:"tier_in_flight,omitempty"`
	// IndexMode is how the cluster's block index is kept: whole (every
	// node indexes every node's blocks, learnt by gossip) or owned (each
	// block hash is indexed by IndexReplicas owners chosen by rendezvous
	// hashing over the members; events go to the owners, lookups ask
	// them). Every node of a cluster must use the same mode. If empty,
	// whole.
	IndexMode string `json:"index_mode,omitempty"`
	// IndexReplicas is how many members own each block hash in owned
	// mode, 1..8. If zero, 3.
	IndexReplicas int `json:"index_replicas,omitempty"`
	// IndexCacheTTL is how long an owned-mode node reuses an owner's
	// answer about a hash before asking again. If zero, 1 s.
	IndexCacheTTL time.Duration `json:"index_cache_ttl,omitempty"`
	// IndexMaxNodeBlocks is the most distinct block hashes this node's
	// index keeps for one holder other than this node, in either mode:
	// past it, that holder's stores of hashes not held already are
	// counted and not indexed (index.Config.MaxNodeBlocks). Set it on
	// every node above the blocks any node's pools and tiers hold: the
	// agent warns where its own hold more. If zero,
	// index.DefaultMaxNodeBlocks.
	IndexMaxNodeBlocks int `json:"index_max_node_blocks,omitempty"`

	// Dumpable keeps the agent's process dumpable (Linux). If false, Start
	// makes the whole process non-dumpable, so that no other process of
	// its user (root apart) can open its block sets' memory through
	// /proc/<pid>/fd or map_files, read it with process_vm_readv or attach
	// to it, and no core dump (which would hold every engine's blocks) is
	// written. Set it for debuggers, core dumps, and the software
	// stand-ins of RDMA and CUDA that read one process's memory from
	// another; real RDMA and CUDA IPC need neither. Process-wide: the last
	// agent started in a process decides.
	Dumpable bool `json:"dumpable,omitempty"`

	// PoolRecycleAhead makes a block set without a tier below recycle its
	// inactive blocks ahead of need, in batches: once an allocation leaves
	// fewer than 5 % of its slots free, until 10 % are. If false, a block
	// is recycled only when an allocation needs its slot, so that the
	// whole set caches blocks (pool_recycle.go). With tiers, blocks are
	// always copied down ahead of need (TierWatermark).
	PoolRecycleAhead bool `json:"pool_recycle_ahead,omitempty"`

	// TierReadAhead is the most blocks read ahead along a sequence after a
	// restore from a tier into an engine's block set (tier_readahead.go),
	// ahead of use at a time (being read, or read and not yet taken):
	// the blocks that followed the last one restored when they went down,
	// brought up in the background into the set's spare slots, cached
	// there; never more than half the blocks the set keeps.
	// 0..MaxTierReadAhead. If zero, none: zero is off, so that the setting
	// given as 0 anywhere turns it off; DefaultConfig sets
	// DefaultTierReadAhead. Always written (MarshalConfig), so that a 0
	// read back over the defaults stays off.
	TierReadAhead int `json:"tier_read_ahead"`
}

// DefaultConfig returns the defaults for an agent on a cluster node.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	c := Config{
		NodeName:         host,
		DataDir:          "/var/lib/kvfabric",
		GossipAddr:       "0.0.0.0:7946",
		ClusterName:      "kvfabric",
		PeerAddr:         "0.0.0.0:7947",
		MetricsAddr:      "127.0.0.1:7948",
		Pools:            []string{"host=1GiB"},
		ImportChunkBytes: 64 << 20,
		LogLevel:         "info",
		TierReadAhead:    DefaultTierReadAhead,
	}
	for _, s := range durationSettings {
		*s.field(&c) = s.Default
	}
	return c
}

// DefaultLocalConfig returns the defaults for agents sharing one machine:
// loopback addresses, loopback gossip timings and a development CA.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.DataDir = filepath.Join(os.TempDir(), "kvfabric")
	c.GossipAddr = "127.0.0.1:7946"
	c.PeerAddr = "127.0.0.1:7947"
	c.Dev = true
	c.Local = true
	return c
}

// LoadConfigFile reads a JSON config file over base: fields the file sets
// replace base's. A key that is not exactly a field's JSON name is an
// error naming it (a typo in a file is a bug, and so is a key in
// another case). Durations are strings such as "30s".
func LoadConfigFile(path string, base Config) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return base, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	// Durations are strings in the file (Duration); take them out, then
	// decode the rest strictly into base.
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return base, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	// A key is a setting's exactly: encoding/json matches keys without
	// regard to case, which took "Block_Set_Grace": 30 as 30ns, past the
	// durations' check, and "Node_Name" as node_name.
	if err := checkConfigKeys(fields); err != nil {
		return base, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	for _, s := range durationSettings {
		raw, ok := fields[s.Key]
		if !ok {
			continue
		}
		delete(fields, s.Key)
		var str string
		if err := json.Unmarshal(raw, &str); err != nil {
			return base, fmt.Errorf("%w: %s: %s: want a duration string such as \"30s\"", ErrConfig, path, s.Key)
		}
		if err := (*Duration)(s.field(&base)).UnmarshalText([]byte(str)); err != nil {
			return base, fmt.Errorf("%w: %s: %s: %v", ErrConfig, path, s.Key, err)
		}
	}
	rest, _ := json.Marshal(fields)
	dec := json.NewDecoder(strings.NewReader(string(rest)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&base); err != nil {
		return base, fmt.Errorf("%w: %s: %v", ErrConfig, path, err)
	}
	return base, nil
}

// configKeys are the configuration file's keys: the JSON names of
// Config's fields.
func configKeys() map[string]bool {
	keys := map[string]bool{}
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		if f := ct.Field(i); f.IsExported() {
			if key, _, _ := strings.Cut(f.Tag.Get("json"), ","); key != "" && key != "-" {
				keys[key] = true
			}
		}
	}
	return keys
}

// checkConfigKeys refuses, naming it, the first key (in order) of a
// configuration file that is not exactly a setting's, saying which
// setting one that differs only in case would be.
func checkConfigKeys(fields map[string]json.RawMessage) error {
	keys := configKeys()
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if keys[k] {
			continue
		}
		if lower := strings.ToLower(k); keys[lower] {
			return fmt.Errorf("unknown key %q: keys are lower case (%q)", k, lower)
		}
		return fmt.Errorf("unknown key %q: no setting has it", k)
	}
	return nil
}

// PoolSpec is one parsed entry of Config.Pools.
type PoolSpec struct {
	Kind string // "host", "pinned" or "device"
	// Size is the bytes asked for; zero for a device pool sized by
	// Fraction.
	Size uint64
	// Fraction is the share of a GPU's free memory, in (0, 1]; zero when
	// Size is given.
	Fraction float64
	// GPU is the CUDA index of a device pool's GPU, or -1 for every GPU.
	// Zero for host and pinned pools.
	GPU int
}

// populate fills the zero fields with defaults.
func (c *Config) populate() {
	d := DefaultConfig()
	if c.NodeName == "" {
		c.NodeName = d.NodeName
	}
	if c.DataDir == "" {
		c.DataDir = d.DataDir
	}
	if c.GossipAddr == "" {
		c.GossipAddr = d.GossipAddr
	}
	if c.ClusterName == "" {
		c.ClusterName = d.ClusterName
	}
	if c.PeerAddr == "" {
		c.PeerAddr = d.PeerAddr
	}
	if c.DevCADir == "" {
		c.DevCADir = devCADir(c.DataDir)
	}
	if c.EngineSocket == "" {
		c.EngineSocket = filepath.Join(c.DataDir, "engine.sock")
	}
	if c.MetricsAddr == "" {
		c.MetricsAddr = d.MetricsAddr
	}
	if len(c.Pools) == 0 {
		c.Pools = d.Pools
	}
	for _, s := range durationSettings {
		if p := s.field(c); *p == 0 {
			*p = s.Default
		}
	}
	if c.ImportChunkBytes == 0 {
		c.ImportChunkBytes = d.ImportChunkBytes
	}
	if c.LogLevel == "" {
		c.LogLevel = d.LogLevel
	}
	if c.LogFormat == "" {
		c.LogFormat = "text"
	}
	if c.RDMA == "" {
		c.RDMA = "auto"
	}
	if c.RDMAPort == 0 {
		c.RDMAPort = 1
	}
	if c.Fabric == "" {
		c.Fabric = "auto"
	}
	c.populateEngineLimits()
	c.populateIndexMode()
}

// validate checks a populated config and returns the pools it asks for.
func (c *Config) validate() ([]PoolSpec, error) {
	bad := badSetting
	// The node's name is its certificate's (peers read it from there), so
	// it takes a certificate name's characters: a name that no certificate
	// can carry passed here and failed once the agent had begun to start.
	if err := ValidNodeName(c.NodeName); err != nil {
		return nil, bad("node_name", "%v", err)
	}
	for _, d := range []struct{ key, path string }{{"data_dir", c.DataDir}, {"memory_dir", c.MemoryDir}} {
		if d.path == "" {
			continue
		}
		if err := notADir(d.path); err != nil {
			return nil, bad(d.key, "%v", err)
		}
	}
	if len(c.ClusterName) > membership.MaxClusterName {
		return nil, bad("cluster_name", "%d bytes, at most %d (gossip's label)", len(c.ClusterName), membership.MaxClusterName)
	}
	for _, a := range []struct{ field, addr string }{
		{"gossip_addr", c.GossipAddr}, {"gossip_advertise", c.GossipAdvertise},
		{"peer_addr", c.PeerAddr}, {"peer_advertise", c.PeerAdvertise},
	} {
		if a.addr == "" {
			continue
		}
		if err := checkAddr(a.field, a.addr); err != nil {
			return nil, err
		}
	}
	for i, j := range c.Join {
		if _, _, err := splitHostPort(j); err != nil {
			return nil, bad(fmt.Sprintf("join[%d]", i), "%v", err)
		}
	}
	if err := c.checkEngineSocket(); err != nil {
		return nil, err
	}
	if _, err := parseSocketMode(c.EngineSocketMode); err != nil {
		return nil, bad("engine_socket_mode", "%v", err)
	}
	if _, err := lookupGroup(c.EngineSocketGroup); err != nil {
		return nil, bad("engine_socket_group", "%v", err)
	}
	if c.MetricsAddr != "off" {
		if _, _, err := splitHostPort(c.MetricsAddr); err != nil {
			return nil, bad("metrics_addr", "%v (or \"off\")", err)
		}
	}
	if !c.Dev && (c.CAFile == "" || c.CertFile == "" || c.KeyFile == "") {
		return nil, bad(tlsFileKeys, "all three are required for mutual TLS between peers (make them with `kvfabric certs`), or use --dev for a local development cluster")
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return nil, bad("log_format", "%q is not text or json", c.LogFormat)
	}
	if _, err := parseLevel(c.LogLevel); err != nil {
		return nil, bad("log_level", "%v", err)
	}
	if c.LaneAddr != "" {
		if _, _, err := splitHostPort(c.LaneAddr); err != nil {
			return nil, bad("lane_addr", "%v", err)
		}
	}
	switch {
	case c.LanePlain && c.LaneAddr == "":
		return nil, bad("lane_plain", "set without lane_addr")
	case c.LaneConns < 0 || c.LaneConns > transfer.MaxLaneConns:
		return nil, bad("lane_conns", "%d not in 1..%d (0: %d)", c.LaneConns, transfer.MaxLaneConns, transfer.DefaultLaneConns)
	case c.LaneMaxPending < 0 || c.LaneMaxPending > MaxLanePending:
		return nil, bad("lane_max_pending", "%d not in 1..%d (0: %d)", c.LaneMaxPending, MaxLanePending, transfer.DefaultLaneMaxPending)
	case c.LaneMaxPendingPerSource < 0 || c.LaneMaxPendingPerSource > MaxLanePending:
		return nil, bad("lane_max_pending_per_source", "%d not in 1..%d (0: %d)", c.LaneMaxPendingPerSource, MaxLanePending, transfer.DefaultLaneMaxPendingPerSource)
	}
	switch {
	case c.Fabric != "auto" && c.Fabric != "verbs" && c.Fabric != "ofi" && c.Fabric != "off":
		return nil, bad("fabric", "%q is not auto, verbs, ofi or off", c.Fabric)
	case c.Fabric == "off" && c.RDMA == "on":
		return nil, bad("fabric", "off with rdma=on")
	case (c.FabricProvider != "" || c.FabricAddr != "") && (c.Fabric == "verbs" || c.Fabric == "off"):
		return nil, bad("fabric_provider", "libfabric's provider or address set with fabric=%s", c.Fabric)
	case len(c.FabricProvider) > 64 || strings.IndexFunc(c.FabricProvider, notProviderRune) >= 0:
		return nil, bad("fabric_provider", "%q is not a libfabric provider name (letters, digits, _ and ;, at most 64)", c.FabricProvider)
	case len(c.FabricAddr) > 255:
		return nil, bad("fabric_addr", "%d bytes, at most 255", len(c.FabricAddr))
	}
	switch {
	case c.RDMA != "auto" && c.RDMA != "on" && c.RDMA != "off":
		return nil, bad("rdma", "%q is not auto, on or off", c.RDMA)
	case c.RDMAPort < 1 || c.RDMAPort > 255:
		return nil, bad("rdma_port", "%d not in 1..255", c.RDMAPort)
	case c.RDMATimeout < 0 || c.RDMATimeout > 31:
		return nil, bad("rdma_timeout", "%d not in 1..31 (0: 14)", c.RDMATimeout)
	case c.RDMARetry < 0 || c.RDMARetry > 7:
		return nil, bad("rdma_retry", "%d not in 1..7 (0: 7)", c.RDMARetry)
	}
	for _, s := range durationSettings {
		if v := Duration(*s.field(c)); v < 0 {
			return nil, bad(s.Key, "%v is negative", v)
		} else if !s.within(time.Duration(v)) && s.Min == 0 {
			return nil, bad(s.Key, "%v is more than %v", v, Duration(s.Max))
		} else if !s.within(time.Duration(v)) {
			return nil, bad(s.Key, "%v is not in %s", v, s.Range())
		}
	}
	if c.ImportChunkBytes < minImportChunk || c.ImportChunkBytes > maxImportChunk {
		return nil, bad("import_chunk_bytes", "%d is not in %d..%d", c.ImportChunkBytes, minImportChunk, maxImportChunk)
	}
	if c.MaxLeasedPerPeer < 0 {
		return nil, bad("max_leased_per_peer", "%d is negative", c.MaxLeasedPerPeer)
	}
	if c.MaxLeased < 0 {
		return nil, bad("max_leased", "%d is negative", c.MaxLeased)
	}
	if c.BlockSetSlots < 0 || c.BlockSetSlots > layout.MaxSlots {
		return nil, bad("block_set_slots", "%d is not in 1..%d (0: a quarter of the pool)", c.BlockSetSlots, layout.MaxSlots)
	}
	if err := c.validateEngineLimits(); err != nil {
		return nil, err
	}
	if err := c.validateTiers(); err != nil {
		return nil, err
	}
	if err := c.validateIndexMode(); err != nil {
		return nil, err
	}
	var specs []PoolSpec
	hostAt, everyGPU := -1, false
	gpus := map[int]bool{}
	for i, p := range c.Pools {
		s, err := ParsePoolSpec(p)
		if err != nil {
			return nil, bad(fmt.Sprintf("pools[%d]", i), "%v", err)
		}
		switch {
		case s.Kind != "device" && hostAt >= 0:
			return nil, bad(fmt.Sprintf("pools[%d]", i), "%q: a second host or pinned pool (pools[%d] is one); an agent has one", p, hostAt)
		case s.Kind != "device":
			hostAt = i
		case s.GPU < 0 && (everyGPU || len(gpus) > 0), s.GPU >= 0 && (everyGPU || gpus[s.GPU]):
			return nil, bad(fmt.Sprintf("pools[%d]", i), "%q names a GPU that another device entry already sizes", p)
		case s.GPU < 0:
			everyGPU = true
		default:
			gpus[s.GPU] = true
		}
		specs = append(specs, s)
	}
	return specs, nil
}

// maxGPUIndex bounds the N of device:N, far above any node's GPU count.
const maxGPUIndex = 255

// ParsePoolSpec parses one entry of Config.Pools: "host=SIZE",
// "pinned=SIZE", "device=AMOUNT" or "device:N=AMOUNT", SIZE in bytes with
// an optional KiB, MiB, GiB or TiB suffix, AMOUNT a SIZE or a fraction of
// free memory with a point (0.5).
func ParsePoolSpec(s string) (PoolSpec, error) {
	kind, size, ok := strings.Cut(s, "=")
	if !ok {
		return PoolSpec{}, fmt.Errorf("%q is not KIND=SIZE (e.g. host=4GiB, device=0.5)", s)
	}
	spec := PoolSpec{Kind: kind}
	if k, n, ok := strings.Cut(kind, ":"); ok && k == "device" {
		g, err := strconv.ParseUint(n, 10, 16)
		if err != nil || g > maxGPUIndex {
			return PoolSpec{}, fmt.Errorf("%q: GPU %q is not a CUDA index 0..%d", s, n, maxGPUIndex)
		}
		spec.Kind, spec.GPU = "device", int(g)
	} else if kind == "device" {
		spec.GPU = -1
	}
	switch spec.Kind {
	case "host", "pinned":
	case "device":
		if strings.Contains(size, ".") {
			f, err := strconv.ParseFloat(size, 64)
			if err != nil || !(f > 0 && f <= 1) {
				return PoolSpec{}, fmt.Errorf("%q: fraction %q of free GPU memory is not in (0, 1]", s, size)
			}
			spec.Fraction = f
			return spec, nil
		}
	default:
		return PoolSpec{}, fmt.Errorf("%q: unknown pool kind %q (host, pinned, device or device:N)", s, kind)
	}
	n, err := ParseSize(size)
	if err != nil {
		return PoolSpec{}, fmt.Errorf("%q: %v", s, err)
	}
	if err := checkPoolFloor(s, n); err != nil {
		return PoolSpec{}, err
	}
	spec.Size = n
	return spec, nil
}

// sizeUnits are the units a size may end in: binary multiples, and B.
var sizeUnits = []struct {
	suffix string
	mult   uint64
}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"B", 1}}

// ParseSize parses a byte count with an optional binary suffix (KiB,
// MiB, GiB, TiB, or B). An error quotes the size as given.
func ParseSize(s string) (uint64, error) {
	num, mult := s, uint64(1)
	for _, u := range sizeUnits {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = v, u.mult
			break
		}
	}
	n, err := strconv.ParseUint(strings.TrimSpace(num), 10, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("size %q is not a positive number of bytes with an optional unit KiB, MiB, GiB, TiB or B (e.g. 512MiB, 4GiB)%s", s, unitHint(s))
	}
	if n > (1<<64-1)/mult {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * mult, nil
}

// unitHint names the unit a size ends in where it is none of sizeUnits
// and follows a number ("GB" of "1GB", "G" of "1G"), else "".
func unitHint(s string) string {
	i := strings.LastIndexFunc(s, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') })
	unit, num := s[i+1:], strings.TrimSpace(s[:i+1])
	if unit == "" || num == "" {
		return ""
	}
	for _, u := range sizeUnits {
		if unit == u.suffix {
			return ""
		}
	}
	return fmt.Sprintf(": %q is not one of them (sizes are binary: 1GiB is 1073741824 bytes)", unit)
}

func splitHostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%q is not host:port", addr)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("%q: port %q is not 0..65535", addr, port)
	}
	return host, int(p), nil
}

// checkAddr checks the address of one of the settings gossip_addr,
// gossip_advertise, peer_addr and peer_advertise: host:port, gossip's host
// an IP address (memberlist binds and advertises IP addresses and resolves
// no names), an advertised address one peers can reach (neither an
// unspecified IP such as 0.0.0.0, nor no host, nor port 0).
func checkAddr(key, addr string) error {
	host, port, err := splitHostPort(addr)
	if err != nil {
		return badSetting(key, "%v", err)
	}
	ip, ipErr := netip.ParseAddr(host)
	if strings.HasPrefix(key, "gossip_") && ipErr != nil {
		return badSetting(key, "%q: host %q is not an IP address (gossip binds and advertises IP addresses; it resolves no names)", addr, host)
	}
	if strings.HasSuffix(key, "_advertise") {
		if host == "" || ipErr == nil && ip.IsUnspecified() {
			return badSetting(key, "%q: no address other nodes can reach: advertise one of this node's addresses, or leave it out to have it derived", addr)
		}
		if port == 0 {
			return badSetting(key, "%q: port 0 is no port other nodes can reach: advertise the port bound", addr)
		}
	}
	return nil
}

// parseSocketMode parses Config.EngineSocketMode ("" is 0600).
func parseSocketMode(s string) (os.FileMode, error) {
	if s == "" {
		return 0o600, nil
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not an octal mode such as 0660", s)
	}
	m := os.FileMode(v)
	if m&^0o660 != 0 || m&0o600 != 0o600 {
		return 0, fmt.Errorf("%#o: want 0600, 0620, 0640 or 0660 (the owner reads and writes; no access for others, no execute bits)", v)
	}
	return m, nil
}

// lookupGroup returns the group id that Config.EngineSocketGroup names:
// a group name or a numeric id of a group that exists; "" is the agent's
// effective group.
func lookupGroup(s string) (int, error) {
	if s == "" {
		return os.Getegid(), nil
	}
	if _, err := strconv.ParseUint(s, 10, 32); err == nil {
		g, err := user.LookupGroupId(s)
		if err != nil {
			return 0, fmt.Errorf("group id %s: %v", s, err)
		}
		gid, _ := strconv.Atoi(g.Gid)
		return gid, nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("group %q: %v", s, err)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("group %q: id %q is not numeric", s, g.Gid)
	}
	return gid, nil
}

// newLogger is the agent's logger when Config.Logger is nil: format
// (text or json) at level on w. Both are validated.
func newLogger(w io.Writer, format, level string) *slog.Logger {
	lvl, _ := parseLevel(level)
	opts := &slog.HandlerOptions{Level: lvl}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("%q is not debug, info, warn or error", s)
	}
	return l, nil
}

// Resolved returns c with the defaults filled in and checked, as Start
// would run with it, without starting anything.
func (c Config) Resolved() (Config, error) {
	c.populate()
	if _, err := c.validate(); err != nil {
		return c, err
	}
	return c, nil
}

// MarshalConfig writes c in the configuration file's format, the one
// LoadConfigFile reads: JSON keys, durations as strings such as "30s".
func MarshalConfig(c Config) ([]byte, error) {
	b, err := json.Marshal(c)
	if err != nil {
		return nil, err
	}
	var fields map[string]any
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, err
	}
	for _, s := range durationSettings {
		if d := *s.field(&c); d != 0 {
			fields[s.Key] = Duration(d)
		}
	}
	return json.MarshalIndent(fields, "", "  ")
}

// Duration is a time.Duration that configuration files write as a string
// such as "30s" (its text form, which encoding/json uses).
type Duration time.Duration

// MarshalText writes d as String does ("10m", not "10m0s"), the form the
// command line's help gives defaults and bounds in.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads what time.ParseDuration reads.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// String is time.Duration's form without zero tails: "5m", "24h", "1h30m".
func (d Duration) String() string {
	s := time.Duration(d).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// DurationSetting is one duration field of Config: its file key, its
// default (what zero means) and its bounds.
type DurationSetting struct {
	// Field is the Config field's name, Key its JSON name.
	Field, Key string
	// Default is what zero means.
	Default time.Duration
	// Min and Max bound the value once zero took the default; zero Max
	// means no ceiling.
	Min, Max time.Duration

	field func(*Config) *time.Duration
}

// durationSettings are Config's durations. A new one is a Config field, a
// line here and its constants: defaults, validation, the file format and
// the command line's help follow.
var durationSettings = []DurationSetting{
	{Field: "BlockSetGrace", Key: "block_set_grace", Default: DefaultBlockSetGrace, Max: MaxBlockSetGrace,
		field: func(c *Config) *time.Duration { return &c.BlockSetGrace }},
	{Field: "SessionKeepalive", Key: "session_keepalive", Default: DefaultSessionKeepalive, Min: MinSessionKeepalive, Max: MaxSessionKeepalive,
		field: func(c *Config) *time.Duration { return &c.SessionKeepalive }},
	{Field: "LeaseDuration", Key: "lease_duration", Default: DefaultLeaseDuration, Min: MinLeaseDuration, Max: MaxLeaseDuration,
		field: func(c *Config) *time.Duration { return &c.LeaseDuration }},
	{Field: "MaxLeaseAge", Key: "max_lease_age", Default: DefaultMaxLeaseAge, Min: MinLeaseDuration, Max: MaxLeaseAgeCeiling,
		field: func(c *Config) *time.Duration { return &c.MaxLeaseAge }},
	{Field: "ImportTimeout", Key: "import_timeout", Default: DefaultImportTimeout, Min: MinImportTimeout, Max: MaxImportTimeout,
		field: func(c *Config) *time.Duration { return &c.ImportTimeout }},
	{Field: "PeerTimeout", Key: "peer_timeout", Default: DefaultPeerTimeout, Min: MinPeerTimeout, Max: MaxPeerTimeout,
		field: func(c *Config) *time.Duration { return &c.PeerTimeout }},
	{Field: "IndexCacheTTL", Key: "index_cache_ttl", Default: DefaultIndexCacheTTL, Min: MinIndexCacheTTL, Max: MaxIndexCacheTTL,
		field: func(c *Config) *time.Duration { return &c.IndexCacheTTL }},
	{Field: "LaneHelloTimeout", Key: "lane_hello_timeout", Default: transfer.DefaultLaneHelloTimeout, Min: MinLaneHelloTimeout, Max: MaxLaneHelloTimeout,
		field: func(c *Config) *time.Duration { return &c.LaneHelloTimeout }},
}

// DurationSettingOf returns the duration setting of the Config field
// named field; ok is false when it is not one.
func DurationSettingOf(field string) (s DurationSetting, ok bool) {
	for _, s := range durationSettings {
		if s.Field == field {
			return s, true
		}
	}
	return DurationSetting{}, false
}

func (s DurationSetting) within(v time.Duration) bool {
	return v >= s.Min && (s.Max == 0 || v <= s.Max)
}

// Range says the bounds as help and errors print them: "1s..5m", "at most
// 24h" (not "0s..24h": zero is the default, so the least that can be given
// is a nanosecond), or "" for none.
func (s DurationSetting) Range() string {
	switch {
	case s.Max == 0 && s.Min == 0:
		return ""
	case s.Max == 0:
		return fmt.Sprintf("at least %v", Duration(s.Min))
	case s.Min == 0:
		return fmt.Sprintf("at most %v", Duration(s.Max))
	}
	return fmt.Sprintf("%v..%v", Duration(s.Min), Duration(s.Max))
}

// notProviderRune reports a rune no libfabric provider name has.
func notProviderRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == ';')
}
