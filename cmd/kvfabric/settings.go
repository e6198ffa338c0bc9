package main

import (
	"flag"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/ofi"
)

// setting binds one agent setting: its flag, the fabric.Config field it
// sets and its help. Everything else comes from the field, so that a
// setting has one definition: the configuration file's key is the field's
// JSON name, the environment variable is KVFABRIC_ and that name in
// capitals, the value is parsed by the field's type, and the default is
// fabric's.
type setting struct {
	flag, field, help string
}

var agentSettings = []setting{
	{"node", "NodeName", "node name, also the name in its TLS certificate: 1 to 128 letters, digits, '-', '.' or '_' (default: host name)"},
	{"data-dir", "DataDir", "directory for the engine socket; --dev keeps its development CA beside it, in kvfabric-dev-ca (default /var/lib/kvfabric)"},
	{"gossip-addr", "GossipAddr", "IP:port gossip binds, UDP and TCP; an IP address, as gossip resolves no names (default 0.0.0.0:7946)"},
	{"gossip-advertise", "GossipAdvertise", "IP:port other nodes reach gossip at: an IP address of this node, not 0.0.0.0 nor port 0 (default: derived)"},
	{"join", "Join", "gossip host:port of a node to join; repeat or comma-separate (retried with backoff; each failure is logged with its reason)"},
	{"allow-alone", "AllowAlone", "/healthz answers ok while no --join seed has answered (default: 503 \"not joined\" until joined once)"},
	{"cluster", "ClusterName", "cluster name, at most 255 bytes (gossip's label); gossip from other clusters is ignored (default kvfabric)"},
	{"gossip-key-file", "GossipKeyFile", "gossip encryption keys, one base64 key per line, first used (default: unencrypted, with a warning)"},
	{"peer-addr", "PeerAddr", "host:port of the QUIC peer transport, UDP (default 0.0.0.0:7947)"},
	{"peer-advertise", "PeerAdvertise", "host:port peers dial: not 0.0.0.0 nor port 0 (default: derived)"},
	{"ca", "CAFile", "cluster CA certificate, PEM (from kvfabric certs ca)"},
	{"cert", "CertFile", "this node's certificate, PEM (from kvfabric certs node)"},
	{"key", "KeyFile", "this node's private key, PEM"},
	{"dev", "Dev", "authenticate peers with a development CA made on first use: for a local cluster only"},
	{"dev-ca-dir", "DevCADir", "where --dev keeps the development CA, shared by the agents of one machine (default: kvfabric-dev-ca beside the data dir)"},
	{"engine-socket", "EngineSocket", "engine API unix socket, at most 104 bytes (a unix socket's path holds 107, and PATH.fd beside it hands out pool memory descriptors) (default DATA_DIR/engine.sock)"},
	{"engine-socket-mode", "EngineSocketMode", "octal mode of the engine socket, its .fd companion and the named memory file: 0600, 0620, 0640 or 0660; with group access, the directories the agent makes for the socket are 0710 and the socket's group, and one there already that the group cannot search is named in a warning at start (default 0600)"},
	{"engine-socket-group", "EngineSocketGroup", "group (name or id) owning the engine socket, its .fd companion and the named memory file; an unknown group is refused (default: the agent's group)"},
	{"memory-dir", "MemoryDir", "make the pool's memory a named file in this directory (e.g. a Kubernetes hostPath shared with engine pods), removed on shutdown (default: none; engines get a descriptor over PATH.fd)"},
	{"metrics-addr", "MetricsAddr", `host:port of /metrics and /healthz, or "off" (default 127.0.0.1:7948)`},
	{"pool", "Pools", "memory pool, repeatable: host=SIZE, pinned=SIZE (through the CUDA driver where it loads, else mlock), device=AMOUNT (every GPU) or device:N=AMOUNT (GPU N), AMOUNT a SIZE or a fraction of free GPU memory such as 0.5; a SIZE is at least 1MiB, a host or pinned one at most the machine's memory; block sets come from the device pools where there is a GPU (a TP rank per GPU), else the host one (default host=1GiB)"},
	{"cuda-library", "CUDALibrary", "path of the CUDA driver library for device and pinned pools (default: $KVFABRIC_CUDA_LIB, then libcuda.so.1)"},
	{"block-set-slots", "BlockSetSlots", "slots of a block set an engine asks none for, 1..67108864 (default, or 0: a quarter of the pool)"},
	{"block-set-grace", "BlockSetGrace", "how long a block set no engine session uses keeps its cached blocks before it is freed (one that holds blocks is kept after it as a cache of the engine that is gone, unless --no-orphan-cache); a Register that needs the memory frees it at once"},
	{"session-keepalive", "SessionKeepalive", "how long an engine session may stay silent before the agent ends it and frees what it held; an engine that exits ends at once"},
	{"lease-duration", "LeaseDuration", "the longest this node pins blocks for an importer per lease or renewal, whatever it asks; importers ask for as much"},
	{"max-lease-age", "MaxLeaseAge", "how old a lease this node granted may be and still be renewed; a renewal past it is refused and the lease ends with its term, so no peer keeps blocks pinned here for good (far past any import's read of a chunk)"},
	{"max-leased-per-peer", "MaxLeasedPerPeer", "blocks one peer may hold leased on this node; past it leases are cut or refused (default: half the slots of the node's block sets)"},
	{"max-leased", "MaxLeased", "blocks all peers together may hold leased on this node (default: three quarters of the slots of its block sets)"},
	{"import-timeout", "ImportTimeout", "bound on one import, all holders tried, and on the tiers' work for an engine (read-ahead, waits for copies down); an engine's import asking for longer is cut to it"},
	{"import-chunk-bytes", "ImportChunkBytes", "bytes an import leases, reads and registers at a time, e.g. 64MiB; at most 4,096 blocks whatever their size (default 64MiB, 1MiB..4GiB)"},
	{"peer-timeout", "PeerTimeout", "how long a silent peer may hold up an import before it moves to another holder: each dial, call and read to a peer gives up after half of it"},
	{"rdma", "RDMA", "auto: read over RDMA where this node and the holder can, QUIC elsewhere; on: refuse to start without a usable RDMA device; off: QUIC only (default auto)"},
	{"rdma-device", "RDMADevice", "RDMA device to use for every pool, e.g. mlx5_0 (default: for device pools the one nearest each GPU, else the first with an active port; see kvfabric rdma devices)"},
	{"rdma-port", "RDMAPort", "port of the RDMA device, 1..255 (default 1)"},
	{"rdma-library", "RDMALibrary", "path of libibverbs (default: $KVFABRIC_IBVERBS_LIB, then libibverbs.so.1)"},
	{"rdma-timeout", "RDMATimeout", "queue-pair ACK timeout exponent, 1..31: each try waits 4.096us x 2^N (default 14)"},
	{"rdma-retry", "RDMARetry", "queue-pair retries after a timeout, 1..7; a dead holder fails a read after (N+1) tries (default 7: about 0.5s with timeout 14)"},
	{"lane-addr", "LaneAddr", "host:port of the TCP data lane (TLS 1.3 with the node's certificate; port 0: any free port), read by peers where RDMA is not there (default: none, peers read this node over QUIC)"},
	{"lane-plain", "LanePlain", "plain TCP on the lane, no TLS: only on a network that is private already (block data crosses it unencrypted; connections still need a token from the QUIC channel)"},
	{"lane-conns", "LaneConns", "lane connections to each holder, 1..16 (default 4)"},
	{"lane-max-pending", "LaneMaxPending", "connections to this node's lane not yet admitted (TLS handshake and token under way), 1..65536; one past it is closed at once, before any TLS work (default 256)"},
	{"lane-max-pending-per-source", "LaneMaxPendingPerSource", "the same bound per source IP address (agents behind one NAT address share it), 1..65536 (default 32)"},
	{"lane-hello-timeout", "LaneHelloTimeout", "how long a connection to this node's lane may take for its TLS handshake and token before it is closed, and how long this node waits for its own lane connections to holders, from the dial (at most half --peer-timeout), before it reads over QUIC; give every agent the same"},
	{"fabric", "Fabric", "what moves RDMA reads: verbs (libibverbs), ofi (libfabric: EFA, Slingshot), auto (verbs where libibverbs has a device, else libfabric's cxi, efa or verbs provider) or off (default auto)"},
	{"fabric-provider", "FabricProvider", "libfabric provider: cxi, efa, verbs, or tcp and shm, used only when named (default: cxi, then efa, then verbs)"},
	{"fabric-addr", "FabricAddr", "address libfabric's endpoint binds to, for providers that take one (tcp: an IP of this node)"},
	{"log-level", "LogLevel", "debug, info, warn or error (default info)"},
	{"log-format", "LogFormat", "text (key=value) or json (one object a line, for log collectors) (default text)"},
	{"no-checksums", "NoChecksums", "take and check no content checksums of blocks (default: a checksum per block registered in host memory, checked by every importer before it registers the block)"},

	{"engine-request-memory", "EngineRequestMemory", "bytes of engine requests served at once (twice their encoded size); past it a request fails RESOURCE_EXHAUSTED; at least 128MiB, the cost of the largest request (default 512MiB)"},
	{"engine-session-request-memory", "EngineSessionRequestMemory", "the same bound per engine session, 128MiB..--engine-request-memory (default 256MiB, or --engine-request-memory if less)"},
	{"engine-sessions", "EngineSessions", "engine sessions open at once, every process's, 1..65536; one past it fails RESOURCE_EXHAUSTED (default 1024)"},
	{"engine-sessions-per-process", "EngineSessionsPerProcess", "engine sessions one process may have open, 1..--engine-sessions; sessions of a process the agent cannot name (pid 0: an engine in a PID namespace the agent's does not show) count only against --engine-sessions (default 64)"},
	{"engine-quota", "EngineQuota", "pool bytes the block sets of one engine (by name) may take, at least 1MiB; another engine's cached sets are never freed for one over it (default, or 0: the pool divided among the engines with block sets)"},

	{"no-cluster-eviction", "NoClusterEviction", "recycle blocks by last use alone (default: among the blocks a pool may recycle, those other live nodes also hold go before those only this node holds)"},
	{"no-orphan-cache", "NoOrphanCache", "free a block set --block-set-grace after its last engine session ends, its blocks with it (default: a set that still holds blocks stays as a cache, announced and served to peers, taken up by the next engine of its layout, and freed first when a new block set needs the memory; a set with device slots retired after a failed copy is kept either way, as freeing it would withhold its memory from every other set)"},
	{"tier", "Tiers", "disk tier under the host or device pools, repeatable: disk=PATH:SIZE, PATH an absolute directory on a local disk (made if missing; a comma in it is part of it here, so repeat the flag for each tier, and none can be in the environment's comma-separated list), SIZE 16MiB..1000GiB; or host=SIZE, one host-memory tier of 16MiB..1TiB placed before the disk tiers, whose least recently used blocks move down to a disk tier when it is full (dropped with none) and which a restart empties; at most 8 tiers; blocks the pool recycles are copied there first, restored on use, served to peers and kept across restarts (default: none)"},
	{"tier-watermark", "TierWatermark", "fraction of a block set's slots in use past which its least recently used blocks are copied to the disk tier ahead of need, in (0, 1] (default 0.90; 0.85 over device pools)"},
	{"tier-queue", "TierQueue", "blocks waiting to be copied to the disk tier, 1..4096; a block that finds the queue full is recycled without a copy when its slot is needed (default 256)"},
	{"tier-in-flight", "TierInFlight", "fraction of a block set's slots that may wait for copies to the disk tier at once, in (0, 1]; past it, blocks recycled for an allocation are dropped as without a tier, so an engine writing faster than the disk never waits for it in Allocate (default 0.25; 1: drop nothing while the tier has room, and Allocate waits for copies instead)"},
	{"tier-staging-slots", "TierStagingSlots", "host slots disk-held blocks are staged into for peers' reads when no engine block set of their layout is here, 1..4096 (default 64)"},
	{"tier-block-bytes", "TierBlockBytes", "room of one block on a disk tier, e.g. 8MiB, at most 1GiB; larger blocks are not copied down (default, or 0: the first block's size, recorded in the tier's directory)"},
	{"tier-read-ahead", "TierReadAhead", "blocks read ahead along a sequence after a restore from a tier: the blocks that followed the last one restored, brought up in the background into the engine's block set (free slots, or those of unused blocks a tier holds too), cached there for its next Acquire; at most half the blocks the set keeps, counting those read and not yet taken; 0..256, 0 turns it off (default 16)"},
	{"index-mode", "IndexMode", "how the block index is kept: whole (every node indexes every block, by gossip; up to a few hundred nodes) or owned (each hash indexed by --index-replicas members chosen by rendezvous hashing, lookups ask them; past that); the same on every node (default whole)"},
	{"index-replicas", "IndexReplicas", "owners of each block hash with --index-mode owned, 1..8 (default 3)"},
	{"index-cache-ttl", "IndexCacheTTL", "how long --index-mode owned reuses an owner's answer about a hash before asking again"},
	{"index-max-node-blocks", "IndexMaxNodeBlocks", "distinct block hashes this node's index keeps for one other holder, in either index mode; past it the holder's stores of hashes not held already are counted (kvfabric_index_stores_refused_total) and not indexed; set on every node above the blocks any node's pools and tiers hold, as the agent warns where its own hold more (default 67108864: 8 TiB in blocks of 128 KiB)"},

	{"dumpable", "Dumpable", "keep the agent's process dumpable, for debuggers, core dumps and the software stand-ins of RDMA and CUDA used in tests (softverbs, softcuda), which read the agent's memory from other processes; real RDMA and CUDA IPC do not need it (default: on Linux the agent makes itself non-dumpable at start, so that no other process of its user can open the engines' memory through /proc/PID/fd or attach to it, and it writes no core dump)"},

	{"pool-recycle-ahead", "PoolRecycleAhead", "recycle a block set's least recently used blocks ahead of need, in batches: from 5% of its slots free until 10% are (default: a block is recycled only when an allocation needs its slot, so the whole set caches; with --tier, blocks are copied down ahead of need by --tier-watermark)"},
}

// The KVFABRIC_ variables that are not settings of fabric.Config: the
// agent's config file, and the client commands' engine socket.
const (
	configFileEnv   = "KVFABRIC_CONFIG"
	clientSocketEnv = "KVFABRIC_SOCKET"
)

// configKey is the file key of a Config field: its JSON name.
func configKey(field string) string {
	f, ok := reflect.TypeFor[fabric.Config]().FieldByName(field)
	if !ok {
		panic("kvfabric: no fabric.Config field " + field) // a mistake in agentSettings, caught by its test
	}
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

// envName is the environment variable of a Config field.
func envName(field string) string { return "KVFABRIC_" + strings.ToUpper(configKey(field)) }

// settingValue collects a flag's values; it is applied after the file and
// the environment, so that flags given win.
type settingValue struct {
	typ  reflect.Type
	vals []string
}

func (v *settingValue) String() string { return strings.Join(v.vals, ",") }

func (v *settingValue) Set(s string) error {
	if v.typ.Kind() != reflect.Slice {
		v.vals = v.vals[:0] // a single-valued flag given twice: the last wins
	}
	v.vals = append(v.vals, s)
	return nil
}

func (v *settingValue) IsBoolFlag() bool { return v.typ.Kind() == reflect.Bool }

// boundSettings are the agent's settings as flags on one flag set.
type boundSettings map[string]*settingValue // by field

// bindSettings defines a flag for every setting, its help saying where
// else the setting can come from.
func bindSettings(fs *flag.FlagSet) boundSettings {
	b := boundSettings{}
	ct := reflect.TypeFor[fabric.Config]()
	for _, s := range agentSettings {
		f, _ := ct.FieldByName(s.field)
		v := &settingValue{typ: f.Type}
		b[s.field] = v
		help := s.help
		if d, ok := fabric.DurationSettingOf(s.field); ok {
			// Durations' defaults and bounds are fabric's constants.
			if r := d.Range(); r != "" {
				help += fmt.Sprintf(" (default %v, %s)", fabric.Duration(d.Default), r)
			} else {
				help += fmt.Sprintf(" (default %v)", fabric.Duration(d.Default))
			}
		}
		fs.Var(v, s.flag, fmt.Sprintf("%s [file: %s, env: %s]", help, configKey(s.field), envName(s.field)))
	}
	return b
}

// applyEnv sets cfg's fields from KVFABRIC_ variables; a variable that
// names no setting is refused, so that a misspelled one is not ignored.
// The libraries' own variables (the libibverbs, libfabric and libcuda paths, read
// where the settings leave the path empty) are not settings, and pass.
func applyEnv(cfg *fabric.Config, environ []string) error {
	known := map[string]string{}
	for _, s := range agentSettings {
		known[envName(s.field)] = s.field
	}
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "KVFABRIC_") || name == clientSocketEnv || name == configFileEnv ||
			name == rdma.EnvLibrary || name == cuda.EnvLibrary || name == ofi.EnvLibrary {
			continue
		}
		field, ok := known[name]
		if !ok {
			return usagef("environment variable %s is not a setting of kvfabric agent (see kvfabric agent -h)", name)
		}
		vals := []string{val}
		if reflect.ValueOf(cfg).Elem().FieldByName(field).Kind() == reflect.Slice {
			vals = strings.Split(val, ",") // a list: comma-separated
		}
		if err := setField(cfg, field, vals); err != nil {
			return usagef("environment variable %s=%q: %v", name, val, err)
		}
	}
	return nil
}

// repeatedOnly are the list settings whose flag is repeated, one entry a
// flag, never comma-separated: a tier's path may hold a comma. Their
// environment variables are comma-separated lists all the same.
var repeatedOnly = map[string]bool{"Tiers": true}

// applyFlags sets cfg's fields from the flags given.
func (b boundSettings) applyFlags(cfg *fabric.Config) error {
	for _, s := range agentSettings {
		v := b[s.field]
		if len(v.vals) == 0 {
			continue
		}
		vals := v.vals
		if v.typ.Kind() == reflect.Slice && !repeatedOnly[s.field] {
			// Repeated or comma-separated.
			vals = nil
			for _, x := range v.vals {
				vals = append(vals, strings.Split(x, ",")...)
			}
		}
		if err := setField(cfg, s.field, vals); err != nil {
			return usagef("--%s %q: %v", s.flag, v.String(), err)
		}
	}
	return nil
}

// setField parses vals as the type of cfg's field and sets it: strings,
// booleans, ints, durations (30s), sizes for int64 byte counts (64MiB, or
// 0 for the default), and lists.
func setField(cfg *fabric.Config, field string, vals []string) error {
	f := reflect.ValueOf(cfg).Elem().FieldByName(field)
	one := strings.TrimSpace(vals[len(vals)-1])
	switch {
	case f.Kind() == reflect.Slice:
		var list []string
		for _, x := range vals {
			if x = strings.TrimSpace(x); x != "" {
				list = append(list, x)
			}
		}
		f.Set(reflect.ValueOf(list))
	case f.Kind() == reflect.String:
		f.SetString(one)
	case f.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(one)
		if err != nil {
			return fmt.Errorf("want true or false")
		}
		f.SetBool(b)
	case f.Type() == reflect.TypeFor[time.Duration]():
		d, err := time.ParseDuration(one)
		if err != nil {
			return fmt.Errorf("want a duration such as 30s")
		}
		f.SetInt(int64(d))
	case f.Kind() == reflect.Int64 && one == "0":
		// The default, as 0 in the file is: the only way back to a
		// default that no size spells (engine_quota's fair share,
		// tier_block_bytes' first block) over a file's value.
		f.SetInt(0)
	case f.Kind() == reflect.Int64:
		n, err := fabric.ParseSize(one)
		if err != nil || n > math.MaxInt64 {
			return fmt.Errorf("want a size such as 64MiB, or 0 for the default")
		}
		f.SetInt(int64(n))
	case f.Kind() == reflect.Float64:
		x, err := strconv.ParseFloat(one, 64)
		if err != nil {
			return fmt.Errorf("want a number such as 0.9")
		}
		f.SetFloat(x)
	case f.Kind() == reflect.Int:
		n, err := strconv.Atoi(one)
		if err != nil {
			return fmt.Errorf("want a whole number")
		}
		f.SetInt(int64(n))
	default:
		return fmt.Errorf("settings of type %s cannot be given here", f.Type())
	}
	return nil
}
