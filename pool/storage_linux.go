//go:build linux

package pool

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/layout"
)

// hugePageSize is the hugetlb page size assumed for MFD_HUGETLB, the x86-64
// and arm64 default. A system whose default differs refuses the size and
// the storage falls back to normal pages.
const hugePageSize = 2 << 20

// HostStorage is host memory in a memory file, mapped shared, that engine
// processes on the node can map too. The agent keeps the file open for as
// long as the storage lives.
type HostStorage struct {
	file   *os.File
	path   string // ShmFile only: removed on Close
	mem    []byte
	kind   layout.MemoryKind
	device int32
	huge   bool
	ops    fileOps

	closeOnce sync.Once
	closeErr  error
}

var _ Storage = (*HostStorage)(nil)

// fileOps are the system calls that turn a memory file into mapped memory.
// Tests replace them to make each step fail in turn.
type fileOps struct {
	chmod    func(f *os.File, mode os.FileMode) error
	truncate func(fd int, size int64) error
	mmap     func(fd int, size int) ([]byte, error)
}

var sysFileOps = fileOps{
	chmod:    (*os.File).Chmod,
	truncate: unix.Ftruncate,
	mmap: func(fd int, size int) ([]byte, error) {
		return unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	},
}

// NewHostStorage makes shareable host memory. Only a failure to get the
// memory at all is an error; locking and huge pages fall back with a log.
func NewHostStorage(cfg HostConfig) (*HostStorage, error) {
	return newHostStorage(cfg, sysFileOps)
}

func newHostStorage(cfg HostConfig, ops fileOps) (*HostStorage, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Size == 0 {
		return nil, fmt.Errorf("%w: HostConfig.Size: zero", ErrInvalidConfig)
	}
	page := uint64(os.Getpagesize())
	size := (cfg.Size + page - 1) &^ (page - 1)
	if size < cfg.Size || size > 1<<48 {
		return nil, fmt.Errorf("%w: HostConfig.Size: %d bytes is beyond what can be mapped", ErrInvalidConfig, cfg.Size)
	}
	name := cfg.Name
	if name == "" {
		name = "kvfabric-pool"
	}
	h := &HostStorage{kind: layout.Host, device: cfg.NUMANode, ops: ops}
	var err error
	switch cfg.Backing {
	case MemFD:
		err = h.makeMemfd(name, size, cfg.HugePages, log)
	case ShmFile:
		dir := cfg.Dir
		if dir == "" {
			dir = "/dev/shm"
		}
		err = h.makeShm(dir, name, size)
	default:
		return nil, fmt.Errorf("%w: HostConfig.Backing: unknown value %d", ErrInvalidConfig, cfg.Backing)
	}
	if err != nil {
		return nil, err
	}
	if cfg.HugePages && !h.huge {
		// Transparent huge pages for shmem are governed by
		// /sys/kernel/mm/transparent_hugepage/shmem_enabled; advice is all
		// we can give.
		if err := unix.Madvise(h.mem, unix.MADV_HUGEPAGE); err != nil {
			log.Info("pool: transparent huge pages unavailable, using normal pages", "err", err)
		}
	}
	if cfg.Lock {
		if err := unix.Mlock(h.mem); err != nil {
			log.Warn("pool: cannot lock host memory, it stays pageable (raise RLIMIT_MEMLOCK to pin it)",
				"bytes", len(h.mem), "err", err)
		} else {
			h.kind = layout.Pinned
		}
	}
	return h, nil
}

func (h *HostStorage) makeMemfd(name string, size uint64, huge bool, log *slog.Logger) error {
	if huge {
		hsize := (size + hugePageSize - 1) &^ (hugePageSize - 1)
		err := h.mapMemfd(name, hsize, unix.MFD_HUGETLB)
		if err == nil {
			h.huge = true
			return nil
		}
		log.Info("pool: hugetlb pages unavailable, falling back to normal pages", "bytes", hsize, "err", err)
	}
	return h.mapMemfd(name, size, 0)
}

func (h *HostStorage) mapMemfd(name string, size uint64, flags int) error {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|flags)
	if err != nil {
		return fmt.Errorf("pool: memfd_create %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := h.mapFile(f, size); err != nil {
		f.Close()
		return err
	}
	h.file = f
	return nil
}

func (h *HostStorage) makeShm(dir, name string, size uint64) error {
	// CreateTemp opens with O_EXCL and mode 0600: nobody else's file is
	// reused, and only our user can map it.
	f, err := os.CreateTemp(dir, name+"-*")
	if err != nil {
		return fmt.Errorf("pool: create memory file in %s: %w", dir, err)
	}
	// The umask can only take bits away; make the mode exact anyway.
	if err = h.ops.chmod(f, 0o600); err != nil {
		err = fmt.Errorf("chmod: %w", err)
	} else {
		err = h.mapFile(f, size)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("pool: memory file %s: %w", f.Name(), err)
	}
	h.file = f
	h.path = filepath.Clean(f.Name())
	return nil
}

func (h *HostStorage) mapFile(f *os.File, size uint64) error {
	if err := h.ops.truncate(int(f.Fd()), int64(size)); err != nil {
		return fmt.Errorf("ftruncate %d bytes: %w", size, err)
	}
	mem, err := h.ops.mmap(int(f.Fd()), int(size))
	if err != nil {
		return fmt.Errorf("mmap %d bytes: %w", size, err)
	}
	h.mem = mem
	return nil
}

// Addr returns the base address of the mapping in this process.
func (h *HostStorage) Addr() uint64 {
	if len(h.mem) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&h.mem[0])))
}

// Size returns the bytes mapped, the requested size rounded up to pages.
func (h *HostStorage) Size() uint64 { return uint64(len(h.mem)) }

// Kind returns Pinned when the memory is locked, else Host.
func (h *HostStorage) Kind() layout.MemoryKind { return h.kind }

// Device returns the NUMA node from the config.
func (h *HostStorage) Device() int32 { return h.device }

// Bytes returns the mapping.
func (h *HostStorage) Bytes() []byte { return h.mem }

// FD returns the descriptor of the memory file, to pass to an engine over a
// unix socket (SCM_RIGHTS), or -1 after Close.
func (h *HostStorage) FD() int {
	if h.file == nil {
		return -1
	}
	return int(h.file.Fd())
}

// Path returns what an engine opens to map the memory: the file under Dir
// for ShmFile, or /proc/<pid>/fd/<fd> for MemFD (openable by processes of
// the same user).
func (h *HostStorage) Path() string {
	if h.path != "" {
		return h.path
	}
	if h.file == nil {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), h.file.Fd())
}

// Locked reports whether the memory is page-locked.
func (h *HostStorage) Locked() bool { return h.kind == layout.Pinned }

// HugePages reports whether the memory is on hugetlb pages.
func (h *HostStorage) HugePages() bool { return h.huge }

// Close unmaps the memory, closes the file and removes it if it has a path.
// Engines that mapped it keep their mappings.
func (h *HostStorage) Close() error {
	h.closeOnce.Do(func() {
		var errs []error
		if h.mem != nil {
			if err := unix.Munmap(h.mem); err != nil {
				errs = append(errs, fmt.Errorf("munmap: %w", err))
			}
			h.mem = nil
		}
		if h.file != nil {
			if err := h.file.Close(); err != nil {
				errs = append(errs, err)
			}
		}
		if h.path != "" {
			if err := os.Remove(h.path); err != nil && !os.IsNotExist(err) {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			h.closeErr = fmt.Errorf("pool: close host storage: %v", errs)
		}
	})
	return h.closeErr
}
