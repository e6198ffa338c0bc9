// Package pool is where KV blocks live on a node: the memory an agent owns
// in one tier, cut into block sets of slots, and the life of every block in
// them. Engines write into it, peers read out of it while it keeps
// serving, and it never hands out a block that is half written or recycled
// under a reader.
//
// # Memory
//
// A [Storage] is one piece of memory: [HostStorage] is host memory in a
// memory file (memfd, or a mode 0600 file under /dev/shm) mapped shared, so
// that an engine on the node maps the same bytes through [HostStorage.FD]
// or [HostStorage.Path]; it is page-locked (Pinned) and on huge pages where
// the system allows, and falls back with a log line where it does not.
// Device memory implements the same interface in pool/cuda.
//
// [HostStorage.NewSection] gives a range of host storage a memory file of
// its own, with fresh pages at the same addresses, so that one block set's
// memory can be handed to an engine without the rest; the pages the range
// had stay with whoever still maps them and are never handed out again.
// [HostStorage.NewSectionFile] and [Section.Place] are the same in two
// steps: the file first, the range untouched, and its pages placed later.
//
// A [Pool] carves [BlockSet]s from one Storage, or from one per GPU
// ([NewSpanning]): one region per TP rank, page aligned, at
// [BlockSet.RegionOffset] of the storage [BlockSet.RegionStorage] names
// (rank r on storage r mod their number, or as [Pool.NewBlockSetOn] places
// it), so that slot s of rank r sits where the block set's [layout.Layout]
// says. [Pool.FreeBlockSet] gives a
// set's memory back once nothing in it is allocated, referenced or leased
// (its registered blocks leave with remove events); new sets take freed
// memory first fit before carving past the last set, and set ids are never
// reused.
//
// # Lifecycle
//
// Every slot is in one of five states:
//
//	state       owner                     ops that leave it
//	----------  ------------------------  -------------------------------------
//	Reset       the pool (free stack)     Allocate            -> Partial
//	Partial     the allocator             Commit              -> Complete
//	                                      Abort               -> Reset
//	                                      Retire              -> Retired
//	Complete    the allocator             Register            -> Registered
//	                                      Register, duplicate -> Reset
//	                                      Abort               -> Reset
//	                                      Retire              -> Retired
//	Registered  shared: users and leases  recycle when inactive -> Reset
//	Retired     nobody, for good          none
//
//	from        to          trigger                 check
//	----------  ----------  ----------------------  ---------------------------
//	Reset       Partial     Allocate                free, or recyclable
//	Partial     Complete    Commit                  caller says it is full
//	Complete    Registered  Register(hash)          hash not in the set yet
//	Complete    Reset       Register(existing hash) the existing block is used
//	Registered  Reset       recycle (Evict, watermarks, Allocate)
//	                                                no users and no leases
//	Partial     Reset       Abort                   aborted sequence
//	Complete    Reset       Abort                   invalidated
//	Partial     Retired     Retire                  a copy may still land
//	Complete    Retired     Retire                  a copy may still land
//
// A set with Retired slots can be freed, but its memory goes to no other
// set while the pool lives ([Metrics].WithheldBytes); [Pool.ReclaimBlockSet],
// which frees a set only for its memory, refuses it ([ErrBlockSetRetired]),
// seeing a slot retired up to the call. Retired slots count
// in neither [BlockSet.Usable] (the slots that may still be allocated) nor
// [BlockSet.Retains] (the blocks the set keeps before allocating recycles
// them).
//
// Anything else is a [TransitionError]. Every return to Reset bumps the
// slot's generation, so a [Block] handle (slot, generation) issued before
// goes stale ([ErrStaleBlock]) instead of touching the new contents.
//
// [BlockSet.RegisterBatch] takes a sequence of up to [MaxRegisterBatch]
// Partial or Complete slots through Commit and Register, with their
// checksums, under one hold of the set's lock, and queues their store
// events as one batch; it stops at the first slot refused.
//
// A Registered block counts references (Register gives one, Acquire takes
// one, Release drops one) and leases. With neither it is inactive, and
// allocation may recycle it when free slots run out, or fall below the low
// watermark (then up to the high one). Recycling is prefix-aware: a block
// whose parent is Registered in the same set extends it, and a block is
// not recycled while one that extends it is Registered, so the leaves of
// the cached prefix tree go first, least recently used among them, and a
// sequence loses its tail before its head. Each recycle emits a remove
// event; each new registration a store event. [BlockSet.Demote] marks
// blocks that other nodes also hold: among the leaves they go first
// (least recently used among them), so that the cluster keeps more
// distinct blocks; [BlockSet.Undemote] takes the mark off.
//
// With [Config.Offload] set, blocks may fall to a tier below (the agent's
// host and disk tiers) instead of being recycled away: recycling offers
// each victim that has no copy below to the hook, and a block taken stays
// Registered and served, out of recycling's reach, until
// [BlockSet.Offloaded] says its copy is complete; then it is recycled
// first, losing nothing. Recycling ahead of need starts past
// [Config.OffloadWatermark] of use; at most [Config.OffloadInFlight] of a
// set's slots wait for copies; under [Config.OffloadGiveUp] an allocation
// takes the slots of blocks whose copies are under way (never one being
// read) rather than wait for the tier below. A set whose layout [Config.OffloadSkips] says no
// tier takes is offered nothing and recycles only on need.
//
// # Leases
//
// A peer that reads our memory first leases the blocks by sequence hash
// ([BlockSet.Lease]): it gets each block's slot and generation and a random
// [LeaseID], and the blocks cannot be recycled until [Pool.ReleaseLease] or
// the deadline. Release reports whether the lease was still valid: a
// reader trusts the bytes only then. [Pool.CheckRead] is the transport's
// gate: it serves a range of a region only when the range lies entirely in
// the leased slots' shards. [Pool.LeasedSlots] says which slots a live
// lease holds and the hash each held when leased, for checking other
// claims a reader makes about it; [Pool.LeaseDeadline] when it ends.
//
// Expiry follows [Config.Clock]. Leases past their deadline are reaped by
// the pool's goroutine every [Config.ExpiryInterval], by [Pool.ExpireLeases],
// and by Renew, ReleaseLease, CheckRead, LeasedSlots and LeaseDeadline on
// the lease they name; a lease past its deadline is never honoured even
// before it is reaped.
//
// # Checksums
//
// A Registered block may carry a content checksum ([BlockSet.SetSum] or
// [Registration.Sum],
// layout.BlockSum of its bytes), which its leases carry to readers. A
// block found changed after registration is withdrawn
// ([BlockSet.Withdraw]): it leaves the registry with its remove event at
// once, and its slot is recycled when its users and leases are gone.
//
// # Events
//
// Store and remove events are numbered per pool in the order they happen
// and handed to [Config.Events] in batches from the pool's goroutine, out
// of a bounded buffer: a slow sink loses events (counted, and visible as
// gaps in Event.Seq), never stalls the pool, and resynchronises from
// [Pool.Snapshot].
//
// # Concurrency
//
// Each block set has one mutex; the operations under it are O(1) except
// those that change what is evictable (Release, Acquire, Register,
// recycling: O(log n) per block), leases (O(hashes)) and snapshots.
// Locks are never held while calling out.
package pool
