//go:build cgo && linux

package ofi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

var requiredSymbols = []string{"fi_getinfo", "fi_freeinfo", "fi_dupinfo", "fi_fabric", "fi_strerror", "fi_version"}

// fakeLibrary builds a shared library exporting every required symbol but
// omit, whose fi_version reports version.
func fakeLibrary(t *testing.T, omit string, version uint32) string {
	t.Helper()
	return fakeLibraryOf(t, omit, version)
}

// fakeLibraryWith is fakeLibrary with every symbol, built with the C
// source extra.
func fakeLibraryWith(t *testing.T, extra string) string {
	t.Helper()
	return fakeLibraryOf(t, "", APIVersion, extra)
}

func fakeLibraryOf(t *testing.T, omit string, version uint32, extra ...string) string {
	t.Helper()
	var b strings.Builder
	for _, s := range requiredSymbols {
		switch {
		case s == omit:
		case s == "fi_version":
			fmt.Fprintf(&b, "unsigned fi_version(void) { return %du; }\n", version)
		case s == "fi_dupinfo":
			b.WriteString("void *fi_dupinfo(const void *i) { return 0; }\n")
		case s == "fi_strerror":
			b.WriteString("const char *fi_strerror(int e) { return \"fake\"; }\n")
		default:
			fmt.Fprintf(&b, "long %s(void) { return -61; }\n", s)
		}
	}
	dir := t.TempDir()
	src, lib := filepath.Join(dir, "fake.c"), filepath.Join(dir, "libfakefabric.so")
	if err := os.WriteFile(src, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", append([]string{"-shared", "-fPIC", "-o", lib, src}, extra...)...).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}

func TestLoadRefusals(t *testing.T) {
	if _, err := Load(Config{Library: filepath.Join(t.TempDir(), "libfabric-absent.so.1")}); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a missing library: %v, want ErrUnavailable", err)
	}
	for _, s := range requiredSymbols {
		_, err := Load(Config{Library: fakeLibrary(t, s, APIVersion)})
		if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), s) {
			t.Errorf("a library without %s: %v, want ErrNotSupported naming it", s, err)
		}
	}
	if _, err := Load(Config{Library: fakeLibrary(t, "", APIVersion-1)}); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "1.16") {
		t.Errorf("libfabric 1.16: %v, want ErrNotSupported naming the version", err)
	}
	l, err := Load(Config{Library: fakeLibrary(t, "", APIVersion)})
	if err != nil {
		t.Fatalf("libfabric %d.%d: %v", APIVersion>>16, APIVersion&0xffff, err)
	}
	defer l.Close()
	// It cannot allocate hints: no provider is an error, not a panic.
	if _, err := l.Open(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Open on a library offering nothing: %v, want ErrUnavailable", err)
	}
	t.Setenv(EnvLibrary, filepath.Join(t.TempDir(), "from-env.so"))
	if _, err := Load(Config{}); err == nil || !strings.Contains(err.Error(), "from-env.so") {
		t.Errorf("the library named by %s: %v", EnvLibrary, err)
	}
}

// A library that takes signal handlers when it loads (as Debian's
// libfabric does through libpsm, whose constructor takes SIGTERM and
// SIGSEGV and exits on them) leaves the process's handlers as they were:
// Load puts them back, and the Go runtime still stops on SIGTERM and
// panics on a nil pointer. Also the real libfabric, loaded, listed and
// opened here.
func TestLoadKeepsSignalHandlers(t *testing.T) {
	sigs := []syscall.Signal{syscall.SIGINT, syscall.SIGILL, syscall.SIGABRT, syscall.SIGBUS, syscall.SIGSEGV, syscall.SIGTERM}
	before := map[syscall.Signal]uintptr{}
	for _, s := range sigs {
		before[s] = signalHandler(s)
	}
	check := func(what string) {
		t.Helper()
		for _, s := range sigs {
			if h := signalHandler(s); h != before[s] {
				t.Errorf("after %s, the handler of %v is %#x, was %#x", what, s, h, before[s])
			}
		}
	}
	grab := filepath.Join(t.TempDir(), "grab.c")
	var src strings.Builder
	src.WriteString("#include <signal.h>\n#include <stdlib.h>\nstatic void die(int s) { exit(1); }\n")
	src.WriteString("__attribute__((constructor)) static void grab(void) {\n")
	for _, s := range sigs {
		fmt.Fprintf(&src, "\tsignal(%d, die);\n", int(s))
	}
	src.WriteString("}\n")
	if err := os.WriteFile(grab, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	lib := fakeLibraryWith(t, grab)
	l, err := Load(Config{Library: lib})
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	check("loading a library whose constructor takes them")
	real := loadLibrary(t, "tcp")
	if _, err := real.Providers(); err != nil {
		t.Fatal(err)
	}
	openEndpoint(t, real)
	check("loading libfabric, listing its providers and opening a tcp endpoint")
}
