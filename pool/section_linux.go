//go:build linux

package pool

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/layout"
)

// Section is a range of a HostStorage backed by a memory file of its own,
// so that the range alone can be handed to an engine: whoever maps the
// section's file reaches these bytes and nothing else of the storage.
//
// NewSection puts fresh pages under the range (zeroed by the kernel, never
// mapped by anyone before), at the same addresses in this process, so the
// pool and its readers go on using the range as before. The pages the range
// had are dropped from this process; a process that still maps them keeps
// them, and they go back to the system when the last such mapping goes, so
// memory once handed out is never handed to anyone else.
//
// NewSectionFile and Place are NewSection in two steps: the memory file
// first, sized, with the range untouched (what can fail before a caller
// gives up what the range holds: a descriptor, a file, its size), and its
// pages put under the range later (a mapping, and its lock for pinned
// storage).
type Section struct {
	h    *HostStorage
	file *os.File
	path string // under HostConfig.Dir for ShmFile: removed on Close
	off  uint64
	size uint64

	mu     sync.Mutex
	closed bool
	placed bool
}

// NewSection backs [off, off+size) of the storage with a new memory file
// named after name (a memfd, or for ShmFile storage a mode 0600 file
// under its directory with a random suffix), and returns it. off and size
// must be page aligned and inside the storage. What the range held is
// gone from this process. The storage must not be read or written in the
// range while NewSection runs. It keeps the storage's page lock.
func (h *HostStorage) NewSection(off, size uint64, name string) (*Section, error) {
	if err := h.sectionRange(off, size); err != nil {
		return nil, err
	}
	s, err := h.NewSectionFile(size, name)
	if err != nil {
		return nil, err
	}
	if err := s.Place(off); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// sectionRange checks [off, off+size) for a section: page aligned, not
// empty, inside the open storage.
func (h *HostStorage) sectionRange(off, size uint64) error {
	page := uint64(os.Getpagesize())
	if h.mem == nil {
		return fmt.Errorf("%w: host storage closed", ErrClosed)
	}
	if h.huge {
		return fmt.Errorf("pool: section of hugetlb storage: %w", ErrNotSupported)
	}
	if size == 0 || off%page != 0 || size%page != 0 || off > uint64(len(h.mem)) || size > uint64(len(h.mem))-off {
		return fmt.Errorf("%w: section [%d, +%d) of %d bytes: want page-aligned, non-empty, inside", ErrInvalidArgument, off, size, len(h.mem))
	}
	return nil
}

// NewSectionFile makes the memory file of a section of size bytes (named
// as NewSection names it), sized, and returns it not yet placed: the
// storage is untouched until Place. size must be page aligned and fit in
// the storage. Close closes a section never placed as any other.
func (h *HostStorage) NewSectionFile(size uint64, name string) (*Section, error) {
	if err := h.sectionRange(0, size); err != nil {
		return nil, err
	}
	s := &Section{h: h, size: size}
	if h.path != "" {
		f, err := os.CreateTemp(filepath.Dir(h.path), name+"-*")
		if err != nil {
			return nil, fmt.Errorf("pool: section file: %w", err)
		}
		if err := f.Chmod(0o600); err != nil {
			f.Close()
			os.Remove(f.Name())
			return nil, fmt.Errorf("pool: section file %s: %w", f.Name(), err)
		}
		s.file, s.path = f, filepath.Clean(f.Name())
	} else {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("pool: memfd_create %s: %w", name, err)
		}
		s.file = os.NewFile(uintptr(fd), name)
	}
	if err := unix.Ftruncate(int(s.file.Fd()), int64(size)); err != nil {
		s.Close()
		return nil, fmt.Errorf("pool: section %s: ftruncate %d bytes: %w", name, size, err)
	}
	return s, nil
}

// Place puts the section's pages under [off, off+Size()) of its storage,
// as NewSection does: off must be page aligned and the range inside the
// storage. A section is placed once; one closed, or placed already, is
// refused. Where the mapping fails the section stays unplaced (the range
// may have lost its pages: the storage must not be read there until a
// section is placed in it); where the page lock fails after it, placed.
func (s *Section) Place(off uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%w: section closed", ErrClosed)
	}
	if s.placed {
		return fmt.Errorf("%w: section placed at %d already", ErrInvalidArgument, s.off)
	}
	h := s.h
	if err := h.sectionRange(off, s.size); err != nil {
		return err
	}
	name := s.file.Name()
	// MAP_FIXED replaces the old mapping of the range in one step: no
	// other mapping can take the addresses in between.
	at := unsafe.Pointer(&h.mem[off])
	got, err := unix.MmapPtr(int(s.file.Fd()), 0, at, uintptr(s.size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return fmt.Errorf("pool: section %s: mmap %d bytes at %p: %w", name, s.size, at, err)
	}
	if got != at {
		return fmt.Errorf("pool: section %s: mmap at %p landed at %p", name, at, got)
	}
	s.off, s.placed = off, true
	if h.kind == layout.Pinned {
		if err := unix.Mlock(h.mem[off : off+s.size]); err != nil {
			return fmt.Errorf("pool: section %s: mlock: %w", name, err)
		}
	}
	return nil
}

// Offset is where the section starts in its storage (0 until placed).
func (s *Section) Offset() uint64 { return s.off }

// Size is the bytes of the section, the size of its file.
func (s *Section) Size() uint64 { return s.size }

// FD returns the descriptor of the section's file, to pass to an engine
// over a unix socket, or -1 after Close.
func (s *Section) FD() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file == nil || s.closed {
		return -1
	}
	return int(s.file.Fd())
}

// Path is what an engine opens to map the section: the file under the
// storage's directory for ShmFile, else /proc/<pid>/fd/<fd>.
func (s *Section) Path() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.path != "" {
		return s.path
	}
	if s.file == nil || s.closed {
		return ""
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), s.file.Fd())
}

// Rename gives a section's file under the storage's directory a new name
// (name, then a random suffix), so that whoever learned the old one can no
// longer open it; mappings and descriptors already open stay. A memfd
// section has no name to learn: nothing is done.
func (s *Section) Rename(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%w: section closed", ErrClosed)
	}
	if s.path == "" {
		return nil
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return fmt.Errorf("pool: section %s: %w", s.path, err)
	}
	to := filepath.Join(filepath.Dir(s.path), fmt.Sprintf("%s-%x", name, b))
	// link, then remove: no file of that name is replaced.
	if err := os.Link(s.path, to); err != nil {
		return fmt.Errorf("pool: section %s: %w", s.path, err)
	}
	if err := os.Remove(s.path); err != nil {
		os.Remove(to)
		return fmt.Errorf("pool: section %s: %w", s.path, err)
	}
	s.path = to
	return nil
}

// Close closes the section's file and removes its name: no one can map it
// any more. The storage keeps its bytes at the same addresses until the
// range is given to another section or the storage is closed; mappings
// others hold stay theirs. Safe to call twice.
func (s *Section) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var err error
	if s.file != nil {
		err = s.file.Close()
	}
	if s.path != "" {
		if rerr := os.Remove(s.path); rerr != nil && !os.IsNotExist(rerr) && err == nil {
			err = rerr
		}
	}
	return err
}
