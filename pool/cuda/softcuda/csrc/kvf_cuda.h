// kvf_cuda.h: the CUDA driver-API types, codes and structures kvfabric
// uses, declared once for the binding (pool/cuda/lib_cgo.go) and for the
// software GPU (softcuda.c), so that no CUDA headers are needed to build.
// Names and layouts follow cuda.h (x86-64 and aarch64 Linux, LP64); the
// static asserts below pin every size and offset the two sides share, and
// TestHeaderMatchesCudaH compares them with a real cuda.h where one is
// installed.
#ifndef CUDA_H
#define CUDA_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
// Opaque handles, as cuda.h declares them; softcuda defines the structures.
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

#define CU_IPC_HANDLE_SIZE 64
typedef struct CUipcMemHandle_st {
	char reserved[CU_IPC_HANDLE_SIZE];
} CUipcMemHandle;

// CUmemorytype (an enum: int-sized).
enum {
	CU_MEMORYTYPE_HOST = 1,
	CU_MEMORYTYPE_DEVICE = 2,
};

// CUdevice_attribute values used.
enum {
	CU_DEVICE_ATTRIBUTE_MAX_PITCH = 11,
	CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33,
	CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34,
	CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50,
	CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124,
};

// Other enumerations and flags used.
enum {
	CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
	CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 1,
	CU_STREAM_NON_BLOCKING = 1,
	CU_MEMHOSTALLOC_PORTABLE = 1,
	CU_MEMHOSTREGISTER_PORTABLE = 1,
	CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1,
};

// CUresult values named on either side.
enum {
	CUDA_SUCCESS = 0,
	CUDA_ERROR_INVALID_VALUE = 1,
	CUDA_ERROR_OUT_OF_MEMORY = 2,
	CUDA_ERROR_NOT_INITIALIZED = 3,
	CUDA_ERROR_NO_DEVICE = 100,
	CUDA_ERROR_INVALID_DEVICE = 101,
	CUDA_ERROR_INVALID_CONTEXT = 201,
	CUDA_ERROR_MAP_FAILED = 205,
	CUDA_ERROR_ECC_UNCORRECTABLE = 214,
	CUDA_ERROR_OPERATING_SYSTEM = 304,
	CUDA_ERROR_INVALID_HANDLE = 400,
	CUDA_ERROR_NOT_READY = 600,
	CUDA_ERROR_ILLEGAL_ADDRESS = 700,
	CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
	CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
	CUDA_ERROR_LAUNCH_FAILED = 719,
	CUDA_ERROR_NOT_SUPPORTED = 801,
	CUDA_ERROR_UNKNOWN = 999,
};

// CUDA_MEMCPY2D (CUDA_MEMCPY2D_v2 in cuda.h), field for field. CUarray is
// an opaque pointer.
typedef struct {
	size_t srcXInBytes, srcY;
	int srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray;
	size_t srcPitch;
	size_t dstXInBytes, dstY;
	int dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray;
	size_t dstPitch;
	size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

// CUDA_MEMCPY3D_PEER (CUDA_MEMCPY3D_PEER_v1 in cuda.h), field for field.
typedef struct {
	size_t srcXInBytes, srcY, srcZ, srcLOD;
	int srcMemoryType;
	const void *srcHost;
	CUdeviceptr srcDevice;
	void *srcArray;
	CUcontext srcContext;
	size_t srcPitch, srcHeight;
	size_t dstXInBytes, dstY, dstZ, dstLOD;
	int dstMemoryType;
	void *dstHost;
	CUdeviceptr dstDevice;
	void *dstArray;
	CUcontext dstContext;
	size_t dstPitch, dstHeight;
	size_t WidthInBytes, Height, Depth;
} CUDA_MEMCPY3D_PEER;

// The layouts of cuda.h on LP64 Linux (checked against CUDA 11.8's cuda.h).
#define CU_ASSERT(c, m) _Static_assert(c, m)
CU_ASSERT(sizeof(CUdeviceptr) == 8, "CUdeviceptr is 64 bits");
CU_ASSERT(sizeof(CUipcMemHandle) == 64, "CUipcMemHandle size");
CU_ASSERT(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D size");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, srcMemoryType) == 16, "CUDA_MEMCPY2D.srcMemoryType");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, srcHost) == 24, "CUDA_MEMCPY2D.srcHost");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, srcDevice) == 32, "CUDA_MEMCPY2D.srcDevice");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, srcPitch) == 48, "CUDA_MEMCPY2D.srcPitch");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, dstXInBytes) == 56, "CUDA_MEMCPY2D.dstXInBytes");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, dstMemoryType) == 72, "CUDA_MEMCPY2D.dstMemoryType");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, dstHost) == 80, "CUDA_MEMCPY2D.dstHost");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, dstDevice) == 88, "CUDA_MEMCPY2D.dstDevice");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, dstPitch) == 104, "CUDA_MEMCPY2D.dstPitch");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, WidthInBytes) == 112, "CUDA_MEMCPY2D.WidthInBytes");
CU_ASSERT(offsetof(CUDA_MEMCPY2D, Height) == 120, "CUDA_MEMCPY2D.Height");
CU_ASSERT(sizeof(CUDA_MEMCPY3D_PEER) == 200, "CUDA_MEMCPY3D_PEER size");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, srcMemoryType) == 32, "CUDA_MEMCPY3D_PEER.srcMemoryType");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, srcDevice) == 48, "CUDA_MEMCPY3D_PEER.srcDevice");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, srcContext) == 64, "CUDA_MEMCPY3D_PEER.srcContext");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, srcPitch) == 72, "CUDA_MEMCPY3D_PEER.srcPitch");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, srcHeight) == 80, "CUDA_MEMCPY3D_PEER.srcHeight");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, dstXInBytes) == 88, "CUDA_MEMCPY3D_PEER.dstXInBytes");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, dstMemoryType) == 120, "CUDA_MEMCPY3D_PEER.dstMemoryType");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, dstDevice) == 136, "CUDA_MEMCPY3D_PEER.dstDevice");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, dstContext) == 152, "CUDA_MEMCPY3D_PEER.dstContext");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, dstPitch) == 160, "CUDA_MEMCPY3D_PEER.dstPitch");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, WidthInBytes) == 176, "CUDA_MEMCPY3D_PEER.WidthInBytes");
CU_ASSERT(offsetof(CUDA_MEMCPY3D_PEER, Depth) == 192, "CUDA_MEMCPY3D_PEER.Depth");
#undef CU_ASSERT

#endif
