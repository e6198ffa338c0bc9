package client

import (
	"context"
	"math"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/layout"
)

// countingEngine opens sessions, records the counts of each Register and
// Allocate that reaches it, and refuses them (Unavailable): what reached
// it is what the test looks at.
type countingEngine struct {
	fabricpb.UnimplementedEngineServer
	mu        sync.Mutex
	registers []*fabricpb.RegisterRequest
	allocates []uint32
}

func (e *countingEngine) OpenSession(stream fabricpb.Engine_OpenSessionServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&fabricpb.SessionEvent{Session: 1, KeepaliveMs: 60_000}); err != nil {
		return err
	}
	<-stream.Context().Done()
	return nil
}

func (e *countingEngine) Register(_ context.Context, req *fabricpb.RegisterRequest) (*fabricpb.RegisterResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.registers = append(e.registers, req)
	return nil, status.Error(codes.Unavailable, "counted")
}

func (e *countingEngine) Allocate(_ context.Context, req *fabricpb.AllocateRequest) (*fabricpb.AllocateResponse, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.allocates = append(e.allocates, req.GetCount())
	return nil, status.Error(codes.Unavailable, "counted")
}

// A count of Register's Engine or Allocate's n that its request's
// unsigned 32-bit field cannot carry is refused InvalidArgument naming the
// field, and sent nowhere: 2^32+2 slots went as 2, and -1 as 2^32-1. At
// 2^32-1 it goes as it is, for the agent to judge.
func TestCountsPastU32AreRefused(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "engine.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	e := &countingEngine{}
	srv := grpc.NewServer()
	fabricpb.RegisterEngineServer(srv, e)
	go srv.Serve(lis)
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	good := func() Engine {
		return Engine{Name: "e", Model: layout.ModelConfig{Layers: 4, KVHeads: 8, HeadDim: 128, DType: layout.DTypeF32}, TPSize: 1, PageSize: 16, Order: layout.HND}
	}
	const most = math.MaxUint32
	for _, f := range []struct {
		name string
		set  func(*Engine, int)
		got  func(*fabricpb.RegisterRequest) uint32
	}{
		{"Model.Layers", func(e *Engine, n int) { e.Model.Layers = n }, func(r *fabricpb.RegisterRequest) uint32 { return r.GetModel().GetLayers() }},
		{"Model.KVHeads", func(e *Engine, n int) { e.Model.KVHeads = n }, func(r *fabricpb.RegisterRequest) uint32 { return r.GetModel().GetKvHeads() }},
		{"Model.HeadDim", func(e *Engine, n int) { e.Model.HeadDim = n }, func(r *fabricpb.RegisterRequest) uint32 { return r.GetModel().GetHeadDim() }},
		{"TPSize", func(e *Engine, n int) { e.TPSize = n }, func(r *fabricpb.RegisterRequest) uint32 { return r.GetTpSize() }},
		{"PageSize", func(e *Engine, n int) { e.PageSize = n }, func(r *fabricpb.RegisterRequest) uint32 { return r.GetPageSize() }},
		{"Slots", func(e *Engine, n int) { e.Slots = n }, func(r *fabricpb.RegisterRequest) uint32 { return r.GetSlots() }},
	} {
		for _, n := range []int{-1, most + 1, most + 2} {
			eng := good()
			f.set(&eng, n)
			_, err := c.Register(ctx, eng)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "Engine."+f.name+" (") || !strings.Contains(err.Error(), "is not in 0..4294967295") {
				t.Errorf("Register with %s %d: %v, want InvalidArgument naming the field", f.name, n, err)
			}
		}
		eng := good()
		f.set(&eng, most)
		if _, err := c.Register(ctx, eng); status.Code(err) != codes.Unavailable {
			t.Errorf("Register with %s %d: %v, want it sent (and refused by the test's agent)", f.name, most, err)
		}
		e.mu.Lock()
		if len(e.registers) != 1 || f.got(e.registers[0]) != most {
			t.Errorf("%s: the agent got %d registrations, want one with %d", f.name, len(e.registers), uint32(most))
		}
		e.registers = nil
		e.mu.Unlock()
	}

	for _, n := range []int{-1, most + 1} {
		if _, err := c.Allocate(ctx, 1, n); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "Allocate: n") {
			t.Errorf("Allocate of %d: %v, want InvalidArgument naming n", n, err)
		}
	}
	if _, err := c.Allocate(ctx, 1, most); status.Code(err) != codes.Unavailable {
		t.Errorf("Allocate of %d: %v, want it sent", most, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.allocates) != 1 || e.allocates[0] != most {
		t.Errorf("the agent got allocations of %v, want one of %d", e.allocates, uint32(most))
	}
}
