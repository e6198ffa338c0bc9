//go:build cgo && linux

package fabric_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
)

// TP 4 -> TP 2 between in-process agents with fabric=ofi over libfabric's
// tcp and shm providers (make test-deps installs libfabric; without it the
// agents refuse to start, rdma=on, and the test fails): byte for byte, the
// fetch says rdma, every byte imported moved over libfabric, and the
// metrics and status name the provider.
func TestImportOverOFI(t *testing.T) {
	for _, prov := range []string{"tcp", "shm"} {
		t.Run(prov, func(t *testing.T) {
			agents := clusterWith(t, 2, func(i int, c *fabric.Config) {
				c.RDMA, c.Fabric, c.FabricProvider = "on", "ofi", prov
				if prov == "tcp" {
					c.FabricAddr = "127.0.0.1"
				}
			})
			n1, n2 := agents[0], agents[1]
			m := importOverRDMA(t, n1, n2)
			if !strings.HasPrefix(m.RDMA.Binding, "ofi:"+prov) || len(m.RDMA.Fallbacks) != 0 {
				t.Errorf("importer's binding %q, fallbacks %v: want ofi:%s and none", m.RDMA.Binding, m.RDMA.Fallbacks, prov)
			}
			s, err := dial(t, n1).Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Pools) == 0 || !strings.HasPrefix(s.Pools[0].RdmaDevice, "ofi:"+prov) {
				t.Errorf("holder's status pools %v: want the pool registered with ofi:%s", s.Pools, prov)
			}
		})
	}
}

// rdma=on refuses to start when the fabric asked for is not there, naming
// what is missing: libfabric without the provider named, and with auto
// both libibverbs and libfabric; fabric=off (rdma=auto) starts without RDMA.
func TestFabricOnWithoutProviderRefusesToStart(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libibverbs.so.1")
	for _, tc := range []struct {
		name, fabric, provider string
		want                   []string
	}{
		{"ofi without cxi", "ofi", "cxi", []string{"cxi"}},
		{"auto without either", "auto", "", []string{"libibverbs", missing, "libfabric", "cxi, efa or verbs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(t, "n1")
			c.RDMA, c.RDMALibrary, c.Fabric, c.FabricProvider = "on", missing, tc.fabric, tc.provider
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			a, err := fabric.Start(ctx, c)
			if err == nil {
				a.Close()
				t.Fatal("rdma=on started without its fabric")
			}
			for _, w := range append(tc.want, "rdma=on") {
				if !errors.Is(err, fabric.ErrConfig) || !strings.Contains(err.Error(), w) {
					t.Errorf("error %q: want fabric.ErrConfig naming %q", err, w)
				}
			}
		})
	}
	c := testConfig(t, "n1")
	c.Fabric = "off"
	a, err := fabric.Start(context.Background(), c)
	if err != nil {
		t.Fatalf("fabric=off: %v", err)
	}
	defer a.Close()
	if a.Metrics().RDMAEnabled {
		t.Error("fabric=off started with RDMA")
	}
}
