//go:build linux

package pool

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfabric/kvfabric/layout"
)

// mapAgain maps a memory file a second time, as an engine process would.
func mapAgain(t *testing.T, fd int, size int) []byte {
	t.Helper()
	m, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	return m
}

func TestHostStorageMemfdShared(t *testing.T) {
	h, err := NewHostStorage(HostConfig{Size: 10000, Name: "pool-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	page := uint64(os.Getpagesize())
	if h.Size() != (10000+page-1)/page*page || h.Addr()%page != 0 {
		t.Fatalf("size %d addr %#x: want page rounded and aligned", h.Size(), h.Addr())
	}
	if h.Kind() != layout.Host || h.Locked() {
		t.Errorf("unlocked storage reports kind %v locked %v", h.Kind(), h.Locked())
	}
	// Through the descriptor, and through the path an engine would open.
	viaFD := mapAgain(t, h.FD(), int(h.Size()))
	f, err := os.OpenFile(h.Path(), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open %s: %v", h.Path(), err)
	}
	defer f.Close()
	viaPath := mapAgain(t, int(f.Fd()), int(h.Size()))

	copy(h.Bytes()[100:], "written by the agent")
	copy(viaPath[5000:], "written by the engine")
	for name, m := range map[string][]byte{"fd": viaFD, "path": viaPath, "agent": h.Bytes()} {
		if !bytes.Equal(m[100:120], []byte("written by the agent")) ||
			!bytes.Equal(m[5000:5021], []byte("written by the engine")) {
			t.Errorf("mapping via %s does not see both writes", name)
		}
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	// The engine's mapping outlives the agent's.
	if !bytes.Equal(viaFD[100:120], []byte("written by the agent")) {
		t.Error("second mapping lost its bytes when the storage closed")
	}
}

func TestHostStorageShmFile(t *testing.T) {
	dir := t.TempDir() // /dev/shm may be absent in a container; the mode is what matters
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dir = ""
	}
	old := unix.Umask(0)
	defer unix.Umask(old)
	h, err := NewHostStorage(HostConfig{Size: 8192, Backing: ShmFile, Dir: dir, Name: "pool-test"})
	if err != nil {
		t.Fatal(err)
	}
	path := h.Path()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", path, st.Mode().Perm())
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := mapAgain(t, int(f.Fd()), 8192)
	f.Close()
	h.Bytes()[42] = 0x5a
	if m[42] != 0x5a {
		t.Error("second mapping of the file does not see the write")
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still exists after Close: %v", path, err)
	}
}

// Locking and huge pages are optimisations: asking for them never fails,
// and what is reported matches what happened.
func TestHostStorageOptimisationsFallBack(t *testing.T) {
	h, err := NewHostStorage(HostConfig{Size: 4 << 20, Lock: true, HugePages: true})
	if err != nil {
		t.Fatalf("Lock and HugePages must fall back, not fail: %v", err)
	}
	defer h.Close()
	if h.Locked() != (h.Kind() == layout.Pinned) {
		t.Errorf("Locked %v but kind %v", h.Locked(), h.Kind())
	}
	if h.HugePages() && h.Size()%hugePageSize != 0 {
		t.Errorf("huge pages with size %d not a multiple of %d", h.Size(), hugePageSize)
	}
	t.Logf("locked=%v hugetlb=%v size=%d", h.Locked(), h.HugePages(), h.Size())
	h.Bytes()[h.Size()-1] = 1 // the whole size is addressable
}

func TestHostStorageBadConfig(t *testing.T) {
	for _, cfg := range []HostConfig{{}, {Size: 1, Backing: 9}, {Size: 1 << 60}} {
		if _, err := NewHostStorage(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	if _, err := NewHostStorage(HostConfig{Size: 4096, Backing: ShmFile, Dir: "/nonexistent/dir"}); err == nil {
		t.Error("a memory file in a missing directory: no error")
	}
}

// A block set in shared host memory: what the agent writes at a slot's
// chunk offset, an engine that mapped the file finds at region offset plus
// the same chunk offset.
func TestBlockSetInSharedMemory(t *testing.T) {
	h, err := NewHostStorage(HostConfig{Size: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p, err := New(h, testConfig(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.NewBlockSet(testLayout(3, 1, layout.FullyContiguous, 64)); err != nil {
		t.Fatal(err)
	}
	b, err := p.NewBlockSet(testLayout(8, 2, layout.LayerSeparate, 256))
	if err != nil {
		t.Fatal(err)
	}
	engine := mapAgain(t, h.FD(), int(h.Size()))
	regions, err := b.RegionBytes()
	if err != nil {
		t.Fatal(err)
	}
	l := b.Layout()
	for r := range 2 {
		off, _ := b.RegionOffset(r)
		co := l.ChunkOffset(5, 1, 1)
		regions[r][co] = byte(r + 1)
		if engine[off+co] != byte(r+1) {
			t.Errorf("rank %d: engine sees %d at %d", r, engine[off+co], off+co)
		}
		if off%uint64(os.Getpagesize()) != 0 {
			t.Errorf("rank %d region at %d, not page aligned for an engine's mmap", r, off)
		}
	}
}

// Each step that turns a memory file into memory can fail; every failure is
// an error naming the step, never storage of 0 bytes, and leaves no file.
func TestHostStorageStepFailures(t *testing.T) {
	errInjected := errors.New("injected")
	for _, tc := range []struct {
		name string
		step string
		back Backing
		ops  func(*fileOps)
	}{
		{"shm chmod", "chmod", ShmFile, func(o *fileOps) {
			o.chmod = func(*os.File, os.FileMode) error { return errInjected }
		}},
		{"shm truncate", "ftruncate", ShmFile, func(o *fileOps) {
			o.truncate = func(int, int64) error { return errInjected }
		}},
		{"shm mmap", "mmap", ShmFile, func(o *fileOps) {
			o.mmap = func(int, int) ([]byte, error) { return nil, errInjected }
		}},
		{"memfd truncate", "ftruncate", MemFD, func(o *fileOps) {
			o.truncate = func(int, int64) error { return errInjected }
		}},
		{"memfd mmap", "mmap", MemFD, func(o *fileOps) {
			o.mmap = func(int, int) ([]byte, error) { return nil, errInjected }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ops := sysFileOps
			tc.ops(&ops)
			h, err := newHostStorage(HostConfig{Size: 1 << 20, Backing: tc.back, Dir: dir, Name: "pool-test"}, ops)
			if err == nil {
				t.Fatalf("storage of %d bytes made although %s failed", h.Size(), tc.step)
			}
			if !errors.Is(err, errInjected) || !strings.Contains(err.Error(), tc.step) {
				t.Errorf("err = %v, want the injected error naming %s", err, tc.step)
			}
			left, _ := os.ReadDir(dir)
			if len(left) != 0 {
				t.Errorf("failed storage left %d files in %s", len(left), dir)
			}
		})
	}
}

// A size that passes the config check but cannot be mapped (2^47 bytes is
// the whole user address space on x86-64) is an error, not an empty pool.
func TestHostStorageUnmappableSize(t *testing.T) {
	for _, back := range []Backing{ShmFile, MemFD} {
		dir := t.TempDir()
		h, err := NewHostStorage(HostConfig{Size: 1 << 47, Backing: back, Dir: dir, Name: "pool-test"})
		if err == nil {
			size := h.Size()
			h.Close()
			if size != 1<<47 {
				t.Errorf("backing %d: 2^47 bytes asked, storage of %d bytes made without error", back, size)
			}
			continue
		}
		if left, _ := os.ReadDir(dir); len(left) != 0 {
			t.Errorf("backing %d: failed storage left %d files", back, len(left))
		}
	}
}
