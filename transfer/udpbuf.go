package transfer

import (
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
)

// wantUDPBuffer is what quic-go asks the kernel for (7 MiB on Linux);
// below it, bursts of packets are dropped at high rates.
const wantUDPBuffer = 7 << 20

var udpWarnOnce sync.Once

// tuneUDPBuffers raises the socket's buffers and warns once, with the
// command that fixes it, when the kernel caps them lower. quic-go prints a
// similar line through the log package when it wraps the socket; this one
// goes to the node's slog logger with the fix spelled out. A binary that
// wants only ours sets QUIC_GO_DISABLE_RECEIVE_BUFFER_WARNING=true (a
// process-wide switch, so a library does not set it).
func tuneUDPBuffers(c *net.UDPConn, log *slog.Logger) {
	_ = c.SetReadBuffer(wantUDPBuffer)
	_ = c.SetWriteBuffer(wantUDPBuffer)
	rcv, snd, ok := socketBuffers(c)
	if !ok {
		return // cannot tell; quic-go's own check still runs
	}
	fix, ok := udpBufferFix(rcv, snd)
	if ok {
		return
	}
	udpWarnOnce.Do(func() {
		log.Warn("transfer: kernel UDP buffers are too small for fast QUIC transfers",
			"receive_bytes", rcv, "send_bytes", snd, "want_bytes", wantUDPBuffer, "fix", fix)
	})
}

// udpBufferFix says whether buffers of rcv and snd bytes (as getsockopt
// reports them) are enough, and if not, the command that raises the
// kernel's caps.
func udpBufferFix(rcv, snd int) (string, bool) {
	if rcv >= wantUDPBuffer && snd >= wantUDPBuffer {
		return "", true
	}
	if runtime.GOOS != "linux" {
		return fmt.Sprintf("raise the kernel's socket buffer limit to at least %d bytes (kern.ipc.maxsockbuf on BSD and macOS)", wantUDPBuffer), false
	}
	return fmt.Sprintf("sysctl -w net.core.rmem_max=%d net.core.wmem_max=%d", wantUDPBuffer, wantUDPBuffer), false
}
