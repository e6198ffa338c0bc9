// svdriver: a process that drives softverbs for the package's tests. It reads
// one command a line on stdin and answers one line on stdout ("ok ..." or
// "err ..."), so a Go test can run several of them as separate processes.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

// The RoCE v2 IPv4-mapped GID in mlx5's table layout (v1, v2 per address;
// link-local first).
#define SGID_V2 3

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq;
static struct ibv_qp *qp; // the QP a command acts on: qps[qp=N], default 0
static struct ibv_qp *qps[8];
static int nqps;
static struct ibv_qp_init_attr qp_init;
static int link_ib;

#define MAXBUF 16
static struct {
	char name[32];
	uint8_t *p;
	size_t len;
	struct ibv_mr *mr;
	int fd;
} bufs[MAXBUF];

static uint64_t splitmix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static uint8_t pattern(uint64_t seed, uint64_t i)
{
	return (uint8_t)(splitmix(seed * 0x100000001b3ull ^ (i / 8)) >> (8 * (i % 8)));
}

static int find(const char *name)
{
	for (int i = 0; i < MAXBUF; i++)
		if (bufs[i].p && strcmp(bufs[i].name, name) == 0)
			return i;
	return -1;
}

// key=value lookup in the rest of a command line
static long long opt(char **argv, int argc, const char *key, long long def)
{
	size_t k = strlen(key);
	for (int i = 0; i < argc; i++)
		if (strncmp(argv[i], key, k) == 0 && argv[i][k] == '=')
			return strtoll(argv[i] + k + 1, NULL, 0);
	return def;
}

static const char *sopt(char **argv, int argc, const char *key)
{
	size_t k = strlen(key);
	for (int i = 0; i < argc; i++)
		if (strncmp(argv[i], key, k) == 0 && argv[i][k] == '=')
			return argv[i] + k + 1;
	return NULL;
}

static void hex(char *out, const uint8_t *g)
{
	for (int i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", g[i]);
}

static int cmd_open(char **a, int n)
{
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	int dev = (int)opt(a, n, "dev", 0);
	if (!list || num <= dev)
		return printf("err no device (%d)\n", num), 0;
	char name[64];
	snprintf(name, sizeof(name), "%s", ibv_get_device_name(list[dev]));
	ctx = ibv_open_device(list[dev]);
	ibv_free_device_list(list);
	if (!ctx)
		return printf("err open errno=%d\n", errno), 0;
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa))
		return printf("err query_port\n"), 0;
	link_ib = pa.link_layer == IBV_LINK_LAYER_INFINIBAND;
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, (int)opt(a, n, "cqe", 64), NULL, NULL, 0);
	if (!pd || !cq)
		return printf("err pd/cq errno=%d\n", errno), 0;
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.sq_sig_all = (int)opt(a, n, "sigall", 0),
		.cap = {.max_send_wr = (uint32_t)opt(a, n, "wr", 16), .max_recv_wr = 1,
			.max_send_sge = (uint32_t)opt(a, n, "sge", 4), .max_recv_sge = 1},
	};
	qp_init = ia;
	qp = ibv_create_qp(pd, &ia);
	if (!qp)
		return printf("err create_qp errno=%d\n", errno), 0;
	qps[nqps++] = qp;
	union ibv_gid g;
	char h[33];
	ibv_query_gid(ctx, 1, link_ib ? 0 : SGID_V2, &g);
	hex(h, g.raw);
	printf("ok qpn=%u lid=%u gid=%s state=%d dev=%s ndev=%d\n", qp->qp_num, pa.lid, h, pa.state, name, num);
	return 0;
}

// addqp: another QP like the first, on the same PD and CQ.
static int cmd_addqp(void)
{
	if (nqps == 8)
		return printf("err too many\n"), 0;
	struct ibv_qp_init_attr ia = qp_init;
	struct ibv_qp *q = ibv_create_qp(pd, &ia);
	if (!q)
		return printf("err create_qp errno=%d\n", errno), 0;
	qps[nqps] = q;
	printf("ok qp=%d qpn=%u\n", nqps++, q->qp_num);
	return 0;
}

static int cmd_buf(char **a, int n)
{
	if (n < 3)
		return printf("err usage: buf NAME SIZE SEED [access=] [dmabuf=1] [iova=]\n"), 0;
	int i = 0;
	while (i < MAXBUF && bufs[i].p)
		i++;
	size_t len = strtoull(a[1], NULL, 0);
	uint64_t seed = strtoull(a[2], NULL, 0);
	int access = (int)opt(a, n, "access", IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	snprintf(bufs[i].name, sizeof(bufs[i].name), "%s", a[0]);
	bufs[i].len = len;
	bufs[i].fd = -1;
	if (opt(a, n, "dmabuf", 0) == 2) {
		// not a memfd: refused
		static uint8_t plain[4096];
		int fd = open("/dev/zero", O_RDWR | O_CLOEXEC);
		bufs[i].mr = ibv_reg_dmabuf_mr(pd, 0, len, 0x10000000, fd, access);
		int e = errno;
		close(fd);
		if (bufs[i].mr)
			return printf("ok unexpected\n"), 0;
		(void)plain;
		return printf("err reg errno=%d\n", e), 0;
	}
	if (opt(a, n, "dmabuf", 0)) {
		int fd = memfd_create("svdriver", MFD_CLOEXEC);
		uint64_t off = (uint64_t)opt(a, n, "off", 0);
		if (fd < 0 || ftruncate(fd, (off_t)(off + len)) != 0)
			return printf("err memfd\n"), 0;
		uint8_t *p = mmap(NULL, off + len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED)
			return printf("err mmap\n"), 0;
		bufs[i].p = p + off;
		bufs[i].fd = fd;
		for (size_t k = 0; k < len; k++)
			bufs[i].p[k] = seed ? pattern(seed, k) : 0;
		uint64_t iova = (uint64_t)opt(a, n, "iova", 0x10000000);
		bufs[i].mr = ibv_reg_dmabuf_mr(pd, off, len, iova, fd, access);
	} else {
		uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			return printf("err mmap\n"), 0;
		bufs[i].p = p;
		for (size_t k = 0; k < len; k++)
			p[k] = seed ? pattern(seed, k) : 0;
		bufs[i].mr = ibv_reg_mr(pd, p, len, access);
	}
	if (!bufs[i].mr) {
		int e = errno;
		bufs[i].p = NULL;
		return printf("err reg errno=%d\n", e), 0;
	}
	printf("ok addr=%llu lkey=%u rkey=%u\n", (unsigned long long)(uintptr_t)bufs[i].mr->addr,
	       bufs[i].mr->lkey, bufs[i].mr->rkey);
	return 0;
}

static int modify(int state, int mask, struct ibv_qp_attr *at)
{
	at->qp_state = state;
	return ibv_modify_qp(qp, at, mask | IBV_QP_STATE);
}

static int cmd_connect(char **a, int n)
{
	if (n < 2)
		return printf("err usage: connect QPN GID|lid=N\n"), 0;
	struct ibv_qp_attr at;
	memset(&at, 0, sizeof(at));
	at.port_num = 1;
	at.qp_access_flags = (unsigned)opt(a, n, "access", IBV_ACCESS_REMOTE_READ);
	int rc = modify(IBV_QPS_INIT, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, &at);
	if (rc)
		return printf("err init rc=%d\n", rc), 0;
	memset(&at, 0, sizeof(at));
	struct ibv_port_attr pa;
	if (ibv_query_port(ctx, 1, &pa))
		return printf("err query_port\n"), 0;
	at.path_mtu = (enum ibv_mtu)opt(a, n, "mtu", pa.active_mtu);
	at.dest_qp_num = (uint32_t)strtoul(a[0], NULL, 0);
	at.rq_psn = (uint32_t)opt(a, n, "rqpsn", 0);
	at.max_dest_rd_atomic = (uint8_t)opt(a, n, "mdra", 16);
	at.min_rnr_timer = 12;
	at.ah_attr.port_num = 1;
	if (strncmp(a[1], "lid=", 4) == 0) {
		at.ah_attr.dlid = (uint16_t)strtoul(a[1] + 4, NULL, 0);
	} else {
		at.ah_attr.is_global = 1;
		at.ah_attr.grh.sgid_index = (uint8_t)opt(a, n, "sgid", link_ib ? 0 : SGID_V2);
		at.ah_attr.grh.hop_limit = 1;
		for (int i = 0; i < 16; i++) {
			unsigned v;
			sscanf(a[1] + 2 * i, "%2x", &v);
			at.ah_attr.grh.dgid.raw[i] = (uint8_t)v;
		}
	}
	rc = modify(IBV_QPS_RTR,
		    IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			    IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
		    &at);
	if (rc)
		return printf("err rtr rc=%d\n", rc), 0;
	memset(&at, 0, sizeof(at));
	at.timeout = (uint8_t)opt(a, n, "timeout", 14);
	at.retry_cnt = (uint8_t)opt(a, n, "retry", 7);
	at.rnr_retry = 7;
	at.sq_psn = (uint32_t)opt(a, n, "sqpsn", 0);
	at.max_rd_atomic = (uint8_t)opt(a, n, "mra", 16);
	rc = modify(IBV_QPS_RTS,
		    IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			    IBV_QP_MAX_QP_RD_ATOMIC,
		    &at);
	if (rc)
		return printf("err rts rc=%d\n", rc), 0;
	printf("ok\n");
	return 0;
}

// post [op=read|write] wrid=N sig=0|1 rkey=K raddr=A sge=NAME:OFF:LEN[:LKEY],... [count=C]
static int cmd_post(char **a, int n)
{
	static struct ibv_send_wr wrs[8192];
	static struct ibv_sge sges[8192][32];
	const char *op = sopt(a, n, "op");
	const char *sl = sopt(a, n, "sge");
	int count = (int)opt(a, n, "count", 1);
	if (count < 1 || count > 8192)
		return printf("err count\n"), 0;
	int nsge = 0;
	struct ibv_sge list[64];
	if (sl && *sl) {
		char tmp[2048];
		snprintf(tmp, sizeof(tmp), "%s", sl);
		char *save = NULL;
		for (char *s = strtok_r(tmp, ",", &save); s && nsge < 64; s = strtok_r(NULL, ",", &save)) {
			char name[32];
			unsigned long long off, len;
			long long lkey = -1;
			int f = sscanf(s, "%31[^:]:%llu:%llu:%lld", name, &off, &len, &lkey);
			int b = find(name);
			if (f < 3 || b < 0)
				return printf("err sge %s\n", s), 0;
			list[nsge].addr = (uintptr_t)bufs[b].mr->addr + off;
			list[nsge].length = (uint32_t)len;
			list[nsge].lkey = lkey >= 0 ? (uint32_t)lkey : bufs[b].mr->lkey;
			nsge++;
		}
	}
	if (nsge > 32)
		nsge = (int)opt(a, n, "nsge", nsge);
	for (int i = 0; i < count; i++) {
		memset(&wrs[i], 0, sizeof(wrs[i]));
		wrs[i].wr_id = (uint64_t)opt(a, n, "wrid", 1) + (uint64_t)i;
		wrs[i].opcode = (op && strcmp(op, "write") == 0) ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
		wrs[i].send_flags = opt(a, n, "sig", 1) ? IBV_SEND_SIGNALED : 0;
		if (i == count - 1 && opt(a, n, "siglast", 0))
			wrs[i].send_flags = IBV_SEND_SIGNALED;
		wrs[i].wr.rdma.rkey = (uint32_t)opt(a, n, "rkey", 0);
		wrs[i].wr.rdma.remote_addr = (uint64_t)opt(a, n, "raddr", 0);
		int k = nsge > 32 ? 32 : nsge;
		memcpy(sges[i], list, (size_t)k * sizeof(list[0]));
		wrs[i].sg_list = sges[i];
		wrs[i].num_sge = (int)opt(a, n, "nsge", nsge);
		wrs[i].next = i + 1 < count ? &wrs[i + 1] : NULL;
	}
	struct ibv_send_wr *bad = NULL;
	int rc = qp->context->ops.post_send(qp, wrs, &bad);
	if (rc)
		return printf("err rc=%d bad=%llu\n", rc, bad ? (unsigned long long)bad->wr_id : 0ull), 0;
	printf("ok\n");
	return 0;
}

static uint64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

// poll N MS: up to N completions within MS milliseconds.
static int cmd_poll(char **a, int n)
{
	int want = n > 0 ? atoi(a[0]) : 1;
	uint64_t ms = n > 1 ? strtoull(a[1], NULL, 0) : 1000;
	uint64_t start = now_ms();
	static struct ibv_wc wc[65536];
	int got = 0;
	if (want > 65536)
		want = 65536;
	while (got < want) {
		int r = cq->context->ops.poll_cq(cq, want - got, wc + got);
		if (r < 0) {
			printf("err poll rc=%d got=%d\n", r, got);
			return 0;
		}
		got += r;
		if (got < want) {
			if (now_ms() - start > ms)
				break;
			usleep(200);
		}
	}
	printf("ok n=%d ms=%llu", got, (unsigned long long)(now_ms() - start));
	for (int i = 0; i < got; i++)
		printf(" %llu:%d:%u", (unsigned long long)wc[i].wr_id, wc[i].status, wc[i].byte_len);
	printf("\n");
	return 0;
}

// check NAME OFF LEN SEED SOFF: bytes equal pattern(SEED, SOFF+i)?
static int cmd_check(char **a, int n)
{
	if (n < 5)
		return printf("err usage\n"), 0;
	int b = find(a[0]);
	if (b < 0)
		return printf("err no buf\n"), 0;
	size_t off = strtoull(a[1], NULL, 0), len = strtoull(a[2], NULL, 0);
	uint64_t seed = strtoull(a[3], NULL, 0), soff = strtoull(a[4], NULL, 0);
	for (size_t i = 0; i < len; i++) {
		uint8_t want = seed ? pattern(seed, soff + i) : 0;
		if (bufs[b].p[off + i] != want)
			return printf("err mismatch at %zu: %u want %u\n", off + i, bufs[b].p[off + i], want), 0;
	}
	printf("ok\n");
	return 0;
}

static int cmd_dereg(char **a, int n)
{
	int b = n > 0 ? find(a[0]) : -1;
	if (b < 0)
		return printf("err no buf\n"), 0;
	int rc = ibv_dereg_mr(bufs[b].mr);
	// keep=1: the memory stays for checks (deregistered, not freed).
	bufs[b].mr = NULL;
	if (!opt(a, n, "keep", 0))
		bufs[b].p = NULL;
	printf(rc ? "err rc=%d\n" : "ok\n", rc);
	return 0;
}

// trunc NAME: truncates a dma-buf buffer's memfd to nothing, as softcuda
// does when the memory's owner frees it.
static int cmd_trunc(char **a, int n)
{
	int b = n > 0 ? find(a[0]) : -1;
	if (b < 0 || bufs[b].fd < 0)
		return printf("err no dma-buf buf\n"), 0;
	int rc = ftruncate(bufs[b].fd, 0);
	printf(rc ? "err trunc errno=%d\n" : "ok\n", errno);
	return 0;
}

// async [ms=M]: the next asynchronous event, waiting up to M ms (default
// 2000) with async_fd non-blocking; answers its type and, for a QP or CQ
// event, whether it names this process's QP or CQ.
static int cmd_async(char **a, int n)
{
	long ms = opt(a, n, "ms", 2000);
	int fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	struct ibv_async_event ev;
	for (long waited = 0;; waited += 10) {
		if (ibv_get_async_event(ctx, &ev) == 0)
			break;
		if (errno != EAGAIN || waited >= ms) {
			printf("err async errno=%d\n", errno);
			return 0;
		}
		usleep(10000);
	}
	int ours = (ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qp) ||
		   (ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == cq);
	ibv_ack_async_event(&ev);
	printf("ok type=%d ours=%d\n", (int)ev.event_type, ours);
	return 0;
}

// many qp|mr|pd N: creates up to N more objects; answers how many were
// created and the errno of the first refusal (0 if none).
static int cmd_many(char **a, int n)
{
	if (n < 2)
		return printf("err usage: many qp|mr|pd N\n"), 0;
	int want = atoi(a[1]), made = 0, e = 0;
	static char page[4096];
	for (; made < want; made++) {
		void *o = NULL;
		if (strcmp(a[0], "qp") == 0) {
			struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
						      .cap = {.max_send_wr = 1, .max_send_sge = 1}};
			o = ibv_create_qp(pd, &ia);
		} else if (strcmp(a[0], "mr") == 0) {
			o = ibv_reg_mr(pd, page, sizeof(page), IBV_ACCESS_LOCAL_WRITE);
		} else if (strcmp(a[0], "pd") == 0) {
			o = ibv_alloc_pd(ctx);
		}
		if (!o) {
			e = errno;
			break;
		}
	}
	printf("ok made=%d errno=%d\n", made, e);
	return 0;
}

static uint64_t now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

// readloop COUNT LEN RKEY RADDR DEPTH: COUNT READs of LEN bytes into dst,
// keeping up to DEPTH outstanding, each signalled; answers the microseconds.
static int cmd_readloop(char **a, int n)
{
	if (n < 5)
		return printf("err usage\n"), 0;
	int count = atoi(a[0]), depth = atoi(a[4]);
	uint32_t len = (uint32_t)strtoul(a[1], NULL, 0);
	int b = find("dst");
	if (b < 0)
		return printf("err no dst\n"), 0;
	struct ibv_sge sge = {.addr = (uintptr_t)bufs[b].mr->addr, .length = len, .lkey = bufs[b].mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED};
	wr.wr.rdma.rkey = (uint32_t)strtoul(a[2], NULL, 0);
	wr.wr.rdma.remote_addr = strtoull(a[3], NULL, 0);
	uint64_t start = now_us();
	int posted = 0, done = 0, out = 0;
	struct ibv_wc wc[64];
	while (done < count) {
		while (posted < count && out < depth) {
			struct ibv_send_wr *bad;
			wr.wr_id = (uint64_t)posted;
			if (qp->context->ops.post_send(qp, &wr, &bad))
				return printf("err post\n"), 0;
			posted++;
			out++;
		}
		int r = cq->context->ops.poll_cq(cq, 64, wc);
		if (r < 0)
			return printf("err poll %d\n", r), 0;
		for (int i = 0; i < r; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				return printf("err status %d\n", wc[i].status), 0;
		done += r;
		out -= r;
	}
	printf("ok us=%llu\n", (unsigned long long)(now_us() - start));
	return 0;
}

// rawread COUNT LEN PID ADDR: the baseline, COUNT process_vm_readv calls of
// LEN bytes from PID at ADDR into dst; answers the microseconds.
static int cmd_rawread(char **a, int n)
{
	if (n < 4)
		return printf("err usage\n"), 0;
	int count = atoi(a[0]);
	size_t len = strtoull(a[1], NULL, 0);
	pid_t pid = (pid_t)atoi(a[2]);
	int b = find("dst");
	if (b < 0)
		return printf("err no dst\n"), 0;
	struct iovec l = {bufs[b].p, len}, r = {(void *)(uintptr_t)strtoull(a[3], NULL, 0), len};
	uint64_t start = now_us();
	for (int i = 0; i < count; i++)
		if (process_vm_readv(pid, &l, 1, &r, 1, 0) != (ssize_t)len)
			return printf("err process_vm_readv errno=%d\n", errno), 0;
	printf("ok us=%llu\n", (unsigned long long)(now_us() - start));
	return 0;
}

// teardown: out of order first (each refused while in use), then in order.
static int cmd_teardown(void)
{
	int cq1 = ibv_destroy_cq(cq), pd1 = ibv_dealloc_pd(pd), ctx1 = ibv_close_device(ctx);
	int qp2 = 0, mr2 = 0;
	for (int i = 0; i < nqps; i++)
		qp2 |= ibv_destroy_qp(qps[i]);
	int pd3 = ibv_dealloc_pd(pd); // regions still use it
	for (int i = 0; i < MAXBUF; i++)
		if (bufs[i].p && bufs[i].mr) {
			mr2 |= ibv_dereg_mr(bufs[i].mr);
			bufs[i].p = NULL;
		}
	int cq2 = ibv_destroy_cq(cq), pd2 = ibv_dealloc_pd(pd), ctx2 = ibv_close_device(ctx);
	nqps = 0;
	printf("ok cq1=%d pd1=%d ctx1=%d pd3=%d qp2=%d mr2=%d cq2=%d pd2=%d ctx2=%d\n", cq1, pd1, ctx1, pd3, qp2,
	       mr2, cq2, pd2, ctx2);
	return 0;
}

static int cmd_state(void)
{
	struct ibv_qp_attr at;
	struct ibv_qp_init_attr ia;
	int rc = ibv_query_qp(qp, &at, IBV_QP_STATE, &ia);
	printf(rc ? "err rc=%d\n" : "ok state=%d\n", rc ? rc : (int)at.qp_state);
	return 0;
}

// modify state=S mask=M [field=value...]: one raw ibv_modify_qp with valid
// values for every field unless overridden; answers its return code.
static int cmd_modify(char **a, int n)
{
	struct ibv_qp_attr at;
	memset(&at, 0, sizeof(at));
	at.qp_state = (enum ibv_qp_state)opt(a, n, "state", 0);
	at.cur_qp_state = (enum ibv_qp_state)opt(a, n, "cur", qp->state);
	at.port_num = (uint8_t)opt(a, n, "port", 1);
	at.pkey_index = (uint16_t)opt(a, n, "pkey", 0);
	at.qp_access_flags = (unsigned)opt(a, n, "access", IBV_ACCESS_REMOTE_READ);
	at.path_mtu = (enum ibv_mtu)opt(a, n, "mtu", IBV_MTU_4096);
	at.dest_qp_num = (uint32_t)opt(a, n, "dqpn", qp->qp_num);
	at.rq_psn = (uint32_t)opt(a, n, "rqpsn", 0);
	at.sq_psn = (uint32_t)opt(a, n, "sqpsn", 0);
	at.max_dest_rd_atomic = (uint8_t)opt(a, n, "mdra", 16);
	at.max_rd_atomic = (uint8_t)opt(a, n, "mra", 16);
	at.min_rnr_timer = (uint8_t)opt(a, n, "rnr", 12);
	at.timeout = (uint8_t)opt(a, n, "timeout", 14);
	at.retry_cnt = (uint8_t)opt(a, n, "retry", 7);
	at.rnr_retry = (uint8_t)opt(a, n, "rnrretry", 7);
	at.ah_attr.port_num = 1;
	at.ah_attr.is_global = (uint8_t)opt(a, n, "global", 1);
	at.ah_attr.dlid = (uint16_t)opt(a, n, "dlid", 0);
	at.ah_attr.grh.sgid_index = (uint8_t)opt(a, n, "sgid", link_ib ? 0 : SGID_V2);
	if (opt(a, n, "zerogid", 0) == 0)
		ibv_query_gid(ctx, 1, link_ib ? 0 : SGID_V2, &at.ah_attr.grh.dgid);
	int rc = ibv_modify_qp(qp, &at, (int)opt(a, n, "mask", 0));
	printf("ok rc=%d state=%d\n", rc, (int)qp->state);
	return 0;
}

static int cmd_reset(void)
{
	struct ibv_qp_attr at;
	memset(&at, 0, sizeof(at));
	int rc = modify(IBV_QPS_RESET, 0, &at);
	printf(rc ? "err rc=%d\n" : "ok\n", rc);
	return 0;
}

int main(void)
{
	char line[8192];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		char *argv[64];
		int argc = 0;
		char *save = NULL;
		for (char *t = strtok_r(line, " \t\n", &save); t && argc < 64; t = strtok_r(NULL, " \t\n", &save))
			argv[argc++] = t;
		if (argc == 0)
			continue;
		char *c = argv[0];
		char **a = argv + 1;
		int n = argc - 1;
		int qi = (int)opt(a, n, "qp", 0);
		if (qi >= 0 && qi < nqps)
			qp = qps[qi];
		if (strcmp(c, "open") == 0)
			cmd_open(a, n);
		else if (strcmp(c, "addqp") == 0)
			cmd_addqp();
		else if (strcmp(c, "buf") == 0)
			cmd_buf(a, n);
		else if (strcmp(c, "connect") == 0)
			cmd_connect(a, n);
		else if (strcmp(c, "post") == 0)
			cmd_post(a, n);
		else if (strcmp(c, "poll") == 0)
			cmd_poll(a, n);
		else if (strcmp(c, "check") == 0)
			cmd_check(a, n);
		else if (strcmp(c, "dereg") == 0)
			cmd_dereg(a, n);
		else if (strcmp(c, "teardown") == 0)
			cmd_teardown();
		else if (strcmp(c, "many") == 0)
			cmd_many(a, n);
		else if (strcmp(c, "readloop") == 0)
			cmd_readloop(a, n);
		else if (strcmp(c, "rawread") == 0)
			cmd_rawread(a, n);
		else if (strcmp(c, "state") == 0)
			cmd_state();
		else if (strcmp(c, "trunc") == 0)
			cmd_trunc(a, n);
		else if (strcmp(c, "async") == 0)
			cmd_async(a, n);
		else if (strcmp(c, "port") == 0) {
			struct ibv_port_attr pa;
			int rc = ibv_query_port(ctx, 1, &pa);
			printf("ok rc=%d state=%d link=%d\n", rc, (int)pa.state, pa.link_layer);
		} else if (strcmp(c, "modify") == 0)
			cmd_modify(a, n);
		else if (strcmp(c, "reset") == 0)
			cmd_reset();
		else if (strcmp(c, "destroy") == 0)
			printf(ibv_destroy_qp(qp) ? "err\n" : "ok\n");
		else if (strcmp(c, "pid") == 0)
			printf("ok pid=%d\n", (int)getpid());
		else if (strcmp(c, "exit") == 0)
			return 0;
		else
			printf("err unknown command %s\n", c);
	}
	return 0;
}
