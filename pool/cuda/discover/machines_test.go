//go:build cgo && linux

package discover

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/kvfabric/kvfabric/internal/pcitopo/pcitopotest"
)

// withBusIDs sets the mock's GPUs at the machine's bus ids, as NVML spells
// them, and leaves their NUMA node for sysfs to tell.
func withBusIDs(s *server.Server, m *pcitopotest.Machine) {
	for i, d := range s.Devices {
		dev := d.(*server.Device)
		id := "0000" + strings.ToUpper(m.GPUs[i])
		dev.GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) {
			var p nvml.PciInfo
			for j, c := range id {
				p.BusId[j] = int8(c)
			}
			return p, nvml.SUCCESS
		}
		dev.GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}
}

// On a DGX H100's tree, with all, some and none of the compute NICs,
// `kvfabric gpus` shows each GPU the machine's nearest NIC: the same
// answers rdma.ClosestDevice's tests hold the agent to.
func TestDiscoverOnDGXH100Tree(t *testing.T) {
	for _, nics := range [][]bool{nil, {false, false, true, false, true, false, true, true}, make([]bool, 8)} {
		t.Run(fmt.Sprint(nics), func(t *testing.T) {
			m := pcitopotest.DGXH100(t, nics)
			s := dgx(t)
			withBusIDs(s, m)
			gpus, err := FromNVML(s, Config{Sysfs: m.Root})
			if err != nil {
				t.Fatal(err)
			}
			for i, g := range gpus {
				if g.PCIBusID != m.GPUs[i] || g.NUMANode != m.GPUNUMA[i] {
					t.Errorf("GPU %d at %s NUMA %d, want %s NUMA %d", i, g.PCIBusID, g.NUMANode, m.GPUs[i], m.GPUNUMA[i])
				}
				if g.NIC != m.Nearest[i].NIC || g.NICPath != m.Nearest[i].Link {
					t.Errorf("GPU %d: nearest %s (%s), want %s (%s)", i, g.NIC, g.NICPath, m.Nearest[i].NIC, m.Nearest[i].Link)
				}
			}
		})
	}
}

func TestAnnotateOnDualSocketPCIe(t *testing.T) {
	m := pcitopotest.DualSocketPCIe(t)
	gpus := make([]GPU, len(m.GPUs))
	for i, g := range m.GPUs {
		gpus[i] = GPU{Index: i, PCIBusID: g, NUMANode: -1}
	}
	annotate(Config{Sysfs: m.Root}, gpus)
	for i, g := range gpus {
		if g.NUMANode != m.GPUNUMA[i] || g.NIC != m.Nearest[i].NIC || g.NICPath != m.Nearest[i].Link {
			t.Errorf("GPU %d: NUMA %d nearest %s (%s), want NUMA %d %s (%s)", i, g.NUMANode, g.NIC, g.NICPath,
				m.GPUNUMA[i], m.Nearest[i].NIC, m.Nearest[i].Link)
		}
	}
}
