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
//	                      one for all (default 127.0.0.1). The GID table is laid
//	                      out as mlx5's: each address as RoCE v1, then v2: 0 is
//	                      fe80::<guid> v1, 1 the same v2, 2 ::ffff:a.b.c.d v1,
//	                      3 the same v2
//	SOFTVERBS_LINK_LAYER  ethernet | infiniband (default ethernet; infiniband
//	                      gives one IB GID and a LID derived from the address)
//	SOFTVERBS_PORT_STATE  active | down (default active)
//	SOFTVERBS_FAULTS      faults, "key=value,..." (below)
//	SOFTVERBS_CONTROL     a file holding faults, re-read on every post_send
//	                      and while a request waits
//	SOFTVERBS_TIMEOUT_CAP_MS  cap on a QP's transport timeout (default 2000); timeout
//	                      0 is infinite, as on hardware, and not capped
//	SOFTVERBS_ACTIVE_MTU  the port's active MTU in bytes: 256, 512, 1024, 2048 or
//	                      4096 (default 1024, RoCE on a 1500-byte Ethernet MTU)
//	SOFTVERBS_ROCE_V1     1: RoCE v1 (layer 2) frames reach peers (one segment);
//	                      by default they are not routed and are lost
//
// Faults: fail_read=N (the Nth RDMA READ posted from when the text was set
// completes with fail_status, default REM_ACCESS_ERR; a status is named as in
// IBV_WC_*, with or without the prefix, or by number), delay_us=U (every
// completion delayed U µs), copy_us=U (each 64 KiB a READ copies takes U µs
// longer: a copy in flight lasts long enough to act on), stall=1 (no response
// until cleared: the QP's timeout applies, then RETRY_EXC_ERR), port_down=1
// (the port reports DOWN and requests time out the same way). A QP records its
// process's control file in the registry, so stall=1 or port_down=1 written to
// a responder's control file stalls the requesters reading from it too.
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
// so requesters keep what they looked up until it moves. Each process that
// executes READs keeps its data-path counters in <registry>/stats-<pid>
// (READs, bytes, and the CPU time of the copies made by pollers and by the
// QPs' worker threads, which are named "softverbs-qp"): the work a NIC does
// off the CPU, which [ReadStats] reads from another process.
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
// after a NIC's checks: each local SGE's lkey in this QP's PD with local write
// and in range (else LOC_PROT_ERR); the responder QP reachable at the RTR
// address, connected back and in RTR or RTS (else no response: RETRY_EXC_ERR
// after 4.096 µs × 2^timeout × (retry_cnt+1), capped, or never with timeout
// 0); the requester's sq_psn equal to the PSN the responder expects (its
// rq_psn), both ends sending from GIDs of the same RoCE version, and v2 unless
// SOFTVERBS_ROCE_V1=1, and a READ longer than the link's MTU (the smaller
// active MTU of the two ports) only where both path MTUs fit it (else, as for
// a packet dropped on the wire, no response); the responder QP allowing remote
// read with max_dest_rd_atomic > 0, and no more READs outstanding (at most the
// requester's max_rd_atomic) than its max_dest_rd_atomic (else
// REM_INV_REQ_ERR); the rkey registered by the responder's process in the
// responder QP's PD, with remote read and covering the range (else
// REM_ACCESS_ERR, also when the responder deregisters it during the copy).
// ibv_dereg_mr waits for a READ writing into the region, so that nothing lands
// in memory after it returns, as with pinned pages. An error completion moves
// the QP to ERR; outstanding and later requests complete with WR_FLUSH_ERR.
// Error completions are always reported; successes only when signalled
// (IBV_SEND_SIGNALED or sq_sig_all). A send-queue slot frees when a completion
// of it or of a later request is polled, so a queue of unsignalled requests
// fills up (post_send returns ENOMEM with bad_wr set) as on hardware.
//
// CQ overrun: a completion that finds the CQ full is lost, the CQ is in
// error from then on (every later completion is lost too) and the QP that
// produced it moves to ERR. ibv_poll_cq still returns the completions stored
// before the overrun, then -EOVERFLOW (errno EOVERFLOW).
//
// Asynchronous events: ibv_get_async_event returns IBV_EVENT_PORT_ERR and
// IBV_EVENT_PORT_ACTIVE when the port's state changes (seen when the library
// next looks at the port: a READ, ibv_query_port, ibv_get_async_event), and
// IBV_EVENT_CQ_ERR with IBV_EVENT_QP_FATAL for a CQ overrun and the QP it
// moved to ERR; async_fd (an eventfd) is readable while events wait.
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
