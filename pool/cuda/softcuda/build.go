package softcuda

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

//go:embed csrc/softcuda.c
var source []byte

// header is the driver-API declarations softcuda.c shares with the binding.
//
//go:embed csrc/kvf_cuda.h
var header []byte

// ErrNoCompiler is returned by Build when gcc is not on PATH.
var ErrNoCompiler = errors.New("softcuda: gcc not found")

// LibName is the file name Build writes in its directory.
const LibName = "libsoftcuda.so"

// Build compiles the library into dir (made if missing) and returns the
// path of the shared object, ready for cuda.Config.Path or
// KVFABRIC_CUDA_LIB. Tests usually pass t.TempDir().
func Build(dir string) (string, error) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoCompiler, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("softcuda: %w", err)
	}
	src := filepath.Join(dir, "softcuda.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", fmt.Errorf("softcuda: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kvf_cuda.h"), header, 0o644); err != nil {
		return "", fmt.Errorf("softcuda: %w", err)
	}
	out := filepath.Join(dir, LibName)
	cmd := exec.Command(gcc, "-std=gnu11", "-O2", "-Wall", "-shared", "-fPIC", "-o", out, src, "-lpthread")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("softcuda: gcc: %w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}
