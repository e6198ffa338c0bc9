//go:build linux

package pool

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sectionChildEnv makes the test binary an engine process that maps the
// memory file it inherits as descriptor 3 (see sectionChild).
const sectionChildEnv = "KVFABRIC_TEST_SECTION_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(sectionChildEnv) != "" {
		if err := sectionChild(); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// sectionChild maps descriptor 3 whole, prints "size N", then answers
// "write" (writes "engine" at byte 0) and "fill" (0x77 over all of it)
// with "ok" until its input ends.
func sectionChild() error {
	f := os.NewFile(3, "section")
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	m, err := unix.Mmap(3, 0, int(fi.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return err
	}
	f.Close() // the mapping outlives the descriptor, as an engine's does
	fmt.Printf("size %d\n", len(m))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "write":
			copy(m, "engine")
		case "fill":
			for i := range m {
				m[i] = 0x77
			}
		}
		fmt.Println("ok")
	}
	return nil
}

// sectionEngine is a child process mapping one section.
type sectionEngine struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
}

func startSectionEngine(t *testing.T, s *Section) (*sectionEngine, uint64) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), sectionChildEnv+"=1")
	// The child gets a duplicate of the section's descriptor: an
	// *os.File over the section's own would close it when collected,
	// under the section (whose Close then fails with EBADF).
	fd, err := unix.Dup(s.FD())
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "section")
	defer f.Close() // the child has its own copy once started
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	e := &sectionEngine{t: t, in: in, out: bufio.NewScanner(out)}
	var size uint64
	if _, err := fmt.Sscanf(e.line(), "size %d", &size); err != nil {
		t.Fatal(err)
	}
	return e, size
}

func (e *sectionEngine) line() string {
	e.t.Helper()
	got := make(chan string, 1)
	go func() {
		if e.out.Scan() {
			got <- e.out.Text()
		} else {
			got <- "exited"
		}
	}()
	select {
	case l := <-got:
		if strings.HasPrefix(l, "error") || l == "exited" {
			e.t.Fatalf("engine process: %s", l)
		}
		return l
	case <-time.After(30 * time.Second):
		e.t.Fatal("engine process: no answer within 30s")
		return ""
	}
}

func (e *sectionEngine) do(cmd string) {
	e.t.Helper()
	fmt.Fprintln(e.in, cmd)
	e.line()
}

// A section hands out its range and nothing else; once a new section
// takes the range, the engine that mapped the old one (a real process,
// still mapping it) neither sees what is there nor changes it, and the new
// section starts zeroed.
func TestSectionIsolatesARange(t *testing.T) {
	for _, backing := range []string{"memfd", "file"} {
		t.Run(backing, func(t *testing.T) {
			page := uint64(os.Getpagesize())
			cfg := HostConfig{Size: 8 * page, Name: "section-test"}
			if backing == "file" {
				cfg.Backing, cfg.Dir = ShmFile, t.TempDir()
			}
			h, err := NewHostStorage(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			mem := h.Bytes()
			for i := range mem {
				mem[i] = 0x11
			}
			off, size := 2*page, 3*page
			s1, err := h.NewSection(off, size, "set-1")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(mem[off:off+size], make([]byte, size)) {
				t.Fatal("a new section does not start zeroed")
			}
			if backing == "file" {
				if filepath.Dir(s1.Path()) != cfg.Dir {
					t.Fatalf("section file %s not in %s", s1.Path(), cfg.Dir)
				}
				if fi, err := os.Stat(s1.Path()); err != nil || fi.Mode().Perm() != 0o600 {
					t.Fatalf("section file: %v %v, want mode 0600", fi, err)
				}
			}
			copy(mem[off:], "agent")
			e, got := startSectionEngine(t, s1)
			if got != size {
				t.Fatalf("the engine mapped %d bytes of a %d-byte section", got, size)
			}
			e.do("write")
			if string(mem[off:off+6]) != "engine" {
				t.Fatalf("the engine's write did not reach the storage: %q", mem[off:off+6])
			}
			e.do("fill")
			for i, v := range mem {
				inside := uint64(i) >= off && uint64(i) < off+size
				if !inside && v != 0x11 {
					t.Fatalf("byte %d outside the section changed to %#x", i, v)
				}
			}
			path := s1.Path()
			if err := s1.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s1.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if backing == "file" {
				if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("section file left after Close: %v", err)
				}
			}
			s2, err := h.NewSection(off, size, "set-2")
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			if !bytes.Equal(mem[off:off+size], make([]byte, size)) {
				t.Fatal("the range given to a new section holds the old one's bytes")
			}
			e.do("fill")
			if !bytes.Equal(mem[off:off+size], make([]byte, size)) {
				t.Fatal("the engine of the old section wrote into the new one")
			}
		})
	}
}

// NewSection takes a page-aligned range inside the storage: the last page
// is fine, one page past the end, a partial page or nothing are not.
func TestSectionBounds(t *testing.T) {
	page := uint64(os.Getpagesize())
	h, err := NewHostStorage(HostConfig{Size: 4 * page})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	s, err := h.NewSection(3*page, page, "last")
	if err != nil {
		t.Fatalf("the last page: %v", err)
	}
	s.Close()
	for _, c := range []struct {
		desc      string
		off, size uint64
	}{
		{"past the end", 4 * page, page},
		{"overlapping the end", 3 * page, 2 * page},
		{"unaligned offset", 1, page},
		{"unaligned size", 0, page + 1},
		{"empty", 0, 0},
		{"wrapping", page, ^uint64(0) &^ (page - 1)},
	} {
		if _, err := h.NewSection(c.off, c.size, "bad"); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", c.desc, err)
		}
	}
	h.Close()
	if _, err := h.NewSection(0, page, "closed"); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v, want ErrClosed", err)
	}
}

// NewSectionFile makes a section's memory file and leaves the storage
// untouched: the range keeps its bytes until Place puts the file's fresh
// pages under it, and what is written there then reaches the file. A
// section is placed once and only inside the storage; one refused stays
// unplaced, to be placed elsewhere or closed; one closed is not placed.
func TestSectionFileThenPlace(t *testing.T) {
	for _, shm := range []bool{false, true} {
		t.Run(fmt.Sprintf("shm=%v", shm), func(t *testing.T) {
			page := uint64(os.Getpagesize())
			cfg := HostConfig{Size: 4 * page}
			if shm {
				cfg.Backing, cfg.Dir = ShmFile, t.TempDir()
			}
			h, err := NewHostStorage(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer h.Close()
			b := h.Bytes()
			copy(b[page:], "before")
			s, err := h.NewSectionFile(page, "two-steps")
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if !bytes.HasPrefix(b[page:], []byte("before")) {
				t.Fatal("the storage changed before the section was placed")
			}
			if err := s.Place(4 * page); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("placed past the end: %v, want ErrInvalidArgument", err)
			}
			if err := s.Place(page); err != nil {
				t.Fatalf("placed after a refusal: %v", err)
			}
			if s.Offset() != page || s.Size() != page {
				t.Fatalf("section at %d of %d bytes, want %d of %d", s.Offset(), s.Size(), page, page)
			}
			if b[page] != 0 {
				t.Fatal("the range kept its bytes once the section was placed")
			}
			copy(b[page:], "pool")
			got := make([]byte, 4)
			if _, err := unix.Pread(s.FD(), got, 0); err != nil || string(got) != "pool" {
				t.Fatalf("the file holds %q (%v), want what the pool wrote", got, err)
			}
			if err := s.Place(2 * page); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("placed twice: %v, want ErrInvalidArgument", err)
			}
			s2, err := h.NewSectionFile(page, "closed-first")
			if err != nil {
				t.Fatal(err)
			}
			path := s2.Path()
			s2.Close()
			if err := s2.Place(2 * page); !errors.Is(err, ErrClosed) {
				t.Errorf("placed after Close: %v, want ErrClosed", err)
			}
			if shm {
				if _, err := os.Stat(path); !os.IsNotExist(err) {
					t.Errorf("the file of a section closed unplaced is still there: %v", err)
				}
			}
			if _, err := h.NewSectionFile(8*page, "too-big"); !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("a file larger than the storage: %v, want ErrInvalidArgument", err)
			}
		})
	}
}
