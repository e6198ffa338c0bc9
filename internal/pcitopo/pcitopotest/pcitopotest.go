// Package pcitopotest builds fake sysfs trees of real machine shapes for the
// tests of whatever reads PCI topology: a DGX H100 and a dual-socket PCIe
// server, each with the GPU-to-NIC answer a correct reader gives.
package pcitopotest

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// Tree is a fake sysfs under a test's temporary directory.
type Tree struct {
	t    testing.TB
	Root string
}

// New makes an empty fake sysfs, removed when the test ends.
func New(t testing.TB) *Tree {
	t.Helper()
	return &Tree{t: t, Root: t.TempDir()}
}

// Function lays out a PCI function at path below devices/ (root complex
// first, the function last) on a NUMA node, with its bus/pci/devices link,
// as the kernel does.
func (tr *Tree) Function(path string, numa int) {
	tr.t.Helper()
	dir := filepath.Join(tr.Root, "devices", path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tr.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "numa_node"), []byte(strconv.Itoa(numa)+"\n"), 0o644); err != nil {
		tr.t.Fatal(err)
	}
	tr.link(path, filepath.Join("bus", "pci", "devices", filepath.Base(path)))
}

// NIC lays out an RDMA device name on the function at path, with its
// class/infiniband link.
func (tr *Tree) NIC(name, path string, numa int) {
	tr.t.Helper()
	tr.Function(path, numa)
	tr.link(path, filepath.Join("class", "infiniband", name, "device"))
}

func (tr *Tree) link(path, name string) {
	tr.t.Helper()
	at := filepath.Join(tr.Root, name)
	if err := os.MkdirAll(filepath.Dir(at), 0o755); err != nil {
		tr.t.Fatal(err)
	}
	up := strings.Repeat("../", strings.Count(name, "/"))
	if err := os.Symlink(up+filepath.Join("devices", path), at); err != nil && !os.IsExist(err) {
		tr.t.Fatal(err)
	}
}

// NICInfo is an RDMA device of a machine: its name, PCI function and NUMA
// node, as the verbs library and sysfs report it.
type NICInfo struct {
	Name string
	Addr string
	NUMA int
}

// Machine is a fake sysfs of a real machine shape and what a correct
// reader finds there.
type Machine struct {
	*Tree
	// GPUs are the GPUs' PCI addresses, in the drivers' order.
	GPUs []string
	// GPUNUMA are their NUMA nodes.
	GPUNUMA []int
	// NICs are the RDMA devices, sorted by name.
	NICs []NICInfo
	// Nearest is, for each GPU, the name of its nearest NIC and the link to
	// it ("PIX" ... "SYS").
	Nearest []struct{ NIC, Link string }
}

func (m *Machine) gpu(path string, numa int, nic, link string) {
	m.Function(path, numa)
	m.GPUs = append(m.GPUs, filepath.Base(path))
	m.GPUNUMA = append(m.GPUNUMA, numa)
	m.Nearest = append(m.Nearest, struct{ NIC, Link string }{nic, link})
}

func (m *Machine) nic(name, path string, numa int) {
	m.NIC(name, path, numa)
	m.NICs = append(m.NICs, NICInfo{Name: name, Addr: filepath.Base(path), NUMA: numa})
}

func fn(bus, dev int) string { return fmt.Sprintf("0000:%02x:%02x.0", bus, dev) }

// DGXH100 is a DGX H100's PCI tree: two sockets, each with four root
// complexes; under each root port a PCIe switch with a GPU and its compute
// ConnectX-7 (mlx5_0 ... mlx5_7, in GPU order) on downstream ports. The
// four storage and management ConnectX-7 ports (mlx5_8 ... mlx5_11) hang
// off second-level switches or root ports of the first and last root
// complex of each socket, nearer to nothing than the compute NICs. Without
// computeNICs[i], GPU i loses its own NIC and its answer changes
// accordingly; computeNICs nil keeps all eight.
func DGXH100(t testing.TB, computeNICs []bool) *Machine {
	t.Helper()
	m := &Machine{Tree: New(t)}
	// Real bus numbers of a DGX H100's GPUs.
	gpuBus := []int{0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb}
	has := func(i int) bool { return computeNICs == nil || computeNICs[i] }
	paths := make([][]string, 8)
	for i, b := range gpuBus {
		rc := b - 4
		paths[i] = []string{fmt.Sprintf("pci0000:%02x", rc), fn(rc, 1), fn(rc+1, 0), fn(rc+2, 0)}
	}
	for i, b := range gpuBus {
		numa := i / 4
		rc := b - 4
		p := paths[i]
		nic, link := fmt.Sprintf("mlx5_%d", i), "PIX"
		if !has(i) {
			// Next nearest: a storage NIC below the same switch or on the
			// same root complex (GPUs 0, 3, 4, 7), else any NIC of the
			// socket.
			switch i {
			case 0, 4:
				nic, link = fmt.Sprintf("mlx5_%d", 8+i/2), "PXB"
			case 3, 7:
				nic, link = fmt.Sprintf("mlx5_%d", 9+(i-3)/2), "PHB"
			default:
				// All of the socket's NICs are on other root complexes of
				// its node: the tie goes to the first name.
				names := []string{fmt.Sprintf("mlx5_%d", 8+2*(i/4)), fmt.Sprintf("mlx5_%d", 9+2*(i/4))}
				for j := i / 4 * 4; j < i/4*4+4; j++ {
					if has(j) {
						names = append(names, fmt.Sprintf("mlx5_%d", j))
					}
				}
				sort.Strings(names)
				nic, link = names[0], "NODE"
			}
		}
		m.gpu(filepath.Join(append(p, fn(b, 0))...), numa, nic, link)
		if has(i) {
			m.nic(fmt.Sprintf("mlx5_%d", i), filepath.Join(append(append([]string(nil), p[:3]...), fn(rc+2, 1), fn(b+1, 0))...), numa)
		}
	}
	// Storage NICs: behind a second switch below GPU 0's and GPU 4's switch
	// (PXB to those GPUs), and on a root port of GPU 3's and GPU 7's root
	// complex (PHB to those GPUs).
	for k, i := range []int{0, 4} {
		p := paths[i]
		rc := gpuBus[i] - 4
		m.nic(fmt.Sprintf("mlx5_%d", 8+2*k), filepath.Join(append(append([]string(nil), p[:3]...), fn(rc+2, 2), fn(rc+0x0a, 0), fn(rc+0x0b, 0), fn(rc+0x0c, 0))...), i/4)
	}
	for k, i := range []int{3, 7} {
		rc := gpuBus[i] - 4
		m.nic(fmt.Sprintf("mlx5_%d", 9+2*k), filepath.Join(fmt.Sprintf("pci0000:%02x", rc), fn(rc, 2), fn(rc+0x0a, 0)), i/4)
	}
	sortNICs(m.NICs)
	return m
}

// DualSocketPCIe is a 2U PCIe server: two sockets; on socket 0 two GPUs on
// root ports of one root complex and a NIC on a third port of it (PHB to
// both); on socket 1 two GPUs on one root complex and the NIC on another
// root complex of the same node (NODE).
func DualSocketPCIe(t testing.TB) *Machine {
	t.Helper()
	m := &Machine{Tree: New(t)}
	m.gpu("pci0000:00/0000:00:01.0/0000:01:00.0", 0, "mlx5_0", "PHB")
	m.gpu("pci0000:00/0000:00:03.0/0000:02:00.0", 0, "mlx5_0", "PHB")
	m.gpu("pci0000:80/0000:80:01.0/0000:81:00.0", 1, "mlx5_1", "NODE")
	m.gpu("pci0000:80/0000:80:03.0/0000:82:00.0", 1, "mlx5_1", "NODE")
	m.nic("mlx5_0", "pci0000:00/0000:00:05.0/0000:03:00.0", 0)
	m.nic("mlx5_1", "pci0000:c0/0000:c0:01.0/0000:c1:00.0", 1)
	return m
}

func sortNICs(n []NICInfo) {
	sort.Slice(n, func(i, j int) bool { return n[i].Name < n[j].Name })
}
