// faultfab: libfabric with faults, for agents that load it as their
// libfabric (KVFABRIC_LIBFABRIC_LIB). It exports the calls kvfabric's
// binding looks up and forwards each to the real library (FAULTFAB_REAL,
// else libfabric.so.1), wrapping the fabric's domain call so that every
// memory registration passes through faultfab first. The faults are read
// from the file FAULTFAB_CONTROL at each registration, as "key=value,...":
//
//	wrong_key=1   the registration's key, as the caller reads it, is not
//	              the one the provider registered (it is restored for close)
//	short_reg=1   the provider registers the first half of the memory only
//	delay_us=N    every read posted waits N microseconds first, so that a
//	              read lasts long enough for a fault to land in it
//
// Everything else is the real provider's doing.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

// fault returns the value the control file gives name, or 0.
static int fault(const char *name) {
	const char *path = getenv("FAULTFAB_CONTROL");
	if (!path || !*path) return 0;
	FILE *f = fopen(path, "r");
	if (!f) return 0;
	char buf[512];
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	size_t len = strlen(name);
	for (char *p = buf; (p = strstr(p, name)) != NULL; p += len) {
		if ((p == buf || p[-1] == ',' || p[-1] == '\n' || p[-1] == ' ') && p[len] == '=')
			return atoi(p + len + 1);
	}
	return 0;
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

static void delay(void) {
	int us = fault("delay_us");
	if (us > 0) usleep(us);
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
