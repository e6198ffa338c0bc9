package cuda

import (
	"fmt"
	"os"
	"sync"
	"unsafe"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
)

// IPCHandle is a CUDA IPC memory handle (CUipcMemHandle): 64 opaque bytes
// that another process on the node passes to OpenIPCHandle to map the same
// device memory.
type IPCHandle [64]byte

// DeviceMemory is device memory from cuMemAlloc: a pool.Storage of kind
// Device. This process cannot dereference it, so Bytes is nil; bytes move
// with the copies of a Stream.
type DeviceMemory struct{ deviceRange }

// deviceRange is what DeviceMemory and IPCMemory share: a range of one
// GPU's memory at a device pointer of this process, freed once.
type deviceRange struct {
	d    *Driver
	dev  int
	ptr  uint64
	size uint64

	once sync.Once
	err  error
}

// Addr returns the device pointer in this process.
func (m *deviceRange) Addr() uint64 { return m.ptr }

// Size returns the bytes of the range.
func (m *deviceRange) Size() uint64 { return m.size }

// Kind returns layout.Device.
func (m *deviceRange) Kind() layout.MemoryKind { return layout.Device }

// Device returns the GPU index.
func (m *deviceRange) Device() int32 { return int32(m.dev) }

// Bytes returns nil: device memory is not addressable from the host.
func (m *deviceRange) Bytes() []byte { return nil }

// release runs free on the range once; what names it in the error.
func (m *deviceRange) release(what string, free func(dev int, ptr uint64) error) error {
	m.once.Do(func() {
		if err := free(m.dev, m.ptr); err != nil {
			m.err = fmt.Errorf("cuda: device %d: %s %#x: %w", m.dev, what, m.ptr, err)
		}
	})
	return m.err
}

var _ pool.Storage = (*DeviceMemory)(nil)

// AllocDevice allocates size bytes of device memory on dev.
func (d *Driver) AllocDevice(dev int, size uint64) (*DeviceMemory, error) {
	if size == 0 {
		return nil, fmt.Errorf("cuda: device %d: allocate 0 bytes: %w", dev, ErrInvalidValue)
	}
	if err := d.context(dev); err != nil {
		return nil, err
	}
	p, err := d.lib.memAlloc(dev, size)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: allocate %d bytes: %w", dev, size, err)
	}
	return &DeviceMemory{deviceRange{d: d, dev: dev, ptr: p, size: size}}, nil
}

// IPCHandle returns the handle an engine process opens with OpenIPCHandle.
func (m *DeviceMemory) IPCHandle() (IPCHandle, error) {
	return m.d.IPCHandle(m.dev, m.ptr)
}

// IPCHandle returns the IPC handle of the allocation holding ptr on dev
// (the driver's handles name whole allocations: the opener gets the base).
func (d *Driver) IPCHandle(dev int, ptr uint64) (IPCHandle, error) {
	if err := d.context(dev); err != nil {
		return IPCHandle{}, err
	}
	h, err := d.lib.ipcGet(dev, ptr)
	if err != nil {
		return h, fmt.Errorf("cuda: device %d: IPC handle of %#x: %w", dev, ptr, err)
	}
	return h, nil
}

// Dmabuf exports the whole allocation as a dma-buf for the NIC
// (ibv_reg_dmabuf_mr). See Driver.DmabufFD.
func (m *DeviceMemory) Dmabuf() (*os.File, error) {
	return m.d.DmabufFD(m.dev, m.ptr, m.size)
}

// Close frees the memory. It is safe to call twice.
func (m *DeviceMemory) Close() error { return m.release("free", m.d.lib.memFree) }

// DmabufFD exports [ptr, ptr+size) of dev's memory as a dma-buf descriptor
// (cuMemGetHandleForAddressRange, flags 0), for ibv_reg_dmabuf_mr. ptr
// should be an allocation's base and size a multiple of the host page size.
// A driver, kernel or device without dma-buf gives an error wrapping
// ErrNotSupported: the caller then falls back to the peer-memory path
// (ibv_reg_mr on the device pointer), as NCCL does. The caller closes the
// file.
func (d *Driver) DmabufFD(dev int, ptr, size uint64) (*os.File, error) {
	if err := d.context(dev); err != nil {
		return nil, err
	}
	if !d.devices[dev].Dmabuf {
		return nil, fmt.Errorf("cuda: device %d: dma-buf export: the driver reports no support: %w", dev, ErrNotSupported)
	}
	page := uint64(os.Getpagesize())
	if size == 0 || ptr%page != 0 || size%page != 0 {
		return nil, fmt.Errorf("cuda: device %d: dma-buf export of %d bytes at %#x: address and size must be non-zero multiples of %d: %w",
			dev, size, ptr, page, ErrInvalidValue)
	}
	fd, err := d.lib.dmabuf(dev, ptr, size)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: dma-buf export: %w", dev, err)
	}
	return os.NewFile(uintptr(fd), fmt.Sprintf("cuda-dmabuf-%d-%#x", dev, ptr)), nil
}

// IPCMemory is another process's device memory opened from an IPC handle:
// a pool.Storage of kind Device at this process's own address.
type IPCMemory struct{ deviceRange }

var _ pool.Storage = (*IPCMemory)(nil)

// OpenIPCHandle maps the device memory another process exported, in dev's
// context. A handle from this same process is refused by the driver; one
// whose exporter freed the memory or exited gives ErrInvalidHandle (or
// another driver error).
func (d *Driver) OpenIPCHandle(dev int, h IPCHandle) (*IPCMemory, error) {
	if err := d.context(dev); err != nil {
		return nil, err
	}
	p, err := d.lib.ipcOpen(dev, h)
	if err != nil {
		return nil, fmt.Errorf("cuda: device %d: open IPC handle: %w", dev, err)
	}
	_, size, err := d.lib.addressRange(dev, p)
	if err != nil {
		d.lib.ipcClose(dev, p)
		return nil, fmt.Errorf("cuda: device %d: size of opened IPC memory: %w", dev, err)
	}
	return &IPCMemory{deviceRange{d: d, dev: dev, ptr: p, size: size}}, nil
}

// Close unmaps it (cuIpcCloseMemHandle). It is safe to call twice.
func (m *IPCMemory) Close() error { return m.release("close IPC memory", m.d.lib.ipcClose) }

// PinnedMemory is page-locked host memory from cuMemHostAlloc (portable
// to every context): a pool.Storage of kind Pinned whose Bytes the host
// reads and writes, and that copies reach at full speed.
type PinnedMemory struct {
	d    *Driver
	p    unsafe.Pointer
	mem  []byte
	node int32

	once sync.Once
	err  error
}

var _ pool.Storage = (*PinnedMemory)(nil)

// AllocPinned allocates size bytes of pinned host memory. numaNode is
// reported by Device (-1 for any); the memory is not bound to it here.
func (d *Driver) AllocPinned(size uint64, numaNode int32) (*PinnedMemory, error) {
	if size == 0 {
		return nil, fmt.Errorf("cuda: allocate 0 bytes of pinned memory: %w", ErrInvalidValue)
	}
	if err := d.context(0); err != nil {
		return nil, err
	}
	p, err := d.lib.hostAlloc(0, size)
	if err != nil {
		return nil, fmt.Errorf("cuda: allocate %d bytes of pinned memory: %w", size, err)
	}
	return &PinnedMemory{d: d, p: p, mem: unsafe.Slice((*byte)(p), size), node: numaNode}, nil
}

// Addr returns the host address.
func (m *PinnedMemory) Addr() uint64 { return uint64(uintptr(m.p)) }

// Size returns the bytes.
func (m *PinnedMemory) Size() uint64 { return uint64(len(m.mem)) }

// Kind returns layout.Pinned.
func (m *PinnedMemory) Kind() layout.MemoryKind { return layout.Pinned }

// Device returns the NUMA node given to AllocPinned.
func (m *PinnedMemory) Device() int32 { return m.node }

// Bytes returns the memory; it must not be used after Close.
func (m *PinnedMemory) Bytes() []byte { return m.mem }

// Close frees the memory. It is safe to call twice.
func (m *PinnedMemory) Close() error {
	m.once.Do(func() {
		if err := m.d.lib.hostFree(0, m.p); err != nil {
			m.err = fmt.Errorf("cuda: free pinned memory: %w", err)
		}
		m.mem = nil
	})
	return m.err
}

// PinnedStorage is host storage registered with the driver
// (cuMemHostRegister), so that copies reach it as pinned memory while
// engines keep mapping it as before: as a whole (PinHost), or range by
// range (PinHostRanges).
type PinnedStorage struct {
	pool.Storage
	d *Driver

	// ranges are the registered ranges by offset, with their sizes, when
	// the storage is registered range by range; nil for a whole one.
	mu     sync.Mutex
	ranges map[uint64]uint64

	once sync.Once
	err  error
}

// PinHost registers host storage (a pool.HostStorage, for instance) with
// the driver. The PinnedStorage takes ownership: its Close unregisters and
// then closes s. Storage without host bytes (device memory) is refused.
func (d *Driver) PinHost(s pool.Storage) (*PinnedStorage, error) {
	b := s.Bytes()
	if len(b) == 0 {
		return nil, fmt.Errorf("cuda: pin storage of kind %v: it has no host bytes: %w", s.Kind(), ErrInvalidValue)
	}
	if err := d.context(0); err != nil {
		return nil, err
	}
	if err := d.lib.hostRegister(0, unsafe.Pointer(&b[0]), uint64(len(b))); err != nil {
		return nil, fmt.Errorf("cuda: pin %d bytes of host storage: %w", len(b), err)
	}
	return &PinnedStorage{Storage: s, d: d}, nil
}

// PinHostRanges takes host storage to be registered with the driver range
// by range (Pin, Unpin), for storage whose pages are replaced under its
// addresses (pool.HostStorage.NewSection): the driver pins the pages a
// range has when it is registered, and would not follow new ones. The
// whole storage is registered and unregistered once first, so that a
// driver that refuses it says so here. The PinnedStorage takes ownership:
// its Close unregisters the ranges still registered and then closes s.
func (d *Driver) PinHostRanges(s pool.Storage) (*PinnedStorage, error) {
	p, err := d.PinHost(s)
	if err != nil {
		return nil, err
	}
	b := s.Bytes()
	if err := d.lib.hostUnregister(0, unsafe.Pointer(&b[0])); err != nil {
		return nil, fmt.Errorf("cuda: unpin host storage after the first pin: %w", err)
	}
	p.ranges = map[uint64]uint64{}
	return p, nil
}

// Pin registers [off, off+size) of storage from PinHostRanges with the
// driver, with the pages it has now. The range must lie inside the storage
// and overlap no registered one (the driver's "already registered").
func (p *PinnedStorage) Pin(off, size uint64) error {
	b := p.Storage.Bytes()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ranges == nil || size == 0 || off > uint64(len(b)) || size > uint64(len(b))-off {
		return fmt.Errorf("cuda: pin [%d, +%d) of %d bytes of host storage registered as a whole or closed, or outside it: %w", off, size, len(b), ErrInvalidValue)
	}
	if err := p.d.lib.hostRegister(0, unsafe.Pointer(&b[off]), size); err != nil {
		return fmt.Errorf("cuda: pin [%d, +%d) of host storage: %w", off, size, err)
	}
	p.ranges[off] = size
	return nil
}

// Unpin unregisters the range Pin registered at off. Pages put under the
// range afterwards (a new section) may be pinned again.
func (p *PinnedStorage) Unpin(off uint64) error {
	b := p.Storage.Bytes()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.ranges[off]; !ok || len(b) == 0 {
		return fmt.Errorf("cuda: unpin at %d of host storage: no range pinned there: %w", off, ErrInvalidValue)
	}
	delete(p.ranges, off)
	if err := p.d.lib.hostUnregister(0, unsafe.Pointer(&b[off])); err != nil {
		return fmt.Errorf("cuda: unpin at %d of host storage: %w", off, err)
	}
	return nil
}

// PinnedBytes is what is registered with the driver now: the whole storage,
// or the sum of the ranges pinned.
func (p *PinnedStorage) PinnedBytes() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ranges == nil {
		return uint64(len(p.Storage.Bytes()))
	}
	var n uint64
	for _, size := range p.ranges {
		n += size
	}
	return n
}

// Kind returns layout.Pinned.
func (p *PinnedStorage) Kind() layout.MemoryKind { return layout.Pinned }

// Close unregisters the memory and closes the storage under it. It is safe
// to call twice.
func (p *PinnedStorage) Close() error {
	p.once.Do(func() {
		var uerr error
		p.mu.Lock()
		if b := p.Storage.Bytes(); len(b) > 0 && p.ranges == nil {
			if err := p.d.lib.hostUnregister(0, unsafe.Pointer(&b[0])); err != nil {
				uerr = fmt.Errorf("cuda: unpin host storage: %w", err)
			}
		} else if len(b) > 0 {
			for off := range p.ranges {
				if err := p.d.lib.hostUnregister(0, unsafe.Pointer(&b[off])); err != nil && uerr == nil {
					uerr = fmt.Errorf("cuda: unpin at %d of host storage: %w", off, err)
				}
			}
		}
		p.ranges = nil
		p.mu.Unlock()
		cerr := p.Storage.Close()
		if uerr != nil {
			p.err = uerr
		} else {
			p.err = cerr
		}
	})
	return p.err
}
