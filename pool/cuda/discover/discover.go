// Package discover finds the node's GPUs through NVML (github.com/NVIDIA/go-nvml,
// which opens libnvidia-ml.so.1 at run time) and, for each, the RDMA device
// closest to it in the PCI topology read from sysfs, which picks the NIC for
// that GPU's device pool. Built without cgo, or on a machine without NVML,
// Discover returns an error wrapping ErrNotSupported.
package discover

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
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
// "0000:18:00.0".
func NormalizeBusID(id string) string {
	id = strings.ToLower(strings.TrimSpace(id))
	dom, rest, ok := strings.Cut(id, ":")
	if !ok {
		return id
	}
	if len(dom) > 4 {
		dom = dom[len(dom)-4:]
	}
	for len(dom) < 4 {
		dom = "0" + dom
	}
	return dom + ":" + rest
}

// pciPath is a device's chain of PCI functions from its root complex
// ("pci0000:16") down to itself.
type pciPath []string

func devicePath(sysfs, link string) (pciPath, error) {
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return nil, err
	}
	devices, err := filepath.EvalSymlinks(filepath.Join(sysfs, "devices"))
	if err != nil {
		return nil, err
	}
	rel, err := filepath.Rel(devices, real)
	if err != nil || strings.HasPrefix(rel, "..") {
		return nil, fmt.Errorf("discover: %s is not under %s/devices", real, sysfs)
	}
	parts := strings.Split(rel, string(filepath.Separator))
	if len(parts) < 2 || !strings.HasPrefix(parts[0], "pci") {
		return nil, fmt.Errorf("discover: %s is not a PCI device", real)
	}
	return parts, nil
}

func numaNode(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

type nic struct {
	name string
	path pciPath
	numa int
}

// rdmaDevices lists /sys/class/infiniband with each device's PCI path.
func rdmaDevices(sysfs string) []nic {
	dir := filepath.Join(sysfs, "class", "infiniband")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var out []nic
	for _, e := range ents {
		dev := filepath.Join(dir, e.Name(), "device")
		p, err := devicePath(sysfs, dev)
		if err != nil {
			continue
		}
		out = append(out, nic{name: e.Name(), path: p, numa: numaNode(dev)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// Path kinds, nearest first.
const (
	PathPIX  = "PIX"
	PathPXB  = "PXB"
	PathPHB  = "PHB"
	PathNODE = "NODE"
	PathSYS  = "SYS"
)

var pathRank = map[string]int{PathPIX: 0, PathPXB: 1, PathPHB: 2, PathNODE: 3, PathSYS: 4}

// classify names the path between two PCI devices. hops (the levels
// between them through their common ancestor) breaks ties within a kind.
func classify(a, b pciPath, numaA, numaB int) (kind string, hops int) {
	if a[0] != b[0] {
		if numaA >= 0 && numaA == numaB {
			return PathNODE, len(a) + len(b)
		}
		return PathSYS, len(a) + len(b)
	}
	common := 0
	for common < len(a)-1 && common < len(b)-1 && a[common] == b[common] {
		common++
	}
	below := max(len(a), len(b)) - common
	hops = (len(a) - common) + (len(b) - common)
	switch {
	case common <= 1:
		// Only the root complex is shared: through the host bridge.
		return PathPHB, hops
	case below <= 2:
		// Each hangs off a downstream port of one PCIe switch.
		return PathPIX, hops
	default:
		return PathPXB, hops
	}
}

// closestNIC picks the nearest RDMA device to the GPU at busID.
func closestNIC(sysfs, busID string, gpuNUMA int, nics []nic) (name, kind string) {
	if len(nics) == 0 || busID == "" {
		return "", ""
	}
	gp, err := devicePath(sysfs, filepath.Join(sysfs, "bus", "pci", "devices", busID))
	if err != nil {
		return "", ""
	}
	best, bestHops := -1, 0
	for i, n := range nics {
		k, h := classify(gp, n.path, gpuNUMA, n.numa)
		if best < 0 || pathRank[k] < pathRank[kind] || (pathRank[k] == pathRank[kind] && h < bestHops) {
			best, kind, bestHops = i, k, h
		}
	}
	return nics[best].name, kind
}

// annotate fills each GPU's NIC from sysfs, and its NUMA node where NVML
// did not know it.
func annotate(cfg Config, gpus []GPU) {
	sysfs := cfg.sysfs()
	nics := rdmaDevices(sysfs)
	for i := range gpus {
		g := &gpus[i]
		if g.NUMANode < 0 && g.PCIBusID != "" {
			g.NUMANode = numaNode(filepath.Join(sysfs, "bus", "pci", "devices", g.PCIBusID))
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
