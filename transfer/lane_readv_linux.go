package transfer

import (
	"bufio"
	"io"
	"net"
	"runtime"
	"unsafe"

	"github.com/kvfabric/kvfabric/layout"
	"golang.org/x/sys/unix"
)

// readPiecesVec reads the pieces of segs from a plain lane connection into
// dst without a copy in between: first what the connection's frame buffer
// read ahead (pr.r, when it is one), then straight from the socket, one
// readv per batch of up to maxVecPieces pieces, for as many calls as the
// batch takes to fill. pr's deadline applies and is pushed forward as
// bytes arrive. The caller has checked every piece against dst.
func readPiecesVec(c *net.TCPConn, pr *laneProgress, segs []layout.Segment, dst [][]byte) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	br, _ := pr.r.(*bufio.Reader)
	iov := make([]unix.Iovec, 0, min(maxVecPieces, len(segs))) // an answer of one piece takes one
	fill := func() error {
		v := iov
		iov = iov[:0]
		for br != nil && br.Buffered() > 0 && len(v) > 0 {
			p := unsafe.Slice(v[0].Base, int(v[0].Len))
			n, _ := br.Read(p[:min(len(p), br.Buffered())]) // from the buffer alone: no error
			v = advanceIovec(v, n)
		}
		for len(v) > 0 {
			pr.refresh()
			var n uintptr
			var errno unix.Errno
			err := rc.Read(func(fd uintptr) bool {
				for {
					n, _, errno = unix.Syscall(unix.SYS_READV, fd, uintptr(unsafe.Pointer(&v[0])), uintptr(len(v)))
					if errno != unix.EINTR {
						return errno != unix.EAGAIN
					}
				}
			})
			switch {
			case err != nil:
				return err
			case errno != 0:
				return errno
			case n == 0:
				return io.ErrUnexpectedEOF
			}
			v = advanceIovec(v, int(n))
		}
		return nil
	}
	add := func(p []byte) error {
		if len(p) == 0 {
			return nil
		}
		var v unix.Iovec
		v.Base = &p[0]
		v.SetLen(len(p))
		iov = append(iov, v)
		if len(iov) == maxVecPieces {
			return fill()
		}
		return nil
	}
	for _, sg := range segs {
		d := dst[sg.DstRank]
		if sg.Count == 1 || sg.DstStride == sg.Length {
			if err := add(d[sg.DstOffset : sg.DstOffset+sg.Bytes()]); err != nil {
				return err
			}
			continue
		}
		for i := uint64(0); i < sg.Count; i++ {
			off := sg.DstOffset + i*sg.DstStride
			if err := add(d[off : off+sg.Length]); err != nil {
				return err
			}
		}
	}
	err = fill()
	runtime.KeepAlive(dst)
	return err
}

// advanceIovec drops the first n bytes of v.
func advanceIovec(v []unix.Iovec, n int) []unix.Iovec {
	for n > 0 {
		l := int(v[0].Len)
		if n >= l {
			n -= l
			v = v[1:]
			continue
		}
		v[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(v[0].Base), n))
		v[0].SetLen(l - n)
		n = 0
	}
	return v
}
