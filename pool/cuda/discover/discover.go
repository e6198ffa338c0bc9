// Package discover finds the node's GPUs through NVML (github.com/NVIDIA/go-nvml,
// which opens libnvidia-ml.so.1 at run time) and, for each, the RDMA device
// closest to it in the PCI topology read from sysfs, measured by
// internal/pcitopo as rdma.ClosestDevice measures it for the agent, so that
// what `kvfabric gpus` shows is the NIC the agent registers that GPU's pool
// with. Built without cgo, or on a machine without NVML,
// Discover returns an error wrapping ErrNotSupported.
package discover

import (
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/kvfabric/kvfabric/internal/pcitopo"
)

// ErrNotSupported: no NVML (library missing, or a build without cgo).
var ErrNotSupported = errors.New("discover: not supported")

// GPU is one GPU as NVML reports it, with its closest RDMA device.
type GPU struct {
	// Index is NVML's index (not affected by CUDA_VISIBLE_DEVICES).
	Index int `json:"index"`
	// Name is the product name.
	Name string `json:"name"`
	// UUID is the GPU's identity, "GPU-...".
	UUID string `json:"uuid"`
	// MemoryTotal and MemoryFree are device memory in bytes.
	MemoryTotal uint64 `json:"memory_total"`
	MemoryFree  uint64 `json:"memory_free"`
	// PCIBusID is domain:bus:device.function in sysfs form
	// ("0000:18:00.0"), lower case.
	PCIBusID string `json:"pci_bus_id"`
	// NUMANode is the GPU's NUMA node, or -1 when unknown.
	NUMANode int `json:"numa_node"`
	// NIC is the closest RDMA device ("mlx5_0"), or "" if there is none.
	NIC string `json:"nic,omitempty"`
	// NICPath says how far NIC is, in NCCL's words: PIX (behind the same
	// PCIe switch), PXB (several switches), PHB (the same host bridge),
	// NODE (another host bridge on the same NUMA node), SYS (across the
	// inter-socket link).
	NICPath string `json:"nic_path,omitempty"`
}

// Config configures Discover.
type Config struct {
	// Sysfs is the sysfs mount read for the PCI topology. If empty, "/sys".
	Sysfs string
}

func (c Config) sysfs() string {
	if c.Sysfs == "" {
		return "/sys"
	}
	return c.Sysfs
}

// NormalizeBusID turns NVML's "00000000:18:00.0" into sysfs's
// "0000:18:00.0"; what is not a PCI address comes back trimmed and in
// lower case.
func NormalizeBusID(id string) string {
	a, err := pcitopo.ParseAddr(strings.TrimSpace(id))
	if err != nil {
		return strings.ToLower(strings.TrimSpace(id))
	}
	return a.String()
}

type nic struct {
	name  string
	place pcitopo.Place
}

// rdmaDevices lists /sys/class/infiniband with each device's place in the
// PCI tree, by name.
func rdmaDevices(sysfs string) []nic {
	dir := filepath.Join(sysfs, "class", "infiniband")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []nic
	for _, e := range ents {
		p, err := pcitopo.LocateLink(sysfs, filepath.Join(dir, e.Name(), "device"))
		if err != nil {
			continue
		}
		out = append(out, nic{name: e.Name(), place: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// The values of GPU.NICPath, nearest first: pcitopo's link names.
const (
	PathPIX  = "PIX"
	PathPXB  = "PXB"
	PathPHB  = "PHB"
	PathNODE = "NODE"
	PathSYS  = "SYS"
)

// closestNIC picks the nearest RDMA device to the GPU at busID, as
// pcitopo.Closest measures it; gpuNUMA, when known, overrides sysfs's.
func closestNIC(sysfs, busID string, gpuNUMA int, nics []nic) (name, kind string) {
	if len(nics) == 0 {
		return "", ""
	}
	a, err := pcitopo.ParseAddr(busID)
	if err != nil {
		return "", ""
	}
	gp, err := pcitopo.Locate(sysfs, a)
	if err != nil {
		return "", ""
	}
	if gpuNUMA >= 0 {
		gp.NUMA = gpuNUMA
	}
	cands := make([]pcitopo.Place, len(nics))
	for i, n := range nics {
		cands[i] = n.place
	}
	best, link := pcitopo.Closest(gp, cands)
	return nics[best].name, link.String()
}

// annotate fills each GPU's NIC from sysfs, and its NUMA node where NVML
// did not know it.
func annotate(cfg Config, gpus []GPU) {
	sysfs := cfg.sysfs()
	nics := rdmaDevices(sysfs)
	for i := range gpus {
		g := &gpus[i]
		if g.NUMANode < 0 && g.PCIBusID != "" {
			if a, err := pcitopo.ParseAddr(g.PCIBusID); err == nil {
				if p, err := pcitopo.Locate(sysfs, a); err == nil {
					g.NUMANode = p.NUMA
				}
			}
		}
		g.NIC, g.NICPath = closestNIC(sysfs, g.PCIBusID, g.NUMANode, nics)
	}
}

// ByBusID finds the GPU with the given PCI bus id, in NVML's or sysfs's
// spelling. CUDA and NVML may number GPUs differently (CUDA orders them
// fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID), so a CUDA device is
// matched to its NVML entry, and so to its NIC, by bus id, never by index.
func ByBusID(gpus []GPU, busID string) (GPU, bool) {
	id := NormalizeBusID(busID)
	for _, g := range gpus {
		if g.PCIBusID == id {
			return g, true
		}
	}
	return GPU{}, false
}
