package fabric

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/transfer"
)

// openRDMA opens the configured RDMA device for the transport, or returns
// nil when RDMA is off: by configuration, or (with auto) because the
// library or a usable device is missing, which it logs once with the
// reason. With rdma=on a missing device is an error.
func (a *Agent) openRDMA() (*transfer.RDMAConfig, error) {
	c := &a.cfg
	if c.RDMA == "off" {
		return nil, nil
	}
	dev, err := a.openRDMADevice()
	if err != nil {
		if c.RDMA == "on" {
			return nil, fmt.Errorf("%w: rdma=on: %w", ErrConfig, err)
		}
		a.log.Info("RDMA off: reads use QUIC", "reason", err.Error())
		return nil, nil
	}
	port := dev.Port()
	a.log.Info("RDMA on", "device", dev.Info().Name, "port", port.Number, "link_layer", port.LinkLayer.String(),
		"mtu", port.MTU, "gid", dev.GID().String(), "lid", port.LID)
	return &transfer.RDMAConfig{Device: dev, QP: rdma.QPOptions{Timeout: uint8(c.RDMATimeout), RetryCount: uint8(c.RDMARetry)}}, nil
}

func (a *Agent) openRDMADevice() (*rdma.Device, error) {
	c := &a.cfg
	lib, err := rdma.Open(rdma.Config{Library: c.RDMALibrary, Logger: a.log, SysfsRoot: c.hooks.sysfsRoot})
	if err != nil {
		return nil, err
	}
	name := c.RDMADevice
	if name == "" {
		devs, err := lib.Devices()
		if err != nil {
			lib.Close()
			return nil, err
		}
		var active []rdma.DeviceInfo
		for _, d := range devs {
			for _, p := range d.Ports {
				if p.Active && p.Number == c.RDMAPort {
					active = append(active, d)
					break
				}
			}
		}
		if len(active) == 0 {
			lib.Close()
			return nil, fmt.Errorf("%w: none of %d RDMA devices has port %d active", rdma.ErrUnavailable, len(devs), c.RDMAPort)
		}
		name = a.pickNIC(active)
	}
	dev, err := lib.OpenDevice(name, c.RDMAPort)
	if err != nil {
		lib.Close()
		return nil, err
	}
	a.rdmaLib, a.rdmaDev = lib, dev
	return dev, nil
}

// pickNIC chooses, among the devices with an active port, the one for the
// pool: for GPU memory, the device nearest the GPUs in PCI topology (one
// behind the same PCIe switch moves data peer to peer; one across the
// socket halves the bandwidth, the most common mistake of every fabric);
// for host memory, the first. The agent drives one device: with device
// pools on GPUs whose nearest devices differ, it takes the one nearest the
// most of them (the lowest GPU's on a tie) and says which GPUs it does not
// suit. --rdma-device overrides it.
func (a *Agent) pickNIC(active []rdma.DeviceInfo) string {
	if a.gpus == nil || a.cuda == nil {
		return active[0].Name
	}
	infos := a.cuda.Devices()
	nearest := make([]string, len(a.gpus))
	votes := map[string]int{}
	pick := ""
	for i, g := range a.gpus {
		bus := infos[g].PCIBusID
		d, err := rdma.ClosestDevice(bus, active, a.cfg.hooks.sysfsRoot)
		if err != nil {
			a.log.Warn("RDMA device nearest the GPU unknown", "gpu", g, "pci_bus_id", bus, "err", err)
			continue
		}
		nearest[i] = d.Name
		votes[d.Name]++
		if pick == "" || votes[d.Name] > votes[pick] {
			pick = d.Name
		}
	}
	if pick == "" {
		a.log.Warn("no RDMA device known to be near a GPU pool: using the first active one", "device", active[0].Name)
		return active[0].Name
	}
	for i, g := range a.gpus {
		switch nearest[i] {
		case pick:
			a.log.Info("RDMA device for the GPU pool", "gpu", g, "pci_bus_id", infos[g].PCIBusID, "device", pick)
		case "":
		default:
			a.log.Warn("the RDMA device this agent drives is not the one nearest this GPU: its reads cross the PCIe hierarchy",
				"gpu", g, "pci_bus_id", infos[g].PCIBusID, "device", pick, "nearest", nearest[i])
		}
	}
	return pick
}

// registerPools registers the pool memory with the RDMA device, once, at
// start: peers read leased blocks from it and this node's reads land in
// it. Registration pins every page; it is logged with what it cost. A
// pool that cannot be registered is read and served over QUIC.
func (a *Agent) registerPools() error {
	if !a.transport.RDMAEnabled() {
		return nil
	}
	for i, st := range a.storages {
		if dm, ok := st.(*cuda.DeviceMemory); ok {
			if err := a.registerDevicePool(i, dm); err != nil {
				return err
			}
			continue
		}
		buf := st.Bytes()
		if buf == nil {
			continue
		}
		start := time.Now()
		rs, err := a.transport.RegisterMemory(buf)
		if err != nil {
			if a.cfg.RDMA == "on" {
				return fmt.Errorf("%w: rdma=on: %w", ErrConfig, err)
			}
			a.log.Warn("RDMA registration of the pool failed: its blocks move over QUIC", "bytes", len(buf), "err", err)
			continue
		}
		a.log.Info("pool registered for RDMA", "bytes", rs.Bytes, "took", rs.Duration, "total", time.Since(start))
	}
	return nil
}

// registerDevicePool registers the GPU pool with the RDMA device so that
// peers read it and imports land in it with no host copy: by dma-buf
// (cuMemGetHandleForAddressRange on the allocation base, then
// ibv_reg_dmabuf_mr), else by the device pointer through the kernel's
// peer-memory client where it is loaded, as NCCL falls back. Which one is
// logged and shown in status; with neither, the pool's blocks move over
// QUIC through pinned staging (staging.go), which is logged as a warning,
// or refused at start with rdma=on.
func (a *Agent) registerDevicePool(i int, dm *cuda.DeviceMemory) error {
	gpu := a.gpus[i]
	start := time.Now()
	var dmaErr, ptrErr error
	f, err := dm.Dmabuf()
	if err == nil {
		st, rerr := a.transport.RegisterDmabuf(f, dm.Addr(), dm.Size())
		f.Close()
		if rerr == nil {
			a.rdmaReg[i] = "dmabuf"
			a.log.Info("device pool registered for RDMA by dma-buf", "gpu", gpu, "bytes", st.Bytes, "took", st.Duration, "total", time.Since(start))
			return nil
		}
		err = rerr
	}
	dmaErr = err
	if mod, ok := peerMemoryModule(); ok {
		st, err := a.transport.RegisterAddr(dm.Addr(), dm.Size())
		if err == nil {
			a.rdmaReg[i] = "peer-memory"
			a.log.Info("device pool registered for RDMA by device pointer (peer memory)", "gpu", gpu, "module", mod,
				"bytes", st.Bytes, "took", st.Duration, "dmabuf_err", dmaErr.Error())
			return nil
		}
		ptrErr = err
	} else {
		ptrErr = errors.New("no peer-memory module (nvidia-peermem) is loaded")
	}
	err = fmt.Errorf("dma-buf: %w; device pointer: %w", dmaErr, ptrErr)
	if a.cfg.RDMA == "on" {
		return fmt.Errorf("%w: rdma=on: device pool on GPU %d: %w", ErrConfig, gpu, err)
	}
	a.log.Warn("RDMA registration of the device pool failed: its blocks move over QUIC through pinned staging",
		"gpu", gpu, "bytes", dm.Size(), "err", err)
	return nil
}

// peerMemoryPaths are where a loaded peer-memory client shows itself, the
// files NCCL checks for GPUDirect RDMA without dma-buf.
var peerMemoryPaths = []string{"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/module/nvidia_peermem/version", "/sys/module/nv_peer_mem/version"}

// peerMemoryModule says whether a peer-memory client is loaded, and which.
func peerMemoryModule() (string, bool) {
	for _, p := range peerMemoryPaths {
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	return "", false
}

// closeRDMA closes the device and library after the transport.
func (a *Agent) closeRDMA() error {
	var errs []error
	if a.rdmaDev != nil {
		errs = append(errs, a.rdmaDev.Close())
	}
	if a.rdmaLib != nil {
		errs = append(errs, a.rdmaLib.Close())
	}
	return errors.Join(errs...)
}
