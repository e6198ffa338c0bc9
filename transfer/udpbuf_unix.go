//go:build unix

package transfer

import (
	"net"

	"golang.org/x/sys/unix"
)

// socketBuffers reads the socket's receive and send buffer sizes as the
// kernel reports them (on Linux, twice what was granted).
func socketBuffers(c *net.UDPConn) (rcv, snd int, ok bool) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var rerr, serr error
	if err := rc.Control(func(fd uintptr) {
		rcv, rerr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		snd, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	}); err != nil || rerr != nil || serr != nil {
		return 0, 0, false
	}
	return rcv, snd, true
}
