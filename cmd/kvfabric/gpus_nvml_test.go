//go:build cgo && linux

package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/pool/cuda/discover"
	"github.com/kvfabric/kvfabric/pool/cuda/softcuda"
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
	if code != 0 || !strings.Contains(errs, "CUDA driver") {
		t.Fatalf("exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 9 || !strings.Contains(lines[8], "NVIDIA H100 80GB HBM3") || !strings.Contains(lines[8], "0000:88:00.0") || !strings.Contains(lines[8], "80.0 GiB") {
		t.Errorf("table:\n%s", out)
	}

	// With the CUDA driver (softcuda, two GPUs at the bus ids of NVML's
	// GPUs 7 and 2, so CUDA numbers them differently): each row gets its
	// CUDA index and dma-buf support, matched by bus id.
	lib, err := softcuda.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SOFTCUDA_DEVICES", "2")
	t.Setenv("SOFTCUDA_PCI_BUS_IDS", "00000000:88:00.0,00000000:38:00.0")
	t.Setenv(cuda.EnvLibrary, lib)
	cudaDevices = func() ([]cuda.DeviceInfo, error) {
		d, err := cuda.Open(cuda.Config{})
		if err != nil {
			return nil, err
		}
		defer d.Close()
		return d.Devices(), nil
	}
	code, out, errs = runCmd(t, "", "gpus", "--json", "--sysfs", t.TempDir())
	var rows []struct {
		Index     int   `json:"index"`
		CUDAIndex *int  `json:"cuda_index"`
		Dmabuf    *bool `json:"dmabuf"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &rows) != nil || len(rows) != 8 {
		t.Fatalf("exit %d: %s\n%s", code, errs, out)
	}
	for _, r := range rows {
		want := map[int]int{7: 0, 2: 1}
		w, ok := want[r.Index]
		switch {
		case ok && (r.CUDAIndex == nil || *r.CUDAIndex != w || r.Dmabuf == nil || !*r.Dmabuf):
			t.Errorf("NVML GPU %d: CUDA index %v dma-buf %v, want %d and true", r.Index, r.CUDAIndex, r.Dmabuf, w)
		case !ok && r.CUDAIndex != nil:
			t.Errorf("NVML GPU %d has CUDA index %d, but CUDA does not see it", r.Index, *r.CUDAIndex)
		}
	}
}
