package fabric

import (
	"errors"
	"fmt"
	"time"

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
	lib, err := rdma.Open(rdma.Config{Library: c.RDMALibrary, Logger: a.log})
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
		for _, d := range devs {
			for _, p := range d.Ports {
				if p.Active && p.Number == c.RDMAPort && name == "" {
					name = d.Name
				}
			}
		}
		if name == "" {
			lib.Close()
			return nil, fmt.Errorf("%w: none of %d RDMA devices has port %d active", rdma.ErrUnavailable, len(devs), c.RDMAPort)
		}
	}
	dev, err := lib.OpenDevice(name, c.RDMAPort)
	if err != nil {
		lib.Close()
		return nil, err
	}
	a.rdmaLib, a.rdmaDev = lib, dev
	return dev, nil
}

// registerPools registers the pool memory with the RDMA device, once, at
// start: peers read leased blocks from it and this node's reads land in
// it. Registration pins every page; it is logged with what it cost. A
// pool that cannot be registered is read and served over QUIC.
func (a *Agent) registerPools() error {
	if !a.transport.RDMAEnabled() {
		return nil
	}
	buf := a.storage.Bytes()
	if buf == nil {
		return nil
	}
	start := time.Now()
	st, err := a.transport.RegisterMemory(buf)
	if err != nil {
		if a.cfg.RDMA == "on" {
			return fmt.Errorf("%w: rdma=on: %w", ErrConfig, err)
		}
		a.log.Warn("RDMA registration of the pool failed: its blocks move over QUIC", "bytes", len(buf), "err", err)
		return nil
	}
	a.log.Info("pool registered for RDMA", "bytes", st.Bytes, "took", st.Duration, "total", time.Since(start))
	return nil
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
