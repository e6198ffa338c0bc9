package fabric_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
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

var smallModel = layout.ModelConfig{Layers: 2, KVHeads: 4, HeadDim: 8, DType: layout.DTypeF16}

func code(err error) codes.Code { return status.Code(err) }

func TestEngineAPI(t *testing.T) {
	cfg := testConfig(t, "n1")
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	fi, err := os.Stat(a.EngineSocket())
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("engine socket mode: %v %v", fi.Mode(), err)
	}
	c := newClient(t, a)

	set, err := c.Register(ctx, client.Engine{Name: "e1", Model: smallModel, TPSize: 2, PageSize: 4, Order: layout.HND, Slots: 32})
	if err != nil {
		t.Fatal(err)
	}
	if set.Layout.Slots != 32 || len(set.Ranks) != 2 {
		t.Fatalf("block set: %d slots, %d ranks", set.Layout.Slots, len(set.Ranks))
	}
	again, err := c.Register(ctx, client.Engine{Name: "e1-rank1", Model: smallModel, TPSize: 2, PageSize: 4, Order: layout.HND})
	if err != nil || again.ID != set.ID {
		t.Fatalf("same shape did not reuse the block set: %v %v", again, err)
	}

	slots, err := c.Allocate(ctx, set.ID, 3)
	if err != nil || len(slots) != 3 {
		t.Fatalf("allocate: %v %v", slots, err)
	}
	h, _ := layout.NewHasher(4, layout.HashOptions{})
	blocks := h.Sequence([]uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})
	hashes := []uint64{blocks[0].Sequence, blocks[1].Sequence, blocks[2].Sequence}
	for i, s := range slots {
		for r := range 2 {
			b := set.Block(r, int(s))
			for j := range b {
				b[j] = byte(i*31 + r*7 + j)
			}
		}
	}
	refs, err := c.RegisterBlocks(ctx, set.ID, slots, hashes)
	if err != nil || len(refs) != 3 {
		t.Fatalf("register: %v %v", refs, err)
	}

	// A second engine registering the same prefix gets the existing block.
	dup, _ := c.Allocate(ctx, set.ID, 1)
	refs2, err := c.RegisterBlocks(ctx, set.ID, dup, hashes[:1])
	if err != nil || !refs2[0].Duplicate || refs2[0].Slot != slots[0] {
		t.Fatalf("duplicate register: %v %v", refs2, err)
	}

	got, err := c.Acquire(ctx, set.ID, append(hashes, 12345))
	if err != nil || len(got) != 3 {
		t.Fatalf("acquire: %v %v (want the 3 leading blocks)", got, err)
	}
	// Memory written through the engine's mapping is the agent's.
	if b := set.Block(1, int(got[2].Slot)); b[5] != byte(2*31+7+5) {
		t.Fatalf("block bytes not shared: %d", b[5])
	}

	// Release what we hold: 3 from register, 1 from the duplicate, 3 acquired.
	for _, rel := range [][]uint32{slots, {slots[0]}, slots} {
		if err := c.Release(ctx, set.ID, rel); err != nil {
			t.Fatalf("release %v: %v", rel, err)
		}
	}
	if err := c.Release(ctx, set.ID, slots[:1]); code(err) != codes.FailedPrecondition {
		t.Fatalf("release of a slot not held: %v", err)
	}

	// Errors map to codes that say what is wrong.
	api := c.API()
	for _, tc := range []struct {
		name string
		call func() error
		want codes.Code
		msg  string
	}{
		{"unknown block set", func() error { _, err := c.Allocate(ctx, 999, 1); return err }, codes.NotFound, "block set 999"},
		{"zero count", func() error { _, err := c.Allocate(ctx, set.ID, 0); return err }, codes.InvalidArgument, "count"},
		{"too many slots", func() error { _, err := c.Allocate(ctx, set.ID, 1000); return err }, codes.ResourceExhausted, "1000"},
		{"no model", func() error {
			_, err := api.Register(ctx, &fabricpb.RegisterRequest{TpSize: 1, PageSize: 4})
			return err
		}, codes.InvalidArgument, "model"},
		{"absurd tp size", func() error {
			_, err := api.Register(ctx, &fabricpb.RegisterRequest{Model: smallModel.Proto(), TpSize: 1 << 30, PageSize: 4, KvOrder: 2})
			return err
		}, codes.InvalidArgument, "tp_size"},
		{"kv order out of range", func() error {
			_, err := api.Register(ctx, &fabricpb.RegisterRequest{Model: smallModel.Proto(), TpSize: 1, PageSize: 4, KvOrder: 257})
			return err
		}, codes.InvalidArgument, "kv_order"},
		{"heads not divisible", func() error {
			_, err := c.Register(ctx, client.Engine{Model: smallModel, TPSize: 3, PageSize: 4, Order: layout.HND})
			return err
		}, codes.InvalidArgument, "tp_size"},
		{"hash count mismatch", func() error {
			s, _ := c.Allocate(ctx, set.ID, 2)
			_, err := c.RegisterBlocks(ctx, set.ID, s, hashes[:1])
			return err
		}, codes.InvalidArgument, "1 hashes for 2 slots"},
		{"register a free slot", func() error {
			_, err := c.RegisterBlocks(ctx, set.ID, []uint32{31}, hashes[:1])
			return err
		}, codes.FailedPrecondition, "slot 31"},
		{"hashes and tokens", func() error {
			_, err := api.RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: []uint32{0}, Hashes: hashes[:1], Tokens: &fabricpb.Tokens{Ids: []uint32{1, 2, 3, 4}}})
			return err
		}, codes.InvalidArgument, "not both"},
	} {
		err := tc.call()
		if code(err) != tc.want || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v naming %q", tc.name, err, tc.want, tc.msg)
		}
	}

	// Token ids hash with the block set's page size.
	s, _ := c.Allocate(ctx, set.ID, 2)
	resp, err := api.RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: s, Tokens: &fabricpb.Tokens{Ids: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}}})
	if err != nil || resp.Blocks[1].Hash != hashes[1] || !resp.Blocks[0].Duplicate {
		t.Fatalf("register by tokens: %v %v", resp, err)
	}

	// The agent counts what an operator reads (cmd/kvfabric exports it),
	// and serves its health.
	if m := a.Metrics(); m.Pool.Registered != 3 || m.Pool.Slots != 32 || m.Node != "n1" || m.Membership.Members != 1 {
		t.Errorf("metrics: %d registered, %d slots, node %q, %d members; want 3, 32, n1, 1", m.Pool.Registered, m.Pool.Slots, m.Node, m.Membership.Members)
	}
	if code, _ := httpStatus(t, "http://"+a.MetricsAddr()+"/metrics"); code != http.StatusNotFound {
		t.Errorf("/metrics without a MetricsHandler: %d, want 404 (the library writes no exposition)", code)
	}
	if body := httpGet(t, "http://"+a.MetricsAddr()+"/healthz"); !strings.HasPrefix(body, "ok n1") {
		t.Errorf("/healthz: %q", body)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestAgentCloseReleasesEverything(t *testing.T) {
	cfg := testConfig(t, "n1")
	a := startAgent(t, cfg)
	socket := a.EngineSocket()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(socket); !os.IsNotExist(err) {
		t.Fatalf("engine socket left behind: %v", err)
	}
	// A new agent can take the same socket and data dir.
	b := startAgent(t, cfg)
	b.Close()
	// A live agent's socket is not stolen.
	c := startAgent(t, cfg)
	cfg2 := cfg
	cfg2.NodeName = "n2"
	if _, err := fabric.Start(context.Background(), cfg2); err == nil || !strings.Contains(err.Error(), "another agent") {
		t.Fatalf("second agent on a live socket: %v", err)
	}
	c.Close()
	if _, err := os.Stat(socket); !os.IsNotExist(err) {
		t.Fatalf("engine socket left behind: %v", err)
	}
}

// A block set made without a slot count holds a quarter of the pool, so
// its size follows the pool's; the engine learns how many it keeps (all:
// a block is recycled only when an allocation needs its slot).
func TestBlockSetSizeFollowsThePool(t *testing.T) {
	e := client.Engine{Name: "e", Model: smallModel, TPSize: 1, PageSize: 16, Order: layout.HND}
	// smallModel's block at page 16 and TP 1: 16 × 4 heads × 8 × 2 bytes
	// per plane, × 2 planes × 2 layers = 4 KiB, the engine alignment.
	const block = 4 << 10
	for _, pool := range []int{16 << 20, 32 << 20} {
		c := testConfig(t, fmt.Sprintf("pool%d", pool>>20))
		c.Pools = []string{fmt.Sprintf("host=%d", pool)}
		a := startAgent(t, c)
		set, err := dial(t, a).Register(context.Background(), e)
		if err != nil {
			t.Fatal(err)
		}
		if want := pool / 4 / block; set.Layout.Slots != want {
			t.Errorf("pool of %d MiB: a block set of %d slots, want a quarter of the pool, %d", pool>>20, set.Layout.Slots, want)
		}
		if want := set.Layout.Slots; set.Retains != want {
			t.Errorf("pool of %d MiB: the set keeps %d, want all its slots (%d)", pool>>20, set.Retains, want)
		}
	}
}

// The engine API takes up to 65,536 hashes and 4,194,304 token ids in one
// request, and refuses one more of either, naming which.
func TestEngineRequestLimits(t *testing.T) {
	a := startAgent(t, testConfig(t, "limits"))
	api := dial(t, a).API()
	ctx := context.Background()
	const maxHashes, maxTokens = 1 << 16, 1 << 22
	hashes := make([]uint64, maxHashes+1)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	if r, err := api.Lookup(ctx, &fabricpb.LookupRequest{Hashes: hashes[:maxHashes]}); err != nil || len(r.Hashes) != maxHashes {
		t.Fatalf("lookup of %d hashes (the limit): %v", maxHashes, err)
	}
	if _, err := api.Lookup(ctx, &fabricpb.LookupRequest{Hashes: hashes}); code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "hashes") {
		t.Fatalf("lookup of %d hashes: %v, want InvalidArgument naming hashes", len(hashes), err)
	}
	tokens := make([]uint32, maxTokens+1)
	for i := range tokens {
		tokens[i] = uint32(i % 128000)
	}
	// At block size 64 the limit's tokens make 65,536 blocks.
	r, err := api.Lookup(ctx, &fabricpb.LookupRequest{Tokens: &fabricpb.Tokens{Ids: tokens[:maxTokens]}, BlockSize: 64})
	if err != nil || len(r.Hashes) != maxTokens/64 {
		t.Fatalf("lookup of %d tokens (the limit): %d hashes, %v", maxTokens, len(r.GetHashes()), err)
	}
	if _, err := api.Lookup(ctx, &fabricpb.LookupRequest{Tokens: &fabricpb.Tokens{Ids: tokens}, BlockSize: 64}); code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "tokens") {
		t.Fatalf("lookup of %d tokens: %v, want InvalidArgument naming tokens", len(tokens), err)
	}
	// Tokens make at most 65,536 blocks too, however small the block.
	r, err = api.Lookup(ctx, &fabricpb.LookupRequest{Tokens: &fabricpb.Tokens{Ids: tokens[:maxHashes]}, BlockSize: 1})
	if err != nil || len(r.Hashes) != maxHashes {
		t.Fatalf("lookup of %d tokens at block size 1 (the limit's blocks): %d hashes, %v", maxHashes, len(r.GetHashes()), err)
	}
	for _, n := range []int{maxHashes + 1, maxTokens} {
		_, err := api.Lookup(ctx, &fabricpb.LookupRequest{Tokens: &fabricpb.Tokens{Ids: tokens[:n]}, BlockSize: 1})
		if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("tokens: %d ids make %d full blocks", n, n)) {
			t.Fatalf("lookup of %d tokens at block size 1: %v, want InvalidArgument naming the tokens and their blocks", n, err)
		}
	}
}

// A block set's memory, as its engine's quota counts it, is its regions',
// whatever its arrangement: one whose layers are kept apart takes every
// layer of each slot (8 MiB here, past a quota of 4 MiB), not one.
func TestLayerSeparateSetCountedWhole(t *testing.T) {
	cfg := testConfig(t, "n1") // host=16MiB
	cfg.EngineQuota = 4 << 20
	a := startAgent(t, cfg)
	api := dial(t, a).API()
	ctx := context.Background()
	m := layout.ModelConfig{Layers: 16, KVHeads: 4, HeadDim: 64, DType: layout.DTypeF16}
	req := func(slots uint32) *fabricpb.RegisterRequest {
		// 16 KiB a slot in each layer: 256 KiB a slot, 8 MiB for 32.
		return &fabricpb.RegisterRequest{Engine: "e", Model: m.Proto(), TpSize: 1, PageSize: 16, KvOrder: layoutpb.KVOrder_KV_ORDER_HND,
			Arrangement: layoutpb.Arrangement_ARRANGEMENT_LAYER_SEPARATE, Slots: slots}
	}
	_, err := api.Register(ctx, req(32))
	if code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "this one needs 8388608") {
		t.Fatalf("register of a set of 8 MiB past a quota of 4 MiB: %v, want ResourceExhausted naming its 8388608 bytes", err)
	}
	st, err := dial(t, a).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.BlockSets) != 0 {
		t.Fatalf("block sets %v made past the quota", st.BlockSets)
	}
	// At the quota.
	if _, err := api.Register(ctx, req(16)); err != nil {
		t.Fatalf("register of a set of 4 MiB within a quota of 4 MiB: %v", err)
	}
}

// A layout whose set would take more than 2^64 bytes over its ranks is
// refused, InvalidArgument naming its slots, and frees no idle set: its
// bytes (2^54 on each of 1,024 ranks) wrapped to 0 passed the quota, and
// the engine's idle sets were freed for room the pool never had. A set of
// just under 2^64 bytes, which the quota's sum (what the engine's sets
// take, plus the need) wrapped to a few KiB, and a set past the quota on
// its own, are refused by the quota (ResourceExhausted) with the engine's
// idle set kept: freeing it makes no room for either.
func TestSetPastTwoToTheSixtyFourRefused(t *testing.T) {
	for _, tc := range []struct {
		desc string
		req  *fabricpb.RegisterRequest
		code codes.Code
		want string // in the error
	}{{
		// 2^46 bytes a slot on each rank (65,536 tokens × 1 head × 65,536
		// × 2 bytes × K and V × 4,096 layers), 256 slots: 2^54 bytes a
		// rank.
		desc: "past 2^64",
		req: &fabricpb.RegisterRequest{Engine: "e", TpSize: 1024, PageSize: 65536, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 256,
			Model: layout.ModelConfig{Layers: 4096, KVHeads: 1024, HeadDim: 65536, DType: layout.DTypeF16}.Proto()},
		code: codes.InvalidArgument, want: "slots",
	}, {
		// MLA, whole on each rank: 18,631 tokens × 2,761 heads × 4,096
		// bytes a slot, 21,887,553 slots: 2^62 - 4,096 bytes a rank,
		// 2^64 - 16,384 over 4 ranks.
		desc: "just under 2^64",
		req: &fabricpb.RegisterRequest{Engine: "e", TpSize: 4, PageSize: 18631, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 21887553,
			Model: layout.ModelConfig{Layers: 1, KVHeads: 2761, HeadDim: 4096, DType: layout.DTypeU8, MLA: true}.Proto()},
		code: codes.ResourceExhausted, want: "this one needs 18446744073709535232",
	}, {
		// 32 MiB (2 MiB a slot: 64 tokens × 64 heads × 128 × 2 bytes ×
		// K and V), past a pool of 16 MiB, the quota.
		desc: "past the quota",
		req: &fabricpb.RegisterRequest{Engine: "e", TpSize: 1, PageSize: 64, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16,
			Model: layout.ModelConfig{Layers: 1, KVHeads: 64, HeadDim: 128, DType: layout.DTypeF16}.Proto()},
		code: codes.ResourceExhausted, want: "this one needs 33554432",
	}} {
		t.Run(tc.desc, func(t *testing.T) {
			cfg := testConfig(t, "n1")
			cfg.BlockSetGrace = time.Hour
			a := startAgent(t, cfg)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			sctx, end := context.WithCancel(ctx)
			api, _, ev := rawSession(t, sctx, a.EngineSocket())
			in := inSession(sctx, ev.Session)
			idle, err := api.Register(in, &fabricpb.RegisterRequest{Engine: "e", Model: smallModel.Proto(), TpSize: 1, PageSize: 4,
				KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16})
			if err != nil {
				t.Fatal(err)
			}
			end() // idle from now, for an hour
			c := dial(t, a)
			wait.For(t, 10*time.Second, "the set idle", func() error {
				st, err := c.Status(ctx)
				if err != nil {
					return err
				}
				if len(st.BlockSets) != 1 || st.BlockSets[0].Sessions != 0 {
					return fmt.Errorf("block sets %v", st.BlockSets)
				}
				return nil
			})
			_, err = c.API().Register(ctx, tc.req)
			if code(err) != tc.code || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("register: %v, want %v naming %q", err, tc.code, tc.want)
			}
			st, err := c.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(st.BlockSets) != 1 || st.BlockSets[0].Id != idle.BlockSet {
				t.Fatalf("block sets %v after the refused register, want the idle set %d kept", st.BlockSets, idle.BlockSet)
			}
		})
	}
}

// A Register that asks for the default slot count of a layout whose block
// takes 2^64 bytes over the ranks of one pool (an MLA block of 2^57 bytes,
// whole on each of 128 ranks) is answered with an error, not a panic: the
// default count divided the pool's quarter by their product, which
// wrapped to 0.
func TestDefaultSlotsOfAHugeBlock(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// 65,536 tokens × 4,096 heads × 65,536 × 2 bytes × 4,096 layers.
	mla := layout.ModelConfig{Layers: 4096, KVHeads: 4096, HeadDim: 65536, DType: layout.DTypeF16, MLA: true}
	_, err := dial(t, a).API().Register(ctx, &fabricpb.RegisterRequest{Engine: "e", Model: mla.Proto(), TpSize: 128, PageSize: 65536,
		KvOrder: layoutpb.KVOrder_KV_ORDER_HND})
	if code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "the default slot count, 1, takes") || !strings.Contains(err.Error(), "more than 2^64") {
		t.Fatalf("register of a block of 2^64 bytes over its ranks, default slots: %v, want InvalidArgument: the default slot count takes more than 2^64 bytes", err)
	}
}
