// The engine API: how an inference engine talks to the kvfabric agent on its
// node, over gRPC on a unix socket (mode 0600 and the agent's group unless
// the agent is configured otherwise: engine_socket_mode,
// engine_socket_group).
//
// Flow for an engine: OpenSession first and keep its stream open (see
// Sessions below), then Register once (it gets its block set, the memory to
// map and, per rank, where every byte goes), map the memory (see Memory),
// then Allocate slots, write KV into them, RegisterBlocks with their
// sequence hashes (or token ids), Lookup who holds a prefix, Import blocks
// from the cluster into local slots, Acquire and Release blocks it reads.
//
// Sessions. Everything an engine allocates, references (Acquire, Import,
// RegisterBlocks) or registers a block set for belongs to the session it
// was done under. The engine calls OpenSession and sends a SessionRequest;
// the first SessionEvent carries the session id, which the engine sends on
// every other call as gRPC metadata "kvfabric-session" (decimal). It keeps
// the stream open, sending a SessionRequest at least every keepalive_ms
// (a third of it is a good period). A malformed id is INVALID_ARGUMENT.
// The sessions open at once are bounded, per process (the agent's
// engine_sessions_per_process, 64 by default) and in all
// (engine_sessions, 1,024), each stream counted from its start, before its
// first SessionRequest: one past either fails RESOURCE_EXHAUSTED at once,
// naming the bound and how many are open. A process the agent cannot
// name (Session.pid 0) counts only in all. The session ends
// when the engine closes the stream, the connection drops (the process
// died) or no SessionRequest came for keepalive_ms: the agent then
// releases its references and frees its unregistered slots; registered
// blocks stay cached for others. An engine whose session ended must not
// read or write the slots it held (they may be another's by then): it
// opens a new session and starts over. A call naming a session that is not open
// fails with FAILED_PRECONDITION and does nothing. An Allocate,
// RegisterBlocks, Acquire or Import whose session ends (an engine stalled
// past keepalive_ms) before its last hold (where the agent records what
// it took in the session) fails with FAILED_PRECONDITION too ("ended
// during the call") and answers no slot or block: what it took was given
// back with the rest (blocks it registered stay cached for others). One
// whose session ends after that hold answers as before, and the engine
// learns it from its session stream, after which it must use nothing it
// holds; other calls answer as before. Either way the engine opens a new
// session. Such a call whose set its own session dropped meanwhile
// (DropBlockSet) fails with FAILED_PRECONDITION too ("dropped it during
// the call"); that session goes on. Calls with no session
// metadata work under one implicit session that never ends: what they
// hold is held until released, as before sessions existed.
//
// Block sets. Register reuses a block set of the same layout (and slot
// count, when one is asked; when none is, the largest such set the
// session already uses, else the largest such set if it holds the agent's
// default slot count, else a new set of that count, else, with no room for
// one, the largest there is); engines sharing a set each hold their own
// references and slots. A set that no session uses any more (all that
// registered or used it dropped it or ended) is freed after the agent's
// grace period, or at once when another Register needs its memory: its
// registered blocks are evicted (remove events, so the cluster forgets
// them) and its id is never reused.
//
// Per-block results. RegisterBlocks, Acquire and Import answer one
// BlockResult per block asked for, in request order, saying what happened
// to it; a request that is malformed, or that did nothing at all, fails
// with a gRPC error instead.
//
// Errors use gRPC codes: INVALID_ARGUMENT for a malformed request (the
// message names the field; strings are bounded: engine names 128 bytes,
// device names 64, salt and LoRA names 256), NOT_FOUND for an unknown
// block set and for blocks that no node holds (an Import or Acquire of
// them: the call, or the block's BlockResult.code), RESOURCE_EXHAUSTED
// when the pool has too few free slots or a session would pass the
// bounds on sessions, UNAVAILABLE when nodes hold the
// blocks but none could serve an import, FAILED_PRECONDITION for a slot
// the session holds nothing on (whatever its number) or one in the wrong
// state, and for a session that is not open (on every call that names
// one, Lookup and Status included) or that ended during the call;
// PERMISSION_DENIED for a call that names a block set (Lookup's included)
// from a process other than those it was handed to (by Register, or by
// its memory's descriptor socket) while one of them still runs, and for a
// call under a session that another process opened. Both hold where the
// agent knows the calling process (the socket's peer credentials): one
// its PID namespace does not show (Session.pid 0) passes both. A block set
// handed to such a process records no receiver, so any other process may
// join it or take it up by a call naming it while that one runs (the
// first of those the agent knows is recorded as a receiver, and keeps the
// others the agent knows off it while it runs), and a session such a
// process opened can be used by any process the agent knows: the socket's
// mode and group are the boundary there. A call naming a block set takes
// it up (its session uses the set, its process is recorded) before the
// call's other fields are checked: one refused for them (INVALID_ARGUMENT)
// has still taken the set up.

// Code generated by protoc-gen-go-grpc. DO NOT EDIT.
// versions:
// - protoc-gen-go-grpc v1.6.2
// - protoc             v3.21.12
// source: fabric/fabricpb/engine.proto

package fabricpb

import (
	context "context"
	grpc "google.golang.org/grpc"
	codes "google.golang.org/grpc/codes"
	status "google.golang.org/grpc/status"
)

// This is a compile-time assertion to ensure that this generated file
// is compatible with the grpc package it is being compiled against.
// Requires gRPC-Go v1.64.0 or later.
const _ = grpc.SupportPackageIsVersion9

const (
	Engine_Register_FullMethodName       = "/kvfabric.fabric.v1.Engine/Register"
	Engine_Allocate_FullMethodName       = "/kvfabric.fabric.v1.Engine/Allocate"
	Engine_Free_FullMethodName           = "/kvfabric.fabric.v1.Engine/Free"
	Engine_RegisterBlocks_FullMethodName = "/kvfabric.fabric.v1.Engine/RegisterBlocks"
	Engine_Acquire_FullMethodName        = "/kvfabric.fabric.v1.Engine/Acquire"
	Engine_Release_FullMethodName        = "/kvfabric.fabric.v1.Engine/Release"
	Engine_Lookup_FullMethodName         = "/kvfabric.fabric.v1.Engine/Lookup"
	Engine_Import_FullMethodName         = "/kvfabric.fabric.v1.Engine/Import"
	Engine_Status_FullMethodName         = "/kvfabric.fabric.v1.Engine/Status"
	Engine_OpenSession_FullMethodName    = "/kvfabric.fabric.v1.Engine/OpenSession"
	Engine_DropBlockSet_FullMethodName   = "/kvfabric.fabric.v1.Engine/DropBlockSet"
	Engine_Prefetch_FullMethodName       = "/kvfabric.fabric.v1.Engine/Prefetch"
)

// EngineClient is the client API for Engine service.
//
// For semantics around ctx use and closing/ending streaming RPCs, please refer to https://pkg.go.dev/google.golang.org/grpc/?tab=doc#ClientConn.NewStream.
type EngineClient interface {
	// Register an engine's layout; returns its block set (made or reused).
	Register(ctx context.Context, in *RegisterRequest, opts ...grpc.CallOption) (*RegisterResponse, error)
	// Allocate free slots in a block set, for the engine to write into.
	Allocate(ctx context.Context, in *AllocateRequest, opts ...grpc.CallOption) (*AllocateResponse, error)
	// Give back allocated slots that were never registered.
	Free(ctx context.Context, in *FreeRequest, opts ...grpc.CallOption) (*FreeResponse, error)
	// Register written slots as blocks, by sequence hash or by token ids.
	RegisterBlocks(ctx context.Context, in *RegisterBlocksRequest, opts ...grpc.CallOption) (*RegisterBlocksResponse, error)
	// Take references on registered blocks so they are not recycled.
	Acquire(ctx context.Context, in *AcquireRequest, opts ...grpc.CallOption) (*AcquireResponse, error)
	// Drop references taken by Acquire, Import or RegisterBlocks.
	Release(ctx context.Context, in *ReleaseRequest, opts ...grpc.CallOption) (*ReleaseResponse, error)
	// Per node, how many leading blocks of a sequence it holds.
	Lookup(ctx context.Context, in *LookupRequest, opts ...grpc.CallOption) (*LookupResponse, error)
	// Bring blocks from the cluster into local slots.
	Import(ctx context.Context, in *ImportRequest, opts ...grpc.CallOption) (*ImportResponse, error)
	// The agent's view: node, members, block sets, transfers.
	Status(ctx context.Context, in *StatusRequest, opts ...grpc.CallOption) (*StatusResponse, error)
	// Open a session: the engine keeps the stream open for as long as it
	// works, sending a SessionRequest at least every keepalive_ms; the first
	// SessionEvent carries the session id. Ending the stream ends the
	// session.
	OpenSession(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[SessionRequest, SessionEvent], error)
	// Stop using a block set under the calling session: its references and
	// unregistered slots there are given back, as when the session ends.
	DropBlockSet(ctx context.Context, in *DropBlockSetRequest, opts ...grpc.CallOption) (*DropBlockSetResponse, error)
	// Bring the leading blocks of a sequence that this node's disk tiers hold
	// up into a block set ahead of use, then those that follow from other
	// nodes (as Import would), cached there unreferenced, so that the Acquire
	// or Import that follows finds them in memory.
	Prefetch(ctx context.Context, in *PrefetchRequest, opts ...grpc.CallOption) (*PrefetchResponse, error)
}

type engineClient struct {
	cc grpc.ClientConnInterface
}

func NewEngineClient(cc grpc.ClientConnInterface) EngineClient {
	return &engineClient{cc}
}

func (c *engineClient) Register(ctx context.Context, in *RegisterRequest, opts ...grpc.CallOption) (*RegisterResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(RegisterResponse)
	err := c.cc.Invoke(ctx, Engine_Register_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) Allocate(ctx context.Context, in *AllocateRequest, opts ...grpc.CallOption) (*AllocateResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(AllocateResponse)
	err := c.cc.Invoke(ctx, Engine_Allocate_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) Free(ctx context.Context, in *FreeRequest, opts ...grpc.CallOption) (*FreeResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(FreeResponse)
	err := c.cc.Invoke(ctx, Engine_Free_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) RegisterBlocks(ctx context.Context, in *RegisterBlocksRequest, opts ...grpc.CallOption) (*RegisterBlocksResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(RegisterBlocksResponse)
	err := c.cc.Invoke(ctx, Engine_RegisterBlocks_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) Acquire(ctx context.Context, in *AcquireRequest, opts ...grpc.CallOption) (*AcquireResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(AcquireResponse)
	err := c.cc.Invoke(ctx, Engine_Acquire_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) Release(ctx context.Context, in *ReleaseRequest, opts ...grpc.CallOption) (*ReleaseResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(ReleaseResponse)
	err := c.cc.Invoke(ctx, Engine_Release_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) Lookup(ctx context.Context, in *LookupRequest, opts ...grpc.CallOption) (*LookupResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(LookupResponse)
	err := c.cc.Invoke(ctx, Engine_Lookup_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) Import(ctx context.Context, in *ImportRequest, opts ...grpc.CallOption) (*ImportResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(ImportResponse)
	err := c.cc.Invoke(ctx, Engine_Import_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) Status(ctx context.Context, in *StatusRequest, opts ...grpc.CallOption) (*StatusResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(StatusResponse)
	err := c.cc.Invoke(ctx, Engine_Status_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) OpenSession(ctx context.Context, opts ...grpc.CallOption) (grpc.BidiStreamingClient[SessionRequest, SessionEvent], error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	stream, err := c.cc.NewStream(ctx, &Engine_ServiceDesc.Streams[0], Engine_OpenSession_FullMethodName, cOpts...)
	if err != nil {
		return nil, err
	}
	x := &grpc.GenericClientStream[SessionRequest, SessionEvent]{ClientStream: stream}
	return x, nil
}

// This type alias is provided for backwards compatibility with existing code that references the prior non-generic stream type by name.
type Engine_OpenSessionClient = grpc.BidiStreamingClient[SessionRequest, SessionEvent]

func (c *engineClient) DropBlockSet(ctx context.Context, in *DropBlockSetRequest, opts ...grpc.CallOption) (*DropBlockSetResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(DropBlockSetResponse)
	err := c.cc.Invoke(ctx, Engine_DropBlockSet_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func (c *engineClient) Prefetch(ctx context.Context, in *PrefetchRequest, opts ...grpc.CallOption) (*PrefetchResponse, error) {
	cOpts := append([]grpc.CallOption{grpc.StaticMethod()}, opts...)
	out := new(PrefetchResponse)
	err := c.cc.Invoke(ctx, Engine_Prefetch_FullMethodName, in, out, cOpts...)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// EngineServer is the server API for Engine service.
// All implementations must embed UnimplementedEngineServer
// for forward compatibility.
type EngineServer interface {
	// Register an engine's layout; returns its block set (made or reused).
	Register(context.Context, *RegisterRequest) (*RegisterResponse, error)
	// Allocate free slots in a block set, for the engine to write into.
	Allocate(context.Context, *AllocateRequest) (*AllocateResponse, error)
	// Give back allocated slots that were never registered.
	Free(context.Context, *FreeRequest) (*FreeResponse, error)
	// Register written slots as blocks, by sequence hash or by token ids.
	RegisterBlocks(context.Context, *RegisterBlocksRequest) (*RegisterBlocksResponse, error)
	// Take references on registered blocks so they are not recycled.
	Acquire(context.Context, *AcquireRequest) (*AcquireResponse, error)
	// Drop references taken by Acquire, Import or RegisterBlocks.
	Release(context.Context, *ReleaseRequest) (*ReleaseResponse, error)
	// Per node, how many leading blocks of a sequence it holds.
	Lookup(context.Context, *LookupRequest) (*LookupResponse, error)
	// Bring blocks from the cluster into local slots.
	Import(context.Context, *ImportRequest) (*ImportResponse, error)
	// The agent's view: node, members, block sets, transfers.
	Status(context.Context, *StatusRequest) (*StatusResponse, error)
	// Open a session: the engine keeps the stream open for as long as it
	// works, sending a SessionRequest at least every keepalive_ms; the first
	// SessionEvent carries the session id. Ending the stream ends the
	// session.
	OpenSession(grpc.BidiStreamingServer[SessionRequest, SessionEvent]) error
	// Stop using a block set under the calling session: its references and
	// unregistered slots there are given back, as when the session ends.
	DropBlockSet(context.Context, *DropBlockSetRequest) (*DropBlockSetResponse, error)
	// Bring the leading blocks of a sequence that this node's disk tiers hold
	// up into a block set ahead of use, then those that follow from other
	// nodes (as Import would), cached there unreferenced, so that the Acquire
	// or Import that follows finds them in memory.
	Prefetch(context.Context, *PrefetchRequest) (*PrefetchResponse, error)
	mustEmbedUnimplementedEngineServer()
}

// UnimplementedEngineServer must be embedded to have
// forward compatible implementations.
//
// NOTE: this should be embedded by value instead of pointer to avoid a nil
// pointer dereference when methods are called.
type UnimplementedEngineServer struct{}

func (UnimplementedEngineServer) Register(context.Context, *RegisterRequest) (*RegisterResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Register not implemented")
}
func (UnimplementedEngineServer) Allocate(context.Context, *AllocateRequest) (*AllocateResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Allocate not implemented")
}
func (UnimplementedEngineServer) Free(context.Context, *FreeRequest) (*FreeResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Free not implemented")
}
func (UnimplementedEngineServer) RegisterBlocks(context.Context, *RegisterBlocksRequest) (*RegisterBlocksResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method RegisterBlocks not implemented")
}
func (UnimplementedEngineServer) Acquire(context.Context, *AcquireRequest) (*AcquireResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Acquire not implemented")
}
func (UnimplementedEngineServer) Release(context.Context, *ReleaseRequest) (*ReleaseResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Release not implemented")
}
func (UnimplementedEngineServer) Lookup(context.Context, *LookupRequest) (*LookupResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Lookup not implemented")
}
func (UnimplementedEngineServer) Import(context.Context, *ImportRequest) (*ImportResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Import not implemented")
}
func (UnimplementedEngineServer) Status(context.Context, *StatusRequest) (*StatusResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Status not implemented")
}
func (UnimplementedEngineServer) OpenSession(grpc.BidiStreamingServer[SessionRequest, SessionEvent]) error {
	return status.Error(codes.Unimplemented, "method OpenSession not implemented")
}
func (UnimplementedEngineServer) DropBlockSet(context.Context, *DropBlockSetRequest) (*DropBlockSetResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method DropBlockSet not implemented")
}
func (UnimplementedEngineServer) Prefetch(context.Context, *PrefetchRequest) (*PrefetchResponse, error) {
	return nil, status.Error(codes.Unimplemented, "method Prefetch not implemented")
}
func (UnimplementedEngineServer) mustEmbedUnimplementedEngineServer() {}
func (UnimplementedEngineServer) testEmbeddedByValue()                {}

// UnsafeEngineServer may be embedded to opt out of forward compatibility for this service.
// Use of this interface is not recommended, as added methods to EngineServer will
// result in compilation errors.
type UnsafeEngineServer interface {
	mustEmbedUnimplementedEngineServer()
}

func RegisterEngineServer(s grpc.ServiceRegistrar, srv EngineServer) {
	// If the following call panics, it indicates UnimplementedEngineServer was
	// embedded by pointer and is nil.  This will cause panics if an
	// unimplemented method is ever invoked, so we test this at initialization
	// time to prevent it from happening at runtime later due to I/O.
	if t, ok := srv.(interface{ testEmbeddedByValue() }); ok {
		t.testEmbeddedByValue()
	}
	s.RegisterService(&Engine_ServiceDesc, srv)
}

func _Engine_Register_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(RegisterRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Register(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Register_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Register(ctx, req.(*RegisterRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_Allocate_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(AllocateRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Allocate(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Allocate_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Allocate(ctx, req.(*AllocateRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_Free_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(FreeRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Free(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Free_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Free(ctx, req.(*FreeRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_RegisterBlocks_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(RegisterBlocksRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).RegisterBlocks(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_RegisterBlocks_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).RegisterBlocks(ctx, req.(*RegisterBlocksRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_Acquire_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(AcquireRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Acquire(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Acquire_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Acquire(ctx, req.(*AcquireRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_Release_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(ReleaseRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Release(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Release_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Release(ctx, req.(*ReleaseRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_Lookup_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(LookupRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Lookup(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Lookup_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Lookup(ctx, req.(*LookupRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_Import_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(ImportRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Import(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Import_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Import(ctx, req.(*ImportRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_Status_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(StatusRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Status(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Status_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Status(ctx, req.(*StatusRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_OpenSession_Handler(srv interface{}, stream grpc.ServerStream) error {
	return srv.(EngineServer).OpenSession(&grpc.GenericServerStream[SessionRequest, SessionEvent]{ServerStream: stream})
}

// This type alias is provided for backwards compatibility with existing code that references the prior non-generic stream type by name.
type Engine_OpenSessionServer = grpc.BidiStreamingServer[SessionRequest, SessionEvent]

func _Engine_DropBlockSet_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(DropBlockSetRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).DropBlockSet(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_DropBlockSet_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).DropBlockSet(ctx, req.(*DropBlockSetRequest))
	}
	return interceptor(ctx, in, info, handler)
}

func _Engine_Prefetch_Handler(srv interface{}, ctx context.Context, dec func(interface{}) error, interceptor grpc.UnaryServerInterceptor) (interface{}, error) {
	in := new(PrefetchRequest)
	if err := dec(in); err != nil {
		return nil, err
	}
	if interceptor == nil {
		return srv.(EngineServer).Prefetch(ctx, in)
	}
	info := &grpc.UnaryServerInfo{
		Server:     srv,
		FullMethod: Engine_Prefetch_FullMethodName,
	}
	handler := func(ctx context.Context, req interface{}) (interface{}, error) {
		return srv.(EngineServer).Prefetch(ctx, req.(*PrefetchRequest))
	}
	return interceptor(ctx, in, info, handler)
}

// Engine_ServiceDesc is the grpc.ServiceDesc for Engine service.
// It's only intended for direct use with grpc.RegisterService,
// and not to be introspected or modified (even as a copy)
var Engine_ServiceDesc = grpc.ServiceDesc{
	ServiceName: "kvfabric.fabric.v1.Engine",
	HandlerType: (*EngineServer)(nil),
	Methods: []grpc.MethodDesc{
		{
			MethodName: "Register",
			Handler:    _Engine_Register_Handler,
		},
		{
			MethodName: "Allocate",
			Handler:    _Engine_Allocate_Handler,
		},
		{
			MethodName: "Free",
			Handler:    _Engine_Free_Handler,
		},
		{
			MethodName: "RegisterBlocks",
			Handler:    _Engine_RegisterBlocks_Handler,
		},
		{
			MethodName: "Acquire",
			Handler:    _Engine_Acquire_Handler,
		},
		{
			MethodName: "Release",
			Handler:    _Engine_Release_Handler,
		},
		{
			MethodName: "Lookup",
			Handler:    _Engine_Lookup_Handler,
		},
		{
			MethodName: "Import",
			Handler:    _Engine_Import_Handler,
		},
		{
			MethodName: "Status",
			Handler:    _Engine_Status_Handler,
		},
		{
			MethodName: "DropBlockSet",
			Handler:    _Engine_DropBlockSet_Handler,
		},
		{
			MethodName: "Prefetch",
			Handler:    _Engine_Prefetch_Handler,
		},
	},
	Streams: []grpc.StreamDesc{
		{
			StreamName:    "OpenSession",
			Handler:       _Engine_OpenSession_Handler,
			ServerStreams: true,
			ClientStreams: true,
		},
	},
	Metadata: "fabric/fabricpb/engine.proto",
}
