package rdma

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfabric/kvfabric/internal/pcitopo/pcitopotest"
)

// fakeSysfs lays out PCI functions under root/devices with bus/pci/devices
// links to them, as the kernel does. path is the chain of components below
// /sys/devices, ending in the function itself.
func fakeSysfs(t *testing.T, fns map[string]struct {
	path string
	numa int
}) string {
	t.Helper()
	root := t.TempDir()
	for addr, f := range fns {
		dir := filepath.Join(root, "devices", f.path)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(strconv.Itoa(f.numa)+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		link := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..", "..", "..", "devices", f.path), link); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestClosestDevice(t *testing.T) {
	type fn = struct {
		path string
		numa int
	}
	root := fakeSysfs(t, map[string]fn{
		// Socket 0: a PCIe switch with GPU 0 and mlx5_0 behind it, mlx5_1 and
		// GPU 3 on another root port.
		"0000:03:00.0": {"pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0},
		"0000:04:00.0": {"pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0},
		"0000:05:00.0": {"pci0000:00/0000:00:02.0/0000:05:00.0", 0},
		"0000:06:00.0": {"pci0000:00/0000:00:02.0/0000:06:00.0", 0},
		// Socket 1: mlx5_2 and GPU 1 on the same root complex; GPU 2 on a
		// root complex with no NIC, same NUMA node.
		"0000:81:00.0": {"pci0000:80/0000:80:01.0/0000:81:00.0", 1},
		"0000:82:00.0": {"pci0000:80/0000:80:02.0/0000:82:00.0", 1},
		"0000:c1:00.0": {"pci0000:c0/0000:c0:01.0/0000:c1:00.0", 1},
		// A GPU on a third node with no NIC anywhere near.
		"0000:e1:00.0": {"pci0000:e0/0000:e0:01.0/0000:e1:00.0", 3},
	})
	devs := []DeviceInfo{
		{Name: "mlx5_1", PCIAddress: "0000:05:00.0", NUMANode: 0},
		{Name: "mlx5_0", PCIAddress: "0000:04:00.0", NUMANode: 0},
		{Name: "mlx5_2", PCIAddress: "0000:81:00.0", NUMANode: 1},
		{Name: "soft0", NUMANode: -1}, // no PCI function (a software device)
	}
	for _, tc := range []struct {
		desc, gpu, want string
	}{
		{"behind the same switch beats the same root complex", "0000:03:00.0", "mlx5_0"},
		{"same root port", "0000:06:00.0", "mlx5_1"},
		{"same root complex on the other socket", "0000:82:00.0", "mlx5_2"},
		{"same NUMA node, no shared bridge", "0000:c1:00.0", "mlx5_2"},
		{"nothing near: the first device", "0000:e1:00.0", "mlx5_1"},
	} {
		got, err := ClosestDevice(tc.gpu, devs, root)
		if err != nil {
			t.Fatalf("%s: %v", tc.desc, err)
		}
		if got.Name != tc.want {
			t.Errorf("%s: closest to %s is %s, want %s", tc.desc, tc.gpu, got.Name, tc.want)
		}
	}

	if _, err := ClosestDevice("0000:03:00.0", nil, root); !errors.Is(err, ErrUnavailable) {
		t.Errorf("no devices: %v, want ErrUnavailable", err)
	}
	if _, err := ClosestDevice("gpu0", devs, root); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "gpu0") {
		t.Errorf("bad address: %v, want ErrInvalidArgument naming it", err)
	}
	if _, err := ClosestDevice("0000:99:00.0", devs, root); err == nil || !strings.Contains(err.Error(), "0000:99:00.0") {
		t.Errorf("address not in sysfs: %v, want an error naming it", err)
	}
}

func TestDevicePCIFromSysfs(t *testing.T) {
	root := fakeSysfs(t, map[string]struct {
		path string
		numa int
	}{"0000:3b:00.0": {"pci0000:3a/0000:3a:00.0/0000:3b:00.0", 1}})
	ib := filepath.Join(root, "class", "infiniband", "mlx5_0")
	if err := os.MkdirAll(ib, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..", "..", "..", "devices", "pci0000:3a/0000:3a:00.0/0000:3b:00.0"), filepath.Join(ib, "device")); err != nil {
		t.Fatal(err)
	}
	if addr, numa := devicePCI(root, "mlx5_0"); addr != "0000:3b:00.0" || numa != 1 {
		t.Fatalf("devicePCI = %q, %d; want 0000:3b:00.0, 1", addr, numa)
	}
	if addr, numa := devicePCI(root, "softverbs0"); addr != "" || numa != -1 {
		t.Fatalf("device without sysfs entry: %q, %d; want \"\", -1", addr, numa)
	}
}

// On machine shapes' trees, with compute NICs missing too, the agent
// registers each GPU's pool with the machine's nearest NIC: the same
// answers discover's tests hold `kvfabric gpus` to.
func TestClosestDeviceOnMachines(t *testing.T) {
	machines := map[string]func(testing.TB) *pcitopotest.Machine{
		"dgx-h100": func(t testing.TB) *pcitopotest.Machine { return pcitopotest.DGXH100(t, nil) },
		"dgx-h100 with four compute NICs": func(t testing.TB) *pcitopotest.Machine {
			return pcitopotest.DGXH100(t, []bool{false, false, true, false, true, false, true, true})
		},
		"dgx-h100 with only storage NICs": func(t testing.TB) *pcitopotest.Machine { return pcitopotest.DGXH100(t, make([]bool, 8)) },
		"dual-socket pcie":                func(t testing.TB) *pcitopotest.Machine { return pcitopotest.DualSocketPCIe(t) },
	}
	for name, mk := range machines {
		t.Run(name, func(t *testing.T) {
			m := mk(t)
			var devs []DeviceInfo
			for _, n := range m.NICs {
				addr, numa := devicePCI(m.Root, n.Name)
				if addr != n.Addr || numa != n.NUMA {
					t.Fatalf("%s: devicePCI = %s, %d; want %s, %d", n.Name, addr, numa, n.Addr, n.NUMA)
				}
				devs = append(devs, DeviceInfo{Name: n.Name, PCIAddress: addr, NUMANode: numa})
			}
			for i, g := range m.GPUs {
				// The CUDA driver's spelling and NVML's find the same device.
				for _, spelled := range []string{g, "0000" + strings.ToUpper(g)} {
					d, err := ClosestDevice(spelled, devs, m.Root)
					if err != nil {
						t.Fatal(err)
					}
					if d.Name != m.Nearest[i].NIC {
						t.Errorf("GPU %d (%s): nearest %s, want %s (%s)", i, spelled, d.Name, m.Nearest[i].NIC, m.Nearest[i].Link)
					}
				}
			}
		})
	}
}
