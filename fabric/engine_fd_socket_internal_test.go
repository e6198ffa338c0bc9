package fabric

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// 70 idle connections from 70 processes (more than maxFDConns) do not lock
// an engine out of the descriptor socket: each new one closes the one idle
// longest, the server never holds more than maxFDConns, and an engine
// connecting after them all gets the memory.
func TestDescriptorSocketIdleFloodFromManyProcesses(t *testing.T) {
	dir, err := os.MkdirTemp("", "kvffd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "engine.sock.fd")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.CreateTemp(dir, "mem")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var pids atomic.Int32
	s := newFDServer(ln, "tok", sharedMemory{fd: int(f.Fd()), size: 4096}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(*net.UnixConn) int32 { return 1000 + pids.Add(1) })
	defer s.close()
	const idle = maxFDConns + 6
	for i := range idle {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Wait until it is served (or refused), so that the order of
		// acceptance is the order of dialing.
		for deadline := time.Now().Add(10 * time.Second); ; {
			s.mu.Lock()
			n := len(s.conns)
			s.mu.Unlock()
			if n == min(i+1, maxFDConns) || time.Now().After(deadline) {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	s.mu.Lock()
	n := len(s.conns)
	s.mu.Unlock()
	if n != maxFDConns {
		t.Fatalf("%d connections served after %d idle ones, want %d", n, idle, maxFDConns)
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "tok\n")
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "ok 0 4096") {
		t.Fatalf("an engine after %d idle connections: %q %v", idle, line, err)
	}
}
