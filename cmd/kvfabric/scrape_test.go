package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/internal/wait"
)

// startScraped starts an agent named name alone on loopback, with a 64 MiB
// host pool and the command's metrics handler, after tweak changes its
// config (dir is the test's directory for it); the agent is closed and the
// directory removed when the test ends.
func startScraped(t *testing.T, name string, tweak func(c *fabric.Config, dir string)) *fabric.Agent {
	t.Helper()
	dir, err := os.MkdirTemp("", "kvf"+name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	var running atomic.Pointer[fabric.Agent]
	c := fabric.DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = name, filepath.Join(dir, "d"), filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	c.Pools = []string{"host=64MiB"}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c.MetricsHandler = metricsHandler(&running)
	if tweak != nil {
		tweak(&c, dir)
	}
	a, err := fabric.Start(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	running.Store(a)
	return a
}

// scrapeUntil scrapes a's /metrics until ok accepts the families (for up
// to 10 s, what naming the wait) and returns the last scrape's; an
// exposition that Prometheus's own parser refuses fails the test.
func scrapeUntil(t *testing.T, a *fabric.Agent, what string, ok func(map[string]*dto.MetricFamily) error) map[string]*dto.MetricFamily {
	t.Helper()
	var fams map[string]*dto.MetricFamily
	wait.For(t, 10*time.Second, what, func() error {
		resp, err := http.Get("http://" + a.MetricsAddr() + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		p := expfmt.NewTextParser(model.UTF8Validation)
		if fams, err = p.TextToMetricFamilies(resp.Body); err != nil {
			t.Fatalf("the exposition does not parse: %v", err)
		}
		return ok(fams)
	})
	return fams
}
