package softcuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestStrict runs testdata/strict.c against the library: the rules a GPU's
// driver enforces that a careless caller would otherwise get away with
// here (a stream destroyed with work queued, memory of a destroyed context
// or of a freed export, fresh memory taken for zeros, a fault ignored).
func TestStrict(t *testing.T) {
	dir := t.TempDir()
	lib, err := Build(dir)
	if err != nil {
		t.Fatal(err)
	}
	src, err := filepath.Abs("testdata/strict.c")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "strict")
	cmd := exec.Command("gcc", "-std=gnu11", "-Wall", "-I", dir, "-o", bin, src, lib, "-Wl,-rpath,"+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name string
		env  []string
	}{
		{"destroy_returns_at_once", []string{"SOFTCUDA_COPY_DELAY_US=1000000"}},
		{"garbage", nil},
		{"other_context", []string{"SOFTCUDA_DEVICES=2"}},
		{"release_destroys", nil},
		{"sticky", []string{"SOFTCUDA_FAIL=cuMemcpyHtoDAsync_v2=700@1"}},
		{"ipc_after_free", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, c.name)
			for _, kv := range os.Environ() {
				if !strings.HasPrefix(kv, "SOFTCUDA_") {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			cmd.Env = append(cmd.Env, c.env...)
			out, err := cmd.CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "ok" {
				t.Errorf("%v\n%s", err, out)
			}
		})
	}
}
