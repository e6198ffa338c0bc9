// Package softcuda is a software GPU for tests: a small C library, built by
// Build with gcc, that exports the CUDA driver API calls pool/cuda uses,
// under the names a real libcuda.so.1 exports (cuMemAlloc_v2,
// cuMemcpyHtoDAsync_v2, cuMemcpy2DAsync_v2, cuIpcOpenMemHandle_v2, ...), so
// the real binding runs on it unchanged. It is a test fixture, not a
// product feature.
//
// What it models:
//
//   - Device memory: each cuMemAlloc_v2 is a memfd, mapped PROT_NONE at the
//     returned device address, so that a host dereference of a device
//     pointer faults as it would on a GPU. The library's own copies reach
//     the bytes through a second, read-write mapping of the same memfd.
//     Sizes are rounded up to the host page size; allocations beyond
//     SOFTCUDA_MEMORY per device fail with CUDA_ERROR_OUT_OF_MEMORY. Fresh
//     memory holds a pattern, never zeros (its first 64 MiB and last MiB,
//     so that sparse allocations of many GiB stay cheap). Memory its owner
//     frees is truncated: importers (IPC) fault on it and an RDMA
//     registration of it (dma-buf) reads nothing more.
//   - Contexts: one primary context per device (cuDevicePrimaryCtxRetain),
//     current per thread (cuCtxSetCurrent); calls that need one return
//     CUDA_ERROR_INVALID_CONTEXT without it. Releasing the last reference
//     destroys the context: its streams are destroyed and its memory
//     (allocated or imported) freed, after the work already queued; a
//     later retain makes a new one, to which the old handles are unknown.
//   - Streams: each runs its work in order on its own worker thread; the
//     NULL stream is one more such worker. Events record, query
//     (CUDA_ERROR_NOT_READY), synchronise, and order streams
//     (cuStreamWaitEvent). Streams and events belong to the context current
//     when they were made: queueing a copy on a stream, or recording an
//     event, under another context is CUDA_ERROR_INVALID_HANDLE (a stream
//     may wait for another context's event). cuStreamDestroy_v2 returns at
//     once, as on a GPU: the work queued still runs, and nothing waits for
//     it.
//   - Faults: a copy through imported memory that its owner has freed
//     fails with CUDA_ERROR_ILLEGAL_ADDRESS, and that error (or an injected
//     ILLEGAL_ADDRESS, ECC_UNCORRECTABLE or LAUNCH_FAILED) is sticky: every
//     later call under the device's context returns it, except device
//     queries and context management, until the context is destroyed.
//   - Copies: host to device, device to host, device to device, and 2-D
//     copies honouring pitches and x/y offsets (pitches at most 2^31-1, the
//     CU_DEVICE_ATTRIBUTE_MAX_PITCH of current GPUs); a range that leaves its
//     allocation is CUDA_ERROR_INVALID_VALUE, an unknown stream or event
//     CUDA_ERROR_INVALID_HANDLE. cuMemcpyHtoD_v2 and cuMemcpyDtoH_v2 copy
//     synchronously, behind all work queued so far (the Python client's).
//   - Peer copies between devices: cuMemcpyPeerAsync and cuMemcpy3DPeerAsync
//     (depth slices of pitched rows) in stream order. Each side names a
//     context; a context that is not a retained primary context is
//     CUDA_ERROR_INVALID_CONTEXT, and a range that is not, whole, in memory of
//     its context's device is CUDA_ERROR_INVALID_VALUE. cuPointerGetAttribute
//     answers CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL for device memory (anything
//     else is CUDA_ERROR_INVALID_VALUE). The ordinary copies, as under unified
//     addressing, take device memory of any device.
//   - Pinned host memory: cuMemHostAlloc (anonymous mapping) and
//     cuMemHostRegister_v2 (bookkeeping only: overlapping registrations are
//     CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, unregistering what was not
//     registered CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED). Nothing is mlocked.
//   - IPC: a handle names the allocation's memfd (pid, descriptor number,
//     inode, size). Another process opens it through /proc/<pid>/fd/<n>, or
//     pidfd_getfd where that is refused, checks the inode, and maps the same
//     bytes at its own address. Opening a handle in the process that made it
//     is CUDA_ERROR_INVALID_CONTEXT, as on the real driver.
//   - dma-buf: cuMemGetHandleForAddressRange with
//     CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD returns a duplicate of the memfd,
//     which the RDMA stand-in accepts for registration. Unlike a real driver
//     the range must start at an allocation base (a memfd's offset 0 is the
//     allocation's first byte); address and size must be page aligned.
//
// Environment, read once by cuInit. A malformed value is reported on stderr
// and makes cuInit return CUDA_ERROR_INVALID_VALUE:
//
//	SOFTCUDA_DEVICES        number of GPUs (default 1, at most 16; 0 makes cuInit
//	                        return CUDA_ERROR_NO_DEVICE)
//	SOFTCUDA_MEMORY         bytes per GPU, with an optional K, M or G suffix
//	                        (default 1G)
//	SOFTCUDA_PCI_BUS_IDS    comma-separated PCI bus ids, one per GPU, e.g.
//	                        "00000000:18:00.0,00000000:2A:00.0" (default
//	                        00000000:18:00.0, then every 0x10 buses)
//	SOFTCUDA_DMABUF         0 makes CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0 and
//	                        cuMemGetHandleForAddressRange CUDA_ERROR_NOT_SUPPORTED
//	                        (a driver or kernel without dma-buf)
//	SOFTCUDA_STRICT_DEVICE  1 makes the ordinary copies (not the peer ones) refuse,
//	                        with CUDA_ERROR_INVALID_VALUE, device memory of a GPU
//	                        other than the current context's, which unified
//	                        addressing lets a real driver accept: a test then
//	                        proves each copy runs on its memory's GPU
//	SOFTCUDA_COPY_DELAY_US  microseconds each copy sleeps before moving bytes
//	                        (to make overlap and ordering observable)
//	SOFTCUDA_IPC_OPEN       how cuIpcOpenMemHandle_v2 reaches the exporter's memfd: proc
//	                        (/proc/<pid>/fd/<n>), pidfd (pidfd_open and pidfd_getfd,
//	                        Linux 5.6+, needs ptrace access to the exporter), or any
//	                        (proc, then pidfd; the default)
//	SOFTCUDA_FAIL           up to 32 comma-separated name=code or name=code@n: the named
//	                        call returns the CUresult code, every time or only on
//	                        its n-th call (1-based), e.g.
//	                        "cuMemAlloc_v2=2,cuIpcOpenMemHandle_v2=400@1"
package softcuda
