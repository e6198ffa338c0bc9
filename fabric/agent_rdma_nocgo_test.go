//go:build !cgo || !linux

package fabric_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
)

// A build without cgo has no RDMA: rdma=on refuses to start and says
// why; rdma=auto starts, says it once, and reports RDMA off.
func TestRDMAInABuildWithoutCgo(t *testing.T) {
	c := testConfig(t, "n1")
	c.RDMA = "on"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if a, err := fabric.Start(ctx, c); err == nil {
		a.Close()
		t.Fatal("rdma=on started in a build without cgo")
	} else if !errors.Is(err, fabric.ErrConfig) || !strings.Contains(err.Error(), "rdma: on, and") || !strings.Contains(err.Error(), "without cgo") {
		t.Errorf("error %q: want fabric.ErrConfig naming rdma on and the build", err)
	}

	var log logBuffer
	c = testConfig(t, "n2")
	c.RDMA = "auto"
	c.Logger = slog.New(slog.NewTextHandler(&log, nil))
	a := startAgent(t, c)
	if n := strings.Count(log.String(), `msg="RDMA off: reads use QUIC"`); n != 1 || !strings.Contains(log.String(), "without cgo") {
		t.Errorf("logged RDMA off %d times (want once, naming the build):\n%s", n, log.String())
	}
	if m := a.Metrics(); m.RDMAEnabled {
		t.Error("RDMA enabled in a build without cgo")
	}
}

// removeGPULibs has nothing to remove in a build without cgo: no GPU test
// builds softcuda there.
func removeGPULibs() {}

// gpuLibs: the software GPU and NIC are C libraries the tests build with
// cgo; a test that needs them cannot run in a build without it.
func gpuLibs(t *testing.T) (cudaLib, verbsLib string) {
	t.Helper()
	t.Skip("softcuda and softverbs are built with cgo, which this build has not")
	return "", ""
}
