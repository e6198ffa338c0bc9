package client

import (
	"context"
	"net"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// endingEngine is an agent whose session ends while an Allocate runs,
// after the Allocate took its slots: the client learns of the end before
// the answer.
type endingEngine struct {
	fabricpb.UnimplementedEngineServer
	clients chan *Client  // the client, handed to Allocate
	end     chan struct{} // closed to end the session
}

func (e *endingEngine) OpenSession(stream fabricpb.Engine_OpenSessionServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	if err := stream.Send(&fabricpb.SessionEvent{Session: 7, KeepaliveMs: 60_000}); err != nil {
		return err
	}
	select {
	case <-e.end:
		return status.Error(codes.DeadlineExceeded, "session 7: no keepalive")
	case <-stream.Context().Done():
		return nil
	}
}

func (e *endingEngine) Allocate(ctx context.Context, req *fabricpb.AllocateRequest) (*fabricpb.AllocateResponse, error) {
	c := <-e.clients
	close(e.end)
	select {
	case <-c.keepDone: // the client saw its session end
	case <-time.After(time.Minute): // never: the test fails on the answer
	}
	return &fabricpb.AllocateResponse{Slots: []uint32{0, 1}}, nil
}

func (e *endingEngine) Release(ctx context.Context, req *fabricpb.ReleaseRequest) (*fabricpb.ReleaseResponse, error) {
	return &fabricpb.ReleaseResponse{}, nil
}

// A call that hands slots, answered after its session ended, fails
// FAILED_PRECONDITION instead of handing the engine slots given back; a
// Release then still says that it released.
func TestSlotsAnsweredAfterTheSessionEndedAreRefused(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "engine.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	e := &endingEngine{clients: make(chan *Client, 1), end: make(chan struct{})}
	srv := grpc.NewServer()
	fabricpb.RegisterEngineServer(srv, e)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e.clients <- c
	slots, err := c.Allocate(ctx, 1, 2)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "session 7 ended") {
		t.Fatalf("Allocate answered after its session ended: slots %v, %v; want FAILED_PRECONDITION: session 7 ended", slots, err)
	}
	if err := c.Release(ctx, 1, []uint32{0}); err != nil {
		t.Fatalf("Release answered OK after the session ended: %v", err)
	}
}

// refusingEngine refuses every session at once, before its first request.
type refusingEngine struct {
	fabricpb.UnimplementedEngineServer
}

func (refusingEngine) OpenSession(stream fabricpb.Engine_OpenSessionServer) error {
	return status.Error(codes.ResourceExhausted, "process 1: has 2 open, at most 2 (engine_sessions_per_process)")
}

// A session the agent refuses before its first request went is Dial's
// error as the agent gave it, not the EOF its request's send then gets:
// here the stream has ended (its header wait returns) before the send.
func TestDialRefusedBeforeItsRequestSaysWhy(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "engine.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	fabricpb.RegisterEngineServer(srv, refusingEngine{})
	go srv.Serve(lis)
	defer srv.Stop()
	beforeSessionSend = func(stream fabricpb.Engine_OpenSessionClient) {
		stream.Header() // returns once the refused stream has ended
	}
	defer func() { beforeSessionSend = nil }()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := Dial(ctx, sock)
	if err == nil {
		c.Close()
		t.Fatal("Dial opened a session the agent refused")
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "engine_sessions_per_process") {
		t.Fatalf("Dial refused before its request went: %v, want the agent's ResourceExhausted", err)
	}
}

// lookingEngine answers Status and Lookup, and records every call that
// reaches it.
type lookingEngine struct {
	fabricpb.UnimplementedEngineServer
	mu  sync.Mutex
	got []string
}

func (e *lookingEngine) Status(context.Context, *fabricpb.StatusRequest) (*fabricpb.StatusResponse, error) {
	return &fabricpb.StatusResponse{}, nil
}

func (e *lookingEngine) Lookup(context.Context, *fabricpb.LookupRequest) (*fabricpb.LookupResponse, error) {
	return &fabricpb.LookupResponse{}, nil
}

// A client dialled WithoutSession (the agent's implicit session, outside
// its bounds on sessions) makes only the calls that hold nothing: Status
// and Lookup reach the agent; Register and every call naming a block set,
// which take slots or sets, are refused FAILED_PRECONDITION by the client
// itself, sent nowhere.
func TestWithoutSessionOnlyLooks(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "engine.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	e := &lookingEngine{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		e.mu.Lock()
		e.got = append(e.got, path.Base(info.FullMethod))
		e.mu.Unlock()
		return h(ctx, req)
	}))
	fabricpb.RegisterEngineServer(srv, e)
	go srv.Serve(lis)
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Dial(ctx, sock, WithoutSession())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Status(ctx); err != nil {
		t.Fatalf("Status without a session: %v", err)
	}
	if _, err := c.Lookup(ctx, []uint64{1}); err != nil {
		t.Fatalf("Lookup without a session: %v", err)
	}
	refused := map[string]func() error{
		"Register": func() error { _, err := c.Register(ctx, Engine{Name: "e"}); return err },
		"Allocate": func() error { _, err := c.Allocate(ctx, 1, 1); return err },
		"Free":     func() error { return c.Free(ctx, 1, []uint32{0}) },
		"RegisterBlocks": func() error {
			_, err := c.RegisterBlocks(ctx, 1, []uint32{0}, []uint64{1})
			return err
		},
		"Acquire":      func() error { _, err := c.Acquire(ctx, 1, []uint64{1}); return err },
		"Release":      func() error { return c.Release(ctx, 1, []uint32{0}) },
		"Import":       func() error { _, err := c.Import(ctx, 1, []uint64{1}); return err },
		"DropBlockSet": func() error { _, err := c.DropBlockSet(ctx, 1); return err },
		"Prefetch":     func() error { _, err := c.Prefetch(ctx, 1, []uint64{1}); return err },
	}
	for name, call := range refused {
		err := call()
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), name+": dialled WithoutSession") {
			t.Errorf("%s without a session: %v, want FAILED_PRECONDITION naming WithoutSession", name, err)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if strings.Join(e.got, ",") != "Status,Lookup" {
		t.Errorf("the agent got %v, want Status and Lookup only", e.got)
	}
}
