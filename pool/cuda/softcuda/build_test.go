package softcuda

import (
	"debug/elf"
	"testing"
)

// The library exports the driver's versioned names, so that the binding
// that loads it loads a real libcuda.so.1 unchanged.
func TestBuildExportsDriverNames(t *testing.T) {
	path, err := Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF {
			have[s.Name] = true
		}
	}
	for _, name := range []string{
		"cuInit", "cuDeviceGetCount", "cuDeviceTotalMem_v2", "cuDevicePrimaryCtxRelease_v2",
		"cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2", "cuMemHostAlloc", "cuMemHostRegister_v2",
		"cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemcpyDtoDAsync_v2", "cuMemcpy2DAsync_v2",
		"cuStreamDestroy_v2", "cuEventDestroy_v2", "cuIpcOpenMemHandle_v2", "cuMemGetHandleForAddressRange",
		"cuMemcpyPeerAsync", "cuMemcpy3DPeerAsync", "cuPointerGetAttribute",
	} {
		if !have[name] {
			t.Errorf("%s not exported", name)
		}
	}
}
