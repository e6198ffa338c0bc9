// softcuda: a software stand-in for the parts of the CUDA driver API that
// pool/cuda uses. See doc.go for what it models and the SOFTCUDA_* variables.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvf_cuda.h"

#define MAXDEV 16
#define IPC_MAGIC 0x31435049414353ULL /* "SCAIPC1" */
#define ATTR_DMA_BUF_SUPPORTED CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
#define ATTR_MAX_PITCH CU_DEVICE_ATTRIBUTE_MAX_PITCH
#define MAX_PITCH 2147483647ULL
#define ATTR_PCI_BUS_ID CU_DEVICE_ATTRIBUTE_PCI_BUS_ID
#define ATTR_PCI_DEVICE_ID CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID
#define ATTR_PCI_DOMAIN_ID CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID

// A primary context (one per device).
struct CUctx_st {
	int dev;
	int refs;
	uint64_t gen; // moves when the last reference goes and the context is destroyed
};

struct ipchandle {
	uint64_t magic;
	int32_t pid, fd;
	uint64_t ino, size;
	int32_t dev;
	char pad[64 - 40];
};

// An allocation: the "device" address is mapped PROT_NONE; shadow is the
// library's own view of the same memfd pages.
struct alloc {
	struct alloc *next;
	uint64_t base, size;
	char *shadow;
	int fd, dev, ipc;
	uint64_t ino;
};

struct hostreg {
	struct hostreg *next;
	uintptr_t base;
	size_t size;
	int hostalloc;
};

struct op;
struct CUevent_st {
	struct CUctx_st *ctx; // the context current at creation
	uint64_t cgen;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	uint64_t recorded, completed;
};

enum { OP_COPY, OP_COPY2D, OP_RECORD, OP_WAIT, OP_STOP };
struct op {
	struct op *next;
	int kind;
	char *dst;
	const char *src;
	size_t n, dpitch, spitch, height;
	struct CUevent_st *ev;
	uint64_t gen;
	int dev;	// the device whose sticky error a fault sets
	int fds[2];	// memfds of imported memory it touches (-1: none)
	uint64_t sizes[2];
};

struct CUstream_st {
	struct CUstream_st *next;
	struct CUctx_st *ctx; // the context current at creation (NULL: the NULL stream)
	uint64_t cgen;	   // ctx->gen at creation
	int dead;	   // destroyed: unknown to every call, its queue still runs
	int exited;	   // its worker has returned
	pthread_t thr;
	pthread_mutex_t mu;
	pthread_cond_t cond;
	struct op *head, *tail;
	uint64_t queued, done;
};

static pthread_mutex_t gmu = PTHREAD_MUTEX_INITIALIZER;
static int initialized, ndev = 1;
static uint64_t memsize = 1ULL << 30, used[MAXDEV];
static char busids[MAXDEV][32];
static int dmabuf = 1;
enum { IPC_ANY, IPC_PROC, IPC_PIDFD };
static int ipc_open = IPC_ANY;
static long delay_us;
static int strict_device; // SOFTCUDA_STRICT_DEVICE
static struct CUctx_st ctxs[MAXDEV];
static struct alloc *allocs;
static struct hostreg *hostregs;
static struct CUstream_st *streams, *defstream;
static __thread CUcontext current;
// A fault (an access to memory its owner freed, or an injected sticky code)
// leaves the device's context unusable: every later call returns the error,
// until the last primary-context reference goes.
static CUresult sticky[MAXDEV];
// Imported (IPC) memory a call's copy touches, gathered while its addresses
// resolve: the copy checks at run time that the owner has not freed it.
static __thread int tl_fds[2], tl_nfd;
static __thread uint64_t tl_sizes[2];

struct fail { char name[64]; int code; long nth; long calls; };
static struct fail fails[32];
static int nfails;

// bad reports a malformed SOFTCUDA_* variable on stderr; cuInit then fails
// with CUDA_ERROR_INVALID_VALUE rather than run a test on settings it did
// not ask for.
static int bad(const char *name, const char *value, const char *why) {
	fprintf(stderr, "softcuda: %s=%s: %s\n", name, value, why);
	return -1;
}

static int parse_num(const char *s, unsigned long long *v, int suffix) {
	char *end;
	errno = 0;
	if (*s == '-') return -1;
	*v = strtoull(s, &end, 0);
	if (errno || end == s) return -1;
	if (suffix && *end) {
		int shift = 0;
		switch (*end) {
		case 'K': case 'k': shift = 10; break;
		case 'M': case 'm': shift = 20; break;
		case 'G': case 'g': shift = 30; break;
		default: return -1;
		}
		if (*v > (~0ULL >> shift)) return -1;
		*v <<= shift;
		end++;
	}
	return *end ? -1 : 0;
}

static int parse_env(void) {
	const char *s;
	unsigned long long v;
	ndev = 1;
	memsize = 1ULL << 30;
	dmabuf = 1;
	delay_us = 0;
	strict_device = 0;
	nfails = 0;
	ipc_open = IPC_ANY;
	if ((s = getenv("SOFTCUDA_IPC_OPEN")) && *s) {
		if (!strcmp(s, "proc")) ipc_open = IPC_PROC;
		else if (!strcmp(s, "pidfd")) ipc_open = IPC_PIDFD;
		else if (strcmp(s, "any")) return bad("SOFTCUDA_IPC_OPEN", s, "not proc, pidfd or any");
	}
	if ((s = getenv("SOFTCUDA_DEVICES")) && *s) {
		if (parse_num(s, &v, 0)) return bad("SOFTCUDA_DEVICES", s, "not a number");
		if (v > MAXDEV) return bad("SOFTCUDA_DEVICES", s, "more than 16 devices");
		ndev = (int)v;
	}
	if ((s = getenv("SOFTCUDA_MEMORY")) && *s) {
		if (parse_num(s, &v, 1) || v == 0) return bad("SOFTCUDA_MEMORY", s, "not a positive size (bytes, or with K, M or G)");
		memsize = v;
	}
	for (int i = 0; i < MAXDEV; i++) snprintf(busids[i], sizeof busids[i], "00000000:%02X:00.0", 0x18 + i * 0x10);
	if ((s = getenv("SOFTCUDA_PCI_BUS_IDS")) && *s) {
		char buf[1024];
		snprintf(buf, sizeof buf, "%s", s);
		char *save, *tok = strtok_r(buf, ",", &save);
		for (int i = 0; tok; i++, tok = strtok_r(NULL, ",", &save)) {
			unsigned dom, bus, dv, fn;
			char extra;
			if (i >= MAXDEV) return bad("SOFTCUDA_PCI_BUS_IDS", s, "more than 16 ids");
			if (strlen(tok) >= sizeof busids[i] || sscanf(tok, "%x:%x:%x.%x%c", &dom, &bus, &dv, &fn, &extra) != 4)
				return bad("SOFTCUDA_PCI_BUS_IDS", s, "an id is not domain:bus:device.function");
			snprintf(busids[i], sizeof busids[i], "%s", tok);
		}
	}
	if ((s = getenv("SOFTCUDA_DMABUF")) && *s) {
		if (strcmp(s, "0") && strcmp(s, "1")) return bad("SOFTCUDA_DMABUF", s, "not 0 or 1");
		dmabuf = *s == '1';
	}
	if ((s = getenv("SOFTCUDA_STRICT_DEVICE")) && *s) strict_device = strcmp(s, "0") != 0;
	if ((s = getenv("SOFTCUDA_COPY_DELAY_US")) && *s) {
		if (parse_num(s, &v, 0) || v > 60000000) return bad("SOFTCUDA_COPY_DELAY_US", s, "not a number of microseconds up to 60 s");
		delay_us = (long)v;
	}
	if ((s = getenv("SOFTCUDA_FAIL")) && *s) {
		char buf[1024];
		snprintf(buf, sizeof buf, "%s", s);
		char *save, *tok = strtok_r(buf, ",", &save);
		for (; tok; tok = strtok_r(NULL, ",", &save)) {
			if (nfails == 32) return bad("SOFTCUDA_FAIL", s, "more than 32 entries");
			char *eq = strchr(tok, '=');
			if (!eq || eq == tok || eq - tok >= 64) return bad("SOFTCUDA_FAIL", s, "an entry is not name=code or name=code@n");
			*eq = 0;
			char *at = strchr(eq + 1, '@');
			if (at) *at = 0;
			struct fail *f = &fails[nfails];
			if (parse_num(eq + 1, &v, 0) || v == 0 || v > 100000) return bad("SOFTCUDA_FAIL", s, "a code is not a CUresult");
			f->code = (int)v;
			f->nth = 0;
			if (at && (parse_num(at + 1, &v, 0) || v == 0)) return bad("SOFTCUDA_FAIL", s, "n in name=code@n is not a positive count");
			if (at) f->nth = (long)v;
			snprintf(f->name, sizeof f->name, "%s", tok);
			nfails++;
		}
	}
	return 0;
}

// injected returns the error code SOFTCUDA_FAIL asks this call to fail with.
static CUresult injected(const char *name) {
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&gmu);
	for (int i = 0; i < nfails; i++) {
		struct fail *f = &fails[i];
		if (strcmp(f->name, name)) continue;
		f->calls++;
		if (f->nth == 0 || f->nth == f->calls) r = f->code;
	}
	pthread_mutex_unlock(&gmu);
	return r;
}

static int is_sticky(CUresult r) {
	return r == CUDA_ERROR_ILLEGAL_ADDRESS || r == 214 /* ECC_UNCORRECTABLE */ || r == 719 /* LAUNCH_FAILED */;
}

static CUresult sticky_of(int dev) {
	return __atomic_load_n(&sticky[dev], __ATOMIC_ACQUIRE);
}

// sticky_applies: device queries and context management still work in a
// faulted context (so that its last reference can go).
static int sticky_applies(const char *name) {
	return strncmp(name, "cuDevice", 8) && strcmp(name, "cuCtxSetCurrent");
}

static void set_sticky(int dev, CUresult r) {
	CUresult zero = CUDA_SUCCESS;
	__atomic_compare_exchange_n(&sticky[dev], &zero, r, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

#define ENTER(name)                                             \
	do {                                                    \
		if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; \
		CUresult r_ = injected(name);                   \
		if (r_ && is_sticky(r_) && current) set_sticky(current->dev, r_); \
		if (r_) return r_;                              \
		if (current && sticky_applies(name) && (r_ = sticky_of(current->dev))) return r_; \
	} while (0)
#define NEEDCTX()                                                \
	do {                                                     \
		if (!current) return CUDA_ERROR_INVALID_CONTEXT; \
		tl_nfd = 0;                                      \
	} while (0)

// find returns the allocation holding [p, p+n); callers hold gmu.
static struct alloc *find(CUdeviceptr p, size_t n) {
	for (struct alloc *a = allocs; a; a = a->next)
		if (p >= a->base && p < a->base + a->size) return (n <= a->base + a->size - p) ? a : NULL;
	return NULL;
}

// note_ipc records imported memory a copy being built touches; callers
// hold gmu.
static void note_ipc(struct alloc *a) {
	if (a && a->ipc && tl_nfd < 2) {
		tl_fds[tl_nfd] = a->fd;
		tl_sizes[tl_nfd++] = a->size;
	}
}

static char *shadow_of(CUdeviceptr p, size_t n) {
	pthread_mutex_lock(&gmu);
	struct alloc *a = find(p, n);
	note_ipc(a);
	char *s = a ? a->shadow + (p - a->base) : NULL;
	pthread_mutex_unlock(&gmu);
	return s;
}

// shadow_on is shadow_of for memory that must belong to device dev.
static char *shadow_on(int dev, CUdeviceptr p, size_t n) {
	pthread_mutex_lock(&gmu);
	struct alloc *a = find(p, n);
	char *s = a && a->dev == dev ? a->shadow + (p - a->base) : NULL;
	if (s) note_ipc(a);
	pthread_mutex_unlock(&gmu);
	return s;
}

// copy_shadow resolves the device side of an ordinary (not peer) copy:
// memory of any GPU, as unified addressing lets a driver accept, or with
// SOFTCUDA_STRICT_DEVICE only the current context's GPU, so that a test
// proves each copy is issued on the GPU its memory is on and copies across
// GPUs are peer copies. The caller holds a context.
static char *copy_shadow(CUdeviceptr p, size_t n) {
	return strict_device ? shadow_on(current->dev, p, n) : shadow_of(p, n);
}

// ctx_ok reports whether c is a retained primary context.
static int ctx_ok(CUcontext c) {
	pthread_mutex_lock(&gmu);
	int ok = c && c >= &ctxs[0] && c < &ctxs[ndev] && c->refs > 0;
	pthread_mutex_unlock(&gmu);
	return ok;
}

// ---- streams

// freed_under reports whether memory a copy reads or writes was imported
// and has since been freed by its owner (its memfd truncated): on a GPU the
// copy faults, and the fault is sticky.
static int freed_under(const struct op *o) {
	for (int i = 0; i < 2; i++) {
		struct stat st;
		if (o->fds[i] >= 0 && (fstat(o->fds[i], &st) || (uint64_t)st.st_size < o->sizes[i])) return 1;
	}
	return 0;
}

static void run_op(struct op *o) {
	if (o->kind == OP_COPY || o->kind == OP_COPY2D) {
		// A faulted context runs nothing more; a copy through freed
		// memory faults it.
		if (sticky_of(o->dev)) return;
		if (freed_under(o)) {
			set_sticky(o->dev, CUDA_ERROR_ILLEGAL_ADDRESS);
			return;
		}
	}
	switch (o->kind) {
	case OP_COPY:
		if (delay_us) usleep(delay_us);
		memmove(o->dst, o->src, o->n);
		break;
	case OP_COPY2D:
		if (delay_us) usleep(delay_us);
		for (size_t y = 0; y < o->height; y++) memmove(o->dst + y * o->dpitch, o->src + y * o->spitch, o->n);
		break;
	case OP_RECORD:
		pthread_mutex_lock(&o->ev->mu);
		if (o->gen > o->ev->completed) o->ev->completed = o->gen;
		pthread_cond_broadcast(&o->ev->cond);
		pthread_mutex_unlock(&o->ev->mu);
		break;
	case OP_WAIT:
		pthread_mutex_lock(&o->ev->mu);
		while (o->ev->completed < o->gen) pthread_cond_wait(&o->ev->cond, &o->ev->mu);
		pthread_mutex_unlock(&o->ev->mu);
		break;
	}
}

static void *worker(void *arg) {
	struct CUstream_st *s = arg;
	for (;;) {
		pthread_mutex_lock(&s->mu);
		while (!s->head) pthread_cond_wait(&s->cond, &s->mu);
		struct op *o = s->head;
		pthread_mutex_unlock(&s->mu);
		int stop = o->kind == OP_STOP;
		if (!stop) run_op(o);
		pthread_mutex_lock(&s->mu);
		s->head = o->next;
		if (!s->head) s->tail = NULL;
		s->done++;
		if (stop) s->exited = 1;
		pthread_cond_broadcast(&s->cond);
		pthread_mutex_unlock(&s->mu);
		free(o);
		if (stop) return NULL;
	}
}

// op_new makes an operation for the current call, carrying the imported
// memory its addresses resolved to.
static struct op *op_new(int kind) {
	struct op *o = calloc(1, sizeof *o);
	if (!o) return NULL;
	o->kind = kind;
	o->dev = current ? current->dev : 0;
	o->fds[0] = o->fds[1] = -1;
	for (int i = 0; i < tl_nfd; i++) {
		o->fds[i] = tl_fds[i];
		o->sizes[i] = tl_sizes[i];
	}
	return o;
}

static struct CUstream_st *stream_new(void) {
	struct CUstream_st *s = calloc(1, sizeof *s);
	if (!s) return NULL;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cond, NULL);
	if (pthread_create(&s->thr, NULL, worker, s)) {
		free(s);
		return NULL;
	}
	return s;
}

static uint64_t enqueue(struct CUstream_st *s, struct op *o) {
	if (!s) s = defstream;
	pthread_mutex_lock(&s->mu);
	o->next = NULL;
	if (s->tail) s->tail->next = o; else s->head = o;
	s->tail = o;
	uint64_t ticket = ++s->queued;
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&s->mu);
	return ticket;
}

static void stream_wait(struct CUstream_st *s, uint64_t ticket) {
	if (!s) s = defstream;
	pthread_mutex_lock(&s->mu);
	while (s->done < ticket) pthread_cond_wait(&s->cond, &s->mu);
	pthread_mutex_unlock(&s->mu);
}

// stream_live reports whether s is the NULL stream or a stream not yet
// destroyed (itself or with its context).
static int stream_live(struct CUstream_st *s) {
	if (!s) return 1;
	pthread_mutex_lock(&gmu);
	struct CUstream_st *x = streams;
	while (x && x != s) x = x->next;
	int ok = x && !x->dead && x->cgen == x->ctx->gen;
	pthread_mutex_unlock(&gmu);
	return ok;
}

// stream_known reports whether work may be queued on s under the current
// context: a stream belongs to the context it was created in, and queueing
// on it under another context is CUDA_ERROR_INVALID_HANDLE.
static int stream_known(struct CUstream_st *s) {
	return stream_live(s) && (!s || s->ctx == current);
}

// ---- init and devices

CUresult cuInit(unsigned int flags) {
	if (flags) return CUDA_ERROR_INVALID_VALUE;
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&gmu);
	if (!initialized) {
		if (parse_env()) {
			pthread_mutex_unlock(&gmu);
			return CUDA_ERROR_INVALID_VALUE;
		}
		for (int i = 0; i < MAXDEV; i++) ctxs[i].dev = i;
		defstream = stream_new();
		if (!defstream) r = CUDA_ERROR_OUT_OF_MEMORY;
		else initialized = 1;
	}
	pthread_mutex_unlock(&gmu);
	if (r) return r;
	if ((r = injected("cuInit"))) return r;
	return ndev == 0 ? CUDA_ERROR_NO_DEVICE : CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *v) {
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	*v = 12040;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *n) {
	ENTER("cuDeviceGetCount");
	if (!n) return CUDA_ERROR_INVALID_VALUE;
	*n = ndev;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *d, int ordinal) {
	ENTER("cuDeviceGet");
	if (!d) return CUDA_ERROR_INVALID_VALUE;
	if (ordinal < 0 || ordinal >= ndev) return CUDA_ERROR_INVALID_DEVICE;
	*d = ordinal;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice d) {
	ENTER("cuDeviceGetName");
	if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, len, "softcuda GPU %d", d);
	return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) {
	ENTER("cuDeviceTotalMem_v2");
	if (!bytes) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
	*bytes = memsize;
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetPCIBusId(char *id, int len, CUdevice d) {
	ENTER("cuDeviceGetPCIBusId");
	if (!id || len <= 0) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
	snprintf(id, len, "%s", busids[d]);
	return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d) {
	ENTER("cuDeviceGetAttribute");
	if (!v) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
	unsigned dom = 0, bus = 0, dv = 0;
	sscanf(busids[d], "%x:%x:%x", &dom, &bus, &dv);
	switch (attr) {
	case ATTR_DMA_BUF_SUPPORTED: *v = dmabuf; break;
	case ATTR_MAX_PITCH: *v = (int)MAX_PITCH; break;
	case ATTR_PCI_BUS_ID: *v = bus; break;
	case ATTR_PCI_DEVICE_ID: *v = dv; break;
	case ATTR_PCI_DOMAIN_ID: *v = dom; break;
	default: return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}

static void ctx_destroy(int d);

CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) {
	ENTER("cuDevicePrimaryCtxRetain");
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
	pthread_mutex_lock(&gmu);
	ctxs[d].refs++;
	pthread_mutex_unlock(&gmu);
	*c = &ctxs[d];
	return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) {
	ENTER("cuDevicePrimaryCtxRelease_v2");
	if (d < 0 || d >= ndev) return CUDA_ERROR_INVALID_DEVICE;
	CUresult r = CUDA_SUCCESS;
	pthread_mutex_lock(&gmu);
	int last = 0;
	if (ctxs[d].refs <= 0) r = CUDA_ERROR_INVALID_CONTEXT;
	else last = --ctxs[d].refs == 0;
	pthread_mutex_unlock(&gmu);
	if (last) ctx_destroy(d);
	return r;
}

CUresult cuCtxSetCurrent(CUcontext c) {
	ENTER("cuCtxSetCurrent");
	if (c && (c < &ctxs[0] || c >= &ctxs[ndev] || c->refs <= 0)) return CUDA_ERROR_INVALID_CONTEXT;
	current = c;
	return CUDA_SUCCESS;
}

// sync_all waits for the work queued so far on every stream.
// Destroyed streams stay on the list until their queues have run (so that
// a free waits for them too); their structures are never freed, as a
// sync_all may still hold them.
static void sync_all(void) {
	pthread_mutex_lock(&gmu);
	int n = 1;
	for (struct CUstream_st *s = streams; s; s = s->next) n++;
	struct CUstream_st **list = malloc(n * sizeof *list);
	if (!list) {
		pthread_mutex_unlock(&gmu);
		return;
	}
	n = 0;
	for (struct CUstream_st *s = streams; s; s = s->next) list[n++] = s;
	list[n++] = defstream;
	pthread_mutex_unlock(&gmu);
	for (int i = 0; i < n; i++) {
		pthread_mutex_lock(&list[i]->mu);
		uint64_t t = list[i]->queued;
		pthread_mutex_unlock(&list[i]->mu);
		stream_wait(list[i], t);
	}
	free(list);
}

static void stream_stop(struct CUstream_st *s);
static void free_alloc(struct alloc *a);

// ctx_destroy runs when the last reference to device d's primary context
// goes: its streams are destroyed and its memory (allocated or imported)
// freed, after the work already queued, and a fault it held is cleared.
// Handles made under it stay unknown to the next context.
static void ctx_destroy(int d) {
	sync_all();
	pthread_mutex_lock(&gmu);
	if (ctxs[d].refs > 0) { // retained again meanwhile
		pthread_mutex_unlock(&gmu);
		return;
	}
	ctxs[d].gen++;
	for (struct CUstream_st *s = streams; s; s = s->next)
		if (s->ctx == &ctxs[d] && !s->dead) stream_stop(s);
	struct alloc **pp = &allocs, *a, *gone = NULL;
	while ((a = *pp)) {
		if (a->dev == d) {
			*pp = a->next;
			a->next = gone;
			gone = a;
		} else {
			pp = &a->next;
		}
	}
	used[d] = 0;
	__atomic_store_n(&sticky[d], CUDA_SUCCESS, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&gmu);
	while ((a = gone)) {
		gone = a->next;
		free_alloc(a);
	}
}

CUresult cuCtxSynchronize(void) {
	ENTER("cuCtxSynchronize");
	NEEDCTX();
	sync_all();
	return sticky_of(current->dev);
}

// ---- device memory

static CUresult map_alloc(int fd, uint64_t size, int dev, int ipc, CUdeviceptr *out) {
	void *dv = mmap(NULL, size, PROT_NONE, MAP_SHARED, fd, 0);
	if (dv == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
	void *sh = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (sh == MAP_FAILED) {
		munmap(dv, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	struct stat st;
	fstat(fd, &st);
	struct alloc *a = calloc(1, sizeof *a);
	if (!a) {
		munmap(dv, size);
		munmap(sh, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	a->base = (uintptr_t)dv;
	a->size = size;
	a->shadow = sh;
	a->fd = fd;
	a->dev = dev;
	a->ipc = ipc;
	a->ino = st.st_ino;
	pthread_mutex_lock(&gmu);
	a->next = allocs;
	allocs = a;
	pthread_mutex_unlock(&gmu);
	*out = a->base;
	return CUDA_SUCCESS;
}

// poison fills fresh memory with a pattern that is never all zeros (as a
// GPU hands out whatever its last user left): the first 64 MiB and the last
// MiB, so that a sparse allocation of many GiB costs no more than that.
static void poison(CUdeviceptr p, uint64_t size) {
	static uint64_t seq;
	pthread_mutex_lock(&gmu);
	struct alloc *a = find(p, 1);
	char *sh = a ? a->shadow : NULL;
	uint64_t x = ++seq * 0x9E3779B97F4A7C15ULL | 1;
	pthread_mutex_unlock(&gmu);
	if (!sh) return;
	uint64_t head = size < (64ULL << 20) ? size : (64ULL << 20);
	uint64_t tail = size - head < (1ULL << 20) ? size - head : (1ULL << 20);
	uint64_t *w = (uint64_t *)sh;
	for (uint64_t i = 0; i < head / 8; i++) w[i] = x + i * 0x2545F4914F6CDD1DULL;
	w = (uint64_t *)(sh + size - tail);
	for (uint64_t i = 0; i < tail / 8; i++) w[i] = ~x - i;
}

static uint64_t page_round(uint64_t n) {
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
	return (n + pg - 1) & ~(pg - 1);
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	ENTER("cuMemAlloc_v2");
	NEEDCTX();
	if (!p || n == 0) return CUDA_ERROR_INVALID_VALUE;
	uint64_t size = page_round(n);
	if (size < n) return CUDA_ERROR_OUT_OF_MEMORY;
	int dev = current->dev;
	pthread_mutex_lock(&gmu);
	int ok = size <= memsize - used[dev];
	if (ok) used[dev] += size;
	pthread_mutex_unlock(&gmu);
	if (!ok) return CUDA_ERROR_OUT_OF_MEMORY;
	char name[32];
	snprintf(name, sizeof name, "softcuda-gpu%d", dev);
	int fd = memfd_create(name, MFD_CLOEXEC);
	CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
	if (fd >= 0 && ftruncate(fd, size) == 0) r = map_alloc(fd, size, dev, 0, p);
	if (!r) poison(*p, size);
	if (r) {
		if (fd >= 0) close(fd);
		pthread_mutex_lock(&gmu);
		used[dev] -= size;
		pthread_mutex_unlock(&gmu);
	}
	return r;
}

// unmap_alloc frees after the work already queued, as the driver's free
// synchronises with the device, so no queued copy touches unmapped pages.
static CUresult unmap_alloc(CUdeviceptr p, int ipc) {
	sync_all();
	pthread_mutex_lock(&gmu);
	struct alloc **pp = &allocs, *a;
	while ((a = *pp) && a->base != p) pp = &a->next;
	if (!a || a->ipc != ipc) {
		pthread_mutex_unlock(&gmu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	*pp = a->next;
	if (!ipc) used[a->dev] -= a->size;
	pthread_mutex_unlock(&gmu);
	free_alloc(a);
	return CUDA_SUCCESS;
}

// free_alloc unmaps an allocation. Memory freed by its owner is truncated:
// processes that imported it (IPC) fault on their next copy, and an RDMA
// registration of it (dma-buf) reads nothing more, as on a GPU, where the
// physical pages go back to the driver.
static void free_alloc(struct alloc *a) {
	if (!a->ipc && ftruncate(a->fd, 0) != 0) perror("softcuda: truncate freed memory");
	munmap((void *)(uintptr_t)a->base, a->size);
	munmap(a->shadow, a->size);
	close(a->fd);
	free(a);
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	ENTER("cuMemFree_v2");
	NEEDCTX();
	return unmap_alloc(p, 0);
}

CUresult cuMemGetInfo_v2(size_t *freeb, size_t *total) {
	ENTER("cuMemGetInfo_v2");
	NEEDCTX();
	if (!freeb || !total) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&gmu);
	*freeb = memsize - used[current->dev];
	*total = memsize;
	pthread_mutex_unlock(&gmu);
	return CUDA_SUCCESS;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p) {
	ENTER("cuMemGetAddressRange_v2");
	NEEDCTX();
	pthread_mutex_lock(&gmu);
	struct alloc *a = find(p, 1);
	if (a) {
		if (base) *base = a->base;
		if (size) *size = a->size;
	}
	pthread_mutex_unlock(&gmu);
	return a ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ---- host memory

static CUresult add_hostreg(uintptr_t base, size_t size, int hostalloc) {
	pthread_mutex_lock(&gmu);
	for (struct hostreg *h = hostregs; h; h = h->next)
		if (base < h->base + h->size && h->base < base + size) {
			pthread_mutex_unlock(&gmu);
			return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
		}
	struct hostreg *h = calloc(1, sizeof *h);
	if (!h) {
		pthread_mutex_unlock(&gmu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	h->base = base;
	h->size = size;
	h->hostalloc = hostalloc;
	h->next = hostregs;
	hostregs = h;
	pthread_mutex_unlock(&gmu);
	return CUDA_SUCCESS;
}

static int del_hostreg(uintptr_t base, int hostalloc, size_t *size) {
	pthread_mutex_lock(&gmu);
	struct hostreg **pp = &hostregs, *h;
	while ((h = *pp) && !(h->base == base && h->hostalloc == hostalloc)) pp = &h->next;
	if (h) {
		*pp = h->next;
		*size = h->size;
		free(h);
	}
	pthread_mutex_unlock(&gmu);
	return h != NULL;
}

CUresult cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
	ENTER("cuMemHostAlloc");
	NEEDCTX();
	if (!p || n == 0 || (flags & ~0x7u)) return CUDA_ERROR_INVALID_VALUE;
	size_t size = page_round(n);
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
	CUresult r = add_hostreg((uintptr_t)m, size, 1);
	if (r) {
		munmap(m, size);
		return r;
	}
	*p = m;
	return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *p) {
	ENTER("cuMemFreeHost");
	NEEDCTX();
	size_t size;
	if (!del_hostreg((uintptr_t)p, 1, &size)) return CUDA_ERROR_INVALID_VALUE;
	munmap(p, size);
	return CUDA_SUCCESS;
}

CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned int flags) {
	ENTER("cuMemHostRegister_v2");
	NEEDCTX();
	if (!p || n == 0 || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
	return add_hostreg((uintptr_t)p, n, 0);
}

CUresult cuMemHostUnregister(void *p) {
	ENTER("cuMemHostUnregister");
	NEEDCTX();
	size_t size;
	if (!del_hostreg((uintptr_t)p, 0, &size)) return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
	return CUDA_SUCCESS;
}

// ---- copies

static CUresult copy(char *dst, const char *src, size_t n, CUstream s) {
	if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
	if (!stream_known(s)) return CUDA_ERROR_INVALID_HANDLE;
	if (n == 0) return CUDA_SUCCESS;
	struct op *o = op_new(OP_COPY);
	if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
	o->dst = dst;
	o->src = src;
	o->n = n;
	enqueue(s, o);
	return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
	ENTER("cuMemcpyHtoDAsync_v2");
	NEEDCTX();
	return copy(copy_shadow(dst, n), src, n, s);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s) {
	ENTER("cuMemcpyDtoHAsync_v2");
	NEEDCTX();
	return copy(dst, copy_shadow(src, n), n, s);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
	ENTER("cuMemcpyDtoDAsync_v2");
	NEEDCTX();
	return copy(copy_shadow(dst, n), copy_shadow(src, n), n, s);
}

// The synchronous copies run behind everything queued so far (the legacy
// NULL stream's ordering) and return once their bytes have moved.
static CUresult copy_sync(char *dst, const char *src, size_t n) {
	if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
	if (n == 0) return CUDA_SUCCESS;
	sync_all();
	struct op *o = op_new(OP_COPY);
	if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
	o->dst = dst;
	o->src = src;
	o->n = n;
	stream_wait(defstream, enqueue(NULL, o));
	return sticky_of(current->dev);
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	ENTER("cuMemcpyHtoD_v2");
	NEEDCTX();
	return copy_sync(copy_shadow(dst, n), src, n);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	ENTER("cuMemcpyDtoH_v2");
	NEEDCTX();
	return copy_sync(dst, copy_shadow(src, n), n);
}

enum { MT_HOST = CU_MEMORYTYPE_HOST, MT_DEVICE = CU_MEMORYTYPE_DEVICE };

// side resolves one end of a 2-D copy to the address of its first byte,
// checking that the whole pitched extent lies in one allocation.
static char *side(int type, const void *host, CUdeviceptr dev, size_t x, size_t y, size_t pitch, size_t w, size_t h) {
	size_t start, extent;
	// An extent that wraps would pass the allocation check: refuse it.
	if (__builtin_mul_overflow(y, pitch, &start) || __builtin_add_overflow(start, x, &start) ||
	    __builtin_mul_overflow(h - 1, pitch, &extent) || __builtin_add_overflow(extent, w, &extent))
		return NULL;
	if (type == MT_HOST) return host ? (char *)host + start : NULL;
	if (type != MT_DEVICE) return NULL;
	return copy_shadow(dev + start, extent);
}

CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream s) {
	ENTER("cuMemcpy2DAsync_v2");
	NEEDCTX();
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if (c->WidthInBytes == 0 || c->Height == 0) return CUDA_SUCCESS;
	// Pitches are limited (CU_DEVICE_ATTRIBUTE_MAX_PITCH); the driver refuses
	// wider ones, and pitches narrower than a row.
	if (c->srcPitch > MAX_PITCH || c->dstPitch > MAX_PITCH) return CUDA_ERROR_INVALID_VALUE;
	// The driver refuses pitches narrower than a row.
	if (c->srcPitch < c->WidthInBytes + c->srcXInBytes && c->Height > 1) return CUDA_ERROR_INVALID_VALUE;
	if (c->dstPitch < c->WidthInBytes + c->dstXInBytes && c->Height > 1) return CUDA_ERROR_INVALID_VALUE;
	char *dst = side(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstXInBytes, c->dstY, c->dstPitch, c->WidthInBytes, c->Height);
	const char *src = side(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcXInBytes, c->srcY, c->srcPitch, c->WidthInBytes, c->Height);
	if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
	if (!stream_known(s)) return CUDA_ERROR_INVALID_HANDLE;
	struct op *o = op_new(OP_COPY2D);
	if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
	o->dst = dst;
	o->src = src;
	o->n = c->WidthInBytes;
	o->dpitch = c->dstPitch;
	o->spitch = c->srcPitch;
	o->height = c->Height;
	enqueue(s, o);
	return CUDA_SUCCESS;
}

// A peer copy names each side's context; each pointer must lie, whole, in
// memory of its context's device.
CUresult cuMemcpyPeerAsync(CUdeviceptr dst, CUcontext dctx, CUdeviceptr src, CUcontext sctx, size_t n, CUstream s) {
	ENTER("cuMemcpyPeerAsync");
	NEEDCTX();
	if (!ctx_ok(dctx) || !ctx_ok(sctx)) return CUDA_ERROR_INVALID_CONTEXT;
	if (n == 0) return stream_known(s) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
	return copy(shadow_on(dctx->dev, dst, n), shadow_on(sctx->dev, src, n), n, s);
}

// side3d resolves one end of a 3-D peer copy to its first byte, checking
// that the whole extent (depth slices of rows rows) lies in memory of the
// context's device.
static char *side3d(int type, const void *host, CUdeviceptr dev, CUcontext c, size_t x, size_t y, size_t z,
		    size_t pitch, size_t rows, size_t w, size_t h, size_t d) {
	if (d > 1 && (rows < h || rows - h < y)) return NULL;
	size_t slice = 0, start, extent, t;
	// An extent that wraps would pass the allocation check: refuse it.
	if ((d > 1 && __builtin_mul_overflow(rows, pitch, &slice)) ||
	    __builtin_mul_overflow(z, slice, &start) || __builtin_mul_overflow(y, pitch, &t) ||
	    __builtin_add_overflow(start, t, &start) || __builtin_add_overflow(start, x, &start) ||
	    __builtin_mul_overflow(d - 1, slice, &extent) || __builtin_mul_overflow(h - 1, pitch, &t) ||
	    __builtin_add_overflow(extent, t, &extent) || __builtin_add_overflow(extent, w, &extent))
		return NULL;
	if (type == MT_HOST) return host ? (char *)host + start : NULL;
	if (type != MT_DEVICE || !c) return NULL;
	return shadow_on(c->dev, dev + start, extent);
}

CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *c, CUstream s) {
	ENTER("cuMemcpy3DPeerAsync");
	NEEDCTX();
	if (!c) return CUDA_ERROR_INVALID_VALUE;
	if ((c->srcMemoryType == MT_DEVICE && !ctx_ok(c->srcContext)) || (c->dstMemoryType == MT_DEVICE && !ctx_ok(c->dstContext)))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c->WidthInBytes == 0 || c->Height == 0 || c->Depth == 0) return CUDA_SUCCESS;
	if (c->srcLOD || c->dstLOD || c->srcArray || c->dstArray) return CUDA_ERROR_INVALID_VALUE;
	if (c->srcPitch > MAX_PITCH || c->dstPitch > MAX_PITCH) return CUDA_ERROR_INVALID_VALUE;
	if (c->srcPitch < c->WidthInBytes + c->srcXInBytes && (c->Height > 1 || c->Depth > 1)) return CUDA_ERROR_INVALID_VALUE;
	if (c->dstPitch < c->WidthInBytes + c->dstXInBytes && (c->Height > 1 || c->Depth > 1)) return CUDA_ERROR_INVALID_VALUE;
	char *dst = side3d(c->dstMemoryType, c->dstHost, c->dstDevice, c->dstContext, c->dstXInBytes, c->dstY, c->dstZ,
			   c->dstPitch, c->dstHeight, c->WidthInBytes, c->Height, c->Depth);
	const char *src = side3d(c->srcMemoryType, c->srcHost, c->srcDevice, c->srcContext, c->srcXInBytes, c->srcY, c->srcZ,
				 c->srcPitch, c->srcHeight, c->WidthInBytes, c->Height, c->Depth);
	if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
	if (!stream_known(s)) return CUDA_ERROR_INVALID_HANDLE;
	for (size_t z = 0; z < c->Depth; z++) {
		struct op *o = op_new(OP_COPY2D);
		if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
		o->dst = dst + z * c->dstHeight * c->dstPitch;
		o->src = src + z * c->srcHeight * c->srcPitch;
		o->n = c->WidthInBytes;
		o->dpitch = c->dstPitch;
		o->spitch = c->srcPitch;
		o->height = c->Height;
		enqueue(s, o);
	}
	return CUDA_SUCCESS;
}

// cuPointerGetAttribute answers CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL only;
// memory that is not device memory is CUDA_ERROR_INVALID_VALUE.
CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
	ENTER("cuPointerGetAttribute");
	if (!data || attr != CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&gmu);
	struct alloc *a = find(p, 1);
	int dev = a ? a->dev : -1;
	pthread_mutex_unlock(&gmu);
	if (dev < 0) return CUDA_ERROR_INVALID_VALUE;
	*(int *)data = dev;
	return CUDA_SUCCESS;
}

// ---- streams and events

CUresult cuStreamCreate(CUstream *out, unsigned int flags) {
	ENTER("cuStreamCreate");
	NEEDCTX();
	if (!out || flags > 1) return CUDA_ERROR_INVALID_VALUE;
	struct CUstream_st *s = stream_new();
	if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
	s->ctx = current;
	pthread_mutex_lock(&gmu);
	s->cgen = current->gen;
	// Streams destroyed whose queues have run leave the list (their
	// structures stay allocated: see sync_all).
	for (struct CUstream_st **pp = &streams; *pp;) {
		struct CUstream_st *x = *pp;
		pthread_mutex_lock(&x->mu);
		int gone = x->dead && x->exited;
		pthread_mutex_unlock(&x->mu);
		if (gone) *pp = x->next;
		else pp = &x->next;
	}
	s->next = streams;
	streams = s;
	pthread_mutex_unlock(&gmu);
	*out = s;
	return CUDA_SUCCESS;
}

// stream_stop marks s destroyed and lets its worker exit once the work
// queued has run; the caller holds gmu.
static void stream_stop(struct CUstream_st *s) {
	s->dead = 1;
	struct op *o = calloc(1, sizeof *o);
	if (o) {
		o->kind = OP_STOP;
		enqueue(s, o);
	}
	pthread_detach(s->thr);
}

// cuStreamDestroy_v2 returns at once, as on a real driver: the work queued
// still runs, and nothing waits for it. A caller that needs its bytes must
// synchronise first.
CUresult cuStreamDestroy_v2(CUstream s) {
	ENTER("cuStreamDestroy_v2");
	NEEDCTX();
	if (!s || !stream_live(s)) return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&gmu);
	stream_stop(s);
	pthread_mutex_unlock(&gmu);
	return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
	ENTER("cuStreamSynchronize");
	NEEDCTX();
	if (!stream_live(s)) return CUDA_ERROR_INVALID_HANDLE;
	struct CUstream_st *x = s ? s : defstream;
	pthread_mutex_lock(&x->mu);
	uint64_t t = x->queued;
	pthread_mutex_unlock(&x->mu);
	stream_wait(x, t);
	return sticky_of(current->dev);
}

CUresult cuStreamQuery(CUstream s) {
	ENTER("cuStreamQuery");
	NEEDCTX();
	if (!stream_live(s)) return CUDA_ERROR_INVALID_HANDLE;
	struct CUstream_st *x = s ? s : defstream;
	pthread_mutex_lock(&x->mu);
	int busy = x->done < x->queued;
	pthread_mutex_unlock(&x->mu);
	return busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

CUresult cuEventCreate(CUevent *out, unsigned int flags) {
	ENTER("cuEventCreate");
	NEEDCTX();
	if (!out || (flags & ~0xfu)) return CUDA_ERROR_INVALID_VALUE;
	struct CUevent_st *e = calloc(1, sizeof *e);
	if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_init(&e->mu, NULL);
	pthread_cond_init(&e->cond, NULL);
	e->ctx = current;
	e->cgen = current->gen;
	*out = e;
	return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent e) {
	ENTER("cuEventDestroy_v2");
	NEEDCTX();
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	// Work still queued may refer to the event: wait for it, as the real
	// driver defers the release.
	pthread_mutex_lock(&e->mu);
	while (e->completed < e->recorded) pthread_cond_wait(&e->cond, &e->mu);
	pthread_mutex_unlock(&e->mu);
	free(e);
	return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
	ENTER("cuEventRecord");
	NEEDCTX();
	// The event and the stream must belong to the current context.
	if (!e || !stream_known(s) || e->ctx != current || e->cgen != current->gen) return CUDA_ERROR_INVALID_HANDLE;
	struct op *o = op_new(OP_RECORD);
	if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&e->mu);
	o->gen = ++e->recorded;
	pthread_mutex_unlock(&e->mu);
	o->ev = e;
	enqueue(s, o);
	return CUDA_SUCCESS;
}

CUresult cuEventSynchronize(CUevent e) {
	ENTER("cuEventSynchronize");
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&e->mu);
	uint64_t want = e->recorded;
	while (e->completed < want) pthread_cond_wait(&e->cond, &e->mu);
	pthread_mutex_unlock(&e->mu);
	return sticky_of(e->ctx->dev);
}

CUresult cuEventQuery(CUevent e) {
	ENTER("cuEventQuery");
	if (!e) return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&e->mu);
	int ready = e->completed >= e->recorded;
	pthread_mutex_unlock(&e->mu);
	return ready ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
	ENTER("cuStreamWaitEvent");
	NEEDCTX();
	// The event may belong to another context (or device); the stream
	// must belong to the current one.
	if (!e || !stream_known(s) || e->cgen != e->ctx->gen) return CUDA_ERROR_INVALID_HANDLE;
	if (flags) return CUDA_ERROR_INVALID_VALUE;
	struct op *o = op_new(OP_WAIT);
	if (!o) return CUDA_ERROR_OUT_OF_MEMORY;
	pthread_mutex_lock(&e->mu);
	o->gen = e->recorded;
	pthread_mutex_unlock(&e->mu);
	o->ev = e;
	enqueue(s, o);
	return CUDA_SUCCESS;
}

// ---- IPC and dma-buf

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p) {
	ENTER("cuIpcGetMemHandle");
	NEEDCTX();
	if (!h) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&gmu);
	struct alloc *a = find(p, 1);
	struct ipchandle ih = {0};
	if (a && !a->ipc) {
		ih.magic = IPC_MAGIC;
		ih.pid = getpid();
		ih.fd = a->fd;
		ih.ino = a->ino;
		ih.size = a->size;
		ih.dev = a->dev;
	}
	pthread_mutex_unlock(&gmu);
	if (!ih.magic) return CUDA_ERROR_INVALID_VALUE;
	memset(h, 0, sizeof *h);
	memcpy(h, &ih, sizeof ih);
	return CUDA_SUCCESS;
}

static int open_remote_fd(int pid, int fd) {
	int f;
	if (ipc_open != IPC_PIDFD) {
		char path[64];
		snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
		f = open(path, O_RDWR | O_CLOEXEC);
		if (f >= 0 || ipc_open == IPC_PROC) return f;
	}
#if defined(SYS_pidfd_open) && defined(SYS_pidfd_getfd)
	int pfd = syscall(SYS_pidfd_open, pid, 0);
	if (pfd < 0) return -1;
	f = syscall(SYS_pidfd_getfd, pfd, fd, 0);
	if (f >= 0) fcntl(f, F_SETFD, FD_CLOEXEC);
	close(pfd);
	return f;
#else
	return -1;
#endif
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags) {
	ENTER("cuIpcOpenMemHandle_v2");
	NEEDCTX();
	if (!p || flags > 1) return CUDA_ERROR_INVALID_VALUE;
	struct ipchandle ih;
	memcpy(&ih, &h, sizeof ih);
	if (ih.magic != IPC_MAGIC || ih.size == 0) return CUDA_ERROR_INVALID_VALUE;
	// The real driver refuses a handle from the opening process itself.
	if (ih.pid == getpid()) return CUDA_ERROR_INVALID_CONTEXT;
	int fd = open_remote_fd(ih.pid, ih.fd);
	if (fd < 0) return CUDA_ERROR_INVALID_HANDLE;
	struct stat st;
	if (fstat(fd, &st) || (uint64_t)st.st_ino != ih.ino || (uint64_t)st.st_size < ih.size) {
		close(fd);
		return CUDA_ERROR_INVALID_HANDLE;
	}
	CUresult r = map_alloc(fd, ih.size, current->dev, 1, p);
	if (r) close(fd);
	return r == CUDA_ERROR_OUT_OF_MEMORY ? CUDA_ERROR_MAP_FAILED : r;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p) {
	ENTER("cuIpcCloseMemHandle");
	NEEDCTX();
	return unmap_alloc(p, 1);
}

CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr p, size_t n, int type, unsigned long long flags) {
	ENTER("cuMemGetHandleForAddressRange");
	NEEDCTX();
	if (!dmabuf) return CUDA_ERROR_NOT_SUPPORTED;
	if (!handle || type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD || flags > 1 || n == 0) return CUDA_ERROR_INVALID_VALUE;
	uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
	if ((p | n) & (pg - 1)) return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&gmu);
	struct alloc *a = find(p, n);
	// A memfd descriptor starts at the allocation's first byte, so only
	// ranges that start at an allocation base are exported.
	int fd = (a && a->base == p && !a->ipc) ? fcntl(a->fd, F_DUPFD_CLOEXEC, 0) : -2;
	pthread_mutex_unlock(&gmu);
	if (fd == -2) return CUDA_ERROR_INVALID_VALUE;
	if (fd < 0) return CUDA_ERROR_OPERATING_SYSTEM;
	*(int *)handle = fd;
	return CUDA_SUCCESS;
}

// ---- error strings

CUresult cuGetErrorName(CUresult r, const char **s) {
	if (!s) return CUDA_ERROR_INVALID_VALUE;
	switch (r) {
#define N(x) case x: *s = #x; break;
	N(CUDA_SUCCESS) N(CUDA_ERROR_INVALID_VALUE) N(CUDA_ERROR_OUT_OF_MEMORY) N(CUDA_ERROR_NOT_INITIALIZED)
	N(CUDA_ERROR_NO_DEVICE) N(CUDA_ERROR_INVALID_DEVICE) N(CUDA_ERROR_INVALID_CONTEXT) N(CUDA_ERROR_MAP_FAILED)
	N(CUDA_ERROR_OPERATING_SYSTEM) N(CUDA_ERROR_INVALID_HANDLE) N(CUDA_ERROR_NOT_READY) N(CUDA_ERROR_ILLEGAL_ADDRESS)
	N(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) N(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
	N(CUDA_ERROR_NOT_SUPPORTED) N(CUDA_ERROR_UNKNOWN)
#undef N
	default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
	}
	return CUDA_SUCCESS;
}
