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
// The token is Memory.token of a RegisterResponse. The agent records the
// process at the other end (SO_PEERCRED) as one the set was handed to. A connection idle for
// fdIdleTimeout is closed; at most maxFDConns are served at once, further
// ones are answered "error busy" and closed.
const (
	// FDSocketSuffix is appended to the engine socket's path to name the
	// descriptor socket.
	FDSocketSuffix = ".fd"
	maxFDLine      = 256
	maxFDConns     = 64
	fdIdleTimeout  = 10 * time.Second
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
	conns  map[*net.UnixConn]struct{}
	closed bool
	wg     sync.WaitGroup
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
	s := &fdServer{ln: ln, log: log, token: token, mem: mem, lookup: lookup, conns: map[*net.UnixConn]struct{}{}}
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
		s.mu.Lock()
		if s.closed || len(s.conns) >= maxFDConns {
			s.mu.Unlock()
			c.SetWriteDeadline(time.Now().Add(time.Second))
			c.Write([]byte("error busy: too many connections\n"))
			c.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c)
	}
}

func (s *fdServer) serve(c *net.UnixConn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	pid := peerCredOf(c).pid
	// A fixed buffer: a line longer than it is refused, never grown.
	r := bufio.NewReaderSize(c, maxFDLine)
	for {
		c.SetDeadline(time.Now().Add(fdIdleTimeout))
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
			if _, err := c.Write([]byte(fmt.Sprintf("error unknown memory token %q (register again: tokens change when the agent restarts)\n", clip(tok, 64)))); err != nil {
				return
			}
			continue
		}
		msg := fmt.Appendf(nil, "ok 0 %d\n", s.mem.size)
		if _, _, err := c.WriteMsgUnix(msg, unix.UnixRights(s.mem.fd), nil); err != nil {
			return
		}
	}
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
