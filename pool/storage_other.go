//go:build !linux

package pool

import (
	"fmt"

	"github.com/kvfabric/kvfabric/layout"
)

// HostStorage is shareable host memory; it needs Linux.
type HostStorage struct{}

// NewHostStorage returns an error wrapping ErrNotSupported off Linux.
func NewHostStorage(cfg HostConfig) (*HostStorage, error) {
	return nil, fmt.Errorf("pool: shareable host memory needs memfd or /dev/shm: %w", ErrNotSupported)
}

// Addr returns 0.
func (h *HostStorage) Addr() uint64 { return 0 }

// Size returns 0.
func (h *HostStorage) Size() uint64 { return 0 }

// Kind returns Host.
func (h *HostStorage) Kind() layout.MemoryKind { return layout.Host }

// Device returns -1.
func (h *HostStorage) Device() int32 { return -1 }

// Bytes returns nil.
func (h *HostStorage) Bytes() []byte { return nil }

// FD returns -1.
func (h *HostStorage) FD() int { return -1 }

// Path returns "".
func (h *HostStorage) Path() string { return "" }

// Locked returns false.
func (h *HostStorage) Locked() bool { return false }

// HugePages returns false.
func (h *HostStorage) HugePages() bool { return false }

// Close does nothing.
func (h *HostStorage) Close() error { return nil }

// Section is a range of a HostStorage with a memory file of its own; it
// needs Linux.
type Section struct{}

// NewSection returns an error wrapping ErrNotSupported off Linux.
func (h *HostStorage) NewSection(off, size uint64, name string) (*Section, error) {
	return nil, fmt.Errorf("pool: host memory sections need memfd: %w", ErrNotSupported)
}

// NewSectionFile returns an error wrapping ErrNotSupported off Linux.
func (h *HostStorage) NewSectionFile(size uint64, name string) (*Section, error) {
	return nil, fmt.Errorf("pool: host memory sections need memfd: %w", ErrNotSupported)
}

// Place returns an error wrapping ErrNotSupported off Linux.
func (s *Section) Place(off uint64) error {
	return fmt.Errorf("pool: host memory sections need memfd: %w", ErrNotSupported)
}

// Offset returns 0.
func (s *Section) Offset() uint64 { return 0 }

// Size returns 0.
func (s *Section) Size() uint64 { return 0 }

// FD returns -1.
func (s *Section) FD() int { return -1 }

// Path returns "".
func (s *Section) Path() string { return "" }

// Rename does nothing here: sections are Linux's.
func (s *Section) Rename(name string) error { return nil }

// Close does nothing.
func (s *Section) Close() error { return nil }
