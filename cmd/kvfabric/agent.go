package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
)

// listFlag is a flag that may be repeated or given comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

func runAgent(e *env, args []string) error {
	fs := newFlags(e, "agent", "[flags]", `
Runs the kvfabric agent of this node: it joins the cluster by gossip, owns
the node's KV block pools, serves the engine API on a unix socket, and
imports blocks from other nodes. Settings come from the defaults, then the
--config file (JSON, the flags' names in snake_case, as in
deploy/agent.json), then the flags given. SIGINT or SIGTERM leave the
cluster gracefully and release everything; SIGHUP reloads the TLS files
and the gossip key file without leaving (what fails its checks is refused
and what was in use stays).`)
	var (
		configFile  = fs.String("config", "", "JSON config file (flags given override it)")
		local       = fs.Bool("local", false, "loopback defaults: addresses on 127.0.0.1, fast gossip timings, --dev")
		node        = fs.String("node", "", "node name, also the name in its TLS certificate (default: host name)")
		dataDir     = fs.String("data-dir", "", "directory for the engine socket and the development CA (default /var/lib/kvfabric)")
		gossipAddr  = fs.String("gossip-addr", "", "host:port gossip binds, UDP and TCP (default 0.0.0.0:7946)")
		gossipAdv   = fs.String("gossip-advertise", "", "host:port other nodes reach gossip at (default: derived)")
		cluster     = fs.String("cluster", "", "cluster name; gossip from other clusters is ignored (default kvfabric)")
		keyFile     = fs.String("gossip-key-file", "", "gossip encryption keys, one base64 key per line, first used (default: unencrypted, with a warning)")
		peerAddr    = fs.String("peer-addr", "", "host:port of the QUIC peer transport, UDP (default 0.0.0.0:7947)")
		peerAdv     = fs.String("peer-advertise", "", "host:port peers dial (default: derived)")
		caFile      = fs.String("ca", "", "cluster CA certificate, PEM (from kvfabric certs ca)")
		certFile    = fs.String("cert", "", "this node's certificate, PEM (from kvfabric certs node)")
		keyPEM      = fs.String("key", "", "this node's private key, PEM")
		dev         = fs.Bool("dev", false, "authenticate peers with a development CA made on first use: for a local cluster only")
		devCADir    = fs.String("dev-ca-dir", "", "where --dev keeps the development CA, shared by the agents of one machine (default: kvfabric-dev-ca beside the data dir)")
		socket      = fs.String("engine-socket", "", "engine API unix socket, mode 0600 (default DATA_DIR/engine.sock)")
		metricsAddr = fs.String("metrics-addr", "", `host:port of /metrics and /healthz, or "off" (default 127.0.0.1:7948)`)
		slots       = fs.Int("block-set-slots", 0, "slots of a block set an engine asks none for (default: a quarter of the pool)")
		logLevel    = fs.String("log-level", "", "debug, info, warn or error (default info)")
		logFormat   = fs.String("log-format", "", "text (key=value) or json (one object a line, for log collectors) (default text)")
		leaseDur    = fs.Duration("lease-duration", 0, "the longest this node pins blocks for an importer per lease or renewal, whatever it asks; importers ask for as much (default 30s, 1s..5m)")
		importTO    = fs.Duration("import-timeout", 0, "bound on one import, all holders tried (default 30s)")
		peerTO      = fs.Duration("peer-timeout", 0, "how long a silent peer may stall a call (default 2s)")
		chunk       = fs.String("import-chunk-bytes", "", "bytes an import leases, reads and registers at a time, e.g. 64MiB; at most 4,096 blocks whatever their size (default 64MiB, 1MiB..4GiB)")
		leasedPeer  = fs.Int("max-leased-per-peer", 0, "blocks one peer may hold leased on this node; past it leases are cut or refused (default: half the slots of the node's block sets)")
		leasedAll   = fs.Int("max-leased", 0, "blocks all peers together may hold leased on this node (default: three quarters of the slots of its block sets)")
		allowAlone  = fs.Bool("allow-alone", false, "/healthz answers ok while no --join seed has answered (default: 503 \"not joined\" until joined once)")
		join, pools listFlag
	)
	fs.Var(&join, "join", "gossip host:port of a node to join; repeat or comma-separate (retried with backoff; each failure is logged with its reason)")
	fs.Var(&pools, "pool", "memory pool KIND=SIZE, kind host or pinned, e.g. host=4GiB (default host=1GiB)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	cfg := fabric.DefaultConfig()
	if *local {
		cfg = fabric.DefaultLocalConfig()
	}
	if *configFile != "" {
		var err error
		if cfg, err = fabric.LoadConfigFile(*configFile, cfg); err != nil {
			return err
		}
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	str := func(name string, dst *string, v string) {
		if set[name] {
			*dst = v
		}
	}
	str("node", &cfg.NodeName, *node)
	str("data-dir", &cfg.DataDir, *dataDir)
	str("gossip-addr", &cfg.GossipAddr, *gossipAddr)
	str("gossip-advertise", &cfg.GossipAdvertise, *gossipAdv)
	str("cluster", &cfg.ClusterName, *cluster)
	str("gossip-key-file", &cfg.GossipKeyFile, *keyFile)
	str("peer-addr", &cfg.PeerAddr, *peerAddr)
	str("peer-advertise", &cfg.PeerAdvertise, *peerAdv)
	str("ca", &cfg.CAFile, *caFile)
	str("cert", &cfg.CertFile, *certFile)
	str("key", &cfg.KeyFile, *keyPEM)
	str("engine-socket", &cfg.EngineSocket, *socket)
	str("dev-ca-dir", &cfg.DevCADir, *devCADir)
	str("metrics-addr", &cfg.MetricsAddr, *metricsAddr)
	str("log-level", &cfg.LogLevel, *logLevel)
	str("log-format", &cfg.LogFormat, *logFormat)
	if set["dev"] {
		cfg.Dev = *dev
	}
	if set["join"] {
		cfg.Join = join
	}
	if set["allow-alone"] {
		cfg.AllowAlone = *allowAlone
	}
	if set["pool"] {
		cfg.Pools = pools
	}
	if set["block-set-slots"] {
		cfg.BlockSetSlots = *slots
	}
	if set["import-chunk-bytes"] {
		n, err := fabric.ParseSize(*chunk)
		if err != nil || n > math.MaxInt64 {
			return usagef("--import-chunk-bytes %q: want a size such as 64MiB", *chunk)
		}
		cfg.ImportChunkBytes = int64(n)
	}
	if set["max-leased-per-peer"] {
		cfg.MaxLeasedPerPeer = *leasedPeer
	}
	if set["max-leased"] {
		cfg.MaxLeased = *leasedAll
	}
	for name, d := range map[string]struct {
		v   time.Duration
		dst *time.Duration
	}{"lease-duration": {*leaseDur, &cfg.LeaseDuration}, "import-timeout": {*importTO, &cfg.ImportTimeout}, "peer-timeout": {*peerTO, &cfg.PeerTimeout}} {
		if set[name] {
			*d.dst = d.v
		}
	}

	// The agent counts; this program exports, as Prometheus metrics.
	var running atomic.Pointer[fabric.Agent]
	cfg.MetricsHandler = metricsHandler(&running)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP reloads the certificates and gossip keys; without a handler
	// it would end the process without leaving the cluster.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	a, err := fabric.Start(startCtx, cfg)
	cancel()
	if errors.Is(err, fabric.ErrConfig) {
		return usagef("%v", err)
	}
	if err != nil {
		return err
	}
	running.Store(a)
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(e.stderr, "kvfabric agent: stopping")
			return a.Close()
		case <-a.Done():
			// Stopped by itself: its name is taken.
			a.Close()
			return a.Err()
		case <-hup:
			a.Reload() // logs what it did, or why it kept what was in use
		}
	}
}
