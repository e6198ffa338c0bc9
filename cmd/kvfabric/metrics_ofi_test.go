//go:build cgo && linux

package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvfabric/kvfabric/fabric"
)

// An agent reading over libfabric's tcp provider says so: the binding
// gauge carries it, and status names it as its pool's RDMA device.
func TestMetricsAndStatusNameTheOFIProvider(t *testing.T) {
	dir := t.TempDir()
	var running atomic.Pointer[fabric.Agent]
	c := fabric.DefaultLocalConfig()
	c.NodeName, c.DataDir, c.DevCADir = "ofi1", filepath.Join(dir, "d"), filepath.Join(dir, "ca")
	c.GossipAddr, c.PeerAddr, c.MetricsAddr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	c.Pools = []string{"host=16MiB"}
	c.RDMA, c.Fabric, c.FabricProvider, c.FabricAddr = "on", "ofi", "tcp", "127.0.0.1"
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c.MetricsHandler = metricsHandler(&running)
	a, err := fabric.Start(context.Background(), c)
	if err != nil {
		t.Fatalf("start over libfabric's tcp provider (make test-deps installs libfabric): %v", err)
	}
	t.Cleanup(func() { a.Close() })
	running.Store(a)
	resp, err := http.Get("http://" + a.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	f := fams["kvfabric_rdma_binding"]
	if f == nil || len(f.Metric) != 1 || len(f.Metric[0].Label) != 1 || !strings.HasPrefix(f.Metric[0].Label[0].GetValue(), "ofi:tcp") ||
		f.Metric[0].GetGauge().GetValue() != 1 {
		t.Fatalf("kvfabric_rdma_binding: %v, want one gauge of 1 labelled ofi:tcp...", f)
	}
	for _, name := range []string{"kvfabric_rdma_endpoint_reopens_total", "kvfabric_rdma_endpoint_reopen_failures_total"} {
		if f := fams[name]; f == nil || len(f.Metric) != 1 || f.Metric[0].GetCounter().GetValue() != 0 {
			t.Errorf("%s: %v, want one counter at 0", name, f)
		}
	}
	code, out, errs := runCmd(t, "", "status", "--socket", a.EngineSocket())
	if code != 0 || !strings.Contains(out, "ofi:tcp") {
		t.Fatalf("status (exit %d, stderr %s) does not name the provider:\n%s", code, errs, out)
	}
}
