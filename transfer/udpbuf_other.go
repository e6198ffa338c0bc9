//go:build !unix

package transfer

import "net"

// socketBuffers cannot read buffer sizes here; quic-go's own check and
// warning still apply.
func socketBuffers(*net.UDPConn) (rcv, snd int, ok bool) { return 0, 0, false }
