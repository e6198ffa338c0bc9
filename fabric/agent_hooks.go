package fabric

import (
	"context"

	"github.com/kvfabric/kvfabric/pool"
)

// testHooks let tests observe and interrupt the agent's flows at points
// no API reaches. Nil hooks are skipped; they run on the flow's own
// goroutine and must not block for long.
type testHooks struct {
	// chunkRegistered runs after each whole chunk an import registers,
	// with the holder and the blocks this fetch registered so far.
	chunkRegistered func(holder string, blocks int)
	// beforeServeRead runs on the holder before it checks a read's
	// segment against its lease.
	beforeServeRead func(peer string, lease uint64)
	// beforeServeRelease runs on the holder before it releases a lease;
	// false makes it answer that the lease had expired.
	beforeServeRelease func(peer string, lease uint64) bool
	// claimsTaken runs on the holder where a release has taken up its
	// lease's checksum claims (leaseBook.claim), before it checks them,
	// given the peer, the lease and what ends the holder's limit on
	// their sums (as PeerTimeout passing does).
	claimsTaken func(peer string, lease uint64, stop context.CancelFunc)
	// claimSummed runs on the holder where a release's checksum claim is
	// about to sum a block its lease pinned (Mismatched), given the
	// peer, the lease and the block's hash.
	claimSummed func(peer string, lease, hash uint64)
	// stageBytes replaces stageServeBytes when non-zero, so that small
	// reads show the batching of staged serving.
	stageBytes uint64
	// beforeServeIndex runs on an owner before it serves a peer's index
	// call; an error is its answer (a test's owner that predates a call).
	beforeServeIndex func(payload []byte) error
	// sysfsRoot replaces /sys where the agent reads PCI topology, so that
	// a fake tree decides which RDMA device is nearest the GPU.
	sysfsRoot string
	// tierAnnounced runs as the tiers publish that the node holds (store)
	// or no longer holds hashes, under block set number set.
	tierAnnounced func(store bool, set uint32, hashes []uint64)
	// poolEvents, if set, takes each batch of the pool's events on the
	// pool's goroutine in place of onPoolEvents, given as publish: a
	// test's batch may be published as one with events lost.
	poolEvents func(b pool.EventBatch, publish func(pool.EventBatch))
	// idleUnlocked, if set, runs where freeIdleLocked has let go of the
	// agent's lock to wait for an idle set's read-ahead, given the set;
	// set, every free for room (not a grace timer's) lets go so, as if a
	// read-ahead were under way, so that a test acts meanwhile.
	idleUnlocked func(es *engineSet)
	// registerRound, if set, runs each time a Register's choice of set is
	// made (newSetForSession), the first time and each time anew.
	registerRound func()
	// beforeSetFree, if set, runs where freeIdleOnceLocked has checked an
	// idle set and is about to ask the pool to free it, given the set;
	// a.mu and the set's mu are held: it must take neither.
	beforeSetFree func(es *engineSet)
	// beforeHold, if set, runs where an engine call is about to record in
	// its session slots or blocks it took for the engine (sessionSet.hold,
	// holdAll), given the session's id, before it looks whether the
	// session still holds: a test ends the session meanwhile.
	beforeHold func(session uint64)
	// beforeCallerCheck, if set, runs where an engine call that took
	// slots or blocks for its session looks whether its caller still
	// waits (sessionSet.callerGone), given the call's ctx: a test waits
	// there until the caller's deadline has reached the call.
	beforeCallerCheck func(ctx context.Context)
	// beforeAttach, if set, runs where an engine call naming a block set
	// by its id has found that its process may use it (joinableSet) and
	// is about to attach it to its session (setFor), given the set: a
	// test hands it to another process meanwhile.
	beforeAttach func(es *engineSet)
	// beforeHandOver, if set, runs where a Register has chosen es (a
	// set it may join, or one it made) and before it attaches es and
	// records its process (handOver), with the agent's lock held.
	beforeHandOver func(es *engineSet)
	// setMemory, if set, runs where a new set's memory for engines
	// (isolated engine memory only) has its sections' files made, placed
	// false (prepareSetMemory), and where they are placed under the set,
	// placed true (placeSetMemory), before their tokens are handed out,
	// given the sections; an error is that step's answer, the sections
	// closed, as if making or placing one had failed.
	setMemory func(placed bool, secs []*pool.Section) error
	// requestBudget, when its total is non-zero, replaces the bounds on
	// engine requests in flight (in all, per session), below the floor
	// the settings keep (MinEngineRequestMemory), so that a test's small
	// requests reach them.
	requestBudget struct{ total, perSession int64 }
}
