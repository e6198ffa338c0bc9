package fabric_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// holdStaller stalls, at the agent's hook fabric.BeforeHold, a hold of a
// session armed for it (the first, or the one stallAt names) until that
// session has ended.
type holdStaller struct {
	mu    sync.Mutex
	armed map[uint64]*stalledSession
}

func (h *holdStaller) hold(session uint64) {
	h.mu.Lock()
	s := h.armed[session]
	if s != nil {
		if s.holds++; s.holds < s.at {
			s = nil // a hold that goes through
		} else {
			delete(h.armed, session)
		}
	}
	h.mu.Unlock()
	if s == nil {
		return
	}
	close(s.reached)
	select {
	case <-s.ended:
	case <-time.After(time.Minute): // never ended: the test fails on its answer
	}
}

// stalledSession is a raw session of an engine that keeps it alive until
// one of its calls stalls (as a long step or a paused process stalls
// the engine), then falls silent past the keepalive bound.
type stalledSession struct {
	t       *testing.T
	h       *holdStaller
	api     fabricpb.EngineClient
	id      uint64
	at      int           // the hold to stall at, counted from 1 once armed
	holds   int           // the holds since armed (holdStaller.mu)
	reached chan struct{} // closed as the stalled call reaches its hold
	ended   chan struct{} // closed once the agent ended the session
	endErr  error         // the stream's end, once ended is closed
}

// open opens a session on a and keeps it alive until the call it stalls
// reaches its hold.
func (h *holdStaller) open(t *testing.T, ctx context.Context, a *fabric.Agent, keepalive time.Duration) *stalledSession {
	t.Helper()
	api, stream, ev := rawSession(t, ctx, a.EngineSocket())
	s := &stalledSession{t: t, h: h, api: api, id: ev.Session, reached: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				s.endErr = err
				close(s.ended)
				return
			}
		}
	}()
	go func() {
		tick := time.NewTicker(keepalive / 4)
		defer tick.Stop()
		for {
			select {
			case <-s.reached:
				return
			case <-s.ended:
				return
			case <-tick.C:
				if stream.Send(&fabricpb.SessionRequest{}) != nil {
					return
				}
			}
		}
	}()
	return s
}

// ctx names the session on a call.
func (s *stalledSession) ctx(ctx context.Context) context.Context { return inSession(ctx, s.id) }

// stall makes call's first hold wait until the session has ended for
// want of keepalives (none sent from that hold on), and returns call's
// error, once sure that the call reached its hold and the session ended.
func (s *stalledSession) stall(call func() error) error {
	s.t.Helper()
	return s.stallAt(1, call)
}

// stallAt is stall at call's nth hold, those before it going through.
func (s *stalledSession) stallAt(n int, call func() error) error {
	s.t.Helper()
	s.h.mu.Lock()
	s.at = n
	s.h.armed[s.id] = s
	s.h.mu.Unlock()
	err := call()
	select {
	case <-s.reached:
	default:
		s.t.Fatalf("the call never reached its hold (%v)", err)
	}
	<-s.ended
	if code(s.endErr) != codes.DeadlineExceeded {
		s.t.Fatalf("session ended with %v, want DeadlineExceeded (no keepalive)", s.endErr)
	}
	return err
}

// register registers e under the stalled session.
func (s *stalledSession) register(ctx context.Context, e client.Engine) uint64 {
	s.t.Helper()
	order := layoutpb.KVOrder_KV_ORDER_HND
	if e.Order == layout.NHD {
		order = layoutpb.KVOrder_KV_ORDER_NHD
	}
	reg, err := s.api.Register(s.ctx(ctx), &fabricpb.RegisterRequest{Engine: e.Name, Model: e.Model.Proto(), TpSize: uint32(e.TPSize),
		PageSize: uint32(e.PageSize), KvOrder: order, Slots: uint32(e.Slots)})
	if err != nil {
		s.t.Fatal(err)
	}
	return reg.BlockSet
}

// wantEnded checks that err is the answer of a call its session
// outlived.
func wantEnded(t *testing.T, what string, err error) {
	t.Helper()
	if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "ended during the call") {
		t.Fatalf("%s outlived by its session: %v, want FAILED_PRECONDITION: ended during the call", what, err)
	}
}

// An engine stalled past its keepalive bound in the middle of a call
// (the agent between taking slots or blocks for it and recording them in
// its session) gets FAILED_PRECONDITION from the call, never slots its
// ended session gave back: those may be another engine's by the time it
// writes or reads them. What the call took is given back exactly once:
// free, or referenced by nobody, and taken by a new session's Allocate;
// a reference another session holds on the same block stays.
func TestCallOutlivedByItsSessionHandsNothing(t *testing.T) {
	const keepalive = time.Second // the bound two loaded cores keep (TestSessionKeepaliveAtTheLimit)
	eng := client.Engine{Name: "stalled", Model: smallModel, TPSize: 1, PageSize: 4, Order: layout.HND, Slots: 16}
	start := func(t *testing.T, tiers ...string) (context.Context, *fabric.Agent, *holdStaller) {
		t.Parallel()
		cfg := testConfig(t, "n1")
		cfg.SessionKeepalive = keepalive
		cfg.Tiers = tiers
		h := &holdStaller{armed: map[uint64]*stalledSession{}}
		fabric.BeforeHold(&cfg, h.hold)
		a := startAgent(t, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		t.Cleanup(cancel)
		return ctx, a, h
	}
	// takesAllOf checks that a new session's Allocate takes every slot of
	// set, of e's slots: nothing of the stalled call's is held.
	takesAllOf := func(t *testing.T, ctx context.Context, c *client.Client, set uint64, e client.Engine) {
		t.Helper()
		if slots, err := c.Allocate(ctx, set, e.Slots); err != nil || len(slots) != e.Slots {
			t.Fatalf("a new session's Allocate of all %d slots: %d slots, %v", e.Slots, len(slots), err)
		}
	}
	takesAll := func(t *testing.T, ctx context.Context, c *client.Client, set uint64) {
		t.Helper()
		takesAllOf(t, ctx, c, set, eng)
	}
	// tierRun stores blocks through a tier-backed agent's set of
	// tierEngine and returns it with three blocks that follow one another
	// in its host tier, none in the set.
	tierRun := func(t *testing.T, a *fabric.Agent, c *client.Client) (uint64, []uint64) {
		t.Helper()
		set := register(t, c, tierEngine)
		hashes := storeThrough(t, c, set, 64, a)
		from := 0
		for from < len(hashes) && fabric.BlockSetHolds(a, set.ID, hashes[from]) {
			from++
		}
		if from+3 > len(hashes) {
			t.Fatalf("the set holds the first %d of %d blocks", from, len(hashes))
		}
		run := hashes[from : from+3]
		for _, h := range run {
			if fabric.BlockSetHolds(a, set.ID, h) || fabric.TierHolding(a, set.ID, h) != "host" {
				t.Fatalf("block %016x: in the set %v, tier %q; want the host tier's only", h, fabric.BlockSetHolds(a, set.ID, h), fabric.TierHolding(a, set.ID, h))
			}
		}
		return set.ID, run
	}

	// cachedForOthers checks, from a new session of a's, that set is the
	// one eng registers, that the blocks the stalled call registered stay
	// cached in it, as an ended session's blocks do, referenced by nobody
	// but that session once it acquires them, and that every slot is free
	// again once it releases them (takesAll).
	cachedForOthers := func(t *testing.T, ctx context.Context, a *fabric.Agent, set uint64, hashes []uint64) {
		t.Helper()
		c := newClient(t, a)
		if got := register(t, c, eng).ID; got != set {
			t.Fatalf("block set %d registered, want %d", got, set)
		}
		refs, err := c.Acquire(ctx, set, hashes)
		if err != nil || len(refs) != len(hashes) {
			t.Fatalf("Acquire of the %d blocks registered by the stalled call: %v, %v", len(hashes), refs, err)
		}
		slots := make([]uint32, len(refs))
		for i, r := range refs {
			slots[i] = r.Slot
		}
		if err := c.Release(ctx, set, slots); err != nil {
			t.Fatal(err)
		}
		takesAll(t, ctx, c, set)
	}

	t.Run("Allocate", func(t *testing.T) {
		ctx, a, h := start(t)
		s := h.open(t, ctx, a, keepalive)
		set := s.register(ctx, eng)
		err := s.stall(func() error {
			resp, err := s.api.Allocate(s.ctx(ctx), &fabricpb.AllocateRequest{BlockSet: set, Count: uint32(eng.Slots)})
			if err == nil {
				t.Errorf("slots %v handed to an engine whose session ended", resp.Slots)
			}
			return err
		})
		wantEnded(t, "Allocate", err)
		c := newClient(t, a)
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.BlockSets) != 1 || st.BlockSets[0].Free != uint32(eng.Slots) {
			t.Fatalf("block sets %v, want one with all %d slots free", st.BlockSets, eng.Slots)
		}
		if got := register(t, c, eng).ID; got != set {
			t.Fatalf("block set %d registered, want %d", got, set)
		}
		takesAll(t, ctx, c, set)
	})

	// An Acquire whose session ends at a hold, while another session keeps
	// a reference on the first block. Ended at the first of two holds, the
	// block it was holding is given back by hold. Ended at the second of
	// three, the first block's reference, recorded, is given back once (by
	// detach: the other session's reference on it stays), the second's by
	// hold, the third never taken.
	for _, tc := range []struct {
		name       string
		blocks, at int
	}{{"Acquire", 2, 1}, {"AcquireAfterAHold", 3, 2}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, a, h := start(t)
			c := newClient(t, a)
			set := register(t, c, eng).ID
			slots, err := c.Allocate(ctx, set, tc.blocks)
			if err != nil {
				t.Fatal(err)
			}
			hashes := []uint64{11, 12, 13}[:tc.blocks]
			refs, err := c.RegisterBlocks(ctx, set, slots, hashes)
			if err != nil || len(refs) != tc.blocks {
				t.Fatalf("register: %v, %v", refs, err)
			}
			var rest []uint32
			for _, r := range refs[1:] {
				rest = append(rest, r.Slot)
			}
			if err := c.Release(ctx, set, rest); err != nil {
				t.Fatal(err)
			}
			s := h.open(t, ctx, a, keepalive)
			if got := s.register(ctx, eng); got != set {
				t.Fatalf("block set %d registered, want %d", got, set)
			}
			err = s.stallAt(tc.at, func() error {
				resp, err := s.api.Acquire(s.ctx(ctx), &fabricpb.AcquireRequest{BlockSet: set, Hashes: hashes})
				if err == nil {
					t.Errorf("blocks %v handed to an engine whose session ended", resp.Blocks)
				}
				return err
			})
			wantEnded(t, "Acquire", err)
			// The other session's reference stays: one slot short of all.
			if _, err := c.Allocate(ctx, set, eng.Slots); code(err) != codes.ResourceExhausted {
				t.Fatalf("Allocate of all %d slots with a block referenced: %v, want RESOURCE_EXHAUSTED", eng.Slots, err)
			}
			if err := c.Release(ctx, set, []uint32{refs[0].Slot}); err != nil {
				t.Fatalf("the other session's reference: %v", err)
			}
			takesAll(t, ctx, c, set)
		})
	}

	t.Run("Import", func(t *testing.T) {
		ctx, a, h := start(t)
		// Blocks another engine's set of this node holds, copied in by
		// the import (registered, then held).
		hashes := sumHashes(7, 3)
		holdBlocks(t, a, client.Engine{Name: "writer", Model: smallModel, TPSize: 1, PageSize: 4, Order: layout.NHD, Slots: 8}, hashes, 1)
		s := h.open(t, ctx, a, keepalive)
		set := s.register(ctx, eng)
		err := s.stall(func() error {
			resp, err := s.api.Import(s.ctx(ctx), &fabricpb.ImportRequest{BlockSet: set, Hashes: hashes})
			if err == nil {
				t.Errorf("blocks %v handed to an engine whose session ended", resp.Blocks)
			}
			return err
		})
		wantEnded(t, "Import", err)
		cachedForOthers(t, ctx, a, set, hashes)
	})

	t.Run("RegisterBlocks", func(t *testing.T) {
		ctx, a, h := start(t)
		s := h.open(t, ctx, a, keepalive)
		set := s.register(ctx, eng)
		resp, err := s.api.Allocate(s.ctx(ctx), &fabricpb.AllocateRequest{BlockSet: set, Count: 3})
		if err != nil {
			t.Fatal(err)
		}
		hashes := []uint64{21, 22, 23}
		err = s.stall(func() error {
			reg, err := s.api.RegisterBlocks(s.ctx(ctx), &fabricpb.RegisterBlocksRequest{BlockSet: set, Slots: resp.Slots, Hashes: hashes})
			if err == nil {
				t.Errorf("blocks %v handed to an engine whose session ended", reg.Blocks)
			}
			return err
		})
		wantEnded(t, "RegisterBlocks", err)
		cachedForOthers(t, ctx, a, set, hashes)
	})

	// An Acquire of blocks restored from a tier: ended at the first hold,
	// it gives back the blocks restored for it and not taken yet too.
	t.Run("AcquireRestored", func(t *testing.T) {
		ctx, a, h := start(t, fmt.Sprintf("host=%d", fabric.MinHostTierBytes))
		c := newClient(t, a)
		set, run := tierRun(t, a, c)
		s := h.open(t, ctx, a, keepalive)
		if got := s.register(ctx, tierEngine); got != set {
			t.Fatalf("block set %d registered, want %d", got, set)
		}
		err := s.stall(func() error {
			resp, err := s.api.Acquire(s.ctx(ctx), &fabricpb.AcquireRequest{BlockSet: set, Hashes: run})
			if err == nil {
				t.Errorf("blocks %v handed to an engine whose session ended", resp.Blocks)
			}
			return err
		})
		wantEnded(t, "Acquire", err)
		takesAllOf(t, ctx, c, set, tierEngine)
	})

	// An Import of blocks restored from a tier (fromTier) whose session
	// ends at their hold stops: given back, and not a failed import.
	t.Run("ImportRestored", func(t *testing.T) {
		ctx, a, h := start(t, fmt.Sprintf("host=%d", fabric.MinHostTierBytes))
		c := newClient(t, a)
		set, run := tierRun(t, a, c)
		s := h.open(t, ctx, a, keepalive)
		if got := s.register(ctx, tierEngine); got != set {
			t.Fatalf("block set %d registered, want %d", got, set)
		}
		fails := a.Metrics().ImportFailures
		err := s.stall(func() error {
			resp, err := s.api.Import(s.ctx(ctx), &fabricpb.ImportRequest{BlockSet: set, Hashes: run})
			if err == nil {
				t.Errorf("blocks %v handed to an engine whose session ended", resp.Blocks)
			}
			return err
		})
		wantEnded(t, "Import", err)
		if got := a.Metrics().ImportFailures; got != fails {
			t.Fatalf("import failures %d after the import its session outlived, want %d", got, fails)
		}
		takesAllOf(t, ctx, c, set, tierEngine)
	})

	// A Prefetch that imports blocks (here from another engine's set)
	// for a session that ends at their hold answers as it does, with no
	// import error: the session's stream tells the engine.
	t.Run("PrefetchImport", func(t *testing.T) {
		ctx, a, h := start(t)
		hashes := sumHashes(7, 3)
		holdBlocks(t, a, client.Engine{Name: "writer", Model: smallModel, TPSize: 1, PageSize: 4, Order: layout.NHD, Slots: 8}, hashes, 1)
		s := h.open(t, ctx, a, keepalive)
		set := s.register(ctx, eng)
		fails := a.Metrics().ImportFailures
		var resp *fabricpb.PrefetchResponse
		err := s.stall(func() (err error) {
			resp, err = s.api.Prefetch(s.ctx(ctx), &fabricpb.PrefetchRequest{BlockSet: set, Hashes: hashes})
			return err
		})
		if err != nil || resp.Error != "" {
			t.Fatalf("Prefetch outlived by its session: %+v, %v; want OK with no error", resp, err)
		}
		if got := a.Metrics().ImportFailures; got != fails {
			t.Fatalf("import failures %d after the prefetch its session outlived, want %d", got, fails)
		}
		c := newClient(t, a)
		if got := register(t, c, eng).ID; got != set {
			t.Fatalf("block set %d registered, want %d", got, set)
		}
		takesAll(t, ctx, c, set)
	})

	// A session that drops the block set (DropBlockSet) while one of its
	// calls waits at its hold is answered so too, though it goes on.
	t.Run("DropBlockSet", func(t *testing.T) {
		ctx, a, h := start(t)
		c := newClient(t, a)
		set := register(t, c, eng).ID
		s := &stalledSession{t: t, h: h, id: c.Session(), reached: make(chan struct{}), ended: make(chan struct{})}
		h.mu.Lock()
		h.armed[s.id] = s
		h.mu.Unlock()
		errc := make(chan error, 1)
		go func() {
			slots, err := c.Allocate(ctx, set, eng.Slots)
			if err == nil {
				err = fmt.Errorf("slots %v handed to an engine that dropped the set", slots)
			}
			errc <- err
		}()
		select {
		case <-s.reached:
		case err := <-errc:
			t.Fatalf("the call never reached its hold (%v)", err)
		}
		if _, err := c.DropBlockSet(ctx, set); err != nil {
			t.Fatal(err)
		}
		close(s.ended)
		err := <-errc
		if code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "dropped it during the call") {
			t.Fatalf("Allocate whose set its session dropped meanwhile: %v, want FAILED_PRECONDITION: dropped it during the call", err)
		}
		if got := register(t, c, eng).ID; got != set {
			t.Fatalf("block set %d registered, want %d", got, set)
		}
		takesAll(t, ctx, c, set)
	})
}

// A call whose caller gave up before it could answer (its deadline passed
// while the call waited, here once it held what it took) gives back what it held for
// the session: the engine never learns of those slots or blocks, and they
// would stay the session's until it ends. Allocate's slots are freed,
// Acquire's blocks released.
func TestCallItsCallerGaveUpOnHoldsNothing(t *testing.T) {
	var stall atomic.Bool
	cfg := testConfig(t, "n1")
	// The call, once it holds what it took, waits until its caller's
	// deadline has reached it.
	fabric.BeforeCallerCheck(&cfg, func(ctx context.Context) {
		if stall.Load() {
			select {
			case <-ctx.Done():
			case <-time.After(30 * time.Second):
			}
		}
	})
	a := startAgent(t, cfg)
	c := dial(t, a)
	set := register(t, c, client.Engine{Name: "giver-up", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 16})
	hashes := storeThrough(t, c, set, 4)
	refs := func() (uint32, uint32) {
		st, err := c.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range st.Sessions {
			if s.Id == c.Session() {
				return s.Refs, s.Slots
			}
		}
		t.Fatal("the client's session is not listed")
		return 0, 0
	}
	for _, call := range []struct {
		name string
		do   func(context.Context) error
	}{
		{"Allocate", func(ctx context.Context) error { _, err := c.Allocate(ctx, set.ID, 4); return err }},
		{"Acquire", func(ctx context.Context) error { _, err := c.Acquire(ctx, set.ID, hashes); return err }},
	} {
		stall.Store(true)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := call.do(ctx)
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("%s past its caller's deadline: %v", call.name, err)
		}
		wait.For(t, 30*time.Second, call.name+"'s holds given back", func() error {
			if r, s := refs(); r != 0 || s != 0 {
				return fmt.Errorf("the session holds %d references and %d slots", r, s)
			}
			return nil
		})
		stall.Store(false)
	}
}
