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

	"golang.org/x/sys/unix"
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

// A connection that has just been handed a block set's memory is idle
// from then, as one handed the pool's is: with the socket full, a new
// connection closes the one idle longest, not the one in use that was
// accepted first.
func TestDescriptorSocketSetExchangeKeepsItsConnection(t *testing.T) {
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
	lookup := func(tok string, _ int32) (int, uint64, bool) {
		if tok != "set" {
			return -1, 0, false
		}
		fd, err := unix.Dup(int(f.Fd()))
		return fd, 4096, err == nil
	}
	var pids atomic.Int32
	s := newFDServer(ln, "tok", sharedMemory{fd: int(f.Fd()), size: 4096}, lookup, slog.New(slog.NewTextHandler(io.Discard, nil)),
		func(*net.UnixConn) int32 { return 1000 + pids.Add(1) })
	defer s.close()
	type conn struct {
		c net.Conn
		r *bufio.Reader
	}
	exchange := func(c conn, tok string) error {
		c.c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := fmt.Fprintf(c.c, "%s\n", tok); err != nil {
			return err
		}
		line, err := c.r.ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "ok 0 4096") {
			err = fmt.Errorf("answer %q", line)
		}
		return err
	}
	open := func() conn {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return conn{c, bufio.NewReader(c)}
	}
	// The first accepted, handed a set's memory.
	engine := open()
	if err := exchange(engine, "set"); err != nil {
		t.Fatal(err)
	}
	// The rest of the socket's room, each handed the pool's memory after.
	for range maxFDConns - 1 {
		if err := exchange(open(), "tok"); err != nil {
			t.Fatal(err)
		}
	}
	// The engine's connection is the one used last.
	if err := exchange(engine, "set"); err != nil {
		t.Fatal(err)
	}
	if err := exchange(open(), "tok"); err != nil {
		t.Fatalf("a connection past the socket's room: %v", err)
	}
	if err := exchange(engine, "set"); err != nil {
		t.Fatalf("the connection used last, after one past the socket's room: %v; the one idle longest should have been closed", err)
	}
}
