//go:build cgo && linux

package ofi

import (
	"testing"

	"github.com/kvfabric/kvfabric/internal/abitest"
)

// abiTypes lists, per libfabric structure, every field whose size and
// offset the binding relies on (kvf_fabric.h declares each as kvf_<struct>).
var abiTypes = [][]string{
	{"struct fi_tx_attr", "caps", "mode", "op_flags", "msg_order", "comp_order", "inject_size", "size",
		"iov_limit", "rma_iov_limit", "tclass"},
	{"struct fi_rx_attr", "caps", "mode", "op_flags", "msg_order", "comp_order", "total_buffered_recv",
		"size", "iov_limit"},
	{"struct fi_ep_attr", "type", "protocol", "protocol_version", "max_msg_size", "msg_prefix_size",
		"max_order_raw_size", "max_order_war_size", "max_order_waw_size", "mem_tag_format", "tx_ctx_cnt",
		"rx_ctx_cnt", "auth_key_size", "auth_key"},
	{"struct fi_domain_attr", "domain", "name", "threading", "control_progress", "data_progress",
		"resource_mgmt", "av_type", "mr_mode", "mr_key_size", "cq_data_size", "cq_cnt", "ep_cnt", "tx_ctx_cnt",
		"rx_ctx_cnt", "max_ep_tx_ctx", "max_ep_rx_ctx", "max_ep_stx_ctx", "max_ep_srx_ctx", "cntr_cnt",
		"mr_iov_limit", "caps", "mode", "auth_key", "auth_key_size", "max_err_data", "mr_cnt", "tclass"},
	{"struct fi_fabric_attr", "fabric", "name", "prov_name", "prov_version", "api_version"},
	{"struct fi_info", "next", "caps", "mode", "addr_format", "src_addrlen", "dest_addrlen", "src_addr",
		"dest_addr", "handle", "tx_attr", "rx_attr", "ep_attr", "domain_attr", "fabric_attr", "nic"},
	{"struct fi_ops", "size", "close", "bind", "control", "ops_open", "tostr", "ops_set"},
	{"struct fid", "fclass", "context", "ops"},
	{"struct fi_ops_fabric", "size", "domain", "domain2"},
	{"struct fid_fabric", "fid", "ops", "api_version"},
	{"struct fi_av_attr", "type", "rx_ctx_bits", "count", "ep_per_node", "name", "map_addr", "flags"},
	{"struct fi_cq_attr", "size", "flags", "format", "wait_obj", "signaling_vector", "wait_cond", "wait_set"},
	{"struct fi_mr_attr", "mr_iov", "iov_count", "access", "offset", "requested_key", "context",
		"auth_key_size", "auth_key", "iface", "device", "device.cuda"},
	{"struct fi_ops_domain", "size", "av_open", "cq_open", "endpoint", "endpoint2"},
	{"struct fi_ops_mr", "size", "reg", "regattr"},
	{"struct fid_domain", "fid", "ops", "mr"},
	{"struct fid_mr", "fid", "mem_desc", "key"},
	{"struct fi_ops_av", "size", "insert", "remove", "av_set"},
	{"struct fid_av", "fid", "ops"},
	{"struct fi_cq_entry", "op_context"},
	{"struct fi_cq_err_entry", "op_context", "flags", "len", "buf", "data", "tag", "olen", "err",
		"prov_errno", "err_data", "err_data_size"},
	{"struct fi_ops_cq", "size", "read", "readerr", "strerror"},
	{"struct fid_cq", "fid", "ops"},
	{"struct fi_ops_cm", "size", "getname", "join"},
	{"struct fi_rma_iov", "addr", "len", "key"},
	{"struct fi_msg_rma", "msg_iov", "desc", "iov_count", "addr", "rma_iov", "rma_iov_count", "context", "data"},
	{"struct fi_ops_rma", "size", "read", "readmsg", "injectdata"},
	{"struct fid_ep", "fid", "ops", "cm", "msg", "rma", "tagged", "atomic", "collective"},
}

// abiConstants are the values the binding uses; ours are KVF_<name>.
var abiConstants = []string{
	"FI_MSG", "FI_RMA", "FI_READ", "FI_RECV", "FI_SEND", "FI_WRITE", "FI_REMOTE_READ", "FI_REMOTE_WRITE",
	"FI_COMPLETION", "FI_HMEM", "FI_LOCAL_COMM", "FI_REMOTE_COMM", "FI_SOURCE",
	"FI_CONTEXT", "FI_CONTEXT2", "FI_LOCAL_MR",
	"FI_MR_UNSPEC", "FI_MR_BASIC", "FI_MR_SCALABLE", "FI_MR_LOCAL", "FI_MR_RAW", "FI_MR_VIRT_ADDR",
	"FI_MR_ALLOCATED", "FI_MR_PROV_KEY", "FI_MR_MMU_NOTIFY", "FI_MR_RMA_EVENT", "FI_MR_ENDPOINT", "FI_MR_HMEM",
	"FI_EP_RDM", "FI_THREAD_SAFE", "FI_THREAD_DOMAIN", "FI_PROGRESS_AUTO", "FI_PROGRESS_MANUAL",
	"FI_AV_MAP", "FI_AV_TABLE", "FI_CQ_FORMAT_CONTEXT", "FI_WAIT_NONE", "FI_WAIT_UNSPEC",
	"FI_HMEM_SYSTEM", "FI_HMEM_CUDA", "FI_ENABLE", "FI_EAGAIN", "FI_EAVAIL", "FI_ADDR_UNSPEC",
}

// TestABIAgainstLibfabricHeaders compares every size, alignment, field
// offset and constant in kvf_fabric.h with libfabric's own headers.
func TestABIAgainstLibfabricHeaders(t *testing.T) {
	abitest.Compare(t, abitest.Spec{
		Includes: []string{"<rdma/fabric.h>", "<rdma/fi_domain.h>", "<rdma/fi_endpoint.h>", "<rdma/fi_cm.h>",
			"<rdma/fi_eq.h>", "<rdma/fi_rma.h>", "<rdma/fi_errno.h>"},
		Ours: "kvf_fabric.h", Package: "libfabric-dev",
		Types: abiTypes, Constants: abiConstants,
	})
}
