//go:build cgo && linux

package ofi

import (
	"os"
	"syscall"
	"testing"
	"unsafe"
)

// resident counts b's pages present in memory (mincore).
func resident(t *testing.T, b []byte) int {
	t.Helper()
	page := os.Getpagesize()
	vec := make([]byte, (len(b)+page-1)/page)
	if _, _, errno := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatalf("mincore: %v", errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestRegisterFaultsPagesIn: Register faults in the pages of host memory
// never touched before, private or shared as pools map it, and leaves
// what is written there as it was.
func TestRegisterFaultsPagesIn(t *testing.T) {
	probe := mapped(t, os.Getpagesize())
	if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(unsafe.Pointer(&probe[0])), uintptr(len(probe)), madvPopulateWrite); errno != 0 {
		t.Skipf("this kernel does not populate on advice (MADV_POPULATE_WRITE, Linux 5.14): %v", errno)
	}
	e := openIdle(t, loadLibrary(t, "shm"))
	page := os.Getpagesize()
	for _, tc := range []struct {
		name  string
		flags int
	}{
		{"private", syscall.MAP_ANON | syscall.MAP_PRIVATE},
		{"shared", syscall.MAP_ANON | syscall.MAP_SHARED},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const pages = 1024
			b, err := syscall.Mmap(-1, 0, pages*page, syscall.PROT_READ|syscall.PROT_WRITE, tc.flags)
			if err != nil {
				t.Fatal(err)
			}
			defer syscall.Munmap(b)
			// Small pages only: with transparent huge pages always on, a
			// write would fault in a whole huge page, not the 2 written.
			if err := syscall.Madvise(b, syscall.MADV_NOHUGEPAGE); err != nil {
				t.Fatal(err)
			}
			written := b[5*page : 7*page]
			fill(written, 3)
			if got := resident(t, b); got != 2 {
				t.Fatalf("%d pages resident before Register, want the 2 written", got)
			}
			// An unaligned start and length: every page they touch.
			r, err := e.Register(uintptr(unsafe.Pointer(&b[100])), uint64(len(b)-200))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			if got := resident(t, b); got != pages {
				t.Fatalf("%d of %d pages resident after Register", got, pages)
			}
			want := make([]byte, len(written))
			fill(want, 3)
			for i := range b {
				w := byte(0)
				if i >= 5*page && i < 7*page {
					w = want[i-5*page]
				}
				if b[i] != w {
					t.Fatalf("byte %d is %d after Register, was %d", i, b[i], w)
				}
			}
		})
	}
}
