package fabric

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer"
)

// openRDMA opens the RDMA devices (or libfabric's endpoint, by
// Config.Fabric) for the transport, or returns nil when RDMA is off: by
// configuration, or (with auto) because the library or a usable device is
// missing, which it logs once with the reason. With rdma=on a missing
// device is an error.
func (a *Agent) openRDMA() (*transfer.RDMAConfig, error) {
	c := &a.cfg
	if c.RDMA == "off" || c.Fabric == "off" {
		return nil, nil
	}
	var devs []*rdma.Device
	err := errors.New("fabric=ofi")
	if c.Fabric != "ofi" {
		devs, err = a.openRDMADevices()
	}
	if err != nil && c.Fabric != "verbs" {
		verbsErr := err
		var rc *transfer.RDMAConfig
		if rc, err = a.openOFI(); err == nil {
			return rc, nil
		}
		if c.Fabric == "auto" {
			err = fmt.Errorf("libibverbs: %w; libfabric: %w", verbsErr, err)
		}
	}
	if err != nil {
		if c.RDMA == "on" {
			return nil, badSettingErr("rdma", err, "on, and RDMA cannot be used: %v", err)
		}
		a.log.Info("RDMA off: reads use QUIC", "reason", err.Error())
		return nil, nil
	}
	for _, dev := range devs {
		port := dev.Port()
		a.log.Info("RDMA on", "device", dev.Info().Name, "port", port.Number, "link_layer", port.LinkLayer.String(),
			"mtu", port.MTU, "gid", dev.GID().String(), "lid", port.LID)
	}
	return &transfer.RDMAConfig{Devices: devs, QP: rdma.QPOptions{Timeout: uint8(c.RDMATimeout), RetryCount: uint8(c.RDMARetry)}}, nil
}

// openOFI opens libfabric's endpoint on Config.FabricProvider (or cxi,
// efa, verbs) for the transport.
func (a *Agent) openOFI() (*transfer.RDMAConfig, error) {
	c := &a.cfg
	// With fabric=auto and no provider named, a machine without cxi, efa
	// or verbs says so once per process: listing libfabric's providers
	// takes a few hundred milliseconds, and hardware does not come.
	probe := c.Fabric == "auto" && c.FabricProvider == ""
	key := os.Getenv(ofi.EnvLibrary) + "\x00" + c.FabricAddr
	if probe {
		ofiAbsent.mu.Lock()
		err, ok := ofiAbsent.err[key]
		ofiAbsent.mu.Unlock()
		if ok {
			return nil, err
		}
	}
	// Without device pools the provider is opened for host memory only:
	// shm then reads by cross-memory attach where it may (ofi.Config).
	lib, err := ofi.Load(ofi.Config{Provider: c.FabricProvider, Node: c.FabricAddr, Logger: a.log,
		HostOnly: a.poolKind != "device"})
	if err != nil {
		return nil, err
	}
	ep, err := lib.Open()
	if err != nil {
		lib.Close()
		if probe && errors.Is(err, ofi.ErrUnavailable) {
			ofiAbsent.mu.Lock()
			ofiAbsent.err[key] = err
			ofiAbsent.mu.Unlock()
		}
		return nil, err
	}
	info := ep.Info()
	a.ofiLib, a.ofiEp, a.poolNIC = lib, ep, make([]int, len(a.storages))
	a.log.Info("RDMA on over libfabric", "provider", info.Provider, "domain", info.Domain, "mr_mode", info.MRMode.String(),
		"libfabric", lib.Version())
	return &transfer.RDMAConfig{OFI: ep}, nil
}

// ofiAbsent remembers, by libfabric library and address, that libfabric
// offers none of cxi, efa and verbs.
var ofiAbsent = struct {
	mu  sync.Mutex
	err map[string]error
}{err: map[string]error{}}

// rdmaDeviceName names what storage i is registered with: its RDMA
// device, or "ofi:" and libfabric's provider.
func (a *Agent) rdmaDeviceName(i int) string {
	if a.ofiEp != nil {
		return "ofi:" + a.ofiEp.Info().Provider
	}
	return a.rdmaDevs[a.poolNIC[i]].Info().Name
}

// openRDMADevices opens the devices the pools are registered with (see
// pickNICs) and sets a.poolNIC.
func (a *Agent) openRDMADevices() ([]*rdma.Device, error) {
	c := &a.cfg
	lib, err := rdma.Open(rdma.Config{Library: c.RDMALibrary, Logger: a.log, SysfsRoot: c.hooks.sysfsRoot})
	if err != nil {
		return nil, err
	}
	names, poolNIC := []string{c.RDMADevice}, make([]int, len(a.storages))
	if c.RDMADevice == "" {
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
		names, poolNIC = a.pickNICs(active)
	}
	var opened []*rdma.Device
	for _, name := range names {
		dev, err := lib.OpenDevice(name, c.RDMAPort)
		if err != nil {
			for _, d := range opened {
				d.Close()
			}
			lib.Close()
			return nil, err
		}
		opened = append(opened, dev)
	}
	a.rdmaLib, a.rdmaDevs, a.poolNIC = lib, opened, poolNIC
	return opened, nil
}

// pickNICs chooses, among the devices with an active port, those the
// pools are registered with: for host memory, the first; for GPU memory,
// for each GPU the device nearest it in PCI topology (one behind the same
// PCIe switch moves data peer to peer; one across the socket halves the
// bandwidth, the most common mistake of every fabric), a NIC per GPU
// where the node has them. It returns the devices to open, each once, and
// for each storage the index of its device among them. A GPU whose
// nearest device is unknown shares the first GPU's (or takes the first
// active device). --rdma-device overrides it all with one device.
func (a *Agent) pickNICs(active []rdma.DeviceInfo) (names []string, poolNIC []int) {
	poolNIC = make([]int, len(a.storages))
	if a.gpus == nil || a.cuda == nil {
		return []string{active[0].Name}, poolNIC
	}
	infos := a.cuda.Devices()
	nearest := make([]string, len(a.gpus))
	index := map[string]int{}
	for i, g := range a.gpus {
		bus := infos[g].PCIBusID
		d, err := rdma.ClosestDevice(bus, active, a.cfg.hooks.sysfsRoot)
		if err != nil {
			a.log.Warn("RDMA device nearest the GPU unknown", "gpu", g, "pci_bus_id", bus, "err", err)
			continue
		}
		nearest[i] = d.Name
		if _, ok := index[d.Name]; !ok {
			index[d.Name] = len(names)
			names = append(names, d.Name)
		}
	}
	if len(names) == 0 {
		a.log.Warn("no RDMA device known to be near a GPU pool: using the first active one", "device", active[0].Name)
		return []string{active[0].Name}, poolNIC
	}
	for i, g := range a.gpus {
		if nearest[i] == "" {
			a.log.Warn("GPU pool registered with another GPU's RDMA device", "gpu", g, "device", names[0])
			continue
		}
		poolNIC[i] = index[nearest[i]]
		a.log.Info("RDMA device for the GPU pool", "gpu", g, "pci_bus_id", infos[g].PCIBusID, "device", nearest[i])
	}
	return names, poolNIC
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
				return badSettingErr("rdma", err, "on, and the pool's RDMA registration failed: %v", err)
			}
			a.log.Warn("RDMA registration of the pool failed: its blocks move over QUIC", "bytes", len(buf), "err", err)
			continue
		}
		a.poolDevice[i] = a.rdmaDeviceName(i)
		a.log.Info("pool registered for RDMA", "device", a.poolDevice[i], "bytes", rs.Bytes, "took", rs.Duration, "total", time.Since(start))
		if a.isolatable() {
			// Block sets get memory of their own (engine_memory.go), which
			// replaces the pages under the pool's addresses: each set's
			// memory is registered when it is made instead. The pool's
			// registration above proved that the device takes it.
			if err := a.transport.DeregisterMemory(buf); err != nil {
				return fmt.Errorf("fabric: pool: %w", err)
			}
			a.hostRDMA = true
		}
	}
	return nil
}

// registerDevicePool registers the GPU pool with the RDMA device so that
// peers read it and imports land in it with no host copy: by dma-buf
// (cuMemGetHandleForAddressRange on the allocation base, then
// ibv_reg_dmabuf_mr), else by the device pointer through the kernel's
// peer-memory client where it is loaded, as NCCL falls back. Which one is
// logged and shown in status; with neither, the pool's blocks move over
// QUIC through pinned staging (import_staging.go), which is logged as a warning,
// or refused at start with rdma=on.
func (a *Agent) registerDevicePool(i int, dm *cuda.DeviceMemory) error {
	if a.ofiEp != nil {
		return a.registerDevicePoolOFI(i, dm)
	}
	gpu := a.gpus[i]
	start := time.Now()
	var dmaErr, ptrErr error
	f, err := dm.Dmabuf()
	if err == nil {
		st, rerr := a.transport.RegisterDmabuf(a.poolNIC[i], f, dm.Addr(), dm.Size())
		f.Close()
		if rerr == nil {
			a.rdmaReg[i], a.poolDevice[i] = "dmabuf", a.rdmaDeviceName(i)
			a.log.Info("device pool registered for RDMA by dma-buf", "gpu", gpu, "device", a.poolDevice[i], "bytes", st.Bytes, "took", st.Duration, "total", time.Since(start))
			return nil
		}
		err = rerr
	}
	dmaErr = err
	if mod, ok := peerMemoryModule(); ok {
		st, err := a.transport.RegisterAddr(a.poolNIC[i], dm.Addr(), dm.Size())
		if err == nil {
			a.rdmaReg[i], a.poolDevice[i] = "peer-memory", a.rdmaDeviceName(i)
			a.log.Info("device pool registered for RDMA by device pointer (peer memory)", "gpu", gpu, "device", a.poolDevice[i], "module", mod,
				"bytes", st.Bytes, "took", st.Duration, "dmabuf_err", dmaErr.Error())
			return nil
		}
		ptrErr = err
	} else {
		ptrErr = errors.New("no peer-memory module (nvidia-peermem) is loaded")
	}
	err = fmt.Errorf("dma-buf: %w; device pointer: %w", dmaErr, ptrErr)
	if a.cfg.RDMA == "on" {
		return badSettingErr("rdma", err, "on, and the device pool on GPU %d cannot be registered for RDMA: %v", gpu, err)
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

// closeRDMA closes the devices and library after the transport.
func (a *Agent) closeRDMA() error {
	var errs []error
	for _, d := range a.rdmaDevs {
		errs = append(errs, d.Close())
	}
	if a.rdmaLib != nil {
		errs = append(errs, a.rdmaLib.Close())
	}
	if a.ofiEp != nil {
		errs = append(errs, a.ofiEp.Close())
	}
	if a.ofiLib != nil {
		errs = append(errs, a.ofiLib.Close())
	}
	return errors.Join(errs...)
}
