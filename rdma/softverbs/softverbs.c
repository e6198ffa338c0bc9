//go:build ignore

// (The constraint above keeps the go tool from treating this file as cgo
// source; build.go embeds it and compiles it with gcc.)

// softverbs: a software RDMA NIC between processes on one machine, exporting
// the libibverbs calls kvfabric's rdma binding uses. A test fixture, not a
// product feature: see doc.go for what it models and what it does not.
//
// Built with: gcc -shared -fPIC -O2 -pthread softverbs.c -o libsoftverbs.so
// against rdma-core's <infiniband/verbs.h>.

#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <endian.h>

#include <infiniband/verbs.h>

// verbs.h turns these into static inlines or macros; we export the symbols.
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define SV_EXPORT __attribute__((visibility("default")))

// Device limits reported by ibv_query_device and enforced everywhere.
enum {
	SV_MAX_QP = 256,
	SV_MAX_QP_WR = 4096,
	SV_MAX_SGE = 30,
	SV_MAX_CQ = 256,
	SV_MAX_CQE = 65536,
	SV_MAX_MR = 4096,
	SV_MAX_PD = 64,
	SV_MAX_QP_RD_ATOM = 16,
	SV_MAX_QP_INIT_RD_ATOM = 16,
	SV_MAX_DEVICES = 16,
	SV_MAX_MSG = 0x80000000u, // port max_msg_sz: 2 GiB
};
static const uint64_t SV_MAX_MR_SIZE = 1ull << 40;

#define SV_DEFAULT_REGISTRY "/dev/shm/softverbs"
#define SV_DEFAULT_TIMEOUT_CAP_MS 2000

// ---------------------------------------------------------------- helpers

static void sv_log(const char *fmt, ...)
{
	va_list ap;
	char buf[512];
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "softverbs[%d]: %s\n", (int)getpid(), buf);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const char *env_or(const char *name, const char *def)
{
	const char *v = getenv(name);
	return (v && *v) ? v : def;
}

// Process start time (field 22 of /proc/pid/stat), which together with the
// pid names a process uniquely even after pid reuse. 0 when unreadable.
static unsigned long long proc_start(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	if (!p)
		return 0;
	p++;
	// Fields after the command: state is field 3, starttime field 22.
	int field = 2;
	unsigned long long start = 0;
	char *save = NULL;
	for (char *tok = strtok_r(p, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
		field++;
		if (field == 3 && tok[0] == 'Z')
			return 0; // a zombie is gone as far as a NIC is concerned
		if (field == 22) {
			start = strtoull(tok, NULL, 10);
			break;
		}
	}
	return start;
}

static int proc_alive(pid_t pid, unsigned long long start)
{
	if (pid <= 0)
		return 0;
	if (kill(pid, 0) != 0 && errno != EPERM)
		return 0;
	return proc_start(pid) == start && start != 0;
}

static pid_t g_pid;
static unsigned long long g_start;

static void self_identity(void)
{
	pid_t p = getpid();
	if (p != g_pid) {
		g_pid = p;
		g_start = proc_start(p);
	}
}

// ---------------------------------------------------------------- registry
//
// One directory, machine-wide. Files:
//   lock        flock'ed around id allocation
//   next-id     the next id, decimal
//   qp-<qpn>    one line: a QP's owner, address and state
//   mr-<rkey>   one line: a memory registration
//   stats-<pid> a process's data-path counters (see stats_add)
// Entries are written to a temporary name and renamed, so readers never see
// half a line; an entry whose pid is gone (or reused) is ignored and removed
// by the next sweep.

static const char *registry_dir(void)
{
	return env_or("SOFTVERBS_REGISTRY", SV_DEFAULT_REGISTRY);
}

static int registry_ensure(void)
{
	const char *d = registry_dir();
	if (mkdir(d, 0777) != 0 && errno != EEXIST) {
		sv_log("registry %s: %s", d, strerror(errno));
		return -1;
	}
	return 0;
}

// <registry>/gen is a 64-bit counter in a shared mapping, bumped by every
// change to the registry, so a requester can keep what it looked up until
// the counter moves (the data path then costs no file reads).
static pthread_mutex_t g_gen_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *g_gen;
static char g_gen_dir[512];

static uint64_t *registry_gen(void)
{
	// The registry directory is the process's for its life: once mapped,
	// the counter is read without a lock.
	uint64_t *mapped = __atomic_load_n(&g_gen, __ATOMIC_ACQUIRE);
	if (mapped)
		return mapped;
	pthread_mutex_lock(&g_gen_lock);
	const char *d = registry_dir();
	if (!g_gen || strcmp(g_gen_dir, d) != 0) {
		char path[600];
		snprintf(path, sizeof(path), "%s/gen", d);
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
		struct stat st;
		if (fd >= 0 && fstat(fd, &st) == 0 && (st.st_size >= 4096 || ftruncate(fd, 4096) == 0)) {
			void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (m != MAP_FAILED) {
				snprintf(g_gen_dir, sizeof(g_gen_dir), "%s", d);
				__atomic_store_n(&g_gen, (uint64_t *)m, __ATOMIC_RELEASE);
			}
		}
		if (fd >= 0)
			close(fd);
	}
	uint64_t *g = g_gen;
	pthread_mutex_unlock(&g_gen_lock);
	return g;
}

static void registry_bump(void)
{
	uint64_t *g = registry_gen();
	if (g)
		__atomic_add_fetch(g, 1, __ATOMIC_SEQ_CST);
}

// The registry's generation; 0 when unknown (nothing may then be cached).
static uint64_t registry_gen_now(void)
{
	uint64_t *g = registry_gen();
	return g ? __atomic_load_n(g, __ATOMIC_SEQ_CST) + 1 : 0;
}

// <registry>/stats-<pid> holds the process's data-path counters as
// uint64 in native byte order in a shared mapping, so that another process (a
// benchmark) reads them while this one runs: what a NIC would do off the
// CPU, done here on it.
enum {
	SV_STAT_READS,	     // READs executed successfully
	SV_STAT_BYTES,	     // bytes they moved
	SV_STAT_POLL_CPU_NS, // CPU time of the copies made by pollers (ibv_poll_cq)
	SV_STAT_WORK_CPU_NS, // CPU time of the copies made by QP workers
	SV_STAT_COUNT,
};

static pthread_mutex_t g_stats_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t *g_stats;

// The counters, mapped on first use (NULL if the file cannot be made: the
// counts are then lost, nothing else is).
static uint64_t *stats_map(void)
{
	uint64_t *mapped = __atomic_load_n(&g_stats, __ATOMIC_ACQUIRE);
	if (mapped)
		return mapped;
	pthread_mutex_lock(&g_stats_lock);
	if (!g_stats) {
		char path[600];
		snprintf(path, sizeof(path), "%s/stats-%d", registry_dir(), (int)getpid());
		int fd = registry_ensure() == 0 ? open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666) : -1;
		if (fd >= 0 && ftruncate(fd, 4096) == 0) {
			void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (m != MAP_FAILED)
				__atomic_store_n(&g_stats, (uint64_t *)m, __ATOMIC_RELEASE);
		}
		if (fd >= 0)
			close(fd);
	}
	uint64_t *g = g_stats;
	pthread_mutex_unlock(&g_stats_lock);
	return g;
}

static void stats_add(int i, uint64_t v)
{
	uint64_t *s = stats_map();
	if (s)
		__atomic_add_fetch(&s[i], v, __ATOMIC_RELAXED);
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint32_t registry_alloc_id(void)
{
	char path[512];
	if (registry_ensure() != 0)
		return 0;
	snprintf(path, sizeof(path), "%s/lock", registry_dir());
	int lfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
	if (lfd < 0)
		return 0;
	while (flock(lfd, LOCK_EX) != 0 && errno == EINTR)
		;
	snprintf(path, sizeof(path), "%s/next-id", registry_dir());
	uint32_t id = 0x100;
	FILE *f = fopen(path, "r");
	if (f) {
		unsigned v;
		if (fscanf(f, "%u", &v) == 1 && v >= 0x100 && v < 0xFFFFFF)
			id = v;
		fclose(f);
	}
	char tmp[600];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (f) {
		fprintf(f, "%u\n", id + 1 >= 0xFFFFFF ? 0x100u : id + 1);
		fclose(f);
		rename(tmp, path);
	}
	flock(lfd, LOCK_UN);
	close(lfd);
	return id;
}

static int registry_write(const char *kind, uint32_t id, const char *line)
{
	char path[512], tmp[600];
	snprintf(path, sizeof(path), "%s/%s-%u", registry_dir(), kind, id);
	snprintf(tmp, sizeof(tmp), "%s/.%s-%u.%d.%ld", registry_dir(), kind, id, (int)getpid(),
		 (long)pthread_self());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
	if (fd < 0)
		return -1;
	size_t len = strlen(line);
	if (write(fd, line, len) != (ssize_t)len) {
		close(fd);
		unlink(tmp);
		return -1;
	}
	close(fd);
	if (rename(tmp, path) != 0) {
		unlink(tmp);
		return -1;
	}
	registry_bump();
	return 0;
}

static int registry_read(const char *kind, uint32_t id, char *buf, size_t n)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s-%u", registry_dir(), kind, id);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t r = read(fd, buf, n - 1);
	close(fd);
	if (r <= 0)
		return -1;
	buf[r] = 0;
	return 0;
}

static void registry_remove(const char *kind, uint32_t id)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/%s-%u", registry_dir(), kind, id);
	unlink(path);
	registry_bump();
}

// Removes the entries of processes that are gone; with mine set, also this
// process's own (at exit).
static void registry_sweep(int mine)
{
	DIR *d = opendir(registry_dir());
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		char path[600], buf[256];
		snprintf(path, sizeof(path), "%s/%s", registry_dir(), e->d_name);
		int spid;
		if (sscanf(e->d_name, "stats-%d", &spid) == 1) {
			if (mine ? spid == g_pid : (kill(spid, 0) != 0 && errno == ESRCH))
				unlink(path);
			continue;
		}
		if (strncmp(e->d_name, "qp-", 3) != 0 && strncmp(e->d_name, "mr-", 3) != 0)
			continue;
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t r = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (r <= 0)
			continue;
		buf[r] = 0;
		int pid = 0;
		unsigned long long start = 0;
		if (sscanf(buf, "pid=%d start=%llu", &pid, &start) != 2)
			continue;
		if (mine ? (pid == g_pid && start == g_start) : !proc_alive(pid, start)) {
			unlink(path);
			registry_bump();
		}
	}
	closedir(d);
}

__attribute__((destructor)) static void sv_exit(void)
{
	if (g_pid == getpid() && g_start != 0)
		registry_sweep(1);
}

struct mr_entry {
	int pid;
	unsigned long long start;
	uint32_t pd, lkey, rkey;
	int access;
	unsigned long long iova, addr, len;
};

static int mr_entry_read(uint32_t rkey, struct mr_entry *m)
{
	char buf[512];
	if (registry_read("mr", rkey, buf, sizeof(buf)) != 0)
		return -1;
	if (sscanf(buf, "pid=%d start=%llu pd=%u lkey=%u rkey=%u access=%d iova=%llu addr=%llu len=%llu",
		   &m->pid, &m->start, &m->pd, &m->lkey, &m->rkey, &m->access, &m->iova, &m->addr,
		   &m->len) != 9)
		return -1;
	return 0;
}

struct qp_entry {
	int pid;
	unsigned long long start;
	uint32_t pd, qpn, dest_qpn, lid;
	int state, access, max_dest_rd_atomic;
	uint8_t gid[2][16];
	uint32_t rq_psn;	// the PSN it expects next
	int path_mtu;		// enum ibv_mtu its responses are cut to
	int active_mtu;		// its port's (enum ibv_mtu)
	int sgid_type;		// type of the GID its QP sends from (enum ibv_gid_type)
	char control[256];
};

static void hex16(char *out, const uint8_t *g)
{
	for (int i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", g[i]);
}

static int unhex16(const char *s, uint8_t *g)
{
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		g[i] = (uint8_t)v;
	}
	return 0;
}

static int qp_entry_read(uint32_t qpn, struct qp_entry *q)
{
	char buf[1024], g0[33], g1[33];
	if (registry_read("qp", qpn, buf, sizeof(buf)) != 0)
		return -1;
	q->control[0] = 0;
	int n = sscanf(buf,
		       "pid=%d start=%llu pd=%u qpn=%u state=%d dest_qpn=%u access=%d "
		       "max_dest_rd_atomic=%d lid=%u gid0=%32s gid1=%32s rq_psn=%u path_mtu=%d "
		       "active_mtu=%d sgid_type=%d control=%255[^\n]",
		       &q->pid, &q->start, &q->pd, &q->qpn, &q->state, &q->dest_qpn, &q->access,
		       &q->max_dest_rd_atomic, &q->lid, g0, g1, &q->rq_psn, &q->path_mtu, &q->active_mtu,
		       &q->sgid_type, q->control);
	if (n < 15)
		return -1;
	if (unhex16(g0, q->gid[0]) || unhex16(g1, q->gid[1]))
		return -1;
	return 0;
}

// ---------------------------------------------------------------- faults

struct faults {
	unsigned fail_read;	// the Nth READ posted from when this was set fails
	int fail_status;	// status of that failure
	unsigned delay_us;	// every completion is delayed this long
	unsigned copy_us;	// each 64 KiB a READ copies takes this much longer
	int stall;		// reads stop completing until cleared
	int port_down;		// port reported down; reads time out
};

static pthread_mutex_t g_fault_lock = PTHREAD_MUTEX_INITIALIZER;
static struct faults g_faults;
static char g_fault_src[1024];	// env + control text the countdown was armed from
static unsigned g_fail_countdown;

static const struct {
	const char *name;
	int status;
} wc_names[] = {
	{"SUCCESS", IBV_WC_SUCCESS},
	{"LOC_LEN_ERR", IBV_WC_LOC_LEN_ERR},
	{"LOC_QP_OP_ERR", IBV_WC_LOC_QP_OP_ERR},
	{"LOC_PROT_ERR", IBV_WC_LOC_PROT_ERR},
	{"WR_FLUSH_ERR", IBV_WC_WR_FLUSH_ERR},
	{"BAD_RESP_ERR", IBV_WC_BAD_RESP_ERR},
	{"LOC_ACCESS_ERR", IBV_WC_LOC_ACCESS_ERR},
	{"REM_INV_REQ_ERR", IBV_WC_REM_INV_REQ_ERR},
	{"REM_ACCESS_ERR", IBV_WC_REM_ACCESS_ERR},
	{"REM_OP_ERR", IBV_WC_REM_OP_ERR},
	{"RETRY_EXC_ERR", IBV_WC_RETRY_EXC_ERR},
	{"RNR_RETRY_EXC_ERR", IBV_WC_RNR_RETRY_EXC_ERR},
	{"REM_ABORT_ERR", IBV_WC_REM_ABORT_ERR},
	{"FATAL_ERR", IBV_WC_FATAL_ERR},
	{"RESP_TIMEOUT_ERR", IBV_WC_RESP_TIMEOUT_ERR},
	{"GENERAL_ERR", IBV_WC_GENERAL_ERR},
};

static int parse_status(const char *v)
{
	if (strncmp(v, "IBV_WC_", 7) == 0)
		v += 7;
	for (size_t i = 0; i < sizeof(wc_names) / sizeof(wc_names[0]); i++)
		if (strcasecmp(v, wc_names[i].name) == 0)
			return wc_names[i].status;
	char *end;
	long n = strtol(v, &end, 10);
	if (*v && !*end && n > 0 && n <= IBV_WC_GENERAL_ERR)
		return (int)n;
	sv_log("fault fail_status=%s: unknown status, using REM_ACCESS_ERR", v);
	return IBV_WC_REM_ACCESS_ERR;
}

static void parse_faults(const char *s, struct faults *f)
{
	char buf[1024];
	snprintf(buf, sizeof(buf), "%s", s);
	char *save = NULL;
	for (char *kv = strtok_r(buf, ",\n \t", &save); kv; kv = strtok_r(NULL, ",\n \t", &save)) {
		char *eq = strchr(kv, '=');
		if (!eq) {
			sv_log("fault '%s': want key=value", kv);
			continue;
		}
		*eq = 0;
		const char *v = eq + 1;
		if (strcmp(kv, "fail_read") == 0)
			f->fail_read = (unsigned)strtoul(v, NULL, 10);
		else if (strcmp(kv, "fail_status") == 0)
			f->fail_status = parse_status(v);
		else if (strcmp(kv, "delay_us") == 0)
			f->delay_us = (unsigned)strtoul(v, NULL, 10);
		else if (strcmp(kv, "copy_us") == 0)
			f->copy_us = (unsigned)strtoul(v, NULL, 10);
		else if (strcmp(kv, "stall") == 0)
			f->stall = atoi(v) != 0;
		else if (strcmp(kv, "port_down") == 0)
			f->port_down = atoi(v) != 0;
		else
			sv_log("fault key %s: unknown (known: fail_read, fail_status, delay_us, copy_us, stall, port_down)", kv);
	}
}

// A control file's identity when last read: it is re-read only when it
// changed (a stat per check instead of open, read, close).
struct ctl_cache {
	char path[256];
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtim;
	int have;   // text is the file's as of the identity above
	int absent; // the last look found no file
	char text[512];
};

// Brings c up to date with the file at path; returns its text. *changed
// (if given) says whether the text may differ from the last call's.
static const char *ctl_text_changed(struct ctl_cache *c, const char *path, int *changed)
{
	struct stat st;
	if (changed)
		*changed = 1;
	if (!path || !*path || stat(path, &st) != 0) {
		if (changed && c->absent)
			*changed = 0;
		c->absent = 1;
		c->have = 0;
		c->text[0] = 0;
		return c->text;
	}
	c->absent = 0;
	if (c->have && strcmp(c->path, path) == 0 && c->dev == st.st_dev && c->ino == st.st_ino &&
	    c->size == st.st_size && c->mtim.tv_sec == st.st_mtim.tv_sec &&
	    c->mtim.tv_nsec == st.st_mtim.tv_nsec) {
		if (changed)
			*changed = 0;
		return c->text;
	}
	snprintf(c->path, sizeof(c->path), "%s", path);
	c->dev = st.st_dev;
	c->ino = st.st_ino;
	c->size = st.st_size;
	c->mtim = st.st_mtim;
	c->have = 1;
	c->text[0] = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t r = read(fd, c->text, sizeof(c->text) - 1);
		close(fd);
		c->text[r > 0 ? r : 0] = 0;
	}
	return c->text;
}

// Re-reads SOFTVERBS_FAULTS and the control file; a changed text re-arms the
// fail_read countdown, so "the Nth READ" counts from when it was written.
static struct ctl_cache g_ctl;

static const char *ctl_text(struct ctl_cache *c, const char *path)
{
	return ctl_text_changed(c, path, NULL);
}

static int g_faults_read;

static void faults_refresh(struct faults *out)
{
	char src[1024];
	pthread_mutex_lock(&g_fault_lock);
	int changed;
	const char *ctl = ctl_text_changed(&g_ctl, getenv("SOFTVERBS_CONTROL"), &changed);
	if (!changed && g_faults_read) {
		if (out)
			*out = g_faults;
		pthread_mutex_unlock(&g_fault_lock);
		return;
	}
	g_faults_read = 1;
	snprintf(src, sizeof(src), "%s,%s", env_or("SOFTVERBS_FAULTS", ""), ctl);
	if (strcmp(src, g_fault_src) != 0) {
		struct faults f = {.fail_status = IBV_WC_REM_ACCESS_ERR};
		parse_faults(src, &f);
		g_faults = f;
		g_fail_countdown = f.fail_read;
		snprintf(g_fault_src, sizeof(g_fault_src), "%s", src);
	}
	if (out)
		*out = g_faults;
	pthread_mutex_unlock(&g_fault_lock);
}

// Stall and port-down of a peer, from the control file it registered.
static void peer_faults(struct ctl_cache *c, const char *control, struct faults *f)
{
	memset(f, 0, sizeof(*f));
	const char *t = ctl_text(c, control);
	if (t[0])
		parse_faults(t, f);
}

// ---------------------------------------------------------------- objects

struct sv_device {
	struct ibv_device dev;
	uint64_t guid; // host order
	uint32_t ipv4; // network order
	uint16_t lid;
};

struct sv_mr;
struct sv_qp;

struct sv_context {
	struct ibv_context ctx;
	struct sv_device *dev;
	int link_ib;
	int port_down_env;
	int active_mtu;	      // enum ibv_mtu (SOFTVERBS_ACTIVE_MTU)
	int roce_v1;	      // RoCE v1 frames reach peers (SOFTVERBS_ROCE_V1=1: one L2 segment)
	pthread_mutex_t lock; // guards mrs and the counts
	pthread_cond_t mr_cv; // an MR's users dropped to 0
	// Asynchronous events (ibv_get_async_event): a ring under ev_lock,
	// signalled on async_fd (an eventfd).
	pthread_mutex_t ev_lock;
	struct ibv_async_event evq[64];
	int ev_head, ev_count, ev_unacked;
	int port_seen_down;
	struct sv_mr *mrs;
	int n_qp, n_cq, n_mr, n_pd;
};

struct sv_pd {
	struct ibv_pd pd;
	uint32_t id;
	int users;
};

struct sv_mr {
	struct ibv_mr mr;
	uint64_t iova;
	uint64_t host; // address in this process
	uint64_t len;
	int access;
	void *map; // dma-buf mapping to unmap at dereg
	size_t maplen;
	int users; // READs writing into it now (under the context's lock)
	struct sv_mr *next;
};

struct sv_cqe {
	struct ibv_wc wc;
	struct sv_qp *qp;
	uint64_t seq;
};

struct sv_cq {
	struct ibv_cq cq;
	pthread_mutex_t lock;
	struct sv_cqe *ring;
	int cap, head, count;
	int overflow;
	int users;
	struct sv_qp *qps; // QPs whose send queue completes here (under lock)
};

struct sv_wr {
	uint64_t wr_id;
	uint64_t seq;
	uint64_t posted_ns;
	int opcode;
	int signaled;
	int inject;   // status to complete with (fault), 0 none
	int deferred; // a poller left it to the worker
	uint64_t raddr;
	uint32_t rkey;
	int num_sge;
	struct ibv_sge sge[SV_MAX_SGE];
};

struct sv_qp {
	struct ibv_qp qp;
	struct ibv_qp_cap cap;
	int sq_sig_all;
	// attributes set by modify
	struct ibv_qp_attr attr;
	pthread_mutex_t lock;
	pthread_cond_t cv;
	struct sv_wr *ring;
	uint64_t posted;	  // next sequence number
	uint64_t executed;	  // next to execute
	uint64_t freed;		  // slots below this are free (atomic)
	uint64_t gen;		  // bumped on RESET: in-flight work is discarded
	int busy, stop;
	uint64_t outstanding; // READs posted and not complete when the one executing started
	int idle;	  // the worker waits for a post (without timeout)
	int busy_waiters; // threads waiting for busy to clear
	pthread_t thr;
	int thr_started;
	// Worker-only lookups, kept while the registry's generation holds (and
	// at most SV_CACHE_NS, so a dead peer is noticed).
	struct {
		uint64_t gen, at;
		struct qp_entry e;
	} peer;
	struct {
		uint64_t gen, at;
		uint32_t rkey;
		struct mr_entry e;
	} mrc[8];
	unsigned mrc_next;
	struct ctl_cache peer_ctl;
	struct sv_qp *cq_next; // in send_cq's list (under the CQ's lock)
	int cq_refs;	       // pollers executing on this QP (under the CQ's lock)
};

#define SV_CACHE_NS 100000000ull

// How long a new request is left to pollers before the worker takes it.
#define SV_GRACE_NS 100000ull

// Not a completion status: the request is left for the QP's worker.
#define SV_DEFER (-1)

static int sv_post_send(struct ibv_qp *, struct ibv_send_wr *, struct ibv_send_wr **);
static int sv_post_recv(struct ibv_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **);
static int sv_poll_cq(struct ibv_cq *, int, struct ibv_wc *);
static int sv_req_notify_cq(struct ibv_cq *, int);

static struct sv_context *ctx_of(struct ibv_context *c) { return (struct sv_context *)c; }

// ---------------------------------------------------------------- devices

static pthread_mutex_t g_dev_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sv_device *g_devs[SV_MAX_DEVICES];
static int g_ndevs;

static uint64_t fnv64(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

static struct sv_device *device_get(const char *name, const char *addr)
{
	for (int i = 0; i < g_ndevs; i++)
		if (strcmp(g_devs[i]->dev.name, name) == 0)
			return g_devs[i];
	if (g_ndevs >= SV_MAX_DEVICES)
		return NULL;
	struct sv_device *d = calloc(1, sizeof(*d));
	if (!d)
		return NULL;
	snprintf(d->dev.name, sizeof(d->dev.name), "%s", name);
	snprintf(d->dev.dev_name, sizeof(d->dev.dev_name), "uverbs%d", g_ndevs);
	snprintf(d->dev.dev_path, sizeof(d->dev.dev_path), "/sys/class/infiniband_verbs/uverbs%d", g_ndevs);
	snprintf(d->dev.ibdev_path, sizeof(d->dev.ibdev_path), "/sys/class/infiniband/%s", name);
	d->dev.node_type = IBV_NODE_CA;
	d->dev.transport_type = IBV_TRANSPORT_IB;
	struct in_addr a;
	if (inet_pton(AF_INET, addr, &a) != 1) {
		sv_log("SOFTVERBS_GID_ADDR %s: not an IPv4 address, using 127.0.0.1", addr);
		inet_pton(AF_INET, "127.0.0.1", &a);
	}
	d->ipv4 = a.s_addr;
	char key[128];
	snprintf(key, sizeof(key), "%s/%s", name, addr);
	d->guid = fnv64(key) | 0x0200000000000000ull;
	uint32_t h = ntohl(a.s_addr);
	d->lid = (uint16_t)((h & 0xBFFF) | 1); // unicast LIDs are 1..0xBFFF
	g_devs[g_ndevs++] = d;
	return d;
}

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	char names[1024], addrs[1024];
	// Set but empty means no devices (a machine without RDMA).
	const char *dv = getenv("SOFTVERBS_DEVICES");
	snprintf(names, sizeof(names), "%s", dv ? dv : "softverbs0");
	snprintf(addrs, sizeof(addrs), "%s", env_or("SOFTVERBS_GID_ADDR", "127.0.0.1"));
	struct ibv_device **list = calloc(SV_MAX_DEVICES + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	// One address per device, or one for all.
	char *asave = NULL, *nsave = NULL;
	char *addr = strtok_r(addrs, ",", &asave);
	const char *last_addr = addr ? addr : "127.0.0.1";
	int n = 0;
	pthread_mutex_lock(&g_dev_lock);
	for (char *name = strtok_r(names, ",", &nsave); name && n < SV_MAX_DEVICES;
	     name = strtok_r(NULL, ",", &nsave)) {
		while (*name == ' ')
			name++;
		if (!*name)
			continue;
		struct sv_device *d = device_get(name, last_addr);
		if (d)
			list[n++] = &d->dev;
		addr = strtok_r(NULL, ",", &asave);
		if (addr)
			last_addr = addr;
	}
	pthread_mutex_unlock(&g_dev_lock);
	if (num)
		*num = n;
	return list;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list) { free(list); }

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device ? device->name : NULL;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	return device ? htobe64(((struct sv_device *)device)->guid) : 0;
}

static int port_is_down(struct sv_context *c);

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	if (!device) {
		errno = EINVAL;
		return NULL;
	}
	self_identity();
	if (registry_ensure() != 0) {
		errno = EIO;
		return NULL;
	}
	registry_sweep(0);
	struct sv_context *c = calloc(1, sizeof(*c));
	if (!c) {
		errno = ENOMEM;
		return NULL;
	}
	c->dev = (struct sv_device *)device;
	c->ctx.device = device;
	c->ctx.cmd_fd = -1;
	c->ctx.async_fd = -1;
	c->ctx.num_comp_vectors = 1;
	c->ctx.abi_compat = NULL; // no extended ops: verbs.h falls back to our exports
	pthread_mutex_init(&c->ctx.mutex, NULL);
	pthread_mutex_init(&c->lock, NULL);
	c->link_ib = strcasecmp(env_or("SOFTVERBS_LINK_LAYER", "ethernet"), "infiniband") == 0;
	c->port_down_env = strcasecmp(env_or("SOFTVERBS_PORT_STATE", "active"), "down") == 0;
	// The active MTU: 1024 by default, as RoCE runs on a 1500-byte Ethernet
	// MTU; InfiniBand and jumbo-frame Ethernet give 4096.
	const char *mtu = env_or("SOFTVERBS_ACTIVE_MTU", "1024");
	c->active_mtu = 0;
	for (int m = IBV_MTU_256, b = 256; m <= IBV_MTU_4096; m++, b *= 2)
		if (strtol(mtu, NULL, 10) == b && strspn(mtu, "0123456789") == strlen(mtu))
			c->active_mtu = m;
	if (!c->active_mtu) {
		sv_log("SOFTVERBS_ACTIVE_MTU=%s: not 256, 512, 1024, 2048 or 4096", mtu);
		free(c);
		errno = EINVAL;
		return NULL;
	}
	c->roce_v1 = strcmp(env_or("SOFTVERBS_ROCE_V1", "0"), "1") == 0;
	pthread_mutex_init(&c->ev_lock, NULL);
	pthread_cond_init(&c->mr_cv, NULL);
	c->ctx.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	c->port_seen_down = port_is_down(c);
	c->ctx.ops.post_send = sv_post_send;
	c->ctx.ops.post_recv = sv_post_recv;
	c->ctx.ops.poll_cq = sv_poll_cq;
	c->ctx.ops.req_notify_cq = sv_req_notify_cq;
	pthread_mutex_lock(&g_fault_lock);
	g_faults_read = 0; // SOFTVERBS_FAULTS is read again at each open
	pthread_mutex_unlock(&g_fault_lock);
	faults_refresh(NULL);
	return &c->ctx;
}

SV_EXPORT int ibv_close_device(struct ibv_context *context)
{
	if (!context)
		return EINVAL;
	struct sv_context *c = ctx_of(context);
	pthread_mutex_lock(&c->lock);
	int busy = c->n_qp || c->n_cq || c->n_mr || c->n_pd;
	pthread_mutex_unlock(&c->lock);
	if (busy)
		return EBUSY;
	pthread_mutex_destroy(&c->lock);
	if (c->ctx.async_fd >= 0)
		close(c->ctx.async_fd);
	free(c);
	return 0;
}

SV_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
	if (!context || !a)
		return EINVAL;
	struct sv_context *c = ctx_of(context);
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "softverbs 1.0");
	a->node_guid = htobe64(c->dev->guid);
	a->sys_image_guid = htobe64(c->dev->guid);
	a->max_mr_size = SV_MAX_MR_SIZE;
	a->page_size_cap = 0xfffff000;
	a->max_qp = SV_MAX_QP;
	a->max_qp_wr = SV_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
	a->max_sge = SV_MAX_SGE;
	a->max_sge_rd = SV_MAX_SGE;
	a->max_cq = SV_MAX_CQ;
	a->max_cqe = SV_MAX_CQE;
	a->max_mr = SV_MAX_MR;
	a->max_pd = SV_MAX_PD;
	a->max_qp_rd_atom = SV_MAX_QP_RD_ATOM;
	a->max_qp_init_rd_atom = SV_MAX_QP_INIT_RD_ATOM;
	a->max_res_rd_atom = SV_MAX_QP * SV_MAX_QP_RD_ATOM;
	a->atomic_cap = IBV_ATOMIC_NONE;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 16;
	a->phys_port_cnt = 1;
	return 0;
}

static int port_is_down(struct sv_context *c)
{
	struct faults f;
	faults_refresh(&f);
	return c->port_down_env || f.port_down;
}

// async_push queues an asynchronous event and signals async_fd. A full
// queue (64 unread) drops the event, as a kernel's event file does.
static void async_push(struct sv_context *c, enum ibv_event_type type, void *element)
{
	pthread_mutex_lock(&c->ev_lock);
	if (c->ev_count < (int)(sizeof(c->evq) / sizeof(c->evq[0]))) {
		struct ibv_async_event *e = &c->evq[(c->ev_head + c->ev_count) % 64];
		memset(e, 0, sizeof(*e));
		e->event_type = type;
		if (type == IBV_EVENT_QP_FATAL)
			e->element.qp = element;
		else if (type == IBV_EVENT_CQ_ERR)
			e->element.cq = element;
		else
			e->element.port_num = 1;
		c->ev_count++;
		uint64_t one = 1;
		if (c->ctx.async_fd >= 0 && write(c->ctx.async_fd, &one, sizeof(one)) != sizeof(one))
			sv_log("async event: eventfd write: %s", strerror(errno));
	}
	pthread_mutex_unlock(&c->ev_lock);
}

// port_watch turns a change of the port's state into IBV_EVENT_PORT_ERR or
// IBV_EVENT_PORT_ACTIVE. The state is looked at when the library next looks
// at the port: a READ, ibv_query_port, ibv_get_async_event.
static int port_watch(struct sv_context *c)
{
	int down = port_is_down(c);
	pthread_mutex_lock(&c->ev_lock);
	int changed = down != c->port_seen_down;
	c->port_seen_down = down;
	pthread_mutex_unlock(&c->ev_lock);
	if (changed)
		async_push(c, down ? IBV_EVENT_PORT_ERR : IBV_EVENT_PORT_ACTIVE, NULL);
	return down;
}

// ibv_get_async_event blocks until an event is queued (port state changes,
// CQ errors and the QPs they make fatal), or, with async_fd set
// O_NONBLOCK, fails with EAGAIN when none is.
SV_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	if (!context || !event) {
		errno = EINVAL;
		return -1;
	}
	struct sv_context *c = ctx_of(context);
	for (;;) {
		port_watch(c);
		pthread_mutex_lock(&c->ev_lock);
		if (c->ev_count > 0) {
			*event = c->evq[c->ev_head];
			c->ev_head = (c->ev_head + 1) % 64;
			c->ev_count--;
			c->ev_unacked++;
			uint64_t v;
			if (read(c->ctx.async_fd, &v, sizeof(v)) != sizeof(v))
				sv_log("async event: eventfd read: %s", strerror(errno));
			pthread_mutex_unlock(&c->ev_lock);
			return 0;
		}
		pthread_mutex_unlock(&c->ev_lock);
		if (fcntl(c->ctx.async_fd, F_GETFL) & O_NONBLOCK) {
			errno = EAGAIN;
			return -1;
		}
		usleep(10000);
	}
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event; // events hold no references here
}

// The exported symbol takes the compat type; like libibverbs it fills a whole
// struct ibv_port_attr (verbs.h's ___ibv_query_port passes one).
SV_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port,
			     struct _compat_ibv_port_attr *compat)
{
	struct ibv_port_attr *a = (struct ibv_port_attr *)compat;
	if (!context || !a)
		return EINVAL;
	if (port != 1)
		return EINVAL;
	struct sv_context *c = ctx_of(context);
	memset(a, 0, sizeof(*a));
	int down = port_watch(c);
	a->state = down ? IBV_PORT_DOWN : IBV_PORT_ACTIVE;
	a->phys_state = down ? 3 /* disabled */ : 5 /* link up */;
	a->max_mtu = IBV_MTU_4096;
	a->active_mtu = c->active_mtu;
	a->gid_tbl_len = c->link_ib ? 1 : 4;
	a->port_cap_flags = c->link_ib ? 0 : (1u << 26) /* IP based GIDs */;
	a->max_msg_sz = SV_MAX_MSG;
	a->pkey_tbl_len = 1;
	a->lid = c->link_ib ? c->dev->lid : 0;
	a->sm_lid = c->link_ib ? 1 : 0;
	a->max_vl_num = 1;
	a->active_width = 2;  // 4x
	a->active_speed = 32; // EDR: 4x EDR = 100 Gb/s
	a->link_layer = c->link_ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
	return 0;
}

// GID table, laid out as mlx5 lays it out: Ethernet: each address twice,
// RoCE v1 then RoCE v2: 0 = fe80::<guid> v1, 1 = fe80::<guid> v2,
// 2 = ::ffff:a.b.c.d v1, 3 = ::ffff:a.b.c.d v2. InfiniBand: 0 = fe80::<guid>.
static int gid_of(struct sv_context *c, int index, union ibv_gid *g, uint32_t *type)
{
	memset(g, 0, sizeof(*g));
	if (c->link_ib) {
		if (index != 0)
			return -1;
		g->raw[0] = 0xfe;
		g->raw[1] = 0x80;
		uint64_t be = htobe64(c->dev->guid);
		memcpy(g->raw + 8, &be, 8);
		*type = IBV_GID_TYPE_IB;
		return 0;
	}
	if (index < 0 || index > 3)
		return -1;
	if (index < 2) {
		g->raw[0] = 0xfe;
		g->raw[1] = 0x80;
		uint64_t be = htobe64(c->dev->guid);
		memcpy(g->raw + 8, &be, 8);
	} else {
		g->raw[10] = 0xff;
		g->raw[11] = 0xff;
		memcpy(g->raw + 12, &c->dev->ipv4, 4);
	}
	*type = index % 2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
	return 0;
}

SV_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port, int index, union ibv_gid *gid)
{
	uint32_t type;
	if (!context || !gid || port != 1 || gid_of(ctx_of(context), index, gid, &type) != 0) {
		errno = EINVAL;
		return -1;
	}
	return 0;
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port, uint32_t index,
				struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
	if (!context || !entry || flags != 0 || entry_size < sizeof(*entry) || port != 1)
		return EINVAL;
	memset(entry, 0, sizeof(*entry));
	if (gid_of(ctx_of(context), (int)index, &entry->gid, &entry->gid_type) != 0)
		return ENODATA;
	entry->gid_index = index;
	entry->port_num = port;
	entry->ndev_ifindex = ctx_of(context)->link_ib ? 0 : 1; // lo
	return 0;
}

// ---------------------------------------------------------------- PDs and MRs

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	struct sv_context *c = ctx_of(context);
	pthread_mutex_lock(&c->lock);
	if (c->n_pd >= SV_MAX_PD) {
		pthread_mutex_unlock(&c->lock);
		errno = ENOMEM;
		return NULL;
	}
	c->n_pd++;
	pthread_mutex_unlock(&c->lock);
	struct sv_pd *p = calloc(1, sizeof(*p));
	uint32_t id = registry_alloc_id();
	if (!p || !id) {
		free(p);
		pthread_mutex_lock(&c->lock);
		c->n_pd--;
		pthread_mutex_unlock(&c->lock);
		errno = p ? EIO : ENOMEM;
		return NULL;
	}
	p->pd.context = context;
	p->pd.handle = id;
	p->id = id;
	return &p->pd;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	if (!pd)
		return EINVAL;
	struct sv_pd *p = (struct sv_pd *)pd;
	struct sv_context *c = ctx_of(pd->context);
	pthread_mutex_lock(&c->lock);
	if (p->users) {
		pthread_mutex_unlock(&c->lock);
		return EBUSY;
	}
	c->n_pd--;
	pthread_mutex_unlock(&c->lock);
	free(p);
	return 0;
}

static const int SV_ACCESS_KNOWN = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
				   IBV_ACCESS_RELAXED_ORDERING;

// Pages of [addr, addr+len) all mapped? (a NIC driver pins them; EFAULT if not)
static int range_mapped(uint64_t addr, uint64_t len)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t start = addr & ~(uint64_t)(page - 1);
	uint64_t end = addr + len;
	static __thread unsigned char vec[4096];
	while (start < end) {
		uint64_t span = end - start;
		uint64_t max = (uint64_t)sizeof(vec) * (uint64_t)page;
		if (span > max)
			span = max;
		if (mincore((void *)start, span, vec) != 0)
			return 0;
		start += span;
	}
	return 1;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif

// populate_supported says whether the kernel knows MADV_POPULATE_WRITE.
static int populate_supported(void)
{
	static int known = -1;
	if (known < 0) {
		long page = sysconf(_SC_PAGESIZE);
		void *p = mmap(NULL, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		known = p != MAP_FAILED && madvise(p, (size_t)page, MADV_POPULATE_WRITE) == 0;
		if (p != MAP_FAILED)
			munmap(p, (size_t)page);
	}
	return known;
}

// pin_range faults in every page of a registration, as a NIC driver's
// pin_user_pages does: the pages are resident before the first READ, and
// registration, not the data path, pays for it. Memory the process cannot
// access (a GPU's device pointer with no peer-memory client, which
// softcuda maps PROT_NONE) fails with EFAULT as pin_user_pages does,
// instead of faulting the process. Kernels without MADV_POPULATE_* get a
// read of each page.
static int pin_range(uint64_t host, uint64_t len, int write)
{
	long page = sysconf(_SC_PAGESIZE);
	uint64_t start = host & ~(uint64_t)(page - 1);
	uint64_t end = host + len;
	if (madvise((void *)(uintptr_t)start, end - start, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
		return 0;
	// EINVAL is both "no such advice" (older kernels) and "permissions
	// incompatible"; a page that surely allows it tells them apart.
	if (errno != EINVAL || populate_supported())
		return EFAULT;
	for (uint64_t a = start; a < end; a += (uint64_t)page)
		(void)*(volatile const char *)(uintptr_t)(a < host ? host : a);
	return 0;
}

static struct ibv_mr *register_mr(struct ibv_pd *pd, uint64_t host, uint64_t len, uint64_t iova,
				  int access, void *map, size_t maplen)
{
	struct sv_context *c = ctx_of(pd->context);
	struct sv_pd *p = (struct sv_pd *)pd;
	pthread_mutex_lock(&c->lock);
	if (c->n_mr >= SV_MAX_MR) {
		pthread_mutex_unlock(&c->lock);
		errno = ENOMEM;
		return NULL;
	}
	c->n_mr++;
	p->users++;
	pthread_mutex_unlock(&c->lock);

	int perr = len > 0 ? pin_range(host, len, access & IBV_ACCESS_LOCAL_WRITE) : 0;
	if (perr) {
		pthread_mutex_lock(&c->lock);
		c->n_mr--;
		p->users--;
		pthread_mutex_unlock(&c->lock);
		errno = perr;
		return NULL;
	}
	struct sv_mr *m = calloc(1, sizeof(*m));
	uint32_t lkey = registry_alloc_id(), rkey = registry_alloc_id();
	if (!m || !lkey || !rkey)
		goto fail;
	m->mr.context = pd->context;
	m->mr.pd = pd;
	m->mr.addr = (void *)(uintptr_t)iova;
	m->mr.length = len;
	m->mr.handle = lkey;
	m->mr.lkey = lkey;
	m->mr.rkey = rkey;
	m->iova = iova;
	m->host = host;
	m->len = len;
	m->access = access;
	m->map = map;
	m->maplen = maplen;
	char line[512];
	snprintf(line, sizeof(line),
		 "pid=%d start=%llu pd=%u lkey=%u rkey=%u access=%d iova=%llu addr=%llu len=%llu\n",
		 (int)g_pid, g_start, p->id, lkey, rkey, access, (unsigned long long)iova,
		 (unsigned long long)host, (unsigned long long)len);
	if (registry_write("mr", rkey, line) != 0)
		goto fail;
	pthread_mutex_lock(&c->lock);
	m->next = c->mrs;
	c->mrs = m;
	pthread_mutex_unlock(&c->lock);
	return &m->mr;
fail:
	free(m);
	pthread_mutex_lock(&c->lock);
	c->n_mr--;
	p->users--;
	pthread_mutex_unlock(&c->lock);
	errno = EIO;
	return NULL;
}

static int check_reg(struct ibv_pd *pd, uint64_t len, int access)
{
	if (!pd || len == 0 || len > SV_MAX_MR_SIZE || (access & ~SV_ACCESS_KNOWN))
		return EINVAL;
	// As every driver: remote write or atomic without local write is refused.
	if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
	    !(access & IBV_ACCESS_LOCAL_WRITE))
		return EINVAL;
	return 0;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
					  uint64_t iova, unsigned int access)
{
	int err = check_reg(pd, length, (int)access);
	if (err) {
		errno = err;
		return NULL;
	}
	if (!addr || !range_mapped((uintptr_t)addr, length)) {
		errno = EFAULT;
		return NULL;
	}
	return register_mr(pd, (uintptr_t)addr, length, iova, (int)access, NULL, 0);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
					 uint64_t iova, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

// dma-buf: softverbs accepts memfd descriptors (the software GPU exports
// those), maps [offset, offset+length) of the file and registers the mapping
// at the given iova; peers read it through the registry like any MR.
SV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					   uint64_t iova, int fd, int access)
{
	int err = check_reg(pd, length, access);
	if (err) {
		errno = err;
		return NULL;
	}
	char link[64], target[256];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = fd >= 0 ? readlink(link, target, sizeof(target) - 1) : -1;
	if (n <= 0) {
		errno = EBADF;
		return NULL;
	}
	target[n] = 0;
	if (strncmp(target, "/memfd:", 7) != 0) {
		sv_log("ibv_reg_dmabuf_mr: fd %d is %s, not a memfd", fd, target);
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) != 0 || offset > (uint64_t)st.st_size ||
	    length > (uint64_t)st.st_size - offset) {
		errno = EINVAL;
		return NULL;
	}
	long page = sysconf(_SC_PAGESIZE);
	uint64_t aligned = offset & ~(uint64_t)(page - 1);
	size_t maplen = (size_t)(offset - aligned + length);
	void *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)aligned);
	if (map == MAP_FAILED)
		return NULL;
	struct ibv_mr *mr = register_mr(pd, (uintptr_t)map + (offset - aligned), length, iova, access,
					map, maplen);
	if (!mr)
		munmap(map, maplen);
	return mr;
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	if (!mr)
		return EINVAL;
	struct sv_mr *m = (struct sv_mr *)mr;
	struct sv_context *c = ctx_of(mr->context);
	pthread_mutex_lock(&c->lock);
	struct sv_mr **pp = &c->mrs;
	while (*pp && *pp != m)
		pp = &(*pp)->next;
	if (!*pp) {
		pthread_mutex_unlock(&c->lock);
		return EINVAL;
	}
	*pp = m->next;
	c->n_mr--;
	((struct sv_pd *)mr->pd)->users--;
	// A READ writing into the region finishes first: once this returns,
	// nothing more lands in the memory (it was pinned until now).
	while (m->users > 0)
		pthread_cond_wait(&c->mr_cv, &c->lock);
	pthread_mutex_unlock(&c->lock);
	registry_remove("mr", mr->rkey);
	if (m->map)
		munmap(m->map, m->maplen);
	free(m);
	return 0;
}

// ---------------------------------------------------------------- CQs

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
				       struct ibv_comp_channel *channel, int comp_vector)
{
	if (!context || cqe < 1 || cqe > SV_MAX_CQE || channel || comp_vector != 0) {
		errno = EINVAL;
		return NULL;
	}
	struct sv_context *c = ctx_of(context);
	pthread_mutex_lock(&c->lock);
	if (c->n_cq >= SV_MAX_CQ) {
		pthread_mutex_unlock(&c->lock);
		errno = ENOMEM;
		return NULL;
	}
	c->n_cq++;
	pthread_mutex_unlock(&c->lock);
	struct sv_cq *q = calloc(1, sizeof(*q));
	struct sv_cqe *ring = calloc((size_t)cqe, sizeof(*ring));
	if (!q || !ring) {
		free(q);
		free(ring);
		pthread_mutex_lock(&c->lock);
		c->n_cq--;
		pthread_mutex_unlock(&c->lock);
		errno = ENOMEM;
		return NULL;
	}
	q->cq.context = context;
	q->cq.cq_context = cq_context;
	q->cq.cqe = cqe; // exactly as asked: no rounding, so the limit is exact
	pthread_mutex_init(&q->cq.mutex, NULL);
	pthread_cond_init(&q->cq.cond, NULL);
	pthread_mutex_init(&q->lock, NULL);
	q->ring = ring;
	q->cap = cqe;
	return &q->cq;
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	if (!cq)
		return EINVAL;
	struct sv_cq *q = (struct sv_cq *)cq;
	struct sv_context *c = ctx_of(cq->context);
	pthread_mutex_lock(&c->lock);
	if (q->users) {
		pthread_mutex_unlock(&c->lock);
		return EBUSY;
	}
	c->n_cq--;
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&q->lock);
	free(q->ring);
	free(q);
	return 0;
}

static void qp_set_error_locked(struct sv_qp *s);

// Pushes a completion; on overrun the CQ is in error, the completion is lost
// and the QP moves to the error state (as a CQ error event does on hardware).
// Called with the QP's lock held.
static void cq_push(struct sv_qp *s, const struct ibv_wc *wc, uint64_t seq)
{
	struct sv_cq *q = (struct sv_cq *)s->qp.send_cq;
	pthread_mutex_lock(&q->lock);
	if (q->overflow || q->count == q->cap) {
		int first = !q->overflow;
		if (first)
			sv_log("CQ overrun (cqe=%d): CQ in error, completions lost", q->cap);
		q->overflow = 1;
		pthread_mutex_unlock(&q->lock);
		int was_err = s->qp.state == IBV_QPS_ERR;
		qp_set_error_locked(s);
		struct sv_context *c = ctx_of(s->qp.context);
		if (first)
			async_push(c, IBV_EVENT_CQ_ERR, &q->cq);
		if (!was_err)
			async_push(c, IBV_EVENT_QP_FATAL, &s->qp);
		return;
	}
	struct sv_cqe *e = &q->ring[(q->head + q->count) % q->cap];
	e->wc = *wc;
	e->qp = s;
	e->seq = seq;
	q->count++;
	pthread_mutex_unlock(&q->lock);
}

// Drops s's completions from q; with reset, also empties s's send queue
// accounting under the same lock, so a poll cannot free slots of the past.
static void cq_purge(struct sv_cq *q, struct sv_qp *s, int reset)
{
	pthread_mutex_lock(&q->lock);
	if (reset)
		__atomic_store_n(&s->freed, 0, __ATOMIC_RELEASE);
	int kept = 0;
	for (int i = 0; i < q->count; i++) {
		struct sv_cqe e = q->ring[(q->head + i) % q->cap];
		if (e.qp != s)
			q->ring[(q->head + kept++) % q->cap] = e;
	}
	q->count = kept;
	pthread_mutex_unlock(&q->lock);
}

// Pops up to n completions; called with q->lock held.
static int cq_pop(struct sv_cq *q, int n, struct ibv_wc *wc)
{
	int got = 0;
	while (got < n && q->count > 0) {
		struct sv_cqe *e = &q->ring[q->head];
		wc[got++] = e->wc;
		// Polling a completion frees its send-queue slot and those of the
		// unsignalled requests before it.
		uint64_t f = e->seq + 1, cur = __atomic_load_n(&e->qp->freed, __ATOMIC_ACQUIRE);
		while (f > cur && !__atomic_compare_exchange_n(&e->qp->freed, &cur, f, 0,
							       __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
			;
		q->head = (q->head + 1) % q->cap;
		q->count--;
	}
	return got;
}

static int qp_step(struct sv_qp *s, int inline_);

// A poller that finds the CQ empty executes queued requests of the QPs that
// complete here on its own thread (as many as it asks completions for, at
// most 16 a QP) before looking again. A spinning poller then moves the bytes
// itself instead of competing for a CPU with the QPs' workers, which take
// what pollers leave (anything that has to wait).
static int sv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct sv_cq *q = (struct sv_cq *)cq;
	if (n < 0 || (n > 0 && !wc))
		return -EINVAL;
	pthread_mutex_lock(&q->lock);
	int got = cq_pop(q, n, wc);
	if (got == 0 && n > 0 && !q->overflow && q->qps) {
		struct sv_qp *qps[SV_MAX_QP];
		int nq = 0;
		for (struct sv_qp *s = q->qps; s && nq < SV_MAX_QP; s = s->cq_next) {
			s->cq_refs++;
			qps[nq++] = s;
		}
		pthread_mutex_unlock(&q->lock);
		for (int i = 0; i < nq; i++) {
			struct sv_qp *s = qps[i];
			pthread_mutex_lock(&s->lock);
			for (int k = 0; k < 16 && k < n && qp_step(s, 1); k++)
				;
			pthread_mutex_unlock(&s->lock);
		}
		pthread_mutex_lock(&q->lock);
		for (int i = 0; i < nq; i++)
			qps[i]->cq_refs--;
		got = cq_pop(q, n, wc);
	}
	int overflow = q->overflow;
	pthread_mutex_unlock(&q->lock);
	if (got == 0 && overflow) {
		errno = EOVERFLOW;
		return -EOVERFLOW;
	}
	return got;
}

static int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)cq;
	(void)solicited_only;
	return EOPNOTSUPP; // no completion channels: poll
}

// ---------------------------------------------------------------- QPs

static void qp_publish(struct sv_qp *s)
{
	struct sv_context *c = ctx_of(s->qp.context);
	union ibv_gid g0, g1, sg;
	uint32_t t, stype = 0;
	// The table's two addresses: link-local, and the IPv4-mapped one.
	gid_of(c, 0, &g0, &t);
	if (gid_of(c, c->link_ib ? 1 : 3, &g1, &t) != 0)
		memset(&g1, 0, sizeof(g1));
	if (s->attr.ah_attr.is_global && gid_of(c, s->attr.ah_attr.grh.sgid_index, &sg, &stype) != 0)
		stype = 0;
	char h0[33], h1[33], line[1024];
	hex16(h0, g0.raw);
	hex16(h1, g1.raw);
	const char *ctl = getenv("SOFTVERBS_CONTROL");
	snprintf(line, sizeof(line),
		 "pid=%d start=%llu pd=%u qpn=%u state=%d dest_qpn=%u access=%d "
		 "max_dest_rd_atomic=%d lid=%u gid0=%s gid1=%s rq_psn=%u path_mtu=%d active_mtu=%d "
		 "sgid_type=%d control=%s\n",
		 (int)g_pid, g_start, ((struct sv_pd *)s->qp.pd)->id, s->qp.qp_num, (int)s->qp.state,
		 s->attr.dest_qp_num, (int)s->attr.qp_access_flags, (int)s->attr.max_dest_rd_atomic,
		 c->link_ib ? c->dev->lid : 0, h0, h1, s->attr.rq_psn, (int)s->attr.path_mtu,
		 (int)c->active_mtu, (int)stype, ctl ? ctl : "");
	registry_write("qp", s->qp.qp_num, line);
}

static void *qp_worker(void *arg);

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
	if (!pd || !ia || ia->qp_type != IBV_QPT_RC || !ia->send_cq || !ia->recv_cq || ia->srq ||
	    ia->send_cq->context != pd->context || ia->recv_cq->context != pd->context ||
	    ia->cap.max_send_wr > SV_MAX_QP_WR || ia->cap.max_recv_wr > SV_MAX_QP_WR ||
	    ia->cap.max_send_sge > SV_MAX_SGE || ia->cap.max_recv_sge > SV_MAX_SGE ||
	    ia->cap.max_inline_data > 0) {
		errno = EINVAL;
		return NULL;
	}
	struct sv_context *c = ctx_of(pd->context);
	pthread_mutex_lock(&c->lock);
	if (c->n_qp >= SV_MAX_QP) {
		pthread_mutex_unlock(&c->lock);
		errno = ENOMEM;
		return NULL;
	}
	c->n_qp++;
	pthread_mutex_unlock(&c->lock);
	struct sv_qp *s = calloc(1, sizeof(*s));
	struct sv_wr *ring = calloc(ia->cap.max_send_wr ? ia->cap.max_send_wr : 1, sizeof(*ring));
	uint32_t qpn = registry_alloc_id();
	if (!s || !ring || !qpn) {
		free(s);
		free(ring);
		pthread_mutex_lock(&c->lock);
		c->n_qp--;
		pthread_mutex_unlock(&c->lock);
		errno = qpn ? ENOMEM : EIO;
		return NULL;
	}
	s->qp.context = pd->context;
	s->qp.qp_context = ia->qp_context;
	s->qp.pd = pd;
	s->qp.send_cq = ia->send_cq;
	s->qp.recv_cq = ia->recv_cq;
	s->qp.handle = qpn;
	s->qp.qp_num = qpn;
	s->qp.state = IBV_QPS_RESET;
	s->qp.qp_type = IBV_QPT_RC;
	pthread_mutex_init(&s->qp.mutex, NULL);
	pthread_cond_init(&s->qp.cond, NULL);
	s->cap = ia->cap; // exact: no rounding, so the limits are exact
	s->sq_sig_all = ia->sq_sig_all;
	s->ring = ring;
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&s->thr, NULL, qp_worker, s) != 0) {
		free(ring);
		free(s);
		pthread_mutex_lock(&c->lock);
		c->n_qp--;
		pthread_mutex_unlock(&c->lock);
		errno = EAGAIN;
		return NULL;
	}
	s->thr_started = 1;
	pthread_mutex_lock(&c->lock);
	((struct sv_pd *)pd)->users++;
	((struct sv_cq *)ia->send_cq)->users++;
	((struct sv_cq *)ia->recv_cq)->users++;
	pthread_mutex_unlock(&c->lock);
	struct sv_cq *scq = (struct sv_cq *)ia->send_cq;
	pthread_mutex_lock(&scq->lock);
	s->cq_next = scq->qps;
	scq->qps = s;
	pthread_mutex_unlock(&scq->lock);
	qp_publish(s);
	return &s->qp;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	if (!qp)
		return EINVAL;
	struct sv_qp *s = (struct sv_qp *)qp;
	struct sv_context *c = ctx_of(qp->context);
	// Out of the CQ's list, and no poller still executing on it.
	struct sv_cq *scq = (struct sv_cq *)qp->send_cq;
	pthread_mutex_lock(&scq->lock);
	struct sv_qp **pp = &scq->qps;
	while (*pp && *pp != s)
		pp = &(*pp)->cq_next;
	if (*pp)
		*pp = s->cq_next;
	while (s->cq_refs > 0) {
		pthread_mutex_unlock(&scq->lock);
		sched_yield();
		pthread_mutex_lock(&scq->lock);
	}
	pthread_mutex_unlock(&scq->lock);
	pthread_mutex_lock(&s->lock);
	s->stop = 1;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->lock);
	if (s->thr_started)
		pthread_join(s->thr, NULL);
	registry_remove("qp", qp->qp_num);
	cq_purge((struct sv_cq *)qp->send_cq, s, 0);
	if (qp->recv_cq != qp->send_cq)
		cq_purge((struct sv_cq *)qp->recv_cq, s, 0);
	pthread_mutex_lock(&c->lock);
	c->n_qp--;
	((struct sv_pd *)qp->pd)->users--;
	((struct sv_cq *)qp->send_cq)->users--;
	((struct sv_cq *)qp->recv_cq)->users--;
	pthread_mutex_unlock(&c->lock);
	pthread_mutex_destroy(&s->lock);
	pthread_cond_destroy(&s->cv);
	free(s->ring);
	free(s);
	return 0;
}

// Required and optional attribute bits per RC transition, as the kernel's
// qp_state_table (ib_modify_qp_is_ok) that mlx5 and rxe rely on.
struct transition {
	int valid;
	int req, opt;
};

static struct transition rc_transition(enum ibv_qp_state cur, enum ibv_qp_state next)
{
	struct transition t = {0, 0, 0};
	if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
		t.valid = 1;
		return t;
	}
	switch (cur) {
	case IBV_QPS_RESET:
		if (next == IBV_QPS_INIT)
			t = (struct transition){1, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
		break;
	case IBV_QPS_INIT:
		if (next == IBV_QPS_INIT)
			t = (struct transition){1, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
		else if (next == IBV_QPS_RTR)
			t = (struct transition){1,
						IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
							IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
						IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
		break;
	case IBV_QPS_RTR:
		if (next == IBV_QPS_RTS)
			t = (struct transition){1,
						IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
							IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
						IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
							IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE};
		break;
	case IBV_QPS_RTS:
		if (next == IBV_QPS_RTS)
			t = (struct transition){1, 0,
						IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
							IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER};
		break;
	default:
		break;
	}
	return t;
}

static int is_zero_gid(const union ibv_gid *g)
{
	for (int i = 0; i < 16; i++)
		if (g->raw[i])
			return 0;
	return 1;
}

static const int SV_QP_ACCESS = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC;

static void qp_reset_locked(struct sv_qp *s)
{
	s->gen++;
	s->posted = s->executed = 0;
	memset(&s->attr, 0, sizeof(s->attr));
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	if (!qp || !attr)
		return EINVAL;
	struct sv_qp *s = (struct sv_qp *)qp;
	struct sv_context *c = ctx_of(qp->context);
	pthread_mutex_lock(&s->lock);
	enum ibv_qp_state cur = qp->state;
	if ((mask & IBV_QP_CUR_STATE) && attr->cur_qp_state != cur)
		goto inval;
	enum ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
	if (next > IBV_QPS_ERR)
		goto inval;
	struct transition t = rc_transition(cur, next);
	int m = mask & ~IBV_QP_STATE;
	if (!t.valid || (m & t.req) != t.req || (m & ~(t.req | t.opt)))
		goto inval;
	// Values.
	if ((m & IBV_QP_PORT) && attr->port_num != 1)
		goto inval;
	if ((m & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0)
		goto inval;
	if ((m & IBV_QP_ACCESS_FLAGS) && (attr->qp_access_flags & ~SV_QP_ACCESS))
		goto inval;
	if ((m & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096))
		goto inval;
	if ((m & IBV_QP_DEST_QPN) && attr->dest_qp_num > 0xFFFFFF)
		goto inval;
	if ((m & IBV_QP_RQ_PSN) && attr->rq_psn > 0xFFFFFF)
		goto inval;
	if ((m & IBV_QP_SQ_PSN) && attr->sq_psn > 0xFFFFFF)
		goto inval;
	if ((m & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > SV_MAX_QP_RD_ATOM)
		goto inval;
	if ((m & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > SV_MAX_QP_INIT_RD_ATOM)
		goto inval;
	if ((m & IBV_QP_MIN_RNR_TIMER) && attr->min_rnr_timer > 31)
		goto inval;
	if ((m & IBV_QP_TIMEOUT) && attr->timeout > 31)
		goto inval;
	if ((m & IBV_QP_RETRY_CNT) && attr->retry_cnt > 7)
		goto inval;
	if ((m & IBV_QP_RNR_RETRY) && attr->rnr_retry > 7)
		goto inval;
	if (m & IBV_QP_AV) {
		const struct ibv_ah_attr *ah = &attr->ah_attr;
		if (ah->port_num > 1)
			goto inval;
		if (ah->is_global) {
			union ibv_gid g;
			uint32_t type;
			if (gid_of(c, ah->grh.sgid_index, &g, &type) != 0 || is_zero_gid(&ah->grh.dgid))
				goto inval;
		} else if (!c->link_ib || ah->dlid == 0) {
			goto inval; // RoCE needs a GRH; InfiniBand without one needs a LID
		}
	}
	if (m & IBV_QP_ALT_PATH)
		goto inval; // no alternate paths on this device

	if (next == IBV_QPS_RESET) {
		// Wait out a request in flight so its completion is discarded.
		s->gen++;
		pthread_cond_broadcast(&s->cv);
		s->busy_waiters++;
		while (s->busy)
			pthread_cond_wait(&s->cv, &s->lock);
		s->busy_waiters--;
		qp_reset_locked(s);
		cq_purge((struct sv_cq *)qp->send_cq, s, 1);
	}
	// Keep the attributes that were given.
	struct ibv_qp_attr *a = &s->attr;
	if (m & IBV_QP_PORT)
		a->port_num = attr->port_num;
	if (m & IBV_QP_PKEY_INDEX)
		a->pkey_index = attr->pkey_index;
	if (m & IBV_QP_ACCESS_FLAGS)
		a->qp_access_flags = attr->qp_access_flags;
	if (m & IBV_QP_AV)
		a->ah_attr = attr->ah_attr;
	if (m & IBV_QP_PATH_MTU)
		a->path_mtu = attr->path_mtu;
	if (m & IBV_QP_DEST_QPN)
		a->dest_qp_num = attr->dest_qp_num;
	if (m & IBV_QP_RQ_PSN)
		a->rq_psn = attr->rq_psn;
	if (m & IBV_QP_SQ_PSN)
		a->sq_psn = attr->sq_psn;
	if (m & IBV_QP_MAX_DEST_RD_ATOMIC)
		a->max_dest_rd_atomic = attr->max_dest_rd_atomic;
	if (m & IBV_QP_MAX_QP_RD_ATOMIC)
		a->max_rd_atomic = attr->max_rd_atomic;
	if (m & IBV_QP_MIN_RNR_TIMER)
		a->min_rnr_timer = attr->min_rnr_timer;
	if (m & IBV_QP_TIMEOUT)
		a->timeout = attr->timeout;
	if (m & IBV_QP_RETRY_CNT)
		a->retry_cnt = attr->retry_cnt;
	if (m & IBV_QP_RNR_RETRY)
		a->rnr_retry = attr->rnr_retry;
	qp->state = next;
	pthread_cond_broadcast(&s->cv); // a worker waiting out a timeout sees ERR/RESET
	qp_publish(s);
	pthread_mutex_unlock(&s->lock);
	return 0;
inval:
	pthread_mutex_unlock(&s->lock);
	return EINVAL;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
			   struct ibv_qp_init_attr *init)
{
	(void)mask;
	if (!qp || !attr || !init)
		return EINVAL;
	struct sv_qp *s = (struct sv_qp *)qp;
	pthread_mutex_lock(&s->lock);
	*attr = s->attr;
	attr->qp_state = qp->state;
	attr->cur_qp_state = qp->state;
	attr->cap = s->cap;
	memset(init, 0, sizeof(*init));
	init->qp_context = qp->qp_context;
	init->send_cq = qp->send_cq;
	init->recv_cq = qp->recv_cq;
	init->cap = s->cap;
	init->qp_type = IBV_QPT_RC;
	init->sq_sig_all = s->sq_sig_all;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

static void qp_set_error_locked(struct sv_qp *s)
{
	if (s->qp.state != IBV_QPS_ERR && s->qp.state != IBV_QPS_RESET) {
		s->qp.state = IBV_QPS_ERR;
		pthread_cond_broadcast(&s->cv);
	}
}

// ---------------------------------------------------------------- data path

static int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct sv_qp *s = (struct sv_qp *)qp;
	struct faults f;
	faults_refresh(&f);
	uint64_t now = now_ns();
	pthread_mutex_lock(&s->lock);
	int err = 0;
	for (; wr; wr = wr->next) {
		if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) {
			err = EINVAL;
			break;
		}
		if (wr->num_sge < 0 || (uint32_t)wr->num_sge > s->cap.max_send_sge ||
		    (wr->num_sge > 0 && !wr->sg_list) || (wr->send_flags & IBV_SEND_INLINE)) {
			err = EINVAL;
			break;
		}
		if (s->posted - __atomic_load_n(&s->freed, __ATOMIC_ACQUIRE) >= s->cap.max_send_wr) {
			err = ENOMEM;
			break;
		}
		struct sv_wr *w = &s->ring[s->posted % s->cap.max_send_wr];
		memset(w, 0, sizeof(*w));
		w->wr_id = wr->wr_id;
		w->seq = s->posted;
		w->posted_ns = now;
		w->opcode = wr->opcode;
		w->signaled = s->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		w->num_sge = wr->num_sge;
		if (wr->num_sge)
			memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(struct ibv_sge));
		if (wr->opcode == IBV_WR_RDMA_READ) {
			pthread_mutex_lock(&g_fault_lock);
			if (g_fail_countdown > 0 && --g_fail_countdown == 0)
				w->inject = g_faults.fail_status;
			pthread_mutex_unlock(&g_fault_lock);
		}
		s->posted++;
	}
	if (err && bad)
		*bad = wr;
	if (s->idle)
		pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->lock);
	return err;
}

static int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)qp;
	if (bad)
		*bad = wr;
	return EOPNOTSUPP; // READs only: no receives
}

// Transport timeout: 4.096 us * 2^timeout per try, retry_cnt+1 tries; long
// ones are capped (SOFTVERBS_TIMEOUT_CAP_MS, default 2 s) so that tests end.
// Timeout 0 is infinite, as on hardware: a request that gets no response
// waits until the QP is reset, moved to ERR or destroyed.
static uint64_t qp_timeout_ns(const struct ibv_qp_attr *a)
{
	if (a->timeout == 0)
		return UINT64_MAX;
	uint64_t cap_ms = strtoull(env_or("SOFTVERBS_TIMEOUT_CAP_MS", "0"), NULL, 10);
	if (cap_ms == 0)
		cap_ms = SV_DEFAULT_TIMEOUT_CAP_MS;
	uint64_t cap = cap_ms * 1000000ull;
	long double ns = 4096.0L * (long double)(1ull << a->timeout) * (a->retry_cnt + 1);
	return ns > (long double)cap ? cap : (uint64_t)ns;
}

// Sleeps until the deadline unless the QP is reset, moved to ERR, or
// destroyed; returns 0 if it slept the whole time.
static int qp_wait(struct sv_qp *s, uint64_t gen, uint64_t until_ns)
{
	pthread_mutex_lock(&s->lock);
	int aborted = 0;
	for (;;) {
		if (s->stop || s->gen != gen || s->qp.state != IBV_QPS_RTS) {
			aborted = 1;
			break;
		}
		uint64_t now = now_ns();
		if (now >= until_ns)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec + (until_ns - now);
		ts.tv_sec = (time_t)(t / 1000000000ull);
		ts.tv_nsec = (long)(t % 1000000000ull);
		pthread_cond_timedwait(&s->cv, &s->lock, &ts);
	}
	pthread_mutex_unlock(&s->lock);
	return aborted;
}

enum reach { REACH_OK, REACH_LOST, REACH_INV_REQ };

// The responder QP's entry, from the cache while the registry is unchanged.
static int peer_entry(struct sv_qp *s, struct qp_entry *pe)
{
	uint64_t gen = registry_gen_now(), now = now_ns();
	if (gen && s->peer.gen == gen && now - s->peer.at < SV_CACHE_NS &&
	    s->peer.e.qpn == s->attr.dest_qp_num) {
		*pe = s->peer.e;
		return 0;
	}
	s->peer.gen = 0;
	if (qp_entry_read(s->attr.dest_qp_num, pe) != 0 || !proc_alive(pe->pid, pe->start))
		return -1;
	s->peer.e = *pe;
	s->peer.gen = gen;
	s->peer.at = now;
	return 0;
}

static int rkey_entry(struct sv_qp *s, uint32_t rkey, struct mr_entry *me)
{
	uint64_t gen = registry_gen_now(), now = now_ns();
	for (unsigned i = 0; i < 8; i++)
		if (gen && s->mrc[i].gen == gen && s->mrc[i].rkey == rkey && now - s->mrc[i].at < SV_CACHE_NS) {
			*me = s->mrc[i].e;
			return 0;
		}
	if (mr_entry_read(rkey, me) != 0)
		return -1;
	unsigned i = s->mrc_next++ % 8;
	s->mrc[i].e = *me;
	s->mrc[i].rkey = rkey;
	s->mrc[i].gen = gen;
	s->mrc[i].at = now;
	return 0;
}

// Can the responder be reached now? LOST means no response would come (gone,
// wrong address, not connected back, stalled, port down): the requester
// retries until its timeout.
static enum reach peer_reach(struct sv_qp *s, struct qp_entry *pe, uint64_t total)
{
	struct sv_context *c = ctx_of(s->qp.context);
	struct faults f;
	faults_refresh(&f);
	if (f.stall || port_watch(c))
		return REACH_LOST;
	if (peer_entry(s, pe) != 0)
		return REACH_LOST;
	const struct ibv_ah_attr *ah = &s->attr.ah_attr;
	if (ah->is_global) {
		if (memcmp(ah->grh.dgid.raw, pe->gid[0], 16) && memcmp(ah->grh.dgid.raw, pe->gid[1], 16))
			return REACH_LOST;
	} else if (ah->dlid != pe->lid) {
		return REACH_LOST;
	}
	if (pe->state < IBV_QPS_RTR || pe->state == IBV_QPS_ERR || pe->dest_qpn != s->qp.qp_num)
		return REACH_LOST;
	if (pe->control[0]) {
		struct faults pf;
		peer_faults(&s->peer_ctl, pe->control, &pf);
		if (pf.stall || pf.port_down)
			return REACH_LOST;
	}
	if (ah->is_global && !c->link_ib) {
		// Both ends send with the same RoCE version, or neither hears the
		// other; RoCE v1 (layer 2) frames are not routed unless the two
		// are on one segment (SOFTVERBS_ROCE_V1=1).
		union ibv_gid g;
		uint32_t type;
		if (gid_of(c, ah->grh.sgid_index, &g, &type) != 0 || (int)type != pe->sgid_type)
			return REACH_LOST;
		if (type == IBV_GID_TYPE_ROCE_V1 && !c->roce_v1)
			return REACH_LOST;
	}
	// The responder takes only the PSN it expects: another is a duplicate
	// or out of sequence, and the requester retries until it gives up.
	if (s->attr.sq_psn != pe->rq_psn)
		return REACH_LOST;
	// Packets longer than the link carries (the smaller active MTU of the
	// two ports) are dropped: a READ response is cut to the responder's
	// path MTU, and the requester takes none longer than its own.
	int link = c->active_mtu < pe->active_mtu ? c->active_mtu : pe->active_mtu;
	uint64_t link_bytes = 128ull << link;
	if (total > link_bytes && (pe->path_mtu > link || (int)s->attr.path_mtu > link))
		return REACH_LOST;
	if (!(pe->access & IBV_ACCESS_REMOTE_READ) || pe->max_dest_rd_atomic == 0)
		return REACH_INV_REQ;
	// More READs outstanding than the responder has resources for: it
	// answers Invalid Request.
	uint64_t outstanding = s->outstanding;
	if (outstanding > s->attr.max_rd_atomic)
		outstanding = s->attr.max_rd_atomic;
	if (outstanding > (uint64_t)pe->max_dest_rd_atomic)
		return REACH_INV_REQ;
	return REACH_OK;
}

// local_sges resolves the request's scatter list. With held, it also
// counts the READ as a user of each region (ibv_dereg_mr waits for it, as
// a NIC's writes into pinned memory end before the deregistration does);
// mr_release drops them.
static void mr_release(struct sv_context *c, struct sv_mr **held, int n);

static int local_sges(struct sv_qp *s, const struct sv_wr *w, struct iovec *iov, uint64_t *total,
		      struct sv_mr **held)
{
	struct sv_context *c = ctx_of(s->qp.context);
	*total = 0;
	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < w->num_sge; i++) {
		const struct ibv_sge *g = &w->sge[i];
		struct sv_mr *m = c->mrs;
		while (m && m->mr.lkey != g->lkey)
			m = m->next;
		if (!m || m->mr.pd != s->qp.pd || !(m->access & IBV_ACCESS_LOCAL_WRITE) ||
		    g->addr < m->iova || g->length > m->len || g->addr - m->iova > m->len - g->length) {
			for (int j = 0; held && j < i; j++)
				held[j]->users--;
			pthread_mutex_unlock(&c->lock);
			return IBV_WC_LOC_PROT_ERR;
		}
		if (held) {
			held[i] = m;
			m->users++;
		}
		iov[i].iov_base = (void *)(uintptr_t)(m->host + (g->addr - m->iova));
		iov[i].iov_len = g->length;
		*total += g->length;
	}
	pthread_mutex_unlock(&c->lock);
	if (*total > SV_MAX_MSG) {
		if (held)
			mr_release(c, held, w->num_sge);
		return IBV_WC_LOC_LEN_ERR;
	}
	return IBV_WC_SUCCESS;
}

static void mr_release(struct sv_context *c, struct sv_mr **held, int n)
{
	pthread_mutex_lock(&c->lock);
	for (int i = 0; i < n; i++)
		held[i]->users--;
	pthread_cond_broadcast(&c->mr_cv);
	pthread_mutex_unlock(&c->lock);
}

// pull copies total bytes of the responder's region into the local
// scatter list; a responder that has exited sets *gone.
static int pull(const struct qp_entry *pe_, const struct sv_wr *w, struct iovec *iov,
		const struct mr_entry *me_, uint64_t total, int *gone_)
{
	const struct qp_entry pe = *pe_;
	const struct mr_entry me = *me_;
	int gone = 0;
	struct faults f;
	faults_refresh(&f);
	struct iovec rem = {(void *)(uintptr_t)(me.addr + (w->raddr - me.iova)), total};
	uint64_t done = 0;
	int li = 0;
	size_t loff = 0;
	while (done < total) {
		struct iovec lv[SV_MAX_SGE];
		int n = 0;
		for (int i = li; i < w->num_sge; i++, n++) {
			lv[n] = iov[i];
			if (i == li) {
				lv[n].iov_base = (char *)lv[n].iov_base + loff;
				lv[n].iov_len -= loff;
			}
		}
		struct iovec piece = rem;
		if (f.copy_us) { // a slow wire: 64 KiB at a time
			usleep(f.copy_us);
			if (piece.iov_len > 65536)
				piece.iov_len = 65536;
		}
		ssize_t got = process_vm_readv(pe.pid, lv, (unsigned long)n, &piece, 1, 0);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			if (errno == ESRCH) {
				gone = 1;
				break;
			}
			if (errno == EPERM)
				sv_log("process_vm_readv from pid %d: %s (same user and ptrace access needed)",
				       pe.pid, strerror(errno));
			return IBV_WC_REM_ACCESS_ERR;
		}
		if (got == 0)
			return IBV_WC_REM_ACCESS_ERR;
		done += (uint64_t)got;
		rem.iov_base = (char *)rem.iov_base + got;
		rem.iov_len -= (size_t)got;
		size_t g = (size_t)got;
		while (g > 0) {
			size_t left = iov[li].iov_len - loff;
			if (g < left) {
				loff += g;
				g = 0;
			} else {
				g -= left;
				li++;
				loff = 0;
			}
		}
		while (li < w->num_sge && iov[li].iov_len == 0)
			li++;
	}
	if (gone)
		*gone_ = 1;
	return IBV_WC_SUCCESS;
}

// Executes one READ; returns its completion status.
static int do_read(struct sv_qp *s, const struct sv_wr *w, uint64_t gen, uint32_t *byte_len,
		   int inline_)
{
	struct iovec iov[SV_MAX_SGE];
	uint64_t total;
	int st = local_sges(s, w, iov, &total, NULL);
	if (st != IBV_WC_SUCCESS)
		return st;
	uint64_t tmo = qp_timeout_ns(&s->attr), deadline = tmo == UINT64_MAX ? UINT64_MAX : now_ns() + tmo;
	struct qp_entry pe;
	for (;;) {
		enum reach r = peer_reach(s, &pe, total);
		if (r == REACH_INV_REQ)
			return IBV_WC_REM_INV_REQ_ERR;
		if (r == REACH_OK) {
			struct mr_entry me;
			uint64_t rgen = registry_gen_now();
			if (rkey_entry(s, w->rkey, &me) != 0 || me.pid != pe.pid || me.start != pe.start ||
			    me.pd != pe.pd || !(me.access & IBV_ACCESS_REMOTE_READ) || w->raddr < me.iova ||
			    total > me.len || w->raddr - me.iova > me.len - total)
				return IBV_WC_REM_ACCESS_ERR;
			struct sv_mr *held[SV_MAX_SGE];
			// Resolve again, holding the regions for the copy: one
			// deregistered since the request was checked is gone.
			st = local_sges(s, w, iov, &total, held);
			if (st != IBV_WC_SUCCESS)
				return st;
			int gone = 0;
			st = pull(&pe, w, iov, &me, total, &gone);
			mr_release(ctx_of(s->qp.context), held, w->num_sge);
			if (st != IBV_WC_SUCCESS)
				return st;
			// A region the responder deregistered during the copy: what
			// was read is not trusted (a NIC's access ends with the
			// registration).
			if (!gone && registry_gen_now() != rgen) {
				struct mr_entry now;
				if (mr_entry_read(w->rkey, &now) != 0 || now.pid != me.pid || now.start != me.start ||
				    now.addr != me.addr || now.len != me.len)
					return IBV_WC_REM_ACCESS_ERR;
			}
			if (!gone) {
				*byte_len = (uint32_t)total;
				return IBV_WC_SUCCESS;
			}
			s->peer.gen = 0; // look the peer up again
		}
		// No response: retry until the transport timeout (on the worker).
		if (inline_)
			return SV_DEFER;
		uint64_t now = now_ns();
		if (now >= deadline)
			return IBV_WC_RETRY_EXC_ERR;
		uint64_t next = now + 2000000ull; // look again in 2 ms
		if (next > deadline)
			next = deadline;
		if (qp_wait(s, gen, next))
			return IBV_WC_WR_FLUSH_ERR;
	}
}

// Executes the QP's next request, if there is one and no other thread is
// executing one; called with s->lock held, returns with it held; 1 if it
// took a request off the queue. inline_: the caller is a poller (see
// sv_poll_cq), which never waits: a request that would (no response yet,
// a delay fault) is left to the QP's worker.
static int qp_step(struct sv_qp *s, int inline_)
{
	if (s->busy || s->executed >= s->posted ||
	    (s->qp.state != IBV_QPS_RTS && s->qp.state != IBV_QPS_ERR))
		return 0;
	struct sv_wr w = s->ring[s->executed % s->cap.max_send_wr];
	uint64_t gen = s->gen;
	int status;
	uint32_t byte_len = 0;
	if (s->qp.state == IBV_QPS_ERR) {
		status = IBV_WC_WR_FLUSH_ERR;
	} else {
		s->busy = 1;
		s->outstanding = s->posted - s->executed;
		pthread_mutex_unlock(&s->lock);
		struct faults f;
		faults_refresh(&f);
		if (inline_ && (f.delay_us || f.copy_us || f.stall || f.port_down))
			status = SV_DEFER;
		else if (w.inject)
			status = w.inject;
		else if (w.opcode != IBV_WR_RDMA_READ)
			status = IBV_WC_LOC_QP_OP_ERR;
		else {
			uint64_t cpu0 = thread_cpu_ns();
			status = do_read(s, &w, gen, &byte_len, inline_);
			stats_add(inline_ ? SV_STAT_POLL_CPU_NS : SV_STAT_WORK_CPU_NS, thread_cpu_ns() - cpu0);
			if (status == IBV_WC_SUCCESS) {
				stats_add(SV_STAT_READS, 1);
				stats_add(SV_STAT_BYTES, byte_len);
			}
		}
		if (f.delay_us && status != SV_DEFER)
			usleep(f.delay_us);
		pthread_mutex_lock(&s->lock);
		s->busy = 0;
		if (status == SV_DEFER || s->busy_waiters)
			pthread_cond_broadcast(&s->cv); // the worker takes deferred work; RESET waits
		if (status == SV_DEFER) {
			if (s->gen == gen)
				s->ring[s->executed % s->cap.max_send_wr].deferred = 1;
			return 0;
		}
		if (s->gen != gen)
			return 1; // reset meanwhile: discarded
		if (status == IBV_WC_SUCCESS && s->qp.state == IBV_QPS_ERR)
			status = IBV_WC_WR_FLUSH_ERR;
	}
	s->executed++;
	if (status != IBV_WC_SUCCESS || w.signaled) {
		struct ibv_wc wc;
		memset(&wc, 0, sizeof(wc));
		wc.wr_id = w.wr_id;
		wc.status = status;
		wc.opcode = IBV_WC_RDMA_READ;
		wc.byte_len = status == IBV_WC_SUCCESS ? byte_len : 0;
		wc.qp_num = s->qp.qp_num;
		enum ibv_qp_state before = s->qp.state;
		cq_push(s, &wc, w.seq); // an overrun moves the QP to ERR
		if (before != IBV_QPS_ERR && s->qp.state == IBV_QPS_ERR) {
			qp_publish(s);
			return 1;
		}
	}
	// An unsignalled success frees its slot when a later completion is polled.
	if (status != IBV_WC_SUCCESS && s->qp.state != IBV_QPS_ERR) {
		qp_set_error_locked(s);
		qp_publish(s);
	}
	return 1;
}

static void *qp_worker(void *arg)
{
	struct sv_qp *s = arg;
	// Named, so that its CPU time shows apart in /proc/<pid>/task/*/comm.
	pthread_setname_np(pthread_self(), "softverbs-qp");
	// Signals are for the application's threads (a Go runtime's among them).
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	pthread_mutex_lock(&s->lock);
	while (!s->stop) {
		int pending = s->executed < s->posted &&
			      (s->qp.state == IBV_QPS_RTS || s->qp.state == IBV_QPS_ERR);
		if (!pending) {
			s->idle = 1;
			pthread_cond_wait(&s->cv, &s->lock);
			s->idle = 0;
			continue;
		}
		// A request younger than SV_GRACE_NS, or one a poller is executing,
		// is left to the pollers a while: a worker woken for every request
		// would cost two thread switches each.
		uint64_t now = now_ns();
		const struct sv_wr *w = &s->ring[s->executed % s->cap.max_send_wr];
		if (s->busy || (s->qp.state == IBV_QPS_RTS && !w->deferred && now - w->posted_ns < SV_GRACE_NS)) {
			struct timespec ts;
			clock_gettime(CLOCK_MONOTONIC, &ts);
			uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + SV_GRACE_NS;
			ts.tv_sec = (time_t)(t / 1000000000ull);
			ts.tv_nsec = (long)(t % 1000000000ull);
			pthread_cond_timedwait(&s->cv, &s->lock, &ts);
			continue;
		}
		qp_step(s, 0);
	}
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

SV_EXPORT const char *ibv_wc_status_str(enum ibv_wc_status status)
{
	static const char *const str[] = {
		[IBV_WC_SUCCESS] = "success",
		[IBV_WC_LOC_LEN_ERR] = "local length error",
		[IBV_WC_LOC_QP_OP_ERR] = "local QP operation error",
		[IBV_WC_LOC_EEC_OP_ERR] = "local EE context operation error",
		[IBV_WC_LOC_PROT_ERR] = "local protection error",
		[IBV_WC_WR_FLUSH_ERR] = "Work Request Flushed Error",
		[IBV_WC_MW_BIND_ERR] = "memory management operation error",
		[IBV_WC_BAD_RESP_ERR] = "bad response error",
		[IBV_WC_LOC_ACCESS_ERR] = "local access error",
		[IBV_WC_REM_INV_REQ_ERR] = "remote invalid request error",
		[IBV_WC_REM_ACCESS_ERR] = "remote access error",
		[IBV_WC_REM_OP_ERR] = "remote operation error",
		[IBV_WC_RETRY_EXC_ERR] = "transport retry counter exceeded",
		[IBV_WC_RNR_RETRY_EXC_ERR] = "RNR retry counter exceeded",
		[IBV_WC_LOC_RDD_VIOL_ERR] = "local RDD violation error",
		[IBV_WC_REM_INV_RD_REQ_ERR] = "remote invalid RD request",
		[IBV_WC_REM_ABORT_ERR] = "aborted error",
		[IBV_WC_INV_EECN_ERR] = "invalid EE context number",
		[IBV_WC_INV_EEC_STATE_ERR] = "invalid EE context state",
		[IBV_WC_FATAL_ERR] = "fatal error",
		[IBV_WC_RESP_TIMEOUT_ERR] = "response timeout error",
		[IBV_WC_GENERAL_ERR] = "general error",
	};
	if ((unsigned)status < sizeof(str) / sizeof(str[0]) && str[status])
		return str[status];
	return "unknown";
}
