package client

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// FDSocketSuffix names the agent's descriptor socket beside its engine
// socket (fabric.FDSocketSuffix; engine.proto's Memory documents the
// exchange).
const FDSocketSuffix = ".fd"

// maxMemory bounds a mapping the agent asks for: what a 64-bit address
// space can hold with room to spare.
const maxMemory = 1 << 48

// ReceiveDescriptor asks the descriptor socket for the memory named by
// token and returns the descriptor, with the range of its file that may be
// mapped. The caller owns the descriptor.
func ReceiveDescriptor(fdSocket, token string) (f *os.File, offset, size uint64, err error) {
	if strings.ContainsAny(token, "\r\n") || len(token) == 0 || len(token) > 250 {
		return nil, 0, 0, fmt.Errorf("client: memory token %q: want 1..250 bytes without newlines", token)
	}
	conn, err := net.DialTimeout("unix", fdSocket, 5*time.Second)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("client: descriptor socket: %w", err)
	}
	defer conn.Close()
	uc := conn.(*net.UnixConn)
	uc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := uc.Write([]byte(token + "\n")); err != nil {
		return nil, 0, 0, fmt.Errorf("client: descriptor socket: %w", err)
	}
	// One answer line of at most 256 bytes, and room for one descriptor.
	buf := make([]byte, 256)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("client: descriptor socket: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err == nil {
			for _, m := range msgs {
				if got, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, got...)
				}
			}
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	line := string(bytes.TrimRight(buf[:n], "\n"))
	if rest, ok := strings.CutPrefix(line, "error "); ok {
		closeAll()
		return nil, 0, 0, fmt.Errorf("client: descriptor socket: agent says: %s", rest)
	}
	var o, s uint64
	fields := strings.Fields(line)
	if len(fields) == 3 && fields[0] == "ok" {
		o, err = strconv.ParseUint(fields[1], 10, 64)
		if err == nil {
			s, err = strconv.ParseUint(fields[2], 10, 64)
		}
	}
	if len(fields) != 3 || fields[0] != "ok" || err != nil || len(fds) != 1 || s == 0 || s > maxMemory || o > maxMemory {
		closeAll()
		return nil, 0, 0, fmt.Errorf("client: descriptor socket: unexpected answer %q with %d descriptors", line, len(fds))
	}
	return os.NewFile(uintptr(fds[0]), "kvfabric-pool"), o, s, nil
}

// MapDescriptor receives the memory named by token from the descriptor
// socket and maps it shared, read-write. Unmap with syscall.Munmap.
func MapDescriptor(fdSocket, token string) ([]byte, error) {
	f, off, size, err := ReceiveDescriptor(fdSocket, token)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if off != 0 {
		return nil, fmt.Errorf("client: descriptor socket: offset %d: this client maps whole files only", off)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("client: map pool memory: %w", err)
	}
	return b, nil
}

// MapFile maps the memory file at path (a named file under the agent's
// memory directory) shared, read-write. Unmap with syscall.Munmap.
func MapFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("client: pool memory: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("client: pool memory: %w", err)
	}
	if fi.Size() <= 0 || fi.Size() > maxMemory {
		return nil, fmt.Errorf("client: pool memory %s: size %d", path, fi.Size())
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("client: map %s: %w", path, err)
	}
	return b, nil
}
