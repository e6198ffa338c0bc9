package fabric_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// A Register that asks for no slot count joins a set of its layout that its
// session already uses (an engine's other ranks), else another session's
// only if that set holds the default slot count (the largest such set), and
// makes one otherwise: another engine's tiny set of the same layout is not
// handed to it. When the pool has no room for a set of the default size,
// the largest existing set is the answer.
func TestRegisterWithoutSlotsAvoidsTinySets(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1")) // host=16MiB: the default set is 1024 slots of 4 KiB
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, _, evA := rawSession(t, ctx, a.EngineSocket())
	_, _, evB := rawSession(t, ctx, a.EngineSocket())
	sctx := inSession(ctx, evB.Session)
	regIn := func(ctx context.Context, page, slots uint32) *fabricpb.RegisterResponse {
		t.Helper()
		r, err := api.Register(ctx, &fabricpb.RegisterRequest{Engine: "e", Model: smallModel.Proto(), TpSize: 1, PageSize: page,
			KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: slots})
		if err != nil {
			t.Fatalf("register page %d slots %d: %v", page, slots, err)
		}
		return r
	}
	reg := func(page, slots uint32) *fabricpb.RegisterResponse { t.Helper(); return regIn(sctx, page, slots) }
	// Session A makes a tiny set; its own other ranks join it without a
	// count.
	actx := inSession(ctx, evA.Session)
	tiny := regIn(actx, 4, 4)
	if r := regIn(actx, 4, 0); r.BlockSet != tiny.BlockSet {
		t.Fatalf("the session's own set not joined without a count: set %d, want %d", r.BlockSet, tiny.BlockSet)
	}
	// 20 tries: the old choice among sets of one layout was a map's order.
	var big uint64
	for i := range 20 {
		r := reg(4, 0)
		if r.BlockSet == tiny.BlockSet || r.Layout.Slots < 1024 {
			t.Fatalf("try %d: a Register without slots got set %d of %d slots", i, r.BlockSet, r.Layout.Slots)
		}
		if big == 0 {
			big = r.BlockSet
		} else if r.BlockSet != big {
			t.Fatalf("try %d: set %d, earlier %d: one layout, one default set", i, r.BlockSet, big)
		}
	}
	// Asking for an exact count still finds the set of that count.
	if r := reg(4, 4); r.BlockSet != tiny.BlockSet {
		t.Fatalf("register with 4 slots: set %d, want %d", r.BlockSet, tiny.BlockSet)
	}

	// Past the pool: a page-16 set (4 KiB blocks) takes all but 1 MiB,
	// leaving no room for a default page-8 set (1024 blocks of 4 KiB); the
	// largest page-8 set there is answers.
	small8 := regIn(actx, 8, 4)
	st, err := api.Status(sctx, &fabricpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	left := st.Pools[0].SizeBytes - st.Pools[0].CarvedBytes
	reg(16, uint32((left-1<<20)/4096))
	r := reg(8, 0)
	if r.BlockSet != small8.BlockSet {
		t.Fatalf("with no room for a default set, got set %d of %d slots, want the existing set %d", r.BlockSet, r.Layout.Slots, small8.BlockSet)
	}
}
