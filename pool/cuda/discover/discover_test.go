//go:build cgo && linux

package discover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// fakeSysfs is a DGX-H100-like PCI tree: four root complexes, two per NUMA
// node; under each, two root ports, each leading to a PCIe switch with one
// GPU and one NIC on its downstream ports. GPU i is at bus gpuBus(i) and
// NIC mlx5_i sits beside it. nics says which NICs exist.
func fakeSysfs(t *testing.T, nics []int) string {
	t.Helper()
	root := t.TempDir()
	mk := func(parts ...string) string {
		p := filepath.Join(append([]string{root, "devices"}, parts...)...)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	link := func(target, name string) {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, name); err != nil {
			t.Fatal(err)
		}
	}
	have := map[int]bool{}
	for _, n := range nics {
		have[n] = true
	}
	for i := range 8 {
		rc := 0x10 * (i/2 + 1)
		rcName := fmt.Sprintf("pci0000:%02x", rc)
		rp := fmt.Sprintf("0000:%02x:%02x.0", rc, 1+i%2)
		sw := gpuBus(i) - 2
		up := fmt.Sprintf("0000:%02x:00.0", sw)
		down0 := fmt.Sprintf("0000:%02x:00.0", sw+1)
		down1 := fmt.Sprintf("0000:%02x:01.0", sw+1)
		gpu := fmt.Sprintf("0000:%02x:00.0", gpuBus(i))
		nic := fmt.Sprintf("0000:%02x:00.0", gpuBus(i)+1)
		gdir := mk(rcName, rp, up, down0, gpu)
		node := fmt.Sprint(i / 4)
		os.WriteFile(filepath.Join(gdir, "numa_node"), []byte(node+"\n"), 0o644)
		link(gdir, filepath.Join(root, "bus", "pci", "devices", gpu))
		if have[i] {
			ndir := mk(rcName, rp, up, down1, nic)
			os.WriteFile(filepath.Join(ndir, "numa_node"), []byte(node+"\n"), 0o644)
			link(ndir, filepath.Join(root, "class", "infiniband", fmt.Sprintf("mlx5_%d", i), "device"))
		}
	}
	return root
}

func gpuBus(i int) int { return 0x10*(i/2+1) + 3 + 4*(i%2) }

// dgx is go-nvml's DGX H100 mock with the PCI bus ids and NUMA nodes the
// mock leaves unset filled in as NVML reports them.
func dgx(t *testing.T) *server.Server {
	s := dgxh100.New()
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		id := fmt.Sprintf("00000000:%02X:00.0", gpuBus(i))
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range id {
				p.BusId[j] = int8(c)
			}
			p.PciDeviceId = dev.Config.PciDeviceId
			return p, nvml.SUCCESS
		}
		node := i / 4
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return node, nvml.SUCCESS }
	}
	return s
}

func TestDiscoverDGXH100(t *testing.T) {
	gpus, err := FromNVML(dgx(t), Config{Sysfs: fakeSysfs(t, []int{0, 1, 2, 3, 4, 5, 6, 7})})
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 8 {
		t.Fatalf("%d GPUs, want 8", len(gpus))
	}
	uuids := map[string]bool{}
	for i, g := range gpus {
		wantBus := fmt.Sprintf("0000:%02x:00.0", gpuBus(i))
		if g.Index != i || g.Name != "NVIDIA H100 80GB HBM3" || g.MemoryTotal != 81920<<20 ||
			g.PCIBusID != wantBus || g.NUMANode != i/4 || len(g.UUID) < 8 || g.UUID[:4] != "GPU-" {
			t.Errorf("GPU %d: %+v", i, g)
		}
		if g.NIC != fmt.Sprintf("mlx5_%d", i) || g.NICPath != PathPIX {
			t.Errorf("GPU %d: closest NIC %s (%s), want mlx5_%d (PIX)", i, g.NIC, g.NICPath, i)
		}
		uuids[g.UUID] = true
	}
	if len(uuids) != 8 {
		t.Errorf("UUIDs not distinct: %v", uuids)
	}
}

// With NICs missing, each GPU gets the next nearest: the other switch under
// its host bridge (PHB), another host bridge on its NUMA node (NODE), or the
// other socket (SYS); with none at all, no NIC.
func TestClosestNICFallsBack(t *testing.T) {
	cases := []struct {
		desc string
		nics []int
		gpu  int
		want string
		path string
	}{
		{"own switch", []int{0, 1, 2, 3, 4, 5, 6, 7}, 3, "mlx5_3", PathPIX},
		{"sibling switch under the same host bridge", []int{1, 4}, 0, "mlx5_1", PathPHB},
		{"other host bridge, same NUMA node", []int{3, 4}, 0, "mlx5_3", PathNODE},
		{"other socket only", []int{6}, 0, "mlx5_6", PathSYS},
		{"nearest wins over lower name", []int{0, 5}, 5, "mlx5_5", PathPIX},
		{"no RDMA device", nil, 0, "", ""},
	}
	for _, c := range cases {
		t.Run(c.desc, func(t *testing.T) {
			gpus, err := FromNVML(dgx(t), Config{Sysfs: fakeSysfs(t, c.nics)})
			if err != nil {
				t.Fatal(err)
			}
			if g := gpus[c.gpu]; g.NIC != c.want || g.NICPath != c.path {
				t.Errorf("GPU %d: %q (%s), want %q (%s)", c.gpu, g.NIC, g.NICPath, c.want, c.path)
			}
		})
	}
}

// A GPU whose driver does not report a NUMA node gets sysfs's.
func TestNUMAFromSysfs(t *testing.T) {
	s := dgx(t)
	for _, d := range s.Devices {
		d.(*server.Device).GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
	gpus, err := FromNVML(s, Config{Sysfs: fakeSysfs(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if gpus[5].NUMANode != 1 || gpus[1].NUMANode != 0 {
		t.Errorf("NUMA nodes %d, %d; want 1, 0", gpus[5].NUMANode, gpus[1].NUMANode)
	}
	gpus, err = FromNVML(s, Config{Sysfs: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if gpus[5].NUMANode != -1 {
		t.Errorf("NUMA node with neither NVML nor sysfs: %d, want -1", gpus[5].NUMANode)
	}
}

func TestNVMLMissing(t *testing.T) {
	s := dgx(t)
	s.InitFunc = func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }
	if _, err := FromNVML(s, Config{}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("NVML library missing: %v, want ErrNotSupported", err)
	}
	s.InitFunc = func() nvml.Return { return nvml.ERROR_NO_PERMISSION }
	_, err := FromNVML(s, Config{})
	if err == nil || errors.Is(err, ErrNotSupported) {
		t.Errorf("NVML refusing: %v, want an error that is not ErrNotSupported", err)
	}
	// On this machine: GPUs where there is a driver, ErrNotSupported where
	// there is none; never another error or a panic.
	gpus, err := Discover(Config{})
	if err != nil && !errors.Is(err, ErrNotSupported) {
		t.Errorf("Discover on this machine: %v", err)
	}
	t.Logf("this machine: %d GPUs, %v", len(gpus), err)
}

func TestNormalizeBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:18:00.0": "0000:18:00.0",
		"0000:9B:00.0":     "0000:9b:00.0",
		"1:2a:00.0":        "0001:2a:00.0",
		"junk":             "junk",
	} {
		if got := NormalizeBusID(in); got != want {
			t.Errorf("NormalizeBusID(%q) = %q, want %q", in, got, want)
		}
	}
}
