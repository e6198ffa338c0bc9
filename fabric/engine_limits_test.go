package fabric_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// Every string an engine sends is bounded: at the bound it is taken, one
// byte past it the call fails INVALID_ARGUMENT naming the field.
func TestEngineStringBounds(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, _, ev := rawSession(t, ctx, a.EngineSocket())
	sctx := inSession(ctx, ev.Session)
	reg := func(engine string, devices []string) error {
		_, err := api.Register(sctx, &fabricpb.RegisterRequest{Engine: engine, Devices: devices, Model: smallModel.Proto(),
			TpSize: 1, PageSize: 4, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16})
		return err
	}
	set, err := api.Register(sctx, &fabricpb.RegisterRequest{Engine: "e", Model: smallModel.Proto(), TpSize: 1, PageSize: 4, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16})
	if err != nil {
		t.Fatal(err)
	}
	lookup := func(salt, lora string) error {
		_, err := api.Lookup(sctx, &fabricpb.LookupRequest{BlockSet: set.BlockSet, Tokens: &fabricpb.Tokens{Ids: make([]uint32, 8), Salt: salt, Lora: lora}})
		return err
	}
	openSession := func(engine string) error {
		stream, err := api.OpenSession(ctx)
		if err != nil {
			return err
		}
		defer stream.CloseSend()
		if err := stream.Send(&fabricpb.SessionRequest{Engine: engine}); err != nil {
			return err
		}
		_, err = stream.Recv()
		return err
	}
	for _, tc := range []struct {
		desc  string
		call  func() error
		want  codes.Code
		field string
	}{
		{"engine name at the bound", func() error { return reg(strings.Repeat("e", fabric.MaxEngineName), nil) }, codes.OK, ""},
		{"engine name past the bound", func() error { return reg(strings.Repeat("e", fabric.MaxEngineName+1), nil) }, codes.InvalidArgument, "engine"},
		{"engine name of 1 MiB", func() error { return reg(strings.Repeat("e", 1<<20), nil) }, codes.InvalidArgument, "engine"},
		// A host pool ignores devices, so a name at the bound is taken.
		{"device name at the bound", func() error { return reg("e", []string{strings.Repeat("0", fabric.MaxDeviceName)}) }, codes.OK, ""},
		{"device name past the bound", func() error { return reg("e", []string{strings.Repeat("0", fabric.MaxDeviceName+1)}) }, codes.InvalidArgument, "devices"},
		{"devices past the TP bound", func() error { return reg("e", make([]string, 1025)) }, codes.InvalidArgument, "devices"},
		{"salt at the bound", func() error { return lookup(strings.Repeat("s", fabric.MaxHashNamespace), "") }, codes.OK, ""},
		{"salt past the bound", func() error { return lookup(strings.Repeat("s", fabric.MaxHashNamespace+1), "") }, codes.InvalidArgument, "tokens.salt"},
		{"lora at the bound", func() error { return lookup("", strings.Repeat("l", fabric.MaxHashNamespace)) }, codes.OK, ""},
		{"lora past the bound", func() error { return lookup("", strings.Repeat("l", fabric.MaxHashNamespace+1)) }, codes.InvalidArgument, "tokens.lora"},
		{"session engine name at the bound", func() error { return openSession(strings.Repeat("e", fabric.MaxEngineName)) }, codes.OK, ""},
		{"session engine name past the bound", func() error { return openSession(strings.Repeat("e", fabric.MaxEngineName+1)) }, codes.InvalidArgument, "engine"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			err := tc.call()
			if code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			if tc.field != "" && !strings.Contains(err.Error(), tc.field+":") {
				t.Fatalf("%v does not name %q", err, tc.field)
			}
		})
	}
	st, err := api.Status(sctx, &fabricpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st.Sessions {
		if len(s.Engine) > fabric.MaxEngineName {
			t.Errorf("session %d in status with a %d-byte engine name", s.Id, len(s.Engine))
		}
	}
}

// The codes engine.proto documents, one case each.
func TestEngineContractCodes(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, _, ev := rawSession(t, ctx, a.EngineSocket())
	sctx := inSession(ctx, ev.Session)
	set, err := api.Register(sctx, &fabricpb.RegisterRequest{Engine: "e", Model: smallModel.Proto(), TpSize: 1, PageSize: 4, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16})
	if err != nil {
		t.Fatal(err)
	}
	bad := metadata.AppendToOutgoingContext(ctx, fabricpb.SessionMetadata, "not-a-number")
	unknown := inSession(ctx, ev.Session+1)
	lookup := func(ctx context.Context) error {
		_, err := api.Lookup(ctx, &fabricpb.LookupRequest{Hashes: []uint64{1}})
		return err
	}
	statusCall := func(ctx context.Context) error {
		_, err := api.Status(ctx, &fabricpb.StatusRequest{})
		return err
	}
	for _, tc := range []struct {
		desc string
		call func() error
		want codes.Code
	}{
		{"lookup in the session", func() error { return lookup(sctx) }, codes.OK},
		{"lookup with no session", func() error { return lookup(ctx) }, codes.OK},
		{"lookup with a malformed session id", func() error { return lookup(bad) }, codes.InvalidArgument},
		{"lookup with an unknown session id", func() error { return lookup(unknown) }, codes.FailedPrecondition},
		{"status in the session", func() error { return statusCall(sctx) }, codes.OK},
		{"status with a malformed session id", func() error { return statusCall(bad) }, codes.InvalidArgument},
		{"status with an unknown session id", func() error { return statusCall(unknown) }, codes.FailedPrecondition},
		{"allocate in an unknown block set", func() error {
			_, err := api.Allocate(sctx, &fabricpb.AllocateRequest{BlockSet: 999, Count: 1})
			return err
		}, codes.NotFound},
		{"lookup naming an unknown block set", func() error {
			_, err := api.Lookup(sctx, &fabricpb.LookupRequest{BlockSet: 999, Hashes: []uint64{1}})
			return err
		}, codes.NotFound},
		{"free of a slot out of range", func() error {
			_, err := api.Free(sctx, &fabricpb.FreeRequest{BlockSet: set.BlockSet, Slots: []uint32{1 << 30}})
			return err
		}, codes.FailedPrecondition},
		{"import of blocks no node holds", func() error {
			_, err := api.Import(sctx, &fabricpb.ImportRequest{BlockSet: set.BlockSet, Hashes: []uint64{77}, TimeoutMs: 5000})
			return err
		}, codes.NotFound},
		{"allocate past the pool", func() error {
			_, err := api.Allocate(sctx, &fabricpb.AllocateRequest{BlockSet: set.BlockSet, Count: 17})
			return err
		}, codes.ResourceExhausted},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if err := tc.call(); code(err) != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
		})
	}
	// Acquire answers per block: a block no node holds is MISSING with
	// NOT_FOUND.
	acq, err := api.Acquire(sctx, &fabricpb.AcquireRequest{BlockSet: set.BlockSet, Hashes: []uint64{77}})
	if err != nil {
		t.Fatal(err)
	}
	if r := acq.Results[0]; r.Outcome != fabricpb.Outcome_OUTCOME_MISSING || codes.Code(r.Code) != codes.NotFound {
		t.Fatalf("acquire of a block not held: %v", r)
	}
}

// openSessionErr opens a session on api and returns what its first answer
// says: nil where the session opened (it stays open until ctx ends).
func openSessionErr(ctx context.Context, api fabricpb.EngineClient) error {
	stream, err := api.OpenSession(ctx)
	if err != nil {
		return err
	}
	// A stream refused at once may have ended before the request went:
	// its status comes with Recv.
	stream.Send(&fabricpb.SessionRequest{Engine: "bound"})
	_, err = stream.Recv()
	return err
}

// The engine sessions one process has open are bounded, streams that have
// not yet sent their first request included: at the bound a session
// opens, one past it fails RESOURCE_EXHAUSTED naming the bound and how
// many are open, and once one ends another opens.
func TestEngineSessionsPerProcessBound(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.EngineSessionsPerProcess = 2
	// rawSession sends no keepalives: its session outlasts the test.
	cfg.SessionKeepalive = time.Minute
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	api, _, _ := rawSession(t, ctx, a.EngineSocket())
	// The second, at the bound: a stream that sends nothing yet.
	pctx, pcancel := context.WithCancel(ctx)
	defer pcancel()
	if _, err := api.OpenSession(pctx); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "2 sessions open", func() error {
		if n := a.Metrics().EngineSessions; n != 2 {
			return fmt.Errorf("%d open", n)
		}
		return nil
	})
	err := openSessionErr(ctx, api)
	if code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "has 2 open, at most 2 (engine_sessions_per_process)") {
		t.Fatalf("a third session of the process: %v, want ResourceExhausted naming the bound", err)
	}
	// The Go client says so, without asking whether the agent runs.
	_, err = client.Dial(ctx, a.EngineSocket())
	if code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "engine_sessions_per_process") || strings.Contains(err.Error(), "is the agent running") {
		t.Fatalf("client.Dial past the process's bound: %v, want ResourceExhausted naming the bound alone", err)
	}
	if r := a.Metrics().EngineSessionsRefused; r.Process != 2 || r.Total != 0 {
		t.Fatalf("refused %+v, want two past the process's bound", r)
	}
	pcancel()
	wait.For(t, 10*time.Second, "the silent stream's end", func() error {
		if n := a.Metrics().EngineSessions; n != 1 {
			return fmt.Errorf("%d open", n)
		}
		return nil
	})
	if err := openSessionErr(ctx, api); err != nil {
		t.Fatalf("a session once one ended: %v", err)
	}
}

// The engine sessions of all processes together are bounded: with another
// process's session open, this process's opens at the bound and one past
// it fails RESOURCE_EXHAUSTED naming the bound, though the process is
// within its own.
func TestEngineSessionsTotalBound(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.EngineSessions = 2
	// rawSession sends no keepalives: its session outlasts the test.
	cfg.SessionKeepalive = time.Minute
	a := startAgent(t, cfg)
	startTenant(t, a, "fd") // another process, one session
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	api, _, _ := rawSession(t, ctx, a.EngineSocket()) // at the bound
	err := openSessionErr(ctx, api)
	if code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "2 open in all, at most 2 (engine_sessions)") {
		t.Fatalf("a session past the total: %v, want ResourceExhausted naming the bound", err)
	}
	if r := a.Metrics().EngineSessionsRefused; r.Process != 0 || r.Total != 1 {
		t.Fatalf("refused %+v, want one past the total", r)
	}
}

// An import's timeout_ms is bounded by the agent's import_timeout: an
// engine that asks for 49 days (the most the field holds) of an import
// that can only wait is answered DEADLINE_EXCEEDED once import_timeout
// has passed.
func TestImportTimeoutBoundedByTheAgents(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.ImportTimeout = 300 * time.Millisecond
	// rawSession sends no keepalives: its session outlasts the test.
	cfg.SessionKeepalive = time.Minute
	a := startAgent(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	api, _, ev := rawSession(t, ctx, a.EngineSocket())
	sctx := inSession(ctx, ev.Session)
	set, err := api.Register(sctx, &fabricpb.RegisterRequest{Engine: "e", Model: smallModel.Proto(), TpSize: 1, PageSize: 4, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16})
	if err != nil {
		t.Fatal(err)
	}
	// The import waits for the block as for another import bringing it,
	// until its bound.
	release := fabric.HoldImport(a, set.BlockSet, 77)
	defer release()
	answer := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := api.Import(sctx, &fabricpb.ImportRequest{BlockSet: set.BlockSet, Hashes: []uint64{77}, TimeoutMs: math.MaxUint32})
		answer <- err
	}()
	select {
	case err := <-answer:
		if code(err) != codes.DeadlineExceeded {
			t.Fatalf("import past import_timeout: %v, want DeadlineExceeded", err)
		}
		if took := time.Since(start); took < cfg.ImportTimeout {
			t.Fatalf("import answered after %v, before import_timeout (%v)", took, cfg.ImportTimeout)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("import asking for timeout_ms %d not answered within 20s, import_timeout %v", uint32(math.MaxUint32), cfg.ImportTimeout)
	}
}
