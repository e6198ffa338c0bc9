package fabric

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// quotaSet is a block set of mib MiB (blocks of 1 KiB, belowLayout),
// made by the engine named, idle (an orphan where the engine is ""), or
// in use.
type quotaSet struct {
	engine string
	mib    int
	inUse  bool
}

// quotaAgent is an agent with a pool of 16 MiB and the sets carved from
// it in order, the first idle the longest.
func quotaAgent(t *testing.T, sets ...quotaSet) (*Agent, []*engineSet) {
	t.Helper()
	storage, p := hostPool(t, 16<<20, "quota-test", pool.Config{ExpiryInterval: -1})
	a := &Agent{log: slog.New(slog.DiscardHandler), pool: p, storages: []pool.Storage{storage}, sets: map[pool.SetID]*engineSet{}}
	var out []*engineSet
	for i, s := range sets {
		set, err := p.NewBlockSet(belowLayout(s.mib << 10))
		if err != nil {
			t.Fatalf("set %d of %d MiB: %v", i, s.mib, err)
		}
		es := &engineSet{set: set, engine: s.engine, users: map[uint64]*setUse{},
			idleSince: time.Now().Add(time.Duration(i-len(sets)) * time.Minute), orphaned: s.engine == ""}
		if s.inUse {
			es.users[1] = &setUse{}
		}
		a.sets[set.ID()] = es
		out = append(out, es)
	}
	return a, out
}

// An engine's new set that fits once its idle fallback set is freed
// (within its quota only so) is made in that set's room: no other set is
// freed for it where the fallback's room is enough (not an orphan, which
// freeIdleSets frees first of all); another idle set is freed only where
// the fallback's room is not enough; where the set fits nowhere, even
// with every idle set it may free freed, none is freed, and the fallback
// stays; and where the fallback is busy (a peer's lease on one of its
// blocks) once the new set is made, or before, the new set is freed again
// and the fallback kept (errFallbackKept), never the engine left with
// neither, and no other set freed for a swap that cannot be made. The new
// set's memory files (prepare) are made before the first set is freed for
// it, and only where one is to be.
func TestQuotaSwapFreesOnlyWhatTheNewSetNeeds(t *testing.T) {
	const (
		orphan = iota
		active
		keep
	)
	for _, tc := range []struct {
		desc        string
		activeFirst bool // the set in use carved first, the orphan next to the fallback
		orphanMB    int  // the orphan's size
		keepMB      int
		newMB       int
		busy        string // "", "before" (keep busy from the start), "after" (once the new set is made)
		made        bool   // the new set made
		err         error
		freed       []int // of orphan, active, keep
		// prepared: the new set's memory files made before a set is
		// freed for it (prepare); not where nothing is to be freed.
		prepared bool
	}{
		{"fits in the fallback's room", false, 6, 4, 6, "", true, nil, []int{keep}, true},
		{"fits beside the fallback", false, 2, 4, 4, "", true, nil, []int{keep}, false},
		{"fits once the orphan too is freed", true, 6, 4, 10, "", true, nil, []int{orphan, keep}, true},
		{"fits nowhere", false, 6, 4, 10, "", false, pool.ErrOutOfMemory, nil, false},
		{"the fallback busy once the new set is made", false, 2, 4, 4, "after", false, errFallbackKept, nil, false},
		{"the fallback busy, the new set in its room", false, 6, 4, 6, "before", false, errFallbackKept, nil, true},
		{"the fallback busy, the new set fits once the orphan too is freed", true, 6, 4, 10, "before", false, errFallbackKept, nil, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// The orphan first, then another engine's set in use, then the
			// engine's fallback, then what is left free.
			o, f, e := quotaSet{"", tc.orphanMB, false}, quotaSet{"f", 4, true}, quotaSet{"e", tc.keepMB, false}
			var a *Agent
			var sets []*engineSet
			if tc.activeFirst {
				a, sets = quotaAgent(t, f, o, e)
				sets[orphan], sets[active] = sets[active], sets[orphan]
			} else {
				a, sets = quotaAgent(t, o, f, e)
			}
			k := sets[keep]
			if tc.busy == "before" {
				if _, err := k.set.Allocate(1); err != nil {
					t.Fatal(err)
				}
			}
			tmpl := belowLayout(tc.newMB << 10)
			var made *pool.BlockSet
			mk := func() (*pool.BlockSet, error) {
				s, err := a.pool.NewBlockSetOn(tmpl, nil)
				if err == nil {
					made = s
					if tc.busy == "after" {
						if _, err := k.set.Allocate(1); err != nil {
							t.Error(err)
						}
					}
				}
				return s, err
			}
			may := func(es *engineSet) bool { return es.engine == "e" }
			prepared := false
			prepare := func() error {
				if prepared {
					return nil // made once, as setMaker.prepare
				}
				for _, es := range sets {
					if !held(a, es) {
						t.Errorf("the new set's memory files made once set %d was freed", es.set.ID())
					}
				}
				prepared = true
				return nil
			}
			a.mu.Lock()
			set, err := a.swapFallback("e", uint64(tc.newMB)<<20, tmpl, nil, mk, a.freeUnused, prepare, may, k, nil)
			a.mu.Unlock()
			if (set != nil) != tc.made || !errors.Is(err, tc.err) {
				t.Fatalf("new set %v, %v; want made %v, %v", set != nil, err, tc.made, tc.err)
			}
			if prepared != tc.prepared {
				t.Errorf("the new set's memory files made: %v, want %v", prepared, tc.prepared)
			}
			for i, es := range sets {
				want := false
				for _, f := range tc.freed {
					want = want || f == i
				}
				if _, err := a.pool.BlockSet(es.set.ID()); (err != nil) != want {
					t.Errorf("set %d freed: %v, want %v", i, err != nil, want)
				}
			}
			if made != nil && set == nil {
				if _, err := a.pool.BlockSet(made.ID()); err == nil {
					t.Error("the new set, not given, is still held")
				}
			}
		})
	}
}

// A Register whose new set is within the engine's quota only once its
// idle fallback set is freed (the quota's swap), and whose new set's
// memory for engines cannot be made, keeps the fallback, its cache with
// it: the engine is given the fallback, never an error with neither set.
// Where the new set fits beside the fallback, its memory is made whole,
// files and placing, before the fallback is freed; where it fits only in
// the fallback's room, its memory's files are made before the fallback is
// freed (a memory file or its access failing keeps the fallback), and
// only their placing (a mapping failing) comes after: the Register tries
// the new set once more in the room now free, its memory made whole, and
// where that fails too it makes the fallback's set again there, empty,
// and gives it; where that set's memory fails as well, the engine is told
// the error, which names the fallback freed: it has neither set, and its
// next Register makes the new set in that room. Either way nothing leaks:
// the new set's pool memory and its sections go back, and no token names
// them.
func TestQuotaSwapKeepsTheFallbackWhereTheNewSetsMemoryFails(t *testing.T) {
	beside := []quotaSet{{"e", 2, true}, {"f", 4, true}, {"e", 4, false}} // 6 MiB free: the new set of 6 MiB fits beside the fallback
	inRoom := []quotaSet{{"f", 8, true}, {"e", 2, true}, {"e", 4, false}} // 2 MiB free: it fits only in the fallback's room
	for _, tc := range []struct {
		desc   string
		sets   []quotaSet // the last one the engine's idle fallback
		placed bool       // the memory fails as its sections are placed, else as their files are made
		// bigOnly: only the memory of a set bigger than the fallback fails.
		bigOnly bool
		// keep: the fallback given; remade: the fallback freed, and made
		// again, empty, and given; else the error, the fallback freed.
		keep, remade bool
	}{
		{"fits beside the fallback, its memory's files fail", beside, false, false, true, false},
		{"fits beside the fallback, its memory's placing fails", beside, true, false, true, false},
		{"fits in the fallback's room, its memory's files fail", inRoom, false, false, true, false},
		{"fits in the fallback's room, its memory's placing fails, the fallback's does not", inRoom, true, true, false, true},
		{"fits in the fallback's room, its memory's placing fails, the fallback's too", inRoom, true, false, false, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			a, sets := quotaAgent(t, tc.sets...)
			keep := len(sets) - 1
			for _, es := range sets[:keep] {
				relayout(t, a, es)
			}
			h, ok := a.storages[0].(*pool.HostStorage)
			if !ok {
				t.Fatalf("storage %T, want host storage", a.storages[0])
			}
			a.host, a.isolated, a.memTokens = h, true, map[[32]byte]memoryRef{}
			a.cfg.EngineQuota = 10 << 20 // 6 MiB in the engine's sets, 6 more asked: within only once the fallback is freed
			a.cfg.BlockSetSlots = 6 << 10
			k := sets[keep]
			var secs []*pool.Section
			failed := 0
			a.cfg.hooks.setMemory = func(placed bool, s []*pool.Section) error {
				secs = append(secs, s...)
				if placed != tc.placed || tc.bigOnly && s[0].Size() <= setBytes(k.set) {
					return nil
				}
				failed++
				return errors.New("no memory for engines")
			}
			free := uint64(16 << 20)
			for _, es := range sets {
				free -= setBytes(es.set)
			}
			sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
			ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
			if failed == 0 {
				t.Fatalf("no new set's memory failed: %v", err)
			}
			var given *engineSet // a set made, with its memory open
			switch {
			case tc.keep:
				if err != nil || ss.engineSet != k || !held(a, k) || setFreed(k) {
					t.Fatalf("register with the new set's memory failing: %v (held %v), want the fallback, set %d", err, held(a, k), k.set.ID())
				}
				if got := len(a.pool.BlockSets()); got != 3 {
					t.Errorf("the pool holds %d sets, want the 3 it had", got)
				}
				k.mu.Lock()
				claimed := k.claim != nil
				k.mu.Unlock()
				if claimed {
					t.Error("the fallback is still claimed by the swap")
				}
			case tc.remade:
				if err != nil {
					t.Fatalf("register with the new set's memory failing in the fallback's room: %v, want the fallback made again", err)
				}
				es := ss.engineSet
				given = es
				if failed != 2 {
					t.Errorf("the new set's memory failed %d times, want twice: in the swap, then once more in the room freed", failed)
				}
				if held(a, k) || a.sets[k.set.ID()] != nil {
					t.Fatal("the fallback, freed for the new set's room, is still held")
				}
				if es == k || !held(a, es) || es.set.Slots() != k.set.Slots() || es.set.Layout().Digest() != k.set.Layout().Digest() ||
					es.set.Metrics().Registered != 0 || len(es.mem) != 1 {
					t.Fatalf("given set %d of %d slots (%d blocks, %d sections); want a new set like the fallback, set %d of %d slots, empty, with its memory",
						es.set.ID(), es.set.Slots(), es.set.Metrics().Registered, len(es.mem), k.set.ID(), k.set.Slots())
				}
			default:
				named := fmt.Sprintf("block set %d of the layout, freed for the new set's room", k.set.ID())
				if err == nil || !strings.Contains(err.Error(), "no memory for engines") || !strings.Contains(err.Error(), named) {
					t.Fatalf("register with the new set's memory failing, the fallback freed for its room: %v, want that error, naming the fallback freed", err)
				}
				if failed != 3 {
					t.Errorf("the memory failed %d times, want 3: the new set's in the swap, then once more in the room freed, then the fallback's made again there", failed)
				}
				if held(a, k) || a.sets[k.set.ID()] != nil {
					t.Fatal("the fallback, freed for the new set's room, is still held")
				}
				free += setBytes(k.set)
			}
			if got := len(a.sets); got != len(a.pool.BlockSets()) {
				t.Errorf("the agent knows %d sets, the pool holds %d", got, len(a.pool.BlockSets()))
			}
			tokens := 0
			if given != nil {
				t.Cleanup(func() {
					given.mu.Lock()
					defer given.mu.Unlock()
					a.dropSetMemoryLocked(given)
				})
				tokens = len(given.mem)
			}
			for _, s := range secs {
				if s.FD() >= 0 && (given == nil || !slices.ContainsFunc(given.mem, func(m *setMemory) bool { return m.sec == s })) {
					t.Errorf("section at %d of a set not made still open", s.Offset())
				}
			}
			if len(a.memTokens) != tokens {
				t.Errorf("%d memory tokens, want %d: none names a set not made", len(a.memTokens), tokens)
			}
			// The pool's free memory is what it was (the fallback's
			// added where it went, not where it was made again in its
			// room): a set of all of it fits.
			if ok, err := a.pool.FitsFreeing(belowLayout(int(free>>10)), nil); !ok || err != nil {
				t.Errorf("a set of the %d bytes free does not fit: %v", free, err)
			}
			if tc.keep || tc.remade {
				return
			}
			// The engine registers again, its memory made this time: the
			// new set, in the room the fallback left.
			a.cfg.hooks.setMemory = nil
			ss, err = a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
			if err != nil {
				t.Fatalf("register again: %v", err)
			}
			t.Cleanup(func() {
				es := ss.engineSet
				es.mu.Lock()
				defer es.mu.Unlock()
				a.dropSetMemoryLocked(es)
			})
			if got := ss.engineSet.set.Slots(); got != 6<<10 || len(ss.engineSet.mem) != 1 || len(a.memTokens) != 1 {
				t.Errorf("registered again: a set of %d slots, %d sections, %d memory tokens; want %d slots, its 1 section and token",
					got, len(ss.engineSet.mem), len(a.memTokens), 6<<10)
			}
		})
	}
}

// A Register whose quota swap freed its fallback set for the new set's
// room, the new set's memory then failing there, and whose next round
// ends without a set made, not for the memory but refused by the quota
// (shrunk meanwhile) or out of memory (the room taken meanwhile), still
// makes the fallback's set again, empty, and gives it where it is within
// the quota and fits; where it does not, the engine is told the round's
// error, which names the fallback as freed. Never the plain error with
// neither set and the fallback not named.
func TestQuotaSwapRemakesTheFallbackWhereALaterRoundFindsNoRoom(t *testing.T) {
	// shape is a layout's digest with its regions' addresses left out:
	// where the room was taken meanwhile, the set made again lies
	// elsewhere.
	shape := func(l *layout.Layout) layout.Digest {
		l = l.Clone()
		for i := range l.Regions {
			l.Regions[i].Base = 0
		}
		return l.Digest()
	}
	for _, tc := range []struct {
		desc  string
		quota int64 // the engine's quota from the second round on, 0 for as it was
		taken int   // MiB of the pool taken from the second round on, by no engine's set
		// remade: the fallback made again and given; else the error,
		// which is err (nil: any), with code (OK: any).
		remade bool
		err    error
		code   codes.Code
	}{
		{"refused by the quota, the fallback within it", 7 << 20, 0, true, nil, codes.OK},
		{"refused by the quota, the fallback past it too", 5 << 20, 0, false, nil, codes.ResourceExhausted},
		{"out of memory, the fallback fits", 0, 2, true, nil, codes.OK},
		{"out of memory, the fallback does not fit", 0, 6, false, pool.ErrOutOfMemory, codes.OK},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			// 2 MiB free: the new set of 6 MiB fits only in the fallback's
			// room, and the quota of 10 MiB has room for it only once the
			// fallback is freed.
			a, sets := quotaAgent(t, quotaSet{"f", 8, true}, quotaSet{"e", 2, true}, quotaSet{"e", 4, false})
			keep := len(sets) - 1
			for _, es := range sets[:keep] {
				relayout(t, a, es)
			}
			h, ok := a.storages[0].(*pool.HostStorage)
			if !ok {
				t.Fatalf("storage %T, want host storage", a.storages[0])
			}
			a.host, a.isolated, a.memTokens = h, true, map[[32]byte]memoryRef{}
			a.cfg.EngineQuota = 10 << 20
			a.cfg.BlockSetSlots = 6 << 10
			k := sets[keep]
			failed := 0
			a.cfg.hooks.setMemory = func(placed bool, s []*pool.Section) error {
				if !placed || s[0].Size() <= setBytes(k.set) {
					return nil
				}
				failed++ // the new set's, placed in the fallback's room
				return errors.New("no memory for engines")
			}
			rounds := 0
			a.cfg.hooks.registerRound = func() {
				if rounds++; rounds != 2 {
					return
				}
				if tc.quota != 0 {
					a.cfg.EngineQuota = tc.quota
				}
				if tc.taken != 0 {
					if _, err := a.pool.NewBlockSet(belowLayout(tc.taken << 10)); err != nil {
						t.Errorf("take %d MiB of the pool: %v", tc.taken, err)
					}
				}
			}
			sess := &session{id: 7, engine: "e", sets: map[pool.SetID]*engineSet{}}
			ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, 0)
			if failed != 1 || rounds < 2 {
				t.Fatalf("the new set's memory failed %d times in %d rounds, want once, then another round: %v", failed, rounds, err)
			}
			if held(a, k) || a.sets[k.set.ID()] != nil {
				t.Fatal("the fallback, freed for the new set's room, is still held")
			}
			tokens := 0
			if tc.remade {
				if err != nil {
					t.Fatalf("register: %v, want the fallback made again", err)
				}
				es := ss.engineSet
				t.Cleanup(func() {
					es.mu.Lock()
					defer es.mu.Unlock()
					a.dropSetMemoryLocked(es)
				})
				if es == k || !held(a, es) || es.set.Slots() != k.set.Slots() || shape(es.set.Layout()) != shape(k.set.Layout()) ||
					es.set.Metrics().Registered != 0 || len(es.mem) != 1 {
					t.Fatalf("given set %d of %d slots (%d blocks, %d sections); want a new set like the fallback, set %d of %d slots, empty, with its memory",
						es.set.ID(), es.set.Slots(), es.set.Metrics().Registered, len(es.mem), k.set.ID(), k.set.Slots())
				}
				tokens = 1
			} else {
				named := fmt.Sprintf("block set %d of the layout, freed for the new set's room", k.set.ID())
				if err == nil || !strings.Contains(err.Error(), named) {
					t.Fatalf("register: %v, want the round's error, naming the fallback freed", err)
				}
				if tc.err != nil && !errors.Is(err, tc.err) {
					t.Errorf("register: %v, want %v", err, tc.err)
				}
				if got := status.Code(err); tc.code != codes.OK && got != tc.code {
					t.Errorf("register: code %v, want %v", got, tc.code)
				}
			}
			if got := len(a.memTokens); got != tokens {
				t.Errorf("%d memory tokens, want %d: none names a set not made", got, tokens)
			}
		})
	}
}

// The quota's tests compare without a sum that wraps: a need just under
// 2^64 added to what the engine's sets take (2 MiB) wrapped to less than
// 2 MiB, within the quota of 16 MiB, whether the engine's sets are taken
// as they are (withinQuota) or with one freed (withinQuotaFreeing); and
// makeRoomInQuota refuses a need past the quota on its own before it
// frees anything, the engine's idle sets kept.
func TestQuotaSumsDoNotWrap(t *testing.T) {
	a, sets := quotaAgent(t, quotaSet{"e", 1, false}, quotaSet{"e", 1, false})
	a.mu.Lock()
	defer a.mu.Unlock()
	const wraps = 1<<64 - 16384
	if a.withinQuota("e", wraps) {
		t.Errorf("withinQuota of 2^64 - 16,384 bytes beside 2 MiB: true")
	}
	if a.withinQuotaFreeing("e", wraps, sets[1]) {
		t.Errorf("withinQuotaFreeing of 2^64 - 16,384 bytes beside 1 MiB: true")
	}
	if !a.withinQuota("e", 14<<20) || a.withinQuota("e", 14<<20+1) {
		t.Errorf("withinQuota at the quota's 14 MiB left, and one byte past: want true, false")
	}
	for _, need := range []uint64{wraps, 17 << 20} {
		_, _, err := a.makeRoomInQuota("e", need, nil, nil)
		if err == nil || !strings.Contains(err.Error(), "past its quota") {
			t.Errorf("makeRoomInQuota of %d bytes: %v, want past its quota", need, err)
		}
		for i, es := range sets {
			if setFreed(es) {
				t.Fatalf("makeRoomInQuota of %d bytes past the quota of 16 MiB freed idle set %d", need, i)
			}
		}
	}
}
