// Package ofi is kvfabric's binding to libfabric (OpenFabrics Interfaces):
// reliable datagram endpoints (FI_EP_RDM) that move bytes by RMA reads from a
// peer's registered memory into ours. It reaches the fabrics libibverbs does
// not: AWS EFA (the efa provider) and HPE Slingshot (cxi); on a machine
// without them, libfabric's own tcp (tcp;ofi_rxm) and shm providers give the
// same calls over the kernel's sockets and shared memory.
//
// libfabric is opened with dlopen at run time (Config.Library, else the
// KVFABRIC_LIBFABRIC_LIB environment variable, else "libfabric.so.1"), so
// building needs only Go and gcc, and a machine without the library runs the
// same binary without it: Open returns an error wrapping ErrUnavailable. A
// build without cgo has the same API; every entry point returns an error
// wrapping ErrNotSupported.
//
// The structures the binding passes to libfabric are declared in
// kvf_fabric.h, never taken from libfabric's headers; abi_test.go holds every
// size, offset and constant against the real ones. Calls other than the few
// libfabric exports go through the objects' ops tables, as the headers'
// static inline functions do.
//
// # Choosing a provider
//
// Providers lists what libfabric offers with FI_RMA on FI_EP_RDM; Choose
// picks cxi, then efa, then verbs, and tcp or shm only when the caller names
// them (they are slower than kvfabric's own TCP lane and exist here for
// tests and for machines that have nothing else).
//
// # Memory registration
//
// A provider says in its mr_mode how memory must be registered; MRMode.Plan
// turns that into what the binding does:
//
//	bit              the binding
//	FI_MR_LOCAL      registers local buffers too and passes their descriptors
//	FI_MR_VIRT_ADDR  peers address a region by virtual address, else by offset
//	FI_MR_PROV_KEY   takes the provider's key, else asks for one of its own
//	FI_MR_ENDPOINT   binds each region to the endpoint and enables it
//	FI_MR_ALLOCATED  registers only allocated memory (all kvfabric memory is)
//	FI_MR_HMEM       registers device memory with its interface (FI_HMEM_CUDA)
//	FI_MR_RAW        refused: keys wider than 64 bits are not supported
//
// # What peers exchange
//
// Over an authenticated channel (kvfabric's QUIC control stream), a holder
// hands a reader its endpoint name and, under a lease, each region's remote
// address and key:
//
//	field   size      meaning
//	name    <= 256 B  the holder's endpoint address (fi_getname), inserted into the reader's AV
//	addr    8 B       where the region starts: its virtual address, or 0 without FI_MR_VIRT_ADDR
//	length  8 B       the region's length in bytes
//	key     8 B       the region's key
//
// Memory is registered for remote read only, never remote write, and only
// reads are ever posted.
//
// # Completions and progress
//
// One goroutine per endpoint reads its completion queue and so also drives
// the provider's progress, which software providers need on the serving side
// as well: tcp sends a read's bytes, and shm (without cross-memory attach)
// copies them, only when the holder's loop polls. A Read also takes the
// queue itself after each batch of requests it posts, in the same call:
// posting and polling hold one lock of the endpoint's, which the loop only
// tries, so that one thread at a time posts to or polls the provider
// (registrations and address inserts, thread-safe there, run beside them;
// shm holds its spin locks over a whole cross-memory copy, and a poll that
// meets one spins until the copy ends), and a read that the provider completes within
// the call (shm by cross-memory attach) needs no loop to wake it. The loop
// polls hot only while a Read waits on it with nothing left to post. shm's queues have no wait
// object in libfabric 1.17, so the loop polls, napping between empty polls
// on an eventfd with a timeout (plus the kernel's timer slack), longer the
// longer nothing comes, up to a cap set by what the endpoint does: 20 us
// while a Read of its own waits on it (after 256 polls that only yield), 50 us
// while it serves peers (Serve, which kvfabric calls for each lease it
// answers with the endpoint, until the lease ends), 1 ms while it serves
// only peers whose reads complete inline (ServeInline), 10 ms otherwise. A
// Read that begins to wait on it, or a Serve that begins, wakes the nap at
// once.
// An idle endpoint costs about a hundred wake-ups a second.
//
// Read posts its requests (split at the provider's message size,
// gathered into scatter lists up to its iov limit, at most its transmit queue
// depth in flight), then waits for their completions. A read whose context
// ends with requests still in flight waits a bounded grace for them; past it
// the endpoint is closed (which flushes them), so that no byte lands in the
// caller's memory after Read has returned. A read the provider takes no
// request of for Config.ConnectTimeout, with nothing of it in flight, fails
// with ErrUnreachable: tcp;ofi_rxm takes none while it connects to a peer,
// and keeps trying to connect to one that is gone.
//
// Over tcp (ProviderInfo.StagesReads), a remote run that lands in more
// small pieces than the iov limit (four) allows is read in requests of up
// to 512 KiB into a registered staging buffer of the endpoint's (16 slots,
// mapped on the first read that needs it) and its pieces copied out by the
// Read: every tcp request costs system calls on both ends, and a TP 4 -> 2
// HND import otherwise posts one per 32 KiB. Device memory, and providers
// that read scatter lists on the NIC, are read in place.
//
// # shm in libfabric 1.17
//
// Opened with FI_HMEM, shm turns cross-memory attach off: every read is
// copied by the holder's progress through shared buffers, one read at a
// time per peer, so a read of many small pieces costs a holder wake-up
// each; a read with a wrong key or past a registration gets no completion
// at all (the holder drops it), and ends at the caller's deadline.
// Opened without (Config.HostOnly), shm reads the holder's memory itself
// with process_vm_readv where the kernel lets it (same user, holder
// dumpable): fast, needing the holder only to recycle its command slots,
// and checking neither keys nor registrations (a process that may attach
// to the holder may read all of its memory anyway). A holder that has
// exited fails such a read at once. Such a reader holds the holder's
// region spin lock over each copy, and the holder's poll takes that lock
// to recycle the slots (one per request, 1,024 of them): a holder that
// polls while a peer reads spins until the copy ends. The holder cannot
// tell through libfabric which kind of reader it serves; the reader can:
// ReadDetailed says whether every request of a read completed within the
// call that posted it (ReadResult.Inline), which shm does only by
// cross-memory attach (its fast path: FI_MR_VIRT_ADDR, one remote iov, the
// kernel letting the reader in). kvfabric's reader says so in its next
// lease and renewal requests, naming the holder's endpoint its reads
// completed inline from, and the holder, over shm and for its endpoint of
// now only, serves those leases with ServeInline:
// naps of up to 1 ms (a reader uses 1,024 command slots in several ms at
// full rate), where each poll that meets a copy spins.
package ofi
