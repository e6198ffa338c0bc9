package softverbs

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

//go:embed softverbs.c
var source []byte

// cflags are the flags the library is compiled with; they are part of the
// cache key.
var cflags = []string{"-shared", "-fPIC", "-O2", "-pthread"}

// sysroot, when set, is passed to gcc (tests use it to hide the headers).
var sysroot string

// ErrNoHeaders is returned by [Build] when rdma-core's <infiniband/verbs.h>
// is missing (Debian: apt-get install libibverbs-dev).
var ErrNoHeaders = errors.New("softverbs: <infiniband/verbs.h> not found: install libibverbs-dev")

// Source returns softverbs.c, for tests that compile programs against it.
func Source() []byte { return bytes.Clone(source) }

// BuildShared is Build into one directory that every test of every
// package shares: the library is built once per version of its source,
// whichever test asks first. It is a cache, like Go's own build cache, so
// it lives in the user's cache directory (os.UserCacheDir, usually
// ~/.cache/kvfabric/softverbs), not among the temporary files tests make
// and remove.
func BuildShared() (string, error) {
	return Build(sharedDir())
}

// sharedDir is BuildShared's directory: under os.UserCacheDir, or under
// os.TempDir where there is none (neither XDG_CACHE_HOME nor HOME set).
func sharedDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "kvfabric", "softverbs")
	}
	return filepath.Join(os.TempDir(), "kvfabric-softverbs")
}

// Build compiles softverbs.c into dir (created if needed) and returns the
// path of the shared library. Builds are cached by the hash of the source
// and flags: a library already in dir is reused. Safe to call from several
// processes at once (each writes a temporary file and renames it).
func Build(dir string) (string, error) {
	h := sha256.New()
	h.Write(source)
	h.Write([]byte(strings.Join(cflags, " ")))
	sum := hex.EncodeToString(h.Sum(nil))[:16]
	lib := filepath.Join(dir, "libsoftverbs-"+sum+".so")
	if _, err := os.Stat(lib); err == nil {
		return lib, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("softverbs: build dir: %w", err)
	}
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return "", fmt.Errorf("softverbs: gcc is needed to build the library: %w", err)
	}
	if err := haveHeaders(gcc); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", fmt.Errorf("softverbs: build dir: %w", err)
	}
	defer os.RemoveAll(tmp)
	src := filepath.Join(tmp, "softverbs.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", fmt.Errorf("softverbs: %w", err)
	}
	out := filepath.Join(tmp, "libsoftverbs.so")
	args := append(gccArgs(), src, "-o", out)
	if msg, err := exec.Command(gcc, args...).CombinedOutput(); err != nil {
		if strings.Contains(string(msg), "infiniband/verbs.h") {
			return "", fmt.Errorf("%w (gcc: %s)", ErrNoHeaders, firstLine(msg))
		}
		return "", fmt.Errorf("softverbs: gcc %s: %w\n%s", strings.Join(args, " "), err, msg)
	}
	if err := os.Rename(out, lib); err != nil {
		return "", fmt.Errorf("softverbs: %w", err)
	}
	return lib, nil
}

func gccArgs() []string {
	args := append([]string{}, cflags...)
	if sysroot != "" {
		args = append(args, "--sysroot="+sysroot)
	}
	return args
}

// haveHeaders preprocesses an include of <infiniband/verbs.h> alone, so that
// a missing header is told apart from any other compile error.
func haveHeaders(gcc string) error {
	args := []string{"-E", "-x", "c", "-o", os.DevNull, "-"}
	if sysroot != "" {
		args = append(args, "--sysroot="+sysroot)
	}
	cmd := exec.Command(gcc, args...)
	cmd.Stdin = strings.NewReader("#include <infiniband/verbs.h>\n")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%w (gcc: %s)", ErrNoHeaders, firstLine(msg))
	}
	return nil
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
