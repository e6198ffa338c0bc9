package kvtest

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CrossMemoryAttach says whether this process may read memory of a process
// by process_vm_readv (a seccomp policy or a kernel without it refuses), as
// libfabric's shm provider needs for a reader to copy a holder's bytes
// itself; tests of that path skip with its error.
func CrossMemoryAttach() error {
	src, dst := []byte{1}, []byte{0}
	_, err := unix.ProcessVMReadv(os.Getpid(),
		[]unix.Iovec{{Base: &dst[0], Len: 1}},
		[]unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&src[0])), Len: 1}}, 0)
	return err
}
