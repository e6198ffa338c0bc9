// Package softverbs builds softverbs, a software RDMA NIC for tests: a C
// library (softverbs.c) that exports the libibverbs calls kvfabric's rdma
// binding uses and moves bytes between processes on one machine. It is a
// test fixture, not a product feature: nothing in an agent links it unless a
// test points rdma.Config.Library (or KVFABRIC_IBVERBS_LIB) at the file that
// [Build] returns.
//
// # What it models
//
// Devices, ports and GIDs come from the environment, read at
// ibv_get_device_list / ibv_open_device:
//
//	SOFTVERBS_REGISTRY    machine-wide registry directory (default /dev/shm/softverbs)
//	SOFTVERBS_DEVICES     comma-separated device names (unset: "softverbs0";
//	                      set and empty: no devices)
//	SOFTVERBS_GID_ADDR    IPv4 address(es) the GIDs derive from, one per device or
//	                      one for all (default 127.0.0.1): GID 1 is ::ffff:a.b.c.d
//	                      (RoCE v2), GID 0 fe80::<guid> (RoCE v1)
//	SOFTVERBS_LINK_LAYER  ethernet | infiniband (default ethernet; infiniband
//	                      gives one IB GID and a LID derived from the address)
//	SOFTVERBS_PORT_STATE  active | down (default active)
//	SOFTVERBS_FAULTS      faults, "key=value,..." (below)
//	SOFTVERBS_CONTROL     a file holding faults, re-read on every post_send
//	                      and while a request waits
//	SOFTVERBS_TIMEOUT_CAP_MS  cap on a QP's transport timeout (default 2000)
//
// Faults: fail_read=N (the Nth RDMA READ posted from when the text was set
// completes with fail_status, default REM_ACCESS_ERR; a status is named as
// in IBV_WC_*, with or without the prefix, or by number), delay_us=U (every
// completion delayed U µs), stall=1 (no response until cleared: the QP's
// timeout applies, then RETRY_EXC_ERR), port_down=1 (the port reports DOWN
// and requests time out the same way). A QP records its process's control
// file in the registry, so stall=1 or port_down=1 written to a responder's
// control file stalls the requesters reading from it too.
//
// The registry holds one file per memory registration (mr-<rkey>) and per QP
// (qp-<qpn>) with the owner's pid and start time; QPNs, PD ids, lkeys and
// rkeys are allocated from one counter under flock, so they are unique
// machine-wide and lkey != rkey (a request using one for the other fails as
// it would on a NIC). Entries go at dereg/destroy and at process exit (C's
// exit; a Go program's os.Exit skips it, and its entries are then treated as
// a killed process's); those of a process killed with SIGKILL are ignored
// (its pid is gone or names a later process) and swept by the next
// ibv_open_device. A shared counter (<registry>/gen) moves with every change,
// so requesters keep what they looked up until it moves.
//
// Device limits (ibv_query_device) are enforced: max_qp_wr 4096, max_sge 30,
// max_cqe 65536, max_qp_rd_atom and max_qp_init_rd_atom 16, max_qp 256,
// max_cq 256, max_mr 4096, max_pd 64, max_mr_size 1 TiB; port max_msg_sz
// 2 GiB. Queue and CQ sizes are taken exactly as asked (no rounding up), so a
// limit set at creation is the limit enforced.
//
// RC QPs follow the kernel's state table (RESET->INIT->RTR->RTS, any->ERR,
// any->RESET, INIT->INIT, RTS->RTS): a mask that lacks a required bit or
// has one neither required nor optional for the transition fails with
// EINVAL, as do out-of-range values. Only IBV_WR_RDMA_READ executes; any
// other opcode completes with IBV_WC_LOC_QP_OP_ERR. A READ runs with
// process_vm_readv from the connected peer's process, on the poller's
// thread when ibv_poll_cq finds the CQ empty, else on the QP's worker thread
// once the request is 100 µs old (a spinning poller on a loaded machine would
// otherwise starve the worker, and a worker woken for every request costs two
// thread switches each; anything that has to wait is left to the worker),
// after a NIC's checks: each local SGE's lkey in this QP's PD with local
// write and in range (else LOC_PROT_ERR); the responder QP reachable at the
// RTR address, connected back and in RTR or RTS (else no response:
// RETRY_EXC_ERR after 4.096 µs × 2^timeout × (retry_cnt+1), capped); the
// responder QP allowing remote read with max_dest_rd_atomic > 0 (else
// REM_INV_REQ_ERR); the rkey registered by the responder's process in the
// responder QP's PD, with remote read and covering the range (else
// REM_ACCESS_ERR). An error completion moves the QP to ERR; outstanding and
// later requests complete with WR_FLUSH_ERR. Error completions are always
// reported; successes only when signalled (IBV_SEND_SIGNALED or sq_sig_all).
// A send-queue slot frees when a completion of it or of a later request is
// polled, so a queue of unsignalled requests fills up (post_send returns
// ENOMEM with bad_wr set) as on hardware.
//
// CQ overrun: a completion that finds the CQ full is lost, the CQ is in
// error from then on (every later completion is lost too) and the QP that
// produced it moves to ERR. ibv_poll_cq still returns the completions stored
// before the overrun, then -EOVERFLOW (errno EOVERFLOW).
//
// ibv_reg_dmabuf_mr accepts memfd descriptors only (the software GPU exports
// those): it maps [offset, offset+length) of the file and registers the
// mapping at the given iova; peers read it like any other region. Remote
// addresses and SGE addresses are in the region's iova space (the address
// for ibv_reg_mr).
//
// Teardown is strict where a driver is: ibv_destroy_cq refuses (EBUSY) while
// QPs use the CQ, ibv_dealloc_pd while QPs or regions use the PD, and, unlike
// libibverbs (where the kernel cleans up), ibv_close_device while the context
// holds anything, so that a leak shows.
//
// Not modelled: receives, sends, writes, atomics, completion channels,
// SRQs, alternate paths, more than one port.
package softverbs
