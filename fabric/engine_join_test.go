package fabric_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// joinRequest is isolationEngine's Register, joining set id with token.
func joinRequest(id uint64, token string) *fabricpb.RegisterRequest {
	return &fabricpb.RegisterRequest{
		Engine: "tenant-rank1", Model: isolationEngine.Model.Proto(), TpSize: uint32(isolationEngine.TPSize),
		PageSize: uint32(isolationEngine.PageSize), KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: uint32(isolationEngine.Slots),
		JoinBlockSet: id, JoinToken: token,
	}
}

// joinToken asks the helper for the join token Register answered it,
// failing unless it is one.
func (tn *isolationTenant) joinToken(t *testing.T) string {
	t.Helper()
	f := strings.Fields(tn.do("token"))
	if len(f) != 3 || f[0] != "token" || !strings.HasPrefix(f[1], "join-") {
		t.Fatalf("engine helper, token: %q", f)
	}
	return f[1]
}

// Another process of an engine (a TP worker of its own) joins the block
// set that a running process registered, by the join token Register
// answered it: it is handed that very set, no new one, and its calls
// naming the set are its own from then on. A wrong token, a layout other
// than the set's, an unknown set and a freed one are each refused, naming
// what is wrong, and never answered with another set.
func TestRegisterJoinsBySetCredential(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace = 50 * time.Millisecond
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenant := startTenant(t, a, "fd")
	token := tenant.joinToken(t)
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sets := func() int {
		t.Helper()
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(st.BlockSets)
	}
	before := sets()

	refused := []struct {
		name string
		req  *fabricpb.RegisterRequest
		code codes.Code
		says string
	}{
		{"a wrong token", joinRequest(tenant.set, token+"0"), codes.PermissionDenied, "join_token"},
		{"no token", joinRequest(tenant.set, ""), codes.PermissionDenied, "join_token"},
		{"an unknown set", joinRequest(tenant.set+100, token), codes.NotFound, fmt.Sprintf("block set %d", tenant.set+100)},
		{"a token but no set", joinRequest(0, token), codes.InvalidArgument, "join_block_set"},
		{"another page size", func() *fabricpb.RegisterRequest {
			r := joinRequest(tenant.set, token)
			r.PageSize = 8
			return r
		}(), codes.InvalidArgument, "page_size"},
		{"another slot count", func() *fabricpb.RegisterRequest {
			r := joinRequest(tenant.set, token)
			r.Slots = 16
			return r
		}(), codes.InvalidArgument, "slots"},
	}
	for _, tc := range refused {
		resp, err := c.API().Register(ctx, tc.req)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("join with %s: %v (set %d), want %v naming %s", tc.name, err, resp.GetBlockSet(), tc.code, tc.says)
		}
	}
	// The tenant's set is its process's: not to be named by this one.
	if _, err := c.Acquire(ctx, tenant.set, []uint64{0xa1}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("Acquire in the tenant's set before joining it: %v, want PermissionDenied", err)
	}

	resp, err := c.API().Register(ctx, joinRequest(tenant.set, token))
	if err != nil {
		t.Fatalf("join with the set's token while its process runs: %v", err)
	}
	if resp.GetBlockSet() != tenant.set || resp.GetJoinToken() != token || len(resp.GetMemory()) != isolationEngine.TPSize {
		t.Fatalf("join answered set %d (token %q, %d ranks), want the tenant's set %d", resp.GetBlockSet(), resp.GetJoinToken(), len(resp.GetMemory()), tenant.set)
	}
	if got := sets(); got != before {
		t.Fatalf("%d block sets after the join, %d before: joining made one", got, before)
	}
	if n := a.Metrics().EngineSetJoins; n != 1 {
		t.Fatalf("%d joins counted after one, and refusals", n)
	}
	// The joiner's calls naming the set are allowed, and act on it (the
	// tenant took every slot: Allocate reaches the pool, which has none).
	refs, err := c.Acquire(ctx, tenant.set, []uint64{0xa1})
	if err != nil || len(refs) != 1 {
		t.Fatalf("Acquire of the tenant's block in the joined set: %v, %v", refs, err)
	}
	if err := c.Release(ctx, tenant.set, []uint32{refs[0].Slot}); err != nil {
		t.Fatalf("Release in the joined set: %v", err)
	}
	if _, err := c.Allocate(ctx, tenant.set, 1); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("Allocate in the joined set, every slot the tenant's: %v, want ResourceExhausted", err)
	}

	// A freed set is not joined, its token notwithstanding.
	own, err := c.Register(ctx, client.Engine{Name: "other", Model: smallModel, TPSize: 1, PageSize: 4, Order: layout.HND, Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.DropBlockSet(ctx, own.ID); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the dropped set to be freed", func() error {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		for _, b := range st.BlockSets {
			if b.Id == own.ID {
				return fmt.Errorf("block set %d still there", own.ID)
			}
		}
		return nil
	})
	req := &fabricpb.RegisterRequest{Engine: "other", Model: smallModel.Proto(), TpSize: 1, PageSize: 4,
		KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 4, JoinBlockSet: own.ID, JoinToken: own.JoinToken}
	if resp, err := c.API().Register(ctx, req); status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), fmt.Sprintf("block set %d", own.ID)) {
		t.Fatalf("join of a freed set: %v (set %d), want NotFound naming it", err, resp.GetBlockSet())
	}
}

// A set whose processes have all exited and that another engine takes up
// (the orphan cache's path) gets a new join token: whoever learned the
// old one from the exited engine cannot join the new engine's set.
func TestJoinTokenRenewedWhenSetPassesOn(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace = time.Minute
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenant := startTenant(t, a, "fd")
	old := tenant.joinToken(t)
	tenant.exit(t)
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitSetIdle(t, ctx, c, tenant.set)
	set, err := c.Register(ctx, isolationEngine)
	if err != nil {
		t.Fatal(err)
	}
	if set.ID != tenant.set {
		t.Fatalf("set %d made, want the exited engine's set %d taken up", set.ID, tenant.set)
	}
	if set.JoinToken == old || !strings.HasPrefix(set.JoinToken, "join-") {
		t.Fatalf("the set taken up answers join token %q, the exited engine's was %q: want a new one", set.JoinToken, old)
	}
	if resp, err := c.API().Register(ctx, joinRequest(set.ID, old)); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "join_token") {
		t.Fatalf("join of the set taken up with the exited engine's token: %v (set %d), want PermissionDenied naming join_token", err, resp.GetBlockSet())
	}
	resp, err := c.API().Register(ctx, joinRequest(set.ID, set.JoinToken))
	if err != nil || resp.GetBlockSet() != set.ID || resp.GetJoinToken() != set.JoinToken {
		t.Fatalf("join with the new token: %v (set %d, token %q)", err, resp.GetBlockSet(), resp.GetJoinToken())
	}
}

// The Go client joins a set another process of the engine registered
// (Engine.Join, with the token that process was given): Register answers
// that very set with its memory mapped, the other process's bytes in it,
// and a join that names no set or no token is refused before any call,
// naming what is missing.
func TestClientJoinsASet(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenant := startTenant(t, a, "fd")
	token := tenant.joinToken(t)
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	e := isolationEngine
	e.Name = "tenant-rank1"
	for _, tc := range []struct {
		name string
		join client.Join
		says string
	}{
		{"no set", client.Join{Token: token}, "Join.BlockSet"},
		{"no token", client.Join{BlockSet: tenant.set}, "join token"},
	} {
		e.Join = &tc.join
		if set, err := c.Register(ctx, e); err == nil || status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("join with %s: set %v, %v; want an error of the client naming %s", tc.name, set, err, tc.says)
		}
	}
	if n := a.Metrics().EngineSetJoins; n != 0 {
		t.Fatalf("%d joins counted after joins refused by the client", n)
	}

	e.Join = &client.Join{BlockSet: tenant.set, Token: token}
	set, err := c.Register(ctx, e)
	if err != nil {
		t.Fatalf("join with the set's token: %v", err)
	}
	if set.ID != tenant.set || set.JoinToken != token || len(set.Ranks) != isolationEngine.TPSize {
		t.Fatalf("join answered set %d (token %q, %d ranks), want the tenant's set %d", set.ID, set.JoinToken, len(set.Ranks), tenant.set)
	}
	if n := a.Metrics().EngineSetJoins; n != 1 {
		t.Fatalf("%d joins counted after one", n)
	}
	// The tenant filled every slot with 0x77: the joiner maps those bytes.
	for r, b := range set.Ranks {
		for i, v := range b {
			if v != 0x77 {
				t.Fatalf("rank %d byte %d of the joined set is %#x, not the tenant's 0x77", r, i, v)
			}
		}
	}
	refs, err := c.Acquire(ctx, set.ID, []uint64{0xa1})
	if err != nil || len(refs) != 1 {
		t.Fatalf("Acquire of the tenant's block in the joined set: %v, %v", refs, err)
	}
}

// A Register (or a join) whose answer the Go client cannot map gives the
// set back: here the client reaches the engine socket by a link that has
// no descriptor socket beside it, so the memory token cannot be redeemed;
// the error says so, and the session uses no set afterwards, where the
// agent had attached the one it answered.
func TestClientRegisterUnmappedDropsTheSet(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	link := filepath.Join(t.TempDir(), "engine.sock")
	if err := os.Symlink(a.EngineSocket(), link); err != nil {
		t.Fatal(err)
	}
	c, err := client.Dial(ctx, link)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	set, err := c.Register(ctx, isolationEngine)
	if err == nil || !strings.Contains(err.Error(), client.FDSocketSuffix) {
		t.Fatalf("Register with no descriptor socket beside the engine socket: set %v, %v; want the mapping's error", set, err)
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var sets []uint64
	found := false
	for _, s := range st.GetSessions() {
		if s.GetId() == c.Session() {
			sets, found = s.GetBlockSets(), true
		}
	}
	if !found || len(sets) != 0 {
		t.Fatalf("after a Register whose memory was not mapped, the session (found %v) uses block sets %v, want none", found, sets)
	}
	if n := len(st.GetBlockSets()); n != 1 {
		t.Fatalf("%d block sets, want the one registered", n)
	}
}
