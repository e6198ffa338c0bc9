//go:build cgo && linux

package rdma

import (
	"testing"

	"github.com/kvfabric/kvfabric/internal/abitest"
)

// abiTypes lists, per verbs structure, every field whose size and offset
// the binding relies on (kvf_verbs.h declares each as kvf_<struct>).
var abiTypes = [][]string{
	{"union ibv_gid", "raw", "global.subnet_prefix", "global.interface_id"},
	{"struct ibv_gid_entry", "gid", "gid_index", "port_num", "gid_type", "ndev_ifindex"},
	{"struct ibv_device", "node_type", "transport_type", "name", "dev_name", "dev_path", "ibdev_path"},
	{"struct ibv_device_attr", "fw_ver", "node_guid", "sys_image_guid", "max_mr_size", "page_size_cap",
		"vendor_id", "vendor_part_id", "hw_ver", "max_qp", "max_qp_wr", "device_cap_flags", "max_sge", "max_sge_rd",
		"max_cq", "max_cqe", "max_mr", "max_pd", "max_qp_rd_atom", "max_ee_rd_atom", "max_res_rd_atom",
		"max_qp_init_rd_atom", "max_ee_init_rd_atom", "atomic_cap", "max_ee", "max_rdd", "max_mw", "max_raw_ipv6_qp",
		"max_raw_ethy_qp", "max_mcast_grp", "max_mcast_qp_attach", "max_total_mcast_qp_attach", "max_ah", "max_fmr",
		"max_map_per_fmr", "max_srq", "max_srq_wr", "max_srq_sge", "max_pkeys", "local_ca_ack_delay", "phys_port_cnt"},
	{"struct ibv_port_attr", "state", "max_mtu", "active_mtu", "gid_tbl_len", "port_cap_flags", "max_msg_sz",
		"bad_pkey_cntr", "qkey_viol_cntr", "pkey_tbl_len", "lid", "sm_lid", "lmc", "max_vl_num", "sm_sl",
		"subnet_timeout", "init_type_reply", "active_width", "active_speed", "phys_state", "link_layer", "flags",
		"port_cap_flags2"},
	{"struct ibv_wc", "wr_id", "status", "opcode", "vendor_err", "byte_len", "imm_data", "qp_num", "src_qp",
		"wc_flags", "pkey_index", "slid", "sl", "dlid_path_bits"},
	{"struct ibv_pd", "context", "handle"},
	{"struct ibv_mr", "context", "pd", "addr", "length", "handle", "lkey", "rkey"},
	{"struct ibv_global_route", "dgid", "flow_label", "sgid_index", "hop_limit", "traffic_class"},
	{"struct ibv_ah_attr", "grh", "grh.dgid", "grh.sgid_index", "grh.hop_limit", "dlid", "sl", "src_path_bits",
		"static_rate", "is_global", "port_num"},
	{"struct ibv_qp_cap", "max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data"},
	{"struct ibv_qp_init_attr", "qp_context", "send_cq", "recv_cq", "srq", "cap", "cap.max_send_wr",
		"cap.max_send_sge", "qp_type", "sq_sig_all"},
	{"struct ibv_qp_attr", "qp_state", "cur_qp_state", "path_mtu", "path_mig_state", "qkey", "rq_psn", "sq_psn",
		"dest_qp_num", "qp_access_flags", "cap", "ah_attr", "ah_attr.grh.dgid", "ah_attr.grh.sgid_index",
		"ah_attr.grh.hop_limit", "ah_attr.dlid", "ah_attr.is_global", "ah_attr.port_num", "alt_ah_attr", "pkey_index",
		"alt_pkey_index", "en_sqd_async_notify", "sq_draining", "max_rd_atomic", "max_dest_rd_atomic", "min_rnr_timer",
		"port_num", "timeout", "retry_cnt", "rnr_retry", "alt_port_num", "alt_timeout", "rate_limit"},
	{"struct ibv_sge", "addr", "length", "lkey"},
	{"struct ibv_send_wr", "wr_id", "next", "sg_list", "num_sge", "opcode", "send_flags", "imm_data",
		"wr", "wr.rdma.remote_addr", "wr.rdma.rkey", "wr.atomic.rkey", "qp_type", "qp_type.xrc.remote_srqn",
		"bind_mw.mw", "bind_mw.rkey", "bind_mw.bind_info.mw_access_flags"},
	{"struct ibv_context_ops", "_compat_query_device", "poll_cq", "req_notify_cq", "post_send", "post_recv",
		"_compat_async_event"},
	{"struct ibv_context", "device", "ops", "ops.poll_cq", "ops.post_send", "cmd_fd", "async_fd",
		"num_comp_vectors", "mutex", "abi_compat"},
	{"struct ibv_cq", "context", "channel", "cq_context", "handle", "cqe", "mutex", "cond",
		"comp_events_completed", "async_events_completed"},
	{"struct ibv_qp", "context", "qp_context", "pd", "send_cq", "recv_cq", "srq", "handle", "qp_num", "state",
		"qp_type", "mutex", "cond", "events_completed"},
}

// abiConstants are the enum values the binding uses; ours are KVF_<name>.
var abiConstants = []string{
	"IBV_GID_TYPE_IB", "IBV_GID_TYPE_ROCE_V1", "IBV_GID_TYPE_ROCE_V2",
	"IBV_MTU_256", "IBV_MTU_512", "IBV_MTU_1024", "IBV_MTU_2048", "IBV_MTU_4096",
	"IBV_PORT_NOP", "IBV_PORT_DOWN", "IBV_PORT_INIT", "IBV_PORT_ARMED", "IBV_PORT_ACTIVE", "IBV_PORT_ACTIVE_DEFER",
	"IBV_LINK_LAYER_UNSPECIFIED", "IBV_LINK_LAYER_INFINIBAND", "IBV_LINK_LAYER_ETHERNET",
	"IBV_WC_SUCCESS", "IBV_WC_LOC_LEN_ERR", "IBV_WC_LOC_QP_OP_ERR", "IBV_WC_LOC_PROT_ERR", "IBV_WC_WR_FLUSH_ERR",
	"IBV_WC_REM_ACCESS_ERR", "IBV_WC_REM_OP_ERR", "IBV_WC_RETRY_EXC_ERR", "IBV_WC_RNR_RETRY_EXC_ERR", "IBV_WC_GENERAL_ERR",
	"IBV_WC_RDMA_READ",
	"IBV_ACCESS_LOCAL_WRITE", "IBV_ACCESS_REMOTE_WRITE", "IBV_ACCESS_REMOTE_READ",
	"IBV_QPT_RC",
	"IBV_QP_STATE", "IBV_QP_ACCESS_FLAGS", "IBV_QP_PKEY_INDEX", "IBV_QP_PORT", "IBV_QP_AV", "IBV_QP_PATH_MTU",
	"IBV_QP_TIMEOUT", "IBV_QP_RETRY_CNT", "IBV_QP_RNR_RETRY", "IBV_QP_RQ_PSN", "IBV_QP_MAX_QP_RD_ATOMIC",
	"IBV_QP_MIN_RNR_TIMER", "IBV_QP_SQ_PSN", "IBV_QP_MAX_DEST_RD_ATOMIC", "IBV_QP_CAP", "IBV_QP_DEST_QPN",
	"IBV_QPS_RESET", "IBV_QPS_INIT", "IBV_QPS_RTR", "IBV_QPS_RTS", "IBV_QPS_SQD", "IBV_QPS_SQE", "IBV_QPS_ERR",
	"IBV_WR_RDMA_WRITE", "IBV_WR_SEND", "IBV_WR_RDMA_READ",
	"IBV_SEND_FENCE", "IBV_SEND_SIGNALED",
}

// TestABIAgainstVerbsHeader compares every size, alignment, field offset and
// constant in kvf_verbs.h with rdma-core's <infiniband/verbs.h>.
func TestABIAgainstVerbsHeader(t *testing.T) {
	abitest.Compare(t, abitest.Spec{
		Includes: []string{"<infiniband/verbs.h>"}, Ours: "kvf_verbs.h", Package: "libibverbs-dev",
		Types: abiTypes, Constants: abiConstants,
	})
}
