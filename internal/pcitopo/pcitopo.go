// Package pcitopo reads where PCI functions sit in a machine's PCI tree, as
// sysfs shows it, and says how far apart two of them are: the one place the
// agent and `kvfabric gpus` decide which RDMA device is nearest a GPU.
//
// Distances are named as NCCL and nvidia-smi name them, nearest first: PIX
// (both behind one PCIe switch), PXB (behind several bridges but not the
// host bridge), PHB (through the host bridge of one root complex), NODE
// (across root complexes of one NUMA node), SYS (across the link between
// sockets, or unknown).
package pcitopo

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ErrNotPCIAddress: a string is not a PCI address.
var ErrNotPCIAddress = errors.New("pcitopo: not a PCI address (domain:bus:device.function)")

// Addr is a PCI function's address.
type Addr struct {
	Domain   uint32
	Bus      uint8
	Device   uint8 // below 32
	Function uint8 // below 8
}

// ParseAddr reads domain:bus:device.function in hexadecimal, whatever the
// case and the width of the domain: the kernel and the CUDA driver write
// "0000:18:00.0", NVML "00000000:18:00.0".
func ParseAddr(s string) (Addr, error) {
	bad := func(why string) (Addr, error) {
		return Addr{}, fmt.Errorf("%w: %q: %s", ErrNotPCIAddress, s, why)
	}
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return bad("want three fields separated by ':'")
	}
	dev, fn, ok := strings.Cut(parts[2], ".")
	if !ok {
		return bad("no '.' before the function")
	}
	fields := []struct {
		s     string
		width int
		max   uint64
	}{{parts[0], 8, 1<<32 - 1}, {parts[1], 2, 0xff}, {dev, 2, 0x1f}, {fn, 1, 7}}
	var v [4]uint64
	for i, f := range fields {
		if f.s == "" || len(f.s) > f.width {
			return bad(fmt.Sprintf("field %q: 1 to %d hexadecimal digits", f.s, f.width))
		}
		n, err := strconv.ParseUint(f.s, 16, 32)
		if err != nil || n > f.max {
			return bad(fmt.Sprintf("field %q: hexadecimal up to %#x", f.s, f.max))
		}
		v[i] = n
	}
	return Addr{Domain: uint32(v[0]), Bus: uint8(v[1]), Device: uint8(v[2]), Function: uint8(v[3])}, nil
}

// String returns the address as sysfs names it, "0000:18:00.0".
func (a Addr) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.Domain, a.Bus, a.Device, a.Function)
}

// Link is how far apart two PCI functions are, nearest first.
type Link int

// Links, nearest first.
const (
	PIX Link = iota
	PXB
	PHB
	NODE
	SYS
)

func (l Link) String() string {
	switch l {
	case PIX:
		return "PIX"
	case PXB:
		return "PXB"
	case PHB:
		return "PHB"
	case NODE:
		return "NODE"
	case SYS:
		return "SYS"
	}
	return fmt.Sprintf("Link(%d)", int(l))
}

// Place is where a PCI function sits: the chain of its device path below
// /sys/devices, root complex first and the function itself last (nil when
// unknown, as for a software device), and its NUMA node (-1 when unknown).
type Place struct {
	Path []string
	NUMA int
}

func sysfsOr(root string) string {
	if root == "" {
		return "/sys"
	}
	return root
}

// Locate finds the function at a in the sysfs mounted at root ("" means
// "/sys").
func Locate(root string, a Addr) (Place, error) {
	root = sysfsOr(root)
	return LocateLink(root, filepath.Join(root, "bus", "pci", "devices", a.String()))
}

// LocateLink finds the PCI function a sysfs link resolves to, such as
// class/infiniband/mlx5_0/device, in the sysfs mounted at root.
func LocateLink(root, link string) (Place, error) {
	root = sysfsOr(root)
	real, err := filepath.EvalSymlinks(link)
	if err != nil {
		return Place{}, fmt.Errorf("pcitopo: resolve %s: %w", link, err)
	}
	devices, err := filepath.EvalSymlinks(filepath.Join(root, "devices"))
	if err != nil {
		return Place{}, fmt.Errorf("pcitopo: resolve %s/devices: %w", root, err)
	}
	rel, err := filepath.Rel(devices, real)
	if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
		return Place{}, fmt.Errorf("pcitopo: %s resolves to %s, outside %s", link, real, devices)
	}
	parts := strings.Split(rel, string(filepath.Separator))
	if len(parts) < 2 || !strings.HasPrefix(parts[0], "pci") {
		return Place{}, fmt.Errorf("pcitopo: %s resolves to %s, not a PCI function", link, real)
	}
	if _, err := ParseAddr(parts[len(parts)-1]); err != nil {
		return Place{}, fmt.Errorf("pcitopo: %s resolves to %s: %w", link, real, err)
	}
	return Place{Path: parts, NUMA: numaNode(real)}, nil
}

// Addr returns the address of the function at p, if its path is known.
func (p Place) Addr() (Addr, bool) {
	if len(p.Path) == 0 {
		return Addr{}, false
	}
	a, err := ParseAddr(p.Path[len(p.Path)-1])
	return a, err == nil
}

func numaNode(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "numa_node"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// Distance says how far apart a and b are: the link between them, how many
// bridges they share (more is nearer), and the hops from each up to the
// nearest bridge they share and down again (fewer is nearer).
func Distance(a, b Place) (link Link, shared, hops int) {
	if len(a.Path) == 0 || len(b.Path) == 0 || a.Path[0] != b.Path[0] {
		if a.NUMA >= 0 && a.NUMA == b.NUMA {
			return NODE, 0, 0
		}
		return SYS, 0, 0
	}
	// Bridges both sit behind: the components shared above each function.
	for shared < len(a.Path)-1 && shared < len(b.Path)-1 && a.Path[shared] == b.Path[shared] {
		shared++
	}
	hops = len(a.Path) - shared + len(b.Path) - shared
	switch {
	case shared <= 1:
		// Only the root complex: through its host bridge.
		return PHB, shared, hops
	case max(len(a.Path), len(b.Path))-shared <= 2:
		// Each on a downstream port of one switch.
		return PIX, shared, hops
	}
	return PXB, shared, hops
}

// Closest returns the index of the place in cands nearest target, and the
// link to it: the nearest link first, then the most bridges shared, then the
// fewest hops, then the earliest in cands. It returns -1 for no cands.
func Closest(target Place, cands []Place) (int, Link) {
	best, bestLink, bestShared, bestHops := -1, SYS, 0, 0
	for i, c := range cands {
		l, s, h := Distance(target, c)
		if best < 0 || l < bestLink || l == bestLink && (s > bestShared || s == bestShared && h < bestHops) {
			best, bestLink, bestShared, bestHops = i, l, s, h
		}
	}
	return best, bestLink
}
