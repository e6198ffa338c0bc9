package rdma

import (
	"fmt"

	"github.com/kvfabric/kvfabric/internal/pcitopo"
)

// ClosestDevice picks, among devs, the RDMA device nearest the PCI function
// pciAddr (a GPU, say) in PCI topology, as internal/pcitopo measures it:
// the nearest link (behind one switch, several bridges, the host bridge,
// the NUMA node, across sockets), then the most bridges shared, then the
// fewest hops; ties go to the earlier device in devs. sysfsRoot is where
// sysfs is mounted ("" means "/sys"); devices without a PCIAddress can
// only win on NUMA node or order.
func ClosestDevice(pciAddr string, devs []DeviceInfo, sysfsRoot string) (DeviceInfo, error) {
	if len(devs) == 0 {
		return DeviceInfo{}, fmt.Errorf("rdma: closest device to %s: no devices: %w", pciAddr, ErrUnavailable)
	}
	addr, err := pcitopo.ParseAddr(pciAddr)
	if err != nil {
		return DeviceInfo{}, fmt.Errorf("rdma: closest device: %v: %w", err, ErrInvalidArgument)
	}
	target, err := pcitopo.Locate(sysfsRoot, addr)
	if err != nil {
		return DeviceInfo{}, fmt.Errorf("rdma: closest device to %s: %w", pciAddr, err)
	}
	cands := make([]pcitopo.Place, len(devs))
	for i, d := range devs {
		cands[i].NUMA = d.NUMANode
		if a, err := pcitopo.ParseAddr(d.PCIAddress); err == nil {
			if p, err := pcitopo.Locate(sysfsRoot, a); err == nil {
				cands[i].Path = p.Path
				if cands[i].NUMA < 0 {
					cands[i].NUMA = p.NUMA
				}
			}
		}
	}
	best, _ := pcitopo.Closest(target, cands)
	return devs[best], nil
}
