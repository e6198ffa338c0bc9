//go:build !cgo || !linux

package rdma

import (
	"context"
	"fmt"
	"time"
)

// errBuild says why this build has no RDMA.
var errBuild = fmt.Errorf("rdma: RDMA is off: this kvfabric was built without cgo or not for Linux: %w", ErrNotSupported)

// Library is an opened libibverbs; this build cannot open one.
type Library struct{}

// Open returns an error wrapping ErrNotSupported in this build.
func Open(cfg Config) (*Library, error) { return nil, errBuild }

// Path is the library that was opened.
func (l *Library) Path() string { return "" }

// Close does nothing in this build.
func (l *Library) Close() error { return nil }

// Devices returns an error wrapping ErrNotSupported in this build.
func (l *Library) Devices() ([]DeviceInfo, error) { return nil, errBuild }

// OpenDevice returns an error wrapping ErrNotSupported in this build.
func (l *Library) OpenDevice(name string, port int) (*Device, error) { return nil, errBuild }

// Device is one opened port of an RDMA device.
type Device struct{}

// Info describes the device.
func (d *Device) Info() DeviceInfo { return DeviceInfo{} }

// Port describes the opened port.
func (d *Device) Port() PortInfo { return PortInfo{} }

// GID is the GID queue pairs send from.
func (d *Device) GID() GID { return GID{} }

// Close does nothing in this build.
func (d *Device) Close() error { return nil }

// RegisterMemory returns an error wrapping ErrNotSupported in this build.
func (d *Device) RegisterMemory(buf []byte) (*MemoryRegion, error) { return nil, errBuild }

// RegisterAddr returns an error wrapping ErrNotSupported in this build.
func (d *Device) RegisterAddr(addr, length uint64) (*MemoryRegion, error) { return nil, errBuild }

// RegisterDmabuf returns an error wrapping ErrNotSupported in this build.
func (d *Device) RegisterDmabuf(fd int, offset, length, iova uint64) (*MemoryRegion, error) {
	return nil, errBuild
}

// NewQueuePair returns an error wrapping ErrNotSupported in this build.
func (d *Device) NewQueuePair(o QPOptions) (*QueuePair, error) { return nil, errBuild }

// MemoryRegion is registered memory.
type MemoryRegion struct{}

// Addr is the address peers read from.
func (m *MemoryRegion) Addr() uint64 { return 0 }

// Len is the registered length.
func (m *MemoryRegion) Len() uint64 { return 0 }

// LKey is the local key.
func (m *MemoryRegion) LKey() uint32 { return 0 }

// RKey is the remote key.
func (m *MemoryRegion) RKey() uint32 { return 0 }

// Stats says what the registration cost.
func (m *MemoryRegion) Stats() RegistrationStats { return RegistrationStats{} }

// Close does nothing in this build.
func (m *MemoryRegion) Close() error { return nil }

// QueuePair is an RC queue pair.
type QueuePair struct{}

// Options are the queue pair's options.
func (q *QueuePair) Options() QPOptions { return QPOptions{} }

// Endpoint is what the peer needs to connect.
func (q *QueuePair) Endpoint() Endpoint { return Endpoint{} }

// Connect returns an error wrapping ErrNotSupported in this build.
func (q *QueuePair) Connect(remote Endpoint) error { return errBuild }

// Reset returns an error wrapping ErrNotSupported in this build.
func (q *QueuePair) Reset() error { return errBuild }

// State returns an error wrapping ErrNotSupported in this build.
func (q *QueuePair) State() (string, error) { return "", errBuild }

// Read returns an error wrapping ErrNotSupported in this build.
func (q *QueuePair) Read(ctx context.Context, ops []ReadOp) error { return errBuild }

// ReadCPU is 0 in this build.
func (q *QueuePair) ReadCPU() time.Duration { return 0 }

// Close does nothing in this build.
func (q *QueuePair) Close() error { return nil }
