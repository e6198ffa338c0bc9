package cuda

import (
	"runtime"
	"unsafe"
)

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

func keepAlive(b []byte) { runtime.KeepAlive(b) }
