/*
 * kvf_verbs.h: kvfabric's own declarations of the parts of rdma-core's
 * <infiniband/verbs.h> that package rdma uses. The binding loads libibverbs
 * with dlopen at run time, so it cannot include the real header (which is in
 * libibverbs-dev, absent on most machines that run the agent). Every size,
 * field offset and constant here is checked against the real header by
 * abi_test.go; names are verbs.h's with a kvf_ prefix so that both can be
 * read side by side.
 *
 * Only what is used is declared. Structures the binding only ever holds
 * pointers to (ibv_comp_channel, ibv_srq, ibv_ah, ibv_mw) stay incomplete.
 */
#ifndef KVF_VERBS_H
#define KVF_VERBS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct kvf_ibv_context;
struct kvf_ibv_cq;
struct kvf_ibv_qp;
struct kvf_ibv_pd;

union kvf_ibv_gid {
	uint8_t raw[16];
	struct {
		uint64_t subnet_prefix; /* big endian */
		uint64_t interface_id;  /* big endian */
	} global;
};

enum {
	KVF_IBV_GID_TYPE_IB = 0,
	KVF_IBV_GID_TYPE_ROCE_V1 = 1,
	KVF_IBV_GID_TYPE_ROCE_V2 = 2,
};

struct kvf_ibv_gid_entry {
	union kvf_ibv_gid gid;
	uint32_t gid_index;
	uint32_t port_num;
	uint32_t gid_type;
	uint32_t ndev_ifindex;
};

struct kvf_ibv_device {
	void *_ops[2];
	int node_type;
	int transport_type;
	char name[64];
	char dev_name[64];
	char dev_path[256];
	char ibdev_path[256];
};

struct kvf_ibv_device_attr {
	char fw_ver[64];
	uint64_t node_guid;
	uint64_t sys_image_guid;
	uint64_t max_mr_size;
	uint64_t page_size_cap;
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	uint32_t hw_ver;
	int max_qp;
	int max_qp_wr;
	unsigned int device_cap_flags;
	int max_sge;
	int max_sge_rd;
	int max_cq;
	int max_cqe;
	int max_mr;
	int max_pd;
	int max_qp_rd_atom;
	int max_ee_rd_atom;
	int max_res_rd_atom;
	int max_qp_init_rd_atom;
	int max_ee_init_rd_atom;
	int atomic_cap;
	int max_ee;
	int max_rdd;
	int max_mw;
	int max_raw_ipv6_qp;
	int max_raw_ethy_qp;
	int max_mcast_grp;
	int max_mcast_qp_attach;
	int max_total_mcast_qp_attach;
	int max_ah;
	int max_fmr;
	int max_map_per_fmr;
	int max_srq;
	int max_srq_wr;
	int max_srq_sge;
	uint16_t max_pkeys;
	uint8_t local_ca_ack_delay;
	uint8_t phys_port_cnt;
};

enum {
	KVF_IBV_MTU_256 = 1,
	KVF_IBV_MTU_512 = 2,
	KVF_IBV_MTU_1024 = 3,
	KVF_IBV_MTU_2048 = 4,
	KVF_IBV_MTU_4096 = 5,
};

enum {
	KVF_IBV_PORT_NOP = 0,
	KVF_IBV_PORT_DOWN = 1,
	KVF_IBV_PORT_INIT = 2,
	KVF_IBV_PORT_ARMED = 3,
	KVF_IBV_PORT_ACTIVE = 4,
	KVF_IBV_PORT_ACTIVE_DEFER = 5,
};

enum {
	KVF_IBV_LINK_LAYER_UNSPECIFIED = 0,
	KVF_IBV_LINK_LAYER_INFINIBAND = 1,
	KVF_IBV_LINK_LAYER_ETHERNET = 2,
};

struct kvf_ibv_port_attr {
	int state;
	int max_mtu;
	int active_mtu;
	int gid_tbl_len;
	uint32_t port_cap_flags;
	uint32_t max_msg_sz;
	uint32_t bad_pkey_cntr;
	uint32_t qkey_viol_cntr;
	uint16_t pkey_tbl_len;
	uint16_t lid;
	uint16_t sm_lid;
	uint8_t lmc;
	uint8_t max_vl_num;
	uint8_t sm_sl;
	uint8_t subnet_timeout;
	uint8_t init_type_reply;
	uint8_t active_width;
	uint8_t active_speed;
	uint8_t phys_state;
	uint8_t link_layer;
	uint8_t flags;
	uint16_t port_cap_flags2;
};

enum {
	KVF_IBV_WC_SUCCESS = 0,
	KVF_IBV_WC_LOC_LEN_ERR = 1,
	KVF_IBV_WC_LOC_QP_OP_ERR = 2,
	KVF_IBV_WC_LOC_PROT_ERR = 4,
	KVF_IBV_WC_WR_FLUSH_ERR = 5,
	KVF_IBV_WC_REM_ACCESS_ERR = 10,
	KVF_IBV_WC_REM_OP_ERR = 11,
	KVF_IBV_WC_RETRY_EXC_ERR = 12,
	KVF_IBV_WC_RNR_RETRY_EXC_ERR = 13,
	KVF_IBV_WC_GENERAL_ERR = 21,
};

enum {
	KVF_IBV_WC_RDMA_READ = 2,
};

struct kvf_ibv_wc {
	uint64_t wr_id;
	int status;
	int opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data;
	uint32_t qp_num;
	uint32_t src_qp;
	unsigned int wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
};

enum {
	KVF_IBV_ACCESS_LOCAL_WRITE = 1,
	KVF_IBV_ACCESS_REMOTE_WRITE = 1 << 1,
	KVF_IBV_ACCESS_REMOTE_READ = 1 << 2,
};

struct kvf_ibv_pd {
	struct kvf_ibv_context *context;
	uint32_t handle;
};

struct kvf_ibv_mr {
	struct kvf_ibv_context *context;
	struct kvf_ibv_pd *pd;
	void *addr;
	size_t length;
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;
};

struct kvf_ibv_global_route {
	union kvf_ibv_gid dgid;
	uint32_t flow_label;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
};

struct kvf_ibv_ah_attr {
	struct kvf_ibv_global_route grh;
	uint16_t dlid;
	uint8_t sl;
	uint8_t src_path_bits;
	uint8_t static_rate;
	uint8_t is_global;
	uint8_t port_num;
};

enum {
	KVF_IBV_QPT_RC = 2,
};

struct kvf_ibv_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
};

struct kvf_ibv_qp_init_attr {
	void *qp_context;
	struct kvf_ibv_cq *send_cq;
	struct kvf_ibv_cq *recv_cq;
	void *srq;
	struct kvf_ibv_qp_cap cap;
	int qp_type;
	int sq_sig_all;
};

enum {
	KVF_IBV_QP_STATE = 1 << 0,
	KVF_IBV_QP_ACCESS_FLAGS = 1 << 3,
	KVF_IBV_QP_PKEY_INDEX = 1 << 4,
	KVF_IBV_QP_PORT = 1 << 5,
	KVF_IBV_QP_AV = 1 << 7,
	KVF_IBV_QP_PATH_MTU = 1 << 8,
	KVF_IBV_QP_TIMEOUT = 1 << 9,
	KVF_IBV_QP_RETRY_CNT = 1 << 10,
	KVF_IBV_QP_RNR_RETRY = 1 << 11,
	KVF_IBV_QP_RQ_PSN = 1 << 12,
	KVF_IBV_QP_MAX_QP_RD_ATOMIC = 1 << 13,
	KVF_IBV_QP_MIN_RNR_TIMER = 1 << 15,
	KVF_IBV_QP_SQ_PSN = 1 << 16,
	KVF_IBV_QP_MAX_DEST_RD_ATOMIC = 1 << 17,
	KVF_IBV_QP_CAP = 1 << 19,
	KVF_IBV_QP_DEST_QPN = 1 << 20,
};

enum {
	KVF_IBV_QPS_RESET = 0,
	KVF_IBV_QPS_INIT = 1,
	KVF_IBV_QPS_RTR = 2,
	KVF_IBV_QPS_RTS = 3,
	KVF_IBV_QPS_SQD = 4,
	KVF_IBV_QPS_SQE = 5,
	KVF_IBV_QPS_ERR = 6,
};

struct kvf_ibv_qp_attr {
	int qp_state;
	int cur_qp_state;
	int path_mtu;
	int path_mig_state;
	uint32_t qkey;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint32_t dest_qp_num;
	unsigned int qp_access_flags;
	struct kvf_ibv_qp_cap cap;
	struct kvf_ibv_ah_attr ah_attr;
	struct kvf_ibv_ah_attr alt_ah_attr;
	uint16_t pkey_index;
	uint16_t alt_pkey_index;
	uint8_t en_sqd_async_notify;
	uint8_t sq_draining;
	uint8_t max_rd_atomic;
	uint8_t max_dest_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t port_num;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t alt_port_num;
	uint8_t alt_timeout;
	uint32_t rate_limit;
};

enum {
	KVF_IBV_WR_RDMA_WRITE = 0,
	KVF_IBV_WR_SEND = 2,
	KVF_IBV_WR_RDMA_READ = 4,
};

enum {
	KVF_IBV_SEND_FENCE = 1 << 0,
	KVF_IBV_SEND_SIGNALED = 1 << 1,
};

struct kvf_ibv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

/*
 * The unions after wr are declared by their largest members only (atomic,
 * bind_mw), which fixes the structure's size and alignment; rdma is the only
 * member read or written.
 */
struct kvf_ibv_send_wr {
	uint64_t wr_id;
	struct kvf_ibv_send_wr *next;
	struct kvf_ibv_sge *sg_list;
	int num_sge;
	int opcode;
	unsigned int send_flags;
	uint32_t imm_data;
	union {
		struct {
			uint64_t remote_addr;
			uint32_t rkey;
		} rdma;
		struct {
			uint64_t remote_addr;
			uint64_t compare_add;
			uint64_t swap;
			uint32_t rkey;
		} atomic;
	} wr;
	union {
		struct {
			uint32_t remote_srqn;
		} xrc;
	} qp_type;
	struct {
		void *mw;
		uint32_t rkey;
		struct {
			void *mr;
			uint64_t addr;
			uint64_t length;
			unsigned int mw_access_flags;
		} bind_info;
	} bind_mw;
};

struct kvf_ibv_context_ops {
	void *_compat_query_device;
	void *_compat_query_port;
	void *_compat_alloc_pd;
	void *_compat_dealloc_pd;
	void *_compat_reg_mr;
	void *_compat_rereg_mr;
	void *_compat_dereg_mr;
	void *alloc_mw;
	void *bind_mw;
	void *dealloc_mw;
	void *_compat_create_cq;
	int (*poll_cq)(struct kvf_ibv_cq *cq, int num_entries, struct kvf_ibv_wc *wc);
	void *req_notify_cq;
	void *_compat_cq_event;
	void *_compat_resize_cq;
	void *_compat_destroy_cq;
	void *_compat_create_srq;
	void *_compat_modify_srq;
	void *_compat_query_srq;
	void *_compat_destroy_srq;
	void *post_srq_recv;
	void *_compat_create_qp;
	void *_compat_query_qp;
	void *_compat_modify_qp;
	void *_compat_destroy_qp;
	int (*post_send)(struct kvf_ibv_qp *qp, struct kvf_ibv_send_wr *wr,
			 struct kvf_ibv_send_wr **bad_wr);
	void *post_recv;
	void *_compat_create_ah;
	void *_compat_destroy_ah;
	void *_compat_attach_mcast;
	void *_compat_detach_mcast;
	void *_compat_async_event;
};

struct kvf_ibv_context {
	struct kvf_ibv_device *device;
	struct kvf_ibv_context_ops ops;
	int cmd_fd;
	int async_fd;
	int num_comp_vectors;
	pthread_mutex_t mutex;
	void *abi_compat;
};

struct kvf_ibv_cq {
	struct kvf_ibv_context *context;
	void *channel;
	void *cq_context;
	uint32_t handle;
	int cqe;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t comp_events_completed;
	uint32_t async_events_completed;
};

struct kvf_ibv_qp {
	struct kvf_ibv_context *context;
	void *qp_context;
	struct kvf_ibv_pd *pd;
	struct kvf_ibv_cq *send_cq;
	struct kvf_ibv_cq *recv_cq;
	void *srq;
	uint32_t handle;
	uint32_t qp_num;
	int state;
	int qp_type;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t events_completed;
};

#endif /* KVF_VERBS_H */
