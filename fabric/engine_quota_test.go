package fabric_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// A flood of sessions of one engine, each registering a block set of
// another layout, cycles through that engine's own idle sets and never
// evicts another engine's idle set of 768 cached blocks, which is within
// its fair share of the pool.
func TestEngineFloodCannotEvictAnothersCachedSet(t *testing.T) {
	cfg := testConfig(t, "n1") // host=16MiB
	cfg.BlockSetGrace = time.Hour
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	vctx, vcancel := context.WithCancel(ctx)
	api, _, ev := rawSession(t, vctx, a.EngineSocket())
	sctx := inSession(vctx, ev.Session)
	reg, err := api.Register(sctx, &fabricpb.RegisterRequest{Engine: "victim", Model: smallModel.Proto(), TpSize: 1, PageSize: 4,
		KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 768})
	if err != nil {
		t.Fatal(err)
	}
	al, err := api.Allocate(sctx, &fabricpb.AllocateRequest{BlockSet: reg.BlockSet, Count: 768})
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, 768)
	for i := range hashes {
		hashes[i] = uint64(i) + 1
	}
	if _, err := api.RegisterBlocks(sctx, &fabricpb.RegisterBlocksRequest{BlockSet: reg.BlockSet, Slots: al.Slots, Hashes: hashes}); err != nil {
		t.Fatal(err)
	}
	vcancel() // the victim's session ends: its set is idle, its blocks cached
	victim := func() (*fabricpb.BlockSet, error) {
		st, err := dial(t, a).Status(ctx)
		if err != nil {
			return nil, err
		}
		for _, b := range st.BlockSets {
			if b.Id == reg.BlockSet {
				return b, nil
			}
		}
		return nil, fmt.Errorf("the victim's set %d is gone", reg.BlockSet)
	}
	wait.For(t, 10*time.Second, "the victim's set idle", func() error {
		b, err := victim()
		if err != nil {
			return err
		}
		if b.Sessions != 0 {
			return fmt.Errorf("%d sessions", b.Sessions)
		}
		return nil
	})

	made, refused := 0, 0
	for i := range 40 {
		fctx, fcancel := context.WithCancel(ctx)
		fapi, _, fev := rawSession(t, fctx, a.EngineSocket())
		// Another page size each time: another layout, another set.
		_, err := fapi.Register(inSession(fctx, fev.Session), &fabricpb.RegisterRequest{Engine: "flood", Model: smallModel.Proto(), TpSize: 1,
			PageSize: uint32(8 + i), KvOrder: layoutpb.KVOrder_KV_ORDER_HND})
		fcancel()
		switch {
		case err == nil:
			made++
		case code(err) == codes.ResourceExhausted:
			refused++
		default:
			t.Fatalf("flood register %d: %v", i, err)
		}
	}
	b, err := victim()
	if err != nil {
		t.Fatalf("after %d flood sets made and %d refused: %v", made, refused, err)
	}
	if b.Registered != 768 {
		t.Fatalf("the victim's set holds %d registered blocks, want 768", b.Registered)
	}
	if made < 10 {
		t.Fatalf("the flood made only %d sets: it should cycle its own idle ones", made)
	}
	t.Logf("flood: %d sets made, %d refused; the victim's 768 cached blocks stayed", made, refused)
}

// With engine_quota set, an engine's sets may take up to it: at the quota
// a Register is served, past it one fails RESOURCE_EXHAUSTED naming the
// quota, while the engine's sets are in use.
func TestEngineQuotaAtAndPast(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.EngineQuota = 1 << 20 // 256 blocks of 4 KiB
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, _, ev := rawSession(t, ctx, a.EngineSocket())
	sctx := inSession(ctx, ev.Session)
	reg := func(page, slots uint32) error {
		_, err := api.Register(sctx, &fabricpb.RegisterRequest{Engine: "q", Model: smallModel.Proto(), TpSize: 1, PageSize: page,
			KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: slots})
		return err
	}
	if err := reg(4, 128); err != nil {
		t.Fatalf("half the quota: %v", err)
	}
	if err := reg(8, 128); err != nil {
		t.Fatalf("up to the quota: %v", err)
	}
	err := reg(12, 1)
	if code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "engine_quota") || !strings.Contains(err.Error(), `engine "q"`) {
		t.Fatalf("one block past the quota: %v, want ResourceExhausted naming the engine and engine_quota", err)
	}
	// Another engine has its own quota.
	if _, err := api.Register(sctx, &fabricpb.RegisterRequest{Engine: "other", Model: smallModel.Proto(), TpSize: 1, PageSize: 12,
		KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 1}); err != nil {
		t.Fatalf("another engine: %v", err)
	}
}

// An engine whose idle set is the fallback of its next Register (the
// layout's set, with fewer slots than the default count the Register asks
// for) keeps that set when the quota has no room for a new one: the quota
// path does not free the set the Register would then fall back to, so the
// engine is given its old set, not told it was freed.
func TestEngineQuotaKeepsTheFallbackSet(t *testing.T) {
	cfg := testConfig(t, "n1") // host=16MiB: the default set is a quarter, 4 MiB
	cfg.EngineQuota = 1 << 20  // 256 blocks of 4 KiB
	cfg.BlockSetGrace = time.Hour
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := idleQuotaSet(t, ctx, a)
	// The default count (4 MiB) is past the quota whatever is freed: the
	// layout's idle set is the one this Register can have.
	again, err := quotaRegister(t, ctx, a, 0)
	if err != nil {
		t.Fatalf("a Register of the default count past the quota, with the engine's idle set of its layout: %v, want that set", err)
	}
	if again.BlockSet != old.BlockSet {
		t.Fatalf("given set %d, want the engine's idle set %d", again.BlockSet, old.BlockSet)
	}
}

// Where the engine's new set fits the quota on its own but not beside a
// set of the engine that is in use, even with every idle set freed, the
// idle set of its layout is not freed for it: the Register is given that
// set.
func TestEngineQuotaKeepsTheFallbackSetBesideABusySet(t *testing.T) {
	cfg := testConfig(t, "n1") // host=16MiB
	cfg.EngineQuota = 1 << 20  // 256 blocks of 4 KiB
	cfg.BlockSetSlots = 200    // the default count: 800 KiB, within the quota
	cfg.BlockSetGrace = time.Hour
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := idleQuotaSet(t, ctx, a) // 512 KiB
	// A set of another layout (8 tokens a block, 4 KiB aligned as 4), in
	// use: 64 blocks, 256 KiB.
	api, _, ev := rawSession(t, ctx, a.EngineSocket())
	if _, err := api.Register(inSession(ctx, ev.Session), &fabricpb.RegisterRequest{Engine: "q", Model: smallModel.Proto(), TpSize: 1,
		PageSize: 8, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 64}); err != nil {
		t.Fatalf("a set in use of a quarter of the quota: %v", err)
	}
	// 800 KiB beside the 256 KiB in use is past the quota, the idle set
	// freed or not.
	again, err := quotaRegister(t, ctx, a, 0)
	if err != nil {
		t.Fatalf("a Register of the default count, past the quota beside a set in use, with the engine's idle set of its layout: %v, want that set", err)
	}
	if again.BlockSet != old.BlockSet {
		t.Fatalf("given set %d, want the engine's idle set %d", again.BlockSet, old.BlockSet)
	}
}

// Where the quota has room for the engine's new set only once its idle
// fallback set is freed, and the pool has room for the new set beside it,
// the new set is made first and the fallback freed after: the engine gets
// the slot count it asked for, within its quota.
func TestEngineQuotaSwapsTheFallbackForANewSet(t *testing.T) {
	cfg := testConfig(t, "n1") // host=16MiB
	cfg.EngineQuota = 1 << 20  // 256 blocks of 4 KiB
	cfg.BlockSetSlots = 200    // the default count: 800 KiB
	cfg.BlockSetGrace = time.Hour
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old := idleQuotaSet(t, ctx, a)
	again, err := quotaRegister(t, ctx, a, 0)
	if err != nil {
		t.Fatalf("a Register of the default count, within the quota once the idle set is freed: %v", err)
	}
	if again.BlockSet == old.BlockSet {
		t.Fatalf("given the idle set %d of 128 slots, want a new set of the default 200", old.BlockSet)
	}
	st, err := dial(t, a).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range st.BlockSets {
		if b.Id == old.BlockSet {
			t.Fatalf("the idle set %d is still held beside the new one: past the quota", old.BlockSet)
		}
	}
}

// quotaRegister registers slots (0: the default count) for engine "q" in
// a session of its own, which lasts as long as ctx.
func quotaRegister(t *testing.T, ctx context.Context, a *fabric.Agent, slots uint32) (*fabricpb.RegisterResponse, error) {
	api, _, ev := rawSession(t, ctx, a.EngineSocket())
	return api.Register(inSession(ctx, ev.Session), &fabricpb.RegisterRequest{Engine: "q", Model: smallModel.Proto(), TpSize: 1,
		PageSize: 4, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: slots})
}

// idleQuotaSet registers a set of 128 slots for engine "q" and ends its
// session: the set is left idle, kept for the grace period.
func idleQuotaSet(t *testing.T, ctx context.Context, a *fabric.Agent) *fabricpb.RegisterResponse {
	t.Helper()
	octx, ocancel := context.WithCancel(ctx)
	old, err := quotaRegister(t, octx, a, 128)
	if err != nil {
		t.Fatalf("a set of half the quota: %v", err)
	}
	ocancel()
	wait.For(t, 10*time.Second, "the old set idle", func() error {
		st, err := dial(t, a).Status(ctx)
		if err != nil {
			return err
		}
		for _, b := range st.BlockSets {
			if b.Id == old.BlockSet && b.Sessions == 0 {
				return nil
			}
		}
		return fmt.Errorf("set %d not idle: %v", old.BlockSet, st.BlockSets)
	})
	return old
}
