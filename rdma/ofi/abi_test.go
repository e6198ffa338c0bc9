//go:build cgo && linux

package ofi

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// abiFields lists, per libfabric structure, every field whose size and
// offset the binding relies on (kvf_fabric.h declares each as kvf_<struct>).
var abiFields = []struct {
	typ    string
	fields []string
}{
	{"struct fi_tx_attr", []string{"caps", "mode", "op_flags", "msg_order", "comp_order", "inject_size", "size",
		"iov_limit", "rma_iov_limit", "tclass"}},
	{"struct fi_rx_attr", []string{"caps", "mode", "op_flags", "msg_order", "comp_order", "total_buffered_recv",
		"size", "iov_limit"}},
	{"struct fi_ep_attr", []string{"type", "protocol", "protocol_version", "max_msg_size", "msg_prefix_size",
		"max_order_raw_size", "max_order_war_size", "max_order_waw_size", "mem_tag_format", "tx_ctx_cnt",
		"rx_ctx_cnt", "auth_key_size", "auth_key"}},
	{"struct fi_domain_attr", []string{"domain", "name", "threading", "control_progress", "data_progress",
		"resource_mgmt", "av_type", "mr_mode", "mr_key_size", "cq_data_size", "cq_cnt", "ep_cnt", "tx_ctx_cnt",
		"rx_ctx_cnt", "max_ep_tx_ctx", "max_ep_rx_ctx", "max_ep_stx_ctx", "max_ep_srx_ctx", "cntr_cnt",
		"mr_iov_limit", "caps", "mode", "auth_key", "auth_key_size", "max_err_data", "mr_cnt", "tclass"}},
	{"struct fi_fabric_attr", []string{"fabric", "name", "prov_name", "prov_version", "api_version"}},
	{"struct fi_info", []string{"next", "caps", "mode", "addr_format", "src_addrlen", "dest_addrlen", "src_addr",
		"dest_addr", "handle", "tx_attr", "rx_attr", "ep_attr", "domain_attr", "fabric_attr", "nic"}},
	{"struct fi_ops", []string{"size", "close", "bind", "control", "ops_open", "tostr", "ops_set"}},
	{"struct fid", []string{"fclass", "context", "ops"}},
	{"struct fi_ops_fabric", []string{"size", "domain", "domain2"}},
	{"struct fid_fabric", []string{"fid", "ops", "api_version"}},
	{"struct fi_av_attr", []string{"type", "rx_ctx_bits", "count", "ep_per_node", "name", "map_addr", "flags"}},
	{"struct fi_cq_attr", []string{"size", "flags", "format", "wait_obj", "signaling_vector", "wait_cond", "wait_set"}},
	{"struct fi_mr_attr", []string{"mr_iov", "iov_count", "access", "offset", "requested_key", "context",
		"auth_key_size", "auth_key", "iface", "device", "device.cuda"}},
	{"struct fi_ops_domain", []string{"size", "av_open", "cq_open", "endpoint", "endpoint2"}},
	{"struct fi_ops_mr", []string{"size", "reg", "regattr"}},
	{"struct fid_domain", []string{"fid", "ops", "mr"}},
	{"struct fid_mr", []string{"fid", "mem_desc", "key"}},
	{"struct fi_ops_av", []string{"size", "insert", "remove", "av_set"}},
	{"struct fid_av", []string{"fid", "ops"}},
	{"struct fi_cq_entry", []string{"op_context"}},
	{"struct fi_cq_err_entry", []string{"op_context", "flags", "len", "buf", "data", "tag", "olen", "err",
		"prov_errno", "err_data", "err_data_size"}},
	{"struct fi_ops_cq", []string{"size", "read", "readerr", "strerror"}},
	{"struct fid_cq", []string{"fid", "ops"}},
	{"struct fi_ops_cm", []string{"size", "getname", "join"}},
	{"struct fi_rma_iov", []string{"addr", "len", "key"}},
	{"struct fi_msg_rma", []string{"msg_iov", "desc", "iov_count", "addr", "rma_iov", "rma_iov_count", "context", "data"}},
	{"struct fi_ops_rma", []string{"size", "read", "readmsg", "injectdata"}},
	{"struct fid_ep", []string{"fid", "ops", "cm", "msg", "rma", "tagged", "atomic", "collective"}},
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

// The headers the real program includes.
const fabricHeaders = "#include <rdma/fabric.h>\n#include <rdma/fi_domain.h>\n#include <rdma/fi_endpoint.h>\n" +
	"#include <rdma/fi_cm.h>\n#include <rdma/fi_eq.h>\n#include <rdma/fi_rma.h>\n#include <rdma/fi_errno.h>\n"

// abiProgram writes a C program printing "name=size S offset O" per field,
// "name=size S align A" per type and "name=value" per constant; prefix is ""
// for libfabric's headers, "kvf_" for ours.
func abiProgram(includes, prefix string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#include <stdio.h>\n#include <stddef.h>\n%s\nint main(void) {\n", includes)
	for _, s := range abiFields {
		kind, name, _ := strings.Cut(s.typ, " ")
		typ := kind + " " + prefix + name
		fmt.Fprintf(&b, "\tprintf(\"%s=size %%zu align %%zu\\n\", sizeof(%s), _Alignof(%s));\n", s.typ, typ, typ)
		for _, f := range s.fields {
			fmt.Fprintf(&b, "\tprintf(\"%s.%s=size %%zu offset %%zu\\n\", sizeof(((%s *)0)->%s), offsetof(%s, %s));\n",
				s.typ, f, typ, f, typ, f)
		}
	}
	for _, c := range abiConstants {
		fmt.Fprintf(&b, "\tprintf(\"%s=%%llu\\n\", (unsigned long long)%s%s);\n", c, strings.ToUpper(prefix), c)
	}
	b.WriteString("\treturn 0;\n}\n")
	return b.String()
}

func runABIProgram(t *testing.T, dir, name, src string) map[string]string {
	t.Helper()
	cfile := filepath.Join(dir, name+".c")
	if err := os.WriteFile(cfile, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	pkgDir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, name)
	out, err := exec.Command("gcc", "-std=gnu11", "-Wall", "-Werror", "-I", pkgDir, "-o", bin, cfile).CombinedOutput()
	if err != nil {
		if bytes.Contains(out, []byte("rdma/fabric.h")) {
			t.Fatalf("libfabric's headers are missing: install libfabric-dev (make test-deps): %s", out)
		}
		t.Fatalf("gcc %s: %v\n%s", name, err, out)
	}
	res, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatalf("run %s: %v", name, err)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(res))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok {
			t.Fatalf("%s printed %q", name, sc.Text())
		}
		m[k] = v
	}
	return m
}

// TestABIAgainstLibfabricHeaders compares every size, alignment, field
// offset and constant in kvf_fabric.h with libfabric's own headers.
func TestABIAgainstLibfabricHeaders(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatalf("the ABI test needs gcc: %v", err)
	}
	dir := t.TempDir()
	theirs := runABIProgram(t, dir, "libfabric", abiProgram(fabricHeaders, ""))
	ours := runABIProgram(t, dir, "kvf", abiProgram(`#include "kvf_fabric.h"`, "kvf_"))
	want := len(abiConstants)
	for _, s := range abiFields {
		want += 1 + len(s.fields)
	}
	if len(theirs) != want || len(ours) != want {
		t.Fatalf("parsed %d lines from libfabric's program and %d from ours, want %d each", len(theirs), len(ours), want)
	}
	for _, k := range slices.Sorted(maps.Keys(theirs)) {
		if v := theirs[k]; ours[k] != v {
			t.Errorf("%s: libfabric says %s, kvf_fabric.h says %s", k, v, ours[k])
		}
	}
}
