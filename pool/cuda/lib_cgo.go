//go:build cgo && linux

package cuda

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The driver-API types we use, declared once for the binding and softcuda
// (with static asserts on their layouts); no CUDA headers are needed to
// build.
#cgo CFLAGS: -I${SRCDIR}/softcuda/csrc
#include "kvf_cuda.h"

#define KVF_MAXDEV 64

// The calls, under the versioned names a real libcuda.so.1 exports.
#define KVF_FUNCS(X) \
	X(cuInit, (unsigned int)) \
	X(cuDeviceGetCount, (int *)) \
	X(cuDeviceGet, (CUdevice *, int)) \
	X(cuDeviceGetName, (char *, int, CUdevice)) \
	X(cuDeviceTotalMem_v2, (size_t *, CUdevice)) \
	X(cuDeviceGetPCIBusId, (char *, int, CUdevice)) \
	X(cuDeviceGetAttribute, (int *, int, CUdevice)) \
	X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice)) \
	X(cuDevicePrimaryCtxRelease_v2, (CUdevice)) \
	X(cuCtxSetCurrent, (CUcontext)) \
	X(cuMemAlloc_v2, (CUdeviceptr *, size_t)) \
	X(cuMemFree_v2, (CUdeviceptr)) \
	X(cuMemGetInfo_v2, (size_t *, size_t *)) \
	X(cuMemGetAddressRange_v2, (CUdeviceptr *, size_t *, CUdeviceptr)) \
	X(cuMemHostAlloc, (void **, size_t, unsigned int)) \
	X(cuMemFreeHost, (void *)) \
	X(cuMemHostRegister_v2, (void *, size_t, unsigned int)) \
	X(cuMemHostUnregister, (void *)) \
	X(cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void *, size_t, CUstream)) \
	X(cuMemcpyDtoHAsync_v2, (void *, CUdeviceptr, size_t, CUstream)) \
	X(cuMemcpyDtoDAsync_v2, (CUdeviceptr, CUdeviceptr, size_t, CUstream)) \
	X(cuMemcpy2DAsync_v2, (const CUDA_MEMCPY2D *, CUstream)) \
	X(cuMemcpyPeerAsync, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream)) \
	X(cuMemcpy3DPeerAsync, (const CUDA_MEMCPY3D_PEER *, CUstream)) \
	X(cuPointerGetAttribute, (void *, int, CUdeviceptr)) \
	X(cuStreamCreate, (CUstream *, unsigned int)) \
	X(cuStreamDestroy_v2, (CUstream)) \
	X(cuStreamSynchronize, (CUstream)) \
	X(cuStreamWaitEvent, (CUstream, CUevent, unsigned int)) \
	X(cuEventCreate, (CUevent *, unsigned int)) \
	X(cuEventDestroy_v2, (CUevent)) \
	X(cuEventRecord, (CUevent, CUstream)) \
	X(cuEventSynchronize, (CUevent)) \
	X(cuEventQuery, (CUevent)) \
	X(cuIpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr)) \
	X(cuIpcOpenMemHandle_v2, (CUdeviceptr *, CUipcMemHandle, unsigned int)) \
	X(cuIpcCloseMemHandle, (CUdeviceptr)) \
	X(cuGetErrorName, (CUresult, const char **))

// Optional: drivers before CUDA 11.7 lack it, and dma-buf is then
// unsupported rather than the whole driver.
#define KVF_OPTIONAL(X) \
	X(cuMemGetHandleForAddressRange, (void *, CUdeviceptr, size_t, int, unsigned long long))

#define KVF_DECL(name, args) CUresult (*name) args;
struct kvf_cuda {
	void *h;
	CUcontext ctx[KVF_MAXDEV];
	KVF_FUNCS(KVF_DECL)
	KVF_OPTIONAL(KVF_DECL)
};

// kvf_open loads the library and every symbol. On failure it returns NULL
// and copies the reason into err (dlerror is read on the calling thread,
// within this one call).
static struct kvf_cuda *kvf_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return NULL;
	}
	struct kvf_cuda *l = calloc(1, sizeof *l);
	if (!l) {
		dlclose(h);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	l->h = h;
#define KVF_LOAD(name, args) \
	if (!(l->name = dlsym(h, #name))) { \
		snprintf(err, errlen, "symbol %s missing", #name); \
		dlclose(h); \
		free(l); \
		return NULL; \
	}
	KVF_FUNCS(KVF_LOAD)
#define KVF_LOAD_OPT(name, args) l->name = dlsym(h, #name);
	KVF_OPTIONAL(KVF_LOAD_OPT)
	return l;
}

// Every call that needs a context makes the device's primary context
// current on the thread it runs on first, within the same C call, so that
// goroutines moving between threads never see another device's context.
#define CTX(dev) \
	do { \
		if ((dev) < 0 || (dev) >= KVF_MAXDEV || !l->ctx[dev]) return 201; \
		CUresult r_ = l->cuCtxSetCurrent(l->ctx[dev]); \
		if (r_) return r_; \
	} while (0)

static CUresult kvf_retain(struct kvf_cuda *l, int dev) {
	if (dev < 0 || dev >= KVF_MAXDEV) return 101;
	CUdevice d;
	CUresult r = l->cuDeviceGet(&d, dev);
	if (r) return r;
	return l->cuDevicePrimaryCtxRetain(&l->ctx[dev], d);
}

static CUresult kvf_release(struct kvf_cuda *l, int dev) {
	// A CUdevice is a handle from cuDeviceGet, not necessarily the ordinal.
	CUdevice d;
	CUresult r = l->cuDeviceGet(&d, dev);
	if (r) return r;
	r = l->cuDevicePrimaryCtxRelease_v2(d);
	l->ctx[dev] = NULL;
	return r;
}

static CUresult kvf_info(struct kvf_cuda *l, int dev, char *name, int namelen, size_t *total, char *bus, int buslen, int *dmabuf) {
	CUdevice d;
	CUresult r = l->cuDeviceGet(&d, dev);
	if (r) return r;
	if ((r = l->cuDeviceGetName(name, namelen, d))) return r;
	if ((r = l->cuDeviceTotalMem_v2(total, d))) return r;
	if ((r = l->cuDeviceGetPCIBusId(bus, buslen, d))) return r;
	*dmabuf = 0;
	// CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED; older drivers refuse the
	// attribute, which means no.
	if (l->cuMemGetHandleForAddressRange && l->cuDeviceGetAttribute(dmabuf, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, d)) *dmabuf = 0;
	return 0;
}

static CUresult kvf_meminfo(struct kvf_cuda *l, int dev, size_t *freeb, size_t *total) {
	CTX(dev);
	return l->cuMemGetInfo_v2(freeb, total);
}
static CUresult kvf_alloc(struct kvf_cuda *l, int dev, CUdeviceptr *p, size_t n) {
	CTX(dev);
	return l->cuMemAlloc_v2(p, n);
}
static CUresult kvf_free(struct kvf_cuda *l, int dev, CUdeviceptr p) {
	CTX(dev);
	return l->cuMemFree_v2(p);
}
static CUresult kvf_range(struct kvf_cuda *l, int dev, CUdeviceptr p, CUdeviceptr *base, size_t *size) {
	CTX(dev);
	return l->cuMemGetAddressRange_v2(base, size, p);
}
static CUresult kvf_hostalloc(struct kvf_cuda *l, int dev, void **p, size_t n) {
	CTX(dev);
	return l->cuMemHostAlloc(p, n, CU_MEMHOSTALLOC_PORTABLE);
}
static CUresult kvf_hostfree(struct kvf_cuda *l, int dev, void *p) {
	CTX(dev);
	return l->cuMemFreeHost(p);
}
static CUresult kvf_hostregister(struct kvf_cuda *l, int dev, void *p, size_t n) {
	CTX(dev);
	return l->cuMemHostRegister_v2(p, n, CU_MEMHOSTREGISTER_PORTABLE);
}
static CUresult kvf_hostunregister(struct kvf_cuda *l, int dev, void *p) {
	CTX(dev);
	return l->cuMemHostUnregister(p);
}
static CUresult kvf_copy(struct kvf_cuda *l, int dev, int dir, uint64_t dst, uint64_t src, size_t n, CUstream s) {
	CTX(dev);
	switch (dir) {
	case 1: return l->cuMemcpyHtoDAsync_v2(dst, (const void *)(uintptr_t)src, n, s);
	case 2: return l->cuMemcpyDtoHAsync_v2((void *)(uintptr_t)dst, src, n, s);
	case 3: return l->cuMemcpyDtoDAsync_v2(dst, src, n, s);
	}
	return 1;
}
// kvf_copy_sync copies between Go memory and the device and waits, all in
// one C call: cgo keeps the Go memory in place for exactly that long.
static CUresult kvf_copy_sync(struct kvf_cuda *l, int dev, int dir, void *host, uint64_t devptr, size_t n, CUstream s) {
	CTX(dev);
	CUresult r = dir == 1 ? l->cuMemcpyHtoDAsync_v2(devptr, host, n, s) : l->cuMemcpyDtoHAsync_v2(host, devptr, n, s);
	if (r) return r;
	return l->cuStreamSynchronize(s);
}
static CUresult kvf_copy2d(struct kvf_cuda *l, int dev, int dir, uint64_t dst, size_t dpitch, uint64_t src, size_t spitch, size_t width, size_t height, CUstream s) {
	CTX(dev);
	CUDA_MEMCPY2D c;
	memset(&c, 0, sizeof c);
	c.srcMemoryType = dir == 1 ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
	c.dstMemoryType = dir == 2 ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
	if (c.srcMemoryType == CU_MEMORYTYPE_HOST) c.srcHost = (const void *)(uintptr_t)src; else c.srcDevice = src;
	if (c.dstMemoryType == CU_MEMORYTYPE_HOST) c.dstHost = (void *)(uintptr_t)dst; else c.dstDevice = dst;
	c.srcPitch = spitch;
	c.dstPitch = dpitch;
	c.WidthInBytes = width;
	c.Height = height;
	return l->cuMemcpy2DAsync_v2(&c, s);
}
// The peer copies run on a stream of dev and name each side's primary
// context; both must be retained (PCTX).
#define PCTX(dev) \
	do { \
		if ((dev) < 0 || (dev) >= KVF_MAXDEV || !l->ctx[dev]) return 201; \
	} while (0)
static CUresult kvf_copy_peer(struct kvf_cuda *l, int dev, uint64_t dst, int dstdev, uint64_t src, int srcdev, size_t n, CUstream s) {
	PCTX(dstdev);
	PCTX(srcdev);
	CTX(dev);
	return l->cuMemcpyPeerAsync(dst, l->ctx[dstdev], src, l->ctx[srcdev], n, s);
}
static CUresult kvf_copy2d_peer(struct kvf_cuda *l, int dev, uint64_t dst, int dstdev, size_t dpitch, uint64_t src, int srcdev, size_t spitch, size_t width, size_t height, CUstream s) {
	PCTX(dstdev);
	PCTX(srcdev);
	CTX(dev);
	CUDA_MEMCPY3D_PEER c;
	memset(&c, 0, sizeof c);
	c.srcMemoryType = CU_MEMORYTYPE_DEVICE;
	c.srcDevice = src;
	c.srcContext = l->ctx[srcdev];
	c.srcPitch = spitch;
	c.srcHeight = height;
	c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
	c.dstDevice = dst;
	c.dstContext = l->ctx[dstdev];
	c.dstPitch = dpitch;
	c.dstHeight = height;
	c.WidthInBytes = width;
	c.Height = height;
	c.Depth = 1;
	return l->cuMemcpy3DPeerAsync(&c, s);
}
static CUresult kvf_pointer_device(struct kvf_cuda *l, int dev, CUdeviceptr p, int *ordinal) {
	CTX(dev);
	return l->cuPointerGetAttribute(ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p);
}
static CUresult kvf_stream_create(struct kvf_cuda *l, int dev, CUstream *s) {
	CTX(dev);
	return l->cuStreamCreate(s, CU_STREAM_NON_BLOCKING);
}
static CUresult kvf_stream_destroy(struct kvf_cuda *l, int dev, CUstream s) {
	CTX(dev);
	return l->cuStreamDestroy_v2(s);
}
static CUresult kvf_stream_sync(struct kvf_cuda *l, int dev, CUstream s) {
	CTX(dev);
	return l->cuStreamSynchronize(s);
}
static CUresult kvf_stream_wait(struct kvf_cuda *l, int dev, CUstream s, CUevent e) {
	CTX(dev);
	return l->cuStreamWaitEvent(s, e, 0);
}
static CUresult kvf_event_create(struct kvf_cuda *l, int dev, CUevent *e) {
	CTX(dev);
	return l->cuEventCreate(e, 2); // CU_EVENT_DISABLE_TIMING
}
static CUresult kvf_event_destroy(struct kvf_cuda *l, int dev, CUevent e) {
	CTX(dev);
	return l->cuEventDestroy_v2(e);
}
static CUresult kvf_event_record(struct kvf_cuda *l, int dev, CUevent e, CUstream s) {
	CTX(dev);
	return l->cuEventRecord(e, s);
}
static CUresult kvf_event_sync(struct kvf_cuda *l, int dev, CUevent e) {
	CTX(dev);
	return l->cuEventSynchronize(e);
}
static CUresult kvf_event_query(struct kvf_cuda *l, int dev, CUevent e) {
	CTX(dev);
	return l->cuEventQuery(e);
}
static CUresult kvf_ipc_get(struct kvf_cuda *l, int dev, CUdeviceptr p, void *out) {
	CTX(dev);
	return l->cuIpcGetMemHandle((CUipcMemHandle *)out, p);
}
static CUresult kvf_ipc_open(struct kvf_cuda *l, int dev, const void *h, CUdeviceptr *p) {
	CTX(dev);
	CUipcMemHandle hh;
	memcpy(&hh, h, sizeof hh);
	return l->cuIpcOpenMemHandle_v2(p, hh, 1); // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
}
static CUresult kvf_ipc_close(struct kvf_cuda *l, int dev, CUdeviceptr p) {
	CTX(dev);
	return l->cuIpcCloseMemHandle(p);
}
static CUresult kvf_dmabuf(struct kvf_cuda *l, int dev, CUdeviceptr p, size_t n, int *fd) {
	if (!l->cuMemGetHandleForAddressRange) return 801;
	CTX(dev);
	// Flags 0, as NCCL asks first.
	return l->cuMemGetHandleForAddressRange(fd, p, n, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
}
static CUresult kvf_init(struct kvf_cuda *l) { return l->cuInit(0); }
static CUresult kvf_count(struct kvf_cuda *l, int *n) { return l->cuDeviceGetCount(n); }
static const char *kvf_errname(struct kvf_cuda *l, CUresult r) {
	const char *s = NULL;
	if (l->cuGetErrorName(r, &s)) return NULL;
	return s;
}
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"
)

const maxDevices = C.KVF_MAXDEV

type (
	streamHandle = C.CUstream
	eventHandle  = C.CUevent
)

// lib is the loaded driver. Its methods are safe for concurrent use; the
// caller retains a device's context before using the device.
type lib struct {
	l *C.struct_kvf_cuda
}

func openLib(path string) (*lib, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var errbuf [512]C.char
	l := C.kvf_open(cpath, &errbuf[0], C.size_t(len(errbuf)))
	if l == nil {
		msg := C.GoString(&errbuf[0])
		if strings.HasPrefix(msg, "symbol ") { // kvf_open's words for a call dlsym did not find
			return nil, fmt.Errorf("cuda: load %s: %s: %w: %w", path, msg, ErrMissingCall, ErrNotSupported)
		}
		return nil, fmt.Errorf("cuda: load %s: %s: %w", path, msg, ErrNotSupported)
	}
	lb := &lib{l: l}
	if err := lb.check("cuInit", C.kvf_init(l)); err != nil {
		// Once cuInit ran, the library may have started threads: it stays
		// loaded (see lib.close).
		return nil, err
	}
	return lb, nil
}

// close forgets the library without unloading it: after cuInit a driver
// has threads running its code, and dlclose would pull it from under them.
func (lb *lib) close() {}

func (lb *lib) check(call string, r C.CUresult) error {
	if r == 0 {
		return nil
	}
	e := &Error{Call: call, Code: Result(r)}
	if s := C.kvf_errname(lb.l, r); s != nil {
		e.Name = C.GoString(s)
	}
	return e
}

func (lb *lib) deviceCount() (int, error) {
	var n C.int
	if err := lb.check("cuDeviceGetCount", C.kvf_count(lb.l, &n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

func (lb *lib) deviceInfo(dev int) (DeviceInfo, error) {
	var name [256]C.char
	var bus [64]C.char
	var total C.size_t
	var dmabuf C.int
	r := C.kvf_info(lb.l, C.int(dev), &name[0], C.int(len(name)), &total, &bus[0], C.int(len(bus)), &dmabuf)
	if err := lb.check("cuDeviceGet/Name/TotalMem/PCIBusId", r); err != nil {
		return DeviceInfo{}, err
	}
	return DeviceInfo{
		Index:       dev,
		Name:        C.GoString(&name[0]),
		TotalMemory: uint64(total),
		PCIBusID:    C.GoString(&bus[0]),
		Dmabuf:      dmabuf != 0,
	}, nil
}

func (lb *lib) retain(dev int) error {
	return lb.check("cuDevicePrimaryCtxRetain", C.kvf_retain(lb.l, C.int(dev)))
}

func (lb *lib) release(dev int) error {
	return lb.check("cuDevicePrimaryCtxRelease_v2", C.kvf_release(lb.l, C.int(dev)))
}

func (lb *lib) memInfo(dev int) (free, total uint64, err error) {
	var f, t C.size_t
	err = lb.check("cuMemGetInfo_v2", C.kvf_meminfo(lb.l, C.int(dev), &f, &t))
	return uint64(f), uint64(t), err
}

func (lb *lib) memAlloc(dev int, n uint64) (uint64, error) {
	var p C.CUdeviceptr
	if err := lb.check("cuMemAlloc_v2", C.kvf_alloc(lb.l, C.int(dev), &p, C.size_t(n))); err != nil {
		return 0, err
	}
	return uint64(p), nil
}

func (lb *lib) memFree(dev int, p uint64) error {
	return lb.check("cuMemFree_v2", C.kvf_free(lb.l, C.int(dev), C.CUdeviceptr(p)))
}

func (lb *lib) addressRange(dev int, p uint64) (base, size uint64, err error) {
	var b C.CUdeviceptr
	var s C.size_t
	err = lb.check("cuMemGetAddressRange_v2", C.kvf_range(lb.l, C.int(dev), C.CUdeviceptr(p), &b, &s))
	return uint64(b), uint64(s), err
}

func (lb *lib) hostAlloc(dev int, n uint64) (unsafe.Pointer, error) {
	var p unsafe.Pointer
	if err := lb.check("cuMemHostAlloc", C.kvf_hostalloc(lb.l, C.int(dev), &p, C.size_t(n))); err != nil {
		return nil, err
	}
	return p, nil
}

func (lb *lib) hostFree(dev int, p unsafe.Pointer) error {
	return lb.check("cuMemFreeHost", C.kvf_hostfree(lb.l, C.int(dev), p))
}

func (lb *lib) hostRegister(dev int, p unsafe.Pointer, n uint64) error {
	return lb.check("cuMemHostRegister_v2", C.kvf_hostregister(lb.l, C.int(dev), p, C.size_t(n)))
}

func (lb *lib) hostUnregister(dev int, p unsafe.Pointer) error {
	return lb.check("cuMemHostUnregister", C.kvf_hostunregister(lb.l, C.int(dev), p))
}

var copyCalls = [...]string{HostToDevice: "cuMemcpyHtoDAsync_v2", DeviceToHost: "cuMemcpyDtoHAsync_v2", DeviceToDevice: "cuMemcpyDtoDAsync_v2"}

func (lb *lib) copyAsync(dev int, dir Direction, dst, src, n uint64, s streamHandle) error {
	r := C.kvf_copy(lb.l, C.int(dev), C.int(dir), C.uint64_t(dst), C.uint64_t(src), C.size_t(n), s)
	return lb.check(copyCalls[dir], r)
}

// copySync copies between Go memory (host) and the device and returns when
// done. dir is HostToDevice or DeviceToHost.
func (lb *lib) copySync(dev int, dir Direction, host []byte, devptr uint64, s streamHandle) error {
	r := C.kvf_copy_sync(lb.l, C.int(dev), C.int(dir), unsafe.Pointer(unsafe.SliceData(host)), C.uint64_t(devptr), C.size_t(len(host)), s)
	return lb.check(copyCalls[dir]+"+cuStreamSynchronize", r)
}

func (lb *lib) copy2DAsync(dev int, c Copy2D, s streamHandle) error {
	r := C.kvf_copy2d(lb.l, C.int(dev), C.int(c.Dir), C.uint64_t(c.Dst), C.size_t(c.DstPitch),
		C.uint64_t(c.Src), C.size_t(c.SrcPitch), C.size_t(c.Width), C.size_t(c.Height), s)
	return lb.check("cuMemcpy2DAsync_v2", r)
}

func (lb *lib) copyPeerAsync(dev int, dst uint64, dstDev int, src uint64, srcDev int, n uint64, s streamHandle) error {
	r := C.kvf_copy_peer(lb.l, C.int(dev), C.uint64_t(dst), C.int(dstDev), C.uint64_t(src), C.int(srcDev), C.size_t(n), s)
	return lb.check("cuMemcpyPeerAsync", r)
}

// copy2DPeerAsync is a pitched copy between two devices' memory: a
// cuMemcpy3DPeerAsync of depth 1.
func (lb *lib) copy2DPeerAsync(dev int, c Copy2D, dstDev, srcDev int, s streamHandle) error {
	r := C.kvf_copy2d_peer(lb.l, C.int(dev), C.uint64_t(c.Dst), C.int(dstDev), C.size_t(c.DstPitch),
		C.uint64_t(c.Src), C.int(srcDev), C.size_t(c.SrcPitch), C.size_t(c.Width), C.size_t(c.Height), s)
	return lb.check("cuMemcpy3DPeerAsync", r)
}

// pointerDevice returns the GPU whose memory p is
// (CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL), asked in dev's context.
func (lb *lib) pointerDevice(dev int, p uint64) (int, error) {
	var o C.int
	r := C.kvf_pointer_device(lb.l, C.int(dev), C.CUdeviceptr(p), &o)
	return int(o), lb.check("cuPointerGetAttribute", r)
}

func (lb *lib) streamCreate(dev int) (streamHandle, error) {
	var s C.CUstream
	err := lb.check("cuStreamCreate", C.kvf_stream_create(lb.l, C.int(dev), &s))
	return s, err
}

func (lb *lib) streamDestroy(dev int, s streamHandle) error {
	return lb.check("cuStreamDestroy_v2", C.kvf_stream_destroy(lb.l, C.int(dev), s))
}

func (lb *lib) streamSync(dev int, s streamHandle) error {
	return lb.check("cuStreamSynchronize", C.kvf_stream_sync(lb.l, C.int(dev), s))
}

func (lb *lib) streamWait(dev int, s streamHandle, e eventHandle) error {
	return lb.check("cuStreamWaitEvent", C.kvf_stream_wait(lb.l, C.int(dev), s, e))
}

func (lb *lib) eventCreate(dev int) (eventHandle, error) {
	var e C.CUevent
	err := lb.check("cuEventCreate", C.kvf_event_create(lb.l, C.int(dev), &e))
	return e, err
}

func (lb *lib) eventDestroy(dev int, e eventHandle) error {
	return lb.check("cuEventDestroy_v2", C.kvf_event_destroy(lb.l, C.int(dev), e))
}

func (lb *lib) eventRecord(dev int, e eventHandle, s streamHandle) error {
	return lb.check("cuEventRecord", C.kvf_event_record(lb.l, C.int(dev), e, s))
}

func (lb *lib) eventSync(dev int, e eventHandle) error {
	return lb.check("cuEventSynchronize", C.kvf_event_sync(lb.l, C.int(dev), e))
}

// eventQuery reports whether the work before the event's last record has
// finished.
func (lb *lib) eventQuery(dev int, e eventHandle) (bool, error) {
	r := C.kvf_event_query(lb.l, C.int(dev), e)
	if Result(r) == ErrorNotReady {
		return false, nil
	}
	return true, lb.check("cuEventQuery", r)
}

func (lb *lib) ipcGet(dev int, p uint64) (IPCHandle, error) {
	var h IPCHandle
	r := C.kvf_ipc_get(lb.l, C.int(dev), C.CUdeviceptr(p), unsafe.Pointer(&h[0]))
	return h, lb.check("cuIpcGetMemHandle", r)
}

func (lb *lib) ipcOpen(dev int, h IPCHandle) (uint64, error) {
	var p C.CUdeviceptr
	r := C.kvf_ipc_open(lb.l, C.int(dev), unsafe.Pointer(&h[0]), &p)
	return uint64(p), lb.check("cuIpcOpenMemHandle_v2", r)
}

func (lb *lib) ipcClose(dev int, p uint64) error {
	return lb.check("cuIpcCloseMemHandle", C.kvf_ipc_close(lb.l, C.int(dev), C.CUdeviceptr(p)))
}

func (lb *lib) dmabuf(dev int, p, n uint64) (int, error) {
	var fd C.int
	r := C.kvf_dmabuf(lb.l, C.int(dev), C.CUdeviceptr(p), C.size_t(n), &fd)
	return int(fd), lb.check("cuMemGetHandleForAddressRange", r)
}
