//go:build cgo && linux

package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/kvfabric/kvfabric/pool/cuda/discover"
)

// The command on go-nvml's DGX H100 mock: eight H100s, each with the bus id
// set (the mock leaves it empty).
func TestGPUsOnDGXH100Mock(t *testing.T) {
	s := dgxh100.New()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		id := fmt.Sprintf("00000000:%02X:00.0", 0x18+i*0x10)
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range id {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return i / 4, nvml.SUCCESS }
	}
	withDiscovery(t, func(cfg discover.Config) ([]discover.GPU, error) { return discover.FromNVML(s, cfg) })
	code, out, errs := runCmd(t, "", "gpus", "--sysfs", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 9 || !strings.Contains(lines[8], "NVIDIA H100 80GB HBM3") || !strings.Contains(lines[8], "0000:88:00.0") || !strings.Contains(lines[8], "80.0 GiB") {
		t.Errorf("table:\n%s", out)
	}
}
