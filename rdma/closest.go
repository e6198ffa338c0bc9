package rdma

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ClosestDevice picks, among devs, the RDMA device nearest the PCI function
// pciAddr (a GPU, say) in PCI topology: the one sharing the deepest PCI
// bridge (switch, then root port) with it, then one under the same root
// complex, then one on the same NUMA node, then the first. Ties go to the
// earlier device in devs. sysfsRoot is where sysfs is mounted ("" means
// "/sys"); devices without a PCIAddress can only win on NUMA node or order.
func ClosestDevice(pciAddr string, devs []DeviceInfo, sysfsRoot string) (DeviceInfo, error) {
	if sysfsRoot == "" {
		sysfsRoot = "/sys"
	}
	if len(devs) == 0 {
		return DeviceInfo{}, fmt.Errorf("rdma: closest device to %s: no devices: %w", pciAddr, ErrUnavailable)
	}
	if !looksPCI(pciAddr) {
		return DeviceInfo{}, fmt.Errorf("rdma: closest device: %q is not a PCI address (dddd:bb:dd.f): %w", pciAddr, ErrInvalidArgument)
	}
	target, err := pciPath(sysfsRoot, pciAddr)
	if err != nil {
		return DeviceInfo{}, fmt.Errorf("rdma: closest device to %s: %w", pciAddr, err)
	}
	targetNUMA := pciNUMA(sysfsRoot, pciAddr)
	best, bestScore := 0, -1
	for i, d := range devs {
		score := 0
		if d.PCIAddress != "" {
			if p, err := pciPath(sysfsRoot, d.PCIAddress); err == nil {
				// Components shared below the root complex: each is a bridge
				// both sit behind. Sharing only the root complex counts less.
				common := commonPrefix(target, p)
				if common >= 1 {
					score = 1000 + 100*(common-1)
				}
			}
		}
		numa := d.NUMANode
		if numa < 0 && d.PCIAddress != "" {
			numa = pciNUMA(sysfsRoot, d.PCIAddress)
		}
		if numa >= 0 && numa == targetNUMA {
			score += 10
		}
		if score > bestScore {
			best, bestScore = i, score
		}
	}
	return devs[best], nil
}

// pciPath returns the components of a PCI function's device path below
// /sys/devices, e.g. [pci0000:00 0000:00:01.0 0000:01:00.0 0000:3b:00.0],
// without the function itself.
func pciPath(sysfsRoot, addr string) ([]string, error) {
	real, err := filepath.EvalSymlinks(filepath.Join(sysfsRoot, "bus", "pci", "devices", addr))
	if err != nil {
		return nil, fmt.Errorf("resolve PCI function %s in sysfs: %w", addr, err)
	}
	devices, err := filepath.EvalSymlinks(filepath.Join(sysfsRoot, "devices"))
	if err != nil {
		return nil, fmt.Errorf("resolve %s/devices: %w", sysfsRoot, err)
	}
	rel, err := filepath.Rel(devices, real)
	if err != nil || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("PCI function %s resolves to %s, outside %s", addr, real, devices)
	}
	parts := strings.Split(rel, string(filepath.Separator))
	return parts[:len(parts)-1], nil
}

func pciNUMA(sysfsRoot, addr string) int {
	b, err := os.ReadFile(filepath.Join(sysfsRoot, "bus", "pci", "devices", addr, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

func commonPrefix(a, b []string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}
