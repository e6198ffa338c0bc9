package client

import (
	"context"
	"net"
	"path/filepath"
	"strings"
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
