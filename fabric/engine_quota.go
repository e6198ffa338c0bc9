package fabric

import (
	"errors"
	"sort"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
)

// setBytes is the pool memory a block set takes.
func setBytes(s *pool.BlockSet) uint64 {
	var n uint64
	for _, r := range s.Layout().Regions {
		n += r.Size
	}
	return n
}

// engineShare returns the bytes of block sets each engine (by the name it
// registered under) made and is charged for; engine's quota:
// Config.EngineQuota, or the pool divided among the engines with sets in
// use (engine included); and a fair share, the pool divided among the
// engines with any sets, idle ones included (engine included), which an
// engine's idle sets are safe within. a.mu is held, but sets are taken up
// and dropped without it (attach, detach: Agent.relocks), so without
// engine_quota the quota is as of the call: another engine taking up a set
// a moment later shrinks it, and a set made within it may be past it then,
// as a set made just before the take-up would be. That is the quota's
// rule, not a slip of it: it bounds what a Register makes, as of the
// Register, and sets made are never taken back when it shrinks (only idle
// sets are freed for room, each checked idle under its own lock); a
// Register that let go of a.mu reads it again (newSetForSession), where
// the wait gave such changes time.
func (a *Agent) engineShare(engine string) (quota, fair uint64, carved map[string]uint64) {
	carved = map[string]uint64{}
	active := map[string]bool{engine: true}
	for _, es := range a.sets {
		es.mu.Lock()
		if !es.freed {
			carved[es.engine] += setBytes(es.set)
			if len(es.users) > 0 {
				active[es.engine] = true
			}
		}
		es.mu.Unlock()
	}
	var total uint64
	for _, st := range a.storages {
		total += st.Size()
	}
	engines := len(carved)
	if _, ok := carved[engine]; !ok {
		engines++
	}
	fair = total / uint64(max(engines, 1))
	quota = total / uint64(len(active))
	if a.cfg.EngineQuota > 0 {
		quota = uint64(a.cfg.EngineQuota)
	}
	return quota, fair, carved
}

// mayFree says which idle sets of other engines a new set of engine's may
// free: those of engines over a fair share (engineShare), as of the
// latest time it was asked: the shares are read again where a free for
// room let go of a.mu since they were read (a.relocks), sets freed by
// their timers meanwhile and engines gone with them. a.mu is held, where
// it is made and where it is asked, and no engineSet's mu.
func (a *Agent) mayFree(engine string, fair uint64, carved map[string]uint64) func(*engineSet) bool {
	read := a.relocks
	return func(es *engineSet) bool {
		if es.engine == engine {
			return true
		}
		if read != a.relocks {
			_, fair, carved = a.engineShare(engine)
			read = a.relocks
		}
		return carved[es.engine] > fair
	}
}

// withinQuotaFreeing says whether a new set of need bytes, not yet among
// a.sets, keeps engine within its quota as it is now once keep, one of its
// sets, is freed. a.mu is held.
func (a *Agent) withinQuotaFreeing(engine string, need uint64, keep *engineSet) bool {
	quota, _, carved := a.engineShare(engine)
	if !setFreed(keep) {
		carved[engine] -= setBytes(keep.set)
	}
	return fitsQuota(carved[engine], need, quota)
}

// withinQuota says whether a new set of need bytes, not yet among a.sets,
// keeps engine within its quota as it is now. a.mu is held.
func (a *Agent) withinQuota(engine string, need uint64) bool {
	quota, _, carved := a.engineShare(engine)
	return fitsQuota(carved[engine], need, quota)
}

// fitsQuota says whether need bytes more than carved are within quota,
// compared so that no sum wraps: a need near 2^64 (each region at most
// 2^62 bytes, on up to 1,024 ranks, the product checked) added to what the
// engine's sets take would wrap to a few bytes, within any quota.
func fitsQuota(carved, need, quota uint64) bool {
	return need <= quota && carved <= quota-need
}

// makeRoomInQuota makes room for a new block set of need bytes for engine
// within its quota, freeing its own idle sets (longest idle first) if it
// must, or refuses with RESOURCE_EXHAUSTED naming the quota. It never
// frees keep, the set the Register falls back to when no new set is made
// (nil for none): freed for a set that then does not fit (past the quota
// still, or no room in the pool), the Register would have neither. Where
// the quota has room only once keep, an idle set of engine's, is freed,
// swap says so: the new set is to be made with keep standing and keep
// freed after (swapFallback). It returns which other idle sets the pool
// may free to fit the new one: the engine's own and those of engines over
// a fair share, never the cached sets of an engine within it
// (freeIdleSets keeps keep too), the shares read again after a.mu is let
// go (mayFree). What it found within the quota may be past it after
// such a wait (another engine taking up a set shrinks the quota without
// engine_quota): its caller checks again (withinQuota). Idle sets it
// tries to free and does not (busy: a block in use, or a read-ahead that
// outlived the wait for it) go into tried, and a set in tried is not
// tried again: tried is the Register's, across its rounds (nil for none);
// keep goes into it where the swap found it busy (swapFallback), and is
// not offered for a swap again. a.mu is held.
func (a *Agent) makeRoomInQuota(engine string, need uint64, keep *engineSet, tried triedSets) (may func(*engineSet) bool, swap bool, err error) {
	if tried == nil {
		tried = triedSets{}
	}
	for {
		quota, fair, carved := a.engineShare(engine)
		if need > quota {
			// Past the quota on its own: freeing sets makes no room.
			return nil, false, a.pastQuota(engine, carved[engine], need, quota)
		}
		may = a.mayFree(engine, fair, carved)
		if fitsQuota(carved[engine], need, quota) {
			return may, false, nil
		}
		var idle []*engineSet
		keepIdle := false
		for _, es := range a.sets {
			es.mu.Lock()
			if es.engine == engine && len(es.users) == 0 && !es.freed {
				if es == keep {
					keepIdle = es.set.Retired() == 0 && !tried[es] // one with retired slots is never freed, nor one tried
				} else if !tried[es] {
					idle = append(idle, es)
				}
			}
			es.mu.Unlock()
		}
		sort.Slice(idle, func(i, j int) bool { return idle[i].idleSince.Before(idle[j].idleSince) })
		again := false
		for _, es := range idle {
			freed, unlocked := a.freeIdleLocked(es, 0)
			if !freed {
				tried[es] = true
			}
			if freed || unlocked {
				// Freed, or a.mu let go meanwhile: what the engine's
				// sets take, and which are idle, is looked at anew
				// (another may have freed es, or keep).
				again = true
				break
			}
		}
		if again {
			continue
		}
		if keepIdle && fitsQuota(carved[engine]-setBytes(keep.set), need, quota) {
			return may, true, nil
		}
		return nil, false, a.pastQuota(engine, carved[engine], need, quota)
	}
}

// pastQuota is makeRoomInQuota's refusal of a set of need bytes for engine,
// whose sets take carved, past its quota.
func (a *Agent) pastQuota(engine string, carved, need, quota uint64) error {
	what := "the pool divided among the engines using block sets"
	if a.cfg.EngineQuota > 0 {
		what = "engine_quota"
	}
	return status.Errorf(codes.ResourceExhausted,
		"engine %q: its block sets take %d bytes and this one needs %d, past its quota of %d (%s); drop block sets it no longer uses or end their sessions",
		engine, carved, need, quota, what)
}

// triedSets are the idle sets a Register tried to free for room and did
// not (busy, or taken up; its fallback where the quota's swap did not free
// it): each time round it tries sets not in it, or frees one, so its
// rounds end (newSetForSession). A set in it that is free again before the
// Register ends (a lease released, a read-ahead over at last) is not tried
// again: the Register may then be refused, or given its fallback, where
// one more try would have made room. That is a chance lost, not a wrong
// outcome (no set in use is freed, none handed out freed), and a short
// one: the set stays idle, and the engine's next Register tries it again
// (its grace timer, which a free for room that finds it busy leaves as it
// was, still frees it, or keeps it as a cache, at its grace period's end;
// only a timer's own free that finds it busy is tried again soon,
// blockSetRetry). Tried again in the same Register, a set whose read-ahead
// outlived the wait for it would be waited for again, round after round,
// with a.registerMu held. Guarded by a.mu.
type triedSets map[*engineSet]bool

// errFallbackKept is swapFallback's answer where the fallback set could
// not be freed after the new set was made: the new set is freed again, and
// the Register is given the fallback.
var errFallbackKept = errors.New("fabric: the fallback set is busy: kept")

// swapFallback makes the new set (made, of tmpl placed as place; unmade
// frees one made, saying its message where the pool does not; prepare,
// nil for none, makes what can fail of its memory for engines before its
// room is) and frees keep, the engine's idle fallback set, to bring the
// engine within its quota (makeRoomInQuota's swap), never leaving the
// engine with neither, and freeing no other set where keep's memory is
// room enough: made is tried first with keep standing and nothing freed,
// keep freed once the new set exists, its memory for engines made too
// (setMaker: where that fails, made frees the set again and answers
// setMemoryError, returned here with keep untouched, and the Register is
// given keep); where the pool has no room and the set would fit once
// keep's memory is free (pool.Pool.FitsFreeing), keep is freed and the
// set made in its room; only where it would not are other idle sets freed
// (those may allows, as freeIdleSets does), until it fits once keep is
// freed, and none where it would not fit even with all of them and keep
// freed; before the first set is freed so (not where it fits nowhere),
// prepare makes the memory's files (its setMemoryError returned likewise,
// nothing freed); a set made once keep is freed whose memory's placing
// then fails (a mapping, or its page lock: setMemoryError, the set freed
// again) leaves the Register without keep, whose memory was the room:
// newSetForSession makes its choice anew, and where no set is made then
// either makes keep's set again in its room, empty (giveLostFallback),
// the engine told the error only where that fails too. Where the set does
// not fit the error is pool.ErrOutOfMemory, keep untouched; where keep
// cannot be freed (it found a user meanwhile, or is busy: a peer's lease;
// or a slot of it was retired since it was looked at, which the pool's
// free sees and refuses, pool.Pool.ReclaimBlockSet, where its memory
// would be withheld and the new set, to be made in its room, fit nowhere)
// a new set made beside it is freed again, and errFallbackKept returned,
// keep standing. keep is claimed throughout (engineSet.claim): no session
// takes it up while other sets are freed, which may let go of a.mu; and
// before any other set is freed keep is checked free of blocks in use and
// copies below, the pool's reasons to refuse it (fallbackFree), so that
// no set is freed for a swap that would find keep busy, but for a lease
// or an allocation in keep that comes after that check (a peer's lease,
// or a call still in flight of a session that ended or dropped keep: the
// claim keeps sessions out, not the pool's callers). Such a late one
// costs the swap only: the pool looks at keep's slots and leases under
// the set's lock as it frees it, and refuses, changing nothing, so keep
// is kept whole and given (errFallbackKept), its leased blocks served as
// they are, and the allocated slot the call's, given back as the call
// finds its use of keep done (sessionSet.hold), as in any set shared with
// another session; what is lost is the other idle sets freed for the swap
// (their cached blocks; their room stays free), and the new set. No claim
// inside the pool is taken for it: leases and allocations do not wait on
// a Register. Where a.mu was let go since the claim (a.relocks), the
// quota may have shrunk meanwhile (without engine_quota, another engine
// taking up a set): keep is freed only where the new set, of need bytes,
// keeps engine within it once keep is gone (withinQuotaFreeing), else a
// new set made is freed again and errFallbackKept returned; once keep is
// freed, the new set is the engine's, whatever the quota says since (its
// caller does not free it again). tried is makeRoomInQuota's; keep goes
// into it where it is not freed (freeFallbackLocked). a.mu is held: no
// other set is made meanwhile, so FitsFreeing's answer holds, and keep's
// room is there once it is freed (the pool frees it for room only with no
// slot retired, pool.Pool.ReclaimBlockSet).
func (a *Agent) swapFallback(engine string, need uint64, tmpl *layout.Layout, place []int, made func() (*pool.BlockSet, error), unmade func(*pool.BlockSet, string), prepare func() error, may func(*engineSet) bool, keep *engineSet, tried triedSets) (*pool.BlockSet, error) {
	if !claimFallback(keep) {
		return nil, errFallbackKept // taken up or freed since makeRoomInQuota looked
	}
	defer unclaimFallback(keep)
	claimed := a.relocks
	// mayFreeKeep says whether keep may be freed for the new set: the
	// quota read again where a.mu was let go since the claim.
	mayFreeKeep := func() bool {
		return claimed == a.relocks || a.withinQuotaFreeing(engine, need, keep)
	}
	fits := func() (*pool.BlockSet, error) {
		ok, err := a.pool.FitsFreeing(tmpl, place, keep.set.ID())
		if err == nil && !ok {
			err = pool.ErrOutOfMemory
		}
		return nil, err
	}
	// ready makes what can fail of the new set's memory, where it is to be
	// made only once keep, or more, is freed: before anything is.
	ready := func() error {
		if prepare == nil {
			return nil
		}
		return prepare()
	}
	set, err := made()
	if errors.Is(err, pool.ErrOutOfMemory) {
		if _, err = fits(); errors.Is(err, pool.ErrOutOfMemory) {
			// Other sets freed until the set fits once keep is freed;
			// none where it would not fit even once all were.
			ids := []pool.SetID{keep.set.ID()}
			for _, es := range a.sets {
				es.mu.Lock()
				idle, orphaned := es != keep && len(es.users) == 0 && !es.freed, es.orphaned
				es.mu.Unlock()
				if idle && !tried[es] && (orphaned || may(es)) {
					ids = append(ids, es.set.ID())
				}
			}
			if ok, ferr := a.pool.FitsFreeing(tmpl, place, ids...); ferr == nil && ok {
				if !fallbackFree(keep) {
					return nil, errFallbackKept
				}
				if err := ready(); err != nil {
					return nil, err
				}
				_, err = a.freeIdleSets(fits, may, keep, tried)
			}
		}
		if err == nil {
			if !mayFreeKeep() {
				return nil, errFallbackKept
			}
			if err := ready(); err != nil {
				return nil, err
			}
			if !a.freeFallbackLocked(keep, tried) {
				return nil, errFallbackKept
			}
			// keep is gone: whatever may allows goes before the engine
			// is left with no set.
			return a.freeIdleSets(made, may, nil, tried)
		}
		// Else it fits nowhere: not beside keep either, with less room.
	}
	if err != nil {
		return nil, err
	}
	if mayFreeKeep() && a.freeFallbackLocked(keep, tried) {
		return set, nil
	}
	unmade(set, "block set made to replace a fallback set not freed")
	return nil, errFallbackKept
}

// freeFallbackLocked frees keep, swapFallback's fallback set, and says
// whether it is gone: freed here, or by another (its grace timer) while
// freeIdleLocked let go of a.mu. Where it is not (taken up, busy, or a
// slot of it retired), keep goes into tried (nil for none): the Register
// is to be given it, not swap it again, nor wait for it again where its
// read-ahead outlived the wait, round after round. a.mu is held.
func (a *Agent) freeFallbackLocked(keep *engineSet, tried triedSets) bool {
	freed, _ := a.freeIdleLocked(keep, 0)
	if !freed && !setFreed(keep) && tried != nil {
		tried[keep] = true // not swapped again (makeRoomInQuota)
	}
	return freed || setFreed(keep)
}

// claimFallback claims keep, idle, for swapFallback (engineSet.claim), or
// says it is taken up or freed already.
func claimFallback(keep *engineSet) bool {
	keep.mu.Lock()
	defer keep.mu.Unlock()
	if keep.freed || len(keep.users) > 0 {
		return false
	}
	keep.claim = make(chan struct{})
	return true
}

// unclaimFallback ends claimFallback's claim: sessions that named keep
// meanwhile attach it, or find it freed.
func unclaimFallback(keep *engineSet) {
	keep.mu.Lock()
	defer keep.mu.Unlock()
	close(keep.claim)
	keep.claim = nil
}

// fallbackFree says whether the pool would free keep now, as far as it
// can be told without freeing it: no slot allocated, no block referenced
// or leased, and no copy below under way (with copies down, those its
// blocks need are started, as FreeBlockSet would).
func fallbackFree(keep *engineSet) bool {
	m := keep.set.Metrics()
	return m.Active == 0 && m.Leases == 0 && keep.set.CopyDown() == 0
}
