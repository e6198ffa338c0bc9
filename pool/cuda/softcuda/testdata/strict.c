// strict.c: checks, at the driver API, the rules softcuda enforces as a GPU
// does. Run as "strict <case>"; it prints what went wrong and exits 1, or
// prints "ok". Built and run by TestStrict.
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvf_cuda.h"

CUresult cuInit(unsigned int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuMemcpyHtoD_v2(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2(void *, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void *, CUdeviceptr, size_t, CUstream);
CUresult cuStreamCreate(CUstream *, unsigned int);
CUresult cuStreamDestroy_v2(CUstream);
CUresult cuStreamSynchronize(CUstream);
CUresult cuEventCreate(CUevent *, unsigned int);
CUresult cuEventRecord(CUevent, CUstream);
CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned int);
CUresult cuIpcGetMemHandle(CUipcMemHandle *, CUdeviceptr);
CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *, CUipcMemHandle, unsigned int);

static int fails;

#define WANT(call, want)                                                                         \
	do {                                                                                     \
		CUresult r_ = (call);                                                            \
		if (r_ != (want)) {                                                              \
			printf("%s:%d: %s = %d, want %d\n", __FILE__, __LINE__, #call, r_, (want)); \
			fails++;                                                                 \
		}                                                                                \
	} while (0)
#define OK(call) WANT(call, CUDA_SUCCESS)

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static CUcontext ctx[2];

static void up(int ndev) {
	OK(cuInit(0));
	for (int i = 0; i < ndev; i++) OK(cuDevicePrimaryCtxRetain(&ctx[i], i));
	OK(cuCtxSetCurrent(ctx[0]));
}

// SOFTCUDA_COPY_DELAY_US=1000000: destroying a stream with a copy queued
// returns at once; the copy still lands.
static void destroy_returns_at_once(void) {
	up(1);
	CUdeviceptr p;
	OK(cuMemAlloc_v2(&p, 4096));
	static char in[4096], out[4096];
	memset(in, 0x5a, sizeof in);
	CUstream s;
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(cuMemcpyHtoDAsync_v2(p, in, sizeof in, s));
	double t0 = now();
	OK(cuStreamDestroy_v2(s));
	double took = now() - t0;
	if (took > 0.5) {
		printf("cuStreamDestroy_v2 took %.3f s with a 1 s copy queued; a driver returns at once\n", took);
		fails++;
	}
	WANT(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
	OK(cuCtxSynchronize());
	OK(cuMemcpyDtoH_v2(out, p, sizeof out));
	if (memcmp(in, out, sizeof in)) {
		printf("the copy queued before the destroy did not land\n");
		fails++;
	}
}

// Fresh device memory is not zeroed.
static void garbage(void) {
	up(1);
	for (int i = 0; i < 2; i++) {
		CUdeviceptr p;
		static char out[8192];
		OK(cuMemAlloc_v2(&p, sizeof out));
		OK(cuMemcpyDtoH_v2(out, p, sizeof out));
		int zeros = 0;
		for (size_t j = 0; j < sizeof out; j++) zeros += out[j] == 0;
		if (zeros > (int)sizeof out / 64) {
			printf("fresh allocation %d: %d of %zu bytes zero\n", i, zeros, sizeof out);
			fails++;
		}
		OK(cuMemFree_v2(p));
	}
	// Past 64 MiB only the last MiB is filled (a sparse allocation of many
	// GiB stays cheap): the last 8 bytes of the first 64 MiB and of the
	// allocation hold the pattern, the 8 after the 64 MiB are zero.
	CUdeviceptr big;
	const size_t head = 64 << 20, size = 80 << 20;
	OK(cuMemAlloc_v2(&big, size));
	uint64_t at_head, past_head, at_end;
	OK(cuMemcpyDtoH_v2(&at_head, big + head - 8, 8));
	OK(cuMemcpyDtoH_v2(&past_head, big + head, 8));
	OK(cuMemcpyDtoH_v2(&at_end, big + size - 8, 8));
	if (!at_head || past_head || !at_end) {
		printf("80 MiB allocation: %#llx before 64 MiB, %#llx after, %#llx at the end; want pattern, 0, pattern\n",
		       (unsigned long long)at_head, (unsigned long long)past_head, (unsigned long long)at_end);
		fails++;
	}
	OK(cuMemFree_v2(big));
}

// SOFTCUDA_DEVICES=2: a stream or event belongs to the context it was made
// in; work queued on it under another context is refused. A stream may
// wait for another context's event.
static void other_context(void) {
	up(2);
	CUdeviceptr p;
	OK(cuMemAlloc_v2(&p, 4096));
	static char in[4096];
	CUstream s0, s1;
	CUevent e0, e1;
	OK(cuStreamCreate(&s0, CU_STREAM_NON_BLOCKING));
	OK(cuEventCreate(&e0, 2));
	OK(cuCtxSetCurrent(ctx[1]));
	OK(cuStreamCreate(&s1, CU_STREAM_NON_BLOCKING));
	OK(cuEventCreate(&e1, 2));
	WANT(cuMemcpyHtoDAsync_v2(p, in, sizeof in, s0), CUDA_ERROR_INVALID_HANDLE);
	WANT(cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
	WANT(cuEventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE);
	OK(cuEventRecord(e1, s1));
	OK(cuCtxSetCurrent(ctx[0]));
	OK(cuMemcpyHtoDAsync_v2(p, in, sizeof in, s0));
	OK(cuEventRecord(e0, s0));
	OK(cuStreamWaitEvent(s0, e1, 0));
	OK(cuCtxSetCurrent(ctx[1]));
	OK(cuStreamWaitEvent(s1, e0, 0));
	OK(cuStreamSynchronize(s1));
}

// Releasing the last reference to a primary context destroys its streams
// and frees its memory.
static void release_destroys(void) {
	up(1);
	size_t freeb, total;
	CUdeviceptr p;
	OK(cuMemAlloc_v2(&p, 1 << 20));
	CUstream s;
	OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
	OK(cuDevicePrimaryCtxRelease_v2(0));
	OK(cuDevicePrimaryCtxRetain(&ctx[0], 0));
	OK(cuCtxSetCurrent(ctx[0]));
	static char buf[64];
	WANT(cuMemcpyHtoD_v2(p, buf, sizeof buf), CUDA_ERROR_INVALID_VALUE);
	WANT(cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
	OK(cuMemGetInfo_v2(&freeb, &total));
	if (freeb != total) {
		printf("after the context went, %zu of %zu bytes free\n", freeb, total);
		fails++;
	}
}

// SOFTCUDA_FAIL=cuMemcpyHtoDAsync_v2=700@1: an illegal address is sticky:
// every later call fails with it until the context is destroyed.
static void sticky(void) {
	up(1);
	CUdeviceptr p;
	OK(cuMemAlloc_v2(&p, 4096));
	static char in[4096];
	WANT(cuMemcpyHtoDAsync_v2(p, in, sizeof in, NULL), CUDA_ERROR_ILLEGAL_ADDRESS);
	CUdeviceptr q;
	WANT(cuMemAlloc_v2(&q, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
	WANT(cuCtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
	WANT(cuMemcpyHtoD_v2(p, in, sizeof in), CUDA_ERROR_ILLEGAL_ADDRESS);
	OK(cuDevicePrimaryCtxRelease_v2(0));
	OK(cuDevicePrimaryCtxRetain(&ctx[0], 0));
	OK(cuCtxSetCurrent(ctx[0]));
	OK(cuMemAlloc_v2(&q, 4096));
}

// Memory freed by its owner stops working for a process that imported it:
// its next copy faults (CUDA_ERROR_ILLEGAL_ADDRESS, sticky).
static void ipc_after_free(void) {
	int h2c[2], c2h[2];
	if (pipe(h2c) || pipe(c2h)) exit(2);
	pid_t pid = fork();
	if (pid == 0) {
		up(1);
		CUipcMemHandle h;
		if (read(h2c[0], &h, sizeof h) != sizeof h) exit(2);
		CUdeviceptr p;
		OK(cuIpcOpenMemHandle_v2(&p, h, 1));
		static char out[4096];
		OK(cuMemcpyDtoH_v2(out, p, sizeof out));
		if (out[0] != 0x33) {
			printf("importer read %#x before the free, want 0x33\n", out[0]);
			fails++;
		}
		char c = 1;
		if (write(c2h[1], &c, 1) != 1 || read(h2c[0], &c, 1) != 1) exit(2);
		CUstream s;
		OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
		OK(cuMemcpyDtoHAsync_v2(out, p, sizeof out, s));
		WANT(cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
		WANT(cuMemAlloc_v2(&p, 4096), CUDA_ERROR_ILLEGAL_ADDRESS);
		fflush(stdout);
		_exit(fails ? 1 : 0);
	}
	up(1);
	CUdeviceptr p;
	OK(cuMemAlloc_v2(&p, 4096));
	static char in[4096];
	memset(in, 0x33, sizeof in);
	OK(cuMemcpyHtoD_v2(p, in, sizeof in));
	CUipcMemHandle h;
	OK(cuIpcGetMemHandle(&h, p));
	char c;
	if (write(h2c[1], &h, sizeof h) != sizeof h || read(c2h[0], &c, 1) != 1) exit(2);
	OK(cuMemFree_v2(p));
	if (write(h2c[1], &c, 1) != 1) exit(2);
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st)) {
		printf("importer failed\n");
		fails++;
	}
}

int main(int argc, char **argv) {
	static const struct {
		const char *name;
		void (*fn)(void);
	} cases[] = {
		{"destroy_returns_at_once", destroy_returns_at_once},
		{"garbage", garbage},
		{"other_context", other_context},
		{"release_destroys", release_destroys},
		{"sticky", sticky},
		{"ipc_after_free", ipc_after_free},
	};
	if (argc != 2) return 2;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
		if (!strcmp(cases[i].name, argv[1])) {
			cases[i].fn();
			if (!fails) printf("ok\n");
			return fails ? 1 : 0;
		}
	printf("no case %s\n", argv[1]);
	return 2;
}
