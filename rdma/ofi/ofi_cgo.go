//go:build cgo && linux

package ofi

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvf_fabric.h"

// kvf_lib holds the few functions libfabric exports, looked up by kvf_load.
struct kvf_lib {
	void *handle;
	int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct kvf_fi_info *, struct kvf_fi_info **);
	void (*freeinfo)(struct kvf_fi_info *);
	struct kvf_fi_info *(*dupinfo)(const struct kvf_fi_info *);
	int (*fabric)(struct kvf_fi_fabric_attr *, struct kvf_fid_fabric **, void *);
	const char *(*strerror)(int);
	uint32_t (*version)(void);
};

// kvf_sigs holds the process's signal handlers. A provider's library may
// install its own when it loads or initialises (Debian's libfabric links
// libpsm, whose constructor takes SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL
// and SIGABRT and exits on them): that would take the Go runtime's
// handlers away (no graceful stop on SIGTERM, no panic on a nil pointer).
// The binding saves them before each call that may load a provider and
// puts back any that changed.
struct kvf_sigs {
	struct sigaction act[NSIG];
};

static void kvf_sigs_save(struct kvf_sigs *s) {
	for (int i = 1; i < NSIG; i++) sigaction(i, NULL, &s->act[i]);
}

// kvf_sigs_restore puts back every handler that changed since save and
// returns how many.
static int kvf_sigs_restore(struct kvf_sigs *s) {
	int n = 0;
	for (int i = 1; i < NSIG; i++) {
		struct sigaction now;
		if (sigaction(i, NULL, &now) != 0) continue;
		if (now.sa_sigaction != s->act[i].sa_sigaction && sigaction(i, &s->act[i], NULL) == 0) n++;
	}
	return n;
}

// kvf_handler is signal sig's handler, for tests.
static uintptr_t kvf_handler(int sig) {
	struct sigaction a;
	if (sigaction(sig, NULL, &a) != 0) return 0;
	return (uintptr_t)a.sa_sigaction;
}

// kvf_load returns 0, or 1 when dlopen failed, or 2 when a symbol is
// missing; err then holds dlerror's text. The caller holds its OS thread.
static int kvf_load(struct kvf_lib *l, const char *path, char *err, size_t errlen) {
	memset(l, 0, sizeof(*l));
	dlerror();
	l->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!l->handle) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	struct { const char *name; void **slot; } syms[] = {
		{"fi_getinfo", (void **)&l->getinfo},
		{"fi_freeinfo", (void **)&l->freeinfo},
		{"fi_dupinfo", (void **)&l->dupinfo},
		{"fi_fabric", (void **)&l->fabric},
		{"fi_strerror", (void **)&l->strerror},
		{"fi_version", (void **)&l->version},
	};
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		dlerror();
		void *p = dlsym(l->handle, syms[i].name);
		const char *e = dlerror();
		if (e != NULL || p == NULL) {
			snprintf(err, errlen, "%s: %s", syms[i].name, e ? e : "resolves to NULL");
			dlclose(l->handle);
			l->handle = NULL;
			return 2;
		}
		*syms[i].slot = p;
	}
	return 0;
}

static void kvf_unload(struct kvf_lib *l) {
	if (l->handle) dlclose(l->handle);
	l->handle = NULL;
}

static uint32_t kvf_version(struct kvf_lib *l) { return l->version(); }
static const char *kvf_strerror(struct kvf_lib *l, int e) { return l->strerror(e); }
static void kvf_freeinfo(struct kvf_lib *l, struct kvf_fi_info *i) { l->freeinfo(i); }

// kvf_getinfo asks for providers with RMA reads on reliable datagram
// endpoints, honouring the registration modes the binding supports. prov and
// node may be NULL.
static int kvf_getinfo(struct kvf_lib *l, const char *prov, const char *node, int hmem, int mr_modes,
		struct kvf_fi_info **out) {
	struct kvf_fi_info *hints = l->dupinfo(NULL);
	if (!hints) return -12;
	hints->caps = KVF_FI_RMA | KVF_FI_READ | KVF_FI_REMOTE_READ | (hmem ? KVF_FI_HMEM : 0);
	hints->mode = KVF_FI_CONTEXT | KVF_FI_CONTEXT2;
	hints->ep_attr->type = KVF_FI_EP_RDM;
	hints->domain_attr->mr_mode = mr_modes;
	hints->domain_attr->threading = KVF_FI_THREAD_SAFE;
	if (prov) hints->fabric_attr->prov_name = strdup(prov);
	int rc = l->getinfo(KVF_FI_VERSION(1, 17), node, NULL, node ? KVF_FI_SOURCE : 0, hints, out);
	l->freeinfo(hints);
	return rc;
}

static struct kvf_fi_info *kvf_info_next(struct kvf_fi_info *i) { return i->next; }
static const char *kvf_info_prov(struct kvf_fi_info *i) { return i->fabric_attr->prov_name; }
static const char *kvf_info_fabric(struct kvf_fi_info *i) { return i->fabric_attr->name; }
static const char *kvf_info_domain(struct kvf_fi_info *i) { return i->domain_attr->name; }

// kvf_ep is everything one endpoint owns, closed in reverse by kvf_ep_close.
// wake is an eventfd the progress loop naps on (kvf_nap), written by
// kvf_kick when a read waits on it or the endpoint starts serving; napping and
// kicked are the handshake that makes a kick never lost and never a
// needless write. mu serialises the binding's calls that post reads and
// poll the completion queue (kvf_post, kvf_cq_take): see kvf_cq_take.
struct kvf_ep {
	struct kvf_fid_fabric *fabric;
	struct kvf_fid_domain *domain;
	struct kvf_fid_av *av;
	struct kvf_fid_cq *cq;
	struct kvf_fid_ep *ep;
	int wake;
	int napping;
	int kicked;
	int mu_init;
	pthread_mutex_t mu;
};

static int kvf_close_fid(struct kvf_fid *f) { return f ? f->ops->close(f) : 0; }

static void kvf_ep_close(struct kvf_ep *e) {
	if (e->ep) kvf_close_fid(&e->ep->fid);
	if (e->cq) kvf_close_fid(&e->cq->fid);
	if (e->av) kvf_close_fid(&e->av->fid);
	if (e->domain) kvf_close_fid(&e->domain->fid);
	if (e->fabric) kvf_close_fid(&e->fabric->fid);
	if (e->wake > 0) close(e->wake);
	if (e->mu_init) pthread_mutex_destroy(&e->mu);
	memset(e, 0, sizeof(*e));
}

// kvf_ep_open opens fabric, domain, AV, CQ and an enabled endpoint for info.
// *step names the call that failed.
static int kvf_ep_open(struct kvf_lib *l, struct kvf_fi_info *info, size_t cq_size, struct kvf_ep *e, const char **step) {
	memset(e, 0, sizeof(*e));
	int rc;
	*step = "pthread_mutex_init";
	if ((rc = pthread_mutex_init(&e->mu, NULL)) != 0) {
		rc = -rc;
		goto fail;
	}
	e->mu_init = 1;
	*step = "eventfd";
	e->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (e->wake < 0) {
		rc = -12;
		e->wake = 0;
		goto fail;
	}
	*step = "fi_fabric";
	if ((rc = l->fabric(info->fabric_attr, &e->fabric, NULL)) != 0) goto fail;
	*step = "fi_domain";
	if ((rc = e->fabric->ops->domain(e->fabric, info, &e->domain, NULL)) != 0) goto fail;
	struct kvf_fi_av_attr av;
	memset(&av, 0, sizeof(av));
	av.type = info->domain_attr->av_type ? info->domain_attr->av_type : KVF_FI_AV_TABLE;
	*step = "fi_av_open";
	if ((rc = e->domain->ops->av_open(e->domain, &av, &e->av, NULL)) != 0) goto fail;
	struct kvf_fi_cq_attr cq;
	memset(&cq, 0, sizeof(cq));
	cq.size = cq_size;
	cq.format = KVF_FI_CQ_FORMAT_CONTEXT;
	cq.wait_obj = KVF_FI_WAIT_NONE; // polled, never waited on
	*step = "fi_cq_open";
	if ((rc = e->domain->ops->cq_open(e->domain, &cq, &e->cq, NULL)) != 0) goto fail;
	*step = "fi_endpoint";
	if ((rc = e->domain->ops->endpoint(e->domain, info, &e->ep, NULL)) != 0) goto fail;
	*step = "fi_ep_bind(av)";
	if ((rc = e->ep->fid.ops->bind(&e->ep->fid, &e->av->fid, 0)) != 0) goto fail;
	*step = "fi_ep_bind(cq)";
	if ((rc = e->ep->fid.ops->bind(&e->ep->fid, &e->cq->fid, KVF_FI_SEND | KVF_FI_RECV)) != 0) goto fail;
	*step = "fi_enable";
	if ((rc = e->ep->fid.ops->control(&e->ep->fid, KVF_FI_ENABLE, NULL)) != 0) goto fail;
	return 0;
fail:
	kvf_ep_close(e);
	return rc;
}

static int kvf_getname(struct kvf_ep *e, void *buf, size_t *len) {
	return e->ep->cm->getname(&e->ep->fid, buf, len);
}

static int kvf_av_insert(struct kvf_ep *e, const void *name, kvf_fi_addr_t *out) {
	return e->av->ops->insert(e->av, name, 1, out, 0, NULL);
}

static int kvf_av_remove(struct kvf_ep *e, kvf_fi_addr_t a) {
	return e->av->ops->remove(e->av, &a, 1, 0);
}

// kvf_mr_reg registers [addr, addr+len) with access, through fi_mr_regattr
// so that device memory names its interface; bind is FI_MR_ENDPOINT's bind
// and enable.
static int kvf_mr_reg(struct kvf_ep *e, uintptr_t addr, size_t len, uint64_t access, uint64_t key, int iface,
		int device, int bind, struct kvf_fid_mr **mr, const char **step) {
	struct iovec iov = {(void *)addr, len};
	struct kvf_fi_mr_attr a;
	memset(&a, 0, sizeof(a));
	a.mr_iov = &iov;
	a.iov_count = 1;
	a.access = access;
	a.requested_key = key;
	a.iface = iface;
	a.device.cuda = device;
	*step = "fi_mr_regattr";
	int rc = e->domain->mr->regattr(&e->domain->fid, &a, 0, mr);
	if (rc != 0 || !bind) return rc;
	*step = "fi_mr_bind";
	if ((rc = (*mr)->fid.ops->bind(&(*mr)->fid, &e->ep->fid, 0)) != 0) goto fail;
	*step = "fi_mr_enable";
	if ((rc = (*mr)->fid.ops->control(&(*mr)->fid, KVF_FI_ENABLE, NULL)) != 0) goto fail;
	return 0;
fail:
	kvf_close_fid(&(*mr)->fid);
	*mr = NULL;
	return rc;
}

static uint64_t kvf_mr_key(struct kvf_fid_mr *mr) { return mr->key; }
static void *kvf_mr_desc(struct kvf_fid_mr *mr) { return mr->mem_desc; }
static int kvf_mr_close(struct kvf_fid_mr *mr) { return kvf_close_fid(&mr->fid); }

#define KVF_MAX_IOV 8

// kvf_read posts one read of the peer's [raddr, +sum of lens) with key into
// n local pieces given as (address, length) pairs, each with desc.
static ssize_t kvf_read(struct kvf_ep *e, const uint64_t *local, size_t n, void *desc, kvf_fi_addr_t src,
		uint64_t raddr, uint64_t key, void *ctx) {
	if (n == 1)
		return e->ep->rma->read(e->ep, (void *)(uintptr_t)local[0], local[1], desc, src, raddr, key, ctx);
	if (n > KVF_MAX_IOV) return -22;
	struct iovec iov[KVF_MAX_IOV];
	void *descs[KVF_MAX_IOV];
	size_t total = 0;
	for (size_t i = 0; i < n; i++) {
		iov[i].iov_base = (void *)(uintptr_t)local[2 * i];
		iov[i].iov_len = local[2 * i + 1];
		descs[i] = desc;
		total += local[2 * i + 1];
	}
	struct kvf_fi_rma_iov r = {raddr, total, key};
	struct kvf_fi_msg_rma m;
	memset(&m, 0, sizeof(m));
	m.msg_iov = iov;
	m.desc = descs;
	m.iov_count = n;
	m.addr = src;
	m.rma_iov = &r;
	m.rma_iov_count = 1;
	m.context = ctx;
	return e->ep->rma->readmsg(e->ep, &m, KVF_FI_COMPLETION);
}

// kvf_req is one read request of a batch: n local pieces as (address,
// length) pairs with their registration's desc, the peer's address and
// key, and its context.
struct kvf_req {
	uint64_t local[2 * KVF_MAX_IOV];
	uint64_t n, raddr, key;
	uintptr_t ctx, desc;
};

// kvf_read_batch posts reqs in order until the provider refuses one; it
// returns how many it posted, with *rc the refusal (0 when all were).
static size_t kvf_read_batch(struct kvf_ep *e, const struct kvf_req *reqs, size_t n, kvf_fi_addr_t src, ssize_t *rc) {
	*rc = 0;
	for (size_t i = 0; i < n; i++) {
		const struct kvf_req *q = &reqs[i];
		ssize_t x = kvf_read(e, q->local, q->n, (void *)q->desc, src, q->raddr, q->key, (void *)q->ctx);
		if (x != 0) {
			*rc = x;
			return i;
		}
	}
	return n;
}

// kvf_take is what one take of the completion queue found: n > 0
// contexts of successful completions in ctxs; or n == -FI_EAVAIL and one
// error entry, read already (err_ctx, err, prov_errno, text); or another
// negative n: nothing (-FI_EAGAIN, or the lock was busy) or the queue's
// own error.
struct kvf_take {
	void *ctxs[64];
	ssize_t n;
	void *err_ctx;
	int err, prov_errno;
	char text[256];
};

// kvf_take_locked polls the queue once into t; the caller holds e->mu.
static void kvf_take_locked(struct kvf_ep *e, struct kvf_take *t) {
	struct kvf_fi_cq_entry ent[64];
	ssize_t got = e->cq->ops->read(e->cq, ent, 64);
	for (ssize_t i = 0; i < got; i++) t->ctxs[i] = ent[i].op_context;
	t->n = got;
	if (got != -KVF_FI_EAVAIL) return;
	struct kvf_fi_cq_err_entry ee;
	memset(&ee, 0, sizeof(ee));
	ssize_t rc = e->cq->ops->readerr(e->cq, &ee, 0);
	if (rc < 0) {
		t->n = rc == -KVF_FI_EAVAIL ? -KVF_FI_EAGAIN : rc;
		return;
	}
	t->err_ctx = ee.op_context;
	t->err = ee.err;
	t->prov_errno = ee.prov_errno;
	t->text[0] = 0;
	if (ee.prov_errno && e->cq->ops->strerror) {
		const char *s = e->cq->ops->strerror(e->cq, ee.prov_errno, ee.err_data, t->text, sizeof(t->text));
		if (s && s != t->text) snprintf(t->text, sizeof(t->text), "%s", s);
	}
}

// kvf_cq_take polls the completion queue once into t, an error entry
// included. Posting and polling take e->mu, so that one thread at a time
// drives the provider's progress on the endpoint: shm holds its queue's
// and its peer's spin locks over a whole cross-memory copy, and a
// progress loop that polls while a read copies spins until the copy ends.
// With try, a busy lock is nothing to take (the reader holding it polls
// after posting).
static void kvf_cq_take(struct kvf_ep *e, struct kvf_take *t, int try) {
	if (try) {
		if (pthread_mutex_trylock(&e->mu) != 0) {
			t->n = -KVF_FI_EAGAIN;
			return;
		}
	} else {
		pthread_mutex_lock(&e->mu);
	}
	kvf_take_locked(e, t);
	pthread_mutex_unlock(&e->mu);
}

// kvf_post posts reqs as kvf_read_batch does, then takes what the
// completion queue holds into t, under e->mu: a provider that completes a
// read within the call (shm by cross-memory attach) hands its completions
// back to the reader that posted them, with no progress loop in between.
static size_t kvf_post(struct kvf_ep *e, const struct kvf_req *reqs, size_t n, kvf_fi_addr_t src, ssize_t *rc,
		struct kvf_take *t) {
	pthread_mutex_lock(&e->mu);
	size_t posted = kvf_read_batch(e, reqs, n, src, rc);
	kvf_take_locked(e, t);
	pthread_mutex_unlock(&e->mu);
	return posted;
}

// kvf_nap sleeps up to ns nanoseconds, or until kvf_kick; it returns 1
// when kicked (now or before it began), else 0. The kernel's timer slack
// (50 us by default) lengthens the short naps: a slack of 1 us cost the
// import over tcp more CPU in wake-ups than it gave back in rate.
static int kvf_nap(struct kvf_ep *e, long ns) {
	__atomic_store_n(&e->napping, 1, __ATOMIC_SEQ_CST);
	if (__atomic_exchange_n(&e->kicked, 0, __ATOMIC_SEQ_CST)) {
		__atomic_store_n(&e->napping, 0, __ATOMIC_SEQ_CST);
		return 1;
	}
	struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
	struct pollfd p = {e->wake, POLLIN, 0};
	int r = ppoll(&p, 1, &ts, NULL);
	__atomic_store_n(&e->napping, 0, __ATOMIC_SEQ_CST);
	if (r > 0) {
		uint64_t v;
		if (read(e->wake, &v, sizeof(v)) < 0) {}
	}
	return __atomic_exchange_n(&e->kicked, 0, __ATOMIC_SEQ_CST) || r > 0;
}

// kvf_kick ends the progress loop's nap, or the next one.
static void kvf_kick(struct kvf_ep *e) {
	if (__atomic_exchange_n(&e->kicked, 1, __ATOMIC_SEQ_CST)) return; // a kick is pending
	if (__atomic_load_n(&e->napping, __ATOMIC_SEQ_CST)) {
		uint64_t one = 1;
		if (write(e->wake, &one, sizeof(one)) < 0) {}
	}
}

// kvf_cq_wait takes from the completion queue as kvf_cq_take does (with
// try) until that finds anything but -FI_EAGAIN, or kvf_kick (*kicked is
// set), or budget ns pass. Between empty takes it naps, twice as long each
// time from min_nap up to max_nap; *nap carries the last nap from call to
// call, 0 after a completion or a kick. It calls the provider between naps
// with no lock of the caller's, which only a thread-safe provider allows
// (the only kind Choose picks).
static void kvf_cq_wait(struct kvf_ep *e, struct kvf_take *t, long *nap, long min_nap, long max_nap,
		long budget, int *kicked, long *naps) {
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	*kicked = 0;
	for (;;) {
		kvf_cq_take(e, t, 1);
		if (t->n != -KVF_FI_EAGAIN) {
			*nap = 0;
			return;
		}
		clock_gettime(CLOCK_MONOTONIC, &now);
		long el = (now.tv_sec - t0.tv_sec) * 1000000000L + (now.tv_nsec - t0.tv_nsec);
		if (el >= budget) return;
		long d = *nap * 2;
		if (d < min_nap) d = min_nap;
		if (d > max_nap) d = max_nap;
		*nap = d;
		(*naps)++;
		if (kvf_nap(e, d)) {
			*nap = 0;
			*kicked = 1;
			return;
		}
	}
}

// kvf_copy_out copies a staged read from src to its n pieces of dst, given
// as (offset, length) pairs, in order.
static void kvf_copy_out(uintptr_t dst, uintptr_t src, const uint64_t *pieces, size_t n) {
	for (size_t i = 0; i < n; i++) {
		memcpy((char *)dst + pieces[2 * i], (const char *)src, pieces[2 * i + 1]);
		src += pieces[2 * i + 1];
	}
}

static void *kvf_ctx_at(void *slab, size_t i) { return (char *)slab + i * 64; }
static size_t kvf_ctx_index(void *slab, void *ctx) { return (size_t)((char *)ctx - (char *)slab) / 64; }
*/
import "C"

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// contextSize is the room each posted request's context has: a struct
// fi_context2 (eight pointers), which FI_CONTEXT and FI_CONTEXT2 providers
// may use until the completion.
const contextSize = 64

// Library is an opened libfabric. Its methods may be called concurrently.
type Library struct {
	cfg Config
	lib *C.struct_kvf_lib

	mu     sync.Mutex
	closed bool
	eps    map[*Endpoint]struct{}
}

// Load opens libfabric. A missing library returns an error wrapping
// ErrUnavailable; one lacking a required symbol or older than APIVersion,
// ErrNotSupported.
func Load(cfg Config) (*Library, error) {
	cfg = cfg.populate()
	l := (*C.struct_kvf_lib)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_kvf_lib{}))))
	path := C.CString(cfg.Library)
	defer C.free(unsafe.Pointer(path))
	var msg [512]C.char
	var rc C.int
	var version uint32
	keepSignals(cfg.Logger, "dlopen", func() {
		runtime.LockOSThread()
		rc = C.kvf_load(l, path, &msg[0], C.size_t(len(msg)))
		runtime.UnlockOSThread()
		if rc == 0 {
			version = uint32(C.kvf_version(l))
		}
	})
	switch rc {
	case 1:
		C.free(unsafe.Pointer(l))
		return nil, fmt.Errorf("ofi: cannot load %s (%s): %w", cfg.Library, C.GoString(&msg[0]), ErrUnavailable)
	case 2:
		C.free(unsafe.Pointer(l))
		return nil, fmt.Errorf("ofi: %s lacks a required symbol (%s): %w", cfg.Library, C.GoString(&msg[0]), ErrNotSupported)
	}
	if v := version; v < APIVersion {
		C.kvf_unload(l)
		C.free(unsafe.Pointer(l))
		return nil, fmt.Errorf("ofi: %s is libfabric %d.%d; kvfabric needs %d.%d or later: %w",
			cfg.Library, v>>16, v&0xffff, APIVersion>>16, APIVersion&0xffff, ErrNotSupported)
	}
	return &Library{cfg: cfg, lib: l, eps: map[*Endpoint]struct{}{}}, nil
}

// Version is the loaded library's version, as "major.minor".
func (l *Library) Version() string {
	v := uint32(C.kvf_version(l.lib))
	return fmt.Sprintf("%d.%d", v>>16, v&0xffff)
}

// Close closes every endpoint still open, then unloads the library. Safe
// twice.
func (l *Library) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	eps := make([]*Endpoint, 0, len(l.eps))
	for e := range l.eps {
		eps = append(eps, e)
	}
	l.mu.Unlock()
	var errs []error
	for _, e := range eps {
		errs = append(errs, e.Close())
	}
	C.kvf_unload(l.lib)
	C.free(unsafe.Pointer(l.lib))
	return errors.Join(errs...)
}

// sigMu serialises keepSignals: one call's save must not see another's
// provider's handlers.
var sigMu sync.Mutex

// keepSignals runs fn, then puts back every signal handler that a
// provider's library installed during it (see kvf_sigs), and says so.
func keepSignals(log *slog.Logger, during string, fn func()) {
	sigMu.Lock()
	defer sigMu.Unlock()
	s := (*C.struct_kvf_sigs)(C.malloc(C.size_t(unsafe.Sizeof(C.struct_kvf_sigs{}))))
	defer C.free(unsafe.Pointer(s))
	C.kvf_sigs_save(s)
	fn()
	if n := C.kvf_sigs_restore(s); n > 0 {
		log.Info("ofi: put back the signal handlers a provider's library replaced", "during", during, "handlers", int(n))
	}
}

// signalHandler is the address of signal sig's handler, for tests.
func signalHandler(sig syscall.Signal) uintptr { return uintptr(C.kvf_handler(C.int(sig))) }

// fiError turns a libfabric return code (a negated errno or FI_E* value)
// into an error with libfabric's text.
func (l *Library) fiError(rc C.int) error {
	if rc < 0 {
		rc = -rc
	}
	return fiErr{code: int(rc), text: C.GoString(C.kvf_strerror(l.lib, rc))}
}

type fiErr struct {
	code int
	text string
}

func (e fiErr) Error() string { return fmt.Sprintf("%s (%d)", e.text, e.code) }

// Is lets errors.Is match the errno values libfabric shares with the kernel.
func (e fiErr) Is(target error) bool {
	errno, ok := target.(syscall.Errno)
	return ok && int(errno) == e.code
}

// getinfo runs fn over what libfabric offers for prov (all if empty).
func (l *Library) getinfo(prov, node string, hmem bool, fn func(*C.struct_kvf_fi_info) bool) error {
	var cprov, cnode *C.char
	if prov != "" {
		cprov = C.CString(prov)
		defer C.free(unsafe.Pointer(cprov))
	}
	if node != "" {
		cnode = C.CString(node)
		defer C.free(unsafe.Pointer(cnode))
	}
	h := C.int(0)
	if hmem {
		h = 1
	}
	var list *C.struct_kvf_fi_info
	var rc C.int
	keepSignals(l.cfg.Logger, "fi_getinfo", func() { rc = C.kvf_getinfo(l.lib, cprov, cnode, h, C.int(SupportedMRModes), &list) })
	if rc != 0 {
		return fmt.Errorf("ofi: fi_getinfo(provider %q, RMA on RDM): %w", prov, l.fiError(rc))
	}
	defer C.kvf_freeinfo(l.lib, list)
	for i := list; i != nil; i = C.kvf_info_next(i) {
		if !fn(i) {
			break
		}
	}
	return nil
}

func describe(i *C.struct_kvf_fi_info, hmem bool) ProviderInfo {
	d, ep, tx := i.domain_attr, i.ep_attr, i.tx_attr
	return ProviderInfo{
		Provider:    C.GoString(C.kvf_info_prov(i)),
		Fabric:      C.GoString(C.kvf_info_fabric(i)),
		Domain:      C.GoString(C.kvf_info_domain(i)),
		MRMode:      MRMode(d.mr_mode),
		MRKeySize:   int(d.mr_key_size),
		HMEM:        hmem && uint64(i.caps)&uint64(C.KVF_FI_HMEM) != 0,
		MaxMsgSize:  uint64(ep.max_msg_size),
		IOVLimit:    int(tx.iov_limit),
		RMAIOVLimit: int(tx.rma_iov_limit),
		TxSize:      int(tx.size),
		ThreadSafe:  d.threading == C.KVF_FI_THREAD_SAFE,
	}
}

// Providers lists what libfabric offers with RMA reads on reliable datagram
// endpoints, device memory included where a provider registers it. None is
// an error wrapping ErrUnavailable.
func (l *Library) Providers() ([]ProviderInfo, error) {
	var out []ProviderInfo
	seen := map[string]bool{}
	add := func(hmem bool) func(*C.struct_kvf_fi_info) bool {
		return func(i *C.struct_kvf_fi_info) bool {
			p := describe(i, hmem)
			if k := p.Provider + "/" + p.Domain; !seen[k] {
				seen[k] = true
				out = append(out, p)
			}
			return true
		}
	}
	// Providers that register device memory first, so their entry says so.
	if !l.cfg.HostOnly {
		_ = l.getinfo("", l.cfg.Node, true, add(true))
	}
	if err := l.getinfo("", l.cfg.Node, false, add(false)); err != nil && len(out) == 0 {
		return nil, fmt.Errorf("%w: %w", err, ErrUnavailable)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("ofi: %s offers no provider with RMA on reliable datagram endpoints: %w", l.cfg.Library, ErrUnavailable)
	}
	return out, nil
}

// Endpoint is an RDM endpoint with its fabric, domain, address vector and
// completion queue. Read may be called concurrently; Register, AddPeer and
// their Close too.
type Endpoint struct {
	lib   *Library
	info  ProviderInfo
	plan  RegPlan
	grace time.Duration
	// connectTimeout is Config.ConnectTimeout.
	connectTimeout time.Duration
	ep             *C.struct_kvf_ep
	name           []byte

	// live is read-held around every call that uses the endpoint's C
	// objects, and write-held by Close while it frees them.
	live sync.RWMutex

	slab  unsafe.Pointer // window contexts of contextSize bytes, C memory
	free  chan int       // context slots not in use
	owner []atomic.Pointer[reader]
	// copies[slot] is the copy out of staging that the request posted
	// with context slot owes on completion; nil for a read in place.
	copies []atomic.Pointer[stagedCopy]

	// Staging, for a provider that StagesReads: stageSlots slots of
	// stageSlotBytes, mapped and registered by the first read that
	// stages (stageOnce); stageFree holds the slots not in use. stageReg
	// is nil when staging could not be set up (stageErr): reads are then
	// in place.
	stageOnce sync.Once
	stageMem  []byte
	stageReg  *Region
	stageErr  error
	stageFree chan int

	nextKey atomic.Uint64

	mu      sync.Mutex
	closed  bool
	broken  error
	regions map[*Region]struct{}

	stop chan struct{}
	done chan struct{}

	// servingUntil is when the last live Serve ends (Unix ns),
	// inlineUntil the last live ServeInline; serves those live.
	servingUntil atomic.Int64
	inlineUntil  atomic.Int64
	serveMu      sync.Mutex
	serves       map[*serveTicket]struct{}
	// waiting counts the Reads blocked on completions that only the
	// progress loop will take (see Read's park).
	waiting atomic.Int32

	// Counters; naps counts the progress loop's naps.
	reads, bytes, failures, naps atomic.Uint64
	// staged counts the requests read through staging; inline the
	// completions Reads took from the queue themselves.
	staged, inline atomic.Uint64
}

// Staging's size: over tcp, reads of 512 KiB took nearly the time of
// reads of 1 MiB (and a quarter less than reads of 32 KiB), and 16 in
// flight as much as 64 (BENCHMARKS.md, agent imports over libfabric).
const (
	stageSlotBytes = 512 << 10
	stageSlots     = 16
)

// stagedCopy is what a staged request copies out when it completes: its
// staging slot, and the pieces of the destination (dst, a region's
// address) its bytes go to, in order.
type stagedCopy struct {
	slot   int
	dst    uintptr
	pieces []piece
}

// staging sets up the endpoint's staging on first use and returns its
// region, or nil (reads in place) when it could not be.
func (e *Endpoint) staging() *Region {
	e.stageOnce.Do(func() {
		mem, err := syscall.Mmap(-1, 0, stageSlots*stageSlotBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			e.stageErr = fmt.Errorf("ofi: map %d bytes of staging: %w", stageSlots*stageSlotBytes, err)
			return
		}
		reg, err := e.Register(uintptr(unsafe.Pointer(&mem[0])), uint64(len(mem)))
		if err != nil {
			syscall.Munmap(mem)
			e.stageErr = err
			return
		}
		e.mu.Lock()
		e.stageMem = mem
		e.mu.Unlock()
		e.stageReg = reg
		for k := range stageSlots {
			e.stageFree <- k
		}
	})
	if e.stageErr != nil {
		return nil
	}
	return e.stageReg
}

// copyOut copies a completed staged request to where its bytes go. Once
// the endpoint is closed (its staging is unmapped: another read gave up,
// or Close) it copies nothing and says so, so that the read fails rather
// than return with the destination unwritten.
func (e *Endpoint) copyOut(c *stagedCopy) error {
	unlock, err := e.lockCalls()
	if err != nil {
		return fmt.Errorf("ofi: staged read not copied out: %w", err)
	}
	src := uintptr(unsafe.Pointer(&e.stageMem[c.slot*stageSlotBytes]))
	C.kvf_copy_out(C.uintptr_t(c.dst), C.uintptr_t(src), (*C.uint64_t)(unsafe.Pointer(&c.pieces[0])), C.size_t(len(c.pieces)))
	unlock()
	return nil
}

// reader collects the completions of one Read: the progress loop adds
// each batch of them at once and wakes the Read, which takes them all.
type reader struct {
	mu     sync.Mutex
	n      int           // completions not taken yet
	err    error         // the first error among them
	copies []*stagedCopy // the staged ones' copies, owed by the Read
	wake   chan struct{}
}

func newReader() *reader { return &reader{wake: make(chan struct{}, 1)} }

// add counts n completions, err the first error among them, and wakes the
// Read.
func (r *reader) add(n int, err error) {
	r.mu.Lock()
	r.n += n
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// addCopy hands the Read a completed staged request's copy, before the
// add that counts it.
func (r *reader) addCopy(c *stagedCopy) {
	r.mu.Lock()
	r.copies = append(r.copies, c)
	r.mu.Unlock()
}

// take returns the completions counted since the last take, and the copies
// of the staged ones among them.
func (r *reader) take() (int, []*stagedCopy, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, copies, err := r.n, r.copies, r.err
	r.n, r.copies, r.err = 0, nil, nil
	return n, copies, err
}

// Open opens an endpoint on the provider Choose picks from cfg.Provider.
func (l *Library) Open() (*Endpoint, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("ofi: library %s: %w", l.cfg.Library, ErrClosed)
	}
	l.mu.Unlock()
	offered, err := l.Providers()
	if err != nil {
		return nil, err
	}
	p, err := Choose(offered, l.cfg.Provider)
	if err != nil {
		return nil, err
	}
	plan, err := p.MRMode.Plan()
	if err != nil {
		return nil, err
	}
	e := &Endpoint{lib: l, info: p, plan: plan, grace: l.cfg.FlushGrace, connectTimeout: l.cfg.ConnectTimeout, regions: map[*Region]struct{}{},
		serves: map[*serveTicket]struct{}{}, stop: make(chan struct{}), done: make(chan struct{})}
	var opened bool
	var openErr error
	node := l.cfg.Node
	if p.Base() == "shm" && node == "" {
		node = shmName()
	}
	err = l.getinfo(p.Provider, node, p.HMEM, func(i *C.struct_kvf_fi_info) bool {
		if C.GoString(C.kvf_info_domain(i)) != p.Domain {
			return true
		}
		window := min(max(p.TxSize, 1), MaxInFlight)
		e.ep = (*C.struct_kvf_ep)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_kvf_ep{}))))
		var step *C.char
		var rc C.int
		keepSignals(l.cfg.Logger, "open", func() { rc = C.kvf_ep_open(l.lib, i, C.size_t(2*window), e.ep, &step) })
		if rc != 0 {
			openErr = fmt.Errorf("ofi: %s on %s: %s: %w", p.Provider, p.Domain, C.GoString(step), l.fiError(rc))
			C.free(unsafe.Pointer(e.ep))
			e.ep = nil
			return false
		}
		e.slab = C.calloc(C.size_t(window), contextSize)
		e.free = make(chan int, window)
		for k := range window {
			e.free <- k
		}
		e.owner = make([]atomic.Pointer[reader], window)
		e.copies = make([]atomic.Pointer[stagedCopy], window)
		e.stageFree = make(chan int, stageSlots)
		opened = true
		return false
	})
	if err != nil {
		return nil, err
	}
	if openErr != nil {
		return nil, openErr
	}
	if !opened {
		return nil, fmt.Errorf("ofi: %s on %s went away between listing and opening: %w", p.Provider, p.Domain, ErrUnavailable)
	}
	var buf [MaxNameLen]byte
	n := C.size_t(len(buf))
	if rc := C.kvf_getname(e.ep, unsafe.Pointer(&buf[0]), &n); rc != 0 {
		e.closeC()
		return nil, fmt.Errorf("ofi: %s: fi_getname: %w", p.Provider, l.fiError(rc))
	}
	e.name = append([]byte(nil), buf[:n]...)
	l.mu.Lock()
	l.eps[e] = struct{}{}
	l.mu.Unlock()
	go e.progress()
	l.cfg.Logger.Info("ofi endpoint open", "provider", p.Provider, "domain", p.Domain, "mr_mode", p.MRMode.String())
	return e, nil
}

// ShmPrefix begins the name of every shm endpoint the binding opens
// without Config.Node: ShmPrefix, the process ID, a dash and random hex.
// shm keeps each endpoint's region in /dev/shm under its name (with the
// user ID and an index appended), and its default name is the process ID
// alone: a process killed with SIGKILL leaves its region behind, and a
// later process given the same ID could not open an endpoint (fi_enable:
// EBUSY).
const ShmPrefix = "kvf-"

func shmName() string {
	var b [8]byte
	rand.Read(b[:])
	return fmt.Sprintf("%s%d-%x", ShmPrefix, os.Getpid(), b)
}

// Info describes the endpoint's provider.
func (e *Endpoint) Info() ProviderInfo { return e.info }

// Broken returns why the endpoint closed itself (a read whose requests
// were still in flight past the flush grace), or nil while it is open or
// after Close.
func (e *Endpoint) Broken() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.broken
}

// Reopen opens a new endpoint on the library and provider e was opened
// on, with a new name and no regions: a broken endpoint's memory must be
// registered again, and its peers told the new name.
func (e *Endpoint) Reopen() (*Endpoint, error) { return e.lib.Open() }

// Name is the endpoint's address, for peers' AddPeer.
func (e *Endpoint) Name() []byte { return append([]byte(nil), e.name...) }

// Stats are an endpoint's counters.
type Stats struct {
	Reads, Bytes, Failures uint64
	// Staged counts the requests read whole into staging and copied out
	// (ProviderInfo.StagesReads).
	Staged uint64
	// Inline counts the completions Reads took from the queue themselves
	// (after posting a batch, or before waiting), not the progress loop:
	// all of them where the provider completes a read within the call
	// that posts it (shm by cross-memory attach).
	Inline uint64
}

// Stats returns the endpoint's counters.
func (e *Endpoint) Stats() Stats {
	return Stats{Reads: e.reads.Load(), Bytes: e.bytes.Load(), Failures: e.failures.Load(), Staged: e.staged.Load(), Inline: e.inline.Load()}
}

// lockCalls is taken around every call into the provider. It fails once the
// endpoint is closed, so that no call runs on freed objects.
func (e *Endpoint) lockCalls() (func(), error) {
	e.live.RLock()
	e.mu.Lock()
	closed, broken := e.closed, e.broken
	e.mu.Unlock()
	if closed {
		e.live.RUnlock()
		if broken != nil {
			return nil, broken
		}
		return nil, fmt.Errorf("ofi: endpoint on %s: %w", e.info.Provider, ErrClosed)
	}
	// Every provider Choose picks is FI_THREAD_SAFE: calls need no lock
	// of ours beyond this one.
	return e.live.RUnlock, nil
}

func (e *Endpoint) usable() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.broken != nil:
		return e.broken
	case e.closed:
		return fmt.Errorf("ofi: endpoint on %s: %w", e.info.Provider, ErrClosed)
	}
	return nil
}

// progress reads the completion queue until Close, handing each completion
// to the read that posted it. Reading the queue is also what drives a
// software provider's progress, serving peers' reads included (shm serves
// a read only when the holder's loop polls, and tcp sends its bytes).
//
// It polls (fi_cq_read) rather than blocking in fi_cq_sread: shm's queues
// have no wait object in libfabric 1.17, and some providers' sread ignores
// its timeout. Between empty polls it naps (kvf_nap: on an eventfd, with a
// timeout), longer the longer nothing comes, up to a cap set by what the
// endpoint is doing:
//
//	a Read waits on it    yields hotSpins times, then naps up to hotMaxNap
//	serving (Serve)       naps up to servingMaxNap
//	serving (ServeInline) naps up to inlineServeMaxNap
//	none of these         naps up to idleMaxNap
//
// The loop is not the only thread that polls: a Read takes the completion
// queue itself after each batch it posts, in the same call and under the
// same lock (kvf_post), and the loop's polls only try that lock, so that
// one thread at a time drives the provider on the endpoint and none spins
// on the provider's locks while another holds them. A Read waits on the
// loop (and the loop polls hot) only when it has nothing left to post;
// while Reads post and take their own completions, the loop naps as it
// would without them: its wake-ups (tens of thousands a second at
// hotMaxNap) found nothing to take, and cost the reads CPU.
//
// A Read that waits on it, or a Serve that begins, wakes a nap at once
// (kvf_kick), so an idle endpoint sleeps long and costs almost nothing, and
// a holder polls often only while a peer may be reading it. The loop is not locked to a thread:
// a locked goroutine that yields, and every reader it wakes, cost a hand-off
// between threads, which halved the import's rate over tcp on two cores.
func (e *Endpoint) progress() {
	defer close(e.done)
	// C memory: a Go array of pointers passed to C is checked for Go
	// pointers, all 64 of them, on every call.
	t := (*C.struct_kvf_take)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_kvf_take{}))))
	defer C.free(unsafe.Pointer(t))
	idle := 0
	var nap C.long
	for {
		select {
		case <-e.stop:
			return
		default:
		}
		limit := e.napLimit()
		spin := false
		switch {
		case limit == hotMaxNap && idle < hotSpins && e.waiting.Load() > 0:
			// A read waits for completions: a few polls that only
			// yield first. (A read that posts takes what its posts
			// completed itself, and waits on the loop only when it
			// has nothing more to post.)
			spin = true
			C.kvf_cq_take(e.ep, t, 1)
		default:
			// Polls and naps in C until something comes, a read waits or a
			// server begins (kicked), or the budget passes: the runtime is
			// entered once per wait, not once per nap.
			var kicked C.int
			var naps C.long
			C.kvf_cq_wait(e.ep, t, &nap, C.long(minNap), C.long(limit),
				C.long(waitBudget(limit)), &kicked, &naps)
			e.naps.Add(uint64(naps))
			if kicked != 0 {
				idle = 0
				continue
			}
		}
		switch {
		case e.deliver(t) > 0:
			idle, nap = 0, 0
		case spin:
			idle++
			runtime.Gosched()
		}
	}
}

// deliver hands what one take of the completion queue found to the reads
// that posted it, and says how many completions it found: each reader is
// woken once per batch, not once per completion.
func (e *Endpoint) deliver(t *C.struct_kvf_take) int {
	switch n := int(t.n); {
	case n > 0:
		var last *reader
		count := 0
		for i := range n {
			r := e.release(t.ctxs[i])
			if r != last && last != nil {
				last.add(count, nil)
				count = 0
			}
			if r != nil {
				last = r
				count++
			}
		}
		if last != nil {
			last.add(count, nil)
		}
		return n
	case t.n == -C.KVF_FI_EAVAIL:
		err := fmt.Errorf("ofi: read failed on %s: %w: %w", e.info.Provider, e.lib.fiError(t.err), ErrCompletion)
		if t.prov_errno != 0 {
			err = fmt.Errorf("%w (provider: %s)", err, C.GoString(&t.text[0]))
		}
		if r := e.release(t.err_ctx); r != nil {
			r.add(1, err)
		}
		return 1
	}
	return 0
}

// waitBudget is how long one kvf_cq_wait may nap before the loop looks at
// what the endpoint does again: a hundred naps at the cap, at most 50 ms.
func waitBudget(limit time.Duration) time.Duration {
	return min(100*limit, 50*time.Millisecond)
}

// The progress loop's naps (see progress).
const (
	hotSpins      = 256
	minNap        = time.Microsecond
	hotMaxNap     = 20 * time.Microsecond
	servingMaxNap = 50 * time.Microsecond
	idleMaxNap    = 10 * time.Millisecond
	// inlineServeMaxNap: a holder whose readers all complete their reads
	// within their own calls (ServeInline) polls only to give back the
	// command slots those reads take (shm: one a request, 1,024 of them,
	// which a reader at 5 GB/s in 32 KiB requests uses up in about 7 ms);
	// each poll takes the lock such a reader holds over every copy.
	inlineServeMaxNap = time.Millisecond
)

// napLimit is the longest the progress loop naps now.
func (e *Endpoint) napLimit() time.Duration {
	switch {
	case e.waiting.Load() > 0:
		return hotMaxNap
	}
	now := time.Now().UnixNano()
	switch {
	case now < e.servingUntil.Load():
		return servingMaxNap
	case now < e.inlineUntil.Load():
		return inlineServeMaxNap
	}
	return idleMaxNap
}

// Serve tells the endpoint that peers may read its regions until until,
// or until the returned function is called: its progress loop then polls
// often enough to serve them (which shm and tcp need of the holder), where
// an endpoint neither reading nor serving polls rarely. Calls may overlap;
// the endpoint serves while any is live.
func (e *Endpoint) Serve(until time.Time) (done func()) { return e.serve(until, false) }

// ServeInline is Serve for peers that read with reads the provider
// completes within the reader's own calls (ReadResult.Inline on their
// side: shm by cross-memory attach), which need this endpoint's progress
// only to give back the provider's command slots they take: while no
// Serve is live, the progress loop naps up to a millisecond between polls
// instead of 50 us, so that it spins less on the locks such readers hold
// over each copy. A Serve that begins wakes it at once.
func (e *Endpoint) ServeInline(until time.Time) (done func()) { return e.serve(until, true) }

func (e *Endpoint) serve(until time.Time, inline bool) (done func()) {
	t := &serveTicket{until: until.UnixNano(), inline: inline}
	e.serveMu.Lock()
	now := time.Now().UnixNano()
	for o := range e.serves {
		if o.until <= now {
			delete(e.serves, o)
		}
	}
	e.serves[t] = struct{}{}
	latest := &e.servingUntil
	if inline {
		latest = &e.inlineUntil
	}
	if t.until > latest.Load() {
		latest.Store(t.until)
	}
	e.serveMu.Unlock()
	e.kick()
	var once sync.Once
	return func() {
		once.Do(func() {
			e.serveMu.Lock()
			defer e.serveMu.Unlock()
			delete(e.serves, t)
			var serving, inline int64
			for o := range e.serves {
				if o.inline {
					inline = max(inline, o.until)
				} else {
					serving = max(serving, o.until)
				}
			}
			e.servingUntil.Store(serving)
			e.inlineUntil.Store(inline)
		})
	}
}

type serveTicket struct {
	until  int64
	inline bool
}

// MaxNap is the longest the endpoint's progress loop naps between polls
// now: 20 us while a Read waits on it, 50 us while a Serve is live, 1 ms
// while only ServeInline ones are, 10 ms otherwise.
func (e *Endpoint) MaxNap() time.Duration { return e.napLimit() }

// Serving says whether the endpoint is serving now (a Serve or a
// ServeInline is live).
func (e *Endpoint) Serving() bool {
	now := time.Now().UnixNano()
	return now < e.servingUntil.Load() || now < e.inlineUntil.Load()
}

// takeInline takes what the completion queue holds, unless another thread
// is taking or posting (then that one delivers), and hands it to the reads
// that posted it.
func (e *Endpoint) takeInline(t *C.struct_kvf_take) {
	unlock, err := e.lockCalls()
	if err != nil {
		return
	}
	C.kvf_cq_take(e.ep, t, 1)
	e.inline.Add(uint64(e.deliver(t)))
	unlock()
}

// kick wakes the progress loop from its nap.
func (e *Endpoint) kick() {
	unlock, err := e.lockCalls()
	if err != nil {
		return
	}
	C.kvf_kick(e.ep)
	unlock()
}

// release frees the slot of a completed request and returns the reader
// that posted it (nil for a context not of the endpoint's), with the
// request's copy out of staging handed to it.
func (e *Endpoint) release(ctx unsafe.Pointer) *reader {
	i := int(C.kvf_ctx_index(e.slab, ctx))
	if i < 0 || i >= len(e.owner) {
		return nil
	}
	r := e.owner[i].Swap(nil)
	c := e.copies[i].Swap(nil)
	e.free <- i
	if r != nil && c != nil {
		r.addCopy(c)
	}
	return r
}

// Peer is a peer endpoint inserted into this endpoint's address vector.
type Peer struct {
	addr C.kvf_fi_addr_t
}

// AddPeer inserts a peer's endpoint name (its Name) into the address vector.
func (e *Endpoint) AddPeer(name []byte) (Peer, error) {
	if len(name) == 0 || len(name) > MaxNameLen {
		return Peer{}, fmt.Errorf("ofi: a peer's endpoint name of %d bytes: want 1..%d: %w", len(name), MaxNameLen, ErrInvalidArgument)
	}
	buf := C.CBytes(name)
	defer C.free(buf)
	var a C.kvf_fi_addr_t
	unlock, err := e.lockCalls()
	if err != nil {
		return Peer{}, err
	}
	rc := C.kvf_av_insert(e.ep, buf, &a)
	unlock()
	if rc != 1 {
		if rc >= 0 {
			return Peer{}, fmt.Errorf("ofi: %s: fi_av_insert took none of the peer's name (%d bytes): %w", e.info.Provider, len(name), ErrInvalidArgument)
		}
		return Peer{}, fmt.Errorf("ofi: %s: fi_av_insert: %w", e.info.Provider, e.lib.fiError(rc))
	}
	return Peer{addr: a}, nil
}

// RemovePeer takes a peer out of the address vector.
func (e *Endpoint) RemovePeer(p Peer) error {
	unlock, err := e.lockCalls()
	if err != nil {
		return err
	}
	rc := C.kvf_av_remove(e.ep, p.addr)
	unlock()
	if rc != 0 {
		return fmt.Errorf("ofi: %s: fi_av_remove: %w", e.info.Provider, e.lib.fiError(rc))
	}
	return nil
}

// Region is memory registered with the endpoint's domain: readable by peers
// holding its Remote, and usable as the destination of Read.
type Region struct {
	e     *Endpoint
	addr  uintptr
	len   uint64
	mr    *C.struct_kvf_fid_mr
	host  bool           // host memory, which staged reads may copy into
	key   uint64         // fi_mr_key, read at registration
	desc  unsafe.Pointer // fi_mr_desc, read at registration (C memory)
	inUse sync.RWMutex   // read-held by each Read into the region
	once  sync.Once
}

// Register registers host memory at [addr, addr+length), which must stay
// mapped until the region is closed (memory kvfabric's pools own: mmap'd,
// never the Go heap). Peers may read it; nothing may write it remotely.
//
// Its pages are faulted in first, writable and with their contents
// unchanged (populate), as a verbs registration pins them: shm and tcp
// pin nothing, and reads landing in memory never touched before would
// otherwise fault it in page by page inside the copy, which doubles the
// time of a pool's first reads into each slot. Where the kernel cannot
// (before Linux 5.14, memory not writable) the pages fault in on first
// use, as before.
func (e *Endpoint) Register(addr uintptr, length uint64) (*Region, error) {
	if addr != 0 && length != 0 && uint64(addr)+length >= uint64(addr) {
		populate(addr, length)
	}
	return e.register(addr, length, C.KVF_FI_HMEM_SYSTEM, 0)
}

// madvPopulateWrite is Linux's MADV_POPULATE_WRITE (5.14): fault the
// range's pages in as for a write, without writing them.
const madvPopulateWrite = 23

// populate faults in the pages of [addr, addr+length), best effort.
func populate(addr uintptr, length uint64) {
	page := uint64(os.Getpagesize())
	start := uint64(addr) &^ (page - 1)
	end := (uint64(addr) + length + page - 1) &^ (page - 1)
	if end <= start {
		return
	}
	syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(end-start), madvPopulateWrite)
}

// RegisterCUDA registers device memory of CUDA device dev at ptr, for
// providers that offer FI_HMEM.
func (e *Endpoint) RegisterCUDA(ptr uintptr, length uint64, dev int) (*Region, error) {
	if !e.info.HMEM {
		return nil, fmt.Errorf("ofi: %s does not register device memory (no FI_HMEM): %w", e.info.Provider, ErrNotSupported)
	}
	return e.register(ptr, length, C.KVF_FI_HMEM_CUDA, dev)
}

func (e *Endpoint) register(addr uintptr, length uint64, iface C.int, dev int) (*Region, error) {
	if addr == 0 || length == 0 {
		return nil, fmt.Errorf("ofi: register [%#x, +%d): empty or null: %w", addr, length, ErrInvalidArgument)
	}
	if uint64(addr)+length < uint64(addr) {
		return nil, fmt.Errorf("ofi: register [%#x, +%d) wraps: %w", addr, length, ErrInvalidArgument)
	}
	var key uint64
	if !e.plan.ProvKey {
		key = e.nextKey.Add(1)
	}
	bind := C.int(0)
	if e.plan.BindEndpoint {
		bind = 1
	}
	access := C.uint64_t(C.KVF_FI_READ | C.KVF_FI_REMOTE_READ)
	var mr *C.struct_kvf_fid_mr
	var step *C.char
	unlock, err := e.lockCalls()
	if err != nil {
		return nil, err
	}
	rc := C.kvf_mr_reg(e.ep, C.uintptr_t(addr), C.size_t(length), access, C.uint64_t(key), iface, C.int(dev), bind, &mr, &step)
	unlock()
	if rc != 0 {
		return nil, fmt.Errorf("ofi: %s: %s of %d bytes: %w", e.info.Provider, C.GoString(step), length, e.lib.fiError(rc))
	}
	// The key and descriptor are read once, while the registration is
	// surely open: an endpoint's Close frees it, and a peer told a key
	// read after that would be told garbage.
	r := &Region{e: e, addr: addr, len: length, mr: mr, host: iface == C.KVF_FI_HMEM_SYSTEM,
		key: uint64(C.kvf_mr_key(mr)), desc: C.kvf_mr_desc(mr)}
	e.mu.Lock()
	e.regions[r] = struct{}{}
	e.mu.Unlock()
	return r, nil
}

// Len is the region's length in bytes.
func (r *Region) Len() uint64 { return r.len }

// Remote describes the region for a peer.
func (r *Region) Remote() Remote {
	addr := uint64(0)
	if r.e.plan.VirtAddr {
		addr = uint64(r.addr)
	}
	return Remote{Addr: addr, Len: r.len, Key: r.key}
}

// Close deregisters the region once every Read into it has returned (as a
// NIC keeps memory pinned while a read is in flight). Safe twice.
func (r *Region) Close() error {
	var err error
	r.once.Do(func() {
		r.inUse.Lock()
		defer r.inUse.Unlock()
		// The endpoint's Close takes its regions as it marks itself
		// closed, and closes them after the calls under way: one still
		// among them once the calls are locked is this Close's to close.
		unlock, lerr := r.e.lockCalls()
		if lerr != nil {
			return // the endpoint closes it, or did
		}
		defer unlock()
		r.e.mu.Lock()
		_, live := r.e.regions[r]
		delete(r.e.regions, r)
		r.e.mu.Unlock()
		if !live {
			return // the endpoint closed it
		}
		rc := C.kvf_mr_close(r.mr)
		if rc != 0 {
			err = fmt.Errorf("ofi: close a region of %d bytes: %w", r.len, r.e.lib.fiError(rc))
		}
	})
	return err
}

// Read copies every segment from the peer into dst, and returns once all
// have arrived, or the first error. When ctx ends with requests in flight it
// waits for them up to the endpoint's flush grace, then closes the endpoint
// so that nothing lands in dst after Read returns.
func (e *Endpoint) Read(ctx context.Context, peer Peer, dst *Region, segs []Segment) error {
	_, err := e.ReadDetailed(ctx, peer, dst, segs)
	return err
}

// ReadDetailed is Read, and says how the read's requests completed.
func (e *Endpoint) ReadDetailed(ctx context.Context, peer Peer, dst *Region, segs []Segment) (ReadResult, error) {
	var res ReadResult
	if dst == nil || dst.e != e {
		return res, fmt.Errorf("ofi: read into a region of another endpoint or none: %w", ErrInvalidArgument)
	}
	if err := checkSegments(segs, dst.len); err != nil {
		return res, err
	}
	dst.inUse.RLock()
	defer dst.inUse.RUnlock()
	if err := e.usable(); err != nil {
		return res, err
	}
	err := e.read(ctx, peer, dst, segs, &res)
	res.Inline = err == nil && !res.Pending && res.Requests >= 2
	return res, err
}

// read is ReadDetailed after the checks: it counts the requests it posts
// in res.Requests, and sets res.Pending when a call that posted leaves any
// of them in flight.
func (e *Endpoint) read(ctx context.Context, peer Peer, dst *Region, segs []Segment, res *ReadResult) error {
	iovLimit := min(max(e.info.IOVLimit, 1), int(C.KVF_MAX_IOV))
	var reqs []request
	var stage *Region
	if e.info.StagesReads() && dst.host {
		stage = e.staging()
	}
	if stage != nil {
		reqs = gatherStaged(segs, e.info.MaxMsgSize, iovLimit, stageSlotBytes)
	} else {
		reqs = gather(segs, e.info.MaxMsgSize, iovLimit)
	}
	var desc, stageDesc unsafe.Pointer
	if e.plan.PassDesc(dst.host) {
		desc = dst.desc
	}
	if stage != nil && e.plan.PassDesc(true) {
		stageDesc = stage.desc
	}
	r := newReader()
	// What the read's own takes of the completion queue find: after each
	// batch it posts, and before it blocks. C memory, as the progress
	// loop's.
	t := (*C.struct_kvf_take)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_kvf_take{}))))
	defer C.free(unsafe.Pointer(t))
	// park comes before a select that blocks until completions come: it
	// takes what the queue holds now (unless the progress loop is at it),
	// then tells the loop that a read waits on it, which makes it poll
	// hot until the read is back (the function park returns). While reads
	// post and take their own completions, the loop only naps.
	park := func() (unpark func()) {
		e.takeInline(t)
		if e.waiting.Add(1) == 1 {
			e.kick()
		}
		return func() { e.waiting.Add(-1) }
	}
	inFlight := 0
	var first error
	// drain takes the completions that came, and copies the staged ones
	// out (none once the read failed: their bytes are not wanted).
	drain := func() {
		n, copies, err := r.take()
		inFlight -= n
		first = cmpErr(first, err)
		for _, c := range copies {
			if first == nil {
				first = e.copyOut(c)
			}
			e.stageFree <- c.slot
		}
	}
	// wait blocks until completions come, or ctx ends (false).
	wait := func() bool {
		unpark := park()
		defer unpark()
		select {
		case <-r.wake:
			drain()
			return true
		case <-ctx.Done():
			return false
		}
	}
	batch := make([]C.struct_kvf_req, min(postBatch, len(reqs)))
	slots := make([]int, 0, len(batch))
	// stages[k] is the staging slot of slots[k]'s request, -1 for none.
	stages := make([]int, 0, len(batch))
	var moved, staged uint64
	// refused is when the provider began refusing every request of the
	// read with nothing of it in flight; zero while it takes them.
	var refused time.Time
	var pause time.Duration
	for i := 0; i < len(reqs) && first == nil; {
		// A staging slot for the next request if it is staged, and a
		// context slot, waiting if need be; then as many more as are
		// free, up to a batch.
		stageSlot := -1
		if reqs[i].staged {
			unpark := func() {}
			if len(e.stageFree) == 0 {
				unpark = park()
			}
			select {
			case stageSlot = <-e.stageFree:
				unpark()
			case <-r.wake:
				unpark()
				drain()
				continue
			case <-e.stop:
				// The endpoint closes: no slot comes back. What is in
				// flight is flushed by Close, waited for below.
				unpark()
				first = cmpErr(first, e.closedErr())
				continue
			case <-ctx.Done():
				unpark()
				return e.abandon(ctx, r, inFlight, first)
			}
		}
		unpark := func() {}
		if len(e.free) == 0 {
			unpark = park()
		}
		select {
		case slot := <-e.free:
			unpark()
			slots, stages = append(slots[:0], slot), append(stages[:0], stageSlot)
		case <-r.wake:
			unpark()
			if stageSlot >= 0 {
				e.stageFree <- stageSlot
			}
			drain()
			continue
		case <-e.stop:
			unpark()
			if stageSlot >= 0 {
				e.stageFree <- stageSlot
			}
			first = cmpErr(first, e.closedErr())
			continue
		case <-ctx.Done():
			unpark()
			if stageSlot >= 0 {
				e.stageFree <- stageSlot
			}
			return e.abandon(ctx, r, inFlight, first)
		}
	more:
		for len(slots) < min(len(batch), len(reqs)-i) {
			select {
			case slot := <-e.free:
				stageSlot := -1
				if reqs[i+len(slots)].staged {
					select {
					case stageSlot = <-e.stageFree:
					default:
						e.free <- slot
						break more
					}
				}
				slots, stages = append(slots, slot), append(stages, stageSlot)
			default:
				break more
			}
		}
		for k, slot := range slots {
			q, b := &reqs[i+k], &batch[k]
			if q.staged {
				b.local[0] = C.uint64_t(uint64(stage.addr) + uint64(stages[k])*stageSlotBytes)
				b.local[1] = C.uint64_t(q.bytes())
				b.n, b.desc = 1, C.uintptr_t(uintptr(stageDesc))
				e.copies[slot].Store(&stagedCopy{slot: stages[k], dst: dst.addr, pieces: q.local})
			} else {
				for j, p := range q.local {
					b.local[2*j], b.local[2*j+1] = C.uint64_t(uint64(dst.addr)+p.off), C.uint64_t(p.len)
				}
				b.n, b.desc = C.uint64_t(len(q.local)), C.uintptr_t(uintptr(desc))
			}
			b.raddr, b.key = C.uint64_t(q.remoteAddr), C.uint64_t(q.key)
			b.ctx = C.uintptr_t(uintptr(C.kvf_ctx_at(e.slab, C.size_t(slot))))
			e.owner[slot].Store(r)
		}
		giveBack := func(from int) {
			for k, slot := range slots[from:] {
				e.owner[slot].Store(nil)
				e.copies[slot].Store(nil)
				e.free <- slot
				if st := stages[from+k]; st >= 0 {
					e.stageFree <- st
				}
			}
		}
		unlock, err := e.lockCalls()
		if err != nil {
			giveBack(0)
			first = cmpErr(first, err)
			break
		}
		var rc C.ssize_t
		posted := int(C.kvf_post(e.ep, &batch[0], C.size_t(len(slots)), peer.addr, &rc, t))
		e.inline.Add(uint64(e.deliver(t)))
		unlock()
		for k := range posted {
			moved += reqs[i+k].bytes()
			if reqs[i+k].staged {
				staged++
			}
		}
		inFlight += posted
		i += posted
		res.Requests += posted
		giveBack(posted)
		drain()
		if posted > 0 {
			refused, pause = time.Time{}, 0
			if inFlight > 0 {
				res.Pending = true
			}
		}
		switch {
		case rc == 0:
		case rc == -C.KVF_FI_EAGAIN:
			// The transmit queue is full: let completions drain it.
			if inFlight > 0 {
				if !wait() {
					return e.abandon(ctx, r, inFlight, first)
				}
				continue
			}
			// Nothing of the read is in flight: the provider is
			// connecting to the peer, or other reads fill its queue.
			// Wait a little longer each time, up to connectTimeout.
			now := time.Now()
			if refused.IsZero() {
				refused = now
			}
			if d := now.Sub(refused); d >= e.connectTimeout {
				first = fmt.Errorf("ofi: %s took no read request for %v: %w", e.info.Provider, d.Round(time.Millisecond), ErrUnreachable)
				continue
			}
			pause = min(max(2*pause, 10*time.Microsecond), time.Millisecond)
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-e.stop:
				t.Stop()
				first = cmpErr(first, e.closedErr())
			case <-ctx.Done():
				t.Stop()
				return e.abandon(ctx, r, inFlight, first)
			}
		default:
			first = cmpErr(first, fmt.Errorf("ofi: %s: posting a read of %d bytes: %w", e.info.Provider, reqs[i].bytes(), e.lib.fiError(C.int(rc))))
		}
	}
	for inFlight > 0 {
		if !wait() {
			return e.abandon(ctx, r, inFlight, first)
		}
	}
	e.staged.Add(staged)
	if first != nil {
		e.failures.Add(1)
		return first
	}
	e.reads.Add(1)
	e.bytes.Add(moved)
	return nil
}

// postBatch is the most requests one call into C posts.
const postBatch = 16

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// abandon ends a read whose context ended with requests in flight: they
// get the flush grace to complete, after which the endpoint is closed.
func (e *Endpoint) abandon(ctx context.Context, r *reader, inFlight int, first error) error {
	e.failures.Add(1)
	timer := time.NewTimer(e.grace)
	defer timer.Stop()
	if inFlight > 0 {
		// The progress loop polls hot for the requests in flight.
		if e.waiting.Add(1) == 1 {
			e.kick()
		}
		defer e.waiting.Add(-1)
	}
	for inFlight > 0 {
		select {
		case <-r.wake:
			n, copies, _ := r.take()
			inFlight -= n
			for _, c := range copies {
				e.stageFree <- c.slot
			}
		case <-timer.C:
			err := fmt.Errorf("ofi: %d reads on %s still in flight %v after the read was given up: endpoint closed: %w",
				inFlight, e.info.Provider, e.grace, ErrClosed)
			e.fail(err)
			return fmt.Errorf("ofi: read: %w (%w)", ctx.Err(), err)
		}
	}
	if first != nil {
		return first
	}
	return fmt.Errorf("ofi: read on %s: %w", e.info.Provider, ctx.Err())
}

// fail closes the endpoint because of err: later calls return it.
func (e *Endpoint) fail(err error) {
	e.mu.Lock()
	if e.broken == nil {
		e.broken = err
	}
	e.mu.Unlock()
	e.Close()
}

// Close stops the progress loop and closes every region and the endpoint.
// Reads still waiting return ErrClosed. Safe twice.
func (e *Endpoint) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	regions := make([]*Region, 0, len(e.regions))
	for r := range e.regions {
		regions = append(regions, r)
	}
	e.regions = map[*Region]struct{}{}
	e.mu.Unlock()
	close(e.stop)
	C.kvf_kick(e.ep) // the loop may nap up to idleMaxNap
	<-e.done
	e.live.Lock()
	defer e.live.Unlock()
	var errs []error
	for _, r := range regions {
		if rc := C.kvf_mr_close(r.mr); rc != 0 {
			errs = append(errs, fmt.Errorf("ofi: close a region: %w", e.lib.fiError(rc)))
		}
	}
	e.closeC()
	e.mu.Lock()
	mem := e.stageMem
	e.stageMem = nil
	e.mu.Unlock()
	if mem != nil {
		syscall.Munmap(mem)
	}
	// Whatever was in flight is flushed with the endpoint.
	for i := range e.owner {
		if r := e.owner[i].Swap(nil); r != nil {
			r.add(1, e.closedErr())
		}
	}
	e.lib.mu.Lock()
	delete(e.lib.eps, e)
	e.lib.mu.Unlock()
	return errors.Join(errs...)
}

// closedErr is a read's error when its endpoint closed under it.
func (e *Endpoint) closedErr() error {
	return fmt.Errorf("ofi: endpoint on %s: %w", e.info.Provider, ErrClosed)
}

func (e *Endpoint) closeC() {
	if e.ep != nil {
		C.kvf_ep_close(e.ep)
		C.free(unsafe.Pointer(e.ep))
		e.ep = nil
	}
	if e.slab != nil {
		C.free(e.slab)
		e.slab = nil
	}
}
