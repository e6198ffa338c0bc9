package cuda

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
)

// DeviceInfo describes one GPU as the driver numbers it.
type DeviceInfo struct {
	// Index is the driver's ordinal (CUDA_VISIBLE_DEVICES applies).
	Index int
	// Name is the product name.
	Name string
	// TotalMemory is the device memory in bytes.
	TotalMemory uint64
	// PCIBusID is domain:bus:device.function, as the driver writes it.
	PCIBusID string
	// Dmabuf reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: whether device
	// memory can be exported as a dma-buf for the NIC.
	Dmabuf bool
}

// Driver is the CUDA driver, loaded. It retains each device's primary
// context on first use and releases them on Close. Methods are safe for
// concurrent use. Memory, streams and events made through it must be
// closed before the Driver.
type Driver struct {
	lib     *lib
	path    string
	log     *slog.Logger
	devices []DeviceInfo

	mu       sync.Mutex
	retained map[int]bool
	closed   bool
}

// Open loads the driver library, initialises it and reads the devices.
// Without cgo, without the library or with a driver too old, the error
// wraps ErrNotSupported; with no device, ErrUnavailable. Either way the
// caller runs on host memory.
func Open(cfg Config) (*Driver, error) {
	path := cfg.path()
	l, err := openLib(path)
	if err != nil {
		return nil, err
	}
	n, err := l.deviceCount()
	if err == nil && n == 0 {
		err = fmt.Errorf("cuda: %s reports no devices: %w", path, ErrUnavailable)
	}
	if err != nil {
		l.close()
		return nil, err
	}
	if n > maxDevices {
		n = maxDevices
	}
	d := &Driver{lib: l, path: path, log: cfg.logger(), retained: map[int]bool{}}
	for i := range n {
		info, err := l.deviceInfo(i)
		if err != nil {
			l.close()
			return nil, fmt.Errorf("cuda: device %d: %w", i, err)
		}
		d.devices = append(d.devices, info)
	}
	d.log.Debug("cuda: driver loaded", "path", path, "devices", n)
	return d, nil
}

// Path returns the library that was loaded.
func (d *Driver) Path() string { return d.path }

// Devices returns the GPUs the driver sees.
func (d *Driver) Devices() []DeviceInfo { return append([]DeviceInfo(nil), d.devices...) }

// context makes sure dev's primary context is retained.
func (d *Driver) context(dev int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	if dev < 0 || dev >= len(d.devices) {
		return fmt.Errorf("cuda: device %d: the driver has %d: %w", dev, len(d.devices), ErrUnavailable)
	}
	if d.retained[dev] {
		return nil
	}
	if err := d.lib.retain(dev); err != nil {
		return fmt.Errorf("cuda: device %d: %w", dev, err)
	}
	d.retained[dev] = true
	return nil
}

// MemInfo returns the free and total device memory of dev.
func (d *Driver) MemInfo(dev int) (free, total uint64, err error) {
	if err := d.context(dev); err != nil {
		return 0, 0, err
	}
	return d.lib.memInfo(dev)
}

// Close releases the primary contexts and unloads nothing (a driver is
// not safely unloadable while other libraries of the process hold it).
// It is safe to call twice.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	var errs []error
	for dev := range d.retained {
		if err := d.lib.release(dev); err != nil {
			errs = append(errs, fmt.Errorf("cuda: device %d: %w", dev, err))
		}
	}
	return errors.Join(errs...)
}
