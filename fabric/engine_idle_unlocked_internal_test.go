package fabric

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/pool"
)

// freeByTimer frees es as its grace timer does when it fires: a timer of
// its latest generation, under the agent's lock.
func freeByTimer(t *testing.T, a *Agent, es *engineSet) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	es.mu.Lock()
	es.timerGen++
	gen := es.timerGen
	es.mu.Unlock()
	if freed, unlocked := a.freeIdleLocked(es, gen); !freed || unlocked {
		t.Errorf("set %d not freed by its timer (freed %v, unlocked %v)", es.set.ID(), freed, unlocked)
	}
}

// whileWaited makes every free for room let go of the agent's lock as it
// does while an idle set's read-ahead ends, and, while it waits for
// waited the first time, frees gone by its grace timer.
func whileWaited(t *testing.T, a *Agent, waited, gone *engineSet) *bool {
	done := new(bool)
	a.cfg.hooks.idleUnlocked = func(es *engineSet) {
		if es == waited && !*done {
			*done = true
			freeByTimer(t, a, gone)
		}
	}
	return done
}

// relayout makes es's set again, of as many bytes, in pages of 32 tokens
// rather than belowLayout's 16: a layout no Register of belowLayout's
// joins.
func relayout(t *testing.T, a *Agent, es *engineSet) {
	t.Helper()
	n := setBytes(es.set)
	if err := a.pool.FreeBlockSet(es.set.ID()); err != nil {
		t.Fatal(err)
	}
	delete(a.sets, es.set.ID())
	l := belowLayout(int(n >> 11))
	l.PageSize = 32
	set, err := a.pool.NewBlockSet(l)
	if err != nil {
		t.Fatal(err)
	}
	if setBytes(set) != n {
		t.Fatalf("set made again of %d bytes, want %d", setBytes(set), n)
	}
	es.set = set
	a.sets[set.ID()] = es
}

// held says whether the pool still holds es's set.
func held(a *Agent, es *engineSet) bool {
	_, err := a.pool.BlockSet(es.set.ID())
	return err == nil
}

// Where the set a free for room within an engine's quota waits for is
// freed meanwhile by its grace timer, the engine's sets are counted anew:
// the room is there, so no other set is freed and the quota does not
// refuse.
func TestQuotaRecountedWhenAWaitedSetIsFreedByItsTimer(t *testing.T) {
	const (
		waited = iota
		other
		inUse
	)
	a, sets := quotaAgent(t, quotaSet{"e", 4, false}, quotaSet{"e", 2, false}, quotaSet{"e", 2, true})
	a.cfg.EngineQuota = 8 << 20 // 8 MiB taken, 4 more asked: within only once the 4 MiB set is freed
	done := whileWaited(t, a, sets[waited], sets[waited])
	a.mu.Lock()
	_, swap, err := a.makeRoomInQuota("e", 4<<20, nil, nil)
	a.mu.Unlock()
	if !*done {
		t.Fatal("the free for room did not wait for the longest idle set")
	}
	if err != nil || swap {
		t.Fatalf("room within the quota once the waited set was freed by its timer: swap %v, %v", swap, err)
	}
	for i, want := range []bool{false, true, true} {
		if held(a, sets[i]) != want {
			t.Errorf("set %d held %v, want %v", i, !want, want)
		}
	}
	// Past the quota even so, it still refuses.
	a.mu.Lock()
	_, _, err = a.makeRoomInQuota("e", 8<<20, nil, nil)
	a.mu.Unlock()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("8 MiB more with 4 MiB of the 8 MiB quota in use: %v, want RESOURCE_EXHAUSTED", err)
	}
}

// Where the set freeIdleSets waits for is freed meanwhile by its grace
// timer, the new set is tried again: its room is there.
func TestIdleSetsTriedAgainWhenAWaitedSetIsFreedByItsTimer(t *testing.T) {
	// 10 MiB in use, then 4 MiB idle and 2 MiB free after it.
	a, sets := quotaAgent(t, quotaSet{"f", 8, true}, quotaSet{"e", 2, true}, quotaSet{"e", 4, false})
	done := whileWaited(t, a, sets[2], sets[2])
	tmpl := belowLayout(6 << 10)
	a.mu.Lock()
	set, err := a.freeIdleSets(func() (*pool.BlockSet, error) { return a.pool.NewBlockSetOn(tmpl, nil) },
		func(es *engineSet) bool { return es.engine == "e" }, nil, nil)
	a.mu.Unlock()
	if !*done {
		t.Fatal("freeIdleSets did not wait for the idle set")
	}
	if err != nil || set == nil {
		t.Fatalf("a 6 MiB set with the idle 4 MiB set freed by its timer: %v", err)
	}
}

// Where swapFallback's fallback is freed by its grace timer while it is
// being freed (its read-ahead waited for), the fallback is gone as the
// swap wanted: the new set is given, not freed again with the fallback
// gone too.
func TestQuotaSwapFallbackFreedByItsTimer(t *testing.T) {
	for _, tc := range []struct {
		desc            string
		orphanMB, newMB int
	}{
		{"the new set made beside the fallback", 2, 4},
		{"the new set made in the fallback's room", 6, 6},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			a, sets := quotaAgent(t, quotaSet{"", tc.orphanMB, false}, quotaSet{"f", 4, true}, quotaSet{"e", 4, false})
			keep := sets[2]
			done := whileWaited(t, a, keep, keep)
			tmpl := belowLayout(tc.newMB << 10)
			a.mu.Lock()
			set, err := a.swapFallback("e", uint64(tc.newMB)<<20, tmpl, nil, func() (*pool.BlockSet, error) { return a.pool.NewBlockSetOn(tmpl, nil) }, a.freeUnused, nil,
				func(es *engineSet) bool { return es.engine == "e" }, keep, nil)
			a.mu.Unlock()
			if !*done {
				t.Fatal("the fallback was not waited for")
			}
			if err != nil || set == nil {
				t.Fatalf("the fallback freed by its timer: %v, want the new set", err)
			}
			if _, err := a.pool.BlockSet(set.ID()); err != nil {
				t.Fatalf("the new set given is not held: %v", err)
			}
			if !held(a, sets[0]) {
				t.Error("the orphan was freed, though the fallback's room was enough")
			}
		})
	}
}

// A Register that frees an idle set for room, while its fallback set (or
// the set it waits for) is freed by its grace timer, never hands back a
// freed set: where the waited set went, the new set is made in its room;
// where the fallback went and no new set fits, the next best set of the
// layout is attached, or, with none, the quota refuses; where the
// Register's session took up another set of the layout meanwhile, that
// set is attached.
func TestRegisterNeverGivesASetFreedWhileItWaited(t *testing.T) {
	const (
		inUse = iota
		fallback
		other
		waited
	)
	for _, tc := range []struct {
		desc  string
		gone  int // the set freed by its timer while the Register waits
		newMB int
		want  int // the set attached, -1 for a new one
		freed []int
	}{
		{"the waited set freed by its timer", waited, 5, -1, []int{waited}},
		{"the fallback freed by its timer", fallback, 8, other, []int{waited, fallback}},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// f's 8 MiB in use, e's idle 2 MiB (the layout's fallback,
			// all its slots usable), g's 1 MiB in use (fewer slots), e's
			// idle 4 MiB, 1 MiB free: the new set (the default count) of
			// 5 MiB fits in the waited set's room and the free MiB after
			// it; one of 8 MiB fits nowhere, not with the fallback's room
			// either.
			a, sets := quotaAgent(t, quotaSet{"f", 8, true}, quotaSet{"e", 2, false}, quotaSet{"g", 1, true}, quotaSet{"e", 4, false})
			// f's set and the waited set are of another layout (pages of
			// 32 tokens), each made again in its room.
			for _, es := range []*engineSet{sets[inUse], sets[waited]} {
				relayout(t, a, es)
			}
			a.cfg.EngineQuota = 16 << 20
			a.cfg.BlockSetSlots = tc.newMB << 10
			done := whileWaited(t, a, sets[waited], sets[tc.gone])
			sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
			tmpl := belowLayout(0)
			ss, err := a.blockSetForSession(sess, "e", tmpl, nil, 0)
			if !*done {
				t.Fatalf("the Register did not wait for the idle set (%v)", err)
			}
			if err != nil {
				t.Fatalf("register of %d MiB: %v", tc.newMB, err)
			}
			if setFreed(ss.engineSet) || !held(a, ss.engineSet) {
				t.Fatalf("given set %d, freed", ss.engineSet.set.ID())
			}
			if tc.want < 0 {
				for i, es := range sets {
					if ss.engineSet == es {
						t.Fatalf("given set %d, not a new one", i)
					}
				}
				if got := ss.engineSet.set.Slots(); got != tc.newMB<<10 {
					t.Errorf("new set of %d slots, want %d", got, tc.newMB<<10)
				}
			} else if ss.engineSet != sets[tc.want] {
				t.Fatalf("given set %d, want set %d", ss.engineSet.set.ID(), sets[tc.want].set.ID())
			}
			for i, es := range sets {
				want := false
				for _, f := range tc.freed {
					want = want || f == i
				}
				if held(a, es) == want {
					t.Errorf("set %d freed %v, want %v", i, !held(a, es), want)
				}
			}
		})
	}

	// e's 2 MiB in use and idle 4 MiB (pages of 32 tokens), its idle 2
	// MiB the fallback, within a quota of 8 MiB; 4 MiB asked. While the
	// Register waits for the 4 MiB set, the fallback is freed by its timer
	// and another session takes the 4 MiB set up: with the quota's room
	// not there and the layout left with no set, the quota refuses.
	t.Run("the fallback freed and no other set of the layout", func(t *testing.T) {
		const (
			inUse = iota
			waited
			fallback
		)
		a, sets := quotaAgent(t, quotaSet{"e", 2, true}, quotaSet{"e", 4, false}, quotaSet{"e", 2, false})
		for _, es := range []*engineSet{sets[inUse], sets[waited]} {
			relayout(t, a, es)
		}
		a.cfg.EngineQuota = 8 << 20
		a.cfg.BlockSetSlots = 4 << 10
		done := new(bool)
		a.cfg.hooks.idleUnlocked = func(es *engineSet) {
			if es == sets[waited] && !*done {
				*done = true
				freeByTimer(t, a, sets[fallback])
				takeUp(a, sets[waited], 9)
			}
		}
		sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
		ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
		if !*done {
			t.Fatalf("the Register did not wait for the idle set (%v)", err)
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("register of 4 MiB past the quota, the fallback freed: set %v, %v; want RESOURCE_EXHAUSTED", ss, err)
		}
		for i, want := range []bool{true, true, false} {
			if held(a, sets[i]) != want {
				t.Errorf("set %d held %v, want %v", i, !want, want)
			}
		}
	})

	// While the Register waits, the fallback is freed by its timer and
	// the Register's session takes up another set of the layout (the
	// engine's other rank registered it): that set is given, no new set
	// made, though one would fit once a set gone idle meanwhile is freed.
	t.Run("the fallback freed and the session using another set of the layout", func(t *testing.T) {
		const (
			inUse = iota
			waited
			other // g's, the set the Register's session takes up
			goesIdle
			fallback
		)
		// f's 7 MiB in use, e's idle 4 MiB, g's 1 MiB in use, e's 2 MiB
		// in use, e's idle 2 MiB (the fallback), no MiB free: the new set
		// of 3 MiB fits only once the set that goes idle and the fallback
		// are both freed.
		a, sets := quotaAgent(t, quotaSet{"f", 7, true}, quotaSet{"e", 4, false}, quotaSet{"g", 1, true},
			quotaSet{"e", 2, true}, quotaSet{"e", 2, false})
		for _, es := range []*engineSet{sets[inUse], sets[waited], sets[goesIdle]} {
			relayout(t, a, es)
		}
		a.cfg.EngineQuota = 16 << 20
		a.cfg.BlockSetSlots = 3 << 10
		sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
		done := new(bool)
		a.cfg.hooks.idleUnlocked = func(es *engineSet) {
			if es == sets[waited] && !*done {
				*done = true
				freeByTimer(t, a, sets[fallback])
				takeUp(a, sets[waited], 9)
				a.mu.Lock()
				defer a.mu.Unlock()
				if _, err := a.attach(sess, sets[other]); err != nil {
					t.Error(err)
				}
				ge := sets[goesIdle]
				ge.mu.Lock()
				ge.users = map[uint64]*setUse{}
				ge.idleSince = time.Now()
				ge.mu.Unlock()
			}
		}
		ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
		if !*done {
			t.Fatalf("the Register did not wait for the idle set (%v)", err)
		}
		if err != nil {
			t.Fatalf("register with the session using a set of the layout: %v", err)
		}
		if ss.engineSet != sets[other] {
			t.Fatalf("given set %d (%d slots), want set %d, the one the session uses", ss.engineSet.set.ID(),
				ss.engineSet.set.Slots(), sets[other].set.ID())
		}
		for i, want := range []bool{true, true, true, true, false} {
			if held(a, sets[i]) != want {
				t.Errorf("set %d held %v, want %v", i, !want, want)
			}
		}
	})
}

// takeUp makes session id a user of es, as a Register of another session
// does.
func takeUp(a *Agent, es *engineSet, id uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	es.mu.Lock()
	defer es.mu.Unlock()
	es.users[id] = &setUse{}
	es.idleSince = time.Time{}
}

// A swap that must free another idle set besides the fallback claims the
// fallback first: a session that names the fallback while the other set
// is freed (its read-ahead waited for) does not take it up, so the other
// set is not freed in vain; the session waits for the swap and finds the
// fallback freed.
func TestQuotaSwapClaimsTheFallbackBeforeFreeingAnother(t *testing.T) {
	const (
		active = iota
		orphan
		keep
	)
	// f's 4 MiB in use, the orphan's 6, the engine's idle 4 MiB (the
	// fallback), 2 MiB free: a new set of 10 MiB fits only once the orphan
	// and the fallback are both freed.
	a, sets := quotaAgent(t, quotaSet{"f", 4, true}, quotaSet{"", 6, false}, quotaSet{"e", 4, false})
	k := sets[keep]
	sess := &session{id: 9, engine: "e", sets: map[pool.SetID]*engineSet{}}
	var attachErr, waitErr error
	done := new(bool)
	a.cfg.hooks.idleUnlocked = func(es *engineSet) {
		if es == sets[orphan] && !*done {
			*done = true
			_, attachErr = a.attach(sess, k)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, waitErr = a.attachUnclaimed(ctx, sess, k)
		}
	}
	tmpl := belowLayout(10 << 10)
	a.mu.Lock()
	a.cfg.EngineQuota = 12 << 20 // within it once the fallback is freed
	set, err := a.swapFallback("e", 10<<20, tmpl, nil, func() (*pool.BlockSet, error) { return a.pool.NewBlockSetOn(tmpl, nil) }, a.freeUnused, nil,
		func(es *engineSet) bool { return es.engine == "e" }, k, nil)
	a.mu.Unlock()
	if !*done {
		t.Fatal("the orphan was not waited for")
	}
	var claimed *setClaimedError
	if !errors.As(attachErr, &claimed) {
		t.Fatalf("a session took up the fallback while the swap freed the orphan (%v)", attachErr)
	}
	if status.Code(waitErr) != codes.Canceled {
		t.Errorf("a call naming the claimed fallback, its context cancelled: %v, want CANCELED", waitErr)
	}
	if err != nil || set == nil {
		t.Fatalf("swap with the orphan and the fallback freed: %v, want the new set", err)
	}
	for i, want := range []bool{true, false, false} {
		if held(a, sets[i]) != want {
			t.Errorf("set %d held %v, want %v", i, !want, want)
		}
	}
	// The session's call, which waits out the claim, finds it freed.
	if _, err := a.attachUnclaimed(context.Background(), sess, k); status.Code(err) != codes.NotFound {
		t.Fatalf("the fallback named after the swap: %v, want NOT_FOUND", err)
	}
}

// Which other engines' idle sets a new set may free is read anew after a
// free for room let go of the agent's lock: an engine over its fair share
// when the quota's answer was made, and within it once a set was freed
// meanwhile, keeps its other idle set. freeIdleSets, which listed the sets
// it may free before it waited, goes no further with that list.
func TestQuotaFairSharesReadAgainAfterAWait(t *testing.T) {
	const (
		inUse = iota
		waited
		kept
		gone
	)
	// e's 4 MiB in use, g's idle 2 and 4 MiB, h's idle 2 MiB, 4 MiB free:
	// with three engines a fair share is 16/3 MiB, and g's 6 are past it;
	// once h's set is freed by its timer (h gone) and g's 2 MiB for room,
	// the share is 8 MiB and g's 4 within it. A new set of 8 MiB fits only
	// once g's 4 MiB set too is freed.
	newAgent := func(t *testing.T) (*Agent, []*engineSet, *bool) {
		a, sets := quotaAgent(t, quotaSet{"e", 4, true}, quotaSet{"g", 2, false}, quotaSet{"g", 4, false}, quotaSet{"h", 2, false})
		return a, sets, whileWaited(t, a, sets[waited], sets[gone])
	}
	t.Run("the quota's answer", func(t *testing.T) {
		a, sets, done := newAgent(t)
		a.mu.Lock()
		defer a.mu.Unlock()
		may, swap, err := a.makeRoomInQuota("e", 8<<20, nil, nil)
		if err != nil || swap {
			t.Fatalf("8 MiB within the quota of 16: swap %v, %v", swap, err)
		}
		if !may(sets[kept]) {
			t.Fatal("g's set may not be freed with g past its fair share")
		}
		if freed, unlocked := a.freeIdleLocked(sets[waited], 0); !freed || !unlocked || !*done {
			t.Fatalf("g's 2 MiB set freed %v after a wait %v", freed, unlocked)
		}
		if may(sets[kept]) {
			t.Error("g's set may be freed with g within its fair share since")
		}
		if !may(sets[inUse]) {
			t.Error("e's own set may not be freed")
		}
	})
	t.Run("freeIdleSets", func(t *testing.T) {
		a, sets, done := newAgent(t)
		tmpl := belowLayout(8 << 10)
		a.mu.Lock()
		may, swap, err := a.makeRoomInQuota("e", 8<<20, nil, nil)
		if err != nil || swap {
			a.mu.Unlock()
			t.Fatalf("8 MiB within the quota of 16: swap %v, %v", swap, err)
		}
		set, err := a.freeIdleSets(func() (*pool.BlockSet, error) { return a.pool.NewBlockSetOn(tmpl, nil) }, may, nil, nil)
		a.mu.Unlock()
		if !*done {
			t.Fatal("freeIdleSets did not wait for g's longest idle set")
		}
		if !errors.Is(err, pool.ErrOutOfMemory) || set != nil {
			t.Fatalf("a new set of 8 MiB with g within its fair share: %v, want pool.ErrOutOfMemory", err)
		}
		for i, want := range []bool{true, false, true, false} {
			if held(a, sets[i]) != want {
				t.Errorf("set %d held %v, want %v", i, !want, want)
			}
		}
	})
}

// A Register whose new set does not fit after it waited for an idle set
// freed for room looks at the idle sets again: one a session dropped
// meanwhile is freed for the new set where the first was not room enough.
func TestRegisterLooksAtIdleSetsAgainAfterAWait(t *testing.T) {
	const (
		inUse = iota
		waited
		goesIdle
	)
	// f's 8 MiB in use, e's idle 4 MiB, e's 2 MiB in use, 2 MiB free
	// (none of them of the Register's layout): a new set of 8 MiB fits
	// once both of e's sets are freed.
	a, sets := quotaAgent(t, quotaSet{"f", 8, true}, quotaSet{"e", 4, false}, quotaSet{"e", 2, true})
	for _, es := range sets {
		relayout(t, a, es)
	}
	a.cfg.EngineQuota = 16 << 20
	a.cfg.BlockSetSlots = 8 << 10
	done := new(bool)
	a.cfg.hooks.idleUnlocked = func(es *engineSet) {
		if es == sets[waited] && !*done {
			*done = true
			a.mu.Lock()
			defer a.mu.Unlock()
			ge := sets[goesIdle]
			ge.mu.Lock()
			ge.users = map[uint64]*setUse{}
			ge.idleSince = time.Now()
			ge.mu.Unlock()
		}
	}
	sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
	ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
	if !*done {
		t.Fatalf("the Register did not wait for the idle set (%v)", err)
	}
	if err != nil {
		t.Fatalf("register of 8 MiB with e's sets idle: %v", err)
	}
	if got := ss.engineSet.set.Slots(); got != 8<<10 {
		t.Errorf("new set of %d slots, want %d", got, 8<<10)
	}
	for i, want := range []bool{true, false, false} {
		if held(a, sets[i]) != want {
			t.Errorf("set %d held %v, want %v", i, !want, want)
		}
	}
}

// Without engine_quota, the quota of an engine is the pool divided among
// the engines using sets: where another engine takes up its set while a
// Register waits for an idle set freed for room, the quota shrinks, and
// the new set, made after the wait, is checked against it: past it, the
// Register is refused, not given a set that overruns it.
func TestRegisterChecksTheSoftQuotaAgainAfterAWait(t *testing.T) {
	const (
		inUse = iota
		other
		waited
	)
	// e's 4 MiB in use, g's idle 4 MiB, e's idle 2 MiB, 6 MiB free: with
	// e alone using sets its quota is the pool's 16 MiB, and a new set of
	// 8 MiB fits once e's idle set is freed. g takes its set up meanwhile:
	// the quota is 8 MiB, and e's 4 and 8 are past it.
	a, sets := quotaAgent(t, quotaSet{"e", 4, true}, quotaSet{"g", 4, false}, quotaSet{"e", 2, false})
	for _, es := range sets {
		relayout(t, a, es) // none of them the Register's fallback
	}
	a.cfg.BlockSetSlots = 8 << 10
	done := new(bool)
	a.cfg.hooks.idleUnlocked = func(es *engineSet) {
		if es == sets[waited] && !*done {
			*done = true
			takeUp(a, sets[other], 9)
		}
	}
	sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
	ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
	if !*done {
		t.Fatalf("the Register did not wait for the idle set (%v)", err)
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("register of 8 MiB with 4 of a quota of 8 in use: set %v, %v; want RESOURCE_EXHAUSTED", ss, err)
	}
	if got := len(a.pool.BlockSets()); got != 2 {
		t.Errorf("the pool holds %d sets, want 2 (e's in use and g's)", got)
	}
}

// A Register that makes its new set after it waited for an idle set freed
// for room, where its session took up another set of the layout meanwhile
// (the engine's other rank registered it), gives that set: the new one is
// freed again, and the engine's ranks share one set.
func TestRegisterGivesTheSetItsSessionTookUpWhileItWaited(t *testing.T) {
	const (
		inUse = iota
		waited
		other // g's, the set the Register's session takes up
		inUseToo
		fallback
	)
	// f's 7 MiB in use, e's idle 4 MiB, g's 1 MiB in use, e's 2 MiB in
	// use, e's idle 2 MiB (the fallback), no MiB free: the new set of 3
	// MiB fits in the waited set's room.
	a, sets := quotaAgent(t, quotaSet{"f", 7, true}, quotaSet{"e", 4, false}, quotaSet{"g", 1, true},
		quotaSet{"e", 2, true}, quotaSet{"e", 2, false})
	for _, es := range []*engineSet{sets[inUse], sets[waited], sets[inUseToo]} {
		relayout(t, a, es)
	}
	a.cfg.EngineQuota = 16 << 20
	a.cfg.BlockSetSlots = 3 << 10
	sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
	done := new(bool)
	a.cfg.hooks.idleUnlocked = func(es *engineSet) {
		if es == sets[waited] && !*done {
			*done = true
			if _, err := a.attach(sess, sets[other]); err != nil {
				t.Error(err)
			}
		}
	}
	ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
	if !*done {
		t.Fatalf("the Register did not wait for the idle set (%v)", err)
	}
	if err != nil {
		t.Fatalf("register with the session using a set of the layout: %v", err)
	}
	if ss.engineSet != sets[other] {
		t.Fatalf("given set %d (%d slots), want set %d, the one the session uses", ss.engineSet.set.ID(),
			ss.engineSet.set.Slots(), sets[other].set.ID())
	}
	if got := len(a.pool.BlockSets()); got != 4 {
		t.Errorf("the pool holds %d sets, want 4 (the waited set freed, no new one)", got)
	}
}

// A quota's swap that let go of the agent's lock while it freed another
// set for room checks the quota again before it frees the fallback: where
// another engine took up a set meanwhile (without engine_quota its quota
// shrinks), the new set would be past it, so the fallback is kept and
// given, never freed for a set then dropped, leaving the engine neither.
// Where the quota shrinks only while the fallback itself is freed (its
// read-ahead waited for), the new set is given: the fallback is gone.
func TestQuotaSwapKeepsTheFallbackWhereTheQuotaShrankMeanwhile(t *testing.T) {
	const (
		inUse = iota
		other // g's, taken up while the Register waits
		orphan
		keep
	)
	for _, tc := range []struct {
		desc   string
		waited int  // the set whose wait g's set is taken up in
		swap   bool // the new set given, the fallback freed
	}{
		{"while the orphan is freed", orphan, false},
		{"while the fallback is freed", keep, true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// e's 2 MiB in use, g's idle 1 MiB, a 4 MiB orphan, e's idle
			// 4 MiB (the layout's fallback, fewer slots than asked), 5 MiB
			// free: with e alone using sets its quota is the pool's 16
			// MiB, and a new set of 12 MiB is within it only once the
			// fallback is freed (a swap), and fits only once the orphan is
			// freed too. g takes its set up meanwhile: the quota is 8 MiB,
			// and e's 2 and 12 past it.
			a, sets := quotaAgent(t, quotaSet{"e", 2, true}, quotaSet{"g", 1, false}, quotaSet{"", 4, false}, quotaSet{"e", 4, false})
			for _, es := range sets[:keep] {
				relayout(t, a, es)
			}
			a.cfg.BlockSetSlots = 12 << 10
			done := new(bool)
			a.cfg.hooks.idleUnlocked = func(es *engineSet) {
				if es == sets[tc.waited] && !*done {
					*done = true
					takeUp(a, sets[other], 9)
				}
			}
			sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
			ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
			if !*done {
				t.Fatalf("the Register did not wait for set %d (%v)", tc.waited, err)
			}
			if err != nil {
				t.Fatalf("register of 12 MiB past the quota since, with a fallback: %v, want a set", err)
			}
			if !tc.swap && (ss.engineSet != sets[keep] || !held(a, sets[keep])) {
				t.Fatalf("given set %d (%d slots, held %v), want the fallback, set %d", ss.engineSet.set.ID(),
					ss.engineSet.set.Slots(), held(a, ss.engineSet), sets[keep].set.ID())
			}
			if tc.swap && (ss.engineSet.set.Slots() != 12<<10 || !held(a, ss.engineSet) || held(a, sets[keep])) {
				t.Fatalf("given set %d (%d slots, held %v), the fallback held %v; want the new set, the fallback freed",
					ss.engineSet.set.ID(), ss.engineSet.set.Slots(), held(a, ss.engineSet), held(a, sets[keep]))
			}
			if got := len(a.pool.BlockSets()); got != 3 {
				t.Errorf("the pool holds %d sets, want 3 (the orphan freed, the fallback or the new set)", got)
			}
		})
	}
}

// A Register whose free for room waits for an idle set that stays busy
// after the wait (a read-ahead that outlived it, here a slot allocated)
// does not try that set again: it ends, with the pool out of memory,
// rather than wait for it round after round, holding every other
// Register back.
func TestRegisterDoesNotRetryASetBusyAfterItsWait(t *testing.T) {
	const (
		inUse = iota
		busy
		other
	)
	// e's 4 MiB in use, e's idle 4 MiB with a slot allocated, f's 4 MiB
	// in use, 4 MiB free: a new set of 8 MiB is within the quota of 16
	// and fits only once the busy set is freed.
	a, sets := quotaAgent(t, quotaSet{"e", 4, true}, quotaSet{"e", 4, false}, quotaSet{"f", 4, true})
	for _, es := range sets {
		relayout(t, a, es)
	}
	if _, err := sets[busy].set.Allocate(1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		b := sets[busy]
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.freeTimer != nil {
			b.freeTimer.Stop() // its timer, if any
		}
	})
	a.cfg.EngineQuota = 16 << 20
	a.cfg.BlockSetSlots = 8 << 10
	const most = 20
	waits, rounds := 0, 0
	a.cfg.hooks.registerRound = func() { rounds++ }
	a.cfg.hooks.idleUnlocked = func(es *engineSet) {
		if es != sets[busy] {
			return
		}
		if waits++; waits == most {
			takeUp(a, es, 9) // ends a Register that would wait on
		}
	}
	sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
	ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
	if waits != 1 || rounds > 2 {
		t.Fatalf("the Register waited %d times for the busy set in %d rounds, want once in 2 at most", waits, rounds)
	}
	if !errors.Is(err, pool.ErrOutOfMemory) {
		t.Fatalf("register of 8 MiB with the only idle set busy: set %v, %v; want pool.ErrOutOfMemory", ss, err)
	}
	if !held(a, sets[busy]) || len(a.pool.BlockSets()) != 3 {
		t.Errorf("the pool holds %d sets, want the 3 it had", len(a.pool.BlockSets()))
	}
}

// doneCalled is a context that says, on waiting, when Done is first
// asked for: attachUnclaimed asks only once it found its set claimed.
type doneCalled struct {
	context.Context
	once    sync.Once
	waiting chan struct{}
}

func (c *doneCalled) Done() <-chan struct{} {
	c.once.Do(func() { close(c.waiting) })
	return c.Context.Done()
}

// An engine call that names the quota's fallback while the swap frees
// another set for room waits for the swap, and wakes when it ends: it
// finds the fallback freed where the new set was made, and attaches it
// where the swap kept it (a block of it in use by then), the fallback
// usable again.
func TestQuotaSwapWakesTheCallsWaitingForItsFallback(t *testing.T) {
	const (
		active = iota
		orphan
		keep
	)
	for _, tc := range []struct {
		desc string
		busy bool // a slot of the fallback allocated while the orphan is freed
	}{
		{"the fallback freed", false},
		{"the fallback kept", true},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// f's 4 MiB in use, the orphan's 6, the engine's idle 4 MiB
			// (the fallback), 2 MiB free: a new set of 10 MiB fits only
			// once the orphan and the fallback are both freed.
			a, sets := quotaAgent(t, quotaSet{"f", 4, true}, quotaSet{"", 6, false}, quotaSet{"e", 4, false})
			a.cfg.EngineQuota = 12 << 20
			k := sets[keep]
			t.Cleanup(func() {
				a.mu.Lock()
				defer a.mu.Unlock()
				k.mu.Lock()
				defer k.mu.Unlock()
				if k.freeTimer != nil {
					k.freeTimer.Stop() // its timer, if any
				}
			})
			sess := &session{id: 9, engine: "e", sets: map[pool.SetID]*engineSet{}}
			type result struct {
				ss  *sessionSet
				err error
			}
			woke := make(chan result, 1)
			done := new(bool)
			a.cfg.hooks.idleUnlocked = func(es *engineSet) {
				if es != sets[orphan] || *done {
					return
				}
				*done = true
				if tc.busy {
					if _, err := k.set.Allocate(1); err != nil {
						t.Error(err)
					}
				}
				ctx := &doneCalled{Context: context.Background(), waiting: make(chan struct{})}
				go func() {
					ss, err := a.attachUnclaimed(ctx, sess, k)
					woke <- result{ss, err}
				}()
				select {
				case <-ctx.waiting:
				case r := <-woke:
					t.Errorf("a call naming the claimed fallback did not wait: %v", r.err)
				case <-time.After(10 * time.Second):
					t.Error("a call naming the claimed fallback neither waited nor ended")
				}
			}
			tmpl := belowLayout(10 << 10)
			a.mu.Lock()
			set, err := a.swapFallback("e", 10<<20, tmpl, nil, func() (*pool.BlockSet, error) { return a.pool.NewBlockSetOn(tmpl, nil) }, a.freeUnused, nil,
				func(es *engineSet) bool { return es.engine == "e" }, k, nil)
			a.mu.Unlock()
			if !*done {
				t.Fatal("the orphan was not waited for")
			}
			if tc.busy != errors.Is(err, errFallbackKept) || tc.busy == (set != nil) {
				t.Fatalf("swap: set %v, %v; want the fallback kept %v", set != nil, err, tc.busy)
			}
			var r result
			select {
			case r = <-woke:
			case <-time.After(10 * time.Second):
				t.Fatal("the call waiting for the claimed fallback did not wake when the swap ended")
			}
			if !tc.busy {
				if status.Code(r.err) != codes.NotFound {
					t.Fatalf("the call waiting for the fallback, freed: %v, want NOT_FOUND", r.err)
				}
				return
			}
			if r.err != nil || r.ss.engineSet != k || !held(a, k) {
				t.Fatalf("the call waiting for the fallback, kept: %v, want it attached", r.err)
			}
			if _, ok := sess.sets[k.set.ID()]; !ok {
				t.Error("the session does not use the fallback it attached")
			}
		})
	}
}

// A quota's swap that frees the fallback to make the new set in its room
// frees it only where its memory comes back: where a slot of it is
// retired between the last look at it and its free (a device read-ahead's
// upload that outlived the wait for it, found unsynced), the pool would
// withhold its memory, and the new set, which fitted only in that room,
// would fit nowhere, the engine left with neither set. The fallback is
// kept and given instead, its cached blocks with it.
func TestQuotaSwapKeepsAFallbackRetiredAsItIsFreed(t *testing.T) {
	const (
		inUse = iota
		inUseToo
		keep
	)
	// f's 8 MiB in use, e's 2 MiB in use, e's idle 4 MiB (the layout's
	// fallback, fewer slots than asked), 2 MiB free: a new set of 6 MiB is
	// within e's quota of 10 MiB only once the fallback is freed (a swap),
	// and fits only in the fallback's room.
	a, sets := quotaAgent(t, quotaSet{"f", 8, true}, quotaSet{"e", 2, true}, quotaSet{"e", 4, false})
	for _, es := range sets[:keep] {
		relayout(t, a, es)
	}
	a.cfg.EngineQuota = 10 << 20
	a.cfg.BlockSetSlots = 6 << 10
	k := sets[keep]
	var blk pool.Block
	waited, retired := false, false
	a.cfg.hooks.idleUnlocked = func(es *engineSet) {
		if es != k || waited {
			return
		}
		waited = true
		// The read-ahead's slot, its upload under way past the wait.
		bs, err := k.set.Allocate(1)
		if err != nil {
			t.Error(err)
			return
		}
		blk = bs[0]
	}
	a.cfg.hooks.beforeSetFree = func(es *engineSet) {
		if es != k || !waited || retired {
			return
		}
		retired = true
		if err := k.set.Retire(blk); err != nil {
			t.Error(err)
		}
	}
	sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
	ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
	if !waited || !retired {
		t.Fatalf("the fallback was not waited for (%v) and retired in (%v): %v", waited, retired, err)
	}
	if err != nil {
		t.Fatalf("register with the fallback's slot retired as it was freed: %v, want the fallback (held %v)", err, held(a, k))
	}
	if ss.engineSet != k || !held(a, k) {
		t.Fatalf("given set %d (%d slots, held %v), want the fallback, set %d", ss.engineSet.set.ID(),
			ss.engineSet.set.Slots(), held(a, ss.engineSet), k.set.ID())
	}
	if got := len(a.pool.BlockSets()); got != 3 {
		t.Errorf("the pool holds %d sets, want the 3 it had", got)
	}
}

// A free for room never frees an idle set with retired slots, and does not
// wait for its read-ahead either, the agent's lock let go and a Register
// held back for nothing: the set is kept as it is (the pool would refuse
// it too, pool.Pool.ReclaimBlockSet, but only after the wait).
func TestFreeForRoomKeepsARetiredSetWithoutWaiting(t *testing.T) {
	a, sets := quotaAgent(t, quotaSet{"e", 4, false})
	es := sets[0]
	bs, err := es.set.Allocate(1)
	if err != nil {
		t.Fatal(err)
	}
	if err := es.set.Retire(bs[0]); err != nil {
		t.Fatal(err)
	}
	waited := false
	a.cfg.hooks.idleUnlocked = func(*engineSet) { waited = true }
	a.mu.Lock()
	freed, unlocked := a.freeIdleLocked(es, 0)
	a.mu.Unlock()
	if freed || !held(a, es) {
		t.Fatal("an idle set with a retired slot was freed for room")
	}
	if unlocked || waited {
		t.Errorf("the free for room of a set with a retired slot let go of the agent's lock (%v) to wait for its read-ahead (%v)", unlocked, waited)
	}
}

// A Register whose quota's swap waits for the fallback's read-ahead and
// finds the fallback busy still (a read-ahead that outlived the wait,
// here a slot allocated) swaps no more: it is given the fallback, rather
// than make a new set beside it, wait for it and free the new set again
// round after round, holding every other Register back.
func TestRegisterDoesNotRetryAFallbackBusyAfterItsWait(t *testing.T) {
	const (
		inUse = iota
		keep
		other
	)
	// e's 2 MiB in use, e's idle 4 MiB with a slot allocated (the layout's
	// fallback, fewer slots than asked), f's 4 MiB in use, 6 MiB free: a
	// new set of 6 MiB is within e's quota of 10 MiB only once the fallback
	// is freed (a swap), and fits beside it.
	a, sets := quotaAgent(t, quotaSet{"e", 2, true}, quotaSet{"e", 4, false}, quotaSet{"f", 4, true})
	relayout(t, a, sets[inUse])
	relayout(t, a, sets[other])
	k := sets[keep]
	if _, err := k.set.Allocate(1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.freeTimer != nil {
			k.freeTimer.Stop() // its retry, where the Register did not take it up
		}
	})
	a.cfg.EngineQuota = 10 << 20
	a.cfg.BlockSetSlots = 6 << 10
	const most = 20
	waits, rounds := 0, 0
	a.cfg.hooks.registerRound = func() { rounds++ }
	a.cfg.hooks.idleUnlocked = func(es *engineSet) {
		if es != k {
			return
		}
		if waits++; waits == most {
			takeUp(a, es, 9) // ends a Register that would wait on
		}
	}
	sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
	ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
	if waits != 1 || rounds > 2 {
		t.Fatalf("the Register waited %d times for the busy fallback in %d rounds, want once in 2 at most", waits, rounds)
	}
	if err != nil || ss.engineSet != k {
		t.Fatalf("register with the fallback busy after its wait: %v, want the fallback", err)
	}
	if !held(a, k) || len(a.pool.BlockSets()) != 3 {
		t.Errorf("the pool holds %d sets (the fallback held: %v), want the 3 it had, the fallback among them", len(a.pool.BlockSets()), held(a, k))
	}
}

// An idle set that a free for room finds busy (a peer's lease, here a
// slot allocated) keeps its grace timer as it was: not replaced by the
// busy set's retry, which would free it (or keep it as an orphan) about a
// second later, its cached blocks lost early where the Register went on
// without its room. Its timer's own free that finds it busy is still
// tried again soon.
func TestIdleSetBusyForRoomKeepsItsGraceTimer(t *testing.T) {
	const (
		inUse = iota
		busy
	)
	// 12 MiB in use, 4 MiB idle and busy: a new set of 8 MiB fits only
	// once the busy set is freed.
	a, sets := quotaAgent(t, quotaSet{"e", 12, true}, quotaSet{"e", 4, false})
	a.cfg.NoOrphanCache = true // a retry's free would free it
	b := sets[busy]
	if _, err := b.set.Allocate(1); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	a.scheduleFree(b, time.Minute) // its grace period, as detach starts it
	grace, gen := b.freeTimer, b.timerGen
	b.mu.Unlock()
	t.Cleanup(func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.freeTimer != nil {
			b.freeTimer.Stop()
		}
	})
	tmpl := belowLayout(8 << 10)
	a.mu.Lock()
	set, err := a.freeIdleSets(func() (*pool.BlockSet, error) { return a.pool.NewBlockSetOn(tmpl, nil) },
		func(es *engineSet) bool { return es.engine == "e" }, nil, nil)
	a.mu.Unlock()
	if !errors.Is(err, pool.ErrOutOfMemory) || set != nil {
		t.Fatalf("an 8 MiB set with the only idle set busy: set %v, %v; want pool.ErrOutOfMemory", set != nil, err)
	}
	if !held(a, b) {
		t.Fatal("the busy idle set was freed")
	}
	b.mu.Lock()
	kept, keptGen := b.freeTimer == grace, b.timerGen == gen
	b.mu.Unlock()
	if !kept || !keptGen {
		t.Fatalf("the busy set's grace timer replaced by a free for room (same timer %v, same generation %v): a retry would free it in %v, not at its grace's end", kept, keptGen, blockSetRetry)
	}
	// Stopped here, it had not fired nor been stopped: still pending.
	a.mu.Lock()
	b.mu.Lock()
	pending := grace.Stop()
	b.mu.Unlock()
	a.mu.Unlock()
	if !pending {
		t.Fatal("the busy set's grace timer stopped by a free for room")
	}
	// Its timer's own free, busy, is tried again after blockSetRetry.
	a.mu.Lock()
	b.mu.Lock()
	b.freeTimer = nil
	gen = b.timerGen
	b.mu.Unlock()
	freed, _ := a.freeIdleLocked(b, gen)
	b.mu.Lock()
	retried := b.freeTimer != nil && b.timerGen != gen
	b.mu.Unlock()
	a.mu.Unlock()
	if freed || !retried {
		t.Fatalf("the busy set's timer free: freed %v, retry scheduled %v; want kept and tried again", freed, retried)
	}
}

// A Register that let go of the agent's lock for an idle set's read-ahead
// looks at the layout's sets anew before it gives the fallback it chose
// before the wait, or a new set made after it: where its session took up another set of
// the layout meanwhile (its engine's other rank registered it), that set
// is given; where another process's session took up the fallback
// meanwhile, the fallback, no longer one the Register's process may map
// (engineSet.mayJoin), is not given: the next best set of the layout is.
// So where the quota refuses once the engine's own idle set is freed for
// room (the fallback taken up meanwhile: with it idle, a need within the
// quota is always within it by a swap for the fallback once the others
// are freed, and a need past the quota on its own frees nothing, waits
// for nothing), where that set's room is there but the new set's memory
// for engines cannot be made, and where a new set is made within the
// quota once the engine's idle set was freed.
func TestRegisterLooksAtTheLayoutsSetsAgainAfterAWait(t *testing.T) {
	const (
		inUse = iota
		fallback
		other // g's, in use: the set the session takes up, or the next best
		waited
	)
	for _, tc := range []struct {
		desc     string
		quotaMB  int  // the engine's quota
		memFails bool // the new set's memory for engines fails
		// sessionTakesUp: the Register's session takes up other while it
		// waits; else another process's session takes up the fallback.
		sessionTakesUp bool
	}{
		{"within the quota once the engine's idle set is freed, the session using another set of the layout", 8, false, true},
		{"past the quota, the fallback taken up by another process", 6, false, false},
		{"the new set's memory failing, the session using another set of the layout", 16, true, true},
		{"the new set's memory failing, the fallback taken up by another process", 16, true, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// f's 8 MiB in use, e's idle 2 MiB (the layout's fallback,
			// fewer slots than asked), g's 1 MiB in use (fewer still),
			// e's idle 4 MiB, 1 MiB free: the new set of 5 MiB fits once
			// the waited set is freed; within a quota of 16 MiB, within
			// one of 8 MiB only once the waited set is freed, within one
			// of 6 MiB neither with it freed nor, the fallback taken up,
			// by a swap for the fallback.
			a, sets := quotaAgent(t, quotaSet{"f", 8, true}, quotaSet{"e", 2, false}, quotaSet{"g", 1, true}, quotaSet{"e", 4, false})
			for _, es := range []*engineSet{sets[inUse], sets[waited]} {
				relayout(t, a, es)
			}
			a.cfg.EngineQuota = int64(tc.quotaMB) << 20
			a.cfg.BlockSetSlots = 5 << 10
			h, ok := a.storages[0].(*pool.HostStorage)
			if !ok {
				t.Fatalf("storage %T, want host storage", a.storages[0])
			}
			a.host, a.isolated, a.memTokens = h, true, map[[32]byte]memoryRef{}
			failed := 0
			a.cfg.hooks.setMemory = func(bool, []*pool.Section) error {
				if !tc.memFails {
					return nil
				}
				failed++
				return errors.New("no memory for engines")
			}
			fb := sets[fallback]
			t.Cleanup(func() {
				fb.mu.Lock()
				defer fb.mu.Unlock()
				for _, fd := range fb.receivers {
					if fd >= 0 {
						unix.Close(fd)
					}
				}
			})
			sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
			done := new(bool)
			a.cfg.hooks.idleUnlocked = func(es *engineSet) {
				if es != sets[waited] || *done {
					return
				}
				*done = true
				if !tc.sessionTakesUp {
					// This test's process stands for the other engine.
					takeUp(a, fb, 9)
					a.handedTo(fb, int32(os.Getpid()))
					return
				}
				a.mu.Lock()
				defer a.mu.Unlock()
				if _, err := a.attach(sess, sets[other]); err != nil {
					t.Error(err)
				}
			}
			// The Register's process: another live one.
			ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, int32(os.Getppid()))
			if !*done {
				t.Fatalf("the Register did not wait for the idle set (%v)", err)
			}
			if tc.memFails && failed == 0 {
				t.Fatalf("no new set's memory failed: %v", err)
			}
			if err != nil {
				t.Fatalf("register: %v, want set %d", err, sets[other].set.ID())
			}
			if ss.engineSet != sets[other] {
				t.Fatalf("given set %d (%d slots), want set %d (the fallback: set %d)", ss.engineSet.set.ID(),
					ss.engineSet.set.Slots(), sets[other].set.ID(), fb.set.ID())
			}
			for i, want := range []bool{true, true, true, false} {
				if held(a, sets[i]) != want {
					t.Errorf("set %d held %v, want %v", i, !want, want)
				}
			}
			if got := len(a.pool.BlockSets()); got != 3 {
				t.Errorf("the pool holds %d sets, want 3 (the waited set freed, no new set)", got)
			}
			if len(a.memTokens) != 0 {
				t.Errorf("%d memory tokens name sets not made", len(a.memTokens))
			}
		})
	}
}

// A Register with no set of the layout to fall back to, which the quota
// refuses after it let go of the agent's lock to free the engine's own
// idle set for room, looks again at the layout's sets before it refuses,
// as one with a fallback does: where its session took up a set of the
// layout meanwhile (its engine's other rank registered it), that set is
// given; where a set of the layout it may join appeared meanwhile, with
// fewer slots than asked, it is given as the fallback is where the quota
// refuses.
func TestRegisterWithoutAFallbackLooksAgainAfterAWait(t *testing.T) {
	const (
		inUse = iota
		waited
	)
	for _, tc := range []struct {
		desc string
		// sessionTakesUp: the Register's session takes up the set that
		// appears; else another session uses it.
		sessionTakesUp bool
	}{
		{"the session using a set of the layout made meanwhile", true},
		{"a set of the layout made meanwhile for another session", false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// e's 8 MiB in use, e's idle 4 MiB, 4 MiB free, both of
			// another layout (pages of 32 tokens): no set of the layout
			// asked for. 5 MiB asked, within a quota of 6 MiB on its
			// own, past it even once the idle set is freed (8 MiB in
			// use).
			a, sets := quotaAgent(t, quotaSet{"e", 8, true}, quotaSet{"e", 4, false})
			for _, es := range sets {
				relayout(t, a, es)
			}
			a.cfg.EngineQuota = 6 << 20
			a.cfg.BlockSetSlots = 5 << 10
			sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
			var made *engineSet
			a.cfg.hooks.idleUnlocked = func(es *engineSet) {
				if es != sets[waited] || made != nil {
					return
				}
				a.mu.Lock()
				defer a.mu.Unlock()
				set, err := a.pool.NewBlockSet(belowLayout(1 << 10))
				if err != nil {
					t.Error(err)
					return
				}
				made = &engineSet{set: set, engine: "g", users: map[uint64]*setUse{}}
				a.sets[set.ID()] = made
				if !tc.sessionTakesUp {
					made.users[9] = &setUse{}
					return
				}
				if _, err := a.attach(sess, made); err != nil {
					t.Error(err)
				}
			}
			ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
			if made == nil {
				t.Fatalf("the Register did not wait for the idle set (%v)", err)
			}
			if err != nil {
				t.Fatalf("register past the quota, a set of the layout made while it waited: %v, want set %d", err, made.set.ID())
			}
			if ss.engineSet != made {
				t.Fatalf("given set %d (%d slots), want set %d, made while the Register waited", ss.engineSet.set.ID(),
					ss.engineSet.set.Slots(), made.set.ID())
			}
			if held(a, sets[waited]) || !held(a, sets[inUse]) {
				t.Errorf("the idle set held %v, the set in use held %v; want the idle set freed", held(a, sets[waited]), held(a, sets[inUse]))
			}
			if got := len(a.pool.BlockSets()); got != 2 {
				t.Errorf("the pool holds %d sets, want 2 (no new set)", got)
			}
		})
	}
}
