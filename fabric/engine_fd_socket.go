package fabric

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// The descriptor socket: a companion of the engine socket (its path plus
// FDSocketSuffix) that hands the memory file of one rank of a block set
// (or, where sets are not isolated, the pool's) to engines as a file
// descriptor (SCM_RIGHTS), so that an engine in another PID or mount
// namespace can map it. One exchange, repeatable on a connection:
//
//	engine: <token>\n                 at most maxFDLine bytes with the newline
//	agent:  ok <offset> <size>\n      + the descriptor as SCM_RIGHTS
//	agent:  error <reason>\n          no descriptor; the connection stays open
//
// The token is Memory.token of a RegisterResponse; a wrong one is answered
// and the connection closed. The agent records the process at the other end
// (SO_PEERCRED) as one the set was handed to. A connection that sends no
// line within fdFirstLineTimeout, or none for fdIdleTimeout after an
// exchange, is closed. One process has at most maxFDConnsPerProcess open,
// further ones are answered "error busy" and closed; at most maxFDConns are
// served at once, and a new one past that closes the one idle longest, so
// that idle connections cannot lock engines out.
const (
	// FDSocketSuffix is appended to the engine socket's path to name the
	// descriptor socket.
	FDSocketSuffix       = ".fd"
	maxFDLine            = 256
	maxFDConns           = 64
	maxFDConnsPerProcess = 8
	fdIdleTimeout        = 10 * time.Second
	fdFirstLineTimeout   = 2 * time.Second
)

// sharedMemory is what the descriptor socket hands out: a memory file's
// descriptor, valid while the agent runs, and its size.
type sharedMemory struct {
	fd   int
	size uint64
}

// fdServer serves the descriptor socket.
type fdServer struct {
	ln    *net.UnixListener
	log   *slog.Logger
	token string // the whole pool's, "" for none
	mem   sharedMemory
	// lookup answers a block set's token with a descriptor the server
	// closes after sending, recording pid as its receiver.
	lookup func(token string, pid int32) (fd int, size uint64, ok bool)

	mu     sync.Mutex
	conns  map[*net.UnixConn]*fdConn
	closed bool
	wg     sync.WaitGroup
	// pidOf names a connection's process (peerCredOf's pid).
	pidOf func(*net.UnixConn) int32
}

// fdConn is one served connection: its process and when it was last
// answered a token (or accepted).
type fdConn struct {
	pid  int32
	idle time.Time
}

// newMemoryToken returns a token unguessable across agent runs, so that an
// engine holding one from a previous run is told so instead of being
// handed memory it did not register for.
func newMemoryToken() string {
	var b [16]byte
	rand.Read(b[:])
	return "mem-" + hex.EncodeToString(b[:])
}

// startFDServer serves mem under token (none if empty) and what lookup
// finds on ln until close.
func startFDServer(ln *net.UnixListener, token string, mem sharedMemory, lookup func(string, int32) (int, uint64, bool), log *slog.Logger) *fdServer {
	return newFDServer(ln, token, mem, lookup, log, func(c *net.UnixConn) int32 { return peerCredOf(c).pid })
}

// newFDServer is startFDServer with the function that names a
// connection's process.
func newFDServer(ln *net.UnixListener, token string, mem sharedMemory, lookup func(string, int32) (int, uint64, bool), log *slog.Logger, pidOf func(*net.UnixConn) int32) *fdServer {
	s := &fdServer{ln: ln, log: log, token: token, mem: mem, lookup: lookup, conns: map[*net.UnixConn]*fdConn{}, pidOf: pidOf}
	s.wg.Add(1)
	go s.acceptLoop()
	return s
}

func (s *fdServer) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("fabric: descriptor socket stopped", "err", err)
			}
			return
		}
		pid := s.pidOf(c)
		s.mu.Lock()
		if reason := s.admitLocked(pid); reason != "" {
			s.mu.Unlock()
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write([]byte("error busy: " + reason + "\n"))
			c.Close()
			continue
		}
		s.conns[c] = &fdConn{pid: pid, idle: time.Now()}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

// admitLocked makes room for a connection of process pid, closing the
// connection idle longest when all maxFDConns are taken, or says why it
// is refused. s.mu is held.
func (s *fdServer) admitLocked(pid int32) string {
	if s.closed {
		return "closing"
	}
	n := 0
	var oldest *net.UnixConn
	for c, fc := range s.conns {
		if pid != 0 && fc.pid == pid {
			n++
		}
		if oldest == nil || fc.idle.Before(s.conns[oldest].idle) {
			oldest = c
		}
	}
	if n >= maxFDConnsPerProcess {
		return fmt.Sprintf("process %d has %d connections open (at most %d)", pid, n, maxFDConnsPerProcess)
	}
	if len(s.conns) >= maxFDConns && oldest != nil {
		s.log.Warn("fabric: descriptor socket full; closing the connection idle longest", "pid", s.conns[oldest].pid,
			"idle", time.Since(s.conns[oldest].idle).Round(time.Millisecond), "limit", maxFDConns)
		oldest.Close() // its goroutine removes it
		delete(s.conns, oldest)
	}
	return ""
}

func (s *fdServer) serve(c *net.UnixConn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	pid := s.pidOf(c)
	// A fixed buffer: a line longer than it is refused, never grown.
	r := bufio.NewReaderSize(c, maxFDLine)
	for wait := fdFirstLineTimeout; ; wait = fdIdleTimeout {
		c.SetDeadline(time.Now().Add(wait))
		line, err := r.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			c.Write([]byte(fmt.Sprintf("error line longer than %d bytes\n", maxFDLine)))
			return
		}
		if err != nil {
			return // closed, idle or cut: nothing to answer
		}
		tok := string(bytes.TrimRight(line, "\r\n"))
		if s.lookup != nil {
			if fd, size, ok := s.lookup(tok, pid); ok {
				s.exchanged(c)
				_, _, err := c.WriteMsgUnix(fmt.Appendf(nil, "ok 0 %d\n", size), unix.UnixRights(fd), nil)
				unix.Close(fd)
				if err != nil {
					return
				}
				continue
			}
		}
		// In constant time: the token is the only secret between a caller
		// who can reach the socket and the pool's memory.
		if s.token == "" || subtle.ConstantTimeCompare([]byte(tok), []byte(s.token)) != 1 {
			// Answered, then closed: guessing costs a connection each.
			c.Write([]byte(fmt.Sprintf("error unknown memory token %q (register again: tokens change when the agent restarts)\n", clip(tok, 64))))
			return
		}
		msg := fmt.Appendf(nil, "ok 0 %d\n", s.mem.size)
		s.exchanged(c)
		if _, _, err := c.WriteMsgUnix(msg, unix.UnixRights(s.mem.fd), nil); err != nil {
			return
		}
	}
}

// exchanged records that c is being answered: it is idle from now,
// whichever memory it is handed (a block set's or the pool's), and the
// last to be closed for room. Recorded before the answer is written, so
// that an engine that has read its answer is known to have used c.
func (s *fdServer) exchanged(c *net.UnixConn) {
	s.mu.Lock()
	if fc := s.conns[c]; fc != nil {
		fc.idle = time.Now()
	}
	s.mu.Unlock()
}

// clip shortens s for an error message.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// close stops accepting, cuts the open connections and waits for their
// goroutines.
func (s *fdServer) close() {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
	s.wg.Wait()
}
