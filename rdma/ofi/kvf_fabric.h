/*
 * kvf_fabric.h: kvfabric's own declarations of the parts of libfabric's
 * <rdma/fabric.h>, <rdma/fi_domain.h>, <rdma/fi_endpoint.h>, <rdma/fi_cm.h>,
 * <rdma/fi_eq.h> and <rdma/fi_rma.h> that package ofi uses. The binding
 * loads libfabric with dlopen at run time, so it cannot include the real
 * headers (libfabric-dev is absent on most machines that run the agent).
 * Every size, field offset and constant here is checked against the real
 * headers by abi_test.go; names are libfabric's with a kvf_ prefix so that
 * both can be read side by side.
 *
 * libfabric exports only a handful of functions (fi_getinfo, fi_freeinfo,
 * fi_dupinfo, fi_fabric, fi_strerror, fi_version). Everything else (fi_domain,
 * fi_endpoint, fi_mr_reg, fi_read, fi_cq_read, ...) is a static inline
 * function of the headers that calls through the object's ops table; the
 * binding does the same through the tables declared here.
 *
 * Only what is used is declared. Ops tables list every entry (those never
 * called as void *), so that sizes and offsets match the real tables.
 */
#ifndef KVF_FABRIC_H
#define KVF_FABRIC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KVF_FI_VERSION(major, minor) (((major) << 16) | (minor))

/* Capabilities and operation flags (fabric.h). */
#define KVF_FI_MSG (1ULL << 1)
#define KVF_FI_RMA (1ULL << 2)
#define KVF_FI_READ (1ULL << 8)
#define KVF_FI_RECV (1ULL << 10)
#define KVF_FI_SEND (1ULL << 11)
#define KVF_FI_WRITE (1ULL << 9)
#define KVF_FI_REMOTE_READ (1ULL << 12)
#define KVF_FI_REMOTE_WRITE (1ULL << 13)
#define KVF_FI_COMPLETION (1ULL << 24)
#define KVF_FI_HMEM (1ULL << 47)
#define KVF_FI_LOCAL_COMM (1ULL << 51)
#define KVF_FI_REMOTE_COMM (1ULL << 52)
#define KVF_FI_SOURCE (1ULL << 57)

/* Mode bits (fabric.h). */
#define KVF_FI_CONTEXT (1ULL << 59)
#define KVF_FI_CONTEXT2 (1ULL << 52)
#define KVF_FI_LOCAL_MR (1ULL << 55)

/* Memory registration modes (fabric.h, enum fi_mr_mode and defines). */
#define KVF_FI_MR_UNSPEC 0
#define KVF_FI_MR_BASIC 1
#define KVF_FI_MR_SCALABLE 2
#define KVF_FI_MR_LOCAL (1 << 2)
#define KVF_FI_MR_RAW (1 << 3)
#define KVF_FI_MR_VIRT_ADDR (1 << 4)
#define KVF_FI_MR_ALLOCATED (1 << 5)
#define KVF_FI_MR_PROV_KEY (1 << 6)
#define KVF_FI_MR_MMU_NOTIFY (1 << 7)
#define KVF_FI_MR_RMA_EVENT (1 << 8)
#define KVF_FI_MR_ENDPOINT (1 << 9)
#define KVF_FI_MR_HMEM (1 << 10)

/* enum fi_ep_type */
#define KVF_FI_EP_RDM 3
/* enum fi_threading */
#define KVF_FI_THREAD_SAFE 1
#define KVF_FI_THREAD_DOMAIN 3
/* enum fi_progress */
#define KVF_FI_PROGRESS_AUTO 1
#define KVF_FI_PROGRESS_MANUAL 2
/* enum fi_av_type */
#define KVF_FI_AV_MAP 1
#define KVF_FI_AV_TABLE 2
/* enum fi_cq_format */
#define KVF_FI_CQ_FORMAT_CONTEXT 1
/* enum fi_wait_obj */
#define KVF_FI_WAIT_NONE 0
#define KVF_FI_WAIT_UNSPEC 1
/* enum fi_hmem_iface */
#define KVF_FI_HMEM_SYSTEM 0
#define KVF_FI_HMEM_CUDA 1
/* fi_control commands (enum in fabric.h) */
#define KVF_FI_ENABLE 6

/* fi_errno.h: calls return negated values. */
#define KVF_FI_EAGAIN 11
#define KVF_FI_EAVAIL 259

typedef uint64_t kvf_fi_addr_t;
#define KVF_FI_ADDR_UNSPEC ((uint64_t)-1)

struct kvf_fid;
struct kvf_fid_fabric;
struct kvf_fid_domain;
struct kvf_fid_av;
struct kvf_fid_cq;
struct kvf_fid_ep;
struct kvf_fid_mr;

struct kvf_fi_tx_attr {
	uint64_t caps;
	uint64_t mode;
	uint64_t op_flags;
	uint64_t msg_order;
	uint64_t comp_order;
	size_t inject_size;
	size_t size;
	size_t iov_limit;
	size_t rma_iov_limit;
	uint32_t tclass;
};

struct kvf_fi_rx_attr {
	uint64_t caps;
	uint64_t mode;
	uint64_t op_flags;
	uint64_t msg_order;
	uint64_t comp_order;
	size_t total_buffered_recv;
	size_t size;
	size_t iov_limit;
};

struct kvf_fi_ep_attr {
	int type; /* enum fi_ep_type */
	uint32_t protocol;
	uint32_t protocol_version;
	size_t max_msg_size;
	size_t msg_prefix_size;
	size_t max_order_raw_size;
	size_t max_order_war_size;
	size_t max_order_waw_size;
	uint64_t mem_tag_format;
	size_t tx_ctx_cnt;
	size_t rx_ctx_cnt;
	size_t auth_key_size;
	uint8_t *auth_key;
};

struct kvf_fi_domain_attr {
	struct kvf_fid_domain *domain;
	char *name;
	int threading;        /* enum fi_threading */
	int control_progress; /* enum fi_progress */
	int data_progress;    /* enum fi_progress */
	int resource_mgmt;    /* enum fi_resource_mgmt */
	int av_type;          /* enum fi_av_type */
	int mr_mode;
	size_t mr_key_size;
	size_t cq_data_size;
	size_t cq_cnt;
	size_t ep_cnt;
	size_t tx_ctx_cnt;
	size_t rx_ctx_cnt;
	size_t max_ep_tx_ctx;
	size_t max_ep_rx_ctx;
	size_t max_ep_stx_ctx;
	size_t max_ep_srx_ctx;
	size_t cntr_cnt;
	size_t mr_iov_limit;
	uint64_t caps;
	uint64_t mode;
	uint8_t *auth_key;
	size_t auth_key_size;
	size_t max_err_data;
	size_t mr_cnt;
	uint32_t tclass;
};

struct kvf_fi_fabric_attr {
	struct kvf_fid_fabric *fabric;
	char *name;
	char *prov_name;
	uint32_t prov_version;
	uint32_t api_version;
};

struct kvf_fi_info {
	struct kvf_fi_info *next;
	uint64_t caps;
	uint64_t mode;
	uint32_t addr_format;
	size_t src_addrlen;
	size_t dest_addrlen;
	void *src_addr;
	void *dest_addr;
	struct kvf_fid *handle;
	struct kvf_fi_tx_attr *tx_attr;
	struct kvf_fi_rx_attr *rx_attr;
	struct kvf_fi_ep_attr *ep_attr;
	struct kvf_fi_domain_attr *domain_attr;
	struct kvf_fi_fabric_attr *fabric_attr;
	void *nic; /* struct fid_nic *: never read */
};

struct kvf_fi_ops {
	size_t size;
	int (*close)(struct kvf_fid *fid);
	int (*bind)(struct kvf_fid *fid, struct kvf_fid *bfid, uint64_t flags);
	int (*control)(struct kvf_fid *fid, int command, void *arg);
	void *ops_open;
	void *tostr;
	void *ops_set;
};

struct kvf_fid {
	size_t fclass;
	void *context;
	struct kvf_fi_ops *ops;
};

struct kvf_fi_ops_fabric {
	size_t size;
	int (*domain)(struct kvf_fid_fabric *fabric, struct kvf_fi_info *info, struct kvf_fid_domain **dom, void *context);
	void *passive_ep;
	void *eq_open;
	void *wait_open;
	void *trywait;
	void *domain2;
};

struct kvf_fid_fabric {
	struct kvf_fid fid;
	struct kvf_fi_ops_fabric *ops;
	uint32_t api_version;
};

struct kvf_fi_av_attr {
	int type; /* enum fi_av_type */
	int rx_ctx_bits;
	size_t count;
	size_t ep_per_node;
	const char *name;
	void *map_addr;
	uint64_t flags;
};

struct kvf_fi_cq_attr {
	size_t size;
	uint64_t flags;
	int format;   /* enum fi_cq_format */
	int wait_obj; /* enum fi_wait_obj */
	int signaling_vector;
	int wait_cond; /* enum fi_cq_wait_cond */
	void *wait_set;
};

struct kvf_fi_mr_attr {
	const struct iovec *mr_iov;
	size_t iov_count;
	uint64_t access;
	uint64_t offset;
	uint64_t requested_key;
	void *context;
	size_t auth_key_size;
	uint8_t *auth_key;
	int iface; /* enum fi_hmem_iface */
	union {
		uint64_t reserved;
		int cuda;
	} device;
};

struct kvf_fi_ops_domain {
	size_t size;
	int (*av_open)(struct kvf_fid_domain *domain, struct kvf_fi_av_attr *attr, struct kvf_fid_av **av, void *context);
	int (*cq_open)(struct kvf_fid_domain *domain, struct kvf_fi_cq_attr *attr, struct kvf_fid_cq **cq, void *context);
	int (*endpoint)(struct kvf_fid_domain *domain, struct kvf_fi_info *info, struct kvf_fid_ep **ep, void *context);
	void *scalable_ep;
	void *cntr_open;
	void *poll_open;
	void *stx_ctx;
	void *srx_ctx;
	void *query_atomic;
	void *query_collective;
	void *endpoint2;
};

struct kvf_fi_ops_mr {
	size_t size;
	int (*reg)(struct kvf_fid *fid, const void *buf, size_t len, uint64_t access, uint64_t offset,
		uint64_t requested_key, uint64_t flags, struct kvf_fid_mr **mr, void *context);
	void *regv;
	int (*regattr)(struct kvf_fid *fid, const struct kvf_fi_mr_attr *attr, uint64_t flags, struct kvf_fid_mr **mr);
};

struct kvf_fid_domain {
	struct kvf_fid fid;
	struct kvf_fi_ops_domain *ops;
	struct kvf_fi_ops_mr *mr;
};

struct kvf_fid_mr {
	struct kvf_fid fid;
	void *mem_desc;
	uint64_t key;
};

struct kvf_fi_ops_av {
	size_t size;
	int (*insert)(struct kvf_fid_av *av, const void *addr, size_t count, kvf_fi_addr_t *fi_addr, uint64_t flags,
		void *context);
	void *insertsvc;
	void *insertsym;
	int (*remove)(struct kvf_fid_av *av, kvf_fi_addr_t *fi_addr, size_t count, uint64_t flags);
	void *lookup;
	void *straddr;
	void *av_set;
};

struct kvf_fid_av {
	struct kvf_fid fid;
	struct kvf_fi_ops_av *ops;
};

struct kvf_fi_cq_entry {
	void *op_context;
};

struct kvf_fi_cq_err_entry {
	void *op_context;
	uint64_t flags;
	size_t len;
	void *buf;
	uint64_t data;
	uint64_t tag;
	size_t olen;
	int err;
	int prov_errno;
	void *err_data;
	size_t err_data_size;
};

struct kvf_fi_ops_cq {
	size_t size;
	ssize_t (*read)(struct kvf_fid_cq *cq, void *buf, size_t count);
	void *readfrom;
	ssize_t (*readerr)(struct kvf_fid_cq *cq, struct kvf_fi_cq_err_entry *buf, uint64_t flags);
	ssize_t (*sread)(struct kvf_fid_cq *cq, void *buf, size_t count, const void *cond, int timeout);
	void *sreadfrom;
	int (*signal)(struct kvf_fid_cq *cq);
	const char *(*strerror)(struct kvf_fid_cq *cq, int prov_errno, const void *err_data, char *buf, size_t len);
};

struct kvf_fid_cq {
	struct kvf_fid fid;
	struct kvf_fi_ops_cq *ops;
};

struct kvf_fi_ops_cm {
	size_t size;
	void *setname;
	int (*getname)(struct kvf_fid *fid, void *addr, size_t *addrlen);
	void *getpeer;
	void *connect;
	void *listen;
	void *accept;
	void *reject;
	void *shutdown;
	void *join;
};

struct kvf_fi_rma_iov {
	uint64_t addr;
	size_t len;
	uint64_t key;
};

struct kvf_fi_msg_rma {
	const struct iovec *msg_iov;
	void **desc;
	size_t iov_count;
	kvf_fi_addr_t addr;
	const struct kvf_fi_rma_iov *rma_iov;
	size_t rma_iov_count;
	void *context;
	uint64_t data;
};

struct kvf_fi_ops_rma {
	size_t size;
	ssize_t (*read)(struct kvf_fid_ep *ep, void *buf, size_t len, void *desc, kvf_fi_addr_t src_addr, uint64_t addr,
		uint64_t key, void *context);
	void *readv;
	ssize_t (*readmsg)(struct kvf_fid_ep *ep, const struct kvf_fi_msg_rma *msg, uint64_t flags);
	void *write;
	void *writev;
	void *writemsg;
	void *inject;
	void *writedata;
	void *injectdata;
};

struct kvf_fid_ep {
	struct kvf_fid fid;
	void *ops; /* struct fi_ops_ep *: never called */
	struct kvf_fi_ops_cm *cm;
	void *msg;
	struct kvf_fi_ops_rma *rma;
	void *tagged;
	void *atomic;
	void *collective;
};

#endif
