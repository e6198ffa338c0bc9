//go:build cgo && linux

package fabric_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/rdma/softverbs"
)

// softNIC builds softverbs, the software NIC, once per test binary and
// gives this test a registry of its own.
func softNIC(t *testing.T) string {
	t.Helper()
	softLib, err := softverbs.BuildShared()
	if err != nil {
		t.Fatalf("softverbs (make test installs libibverbs-dev): %v", err)
	}
	t.Setenv("SOFTVERBS_REGISTRY", filepath.Join(t.TempDir(), "registry"))
	return softLib
}

// importOverRDMA has n1's TP 4 engine store 20 blocks and n2's TP 2
// engine import them, every byte checked; the import must name rdma as its
// one transport and n2's metrics count every byte as RDMA's, whichever
// binding (verbs or libfabric) carried them. It returns n2's metrics.
func importOverRDMA(t *testing.T, n1, n2 *fabric.Agent) fabric.Metrics {
	t.Helper()
	hashes := produce(t, n1, 4, layout.HND, 20)
	wait.For(t, 5*time.Second, "n2 indexes n1's blocks", func() error {
		if got := agentStatus(t, n2).Members["n1"]; got != 20 {
			return fmt.Errorf("n2 indexes %d blocks of n1", got)
		}
		return nil
	})
	if via := importAll(t, n2, 2, layout.NHD, hashes); len(via) != 1 || via[0] != "rdma" {
		t.Fatalf("fetches over %v, want one over rdma", via)
	}
	m := n2.Metrics()
	if !m.RDMAEnabled || m.ImportBytes == 0 || m.ImportBytesRDMA != m.ImportBytes || m.RDMA.Bytes != m.ImportBytes || m.RDMA.Reads == 0 {
		t.Errorf("importer's metrics: enabled %v, import bytes %d (rdma %d), rdma %+v; want every byte over rdma",
			m.RDMAEnabled, m.ImportBytes, m.ImportBytesRDMA, m.RDMA)
	}
	return m
}

// TP 4 -> TP 2 between in-process agents with RDMA on over softverbs:
// byte for byte, the fetch says rdma, and the importer's metrics count
// the bytes as RDMA's and nothing as QUIC's.
func TestImportOverRDMA(t *testing.T) {
	lib := softNIC(t)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		c.RDMA, c.RDMALibrary = "on", lib
	})
	n1, n2 := agents[0], agents[1]
	m := importOverRDMA(t, n1, n2)
	if m.Transport.BytesRead != m.RDMA.Bytes {
		t.Errorf("importer read %d bytes, %d of them over rdma: the rest went over quic", m.Transport.BytesRead, m.RDMA.Bytes)
	}
	if len(m.RDMA.Fallbacks) != 0 {
		t.Errorf("fallbacks to quic: %v", m.RDMA.Fallbacks)
	}
	// The holder's block set is memory of its own per rank (engines map
	// only their sets), registered with the NIC as the set was made.
	set, err := dial(t, n1).Register(context.Background(), client.Engine{Name: "producer", Model: testModel, TPSize: 4, PageSize: 16, Order: layout.HND, Slots: 64})
	if err != nil {
		t.Fatal(err)
	}
	var setBytes uint64
	tokens := map[string]bool{}
	for _, m := range set.Memory {
		setBytes += m.GetFileSize()
		tokens[m.GetToken()] = true
	}
	if len(tokens) != 4 {
		t.Errorf("the holder's 4 ranks name %d memory tokens, want one each", len(tokens))
	}
	if hm := n1.Metrics(); hm.RDMA.QPsServed == 0 || hm.RDMA.RegisteredBytes != setBytes || hm.Transport.BytesServed != 0 {
		t.Errorf("holder's metrics: %+v, served %d bytes over quic; want queue pairs served, its block set's %d bytes registered, nothing over quic",
			hm.RDMA, hm.Transport.BytesServed, setBytes)
	}
}

// rdma=on refuses to start without a usable device, with an error that
// says why; rdma=auto starts, says once why RDMA is off, and imports
// over QUIC.
func TestRDMAOnWithoutDeviceRefusesToStart(t *testing.T) {
	lib := softNIC(t)
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	for _, tc := range []struct {
		name, lib, device string
		env               []string
		want              string
	}{
		{name: "no library", lib: missing, want: missing},
		{name: "port down", lib: lib, env: []string{"SOFTVERBS_PORT_STATE=down"}, want: "port 1 active"},
		{name: "no such device", lib: lib, device: "mlx5_7", want: "mlx5_7"},
		{name: "named device's port down", lib: lib, device: "softverbs0", env: []string{"SOFTVERBS_PORT_STATE=down"}, want: "softverbs0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			c := testConfig(t, "n1")
			c.RDMA, c.RDMALibrary, c.RDMADevice = "on", tc.lib, tc.device
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := fabric.Start(ctx, c)
			if err == nil {
				a.Close()
				t.Fatal("rdma=on started without a usable device")
			}
			if !errors.Is(err, fabric.ErrConfig) || !strings.Contains(err.Error(), "rdma: on, and") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q: want fabric.ErrConfig naming rdma on and %q", err, tc.want)
			}
			t.Logf("refused: %v", err)
		})
	}
}

func TestRDMAAutoWithoutLibraryUsesQUIC(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	logs := make([]*logBuffer, 2)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		logs[i] = &logBuffer{}
		c.RDMA, c.RDMALibrary = "auto", missing
		c.Logger = slog.New(slog.NewTextHandler(logs[i], nil))
	})
	n1, n2 := agents[0], agents[1]
	for i, l := range logs {
		out := l.String()
		if n := strings.Count(out, `msg="RDMA off: reads use QUIC"`); n != 1 || !strings.Contains(out, missing) {
			t.Errorf("n%d logged RDMA off %d times (want once, naming %s):\n%s", i+1, n, missing, out)
		}
	}
	hashes := produce(t, n1, 4, layout.HND, 8)
	wait.For(t, 5*time.Second, "n2 indexes n1's blocks", func() error {
		if got := agentStatus(t, n2).Members["n1"]; got != 8 {
			return fmt.Errorf("n2 indexes %d blocks of n1", got)
		}
		return nil
	})
	if via := importAll(t, n2, 2, layout.NHD, hashes); len(via) != 1 || via[0] != "quic" {
		t.Fatalf("fetches over %v, want one over quic", via)
	}
	if m := n2.Metrics(); m.RDMAEnabled || m.ImportBytesRDMA != 0 || m.ImportBytes == 0 {
		t.Errorf("importer's metrics: rdma enabled %v, %d of %d bytes over rdma", m.RDMAEnabled, m.ImportBytesRDMA, m.ImportBytes)
	}
}

// With RDMA, each block set's memory is registered with the NIC when the
// set is made and deregistered when it is freed; a set made in the freed
// memory is registered afresh and served over RDMA byte for byte.
func TestRDMARegistersSetBySet(t *testing.T) {
	lib := softNIC(t)
	agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
		c.RDMA, c.RDMALibrary = "on", lib
		c.BlockSetGrace = 100 * time.Millisecond
	})
	n1, n2 := agents[0], agents[1]
	if m := n1.Metrics(); m.RDMA.RegisteredBytes != 0 {
		t.Fatalf("%d bytes registered before any block set", m.RDMA.RegisteredBytes)
	}
	ctx := context.Background()
	c := dial(t, n1)
	first, err := c.Register(ctx, client.Engine{Name: "first", Model: testModel, TPSize: 2, PageSize: 16, Order: layout.NHD, Slots: 32})
	if err != nil {
		t.Fatal(err)
	}
	if m := n1.Metrics(); m.RDMA.RegisteredBytes != first.Memory[0].GetFileSize()+first.Memory[1].GetFileSize() {
		t.Fatalf("%d bytes registered, want the set's", m.RDMA.RegisteredBytes)
	}
	if _, err := c.DropBlockSet(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the dropped set freed and deregistered", func() error {
		if m := n1.Metrics(); m.RDMA.RegisteredBytes != 0 {
			return fmt.Errorf("%d bytes registered", m.RDMA.RegisteredBytes)
		}
		return nil
	})
	hashes := produce(t, n1, 4, layout.HND, 20)
	wait.For(t, 5*time.Second, "n2 indexes n1's blocks", func() error {
		if got := agentStatus(t, n2).Members["n1"]; got != 20 {
			return fmt.Errorf("n2 indexes %d blocks of n1", got)
		}
		return nil
	})
	if via := importAll(t, n2, 2, layout.NHD, hashes); len(via) != 1 || via[0] != "rdma" {
		t.Fatalf("fetches over %v, want one over rdma", via)
	}
}
