package fabric

import (
	"context"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/rdma/ofi"
)

// Test-only access to the agent's hooks and counters, for the tests of
// package fabric_test.

// OnChunkRegistered makes an agent started with c call f after each whole
// chunk an import registers.
func OnChunkRegistered(c *Config, f func(holder string, blocks int)) { c.hooks.chunkRegistered = f }

// BeforeServeRead makes an agent started with c call f on the holder side
// of every read, before the read is checked against its lease.
func BeforeServeRead(c *Config, f func(peer string, lease uint64)) { c.hooks.beforeServeRead = f }

// BeforeServeRelease makes an agent started with c call f on the holder
// side of every release before it releases the lease; f returning false
// makes the holder answer that the lease had expired (and keep it until
// its term ends).
func BeforeServeRelease(c *Config, f func(peer string, lease uint64) bool) {
	c.hooks.beforeServeRelease = f
}

// BeforeHold makes an agent started with c call f where an engine call is
// about to record in its session the slots or blocks it took for the
// engine, given the session's id; f runs on the call's goroutine.
func BeforeHold(c *Config, f func(session uint64)) { c.hooks.beforeHold = f }

// SetStageBytes makes an agent started with c stage the reads it serves out
// of GPU memory n bytes at a time instead of stageServeBytes.
func SetStageBytes(c *Config, n uint64) { c.hooks.stageBytes = n }

// SetRequestBudget makes an agent started with c bound the engine
// requests in flight to total bytes, perSession a session, below the
// settings' floor.
func SetRequestBudget(c *Config, total, perSession int64) {
	c.hooks.requestBudget.total, c.hooks.requestBudget.perSession = total, perSession
}

// ImportChunks is how many chunks a imported whole.
func ImportChunks(a *Agent) uint64 { return a.stats.importChunks.Load() }

// LeaseRenewals is how many lease renewals holders granted to a's reads.
func LeaseRenewals(a *Agent) uint64 { return a.stats.leaseRenewals.Load() }

// Suspect says whether a tries holder after the others, because it just
// failed an import.
func Suspect(a *Agent, holder string) bool { return a.suspects.has(holder) }

// SetPeerMemoryPaths replaces the files whose presence says a peer-memory
// client is loaded, until the returned function restores them. Tests that
// call it must not run in parallel.
func SetPeerMemoryPaths(paths []string) (restore func()) {
	old := peerMemoryPaths
	peerMemoryPaths = paths
	return func() { peerMemoryPaths = old }
}

// SetOFIProviderInfo makes agents take their libfabric provider to report
// what fake returns, when they choose how to register a device pool.
func SetOFIProviderInfo(fake func(ofi.ProviderInfo) ofi.ProviderInfo) (restore func()) {
	old := ofiProviderInfo
	ofiProviderInfo = fake
	return func() { ofiProviderInfo = old }
}

// SetSysfsRoot makes an agent started with c read PCI topology under root.
func SetSysfsRoot(c *Config, root string) { c.hooks.sysfsRoot = root }

// RDMADeviceName is the RDMA device a registers its first pool with, ""
// when RDMA is off.
func RDMADeviceName(a *Agent) string {
	if a.rdmaDevs == nil {
		return ""
	}
	return a.rdmaDevs[a.poolNIC[0]].Info().Name
}

// SetLaneReads turns a's reads over holders' TCP lanes on or off.
func SetLaneReads(a *Agent, on bool) { a.transport.SetLaneReads(on) }

// PinnedBytes is the host pool's memory registered with the CUDA driver
// now, 0 without a pool pinned through it.
func PinnedBytes(a *Agent) uint64 {
	if a.pinned == nil {
		return 0
	}
	return a.pinned.PinnedBytes()
}

// SetsPinned says whether every rank of every live block set is
// registered with the CUDA driver.
func SetsPinned(a *Agent) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, es := range a.sets {
		es.mu.Lock()
		for _, m := range es.mem {
			if !m.pinned {
				es.mu.Unlock()
				return false
			}
		}
		es.mu.Unlock()
	}
	return true
}

// IndexOwners returns the owners of hash under a's view of the members,
// nil in whole mode or before a has a view.
func IndexOwners(a *Agent, hash uint64) []string {
	if a.owned == nil {
		return nil
	}
	return a.owned.owners(hash)
}

// IndexMembers returns the members a's owned index places hashes over.
func IndexMembers(a *Agent) []string { return a.owned.members() }

// IndexHolders returns the holders of hash in a's own index (in owned
// mode, its slice), by name.
func IndexHolders(a *Agent, hash uint64) []string {
	var out []string
	for _, id := range a.index.Holders(hash) {
		if n := a.index.Name(id); n != "" {
			out = append(out, n)
		}
	}
	return out
}

// IndexPairs is how many (hash, holder) pairs a's own index holds.
func IndexPairs(a *Agent) int64 { return a.index.Metrics().Pairs }

// IndexLookupCalls is how many lookup calls a's owned index sent owners.
func IndexLookupCalls(a *Agent) uint64 { return a.owned.stats.lookupCalls.Load() }

// AgentConfig is the configuration a runs with, defaults filled.
func AgentConfig(a *Agent) Config { return a.cfg }

// HoldImport makes a's imports of hash into block set set wait, as for
// another import bringing it, until the returned release is called.
func HoldImport(a *Agent, set, hash uint64) (release func()) {
	f, mine := a.flights.claim(pool.SetID(set), hash)
	if !mine {
		panic("fabric: HoldImport: an import of the block is under way")
	}
	return func() { a.flights.finish(pool.SetID(set), hash, f) }
}

// BeforeCallerCheck makes an agent started with c call f where an engine
// call that took slots or blocks for its session looks whether its caller
// still waits, given the call's ctx.
func BeforeCallerCheck(c *Config, f func(ctx context.Context)) { c.hooks.beforeCallerCheck = f }
