package layout

import "unsafe"

// Non-temporal stores write whole cache lines to memory without first
// reading them into the cache (no read-for-ownership), as Go's memmove does
// for copies of 1 MiB and more. A plan's pieces are far smaller, so without
// this its copies move a third more memory traffic than one large copy.

//go:noescape
func copyNT64(dst, src unsafe.Pointer, n uintptr)

func sfence()

const haveStream = true

// copyStream copies src to dst (equal lengths) with non-temporal stores
// for the 64-byte blocks of the middle, plain copies for the ends. The
// caller calls sfence before anyone reads dst.
func copyStream(dst, src []byte) {
	n := len(dst)
	head := int((16 - uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%16) % 16)
	if n < head+64 {
		copy(dst, src)
		return
	}
	copy(dst[:head], src[:head])
	body := (n - head) &^ 63
	copyNT64(unsafe.Pointer(&dst[head]), unsafe.Pointer(&src[head]), uintptr(body))
	copy(dst[head+body:], src[head+body:n])
}
