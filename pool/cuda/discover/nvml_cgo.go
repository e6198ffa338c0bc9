//go:build cgo && linux

package discover

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Discover lists the GPUs through the system's NVML.
func Discover(cfg Config) ([]GPU, error) {
	return FromNVML(nvml.New(), cfg)
}

// FromNVML lists the GPUs through lib (a mock server in tests). It calls
// Init and Shutdown.
func FromNVML(lib nvml.Interface, cfg Config) ([]GPU, error) {
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND || ret == nvml.ERROR_DRIVER_NOT_LOADED {
			return nil, fmt.Errorf("discover: NVML: %s: %w", nvml.ErrorString(ret), ErrNotSupported)
		}
		return nil, fmt.Errorf("discover: NVML init: %w", ret)
	}
	defer lib.Shutdown()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("discover: NVML device count: %w", ret)
	}
	gpus := make([]GPU, 0, n)
	for i := range n {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("discover: NVML device %d: %w", i, ret)
		}
		g := GPU{Index: i, NUMANode: -1}
		if g.Name, ret = dev.GetName(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("discover: NVML device %d name: %w", i, ret)
		}
		if g.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("discover: NVML device %d UUID: %w", i, ret)
		}
		mem, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("discover: NVML device %d memory: %w", i, ret)
		}
		g.MemoryTotal, g.MemoryFree = mem.Total, mem.Free
		pci, ret := dev.GetPciInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("discover: NVML device %d PCI info: %w", i, ret)
		}
		g.PCIBusID = NormalizeBusID(busID(pci))
		// Not every driver or GPU knows its NUMA node (NOT_SUPPORTED);
		// sysfs is asked then.
		if node, ret := dev.GetNumaNodeId(); ret == nvml.SUCCESS {
			g.NUMANode = node
		}
		gpus = append(gpus, g)
	}
	annotate(cfg, gpus)
	return gpus, nil
}

// busID reads the NUL-terminated bus id NVML writes into PciInfo.
func busID(p nvml.PciInfo) string {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
