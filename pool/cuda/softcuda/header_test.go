package softcuda

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// layoutProbe prints every size, offset and value that kvf_cuda.h
// declares, from whichever header the including file names.
const layoutProbe = `
#include <stddef.h>
#include <stdio.h>
#define S(t) printf("sizeof(%s) %zu\n", #t, sizeof(t));
#define O(t, f) printf("offsetof(%s, %s) %zu\n", #t, #f, offsetof(t, f));
#define V(x) printf("%s %lld\n", #x, (long long)(x));
int main(void) {
	S(CUresult) S(CUdevice) S(CUdeviceptr) S(CUcontext) S(CUstream) S(CUevent) S(CUipcMemHandle)
	S(CUDA_MEMCPY2D)
	O(CUDA_MEMCPY2D, srcXInBytes) O(CUDA_MEMCPY2D, srcY) O(CUDA_MEMCPY2D, srcMemoryType)
	O(CUDA_MEMCPY2D, srcHost) O(CUDA_MEMCPY2D, srcDevice) O(CUDA_MEMCPY2D, srcArray)
	O(CUDA_MEMCPY2D, srcPitch) O(CUDA_MEMCPY2D, dstXInBytes) O(CUDA_MEMCPY2D, dstY)
	O(CUDA_MEMCPY2D, dstMemoryType) O(CUDA_MEMCPY2D, dstHost) O(CUDA_MEMCPY2D, dstDevice)
	O(CUDA_MEMCPY2D, dstArray) O(CUDA_MEMCPY2D, dstPitch) O(CUDA_MEMCPY2D, WidthInBytes)
	O(CUDA_MEMCPY2D, Height)
	S(CUDA_MEMCPY3D_PEER)
	O(CUDA_MEMCPY3D_PEER, srcXInBytes) O(CUDA_MEMCPY3D_PEER, srcY) O(CUDA_MEMCPY3D_PEER, srcZ)
	O(CUDA_MEMCPY3D_PEER, srcLOD) O(CUDA_MEMCPY3D_PEER, srcMemoryType) O(CUDA_MEMCPY3D_PEER, srcHost)
	O(CUDA_MEMCPY3D_PEER, srcDevice) O(CUDA_MEMCPY3D_PEER, srcArray) O(CUDA_MEMCPY3D_PEER, srcContext)
	O(CUDA_MEMCPY3D_PEER, srcPitch) O(CUDA_MEMCPY3D_PEER, srcHeight) O(CUDA_MEMCPY3D_PEER, dstXInBytes)
	O(CUDA_MEMCPY3D_PEER, dstY) O(CUDA_MEMCPY3D_PEER, dstZ) O(CUDA_MEMCPY3D_PEER, dstLOD)
	O(CUDA_MEMCPY3D_PEER, dstMemoryType) O(CUDA_MEMCPY3D_PEER, dstHost) O(CUDA_MEMCPY3D_PEER, dstDevice)
	O(CUDA_MEMCPY3D_PEER, dstArray) O(CUDA_MEMCPY3D_PEER, dstContext) O(CUDA_MEMCPY3D_PEER, dstPitch)
	O(CUDA_MEMCPY3D_PEER, dstHeight) O(CUDA_MEMCPY3D_PEER, WidthInBytes) O(CUDA_MEMCPY3D_PEER, Height)
	O(CUDA_MEMCPY3D_PEER, Depth)
	V(CU_IPC_HANDLE_SIZE) V(CU_MEMORYTYPE_HOST) V(CU_MEMORYTYPE_DEVICE)
	V(CU_DEVICE_ATTRIBUTE_MAX_PITCH) V(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) V(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)
	V(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID) V(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)
	V(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) V(CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD) V(CU_STREAM_NON_BLOCKING)
	V(CU_MEMHOSTALLOC_PORTABLE) V(CU_MEMHOSTREGISTER_PORTABLE) V(CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
	V(CUDA_SUCCESS) V(CUDA_ERROR_INVALID_VALUE) V(CUDA_ERROR_OUT_OF_MEMORY) V(CUDA_ERROR_NOT_INITIALIZED)
	V(CUDA_ERROR_NO_DEVICE) V(CUDA_ERROR_INVALID_DEVICE) V(CUDA_ERROR_INVALID_CONTEXT) V(CUDA_ERROR_MAP_FAILED)
	V(CUDA_ERROR_ECC_UNCORRECTABLE) V(CUDA_ERROR_OPERATING_SYSTEM) V(CUDA_ERROR_INVALID_HANDLE)
	V(CUDA_ERROR_NOT_READY) V(CUDA_ERROR_ILLEGAL_ADDRESS) V(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED)
	V(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED) V(CUDA_ERROR_LAUNCH_FAILED) V(CUDA_ERROR_NOT_SUPPORTED)
	V(CUDA_ERROR_UNKNOWN)
	return 0;
}
`

// probe compiles layoutProbe against include (a header path) and returns
// what it prints.
func probe(t *testing.T, include string) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "probe.c")
	if err := os.WriteFile(src, []byte("#include \""+include+"\"\n"+layoutProbe), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "probe")
	if out, err := exec.Command("gcc", "-std=gnu11", "-Wall", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("gcc with %s: %v\n%s", include, err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// The shared header's sizes, offsets and values equal a real cuda.h's:
// the one KVFABRIC_CUDA_H names, or /usr/include/cuda.h or
// /usr/local/cuda/include/cuda.h (Debian's non-free nvidia-cuda-dev, the
// CUDA toolkit). Without any it skips, saying how to get one.
func TestHeaderMatchesCudaH(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found")
	}
	var real string
	for _, p := range []string{os.Getenv("KVFABRIC_CUDA_H"), "/usr/include/cuda.h", "/usr/local/cuda/include/cuda.h"} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			real = p
			break
		}
	}
	if real == "" {
		t.Skip("no cuda.h: set KVFABRIC_CUDA_H, or run make cuda-header-check (fetches Debian's non-free nvidia-cuda-dev)")
	}
	abs, err := filepath.Abs("csrc/kvf_cuda.h")
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := probe(t, abs), probe(t, real)
	if ours == theirs {
		t.Logf("kvf_cuda.h matches %s: %d sizes, offsets and values", real, strings.Count(ours, "\n"))
		return
	}
	ol, tl := strings.Split(ours, "\n"), strings.Split(theirs, "\n")
	for i := range min(len(ol), len(tl)) {
		if !bytes.Equal([]byte(ol[i]), []byte(tl[i])) {
			t.Errorf("kvf_cuda.h %q, %s %q", ol[i], real, tl[i])
		}
	}
}
