package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/pool/cuda/discover"
)

// withDiscovery replaces NVML discovery with f and the CUDA driver with
// one that is not there.
func withDiscovery(t *testing.T, f func(discover.Config) ([]discover.GPU, error)) {
	t.Helper()
	old, oldCUDA := discoverGPUs, cudaDevices
	discoverGPUs = f
	cudaDevices = func() ([]cuda.DeviceInfo, error) {
		return nil, fmt.Errorf("cuda: load libcuda.so.1: not found: %w", cuda.ErrNotSupported)
	}
	t.Cleanup(func() { discoverGPUs, cudaDevices = old, oldCUDA })
}

func TestGPUsWithoutNVML(t *testing.T) {
	withDiscovery(t, func(discover.Config) ([]discover.GPU, error) {
		return nil, fmt.Errorf("discover: NVML: ERROR_LIBRARY_NOT_FOUND: %w", discover.ErrNotSupported)
	})
	code, out, errs := runCmd(t, "", "gpus", "--json")
	if code != 0 || strings.TrimSpace(out) != "[]" || !strings.Contains(errs, "ERROR_LIBRARY_NOT_FOUND") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errs)
	}
	withDiscovery(t, func(discover.Config) ([]discover.GPU, error) {
		return nil, errors.New("discover: NVML init: ERROR_NO_PERMISSION")
	})
	code, _, errs = runCmd(t, "", "gpus")
	if code == 0 || !strings.Contains(errs, "ERROR_NO_PERMISSION") {
		t.Errorf("NVML refusing: exit %d, stderr %q", code, errs)
	}
	code, _, _ = runCmd(t, "", "gpus", "extra")
	if code != 2 {
		t.Errorf("gpus with an argument: exit %d, want 2", code)
	}
}

func TestGPUsTableAndJSON(t *testing.T) {
	var gotSysfs string
	want := []discover.GPU{
		{Index: 0, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-a", MemoryTotal: 80 << 30, MemoryFree: 79 << 30, PCIBusID: "0000:18:00.0", NUMANode: 0, NIC: "mlx5_0", NICPath: "PIX"},
		{Index: 1, Name: "NVIDIA H100 80GB HBM3", UUID: "GPU-b", MemoryTotal: 80 << 30, PCIBusID: "0000:2a:00.0", NUMANode: 1},
	}
	withDiscovery(t, func(cfg discover.Config) ([]discover.GPU, error) {
		gotSysfs = cfg.Sysfs
		return want, nil
	})
	code, out, errs := runCmd(t, "", "gpus", "--sysfs", "/tmp/fake-sys")
	if code != 0 || gotSysfs != "/tmp/fake-sys" {
		t.Fatalf("exit %d, sysfs %q, stderr %s", code, gotSysfs, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "GPU") ||
		!strings.Contains(lines[1], "mlx5_0") || !strings.Contains(lines[1], "80.0 GiB") || !strings.Contains(lines[1], "0000:18:00.0") ||
		!strings.HasSuffix(strings.Join(strings.Fields(lines[2]), " "), "1 - - - -") {
		t.Errorf("table:\n%s", out)
	}
	code, out, _ = runCmd(t, "", "gpus", "--json")
	var got []discover.GPU
	if code != 0 || json.Unmarshal([]byte(out), &got) != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("json: exit %d\n%s", code, out)
	}
	if strings.Contains(out, "cuda_index") {
		t.Errorf("json without a CUDA driver names CUDA indices:\n%s", out)
	}
}
