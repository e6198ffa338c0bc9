package fabric

import (
	"net"
	"syscall"
)

// peerCredOf reads SO_PEERCRED of a unix socket connection.
func peerCredOf(c net.Conn) peerCred {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return peerCred{}
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return peerCred{}
	}
	var cred *syscall.Ucred
	raw.Control(func(fd uintptr) {
		cred, err = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return peerCred{}
	}
	return peerCred{pid: cred.Pid, uid: cred.Uid}
}
