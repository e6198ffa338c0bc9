package pool

import (
	"log/slog"

	"github.com/kvfabric/kvfabric/layout"
)

// Storage is one piece of memory a pool carves block sets from. The host
// backend is HostStorage; device memory arrives with pool/cuda, which
// implements the same interface. Methods may be called concurrently; Bytes
// and Addr stay valid until Close.
type Storage interface {
	// Addr is the base address in this process (a device pointer for
	// device memory). It is page aligned.
	Addr() uint64
	// Size is the bytes of the storage.
	Size() uint64
	// Kind is the memory tier.
	Kind() layout.MemoryKind
	// Device is the GPU index for device memory, or the NUMA node (-1 for
	// any) for host memory.
	Device() int32
	// Bytes returns the memory as a slice when this process can address it
	// (host memory), or nil. The slice must not be used after Close.
	Bytes() []byte
	// Close releases the memory. It is safe to call twice.
	Close() error
}

// Backing is how host memory is made shareable with engine processes.
type Backing uint8

const (
	// MemFD backs host memory with an anonymous memory file (memfd_create);
	// engines receive the descriptor (HostStorage.FD) from the agent's
	// descriptor socket, or open /proc/<agent pid>/fd/<fd> inside the
	// agent's PID namespace. Nothing is left behind if the agent dies.
	MemFD Backing = iota
	// ShmFile backs host memory with a file under Dir (mode 0600, which the
	// owner may widen), removed on Close; engines open it by path or
	// receive its descriptor as for MemFD.
	ShmFile
)

// HostConfig configures NewHostStorage. The zero value with a Size makes an
// unlocked memfd of normal pages.
type HostConfig struct {
	// Size is the bytes wanted; it is rounded up to the page size (the huge
	// page size when huge pages are used). Required.
	Size uint64
	// Name names the memory file, for /proc/<pid>/fd and /dev/shm listings.
	// If empty, "kvfabric-pool".
	Name string
	// Backing chooses memfd or a file. If zero, MemFD.
	Backing Backing
	// Dir is where ShmFile creates the file. If empty, /dev/shm.
	Dir string
	// Lock page-locks the memory (mlock), which makes it Pinned. If the
	// system refuses (RLIMIT_MEMLOCK), the memory stays Host and the reason
	// is logged.
	Lock bool
	// HugePages asks for huge pages: hugetlb pages for MemFD where the
	// system has them reserved, else transparent huge pages advised with
	// madvise. Unavailability is logged, never an error.
	HugePages bool
	// NUMANode is reported as the storage's Device. If zero, 0; use -1 for
	// "any". The memory is not bound to it by this package.
	NUMANode int32
	// Logger receives the fallbacks. If nil, slog.Default().
	Logger *slog.Logger
}
