// Package fabric is the kvfabric node agent: it wires membership, the
// global block index, the pools, leases and the peer transport together,
// imports blocks from other nodes, and serves the engine API.
//
// # Files
//
// The files are grouped by flow; the prefix says which:
//
//	agent_*, config.go   wiring: Start and Close, configuration and its
//	                     defaults, pools (host, pinned, one per GPU) and
//	                     their limits, RDMA devices, the TLS identity,
//	                     reload on SIGHUP, metrics and /healthz
//	engine_*             the engine API: the gRPC server, sessions and the
//	                     block sets they hold, each set's own memory and who
//	                     it was handed to (or joined it by its token), the
//	                     descriptor socket that hands it to engines, peer
//	                     credentials
//	import*              bringing blocks here for an engine
//	serve_*              what this node answers to peers: hello, layouts,
//	                     leases (and the book that bounds them), renewals,
//	                     releases
//	cluster_*            the cluster: membership and node metadata, the
//	                     index fed by gossiped events, publishing this
//	                     node's events, repairing missed ones, connections
//	                     to peers, suspected holders
//	tier*                the host and disk tiers under the pools: their
//	                     settings and stores, copies down (tier_offload.go),
//	                     restores into an engine's set on Acquire, Lookup
//	                     and Import (tier_restore.go), the read-ahead along
//	                     a sequence that follows a restore
//	                     (tier_readahead.go), prefetch, staging for peers,
//	                     the back-off of slots that could not be read, and
//	                     their announcements
//
// # An import, file by file
//
// An engine's Import (engine_server.go) names its block set and the blocks,
// by sequence hashes or by token ids (import_pages.go turns token ids into
// each holder's own pages when its page size divides the engine's). The
// session's set (engine_session.go) is where the blocks land.
//
// import.go decides where they come from. It first takes what the set
// already holds, then what another set of this node holds (import_local.go
// copies it, on the GPU where the pools are device memory), then what this
// node's tiers hold (tier_restore.go restores it), then asks the
// index (fabric/index, fed by cluster_index_sink.go) who holds the rest and
// orders those holders: recently blamed ones last, then longest prefix
// first, then the fewest blocks held on disk only, then the least loaded
// (import_links.go keeps each peer's observed rate and round trip, for
// Lookup's estimates). Concurrent imports of the same block on this node
// wait for one another rather than fetching it twice (import_flights.go).
//
// import_fetch.go moves the blocks from one holder, a chunk at a time and
// pipelined: it leases the next chunk while the current one is read and the
// previous one released and registered. A lease answer names the holder's
// block set by layout digest; import_layout_cache.go fetches a layout it has
// not seen. The plan from the holder's layout to ours (package layout) is
// executed over RDMA where both ends have it, else over the holder's TCP
// lane where it serves one, else over QUIC (each falling back to the next
// with a reason); into GPU
// memory without RDMA it goes through pinned staging (import_staging.go,
// which also stages this node's GPU memory out for peers reading it over
// QUIC).
// A read that outlives the lease's term renews it (import_lease_keeper.go),
// while the lease is at most the holder's MaxLeaseAge old; a refused
// renewal fails the read over as a lost lease.
// Once a chunk's bytes are in its slots, import_checksum.go checks each
// block against the checksum the lease carried (taken when the holder's
// engine registered it); a mismatch fails the chunk over and tells the
// holder, which checks again and withdraws the block (only a block that
// reader's lease pinned). A chunk's slots are registered only
// after every byte arrived and checked and the holder's release confirmed
// that the lease never expired; a chunk that
// fails is discarded and the rest of the import fails over to the next
// holder, blaming the holder only for failures that are its own
// (cluster_suspects.go tries the recently blamed after the others).
//
// On the other side, serve_peer.go answers the lease: it pins the blocks in
// the pool under a lease whose count serve_lease_book.go bounds per peer and
// in total, renews it while it is at most Config.MaxLeaseAge old, acts on a
// release's checksum claims only for blocks that lease pinned, and only
// on the first release of the lease (import_checksum.go, Mismatched), and
// ends leases whose peer went away.
//
// # A restore from a tier
//
// A block this node holds only in a tier (host memory or disk, below the
// pools) is restored when an engine's Acquire, Lookup or Import asks for
// it: tier_restore.go reads a run of it into slots of the engine's set,
// checks it and registers it. tier_readahead.go then reads the blocks that
// followed the run when they went down into the set's spare slots in the
// background, so that the engine's next call finds them in memory; a
// restore that asks for a block being read ahead waits for it instead of
// reading it twice.
//
// Registered blocks emit pool events; cluster_publish.go numbers and
// gossips them, so that every node's index learns that this node now holds
// the blocks too, and cluster_repair.go serves and fetches the ranges a
// node missed. With the owned-slices index (Config.IndexMode IndexOwned),
// cluster_owned.go sends them instead to each hash's owners, which
// lookups then ask (cluster_owned_lookup.go). Either way, the index keeps
// at most Config.IndexMaxNodeBlocks distinct hashes of any holder but this
// node (cluster_index_sink.go and cluster_owned_serve.go count and log the
// rest).
package fabric
