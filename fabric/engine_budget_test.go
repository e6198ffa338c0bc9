package fabric_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// A request whose cost (twice its encoded size) is exactly the session's
// bound is served; one hash more and it fails RESOURCE_EXHAUSTED naming
// the bound, and is counted.
func TestEngineRequestMemoryBound(t *testing.T) {
	at := &fabricpb.LookupRequest{Hashes: make([]uint64, 1000)}
	for i := range at.Hashes {
		at.Hashes[i] = uint64(i) + 1
	}
	cost := 2 * int64(proto.Size(at))
	cfg := testConfig(t, "n1")
	fabric.SetRequestBudget(&cfg, 2*cost, cost) // below the settings' floor
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	api, _, ev := rawSession(t, ctx, a.EngineSocket())
	sctx := inSession(ctx, ev.Session)
	if _, err := api.Lookup(sctx, at); err != nil {
		t.Fatalf("at the bound: %v", err)
	}
	past := &fabricpb.LookupRequest{Hashes: append(at.Hashes, 1001)}
	_, err := api.Lookup(sctx, past)
	if code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "in flight") {
		t.Fatalf("past the bound: %v, want ResourceExhausted about requests in flight", err)
	}
	m := a.Metrics()
	if m.EngineRequestsRefused != 1 || m.EngineRequestBytes != 0 {
		t.Fatalf("metrics: %d refused, %d bytes in flight; want 1 and 0", m.EngineRequestsRefused, m.EngineRequestBytes)
	}
	// Calls with no session share one bound.
	if _, err := api.Lookup(ctx, past); code(err) != codes.ResourceExhausted {
		t.Fatalf("past the bound with no session: %v", err)
	}
}
