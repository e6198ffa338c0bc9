// faultfab: libfabric with faults, for agents that load it as their
// libfabric (KVFABRIC_LIBFABRIC_LIB). It exports the calls kvfabric's
// binding looks up and forwards each to the real library (FAULTFAB_REAL,
// else libfabric.so.1), wrapping the fabric's domain call so that every
// memory registration passes through faultfab first. The faults are read
// from the file FAULTFAB_CONTROL at each registration and each read posted,
// as "key=value,...":
//
//	wrong_key=1   the registration's key, as the caller reads it, is not
//	              the one the provider registered (it is restored for close)
//	short_reg=1   the provider registers the first half of the memory only
//	delay_us=N    every read posted waits N microseconds first, so that a
//	              read lasts long enough for a fault to land in it
//	hold_after=N  the first N reads posted that find it set go to the
//	              provider; every one after them waits, posted by the
//	              caller but not yet given to the provider, until it is
//	              cleared. The first to wait creates the file named
//	              FAULTFAB_CONTROL with ".held" added: a test that waits
//	              for that file knows that a read is in flight (N of its
//	              requests, or of the reads before it, with the provider)
//	              when it does what should land in one. The count starts
//	              again, and the file is removed, once it is unset. A
//	              read is held at most 60 s (faultfab says so on stderr):
//	              past that it and every read after it go on until
//	              hold_after is unset.
//
// Write the file whole, as a new file renamed over the old: a half-written
// one may be read.
//
// Everything else is the real provider's doing.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <unistd.h>

static struct {
	pthread_once_t once;
	void *h;
	int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *, struct fi_info **);
	void (*freeinfo)(struct fi_info *);
	struct fi_info *(*dupinfo)(const struct fi_info *);
	int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
	const char *(*strerror)(int);
	uint32_t (*version)(void);
} real = {PTHREAD_ONCE_INIT};

static void load(void) {
	const char *path = getenv("FAULTFAB_REAL");
	real.h = dlopen(path && *path ? path : "libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!real.h) {
		fprintf(stderr, "faultfab: %s\n", dlerror());
		abort();
	}
	real.getinfo = dlsym(real.h, "fi_getinfo");
	real.freeinfo = dlsym(real.h, "fi_freeinfo");
	real.dupinfo = dlsym(real.h, "fi_dupinfo");
	real.fabric = dlsym(real.h, "fi_fabric");
	real.strerror = dlsym(real.h, "fi_strerror");
	real.version = dlsym(real.h, "fi_version");
}

#define REAL(f) (pthread_once(&real.once, load), real.f)

// The real library loads with faultfab, as a library linked to it would.
__attribute__((constructor)) static void load_now(void) { pthread_once(&real.once, load); }

// faults reads the control file into buf (size bytes); it is empty
// where there is none.
static void faults(char *buf, size_t size) {
	buf[0] = 0;
	const char *path = getenv("FAULTFAB_CONTROL");
	if (!path || !*path) return;
	FILE *f = fopen(path, "r");
	if (!f) return;
	size_t n = fread(buf, 1, size - 1, f);
	fclose(f);
	buf[n] = 0;
}

// lookup says whether the faults in buf name name, and sets *v to its
// value.
static int lookup(const char *buf, const char *name, int *v) {
	size_t len = strlen(name);
	for (const char *p = buf; (p = strstr(p, name)) != NULL; p += len) {
		if ((p == buf || p[-1] == ',' || p[-1] == '\n' || p[-1] == ' ') && p[len] == '=') {
			*v = atoi(p + len + 1);
			return 1;
		}
	}
	return 0;
}

// fault returns the value the control file gives name, or 0.
static int fault(const char *name) {
	char buf[512];
	int v = 0;
	faults(buf, sizeof(buf));
	lookup(buf, name, &v);
	return v;
}

// A region whose key was changed: its own fid ops, whose close puts the
// key back before the provider's close runs.
struct keyed {
	struct keyed *next;
	struct fid *fid;
	struct fi_ops *orig, ops;
	uint64_t key;
};

static pthread_mutex_t keyed_mu = PTHREAD_MUTEX_INITIALIZER;
static struct keyed *keyed_list;

static int keyed_close(struct fid *fid) {
	pthread_mutex_lock(&keyed_mu);
	struct keyed **pp = &keyed_list, *k = NULL;
	for (; *pp; pp = &(*pp)->next) {
		if ((*pp)->fid == fid) {
			k = *pp;
			*pp = k->next;
			break;
		}
	}
	pthread_mutex_unlock(&keyed_mu);
	if (!k) return -FI_EINVAL;
	struct fid_mr *mr = (struct fid_mr *)fid;
	mr->key = k->key;
	fid->ops = k->orig;
	free(k);
	return fid->ops->close(fid);
}

static int (*real_regattr)(struct fid *, const struct fi_mr_attr *, uint64_t, struct fid_mr **);

static int fault_regattr(struct fid *fid, const struct fi_mr_attr *attr, uint64_t flags, struct fid_mr **mr) {
	struct fi_mr_attr a = *attr;
	struct iovec iov[4];
	if (fault("short_reg") && attr->iov_count >= 1 && attr->iov_count <= 4) {
		memcpy(iov, attr->mr_iov, attr->iov_count * sizeof(iov[0]));
		iov[0].iov_len /= 2;
		a.mr_iov = iov;
	}
	int rc = real_regattr(fid, &a, flags, mr);
	if (rc != 0 || !fault("wrong_key")) return rc;
	struct keyed *k = calloc(1, sizeof(*k));
	if (!k) return rc;
	k->fid = &(*mr)->fid;
	k->orig = (*mr)->fid.ops;
	k->ops = *k->orig;
	k->ops.close = keyed_close;
	k->key = (*mr)->key;
	pthread_mutex_lock(&keyed_mu);
	k->next = keyed_list;
	keyed_list = k;
	pthread_mutex_unlock(&keyed_mu);
	(*mr)->fid.ops = &k->ops;
	(*mr)->key ^= 0x5a5a5a;
	return 0;
}

static struct fi_ops_rma *real_rma;

// held_passed counts the reads that went to the provider while hold_after
// was set, and held_expired says a read waited holdLimit, under held_mu.
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static int held_passed, held_expired;

// holdLimit bounds how long a read is held: a test that fails between
// setting hold_after and clearing it must not leave the reader stuck (a
// held read keeps the endpoint's lock). Past it the read goes on, and so
// does every read after it until hold_after is cleared.
#define holdLimit 60

// heldPath is the file that says a read is held.
static void heldPath(char *path, size_t size) { snprintf(path, size, "%s.held", getenv("FAULTFAB_CONTROL")); }

// hold makes a read wait while hold_after holds it (see the top).
static void hold(int after) {
	pthread_mutex_lock(&held_mu);
	int pass = held_passed < after || held_expired;
	if (pass) held_passed++;
	pthread_mutex_unlock(&held_mu);
	if (pass) return;
	char path[4096];
	heldPath(path, sizeof(path));
	FILE *f = fopen(path, "w");
	if (f) fclose(f);
	char buf[512];
	int v;
	time_t start = time(NULL);
	for (;;) {
		usleep(1000);
		faults(buf, sizeof(buf));
		if (!lookup(buf, "hold_after", &v)) break;
		if (time(NULL) - start >= holdLimit) {
			fprintf(stderr, "faultfab: hold_after held a read %d s and was not cleared: letting it and the reads after it go\n",
				holdLimit);
			pthread_mutex_lock(&held_mu);
			held_expired = 1;
			pthread_mutex_unlock(&held_mu);
			break;
		}
	}
	unlink(path);
}

// delay applies the faults of a read about to be posted: delay_us, then
// hold_after.
static void delay(void) {
	char buf[512];
	int us = 0, after = 0;
	faults(buf, sizeof(buf));
	lookup(buf, "delay_us", &us);
	if (us > 0) usleep(us);
	if (lookup(buf, "hold_after", &after)) {
		hold(after);
		return;
	}
	pthread_mutex_lock(&held_mu);
	int was = held_passed > 0 || held_expired;
	held_passed = held_expired = 0;
	pthread_mutex_unlock(&held_mu);
	if (was) {
		char path[4096];
		heldPath(path, sizeof(path));
		unlink(path);
	}
}

static ssize_t fault_read(struct fid_ep *ep, void *buf, size_t len, void *desc, fi_addr_t src, uint64_t addr,
		uint64_t key, void *ctx) {
	delay();
	return real_rma->read(ep, buf, len, desc, src, addr, key, ctx);
}

static ssize_t fault_readv(struct fid_ep *ep, const struct iovec *iov, void **desc, size_t count, fi_addr_t src,
		uint64_t addr, uint64_t key, void *ctx) {
	delay();
	return real_rma->readv(ep, iov, desc, count, src, addr, key, ctx);
}

static ssize_t fault_readmsg(struct fid_ep *ep, const struct fi_msg_rma *msg, uint64_t flags) {
	delay();
	return real_rma->readmsg(ep, msg, flags);
}

static int (*real_endpoint)(struct fid_domain *, struct fi_info *, struct fid_ep **, void *);

static int fault_endpoint(struct fid_domain *dom, struct fi_info *info, struct fid_ep **ep, void *ctx) {
	int rc = real_endpoint(dom, info, ep, ctx);
	if (rc != 0) return rc;
	struct fi_ops_rma *ops = malloc(sizeof(*ops));
	if (!ops) return rc;
	real_rma = (*ep)->rma;
	*ops = *real_rma;
	ops->read = fault_read;
	ops->readv = fault_readv;
	ops->readmsg = fault_readmsg;
	(*ep)->rma = ops; // one small table per endpoint, never freed
	return 0;
}

static int (*real_domain)(struct fid_fabric *, struct fi_info *, struct fid_domain **, void *);

static int fault_domain(struct fid_fabric *fab, struct fi_info *info, struct fid_domain **dom, void *ctx) {
	int rc = real_domain(fab, info, dom, ctx);
	if (rc != 0) return rc;
	struct fi_ops_mr *ops = malloc(sizeof(*ops));
	if (!ops) return rc;
	*ops = *(*dom)->mr;
	real_regattr = ops->regattr;
	ops->regattr = fault_regattr;
	(*dom)->mr = ops; // one small table per domain, never freed
	struct fi_ops_domain *dops = malloc(sizeof(*dops));
	if (!dops) return rc;
	*dops = *(*dom)->ops;
	real_endpoint = dops->endpoint;
	dops->endpoint = fault_endpoint;
	(*dom)->ops = dops; // the same
	return 0;
}

int fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fab, void *ctx) {
	int rc = REAL(fabric)(attr, fab, ctx);
	if (rc != 0) return rc;
	struct fi_ops_fabric *ops = malloc(sizeof(*ops));
	if (!ops) return rc;
	*ops = *(*fab)->ops;
	real_domain = ops->domain;
	ops->domain = fault_domain;
	(*fab)->ops = ops; // one small table per fabric, never freed
	return 0;
}

int fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const struct fi_info *hints,
		struct fi_info **info) {
	return REAL(getinfo)(version, node, service, flags, hints, info);
}

void fi_freeinfo(struct fi_info *info) { REAL(freeinfo)(info); }
struct fi_info *fi_dupinfo(const struct fi_info *info) { return REAL(dupinfo)(info); }
const char *fi_strerror(int errnum) { return REAL(strerror)(errnum); }
uint32_t fi_version(void) { return REAL(version)(); }
