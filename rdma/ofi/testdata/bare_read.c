/*
 * bare_read: the baseline for BenchmarkRead. Two RDM endpoints of one
 * provider in one process; the reader fetches the holder's region with
 * fi_read in pieces of a given size, a given number in flight, polling both
 * completion queues (software providers progress the serving side only when
 * it polls). Built against libfabric's own headers and library; prints
 * "bytes wall_ns cpu_ns".
 *
 * usage: bare_read PROVIDER NODE|- BYTES PIECE WINDOW ROUNDS
 */
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHECK(x) do { int rc_ = (x); if (rc_) { fprintf(stderr, "%s: %s\n", #x, fi_strerror(-rc_)); exit(1); } } while (0)

struct side {
	struct fid_fabric *fab;
	struct fid_domain *dom;
	struct fid_av *av;
	struct fid_cq *cq;
	struct fid_ep *ep;
	struct fid_mr *mr;
	char *buf;
};

static void open_side(struct fi_info *info, struct side *s, size_t bytes) {
	CHECK(fi_fabric(info->fabric_attr, &s->fab, NULL));
	CHECK(fi_domain(s->fab, info, &s->dom, NULL));
	struct fi_av_attr av = {.type = FI_AV_TABLE};
	CHECK(fi_av_open(s->dom, &av, &s->av, NULL));
	struct fi_cq_attr cq = {.size = 1024, .format = FI_CQ_FORMAT_CONTEXT, .wait_obj = FI_WAIT_NONE};
	CHECK(fi_cq_open(s->dom, &cq, &s->cq, NULL));
	CHECK(fi_endpoint(s->dom, info, &s->ep, NULL));
	CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
	CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_SEND | FI_RECV));
	CHECK(fi_enable(s->ep));
	s->buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_ANON | MAP_PRIVATE, -1, 0);
	memset(s->buf, 0x5a, bytes);
	CHECK(fi_mr_reg(s->dom, s->buf, bytes, FI_READ | FI_REMOTE_READ, 0, 1, 0, &s->mr, NULL));
	if (info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
		CHECK(fi_mr_bind(s->mr, &s->ep->fid, 0));
		CHECK(fi_mr_enable(s->mr));
	}
}

// close_side closes what open_side opened (shm removes the endpoint's
// region from /dev/shm only then).
static void close_side(struct side *s) {
	fi_close(&s->mr->fid);
	fi_close(&s->ep->fid);
	fi_close(&s->cq->fid);
	fi_close(&s->av->fid);
	fi_close(&s->dom->fid);
	fi_close(&s->fab->fid);
}

static long long now(clockid_t c) {
	struct timespec ts;
	clock_gettime(c, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv) {
	if (argc != 7) {
		fprintf(stderr, "usage: bare_read PROVIDER NODE|- BYTES PIECE WINDOW ROUNDS\n");
		return 2;
	}
	size_t bytes = strtoull(argv[3], 0, 10), piece = strtoull(argv[4], 0, 10);
	int window = atoi(argv[5]), rounds = atoi(argv[6]);
	struct fi_info *hints = fi_allocinfo(), *info;
	hints->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->ep_attr->type = FI_EP_RDM;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	hints->fabric_attr->prov_name = strdup(argv[1]);
	const char *node = strcmp(argv[2], "-") ? argv[2] : NULL;
	// shm's default endpoint name is the process ID, under which a killed
	// process may have left its region in /dev/shm: a name of our own.
	char shm_name[64];
	if (!node && strcmp(argv[1], "shm") == 0) {
		snprintf(shm_name, sizeof(shm_name), "kvf-bare-%d-%ld", (int)getpid(), (long)time(NULL));
		node = shm_name;
	}
	CHECK(fi_getinfo(FI_VERSION(1, 17), node, NULL, node ? FI_SOURCE : 0, hints, &info));
	struct side h, r;
	open_side(info, &h, bytes);
	open_side(info, &r, bytes);
	char name[256];
	size_t n = sizeof(name);
	CHECK(fi_getname(&h.ep->fid, name, &n));
	fi_addr_t peer;
	if (fi_av_insert(r.av, name, 1, &peer, 0, NULL) != 1) return 1;
	uint64_t base = (info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)h.buf : 0;
	uint64_t key = fi_mr_key(h.mr);
	struct fi_context2 *ctx = calloc(window, sizeof(*ctx));
	struct fi_cq_entry ent[64];
	long long w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
	for (int round = 0; round < rounds; round++) {
		size_t posted = 0, done = 0, total = bytes / piece;
		int inflight = 0;
		while (done < total) {
			while (inflight < window && posted < total) {
				size_t off = posted * piece;
				ssize_t rc = fi_read(r.ep, r.buf + off, piece, fi_mr_desc(r.mr), peer, base + off, key, &ctx[posted % window]);
				if (rc == -FI_EAGAIN) break;
				if (rc) { fprintf(stderr, "fi_read: %s\n", fi_strerror(-rc)); return 1; }
				posted++;
				inflight++;
			}
			fi_cq_read(h.cq, ent, 64);
			ssize_t got = fi_cq_read(r.cq, ent, 64);
			if (got > 0) { done += got; inflight -= got; }
			else if (got != -FI_EAGAIN) { fprintf(stderr, "fi_cq_read: %s\n", fi_strerror(-got)); return 1; }
		}
	}
	long long w1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_PROCESS_CPUTIME_ID);
	if (memcmp(r.buf, h.buf, bytes) != 0) { fprintf(stderr, "bytes differ\n"); return 1; }
	printf("%zu %lld %lld\n", bytes * rounds, w1 - w0, c1 - c0);
	close_side(&r);
	close_side(&h);
	fi_freeinfo(info);
	return 0;
}
