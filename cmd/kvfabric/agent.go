package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
)

func runAgent(e *env, args []string) error {
	fs := newFlags(e, "agent", "[flags]", `
Runs the kvfabric agent of this node: it joins the cluster by gossip, owns
the node's KV block pools, serves the engine API on a unix socket, and
imports blocks from other nodes. Settings come from the defaults, then the
--config file (JSON, as in deploy/agent.json), then KVFABRIC_ environment
variables, then the flags given; each flag's help names its file key and
variable, and --print-config shows the result. SIGINT or SIGTERM leave the
cluster gracefully and release everything; SIGHUP reloads the TLS files
and the gossip key file without leaving (what fails its checks is refused
and what was in use stays).`)
	configFile := fs.String("config", "", "JSON config file (the environment and flags given override it) [env: KVFABRIC_CONFIG]")
	local := fs.Bool("local", false, "loopback defaults: addresses on 127.0.0.1, fast gossip timings, --dev")
	printConfig := fs.Bool("print-config", false, "print the effective settings (defaults, file, environment and flags) in the config file's format, and exit")
	bound := bindSettings(fs)
	profiles := bindPprof(fs)
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
	file := *configFile
	if file == "" {
		file = e.getenv(configFileEnv)
	}
	if file != "" {
		var err error
		if cfg, err = fabric.LoadConfigFile(file, cfg); err != nil {
			return err
		}
	}
	if err := applyEnv(&cfg, e.environ()); err != nil {
		return err
	}
	if err := bound.applyFlags(&cfg); err != nil {
		return err
	}
	if *printConfig {
		eff, err := cfg.Resolved()
		if err != nil {
			return configUsage(err)
		}
		b, err := fabric.MarshalConfig(eff)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n", b)
		return err
	}

	// Profiles, when asked for, are served from before the agent starts
	// until it has stopped, so that a slow start or stop can be profiled.
	ln, err := profiles.listen()
	if err != nil {
		return err
	}
	if ln != nil {
		defer servePprof(ln, e.stderr)()
		fmt.Fprintf(e.stderr, "kvfabric agent: Go profiles at http://%s/debug/pprof/\n", ln.Addr())
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
		return configUsage(err)
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

// configUsage is the usage error of a configuration error. One about a
// setting names its flag beside its file key ("tiers[1] (--tier): ..."):
// the key is the file's and the environment's name of it, the flag the
// command line's.
func configUsage(err error) error {
	var se *fabric.SettingError
	if errors.As(err, &se) {
		for _, s := range agentSettings {
			if configKey(s.field) == se.Setting() {
				se.Key = fmt.Sprintf("%s (--%s)", se.Key, s.flag)
				break
			}
		}
	}
	return usagef("%v", err)
}
