//go:build cgo && linux

package rdma

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// requiredSymbols are the entry points Open insists on.
var requiredSymbols = []string{
	"ibv_get_device_list", "ibv_free_device_list", "ibv_get_device_name", "ibv_get_device_guid",
	"ibv_open_device", "ibv_close_device", "ibv_query_device", "ibv_query_port", "ibv_query_gid",
	"ibv_alloc_pd", "ibv_dealloc_pd", "ibv_reg_mr", "ibv_dereg_mr", "ibv_create_cq", "ibv_destroy_cq",
	"ibv_create_qp", "ibv_modify_qp", "ibv_query_qp", "ibv_destroy_qp", "ibv_wc_status_str",
}

// fakeLibrary builds a shared library exporting every required symbol but
// omit; its device list is empty.
func fakeLibrary(t *testing.T, omit string) string {
	t.Helper()
	var b strings.Builder
	b.WriteString("#include <stdlib.h>\n")
	for _, s := range requiredSymbols {
		if s == omit {
			continue
		}
		if s == "ibv_get_device_list" {
			b.WriteString("void **ibv_get_device_list(int *n) { if (n) *n = 0; return calloc(1, sizeof(void *)); }\n")
			continue
		}
		if s == "ibv_free_device_list" {
			b.WriteString("void ibv_free_device_list(void **l) { free(l); }\n")
			continue
		}
		fmt.Fprintf(&b, "long %s(void) { return 0; }\n", s)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "fake.c")
	lib := filepath.Join(dir, "libfakeverbs.so")
	if err := os.WriteFile(src, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-shared", "-fPIC", "-o", lib, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return lib
}

func TestOpenMissingLibrary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libibverbs-absent.so.1")
	_, err := Open(Config{Library: path})
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Open of a missing library: %v, want ErrUnavailable", err)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "RDMA is off") {
		t.Fatalf("error %q does not name the library or say RDMA is off", err)
	}
}

func TestOpenLibraryFromEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libfrom-env.so")
	t.Setenv(EnvLibrary, path)
	_, err := Open(Config{})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Open with %s=%s: %v, want an error naming that path", EnvLibrary, path, err)
	}
	// Config wins over the environment.
	lib := fakeLibrary(t, "")
	l, err := Open(Config{Library: lib})
	if err != nil {
		t.Fatalf("Open(Config.Library) with %s set elsewhere: %v", EnvLibrary, err)
	}
	if l.Path() != lib {
		t.Fatalf("opened %s, want %s", l.Path(), lib)
	}
	l.Close()
}

func TestOpenMissingSymbol(t *testing.T) {
	for _, sym := range []string{"ibv_modify_qp", "ibv_wc_status_str", "ibv_get_device_list"} {
		lib := fakeLibrary(t, sym)
		_, err := Open(Config{Library: lib})
		if !errors.Is(err, ErrNotSupported) {
			t.Fatalf("library without %s: %v, want ErrNotSupported", sym, err)
		}
		if !strings.Contains(err.Error(), sym) {
			t.Fatalf("error %q does not name the missing %s", err, sym)
		}
	}
}

func TestNoDevices(t *testing.T) {
	l, err := Open(Config{Library: fakeLibrary(t, "")})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := l.Devices(); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "no RDMA devices") {
		t.Fatalf("Devices with none: %v, want ErrUnavailable saying no RDMA devices", err)
	}
	if _, err := l.OpenDevice("mlx5_0", 1); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("OpenDevice with none: %v, want ErrUnavailable", err)
	}
	// The optional symbols are absent from this library: nothing else
	// depends on them being there.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := l.Devices(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Devices after Close: %v, want ErrClosed", err)
	}
}
