// Package client is the Go client of the kvfabric engine API: an inference
// engine (or a tool) talks to the agent on its node through a unix socket
// and reads and writes blocks in the pool memory it maps.
//
//	c, _ := client.Dial(ctx, "/var/lib/kvfabric/engine.sock")
//	set, _ := c.Register(ctx, client.Engine{Name: "vllm-0", Model: m, TPSize: 2, PageSize: 16, Order: layout.HND})
//	slots, _ := c.Allocate(ctx, set.ID, 4)
//	copy(set.Block(rank, slots[0]), kv) // write each rank's shard
//	c.RegisterBlocks(ctx, set.ID, slots, hashes)
//
// Other languages use the protobuf sources in fabric/fabricpb.
package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/pcitopo"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// Client is a connection to the local agent, working inside one engine
// session: what it allocates, references and registers block sets for is
// given back by the agent when the client closes or its process dies
// (dialled WithoutSession, under the agent's implicit session instead). It
// is safe for concurrent use.
type Client struct {
	conn   *grpc.ClientConn
	api    fabricpb.EngineClient
	socket string // the engine socket's absolute path

	session   uint64
	noSession bool // dialled WithoutSession: only sessionless calls go
	keepalive time.Duration
	stopKeep  context.CancelFunc
	keepDone  chan struct{}
	sessErr   atomic.Pointer[error]

	mu   sync.Mutex
	maps map[string][]byte // memory mapped, by token (or path)
	ipcs map[cuda.IPCHandle]*cuda.IPCMemory
	// users are the block sets of this client that use each mapping (by
	// its key in maps) or device memory (by its handle in ipcs), and sets
	// the BlockSets handed out, by set: DropBlockSet gives up what no
	// other set uses, and takes the views of those it handed out.
	users map[any]map[uint64]struct{}
	sets  map[uint64][]*BlockSet
}

// DialOption changes what Dial does.
type DialOption func(*dialOptions)

type dialOptions struct {
	noSession bool
}

// WithoutSession has Dial open no session: the client's calls run under
// the agent's implicit session, which never ends, so that what they hold
// (slots, references, block sets) would stay held until released. It is
// for callers that hold nothing, Status and Lookup (kvfabric status,
// members, lookup): the agent's bounds on sessions (engine_sessions,
// engine_sessions_per_process) do not refuse them, so an operator can
// look at an agent whose sessions are all taken. Every other call
// (Register, and the calls naming a block set, which take it up) is
// refused by the client itself (FAILED_PRECONDITION), sent nowhere: it
// would take slots or sets under the implicit session, outside those
// bounds. Nothing is asked of the agent until the first call.
func WithoutSession() DialOption {
	return func(o *dialOptions) { o.noSession = true }
}

// Dial connects to the agent's engine socket and opens a session, which
// lasts until Close (none with WithoutSession). ctx bounds the dial and
// the opening.
func Dial(ctx context.Context, socket string, opts ...DialOption) (*Client, error) {
	var o dialOptions
	for _, opt := range opts {
		opt(&o)
	}
	if _, err := os.Stat(socket); err != nil {
		return nil, fmt.Errorf("client: engine socket: %w (is the agent running?)", err)
	}
	// unix:PATH, not unix://PATH: the latter reads a relative path's first
	// element as an authority.
	abs, err := filepath.Abs(socket)
	if err != nil {
		return nil, fmt.Errorf("client: engine socket: %w", err)
	}
	c := &Client{maps: map[string][]byte{}, ipcs: map[cuda.IPCHandle]*cuda.IPCMemory{},
		users: map[any]map[uint64]struct{}{}, sets: map[uint64][]*BlockSet{}, keepDone: make(chan struct{})}
	conn, err := grpc.NewClient("unix:"+abs,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)),
		grpc.WithUnaryInterceptor(c.withSession))
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	c.conn, c.api, c.socket = conn, fabricpb.NewEngineClient(conn), abs
	if o.noSession {
		c.noSession = true
		return c, nil
	}
	if err := c.openSession(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// sessionless names the calls a client dialled WithoutSession makes: they
// hold nothing.
var sessionless = map[string]bool{
	fabricpb.Engine_Status_FullMethodName: true,
	fabricpb.Engine_Lookup_FullMethodName: true,
}

// handsSlots names the calls whose answer hands the engine slots or blocks
// to use under its session.
var handsSlots = map[string]bool{
	fabricpb.Engine_Allocate_FullMethodName:       true,
	fabricpb.Engine_RegisterBlocks_FullMethodName: true,
	fabricpb.Engine_Acquire_FullMethodName:        true,
	fabricpb.Engine_Import_FullMethodName:         true,
}

// withSession names the client's session on every call. A call that hands
// slots or blocks and succeeded fails, FAILED_PRECONDITION, where the
// session is known to have ended by the time its answer came: the agent
// gave back what the session held, the answer's included, so none of it
// is the engine's. (The agent answers so itself where the session ended
// before the call recorded what it took; this narrows what is left, an
// end that comes just after.) Other calls' answers stay true: a Release
// that succeeded did release.
func (c *Client) withSession(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if c.noSession && !sessionless[method] {
		return status.Errorf(codes.FailedPrecondition, "client: %s: dialled WithoutSession, which only looks (Status, Lookup): a call that registers, or names a block set, takes slots or sets, and needs a session of its own (Dial without WithoutSession)", path.Base(method))
	}
	if c.session != 0 {
		ctx = metadata.AppendToOutgoingContext(ctx, fabricpb.SessionMetadata, strconv.FormatUint(c.session, 10))
	}
	if err := invoker(ctx, method, req, reply, cc, opts...); err != nil {
		return err
	}
	if handsSlots[method] {
		if err := c.SessionErr(); err != nil {
			return status.Errorf(codes.FailedPrecondition, "%v, as the call answered: its slots and blocks were given back (Dial again)", err)
		}
	}
	return nil
}

// beforeSessionSend, set by tests, runs where openSession has opened its
// stream and before it sends the first request.
var beforeSessionSend func(stream fabricpb.Engine_OpenSessionClient)

// openSession opens the client's session and keeps it alive until Close.
func (c *Client) openSession(ctx context.Context) error {
	sctx, cancel := context.WithCancel(context.Background())
	stream, err := c.api.OpenSession(sctx)
	if err != nil {
		cancel()
		return fmt.Errorf("client: open session: %w", err)
	}
	if beforeSessionSend != nil {
		beforeSessionSend(stream)
	}
	// A stream the agent refused at once (past its bounds on sessions)
	// may have ended before the request went: Send then says only EOF,
	// and the refusal comes with Recv, which is asked all the same.
	sendErr := stream.Send(&fabricpb.SessionRequest{Engine: filepath.Base(os.Args[0])})
	first := make(chan error, 1)
	var ev *fabricpb.SessionEvent
	go func() {
		var err error
		ev, err = stream.Recv()
		first <- err
	}()
	select {
	case err = <-first:
	case <-ctx.Done():
		cancel()
		<-first
		err = ctx.Err()
	}
	if err == nil && sendErr != nil {
		err = sendErr // an answer with no request: not a session
	}
	if err != nil {
		cancel()
		// An agent's refusal (past its bounds on sessions, say) says
		// what is wrong itself: the agent is running.
		if _, refused := status.FromError(err); refused && status.Code(err) != codes.Unavailable {
			return fmt.Errorf("client: open session: %w", err)
		}
		return fmt.Errorf("client: open session: %w (is the agent running?)", err)
	}
	c.session, c.keepalive, c.stopKeep = ev.GetSession(), time.Duration(ev.GetKeepaliveMs())*time.Millisecond, cancel
	if c.keepalive <= 0 {
		c.keepalive = time.Second
	}
	go c.keepAlive(stream)
	return nil
}

// keepAlive sends a SessionRequest every third of the agent's bound until
// Close, or until the session ends (SessionErr says why).
func (c *Client) keepAlive(stream fabricpb.Engine_OpenSessionClient) {
	defer close(c.keepDone)
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	t := time.NewTicker(c.keepalive / 3)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if err := stream.Send(&fabricpb.SessionRequest{}); err != nil {
				// Recv reports why.
				continue
			}
		case err := <-ended:
			if status.Code(err) != codes.Canceled {
				err = fmt.Errorf("client: session %d ended: %w", c.session, err)
				c.sessErr.Store(&err)
			}
			return
		}
	}
}

// Session returns the id of the client's session, 0 for none (WithoutSession).
func (c *Client) Session() uint64 { return c.session }

// SessionErr says why the client's session ended before Close, nil while
// it is open. Calls fail once it has ended; Dial again for a new one.
func (c *Client) SessionErr() error {
	if p := c.sessErr.Load(); p != nil {
		return *p
	}
	return nil
}

// API returns the raw gRPC client, for calls this package does not wrap.
func (c *Client) API() fabricpb.EngineClient { return c.api }

// Close closes the connection, unmaps the pool memory and closes the
// device memory opened from IPC handles. The BlockSets it returned lose
// Ranks and Device; byte slices and device pointers taken from them must
// not be used after it.
func (c *Client) Close() error {
	if c.stopKeep != nil {
		c.stopKeep()
		<-c.keepDone
		c.stopKeep = nil
	}
	var errs []error
	c.mu.Lock()
	for p, b := range c.maps {
		syscall.Munmap(b)
		delete(c.maps, p)
	}
	for h, m := range c.ipcs {
		errs = append(errs, m.Close())
		delete(c.ipcs, h)
	}
	clear(c.users)
	for id, sets := range c.sets {
		for _, s := range sets {
			s.Ranks, s.Device = nil, nil
		}
		delete(c.sets, id)
	}
	c.mu.Unlock()
	errs = append(errs, c.conn.Close())
	return errors.Join(errs...)
}

// Engine describes an engine's KV cache to the agent.
type Engine struct {
	Name        string
	Model       layout.ModelConfig
	TPSize      int
	PageSize    int
	Order       layout.KVOrder
	Arrangement layout.Arrangement // zero: fully contiguous
	Slots       int                // zero: the agent's default
	// Alignment is the power of two strides are rounded to; zero: the
	// agent's default (4096).
	Alignment uint64
	// Devices, one per TP rank, places each rank's region on a GPU of
	// the agent's device pools: its PCI bus id (what cuda.DeviceInfo's
	// PCIBusID says in this process) or the agent's CUDA index; "" lets
	// the agent choose. If nil, rank r is on the agent's r-th device pool.
	// Ignored by an agent whose pool is host memory.
	Devices []string
	// CUDA, when set, opens an agent's device pool in this process: the
	// IPC handle is opened (cuIpcOpenMemHandle) on the GPU with the PCI bus
	// id the agent names, and BlockSet.Device holds each rank's device
	// region. If nil, a device pool's block set comes back with
	// BlockSet.Memory only, for engines that open the handle themselves.
	CUDA *cuda.Driver
	// Join, when set, joins that block set, which another process of the
	// engine registered and whose JoinToken it passed on, instead of
	// letting the agent choose one; the layout must be the set's (Slots
	// zero takes the set's count). A wrong token is PermissionDenied, a
	// freed set NotFound.
	Join *Join
}

// checkCounts refuses a count of e that the request's unsigned 32-bit
// field cannot carry (a negative one, or one past 2^32-1), which would go
// as another count, wrapped: 2^32+2 slots went as 2.
func (e Engine) checkCounts() error {
	for _, f := range []struct {
		field, wire string
		n           int
	}{
		{"Model.Layers", "model.layers", e.Model.Layers}, {"Model.KVHeads", "model.kv_heads", e.Model.KVHeads},
		{"Model.HeadDim", "model.head_dim", e.Model.HeadDim}, {"TPSize", "tp_size", e.TPSize},
		{"PageSize", "page_size", e.PageSize}, {"Slots", "slots", e.Slots},
	} {
		if err := checkU32("Register: Engine."+f.field+" ("+f.wire+")", f.n); err != nil {
			return err
		}
	}
	return nil
}

// checkU32 refuses n, named what, where an unsigned 32-bit field cannot
// carry it: InvalidArgument, sent nowhere.
func checkU32(what string, n int) error {
	if n < 0 || uint64(n) > math.MaxUint32 {
		return status.Errorf(codes.InvalidArgument, "client: %s: %d is not in 0..%d", what, n, uint32(math.MaxUint32))
	}
	return nil
}

// Join names a block set to join (Engine.Join): its ID and the JoinToken
// of the BlockSet its registering process was given.
type Join struct {
	BlockSet uint64
	Token    string
}

// DeviceRegion is one rank's region in device memory this process opened
// from the agent's IPC handle.
type DeviceRegion struct {
	// GPU is this process's CUDA index of the GPU.
	GPU int
	// Ptr is the region's device pointer in this process; Size its bytes.
	Ptr, Size uint64
}

// BlockSet is an engine's block set with its memory mapped. Its memory is
// the client's until DropBlockSet of the set, or Close: then Ranks and
// Device are cleared, and the byte slices and device pointers taken from
// them must not be used (the mapping is gone, or the device memory
// closed, once no other set of the client uses it).
type BlockSet struct {
	ID     uint64
	Layout *layout.Layout
	// Ranks holds each TP rank's region.
	Ranks [][]byte
	// Retains is how many registered blocks the set keeps before
	// allocating recycles them; storing more loses sequence tails.
	Retains int
	// Description is the agent's per-rank description of where bytes go
	// (engine.proto's RankLayout), for engines that place bytes
	// themselves.
	Description []*fabricpb.RankLayout
	// Device holds each rank's region for a device pool opened through
	// Engine.CUDA; nil for host memory (then Ranks is set).
	Device []DeviceRegion
	// Memory is the agent's answer of where each rank's region lives
	// (engine.proto's Memory), IPC handle included for device pools.
	Memory []*fabricpb.Memory
	// JoinToken lets another process of the engine join the set
	// (RegisterRequest.join_token); pass it only to the engine's own.
	JoinToken string
}

// Block returns the bytes of slot's shard on rank in a fully contiguous
// layout: layers, K and V, in the layout's order. For layer-separate
// layouts use Layout.ChunkOffset on Ranks[rank].
func (s *BlockSet) Block(rank, slot int) []byte {
	st := s.Layout.Strides()
	off := uint64(slot) * st.Block
	return s.Ranks[rank][off : off+st.Shard]
}

// Register registers the engine and maps its block set's memory: a set the
// agent chooses, or the one e.Join names. A set whose memory cannot be
// mapped (or opened) is given back (DropBlockSet), not left on the session;
// where that fails too, its error is joined to the one returned.
func (c *Client) Register(ctx context.Context, e Engine) (*BlockSet, error) {
	if err := e.checkCounts(); err != nil {
		return nil, err
	}
	req := &fabricpb.RegisterRequest{
		Engine:      e.Name,
		Model:       e.Model.Proto(),
		TpSize:      uint32(e.TPSize),
		PageSize:    uint32(e.PageSize),
		KvOrder:     layoutKVOrder(e.Order),
		Arrangement: layoutArrangement(e.Arrangement),
		Slots:       uint32(e.Slots),
		Alignment:   e.Alignment,
		Devices:     e.Devices,
	}
	if j := e.Join; j != nil {
		if j.BlockSet == 0 {
			return nil, errors.New("client: Join: no block set named (Join.BlockSet is 0)")
		}
		if j.Token == "" {
			return nil, fmt.Errorf("client: Join: block set %d's join token (BlockSet.JoinToken) is missing", j.BlockSet)
		}
		req.JoinBlockSet, req.JoinToken = j.BlockSet, j.Token
	}
	resp, err := c.api.Register(ctx, req)
	if err != nil {
		return nil, err
	}
	set, err := c.mapSet(e, resp)
	if err == nil {
		c.mu.Lock()
		c.sets[set.ID] = append(c.sets[set.ID], set)
		c.mu.Unlock()
	} else {
		// The agent attached the set to this session all the same: give it
		// back, or it stays the session's until the session ends.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropAfterFailedMap)
		defer cancel()
		if _, derr := c.DropBlockSet(dctx, resp.GetBlockSet()); derr != nil {
			err = errors.Join(err, fmt.Errorf("client: dropping block set %d after: %v", resp.GetBlockSet(), derr))
		}
		return nil, err
	}
	return set, nil
}

// dropAfterFailedMap bounds the DropBlockSet with which Register gives
// back a set whose memory it could not map.
const dropAfterFailedMap = 10 * time.Second

// mapSet makes the BlockSet of the agent's Register answer resp, its
// memory mapped (or opened through e.CUDA).
func (c *Client) mapSet(e Engine, resp *fabricpb.RegisterResponse) (*BlockSet, error) {
	l, err := layout.FromProto(resp.GetLayout())
	if err != nil {
		return nil, fmt.Errorf("client: agent sent a bad layout: %w", err)
	}
	if len(resp.GetMemory()) != l.TPSize {
		return nil, fmt.Errorf("client: agent sent %d memory regions for %d ranks", len(resp.GetMemory()), l.TPSize)
	}
	set := &BlockSet{ID: resp.GetBlockSet(), Layout: l, Retains: int(resp.GetRetains()),
		Description: resp.GetRanks(), Memory: resp.GetMemory(), JoinToken: resp.GetJoinToken()}
	if len(resp.GetMemory()[0].GetCudaIpcHandle()) > 0 {
		if e.CUDA == nil {
			return set, nil
		}
		set.Device = make([]DeviceRegion, l.TPSize)
		for r, m := range resp.GetMemory() {
			mem, gpu, err := c.openIPC(e.CUDA, m, set.ID)
			if err != nil {
				return nil, fmt.Errorf("client: rank %d: %w", r, err)
			}
			end := m.GetOffset() + m.GetSize()
			if end < m.GetOffset() || end > mem.Size() {
				return nil, fmt.Errorf("client: rank %d region [%d, %d) outside the device allocation (%d bytes)", r, m.GetOffset(), end, mem.Size())
			}
			set.Device[r] = DeviceRegion{GPU: gpu, Ptr: mem.Addr() + m.GetOffset(), Size: m.GetSize()}
		}
		return set, nil
	}
	set.Ranks = make([][]byte, l.TPSize)
	for r, m := range resp.GetMemory() {
		whole, err := c.mapMemory(m, set.ID)
		if err != nil {
			return nil, err
		}
		end := m.GetOffset() + m.GetSize()
		if end < m.GetOffset() || end > uint64(len(whole)) {
			return nil, fmt.Errorf("client: rank %d region [%d, %d) outside the pool memory (%d bytes)", r, m.GetOffset(), end, len(whole))
		}
		set.Ranks[r] = whole[m.GetOffset():end:end]
	}
	return set, nil
}

// openIPC opens the device memory m names, once per handle, on the GPU
// of this process with m's PCI bus id (the agent's CUDA index when the
// agent gave none), for block set id.
func (c *Client) openIPC(d *cuda.Driver, m *fabricpb.Memory, id uint64) (*cuda.IPCMemory, int, error) {
	var h cuda.IPCHandle
	if len(m.GetCudaIpcHandle()) != len(h) {
		return nil, 0, fmt.Errorf("agent sent an IPC handle of %d bytes, want %d", len(m.GetCudaIpcHandle()), len(h))
	}
	copy(h[:], m.GetCudaIpcHandle())
	gpu := -1
	for _, dev := range d.Devices() {
		if m.GetPciBusId() != "" && samePCIAddress(dev.PCIBusID, m.GetPciBusId()) {
			gpu = dev.Index
		}
	}
	if gpu < 0 {
		if m.GetPciBusId() != "" || int(m.GetCudaDevice()) >= len(d.Devices()) || m.GetCudaDevice() < 0 {
			return nil, 0, fmt.Errorf("the agent's GPU %d (PCI bus id %q) is not visible to this process's CUDA driver", m.GetCudaDevice(), m.GetPciBusId())
		}
		gpu = int(m.GetCudaDevice())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if mem, ok := c.ipcs[h]; ok {
		c.useLocked(h, id)
		return mem, gpu, nil
	}
	mem, err := d.OpenIPCHandle(gpu, h)
	if err != nil {
		return nil, 0, err
	}
	c.ipcs[h] = mem
	c.useLocked(h, id)
	return mem, gpu, nil
}

// useLocked records that block set id uses the mapping or device memory
// under key. c.mu is held.
func (c *Client) useLocked(key any, id uint64) {
	u := c.users[key]
	if u == nil {
		u = map[uint64]struct{}{}
		c.users[key] = u
	}
	u[id] = struct{}{}
}

// giveUp gives up block set id's memory: the BlockSets of it handed out
// lose Ranks and Device, and each mapping (device memory) no other set of
// the client uses is unmapped (closed).
func (c *Client) giveUp(id uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.sets[id] {
		s.Ranks, s.Device = nil, nil
	}
	delete(c.sets, id)
	var errs []error
	for key, u := range c.users {
		if _, ok := u[id]; !ok {
			continue
		}
		if delete(u, id); len(u) > 0 {
			continue
		}
		delete(c.users, key)
		switch k := key.(type) {
		case string:
			if err := syscall.Munmap(c.maps[k]); err != nil {
				errs = append(errs, fmt.Errorf("client: unmapping block set %d's memory: %w", id, err))
			}
			delete(c.maps, k)
		case cuda.IPCHandle:
			if err := c.ipcs[k].Close(); err != nil {
				errs = append(errs, fmt.Errorf("client: closing block set %d's device memory: %w", id, err))
			}
			delete(c.ipcs, k)
		}
	}
	return errors.Join(errs...)
}

// mapMemory maps the memory m names, once per token: through the
// descriptor socket when the agent offers it, else by path; for block set
// id.
func (c *Client) mapMemory(m *fabricpb.Memory, id uint64) ([]byte, error) {
	key := m.GetToken()
	if key == "" {
		key = m.GetPath()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.maps[key]; ok {
		c.useLocked(key, id)
		return b, nil
	}
	var b []byte
	var err error
	if m.GetToken() != "" {
		// The companion of the socket as this process reaches it: the
		// agent's fd_socket names it in the agent's mount namespace.
		b, err = MapDescriptor(c.socket+FDSocketSuffix, m.GetToken())
	} else {
		b, err = MapFile(m.GetPath())
	}
	if err != nil {
		return nil, err
	}
	c.maps[key] = b
	c.useLocked(key, id)
	return b, nil
}

// Allocate takes n free slots for the engine to write.
func (c *Client) Allocate(ctx context.Context, set uint64, n int) ([]uint32, error) {
	if err := checkU32("Allocate: n (count)", n); err != nil {
		return nil, err
	}
	resp, err := c.api.Allocate(ctx, &fabricpb.AllocateRequest{BlockSet: set, Count: uint32(n)})
	return resp.GetSlots(), err
}

// Free gives back allocated slots that were never registered.
func (c *Client) Free(ctx context.Context, set uint64, slots []uint32) error {
	_, err := c.api.Free(ctx, &fabricpb.FreeRequest{BlockSet: set, Slots: slots})
	return err
}

// RegisterBlocks registers written slots under their sequence hashes, the
// first block being the first of its sequence. The engine keeps a reference
// on each returned block until Release. Slots the agent refused are left
// out (and stay the engine's, to free); API().RegisterBlocks answers each
// slot's outcome and reason.
func (c *Client) RegisterBlocks(ctx context.Context, set uint64, slots []uint32, hashes []uint64) ([]*fabricpb.BlockRef, error) {
	resp, err := c.api.RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set, Slots: slots, Hashes: hashes})
	return resp.GetBlocks(), err
}

// Acquire references the leading blocks held locally.
func (c *Client) Acquire(ctx context.Context, set uint64, hashes []uint64) ([]*fabricpb.BlockRef, error) {
	resp, err := c.api.Acquire(ctx, &fabricpb.AcquireRequest{BlockSet: set, Hashes: hashes})
	return resp.GetBlocks(), err
}

// Release drops the engine's references on slots.
func (c *Client) Release(ctx context.Context, set uint64, slots []uint32) error {
	_, err := c.api.Release(ctx, &fabricpb.ReleaseRequest{BlockSet: set, Slots: slots})
	return err
}

// Lookup returns per node how many leading blocks of hashes it holds.
func (c *Client) Lookup(ctx context.Context, hashes []uint64) ([]*fabricpb.Overlap, error) {
	resp, err := c.api.Lookup(ctx, &fabricpb.LookupRequest{Hashes: hashes})
	return resp.GetOverlaps(), err
}

// Import brings blocks from the cluster into local slots and references
// them for the engine; it returns the longest prefix it could bring.
func (c *Client) Import(ctx context.Context, set uint64, hashes []uint64) (*fabricpb.ImportResponse, error) {
	return c.api.Import(ctx, &fabricpb.ImportRequest{BlockSet: set, Hashes: hashes})
}

// ImportTokens imports the full pages of tokens (with the hash namespace
// of salt and lora) into set, by the agent's hashes of them at the set's
// page size; holders whose page divides the set's serve them too.
func (c *Client) ImportTokens(ctx context.Context, set uint64, tokens []uint32, salt, lora string) (*fabricpb.ImportResponse, error) {
	return c.api.Import(ctx, &fabricpb.ImportRequest{BlockSet: set, Tokens: &fabricpb.Tokens{Ids: tokens, Salt: salt, Lora: lora}})
}

// DropBlockSet stops the client's use of a block set: the agent gives back
// what the session holds there, and frees the set once no session uses it.
// The client gives up the set's memory, whether or not the agent answered:
// the BlockSets of it this client returned lose Ranks and Device, and each
// mapping (device memory) that no other set of this client uses is unmapped
// (closed), so that a long-lived engine keeps no pages of the sets it
// dropped. Byte slices and device pointers taken from the set must not be
// used after it.
func (c *Client) DropBlockSet(ctx context.Context, set uint64) (*fabricpb.DropBlockSetResponse, error) {
	resp, err := c.api.DropBlockSet(ctx, &fabricpb.DropBlockSetRequest{BlockSet: set})
	if merr := c.giveUp(set); merr != nil {
		return resp, errors.Join(err, merr)
	}
	return resp, err
}

// Status returns the agent's view of the cluster.
func (c *Client) Status(ctx context.Context) (*fabricpb.StatusResponse, error) {
	return c.api.Status(ctx, &fabricpb.StatusRequest{})
}

// samePCIAddress says whether two PCI bus ids name one device, whatever
// the width of the domain (the driver writes "0000:18:00.0", NVML
// "00000000:18:00.0") and the case.
func samePCIAddress(a, b string) bool {
	pa, erra := pcitopo.ParseAddr(a)
	pb, errb := pcitopo.ParseAddr(b)
	if erra != nil || errb != nil {
		return strings.EqualFold(a, b)
	}
	return pa == pb
}
