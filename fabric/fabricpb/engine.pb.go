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

// Code generated by protoc-gen-go. DO NOT EDIT.
// versions:
// 	protoc-gen-go v1.36.12
// 	protoc        v3.21.12
// source: fabric/fabricpb/engine.proto

package fabricpb

import (
	layoutpb "github.com/kvfabric/kvfabric/layout/layoutpb"
	protoreflect "google.golang.org/protobuf/reflect/protoreflect"
	protoimpl "google.golang.org/protobuf/runtime/protoimpl"
	reflect "reflect"
	sync "sync"
	unsafe "unsafe"
)

const (
	// Verify that this generated code is sufficiently up-to-date.
	_ = protoimpl.EnforceVersion(20 - protoimpl.MinVersion)
	// Verify that runtime/protoimpl is sufficiently up-to-date.
	_ = protoimpl.EnforceVersion(protoimpl.MaxVersion - 20)
)

type Outcome int32

const (
	Outcome_OUTCOME_UNSPECIFIED Outcome = 0
	// RegisterBlocks: the slot now holds the block, referenced for the engine.
	Outcome_OUTCOME_REGISTERED Outcome = 1
	// RegisterBlocks: another slot already held the hash; the engine's slot
	// was freed and the other one is referenced for the engine.
	Outcome_OUTCOME_DUPLICATE Outcome = 2
	// RegisterBlocks: nothing was done with this slot (see reason).
	Outcome_OUTCOME_REFUSED Outcome = 3
	// Acquire: referenced for the engine.
	Outcome_OUTCOME_ACQUIRED Outcome = 4
	// Import: already held here, referenced for the engine.
	Outcome_OUTCOME_LOCAL Outcome = 5
	// Import: brought from a holder, referenced for the engine.
	Outcome_OUTCOME_IMPORTED Outcome = 6
	// Acquire, Import: not held here (and, for Import, not brought).
	Outcome_OUTCOME_MISSING Outcome = 7
	// Acquire: not tried, because an earlier block was missing.
	Outcome_OUTCOME_SKIPPED Outcome = 8
)

// Enum value maps for Outcome.
var (
	Outcome_name = map[int32]string{
		0: "OUTCOME_UNSPECIFIED",
		1: "OUTCOME_REGISTERED",
		2: "OUTCOME_DUPLICATE",
		3: "OUTCOME_REFUSED",
		4: "OUTCOME_ACQUIRED",
		5: "OUTCOME_LOCAL",
		6: "OUTCOME_IMPORTED",
		7: "OUTCOME_MISSING",
		8: "OUTCOME_SKIPPED",
	}
	Outcome_value = map[string]int32{
		"OUTCOME_UNSPECIFIED": 0,
		"OUTCOME_REGISTERED":  1,
		"OUTCOME_DUPLICATE":   2,
		"OUTCOME_REFUSED":     3,
		"OUTCOME_ACQUIRED":    4,
		"OUTCOME_LOCAL":       5,
		"OUTCOME_IMPORTED":    6,
		"OUTCOME_MISSING":     7,
		"OUTCOME_SKIPPED":     8,
	}
)

func (x Outcome) Enum() *Outcome {
	p := new(Outcome)
	*p = x
	return p
}

func (x Outcome) String() string {
	return protoimpl.X.EnumStringOf(x.Descriptor(), protoreflect.EnumNumber(x))
}

func (Outcome) Descriptor() protoreflect.EnumDescriptor {
	return file_fabric_fabricpb_engine_proto_enumTypes[0].Descriptor()
}

func (Outcome) Type() protoreflect.EnumType {
	return &file_fabric_fabricpb_engine_proto_enumTypes[0]
}

func (x Outcome) Number() protoreflect.EnumNumber {
	return protoreflect.EnumNumber(x)
}

// Deprecated: Use Outcome.Descriptor instead.
func (Outcome) EnumDescriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{0}
}

type PrefetchRequest struct {
	state    protoimpl.MessageState `protogen:"open.v1"`
	BlockSet uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	// The sequence, by hashes at the set's page size or by token ids (one of
	// the two), at most 65,536 blocks.
	Hashes        []uint64 `protobuf:"varint,2,rep,packed,name=hashes,proto3" json:"hashes,omitempty"`
	Tokens        *Tokens  `protobuf:"bytes,3,opt,name=tokens,proto3" json:"tokens,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *PrefetchRequest) Reset() {
	*x = PrefetchRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[0]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *PrefetchRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*PrefetchRequest) ProtoMessage() {}

func (x *PrefetchRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[0]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use PrefetchRequest.ProtoReflect.Descriptor instead.
func (*PrefetchRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{0}
}

func (x *PrefetchRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *PrefetchRequest) GetHashes() []uint64 {
	if x != nil {
		return x.Hashes
	}
	return nil
}

func (x *PrefetchRequest) GetTokens() *Tokens {
	if x != nil {
		return x.Tokens
	}
	return nil
}

type PrefetchResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Leading blocks of the sequence in the set's memory now: those that
	// were there already, and those restored from disk by this call (at
	// most half the slots the set keeps).
	InMemory uint32 `protobuf:"varint,1,opt,name=in_memory,json=inMemory,proto3" json:"in_memory,omitempty"`
	Restored uint32 `protobuf:"varint,2,opt,name=restored,proto3" json:"restored,omitempty"`
	// Why the run stopped before the sequence's end where a restore or an
	// import failed (a block that failed its check, no slots, every holder
	// failed); empty when it stopped at a block that no node holds, or as
	// its session ended (the session stream says so).
	Error string `protobuf:"bytes,3,opt,name=error,proto3" json:"error,omitempty"`
	// Of in_memory, the blocks imported by this call from this node's other
	// block sets or from other nodes, after those restored (within the same
	// bound).
	Imported      uint32 `protobuf:"varint,4,opt,name=imported,proto3" json:"imported,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *PrefetchResponse) Reset() {
	*x = PrefetchResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[1]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *PrefetchResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*PrefetchResponse) ProtoMessage() {}

func (x *PrefetchResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[1]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use PrefetchResponse.ProtoReflect.Descriptor instead.
func (*PrefetchResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{1}
}

func (x *PrefetchResponse) GetInMemory() uint32 {
	if x != nil {
		return x.InMemory
	}
	return 0
}

func (x *PrefetchResponse) GetRestored() uint32 {
	if x != nil {
		return x.Restored
	}
	return 0
}

func (x *PrefetchResponse) GetError() string {
	if x != nil {
		return x.Error
	}
	return ""
}

func (x *PrefetchResponse) GetImported() uint32 {
	if x != nil {
		return x.Imported
	}
	return 0
}

type RegisterRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// A name for logs and status, e.g. "vllm-0".
	Engine   string                `protobuf:"bytes,1,opt,name=engine,proto3" json:"engine,omitempty"`
	Model    *layoutpb.ModelConfig `protobuf:"bytes,2,opt,name=model,proto3" json:"model,omitempty"`
	TpSize   uint32                `protobuf:"varint,3,opt,name=tp_size,json=tpSize,proto3" json:"tp_size,omitempty"`
	PageSize uint32                `protobuf:"varint,4,opt,name=page_size,json=pageSize,proto3" json:"page_size,omitempty"`
	KvOrder  layoutpb.KVOrder      `protobuf:"varint,5,opt,name=kv_order,json=kvOrder,proto3,enum=kvfabric.layout.v1.KVOrder" json:"kv_order,omitempty"`
	// Optional: defaults to fully contiguous.
	Arrangement layoutpb.Arrangement `protobuf:"varint,6,opt,name=arrangement,proto3,enum=kvfabric.layout.v1.Arrangement" json:"arrangement,omitempty"`
	// Slots wanted; 0 takes the agent's default for the pool.
	Slots uint32 `protobuf:"varint,7,opt,name=slots,proto3" json:"slots,omitempty"`
	// The power of two that block strides (and, layer-separate, layer
	// strides) are rounded up to, 1..2^30; 0: 4096. Region starts are
	// aligned to at least this and to the host page size.
	Alignment uint64 `protobuf:"varint,8,opt,name=alignment,proto3" json:"alignment,omitempty"`
	// Optional, one per TP rank: the GPU whose device pool holds that
	// rank's region, as its PCI bus id (as cuDeviceGetPCIBusId writes it,
	// e.g. "0000:18:00.0"; the robust name, whatever CUDA_VISIBLE_DEVICES
	// says) or the agent's CUDA index ("2"); "" lets the agent choose. Empty:
	// rank r goes to the agent's r-th device pool, modulo their number.
	// Ignored when the agent's pool is host memory. Memory.cuda_device and
	// Memory.pci_bus_id in the response say where each rank landed.
	Devices []string `protobuf:"bytes,9,rep,name=devices,proto3" json:"devices,omitempty"`
	// Join block set join_block_set (0: none) instead of choosing one: a
	// set is shared only within the process it was handed to, and this lets
	// another process of the same engine (a TP worker of its own) share it.
	// join_token is the set's RegisterResponse.join_token, which only
	// Register's answers carry: a wrong one is PERMISSION_DENIED, an unknown
	// or freed set NOT_FOUND, and a layout (or slot count, when one is
	// asked, or devices) other than the set's INVALID_ARGUMENT naming the
	// field; never another set. The caller's process is one the set was
	// handed to from then on, whatever others run; joining takes no memory
	// of the pool or the quota.
	JoinBlockSet  uint64 `protobuf:"varint,10,opt,name=join_block_set,json=joinBlockSet,proto3" json:"join_block_set,omitempty"`
	JoinToken     string `protobuf:"bytes,11,opt,name=join_token,json=joinToken,proto3" json:"join_token,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *RegisterRequest) Reset() {
	*x = RegisterRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[2]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *RegisterRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*RegisterRequest) ProtoMessage() {}

func (x *RegisterRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[2]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use RegisterRequest.ProtoReflect.Descriptor instead.
func (*RegisterRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{2}
}

func (x *RegisterRequest) GetEngine() string {
	if x != nil {
		return x.Engine
	}
	return ""
}

func (x *RegisterRequest) GetModel() *layoutpb.ModelConfig {
	if x != nil {
		return x.Model
	}
	return nil
}

func (x *RegisterRequest) GetTpSize() uint32 {
	if x != nil {
		return x.TpSize
	}
	return 0
}

func (x *RegisterRequest) GetPageSize() uint32 {
	if x != nil {
		return x.PageSize
	}
	return 0
}

func (x *RegisterRequest) GetKvOrder() layoutpb.KVOrder {
	if x != nil {
		return x.KvOrder
	}
	return layoutpb.KVOrder(0)
}

func (x *RegisterRequest) GetArrangement() layoutpb.Arrangement {
	if x != nil {
		return x.Arrangement
	}
	return layoutpb.Arrangement(0)
}

func (x *RegisterRequest) GetSlots() uint32 {
	if x != nil {
		return x.Slots
	}
	return 0
}

func (x *RegisterRequest) GetAlignment() uint64 {
	if x != nil {
		return x.Alignment
	}
	return 0
}

func (x *RegisterRequest) GetDevices() []string {
	if x != nil {
		return x.Devices
	}
	return nil
}

func (x *RegisterRequest) GetJoinBlockSet() uint64 {
	if x != nil {
		return x.JoinBlockSet
	}
	return 0
}

func (x *RegisterRequest) GetJoinToken() string {
	if x != nil {
		return x.JoinToken
	}
	return ""
}

type RegisterResponse struct {
	state    protoimpl.MessageState `protogen:"open.v1"`
	BlockSet uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	// The block set's layout. Its region bases are addresses in the agent's
	// process, useless to an engine: an engine finds a rank's region at
	// Memory.offset (equally ranks[r].offset) in the memory it maps.
	Layout *layoutpb.Layout `protobuf:"bytes,2,opt,name=layout,proto3" json:"layout,omitempty"`
	// One per TP rank: where that rank's region lives.
	Memory []*Memory `protobuf:"bytes,3,rep,name=memory,proto3" json:"memory,omitempty"`
	// How many registered blocks the block set keeps before allocating
	// recycles them (its slots less the pool's low watermark). An engine
	// that stores more loses the tails of the least recently used
	// sequences first.
	Retains uint32 `protobuf:"varint,4,opt,name=retains,proto3" json:"retains,omitempty"`
	// One per TP rank, in rank order: everything an engine needs to place
	// bytes without re-deriving the layout math (see RankLayout).
	Ranks []*RankLayout `protobuf:"bytes,5,rep,name=ranks,proto3" json:"ranks,omitempty"`
	// The block set's credential for RegisterRequest.join_token: what lets
	// another process of this engine join the set. Secret like a memory
	// token: pass it only to the engine's own processes.
	JoinToken     string `protobuf:"bytes,6,opt,name=join_token,json=joinToken,proto3" json:"join_token,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *RegisterResponse) Reset() {
	*x = RegisterResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[3]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *RegisterResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*RegisterResponse) ProtoMessage() {}

func (x *RegisterResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[3]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use RegisterResponse.ProtoReflect.Descriptor instead.
func (*RegisterResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{3}
}

func (x *RegisterResponse) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *RegisterResponse) GetLayout() *layoutpb.Layout {
	if x != nil {
		return x.Layout
	}
	return nil
}

func (x *RegisterResponse) GetMemory() []*Memory {
	if x != nil {
		return x.Memory
	}
	return nil
}

func (x *RegisterResponse) GetRetains() uint32 {
	if x != nil {
		return x.Retains
	}
	return 0
}

func (x *RegisterResponse) GetRanks() []*RankLayout {
	if x != nil {
		return x.Ranks
	}
	return nil
}

func (x *RegisterResponse) GetJoinToken() string {
	if x != nil {
		return x.JoinToken
	}
	return ""
}

// Host memory an engine maps shared (PROT_READ|PROT_WRITE, MAP_SHARED):
// bytes [offset, offset+size) of the memory are the rank's region. Each
// rank of a block set is a memory file of its own (its own token, file and
// path; offset 0): an engine maps the memory of its own block sets and
// nothing else of the pool. Map each token once. A freed set's memory is
// never handed to another set (a new set gets fresh, zeroed pages), and a
// set is joined only by the process it was handed to, by a process given
// its join token (RegisterRequest.join_token) or, once every such process
// has exited, by another (which finds new slots zeroed, and is recorded
// as one the set was handed to, whether it took the set up by a Register
// or by a call naming it: the check and the record are one step, so that
// of two processes taking such a set up at once only one gets it, the
// other's call refused and the other's Register given another set or the
// quota's or the pool's refusal), where the agent
// knows the processes (not Session.pid 0: see the Engine service's
// errors): a Register or call from a process whose pid the agent cannot
// see (pid 0) is not kept off a set handed to another, nor recorded as
// one the set was handed to. An agent whose host pool is pinned through the CUDA driver
// cannot give sets memory apart: then every rank names the pool's one
// memory file (the same token), as the agent logs at start.
//
// There are two ways to get the memory, and the fields say which the agent
// offers:
//
//  1. The descriptor (token set; always offered on Linux). Connect to the
//     unix stream socket fd_socket (the engine socket's path + ".fd", same
//     mode and group as the engine socket) and write one line:
//
//     <token>\n                         (at most 255 bytes)
//
//     The agent answers with one line. On success the line carries the
//     memory file's descriptor as SCM_RIGHTS ancillary data:
//
//     ok <offset> <size>\n              the descriptor may be mapped
//     over bytes [offset, offset+size)
//     of its file; offset is 0
//     error <reason>\n                  no descriptor (unknown token...)
//
//     Several lines may be sent on one connection; the agent closes it
//     after 10 s idle. This works from any PID or mount namespace that can
//     reach the socket file: an engine container mounts the agent's socket
//     directory (a hostPath in Kubernetes). Python: socket.recv_fds.
//
//  2. The named file (file set; only when the agent runs with memory_dir,
//     e.g. a Kubernetes hostPath). The pool's memory is that file, mode
//     and group as the engine socket (without execute bits), removed when
//     the agent stops. An engine that mounts the same directory opens it
//     read-write and maps it; no socket call is needed.
//
// path is the older form: the named file when there is one, else
// /proc/<agent pid>/fd/<n>, which opens only inside the agent's PID
// namespace and as the agent's user, and, unless the agent runs with
// --dumpable (it is non-dumpable by default), only as root. Prefer the two
// above.
//
// Example, an engine in another container of the same pod or node: mount
// the agent's data directory (hostPath /var/lib/kvfabric) at the same path,
// dial /var/lib/kvfabric/engine.sock, Register, then either send
// memory[0].token to memory[0].fd_socket and mmap the descriptor received,
// or open memory[0].file and mmap it; rank r's region starts at
// memory[r].offset in that mapping.
//
// Device memory (an agent with a GPU pool; cuda_ipc_handle set): the
// rank's region is bytes [offset, offset+size) of a GPU allocation of
// file_size bytes on the GPU that cuda_device (the agent's CUDA index)
// and pci_bus_id (domain:bus:device.function, which does not depend on
// CUDA_VISIBLE_DEVICES) name. path, token, fd_socket and file are empty:
// the engine opens the handle with cuIpcOpenMemHandle (flag
// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) in a context of that GPU, which maps
// the whole allocation at a device pointer of its own, adds offset, and
// closes it with cuIpcCloseMemHandle when it is done (before the agent
// stops). The ranks on one GPU name the same allocation (the same handle),
// ranks on different GPUs different ones; open each handle once per
// process.
type Memory struct {
	state  protoimpl.MessageState `protogen:"open.v1"`
	Path   string                 `protobuf:"bytes,1,opt,name=path,proto3" json:"path,omitempty"`
	Offset uint64                 `protobuf:"varint,2,opt,name=offset,proto3" json:"offset,omitempty"`
	Size   uint64                 `protobuf:"varint,3,opt,name=size,proto3" json:"size,omitempty"`
	// The token to send on fd_socket; empty when descriptor passing is not
	// offered.
	Token string `protobuf:"bytes,4,opt,name=token,proto3" json:"token,omitempty"`
	// The companion socket that hands out descriptors, as the agent names
	// it; an engine that reaches the engine socket under another path (a
	// different mount point) appends ".fd" to its own path.
	FdSocket string `protobuf:"bytes,5,opt,name=fd_socket,json=fdSocket,proto3" json:"fd_socket,omitempty"`
	// The named file under the agent's memory_dir; empty when none.
	File string `protobuf:"bytes,6,opt,name=file,proto3" json:"file,omitempty"`
	// The bytes of the whole memory (what to map from offset 0).
	FileSize uint64 `protobuf:"varint,7,opt,name=file_size,json=fileSize,proto3" json:"file_size,omitempty"`
	// The CUDA IPC memory handle (CUipcMemHandle, 64 bytes) of the device
	// allocation; empty for host memory.
	CudaIpcHandle []byte `protobuf:"bytes,8,opt,name=cuda_ipc_handle,json=cudaIpcHandle,proto3" json:"cuda_ipc_handle,omitempty"`
	// The agent's CUDA index of the GPU holding the allocation; meaningful
	// only with cuda_ipc_handle.
	CudaDevice int32 `protobuf:"varint,9,opt,name=cuda_device,json=cudaDevice,proto3" json:"cuda_device,omitempty"`
	// That GPU's PCI bus id, as the driver writes it; empty for host memory.
	PciBusId      string `protobuf:"bytes,10,opt,name=pci_bus_id,json=pciBusId,proto3" json:"pci_bus_id,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Memory) Reset() {
	*x = Memory{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[4]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Memory) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Memory) ProtoMessage() {}

func (x *Memory) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[4]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Memory.ProtoReflect.Descriptor instead.
func (*Memory) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{4}
}

func (x *Memory) GetPath() string {
	if x != nil {
		return x.Path
	}
	return ""
}

func (x *Memory) GetOffset() uint64 {
	if x != nil {
		return x.Offset
	}
	return 0
}

func (x *Memory) GetSize() uint64 {
	if x != nil {
		return x.Size
	}
	return 0
}

func (x *Memory) GetToken() string {
	if x != nil {
		return x.Token
	}
	return ""
}

func (x *Memory) GetFdSocket() string {
	if x != nil {
		return x.FdSocket
	}
	return ""
}

func (x *Memory) GetFile() string {
	if x != nil {
		return x.File
	}
	return ""
}

func (x *Memory) GetFileSize() uint64 {
	if x != nil {
		return x.FileSize
	}
	return 0
}

func (x *Memory) GetCudaIpcHandle() []byte {
	if x != nil {
		return x.CudaIpcHandle
	}
	return nil
}

func (x *Memory) GetCudaDevice() int32 {
	if x != nil {
		return x.CudaDevice
	}
	return 0
}

func (x *Memory) GetPciBusId() string {
	if x != nil {
		return x.PciBusId
	}
	return ""
}

// RankLayout is where one TP rank's bytes go. The byte of element
// (slot s, layer l, plane p, token t, local head h, dim d) is at
//
//	offset + s*block_stride + l*layer_stride + p*kv_stride
//	       + index(t, h, d)*element_bytes
//
// in the mapped memory, with index = (t*heads + h)*head_dim + d for NHD
// (chunk_shape [tokens][heads][head_dim]) and (h*tokens + t)*head_dim + d
// for HND (chunk_shape [heads][tokens][head_dim]); heads = len(head_ids).
// Plane 0 is K (or MLA's latent), 1 is V; MLA has one plane.
//
// The strides, with chunk = page_size*heads*head_dim*element_bytes and A
// the alignment (round up to a multiple of A):
//
//	kv_stride    = chunk
//	fully contiguous: layer_stride = planes*chunk,
//	                  block_stride = roundup(layers*planes*chunk, A)
//	layer-separate:   block_stride = roundup(planes*chunk, A),
//	                  layer_stride = roundup(slots*block_stride, A)
//
// Heads: with TP <= KV heads, rank r holds heads [r*H/TP, (r+1)*H/TP). With
// TP > KV heads every head is replicated on TP/H ranks: rank r holds head
// r/(TP/H). MLA's latent is not split: every rank holds the whole plane
// (all KV heads). replicas says how many ranks hold the same heads.
type RankLayout struct {
	state       protoimpl.MessageState `protogen:"open.v1"`
	Offset      uint64                 `protobuf:"varint,1,opt,name=offset,proto3" json:"offset,omitempty"`
	BlockStride uint64                 `protobuf:"varint,2,opt,name=block_stride,json=blockStride,proto3" json:"block_stride,omitempty"`
	LayerStride uint64                 `protobuf:"varint,3,opt,name=layer_stride,json=layerStride,proto3" json:"layer_stride,omitempty"`
	KvStride    uint64                 `protobuf:"varint,4,opt,name=kv_stride,json=kvStride,proto3" json:"kv_stride,omitempty"`
	// The chunk of one (slot, layer, plane), outermost dimension first:
	// [tokens, heads, head_dim] for NHD, [heads, tokens, head_dim] for HND.
	ChunkShape []uint32 `protobuf:"varint,5,rep,packed,name=chunk_shape,json=chunkShape,proto3" json:"chunk_shape,omitempty"`
	// The global KV head indices this rank holds, in chunk order.
	HeadIds  []uint32 `protobuf:"varint,6,rep,packed,name=head_ids,json=headIds,proto3" json:"head_ids,omitempty"`
	Replicas uint32   `protobuf:"varint,7,opt,name=replicas,proto3" json:"replicas,omitempty"`
	// 2 (K and V), or 1 for MLA.
	Planes       uint32 `protobuf:"varint,8,opt,name=planes,proto3" json:"planes,omitempty"`
	ElementBytes uint32 `protobuf:"varint,9,opt,name=element_bytes,json=elementBytes,proto3" json:"element_bytes,omitempty"`
	// Bytes of one chunk; the shard of one block is layers*planes*chunk_bytes.
	ChunkBytes    uint64 `protobuf:"varint,10,opt,name=chunk_bytes,json=chunkBytes,proto3" json:"chunk_bytes,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *RankLayout) Reset() {
	*x = RankLayout{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[5]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *RankLayout) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*RankLayout) ProtoMessage() {}

func (x *RankLayout) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[5]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use RankLayout.ProtoReflect.Descriptor instead.
func (*RankLayout) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{5}
}

func (x *RankLayout) GetOffset() uint64 {
	if x != nil {
		return x.Offset
	}
	return 0
}

func (x *RankLayout) GetBlockStride() uint64 {
	if x != nil {
		return x.BlockStride
	}
	return 0
}

func (x *RankLayout) GetLayerStride() uint64 {
	if x != nil {
		return x.LayerStride
	}
	return 0
}

func (x *RankLayout) GetKvStride() uint64 {
	if x != nil {
		return x.KvStride
	}
	return 0
}

func (x *RankLayout) GetChunkShape() []uint32 {
	if x != nil {
		return x.ChunkShape
	}
	return nil
}

func (x *RankLayout) GetHeadIds() []uint32 {
	if x != nil {
		return x.HeadIds
	}
	return nil
}

func (x *RankLayout) GetReplicas() uint32 {
	if x != nil {
		return x.Replicas
	}
	return 0
}

func (x *RankLayout) GetPlanes() uint32 {
	if x != nil {
		return x.Planes
	}
	return 0
}

func (x *RankLayout) GetElementBytes() uint32 {
	if x != nil {
		return x.ElementBytes
	}
	return 0
}

func (x *RankLayout) GetChunkBytes() uint64 {
	if x != nil {
		return x.ChunkBytes
	}
	return 0
}

type AllocateRequest struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	BlockSet      uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	Count         uint32                 `protobuf:"varint,2,opt,name=count,proto3" json:"count,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *AllocateRequest) Reset() {
	*x = AllocateRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[6]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *AllocateRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*AllocateRequest) ProtoMessage() {}

func (x *AllocateRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[6]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use AllocateRequest.ProtoReflect.Descriptor instead.
func (*AllocateRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{6}
}

func (x *AllocateRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *AllocateRequest) GetCount() uint32 {
	if x != nil {
		return x.Count
	}
	return 0
}

type AllocateResponse struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	Slots         []uint32               `protobuf:"varint,1,rep,packed,name=slots,proto3" json:"slots,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *AllocateResponse) Reset() {
	*x = AllocateResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[7]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *AllocateResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*AllocateResponse) ProtoMessage() {}

func (x *AllocateResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[7]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use AllocateResponse.ProtoReflect.Descriptor instead.
func (*AllocateResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{7}
}

func (x *AllocateResponse) GetSlots() []uint32 {
	if x != nil {
		return x.Slots
	}
	return nil
}

type FreeRequest struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	BlockSet      uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	Slots         []uint32               `protobuf:"varint,2,rep,packed,name=slots,proto3" json:"slots,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *FreeRequest) Reset() {
	*x = FreeRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[8]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *FreeRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*FreeRequest) ProtoMessage() {}

func (x *FreeRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[8]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use FreeRequest.ProtoReflect.Descriptor instead.
func (*FreeRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{8}
}

func (x *FreeRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *FreeRequest) GetSlots() []uint32 {
	if x != nil {
		return x.Slots
	}
	return nil
}

type FreeResponse struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *FreeResponse) Reset() {
	*x = FreeResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[9]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *FreeResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*FreeResponse) ProtoMessage() {}

func (x *FreeResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[9]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use FreeResponse.ProtoReflect.Descriptor instead.
func (*FreeResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{9}
}

// Token ids and the hash namespace, for requests that let the agent hash.
type Tokens struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	Ids           []uint32               `protobuf:"varint,1,rep,packed,name=ids,proto3" json:"ids,omitempty"`
	Salt          string                 `protobuf:"bytes,2,opt,name=salt,proto3" json:"salt,omitempty"`
	Lora          string                 `protobuf:"bytes,3,opt,name=lora,proto3" json:"lora,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Tokens) Reset() {
	*x = Tokens{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[10]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Tokens) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Tokens) ProtoMessage() {}

func (x *Tokens) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[10]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Tokens.ProtoReflect.Descriptor instead.
func (*Tokens) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{10}
}

func (x *Tokens) GetIds() []uint32 {
	if x != nil {
		return x.Ids
	}
	return nil
}

func (x *Tokens) GetSalt() string {
	if x != nil {
		return x.Salt
	}
	return ""
}

func (x *Tokens) GetLora() string {
	if x != nil {
		return x.Lora
	}
	return ""
}

type RegisterBlocksRequest struct {
	state    protoimpl.MessageState `protogen:"open.v1"`
	BlockSet uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	// Slots in sequence order, one per block.
	Slots []uint32 `protobuf:"varint,2,rep,packed,name=slots,proto3" json:"slots,omitempty"`
	// Either the sequence hashes, one per slot...
	Hashes []uint64 `protobuf:"varint,3,rep,packed,name=hashes,proto3" json:"hashes,omitempty"`
	// ...or the token ids of the whole sequence; the agent hashes full blocks.
	Tokens *Tokens `protobuf:"bytes,4,opt,name=tokens,proto3" json:"tokens,omitempty"`
	// The sequence hash of the block before the first one, when the first
	// registered block is not the sequence's first (parent_set tells).
	Parent        uint64 `protobuf:"varint,5,opt,name=parent,proto3" json:"parent,omitempty"`
	ParentSet     bool   `protobuf:"varint,6,opt,name=parent_set,json=parentSet,proto3" json:"parent_set,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *RegisterBlocksRequest) Reset() {
	*x = RegisterBlocksRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[11]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *RegisterBlocksRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*RegisterBlocksRequest) ProtoMessage() {}

func (x *RegisterBlocksRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[11]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use RegisterBlocksRequest.ProtoReflect.Descriptor instead.
func (*RegisterBlocksRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{11}
}

func (x *RegisterBlocksRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *RegisterBlocksRequest) GetSlots() []uint32 {
	if x != nil {
		return x.Slots
	}
	return nil
}

func (x *RegisterBlocksRequest) GetHashes() []uint64 {
	if x != nil {
		return x.Hashes
	}
	return nil
}

func (x *RegisterBlocksRequest) GetTokens() *Tokens {
	if x != nil {
		return x.Tokens
	}
	return nil
}

func (x *RegisterBlocksRequest) GetParent() uint64 {
	if x != nil {
		return x.Parent
	}
	return 0
}

func (x *RegisterBlocksRequest) GetParentSet() bool {
	if x != nil {
		return x.ParentSet
	}
	return false
}

type RegisterBlocksResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The blocks registered (or found registered), in request order; refused
	// slots are left out.
	Blocks []*BlockRef `protobuf:"bytes,1,rep,name=blocks,proto3" json:"blocks,omitempty"`
	// One per slot of the request, in order: REGISTERED, DUPLICATE (the
	// engine's slot was freed; slot names the one holding the block) or
	// REFUSED with the reason. A refused slot stays the engine's.
	Results       []*BlockResult `protobuf:"bytes,2,rep,name=results,proto3" json:"results,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *RegisterBlocksResponse) Reset() {
	*x = RegisterBlocksResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[12]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *RegisterBlocksResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*RegisterBlocksResponse) ProtoMessage() {}

func (x *RegisterBlocksResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[12]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use RegisterBlocksResponse.ProtoReflect.Descriptor instead.
func (*RegisterBlocksResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{12}
}

func (x *RegisterBlocksResponse) GetBlocks() []*BlockRef {
	if x != nil {
		return x.Blocks
	}
	return nil
}

func (x *RegisterBlocksResponse) GetResults() []*BlockResult {
	if x != nil {
		return x.Results
	}
	return nil
}

// A registered block in a local slot, referenced for the engine.
type BlockRef struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	Hash  uint64                 `protobuf:"varint,1,opt,name=hash,proto3" json:"hash,omitempty"`
	Slot  uint32                 `protobuf:"varint,2,opt,name=slot,proto3" json:"slot,omitempty"`
	// True when another slot already held the hash: the engine's slot was
	// freed and this one holds the block.
	Duplicate     bool `protobuf:"varint,3,opt,name=duplicate,proto3" json:"duplicate,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *BlockRef) Reset() {
	*x = BlockRef{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[13]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *BlockRef) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*BlockRef) ProtoMessage() {}

func (x *BlockRef) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[13]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use BlockRef.ProtoReflect.Descriptor instead.
func (*BlockRef) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{13}
}

func (x *BlockRef) GetHash() uint64 {
	if x != nil {
		return x.Hash
	}
	return 0
}

func (x *BlockRef) GetSlot() uint32 {
	if x != nil {
		return x.Slot
	}
	return 0
}

func (x *BlockRef) GetDuplicate() bool {
	if x != nil {
		return x.Duplicate
	}
	return false
}

type AcquireRequest struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	BlockSet      uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	Hashes        []uint64               `protobuf:"varint,2,rep,packed,name=hashes,proto3" json:"hashes,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *AcquireRequest) Reset() {
	*x = AcquireRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[14]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *AcquireRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*AcquireRequest) ProtoMessage() {}

func (x *AcquireRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[14]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use AcquireRequest.ProtoReflect.Descriptor instead.
func (*AcquireRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{14}
}

func (x *AcquireRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *AcquireRequest) GetHashes() []uint64 {
	if x != nil {
		return x.Hashes
	}
	return nil
}

type AcquireResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The leading blocks held locally, in order; stops at the first missing.
	Blocks []*BlockRef `protobuf:"bytes,1,rep,name=blocks,proto3" json:"blocks,omitempty"`
	// One per hash of the request, in order: ACQUIRED for the leading blocks
	// held, MISSING for the first one not held, SKIPPED for those after it.
	Results       []*BlockResult `protobuf:"bytes,2,rep,name=results,proto3" json:"results,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *AcquireResponse) Reset() {
	*x = AcquireResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[15]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *AcquireResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*AcquireResponse) ProtoMessage() {}

func (x *AcquireResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[15]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use AcquireResponse.ProtoReflect.Descriptor instead.
func (*AcquireResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{15}
}

func (x *AcquireResponse) GetBlocks() []*BlockRef {
	if x != nil {
		return x.Blocks
	}
	return nil
}

func (x *AcquireResponse) GetResults() []*BlockResult {
	if x != nil {
		return x.Results
	}
	return nil
}

type ReleaseRequest struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	BlockSet      uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	Slots         []uint32               `protobuf:"varint,2,rep,packed,name=slots,proto3" json:"slots,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *ReleaseRequest) Reset() {
	*x = ReleaseRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[16]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *ReleaseRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*ReleaseRequest) ProtoMessage() {}

func (x *ReleaseRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[16]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use ReleaseRequest.ProtoReflect.Descriptor instead.
func (*ReleaseRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{16}
}

func (x *ReleaseRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *ReleaseRequest) GetSlots() []uint32 {
	if x != nil {
		return x.Slots
	}
	return nil
}

type ReleaseResponse struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *ReleaseResponse) Reset() {
	*x = ReleaseResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[17]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *ReleaseResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*ReleaseResponse) ProtoMessage() {}

func (x *ReleaseResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[17]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use ReleaseResponse.ProtoReflect.Descriptor instead.
func (*ReleaseResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{17}
}

type LookupRequest struct {
	state  protoimpl.MessageState `protogen:"open.v1"`
	Hashes []uint64               `protobuf:"varint,1,rep,packed,name=hashes,proto3" json:"hashes,omitempty"`
	Tokens *Tokens                `protobuf:"bytes,2,opt,name=tokens,proto3" json:"tokens,omitempty"`
	// Block size for tokens; 0: 16, or the page size of block_set.
	BlockSize uint32 `protobuf:"varint,3,opt,name=block_size,json=blockSize,proto3" json:"block_size,omitempty"`
	// The engine's block set, when it wants fetch estimates: its layout
	// says how many bytes each matched block would move (and, for tokens,
	// the page size when block_size is 0).
	BlockSet uint64 `protobuf:"varint,4,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	// With block_set: answer local_tiers without bringing any block up into
	// the set or reading ahead (a look-up that only counts, and leaves the
	// set and the tiers as they were), and say where each block will be once
	// the copies down to a tier already under way end: a block that has left
	// the set and whose copy down has not ended is waited for, within the
	// call's deadline (the wait ends a tenth of the time left before it, so
	// that the answer arrives), or for at most 10 s where the call has no
	// deadline (a block still in flight then is ""), and answered "disk" or
	// "host" once its copy is in place. Without no_restore, nothing is
	// waited for: such a block is "".
	NoRestore     bool `protobuf:"varint,5,opt,name=no_restore,json=noRestore,proto3" json:"no_restore,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *LookupRequest) Reset() {
	*x = LookupRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[18]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *LookupRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*LookupRequest) ProtoMessage() {}

func (x *LookupRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[18]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use LookupRequest.ProtoReflect.Descriptor instead.
func (*LookupRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{18}
}

func (x *LookupRequest) GetHashes() []uint64 {
	if x != nil {
		return x.Hashes
	}
	return nil
}

func (x *LookupRequest) GetTokens() *Tokens {
	if x != nil {
		return x.Tokens
	}
	return nil
}

func (x *LookupRequest) GetBlockSize() uint32 {
	if x != nil {
		return x.BlockSize
	}
	return 0
}

func (x *LookupRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *LookupRequest) GetNoRestore() bool {
	if x != nil {
		return x.NoRestore
	}
	return false
}

type LookupResponse struct {
	state    protoimpl.MessageState `protogen:"open.v1"`
	Hashes   []uint64               `protobuf:"varint,1,rep,packed,name=hashes,proto3" json:"hashes,omitempty"`
	Overlaps []*Overlap             `protobuf:"bytes,2,rep,name=overlaps,proto3" json:"overlaps,omitempty"`
	// With block_set in the request: for each of hashes, the tier this node
	// holds it in for that block set's layout: the pool's kind ("host",
	// "pinned" or "device"), "host" also for the host tier and "disk" for a
	// disk tier (the first run of them restored into the block set by this
	// call, unless no_restore, so that the Acquire or Import that follows
	// finds it in memory), or "" (not on this node).
	LocalTiers    []string `protobuf:"bytes,3,rep,name=local_tiers,json=localTiers,proto3" json:"local_tiers,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *LookupResponse) Reset() {
	*x = LookupResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[19]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *LookupResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*LookupResponse) ProtoMessage() {}

func (x *LookupResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[19]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use LookupResponse.ProtoReflect.Descriptor instead.
func (*LookupResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{19}
}

func (x *LookupResponse) GetHashes() []uint64 {
	if x != nil {
		return x.Hashes
	}
	return nil
}

func (x *LookupResponse) GetOverlaps() []*Overlap {
	if x != nil {
		return x.Overlaps
	}
	return nil
}

func (x *LookupResponse) GetLocalTiers() []string {
	if x != nil {
		return x.LocalTiers
	}
	return nil
}

type Overlap struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	Node  string                 `protobuf:"bytes,1,opt,name=node,proto3" json:"node,omitempty"`
	// Leading blocks of the request the node holds.
	Blocks uint32 `protobuf:"varint,2,opt,name=blocks,proto3" json:"blocks,omitempty"`
	// Routing score: overlap minus weighted load, higher is better.
	Score float64 `protobuf:"fixed64,3,opt,name=score,proto3" json:"score,omitempty"`
	// With block_set in the request: the estimated time, in microseconds,
	// to import the node's matched blocks here, so that an engine or router
	// can weigh it against recomputing them. It is two control round trips
	// plus fetch_bytes at the read throughput this node's recent imports
	// from that node measured, plus a restore for each block the node holds
	// on a disk tier only (whole index mode). 0 for this node, for nodes
	// that match no block, and when nothing is measured yet (estimate says
	// which).
	FetchEstimateUs uint64 `protobuf:"varint,4,opt,name=fetch_estimate_us,json=fetchEstimateUs,proto3" json:"fetch_estimate_us,omitempty"`
	// How fetch_estimate_us was made: "measured" (from this node's recent
	// imports from that node), "cluster" (no import from it yet: the mean of
	// the nodes measured), or "none" (no estimate).
	Estimate string `protobuf:"bytes,5,opt,name=estimate,proto3" json:"estimate,omitempty"`
	// The bytes importing the matched blocks into block_set would move.
	FetchBytes uint64 `protobuf:"varint,6,opt,name=fetch_bytes,json=fetchBytes,proto3" json:"fetch_bytes,omitempty"`
	// The transport the measurement was made on ("quic", "rdma"); empty
	// without a measurement of that node.
	Transport     string `protobuf:"bytes,7,opt,name=transport,proto3" json:"transport,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Overlap) Reset() {
	*x = Overlap{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[20]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Overlap) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Overlap) ProtoMessage() {}

func (x *Overlap) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[20]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Overlap.ProtoReflect.Descriptor instead.
func (*Overlap) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{20}
}

func (x *Overlap) GetNode() string {
	if x != nil {
		return x.Node
	}
	return ""
}

func (x *Overlap) GetBlocks() uint32 {
	if x != nil {
		return x.Blocks
	}
	return 0
}

func (x *Overlap) GetScore() float64 {
	if x != nil {
		return x.Score
	}
	return 0
}

func (x *Overlap) GetFetchEstimateUs() uint64 {
	if x != nil {
		return x.FetchEstimateUs
	}
	return 0
}

func (x *Overlap) GetEstimate() string {
	if x != nil {
		return x.Estimate
	}
	return ""
}

func (x *Overlap) GetFetchBytes() uint64 {
	if x != nil {
		return x.FetchBytes
	}
	return 0
}

func (x *Overlap) GetTransport() string {
	if x != nil {
		return x.Transport
	}
	return ""
}

type ImportRequest struct {
	state    protoimpl.MessageState `protogen:"open.v1"`
	BlockSet uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	// The sequence hashes of the blocks wanted, at the block set's page
	// size; or leave them out and give tokens.
	Hashes []uint64 `protobuf:"varint,2,rep,packed,name=hashes,proto3" json:"hashes,omitempty"`
	// Bound on the whole import in milliseconds; 0: the agent's
	// import_timeout. At most import_timeout: a longer one is cut to it.
	TimeoutMs uint32 `protobuf:"varint,3,opt,name=timeout_ms,json=timeoutMs,proto3" json:"timeout_ms,omitempty"`
	// The token ids of the sequence, instead of hashes: the agent hashes
	// every full page of the block set's page size (a trailing partial page
	// is ignored). With tokens, the agent also finds holders whose page
	// divides the block set's (a page-32 engine from page-16 holders): it
	// asks them for their own pages by their own hashes, assembles k of
	// them into each page of the engine's, and registers the result under
	// the engine's hashes.
	Tokens        *Tokens `protobuf:"bytes,4,opt,name=tokens,proto3" json:"tokens,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *ImportRequest) Reset() {
	*x = ImportRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[21]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *ImportRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*ImportRequest) ProtoMessage() {}

func (x *ImportRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[21]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use ImportRequest.ProtoReflect.Descriptor instead.
func (*ImportRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{21}
}

func (x *ImportRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

func (x *ImportRequest) GetHashes() []uint64 {
	if x != nil {
		return x.Hashes
	}
	return nil
}

func (x *ImportRequest) GetTimeoutMs() uint32 {
	if x != nil {
		return x.TimeoutMs
	}
	return 0
}

func (x *ImportRequest) GetTokens() *Tokens {
	if x != nil {
		return x.Tokens
	}
	return nil
}

type ImportResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// The longest prefix brought (or already here), referenced for the engine.
	Blocks []*BlockRef `protobuf:"bytes,1,rep,name=blocks,proto3" json:"blocks,omitempty"`
	// Why the rest is missing, when it is.
	Error   string   `protobuf:"bytes,2,opt,name=error,proto3" json:"error,omitempty"`
	Fetches []*Fetch `protobuf:"bytes,3,rep,name=fetches,proto3" json:"fetches,omitempty"`
	// One per hash of the request, in order: LOCAL (already here), IMPORTED,
	// or MISSING with why; the brought prefix stops at the first MISSING.
	Results       []*BlockResult `protobuf:"bytes,4,rep,name=results,proto3" json:"results,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *ImportResponse) Reset() {
	*x = ImportResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[22]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *ImportResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*ImportResponse) ProtoMessage() {}

func (x *ImportResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[22]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use ImportResponse.ProtoReflect.Descriptor instead.
func (*ImportResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{22}
}

func (x *ImportResponse) GetBlocks() []*BlockRef {
	if x != nil {
		return x.Blocks
	}
	return nil
}

func (x *ImportResponse) GetError() string {
	if x != nil {
		return x.Error
	}
	return ""
}

func (x *ImportResponse) GetFetches() []*Fetch {
	if x != nil {
		return x.Fetches
	}
	return nil
}

func (x *ImportResponse) GetResults() []*BlockResult {
	if x != nil {
		return x.Results
	}
	return nil
}

// What one holder contributed to an import.
type Fetch struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	Node          string                 `protobuf:"bytes,1,opt,name=node,proto3" json:"node,omitempty"`
	Transport     string                 `protobuf:"bytes,2,opt,name=transport,proto3" json:"transport,omitempty"`
	Blocks        uint32                 `protobuf:"varint,3,opt,name=blocks,proto3" json:"blocks,omitempty"`
	Bytes         uint64                 `protobuf:"varint,4,opt,name=bytes,proto3" json:"bytes,omitempty"`
	Micros        uint64                 `protobuf:"varint,5,opt,name=micros,proto3" json:"micros,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Fetch) Reset() {
	*x = Fetch{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[23]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Fetch) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Fetch) ProtoMessage() {}

func (x *Fetch) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[23]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Fetch.ProtoReflect.Descriptor instead.
func (*Fetch) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{23}
}

func (x *Fetch) GetNode() string {
	if x != nil {
		return x.Node
	}
	return ""
}

func (x *Fetch) GetTransport() string {
	if x != nil {
		return x.Transport
	}
	return ""
}

func (x *Fetch) GetBlocks() uint32 {
	if x != nil {
		return x.Blocks
	}
	return 0
}

func (x *Fetch) GetBytes() uint64 {
	if x != nil {
		return x.Bytes
	}
	return 0
}

func (x *Fetch) GetMicros() uint64 {
	if x != nil {
		return x.Micros
	}
	return 0
}

// What happened to one block of a request.
type BlockResult struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	Hash  uint64                 `protobuf:"varint,1,opt,name=hash,proto3" json:"hash,omitempty"`
	// The slot holding the block, for the outcomes that reference one.
	Slot    uint32  `protobuf:"varint,2,opt,name=slot,proto3" json:"slot,omitempty"`
	Outcome Outcome `protobuf:"varint,3,opt,name=outcome,proto3,enum=kvfabric.fabric.v1.Outcome" json:"outcome,omitempty"`
	// Why, for REFUSED and MISSING.
	Reason string `protobuf:"bytes,4,opt,name=reason,proto3" json:"reason,omitempty"`
	// For REFUSED and MISSING, the gRPC code the block alone would have
	// failed with (e.g. 9 FAILED_PRECONDITION for a slot not allocated).
	Code uint32 `protobuf:"varint,5,opt,name=code,proto3" json:"code,omitempty"`
	// RegisterBlocks: the engine's slot the block was written in.
	RequestSlot   uint32 `protobuf:"varint,6,opt,name=request_slot,json=requestSlot,proto3" json:"request_slot,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *BlockResult) Reset() {
	*x = BlockResult{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[24]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *BlockResult) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*BlockResult) ProtoMessage() {}

func (x *BlockResult) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[24]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use BlockResult.ProtoReflect.Descriptor instead.
func (*BlockResult) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{24}
}

func (x *BlockResult) GetHash() uint64 {
	if x != nil {
		return x.Hash
	}
	return 0
}

func (x *BlockResult) GetSlot() uint32 {
	if x != nil {
		return x.Slot
	}
	return 0
}

func (x *BlockResult) GetOutcome() Outcome {
	if x != nil {
		return x.Outcome
	}
	return Outcome_OUTCOME_UNSPECIFIED
}

func (x *BlockResult) GetReason() string {
	if x != nil {
		return x.Reason
	}
	return ""
}

func (x *BlockResult) GetCode() uint32 {
	if x != nil {
		return x.Code
	}
	return 0
}

func (x *BlockResult) GetRequestSlot() uint32 {
	if x != nil {
		return x.RequestSlot
	}
	return 0
}

type SessionRequest struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// In the first request only: a name for logs and status, e.g. "vllm-0".
	Engine        string `protobuf:"bytes,1,opt,name=engine,proto3" json:"engine,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *SessionRequest) Reset() {
	*x = SessionRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[25]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *SessionRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*SessionRequest) ProtoMessage() {}

func (x *SessionRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[25]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use SessionRequest.ProtoReflect.Descriptor instead.
func (*SessionRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{25}
}

func (x *SessionRequest) GetEngine() string {
	if x != nil {
		return x.Engine
	}
	return ""
}

type SessionEvent struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// In the first event: the session's id, for the "kvfabric-session"
	// metadata of every other call.
	Session uint64 `protobuf:"varint,1,opt,name=session,proto3" json:"session,omitempty"`
	// In the first event: the session ends when no SessionRequest arrives
	// for this long.
	KeepaliveMs   uint32 `protobuf:"varint,2,opt,name=keepalive_ms,json=keepaliveMs,proto3" json:"keepalive_ms,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *SessionEvent) Reset() {
	*x = SessionEvent{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[26]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *SessionEvent) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*SessionEvent) ProtoMessage() {}

func (x *SessionEvent) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[26]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use SessionEvent.ProtoReflect.Descriptor instead.
func (*SessionEvent) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{26}
}

func (x *SessionEvent) GetSession() uint64 {
	if x != nil {
		return x.Session
	}
	return 0
}

func (x *SessionEvent) GetKeepaliveMs() uint32 {
	if x != nil {
		return x.KeepaliveMs
	}
	return 0
}

type DropBlockSetRequest struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	BlockSet      uint64                 `protobuf:"varint,1,opt,name=block_set,json=blockSet,proto3" json:"block_set,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *DropBlockSetRequest) Reset() {
	*x = DropBlockSetRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[27]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *DropBlockSetRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*DropBlockSetRequest) ProtoMessage() {}

func (x *DropBlockSetRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[27]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use DropBlockSetRequest.ProtoReflect.Descriptor instead.
func (*DropBlockSetRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{27}
}

func (x *DropBlockSetRequest) GetBlockSet() uint64 {
	if x != nil {
		return x.BlockSet
	}
	return 0
}

type DropBlockSetResponse struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// References the session still held there, now released.
	Released uint32 `protobuf:"varint,1,opt,name=released,proto3" json:"released,omitempty"`
	// Unregistered slots it still held there, now freed.
	Freed         uint32 `protobuf:"varint,2,opt,name=freed,proto3" json:"freed,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *DropBlockSetResponse) Reset() {
	*x = DropBlockSetResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[28]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *DropBlockSetResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*DropBlockSetResponse) ProtoMessage() {}

func (x *DropBlockSetResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[28]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use DropBlockSetResponse.ProtoReflect.Descriptor instead.
func (*DropBlockSetResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{28}
}

func (x *DropBlockSetResponse) GetReleased() uint32 {
	if x != nil {
		return x.Released
	}
	return 0
}

func (x *DropBlockSetResponse) GetFreed() uint32 {
	if x != nil {
		return x.Freed
	}
	return 0
}

type StatusRequest struct {
	state         protoimpl.MessageState `protogen:"open.v1"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *StatusRequest) Reset() {
	*x = StatusRequest{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[29]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *StatusRequest) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*StatusRequest) ProtoMessage() {}

func (x *StatusRequest) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[29]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use StatusRequest.ProtoReflect.Descriptor instead.
func (*StatusRequest) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{29}
}

type StatusResponse struct {
	state   protoimpl.MessageState `protogen:"open.v1"`
	Node    string                 `protobuf:"bytes,1,opt,name=node,proto3" json:"node,omitempty"`
	Version string                 `protobuf:"bytes,2,opt,name=version,proto3" json:"version,omitempty"`
	// Current members first (this node included), then those that left or
	// failed in the last minutes.
	Members      []*Member   `protobuf:"bytes,3,rep,name=members,proto3" json:"members,omitempty"`
	BlockSets    []*BlockSet `protobuf:"bytes,4,rep,name=block_sets,json=blockSets,proto3" json:"block_sets,omitempty"`
	IndexEntries uint64      `protobuf:"varint,5,opt,name=index_entries,json=indexEntries,proto3" json:"index_entries,omitempty"`
	Imports      uint64      `protobuf:"varint,6,opt,name=imports,proto3" json:"imports,omitempty"`
	ImportBytes  uint64      `protobuf:"varint,7,opt,name=import_bytes,json=importBytes,proto3" json:"import_bytes,omitempty"`
	Pools        []*Pool     `protobuf:"bytes,8,rep,name=pools,proto3" json:"pools,omitempty"`
	// Imports in progress, and leases peers hold on this node's blocks.
	ImportsInFlight uint64 `protobuf:"varint,9,opt,name=imports_in_flight,json=importsInFlight,proto3" json:"imports_in_flight,omitempty"`
	Leases          uint64 `protobuf:"varint,10,opt,name=leases,proto3" json:"leases,omitempty"`
	// Whether the node has joined its cluster (or has no seeds).
	Joined bool `protobuf:"varint,11,opt,name=joined,proto3" json:"joined,omitempty"`
	// Engine sessions open now, the implicit one (id 0) included when it
	// holds anything.
	Sessions []*Session `protobuf:"bytes,12,rep,name=sessions,proto3" json:"sessions,omitempty"`
	// The TCP data lane this node serves: "off", "tls HOST:PORT", or
	// "PLAIN TCP HOST:PORT (unencrypted)".
	Lane string `protobuf:"bytes,13,opt,name=lane,proto3" json:"lane,omitempty"`
	// Reads that went over QUIC where the lane was on, by reason.
	LaneFallbacks map[string]uint64 `protobuf:"bytes,14,rep,name=lane_fallbacks,json=laneFallbacks,proto3" json:"lane_fallbacks,omitempty" protobuf_key:"bytes,1,opt,name=key" protobuf_val:"varint,2,opt,name=value"`
	// The disk tiers under the pool, in configured order.
	Tiers []*Tier `protobuf:"bytes,15,rep,name=tiers,proto3" json:"tiers,omitempty"`
	// How the block index is kept: "whole", or "owned" with index_replicas
	// owners a hash; owned_index counts the owned index's traffic (owned
	// mode only). Members whose index mode differs from this node's are
	// marked in members (index_mismatch) and counted here: they are not
	// used as index peers.
	IndexMode              string      `protobuf:"bytes,16,opt,name=index_mode,json=indexMode,proto3" json:"index_mode,omitempty"`
	IndexReplicas          uint32      `protobuf:"varint,17,opt,name=index_replicas,json=indexReplicas,proto3" json:"index_replicas,omitempty"`
	OwnedIndex             *OwnedIndex `protobuf:"bytes,18,opt,name=owned_index,json=ownedIndex,proto3" json:"owned_index,omitempty"`
	IndexMismatchedMembers uint32      `protobuf:"varint,19,opt,name=index_mismatched_members,json=indexMismatchedMembers,proto3" json:"index_mismatched_members,omitempty"`
	// Bytes memberlist received and sent since start (probes, gossip,
	// push/pull, event batches), apart from the peer transport's.
	GossipBytesIn  uint64 `protobuf:"varint,20,opt,name=gossip_bytes_in,json=gossipBytesIn,proto3" json:"gossip_bytes_in,omitempty"`
	GossipBytesOut uint64 `protobuf:"varint,21,opt,name=gossip_bytes_out,json=gossipBytesOut,proto3" json:"gossip_bytes_out,omitempty"`
	// Event gaps closed since start: answers from an origin's log applied
	// (a long gap takes several), and whole holdings snapshots applied. A
	// node that missed an event batch on gossip gets it so, later.
	GossipRangeRepairs    uint64 `protobuf:"varint,22,opt,name=gossip_range_repairs,json=gossipRangeRepairs,proto3" json:"gossip_range_repairs,omitempty"`
	GossipSnapshotRepairs uint64 `protobuf:"varint,23,opt,name=gossip_snapshot_repairs,json=gossipSnapshotRepairs,proto3" json:"gossip_snapshot_repairs,omitempty"`
	unknownFields         protoimpl.UnknownFields
	sizeCache             protoimpl.SizeCache
}

func (x *StatusResponse) Reset() {
	*x = StatusResponse{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[30]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *StatusResponse) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*StatusResponse) ProtoMessage() {}

func (x *StatusResponse) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[30]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use StatusResponse.ProtoReflect.Descriptor instead.
func (*StatusResponse) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{30}
}

func (x *StatusResponse) GetNode() string {
	if x != nil {
		return x.Node
	}
	return ""
}

func (x *StatusResponse) GetVersion() string {
	if x != nil {
		return x.Version
	}
	return ""
}

func (x *StatusResponse) GetMembers() []*Member {
	if x != nil {
		return x.Members
	}
	return nil
}

func (x *StatusResponse) GetBlockSets() []*BlockSet {
	if x != nil {
		return x.BlockSets
	}
	return nil
}

func (x *StatusResponse) GetIndexEntries() uint64 {
	if x != nil {
		return x.IndexEntries
	}
	return 0
}

func (x *StatusResponse) GetImports() uint64 {
	if x != nil {
		return x.Imports
	}
	return 0
}

func (x *StatusResponse) GetImportBytes() uint64 {
	if x != nil {
		return x.ImportBytes
	}
	return 0
}

func (x *StatusResponse) GetPools() []*Pool {
	if x != nil {
		return x.Pools
	}
	return nil
}

func (x *StatusResponse) GetImportsInFlight() uint64 {
	if x != nil {
		return x.ImportsInFlight
	}
	return 0
}

func (x *StatusResponse) GetLeases() uint64 {
	if x != nil {
		return x.Leases
	}
	return 0
}

func (x *StatusResponse) GetJoined() bool {
	if x != nil {
		return x.Joined
	}
	return false
}

func (x *StatusResponse) GetSessions() []*Session {
	if x != nil {
		return x.Sessions
	}
	return nil
}

func (x *StatusResponse) GetLane() string {
	if x != nil {
		return x.Lane
	}
	return ""
}

func (x *StatusResponse) GetLaneFallbacks() map[string]uint64 {
	if x != nil {
		return x.LaneFallbacks
	}
	return nil
}

func (x *StatusResponse) GetTiers() []*Tier {
	if x != nil {
		return x.Tiers
	}
	return nil
}

func (x *StatusResponse) GetIndexMode() string {
	if x != nil {
		return x.IndexMode
	}
	return ""
}

func (x *StatusResponse) GetIndexReplicas() uint32 {
	if x != nil {
		return x.IndexReplicas
	}
	return 0
}

func (x *StatusResponse) GetOwnedIndex() *OwnedIndex {
	if x != nil {
		return x.OwnedIndex
	}
	return nil
}

func (x *StatusResponse) GetIndexMismatchedMembers() uint32 {
	if x != nil {
		return x.IndexMismatchedMembers
	}
	return 0
}

func (x *StatusResponse) GetGossipBytesIn() uint64 {
	if x != nil {
		return x.GossipBytesIn
	}
	return 0
}

func (x *StatusResponse) GetGossipBytesOut() uint64 {
	if x != nil {
		return x.GossipBytesOut
	}
	return 0
}

func (x *StatusResponse) GetGossipRangeRepairs() uint64 {
	if x != nil {
		return x.GossipRangeRepairs
	}
	return 0
}

func (x *StatusResponse) GetGossipSnapshotRepairs() uint64 {
	if x != nil {
		return x.GossipSnapshotRepairs
	}
	return 0
}

// OwnedIndex counts what the owned-slices index did since start.
type OwnedIndex struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// Block events sent to the hashes' owners (in calls applied), and the
	// calls that carried them; events received and applied as an owner.
	OpsSent     uint64 `protobuf:"varint,1,opt,name=ops_sent,json=opsSent,proto3" json:"ops_sent,omitempty"`
	OpCallsSent uint64 `protobuf:"varint,2,opt,name=op_calls_sent,json=opCallsSent,proto3" json:"op_calls_sent,omitempty"`
	OpsReceived uint64 `protobuf:"varint,3,opt,name=ops_received,json=opsReceived,proto3" json:"ops_received,omitempty"`
	// Lookup calls asked of owners, and answered as an owner.
	LookupsAsked    uint64 `protobuf:"varint,4,opt,name=lookups_asked,json=lookupsAsked,proto3" json:"lookups_asked,omitempty"`
	LookupsAnswered uint64 `protobuf:"varint,5,opt,name=lookups_answered,json=lookupsAnswered,proto3" json:"lookups_answered,omitempty"`
	// Hashes a lookup found in the cache of recent answers, did not find,
	// and found too old (asked again).
	CacheHits     uint64 `protobuf:"varint,6,opt,name=cache_hits,json=cacheHits,proto3" json:"cache_hits,omitempty"`
	CacheMisses   uint64 `protobuf:"varint,7,opt,name=cache_misses,json=cacheMisses,proto3" json:"cache_misses,omitempty"`
	CacheExpiries uint64 `protobuf:"varint,8,opt,name=cache_expiries,json=cacheExpiries,proto3" json:"cache_expiries,omitempty"`
	// Member list changes that moved hashes between owners, and the block
	// events they queued (stores to new owners, forgets to old ones).
	Handoffs   uint64 `protobuf:"varint,9,opt,name=handoffs,proto3" json:"handoffs,omitempty"`
	HandoffOps uint64 `protobuf:"varint,10,opt,name=handoff_ops,json=handoffOps,proto3" json:"handoff_ops,omitempty"`
	// Calls to owners that failed (retried), and streams started afresh
	// (an owner asked for its slice again, or a new member got its slice).
	StreamErrors   uint64 `protobuf:"varint,11,opt,name=stream_errors,json=streamErrors,proto3" json:"stream_errors,omitempty"`
	StreamReplaces uint64 `protobuf:"varint,12,opt,name=stream_replaces,json=streamReplaces,proto3" json:"stream_replaces,omitempty"`
	unknownFields  protoimpl.UnknownFields
	sizeCache      protoimpl.SizeCache
}

func (x *OwnedIndex) Reset() {
	*x = OwnedIndex{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[31]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *OwnedIndex) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*OwnedIndex) ProtoMessage() {}

func (x *OwnedIndex) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[31]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use OwnedIndex.ProtoReflect.Descriptor instead.
func (*OwnedIndex) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{31}
}

func (x *OwnedIndex) GetOpsSent() uint64 {
	if x != nil {
		return x.OpsSent
	}
	return 0
}

func (x *OwnedIndex) GetOpCallsSent() uint64 {
	if x != nil {
		return x.OpCallsSent
	}
	return 0
}

func (x *OwnedIndex) GetOpsReceived() uint64 {
	if x != nil {
		return x.OpsReceived
	}
	return 0
}

func (x *OwnedIndex) GetLookupsAsked() uint64 {
	if x != nil {
		return x.LookupsAsked
	}
	return 0
}

func (x *OwnedIndex) GetLookupsAnswered() uint64 {
	if x != nil {
		return x.LookupsAnswered
	}
	return 0
}

func (x *OwnedIndex) GetCacheHits() uint64 {
	if x != nil {
		return x.CacheHits
	}
	return 0
}

func (x *OwnedIndex) GetCacheMisses() uint64 {
	if x != nil {
		return x.CacheMisses
	}
	return 0
}

func (x *OwnedIndex) GetCacheExpiries() uint64 {
	if x != nil {
		return x.CacheExpiries
	}
	return 0
}

func (x *OwnedIndex) GetHandoffs() uint64 {
	if x != nil {
		return x.Handoffs
	}
	return 0
}

func (x *OwnedIndex) GetHandoffOps() uint64 {
	if x != nil {
		return x.HandoffOps
	}
	return 0
}

func (x *OwnedIndex) GetStreamErrors() uint64 {
	if x != nil {
		return x.StreamErrors
	}
	return 0
}

func (x *OwnedIndex) GetStreamReplaces() uint64 {
	if x != nil {
		return x.StreamReplaces
	}
	return 0
}

type Tier struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// "disk".
	Kind      string `protobuf:"bytes,1,opt,name=kind,proto3" json:"kind,omitempty"`
	Path      string `protobuf:"bytes,2,opt,name=path,proto3" json:"path,omitempty"`
	SizeBytes uint64 `protobuf:"varint,3,opt,name=size_bytes,json=sizeBytes,proto3" json:"size_bytes,omitempty"`
	// Blocks held and the bytes they take; 0 block_bytes until the first
	// block sized the tier's slots.
	Blocks     uint64 `protobuf:"varint,4,opt,name=blocks,proto3" json:"blocks,omitempty"`
	Bytes      uint64 `protobuf:"varint,5,opt,name=bytes,proto3" json:"bytes,omitempty"`
	BlockBytes uint64 `protobuf:"varint,6,opt,name=block_bytes,json=blockBytes,proto3" json:"block_bytes,omitempty"`
	// Blocks copied down, restored, dropped for failing a check, and
	// evicted to make room, since start.
	Offloads         uint64 `protobuf:"varint,7,opt,name=offloads,proto3" json:"offloads,omitempty"`
	Restores         uint64 `protobuf:"varint,8,opt,name=restores,proto3" json:"restores,omitempty"`
	ChecksumFailures uint64 `protobuf:"varint,9,opt,name=checksum_failures,json=checksumFailures,proto3" json:"checksum_failures,omitempty"`
	Evictions        uint64 `protobuf:"varint,10,opt,name=evictions,proto3" json:"evictions,omitempty"`
	// Read-ahead along sequences, all tiers together, on the first tier
	// only (0 on the others): blocks read ahead into engines' block sets,
	// those later taken (hits), and those recycled or freed with their set
	// before any was taken (unused), since start.
	ReadAheadBlocks uint64 `protobuf:"varint,11,opt,name=read_ahead_blocks,json=readAheadBlocks,proto3" json:"read_ahead_blocks,omitempty"`
	ReadAheadHits   uint64 `protobuf:"varint,12,opt,name=read_ahead_hits,json=readAheadHits,proto3" json:"read_ahead_hits,omitempty"`
	ReadAheadUnused uint64 `protobuf:"varint,13,opt,name=read_ahead_unused,json=readAheadUnused,proto3" json:"read_ahead_unused,omitempty"`
	unknownFields   protoimpl.UnknownFields
	sizeCache       protoimpl.SizeCache
}

func (x *Tier) Reset() {
	*x = Tier{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[32]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Tier) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Tier) ProtoMessage() {}

func (x *Tier) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[32]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Tier.ProtoReflect.Descriptor instead.
func (*Tier) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{32}
}

func (x *Tier) GetKind() string {
	if x != nil {
		return x.Kind
	}
	return ""
}

func (x *Tier) GetPath() string {
	if x != nil {
		return x.Path
	}
	return ""
}

func (x *Tier) GetSizeBytes() uint64 {
	if x != nil {
		return x.SizeBytes
	}
	return 0
}

func (x *Tier) GetBlocks() uint64 {
	if x != nil {
		return x.Blocks
	}
	return 0
}

func (x *Tier) GetBytes() uint64 {
	if x != nil {
		return x.Bytes
	}
	return 0
}

func (x *Tier) GetBlockBytes() uint64 {
	if x != nil {
		return x.BlockBytes
	}
	return 0
}

func (x *Tier) GetOffloads() uint64 {
	if x != nil {
		return x.Offloads
	}
	return 0
}

func (x *Tier) GetRestores() uint64 {
	if x != nil {
		return x.Restores
	}
	return 0
}

func (x *Tier) GetChecksumFailures() uint64 {
	if x != nil {
		return x.ChecksumFailures
	}
	return 0
}

func (x *Tier) GetEvictions() uint64 {
	if x != nil {
		return x.Evictions
	}
	return 0
}

func (x *Tier) GetReadAheadBlocks() uint64 {
	if x != nil {
		return x.ReadAheadBlocks
	}
	return 0
}

func (x *Tier) GetReadAheadHits() uint64 {
	if x != nil {
		return x.ReadAheadHits
	}
	return 0
}

func (x *Tier) GetReadAheadUnused() uint64 {
	if x != nil {
		return x.ReadAheadUnused
	}
	return 0
}

type Session struct {
	state  protoimpl.MessageState `protogen:"open.v1"`
	Id     uint64                 `protobuf:"varint,1,opt,name=id,proto3" json:"id,omitempty"`
	Engine string                 `protobuf:"bytes,2,opt,name=engine,proto3" json:"engine,omitempty"`
	// The engine process, from the socket's peer credentials where the
	// platform gives them; 0 where it does not.
	Pid int32  `protobuf:"varint,3,opt,name=pid,proto3" json:"pid,omitempty"`
	Uid uint32 `protobuf:"varint,4,opt,name=uid,proto3" json:"uid,omitempty"`
	// When it was opened (Unix milliseconds).
	OpenedUnixMs int64 `protobuf:"varint,5,opt,name=opened_unix_ms,json=openedUnixMs,proto3" json:"opened_unix_ms,omitempty"`
	// Block sets it uses, references it holds, unregistered slots it holds.
	BlockSets     []uint64 `protobuf:"varint,6,rep,packed,name=block_sets,json=blockSets,proto3" json:"block_sets,omitempty"`
	Refs          uint32   `protobuf:"varint,7,opt,name=refs,proto3" json:"refs,omitempty"`
	Slots         uint32   `protobuf:"varint,8,opt,name=slots,proto3" json:"slots,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Session) Reset() {
	*x = Session{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[33]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Session) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Session) ProtoMessage() {}

func (x *Session) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[33]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Session.ProtoReflect.Descriptor instead.
func (*Session) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{33}
}

func (x *Session) GetId() uint64 {
	if x != nil {
		return x.Id
	}
	return 0
}

func (x *Session) GetEngine() string {
	if x != nil {
		return x.Engine
	}
	return ""
}

func (x *Session) GetPid() int32 {
	if x != nil {
		return x.Pid
	}
	return 0
}

func (x *Session) GetUid() uint32 {
	if x != nil {
		return x.Uid
	}
	return 0
}

func (x *Session) GetOpenedUnixMs() int64 {
	if x != nil {
		return x.OpenedUnixMs
	}
	return 0
}

func (x *Session) GetBlockSets() []uint64 {
	if x != nil {
		return x.BlockSets
	}
	return nil
}

func (x *Session) GetRefs() uint32 {
	if x != nil {
		return x.Refs
	}
	return 0
}

func (x *Session) GetSlots() uint32 {
	if x != nil {
		return x.Slots
	}
	return 0
}

type Member struct {
	state      protoimpl.MessageState `protogen:"open.v1"`
	Node       string                 `protobuf:"bytes,1,opt,name=node,proto3" json:"node,omitempty"`
	GossipAddr string                 `protobuf:"bytes,2,opt,name=gossip_addr,json=gossipAddr,proto3" json:"gossip_addr,omitempty"`
	PeerAddr   string                 `protobuf:"bytes,3,opt,name=peer_addr,json=peerAddr,proto3" json:"peer_addr,omitempty"`
	// alive, left or failed.
	State  string `protobuf:"bytes,4,opt,name=state,proto3" json:"state,omitempty"`
	Blocks uint64 `protobuf:"varint,5,opt,name=blocks,proto3" json:"blocks,omitempty"`
	// For a member that left or failed, when this node saw it go (Unix
	// milliseconds); 0 for a current member.
	SinceUnixMs int64 `protobuf:"varint,6,opt,name=since_unix_ms,json=sinceUnixMs,proto3" json:"since_unix_ms,omitempty"`
	// Whether the member reads and serves over RDMA.
	Rdma bool `protobuf:"varint,7,opt,name=rdma,proto3" json:"rdma,omitempty"`
	// The member's device pools, from its metadata: how many GPUs, their
	// bytes, the RDMA devices they are registered with (gpus where it has a
	// NIC per GPU) and the first GPU's name; 0 and empty without.
	Gpus         uint32 `protobuf:"varint,8,opt,name=gpus,proto3" json:"gpus,omitempty"`
	GpuPoolBytes uint64 `protobuf:"varint,9,opt,name=gpu_pool_bytes,json=gpuPoolBytes,proto3" json:"gpu_pool_bytes,omitempty"`
	GpuNics      uint32 `protobuf:"varint,10,opt,name=gpu_nics,json=gpuNics,proto3" json:"gpu_nics,omitempty"`
	GpuModel     string `protobuf:"bytes,11,opt,name=gpu_model,json=gpuModel,proto3" json:"gpu_model,omitempty"`
	// This node's peer connection to the member (current members only):
	// whether it answered a QUIC handshake, whether the handshake
	// authenticated both sides (a certificate from another CA does not),
	// and the last dial's error ("" after a success, or before any dial).
	PeerReachable     bool   `protobuf:"varint,12,opt,name=peer_reachable,json=peerReachable,proto3" json:"peer_reachable,omitempty"`
	PeerAuthenticated bool   `protobuf:"varint,13,opt,name=peer_authenticated,json=peerAuthenticated,proto3" json:"peer_authenticated,omitempty"`
	PeerError         string `protobuf:"bytes,14,opt,name=peer_error,json=peerError,proto3" json:"peer_error,omitempty"`
	// The member's index mode from its metadata ("whole", or "owned" and
	// its owners a hash), and whether it differs from this node's: such a
	// member is not used as an index peer.
	IndexMode     string `protobuf:"bytes,15,opt,name=index_mode,json=indexMode,proto3" json:"index_mode,omitempty"`
	IndexReplicas uint32 `protobuf:"varint,16,opt,name=index_replicas,json=indexReplicas,proto3" json:"index_replicas,omitempty"`
	IndexMismatch bool   `protobuf:"varint,17,opt,name=index_mismatch,json=indexMismatch,proto3" json:"index_mismatch,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Member) Reset() {
	*x = Member{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[34]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Member) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Member) ProtoMessage() {}

func (x *Member) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[34]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Member.ProtoReflect.Descriptor instead.
func (*Member) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{34}
}

func (x *Member) GetNode() string {
	if x != nil {
		return x.Node
	}
	return ""
}

func (x *Member) GetGossipAddr() string {
	if x != nil {
		return x.GossipAddr
	}
	return ""
}

func (x *Member) GetPeerAddr() string {
	if x != nil {
		return x.PeerAddr
	}
	return ""
}

func (x *Member) GetState() string {
	if x != nil {
		return x.State
	}
	return ""
}

func (x *Member) GetBlocks() uint64 {
	if x != nil {
		return x.Blocks
	}
	return 0
}

func (x *Member) GetSinceUnixMs() int64 {
	if x != nil {
		return x.SinceUnixMs
	}
	return 0
}

func (x *Member) GetRdma() bool {
	if x != nil {
		return x.Rdma
	}
	return false
}

func (x *Member) GetGpus() uint32 {
	if x != nil {
		return x.Gpus
	}
	return 0
}

func (x *Member) GetGpuPoolBytes() uint64 {
	if x != nil {
		return x.GpuPoolBytes
	}
	return 0
}

func (x *Member) GetGpuNics() uint32 {
	if x != nil {
		return x.GpuNics
	}
	return 0
}

func (x *Member) GetGpuModel() string {
	if x != nil {
		return x.GpuModel
	}
	return ""
}

func (x *Member) GetPeerReachable() bool {
	if x != nil {
		return x.PeerReachable
	}
	return false
}

func (x *Member) GetPeerAuthenticated() bool {
	if x != nil {
		return x.PeerAuthenticated
	}
	return false
}

func (x *Member) GetPeerError() string {
	if x != nil {
		return x.PeerError
	}
	return ""
}

func (x *Member) GetIndexMode() string {
	if x != nil {
		return x.IndexMode
	}
	return ""
}

func (x *Member) GetIndexReplicas() uint32 {
	if x != nil {
		return x.IndexReplicas
	}
	return 0
}

func (x *Member) GetIndexMismatch() bool {
	if x != nil {
		return x.IndexMismatch
	}
	return false
}

// Pool is memory the agent owns in one tier: the host (or pinned) pool,
// or one per GPU with a device pool.
type Pool struct {
	state protoimpl.MessageState `protogen:"open.v1"`
	// host, pinned or device.
	Kind      string `protobuf:"bytes,1,opt,name=kind,proto3" json:"kind,omitempty"`
	SizeBytes uint64 `protobuf:"varint,2,opt,name=size_bytes,json=sizeBytes,proto3" json:"size_bytes,omitempty"`
	// Bytes carved into block sets.
	CarvedBytes uint64 `protobuf:"varint,3,opt,name=carved_bytes,json=carvedBytes,proto3" json:"carved_bytes,omitempty"`
	// Block sets with at least one region in this pool.
	BlockSets uint32 `protobuf:"varint,4,opt,name=block_sets,json=blockSets,proto3" json:"block_sets,omitempty"`
	// For a device pool, the GPU's CUDA index on the agent; -1 for host
	// memory.
	Device int32 `protobuf:"varint,5,opt,name=device,proto3" json:"device,omitempty"`
	// For a device pool, how the NIC reaches it: "dmabuf", "peer-memory"
	// or "" (not registered for RDMA, read and served without it).
	RdmaRegistration string `protobuf:"bytes,6,opt,name=rdma_registration,json=rdmaRegistration,proto3" json:"rdma_registration,omitempty"`
	// The RDMA device the pool is registered with (for a device pool, the
	// one nearest its GPU); empty when it is not registered.
	RdmaDevice    string `protobuf:"bytes,7,opt,name=rdma_device,json=rdmaDevice,proto3" json:"rdma_device,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *Pool) Reset() {
	*x = Pool{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[35]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *Pool) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*Pool) ProtoMessage() {}

func (x *Pool) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[35]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use Pool.ProtoReflect.Descriptor instead.
func (*Pool) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{35}
}

func (x *Pool) GetKind() string {
	if x != nil {
		return x.Kind
	}
	return ""
}

func (x *Pool) GetSizeBytes() uint64 {
	if x != nil {
		return x.SizeBytes
	}
	return 0
}

func (x *Pool) GetCarvedBytes() uint64 {
	if x != nil {
		return x.CarvedBytes
	}
	return 0
}

func (x *Pool) GetBlockSets() uint32 {
	if x != nil {
		return x.BlockSets
	}
	return 0
}

func (x *Pool) GetDevice() int32 {
	if x != nil {
		return x.Device
	}
	return 0
}

func (x *Pool) GetRdmaRegistration() string {
	if x != nil {
		return x.RdmaRegistration
	}
	return ""
}

func (x *Pool) GetRdmaDevice() string {
	if x != nil {
		return x.RdmaDevice
	}
	return ""
}

type BlockSet struct {
	state        protoimpl.MessageState `protogen:"open.v1"`
	Id           uint64                 `protobuf:"varint,1,opt,name=id,proto3" json:"id,omitempty"`
	Engine       string                 `protobuf:"bytes,2,opt,name=engine,proto3" json:"engine,omitempty"`
	LayoutDigest string                 `protobuf:"bytes,3,opt,name=layout_digest,json=layoutDigest,proto3" json:"layout_digest,omitempty"`
	TpSize       uint32                 `protobuf:"varint,4,opt,name=tp_size,json=tpSize,proto3" json:"tp_size,omitempty"`
	PageSize     uint32                 `protobuf:"varint,5,opt,name=page_size,json=pageSize,proto3" json:"page_size,omitempty"`
	Slots        uint32                 `protobuf:"varint,6,opt,name=slots,proto3" json:"slots,omitempty"`
	Free         uint32                 `protobuf:"varint,7,opt,name=free,proto3" json:"free,omitempty"`
	Registered   uint32                 `protobuf:"varint,8,opt,name=registered,proto3" json:"registered,omitempty"`
	Leased       uint32                 `protobuf:"varint,9,opt,name=leased,proto3" json:"leased,omitempty"`
	// Sessions using the set; 0 with idle_since_unix_ms set: the set is
	// freed after the grace period or when its memory is needed.
	Sessions        uint32 `protobuf:"varint,10,opt,name=sessions,proto3" json:"sessions,omitempty"`
	IdleSinceUnixMs int64  `protobuf:"varint,11,opt,name=idle_since_unix_ms,json=idleSinceUnixMs,proto3" json:"idle_since_unix_ms,omitempty"`
	// Kept past the grace period as a cache of an engine that is gone: its
	// blocks are announced and served, the next engine of its layout takes
	// it up, and it is freed first when a new block set needs the memory.
	Orphaned bool `protobuf:"varint,12,opt,name=orphaned,proto3" json:"orphaned,omitempty"`
	// The times a new engine session took the set up as an orphan.
	Adoptions     uint32 `protobuf:"varint,13,opt,name=adoptions,proto3" json:"adoptions,omitempty"`
	unknownFields protoimpl.UnknownFields
	sizeCache     protoimpl.SizeCache
}

func (x *BlockSet) Reset() {
	*x = BlockSet{}
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[36]
	ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
	ms.StoreMessageInfo(mi)
}

func (x *BlockSet) String() string {
	return protoimpl.X.MessageStringOf(x)
}

func (*BlockSet) ProtoMessage() {}

func (x *BlockSet) ProtoReflect() protoreflect.Message {
	mi := &file_fabric_fabricpb_engine_proto_msgTypes[36]
	if x != nil {
		ms := protoimpl.X.MessageStateOf(protoimpl.Pointer(x))
		if ms.LoadMessageInfo() == nil {
			ms.StoreMessageInfo(mi)
		}
		return ms
	}
	return mi.MessageOf(x)
}

// Deprecated: Use BlockSet.ProtoReflect.Descriptor instead.
func (*BlockSet) Descriptor() ([]byte, []int) {
	return file_fabric_fabricpb_engine_proto_rawDescGZIP(), []int{36}
}

func (x *BlockSet) GetId() uint64 {
	if x != nil {
		return x.Id
	}
	return 0
}

func (x *BlockSet) GetEngine() string {
	if x != nil {
		return x.Engine
	}
	return ""
}

func (x *BlockSet) GetLayoutDigest() string {
	if x != nil {
		return x.LayoutDigest
	}
	return ""
}

func (x *BlockSet) GetTpSize() uint32 {
	if x != nil {
		return x.TpSize
	}
	return 0
}

func (x *BlockSet) GetPageSize() uint32 {
	if x != nil {
		return x.PageSize
	}
	return 0
}

func (x *BlockSet) GetSlots() uint32 {
	if x != nil {
		return x.Slots
	}
	return 0
}

func (x *BlockSet) GetFree() uint32 {
	if x != nil {
		return x.Free
	}
	return 0
}

func (x *BlockSet) GetRegistered() uint32 {
	if x != nil {
		return x.Registered
	}
	return 0
}

func (x *BlockSet) GetLeased() uint32 {
	if x != nil {
		return x.Leased
	}
	return 0
}

func (x *BlockSet) GetSessions() uint32 {
	if x != nil {
		return x.Sessions
	}
	return 0
}

func (x *BlockSet) GetIdleSinceUnixMs() int64 {
	if x != nil {
		return x.IdleSinceUnixMs
	}
	return 0
}

func (x *BlockSet) GetOrphaned() bool {
	if x != nil {
		return x.Orphaned
	}
	return false
}

func (x *BlockSet) GetAdoptions() uint32 {
	if x != nil {
		return x.Adoptions
	}
	return 0
}

var File_fabric_fabricpb_engine_proto protoreflect.FileDescriptor

const file_fabric_fabricpb_engine_proto_rawDesc = "" +
	"\n" +
	"\x1cfabric/fabricpb/engine.proto\x12\x12kvfabric.fabric.v1\x1a\x1clayout/layoutpb/layout.proto\"z\n" +
	"\x0fPrefetchRequest\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\x12\x16\n" +
	"\x06hashes\x18\x02 \x03(\x04R\x06hashes\x122\n" +
	"\x06tokens\x18\x03 \x01(\v2\x1a.kvfabric.fabric.v1.TokensR\x06tokens\"}\n" +
	"\x10PrefetchResponse\x12\x1b\n" +
	"\tin_memory\x18\x01 \x01(\rR\binMemory\x12\x1a\n" +
	"\brestored\x18\x02 \x01(\rR\brestored\x12\x14\n" +
	"\x05error\x18\x03 \x01(\tR\x05error\x12\x1a\n" +
	"\bimported\x18\x04 \x01(\rR\bimported\"\xa4\x03\n" +
	"\x0fRegisterRequest\x12\x16\n" +
	"\x06engine\x18\x01 \x01(\tR\x06engine\x125\n" +
	"\x05model\x18\x02 \x01(\v2\x1f.kvfabric.layout.v1.ModelConfigR\x05model\x12\x17\n" +
	"\atp_size\x18\x03 \x01(\rR\x06tpSize\x12\x1b\n" +
	"\tpage_size\x18\x04 \x01(\rR\bpageSize\x126\n" +
	"\bkv_order\x18\x05 \x01(\x0e2\x1b.kvfabric.layout.v1.KVOrderR\akvOrder\x12A\n" +
	"\varrangement\x18\x06 \x01(\x0e2\x1f.kvfabric.layout.v1.ArrangementR\varrangement\x12\x14\n" +
	"\x05slots\x18\a \x01(\rR\x05slots\x12\x1c\n" +
	"\talignment\x18\b \x01(\x04R\talignment\x12\x18\n" +
	"\adevices\x18\t \x03(\tR\adevices\x12$\n" +
	"\x0ejoin_block_set\x18\n" +
	" \x01(\x04R\fjoinBlockSet\x12\x1d\n" +
	"\n" +
	"join_token\x18\v \x01(\tR\tjoinToken\"\x86\x02\n" +
	"\x10RegisterResponse\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\x122\n" +
	"\x06layout\x18\x02 \x01(\v2\x1a.kvfabric.layout.v1.LayoutR\x06layout\x122\n" +
	"\x06memory\x18\x03 \x03(\v2\x1a.kvfabric.fabric.v1.MemoryR\x06memory\x12\x18\n" +
	"\aretains\x18\x04 \x01(\rR\aretains\x124\n" +
	"\x05ranks\x18\x05 \x03(\v2\x1e.kvfabric.fabric.v1.RankLayoutR\x05ranks\x12\x1d\n" +
	"\n" +
	"join_token\x18\x06 \x01(\tR\tjoinToken\"\x93\x02\n" +
	"\x06Memory\x12\x12\n" +
	"\x04path\x18\x01 \x01(\tR\x04path\x12\x16\n" +
	"\x06offset\x18\x02 \x01(\x04R\x06offset\x12\x12\n" +
	"\x04size\x18\x03 \x01(\x04R\x04size\x12\x14\n" +
	"\x05token\x18\x04 \x01(\tR\x05token\x12\x1b\n" +
	"\tfd_socket\x18\x05 \x01(\tR\bfdSocket\x12\x12\n" +
	"\x04file\x18\x06 \x01(\tR\x04file\x12\x1b\n" +
	"\tfile_size\x18\a \x01(\x04R\bfileSize\x12&\n" +
	"\x0fcuda_ipc_handle\x18\b \x01(\fR\rcudaIpcHandle\x12\x1f\n" +
	"\vcuda_device\x18\t \x01(\x05R\n" +
	"cudaDevice\x12\x1c\n" +
	"\n" +
	"pci_bus_id\x18\n" +
	" \x01(\tR\bpciBusId\"\xbd\x02\n" +
	"\n" +
	"RankLayout\x12\x16\n" +
	"\x06offset\x18\x01 \x01(\x04R\x06offset\x12!\n" +
	"\fblock_stride\x18\x02 \x01(\x04R\vblockStride\x12!\n" +
	"\flayer_stride\x18\x03 \x01(\x04R\vlayerStride\x12\x1b\n" +
	"\tkv_stride\x18\x04 \x01(\x04R\bkvStride\x12\x1f\n" +
	"\vchunk_shape\x18\x05 \x03(\rR\n" +
	"chunkShape\x12\x19\n" +
	"\bhead_ids\x18\x06 \x03(\rR\aheadIds\x12\x1a\n" +
	"\breplicas\x18\a \x01(\rR\breplicas\x12\x16\n" +
	"\x06planes\x18\b \x01(\rR\x06planes\x12#\n" +
	"\relement_bytes\x18\t \x01(\rR\felementBytes\x12\x1f\n" +
	"\vchunk_bytes\x18\n" +
	" \x01(\x04R\n" +
	"chunkBytes\"D\n" +
	"\x0fAllocateRequest\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\x12\x14\n" +
	"\x05count\x18\x02 \x01(\rR\x05count\"(\n" +
	"\x10AllocateResponse\x12\x14\n" +
	"\x05slots\x18\x01 \x03(\rR\x05slots\"@\n" +
	"\vFreeRequest\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\x12\x14\n" +
	"\x05slots\x18\x02 \x03(\rR\x05slots\"\x0e\n" +
	"\fFreeResponse\"B\n" +
	"\x06Tokens\x12\x10\n" +
	"\x03ids\x18\x01 \x03(\rR\x03ids\x12\x12\n" +
	"\x04salt\x18\x02 \x01(\tR\x04salt\x12\x12\n" +
	"\x04lora\x18\x03 \x01(\tR\x04lora\"\xcd\x01\n" +
	"\x15RegisterBlocksRequest\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\x12\x14\n" +
	"\x05slots\x18\x02 \x03(\rR\x05slots\x12\x16\n" +
	"\x06hashes\x18\x03 \x03(\x04R\x06hashes\x122\n" +
	"\x06tokens\x18\x04 \x01(\v2\x1a.kvfabric.fabric.v1.TokensR\x06tokens\x12\x16\n" +
	"\x06parent\x18\x05 \x01(\x04R\x06parent\x12\x1d\n" +
	"\n" +
	"parent_set\x18\x06 \x01(\bR\tparentSet\"\x89\x01\n" +
	"\x16RegisterBlocksResponse\x124\n" +
	"\x06blocks\x18\x01 \x03(\v2\x1c.kvfabric.fabric.v1.BlockRefR\x06blocks\x129\n" +
	"\aresults\x18\x02 \x03(\v2\x1f.kvfabric.fabric.v1.BlockResultR\aresults\"P\n" +
	"\bBlockRef\x12\x12\n" +
	"\x04hash\x18\x01 \x01(\x04R\x04hash\x12\x12\n" +
	"\x04slot\x18\x02 \x01(\rR\x04slot\x12\x1c\n" +
	"\tduplicate\x18\x03 \x01(\bR\tduplicate\"E\n" +
	"\x0eAcquireRequest\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\x12\x16\n" +
	"\x06hashes\x18\x02 \x03(\x04R\x06hashes\"\x82\x01\n" +
	"\x0fAcquireResponse\x124\n" +
	"\x06blocks\x18\x01 \x03(\v2\x1c.kvfabric.fabric.v1.BlockRefR\x06blocks\x129\n" +
	"\aresults\x18\x02 \x03(\v2\x1f.kvfabric.fabric.v1.BlockResultR\aresults\"C\n" +
	"\x0eReleaseRequest\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\x12\x14\n" +
	"\x05slots\x18\x02 \x03(\rR\x05slots\"\x11\n" +
	"\x0fReleaseResponse\"\xb6\x01\n" +
	"\rLookupRequest\x12\x16\n" +
	"\x06hashes\x18\x01 \x03(\x04R\x06hashes\x122\n" +
	"\x06tokens\x18\x02 \x01(\v2\x1a.kvfabric.fabric.v1.TokensR\x06tokens\x12\x1d\n" +
	"\n" +
	"block_size\x18\x03 \x01(\rR\tblockSize\x12\x1b\n" +
	"\tblock_set\x18\x04 \x01(\x04R\bblockSet\x12\x1d\n" +
	"\n" +
	"no_restore\x18\x05 \x01(\bR\tnoRestore\"\x82\x01\n" +
	"\x0eLookupResponse\x12\x16\n" +
	"\x06hashes\x18\x01 \x03(\x04R\x06hashes\x127\n" +
	"\boverlaps\x18\x02 \x03(\v2\x1b.kvfabric.fabric.v1.OverlapR\boverlaps\x12\x1f\n" +
	"\vlocal_tiers\x18\x03 \x03(\tR\n" +
	"localTiers\"\xd2\x01\n" +
	"\aOverlap\x12\x12\n" +
	"\x04node\x18\x01 \x01(\tR\x04node\x12\x16\n" +
	"\x06blocks\x18\x02 \x01(\rR\x06blocks\x12\x14\n" +
	"\x05score\x18\x03 \x01(\x01R\x05score\x12*\n" +
	"\x11fetch_estimate_us\x18\x04 \x01(\x04R\x0ffetchEstimateUs\x12\x1a\n" +
	"\bestimate\x18\x05 \x01(\tR\bestimate\x12\x1f\n" +
	"\vfetch_bytes\x18\x06 \x01(\x04R\n" +
	"fetchBytes\x12\x1c\n" +
	"\ttransport\x18\a \x01(\tR\ttransport\"\x97\x01\n" +
	"\rImportRequest\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\x12\x16\n" +
	"\x06hashes\x18\x02 \x03(\x04R\x06hashes\x12\x1d\n" +
	"\n" +
	"timeout_ms\x18\x03 \x01(\rR\ttimeoutMs\x122\n" +
	"\x06tokens\x18\x04 \x01(\v2\x1a.kvfabric.fabric.v1.TokensR\x06tokens\"\xcc\x01\n" +
	"\x0eImportResponse\x124\n" +
	"\x06blocks\x18\x01 \x03(\v2\x1c.kvfabric.fabric.v1.BlockRefR\x06blocks\x12\x14\n" +
	"\x05error\x18\x02 \x01(\tR\x05error\x123\n" +
	"\afetches\x18\x03 \x03(\v2\x19.kvfabric.fabric.v1.FetchR\afetches\x129\n" +
	"\aresults\x18\x04 \x03(\v2\x1f.kvfabric.fabric.v1.BlockResultR\aresults\"\x7f\n" +
	"\x05Fetch\x12\x12\n" +
	"\x04node\x18\x01 \x01(\tR\x04node\x12\x1c\n" +
	"\ttransport\x18\x02 \x01(\tR\ttransport\x12\x16\n" +
	"\x06blocks\x18\x03 \x01(\rR\x06blocks\x12\x14\n" +
	"\x05bytes\x18\x04 \x01(\x04R\x05bytes\x12\x16\n" +
	"\x06micros\x18\x05 \x01(\x04R\x06micros\"\xbb\x01\n" +
	"\vBlockResult\x12\x12\n" +
	"\x04hash\x18\x01 \x01(\x04R\x04hash\x12\x12\n" +
	"\x04slot\x18\x02 \x01(\rR\x04slot\x125\n" +
	"\aoutcome\x18\x03 \x01(\x0e2\x1b.kvfabric.fabric.v1.OutcomeR\aoutcome\x12\x16\n" +
	"\x06reason\x18\x04 \x01(\tR\x06reason\x12\x12\n" +
	"\x04code\x18\x05 \x01(\rR\x04code\x12!\n" +
	"\frequest_slot\x18\x06 \x01(\rR\vrequestSlot\"(\n" +
	"\x0eSessionRequest\x12\x16\n" +
	"\x06engine\x18\x01 \x01(\tR\x06engine\"K\n" +
	"\fSessionEvent\x12\x18\n" +
	"\asession\x18\x01 \x01(\x04R\asession\x12!\n" +
	"\fkeepalive_ms\x18\x02 \x01(\rR\vkeepaliveMs\"2\n" +
	"\x13DropBlockSetRequest\x12\x1b\n" +
	"\tblock_set\x18\x01 \x01(\x04R\bblockSet\"H\n" +
	"\x14DropBlockSetResponse\x12\x1a\n" +
	"\breleased\x18\x01 \x01(\rR\breleased\x12\x14\n" +
	"\x05freed\x18\x02 \x01(\rR\x05freed\"\x0f\n" +
	"\rStatusRequest\"\xb9\b\n" +
	"\x0eStatusResponse\x12\x12\n" +
	"\x04node\x18\x01 \x01(\tR\x04node\x12\x18\n" +
	"\aversion\x18\x02 \x01(\tR\aversion\x124\n" +
	"\amembers\x18\x03 \x03(\v2\x1a.kvfabric.fabric.v1.MemberR\amembers\x12;\n" +
	"\n" +
	"block_sets\x18\x04 \x03(\v2\x1c.kvfabric.fabric.v1.BlockSetR\tblockSets\x12#\n" +
	"\rindex_entries\x18\x05 \x01(\x04R\findexEntries\x12\x18\n" +
	"\aimports\x18\x06 \x01(\x04R\aimports\x12!\n" +
	"\fimport_bytes\x18\a \x01(\x04R\vimportBytes\x12.\n" +
	"\x05pools\x18\b \x03(\v2\x18.kvfabric.fabric.v1.PoolR\x05pools\x12*\n" +
	"\x11imports_in_flight\x18\t \x01(\x04R\x0fimportsInFlight\x12\x16\n" +
	"\x06leases\x18\n" +
	" \x01(\x04R\x06leases\x12\x16\n" +
	"\x06joined\x18\v \x01(\bR\x06joined\x127\n" +
	"\bsessions\x18\f \x03(\v2\x1b.kvfabric.fabric.v1.SessionR\bsessions\x12\x12\n" +
	"\x04lane\x18\r \x01(\tR\x04lane\x12\\\n" +
	"\x0elane_fallbacks\x18\x0e \x03(\v25.kvfabric.fabric.v1.StatusResponse.LaneFallbacksEntryR\rlaneFallbacks\x12.\n" +
	"\x05tiers\x18\x0f \x03(\v2\x18.kvfabric.fabric.v1.TierR\x05tiers\x12\x1d\n" +
	"\n" +
	"index_mode\x18\x10 \x01(\tR\tindexMode\x12%\n" +
	"\x0eindex_replicas\x18\x11 \x01(\rR\rindexReplicas\x12?\n" +
	"\vowned_index\x18\x12 \x01(\v2\x1e.kvfabric.fabric.v1.OwnedIndexR\n" +
	"ownedIndex\x128\n" +
	"\x18index_mismatched_members\x18\x13 \x01(\rR\x16indexMismatchedMembers\x12&\n" +
	"\x0fgossip_bytes_in\x18\x14 \x01(\x04R\rgossipBytesIn\x12(\n" +
	"\x10gossip_bytes_out\x18\x15 \x01(\x04R\x0egossipBytesOut\x120\n" +
	"\x14gossip_range_repairs\x18\x16 \x01(\x04R\x12gossipRangeRepairs\x126\n" +
	"\x17gossip_snapshot_repairs\x18\x17 \x01(\x04R\x15gossipSnapshotRepairs\x1a@\n" +
	"\x12LaneFallbacksEntry\x12\x10\n" +
	"\x03key\x18\x01 \x01(\tR\x03key\x12\x14\n" +
	"\x05value\x18\x02 \x01(\x04R\x05value:\x028\x01\"\xb2\x03\n" +
	"\n" +
	"OwnedIndex\x12\x19\n" +
	"\bops_sent\x18\x01 \x01(\x04R\aopsSent\x12\"\n" +
	"\rop_calls_sent\x18\x02 \x01(\x04R\vopCallsSent\x12!\n" +
	"\fops_received\x18\x03 \x01(\x04R\vopsReceived\x12#\n" +
	"\rlookups_asked\x18\x04 \x01(\x04R\flookupsAsked\x12)\n" +
	"\x10lookups_answered\x18\x05 \x01(\x04R\x0flookupsAnswered\x12\x1d\n" +
	"\n" +
	"cache_hits\x18\x06 \x01(\x04R\tcacheHits\x12!\n" +
	"\fcache_misses\x18\a \x01(\x04R\vcacheMisses\x12%\n" +
	"\x0ecache_expiries\x18\b \x01(\x04R\rcacheExpiries\x12\x1a\n" +
	"\bhandoffs\x18\t \x01(\x04R\bhandoffs\x12\x1f\n" +
	"\vhandoff_ops\x18\n" +
	" \x01(\x04R\n" +
	"handoffOps\x12#\n" +
	"\rstream_errors\x18\v \x01(\x04R\fstreamErrors\x12'\n" +
	"\x0fstream_replaces\x18\f \x01(\x04R\x0estreamReplaces\"\x9f\x03\n" +
	"\x04Tier\x12\x12\n" +
	"\x04kind\x18\x01 \x01(\tR\x04kind\x12\x12\n" +
	"\x04path\x18\x02 \x01(\tR\x04path\x12\x1d\n" +
	"\n" +
	"size_bytes\x18\x03 \x01(\x04R\tsizeBytes\x12\x16\n" +
	"\x06blocks\x18\x04 \x01(\x04R\x06blocks\x12\x14\n" +
	"\x05bytes\x18\x05 \x01(\x04R\x05bytes\x12\x1f\n" +
	"\vblock_bytes\x18\x06 \x01(\x04R\n" +
	"blockBytes\x12\x1a\n" +
	"\boffloads\x18\a \x01(\x04R\boffloads\x12\x1a\n" +
	"\brestores\x18\b \x01(\x04R\brestores\x12+\n" +
	"\x11checksum_failures\x18\t \x01(\x04R\x10checksumFailures\x12\x1c\n" +
	"\tevictions\x18\n" +
	" \x01(\x04R\tevictions\x12*\n" +
	"\x11read_ahead_blocks\x18\v \x01(\x04R\x0freadAheadBlocks\x12&\n" +
	"\x0fread_ahead_hits\x18\f \x01(\x04R\rreadAheadHits\x12*\n" +
	"\x11read_ahead_unused\x18\r \x01(\x04R\x0freadAheadUnused\"\xc4\x01\n" +
	"\aSession\x12\x0e\n" +
	"\x02id\x18\x01 \x01(\x04R\x02id\x12\x16\n" +
	"\x06engine\x18\x02 \x01(\tR\x06engine\x12\x10\n" +
	"\x03pid\x18\x03 \x01(\x05R\x03pid\x12\x10\n" +
	"\x03uid\x18\x04 \x01(\rR\x03uid\x12$\n" +
	"\x0eopened_unix_ms\x18\x05 \x01(\x03R\fopenedUnixMs\x12\x1d\n" +
	"\n" +
	"block_sets\x18\x06 \x03(\x04R\tblockSets\x12\x12\n" +
	"\x04refs\x18\a \x01(\rR\x04refs\x12\x14\n" +
	"\x05slots\x18\b \x01(\rR\x05slots\"\x94\x04\n" +
	"\x06Member\x12\x12\n" +
	"\x04node\x18\x01 \x01(\tR\x04node\x12\x1f\n" +
	"\vgossip_addr\x18\x02 \x01(\tR\n" +
	"gossipAddr\x12\x1b\n" +
	"\tpeer_addr\x18\x03 \x01(\tR\bpeerAddr\x12\x14\n" +
	"\x05state\x18\x04 \x01(\tR\x05state\x12\x16\n" +
	"\x06blocks\x18\x05 \x01(\x04R\x06blocks\x12\"\n" +
	"\rsince_unix_ms\x18\x06 \x01(\x03R\vsinceUnixMs\x12\x12\n" +
	"\x04rdma\x18\a \x01(\bR\x04rdma\x12\x12\n" +
	"\x04gpus\x18\b \x01(\rR\x04gpus\x12$\n" +
	"\x0egpu_pool_bytes\x18\t \x01(\x04R\fgpuPoolBytes\x12\x19\n" +
	"\bgpu_nics\x18\n" +
	" \x01(\rR\agpuNics\x12\x1b\n" +
	"\tgpu_model\x18\v \x01(\tR\bgpuModel\x12%\n" +
	"\x0epeer_reachable\x18\f \x01(\bR\rpeerReachable\x12-\n" +
	"\x12peer_authenticated\x18\r \x01(\bR\x11peerAuthenticated\x12\x1d\n" +
	"\n" +
	"peer_error\x18\x0e \x01(\tR\tpeerError\x12\x1d\n" +
	"\n" +
	"index_mode\x18\x0f \x01(\tR\tindexMode\x12%\n" +
	"\x0eindex_replicas\x18\x10 \x01(\rR\rindexReplicas\x12%\n" +
	"\x0eindex_mismatch\x18\x11 \x01(\bR\rindexMismatch\"\xe1\x01\n" +
	"\x04Pool\x12\x12\n" +
	"\x04kind\x18\x01 \x01(\tR\x04kind\x12\x1d\n" +
	"\n" +
	"size_bytes\x18\x02 \x01(\x04R\tsizeBytes\x12!\n" +
	"\fcarved_bytes\x18\x03 \x01(\x04R\vcarvedBytes\x12\x1d\n" +
	"\n" +
	"block_sets\x18\x04 \x01(\rR\tblockSets\x12\x16\n" +
	"\x06device\x18\x05 \x01(\x05R\x06device\x12+\n" +
	"\x11rdma_registration\x18\x06 \x01(\tR\x10rdmaRegistration\x12\x1f\n" +
	"\vrdma_device\x18\a \x01(\tR\n" +
	"rdmaDevice\"\xf2\x02\n" +
	"\bBlockSet\x12\x0e\n" +
	"\x02id\x18\x01 \x01(\x04R\x02id\x12\x16\n" +
	"\x06engine\x18\x02 \x01(\tR\x06engine\x12#\n" +
	"\rlayout_digest\x18\x03 \x01(\tR\flayoutDigest\x12\x17\n" +
	"\atp_size\x18\x04 \x01(\rR\x06tpSize\x12\x1b\n" +
	"\tpage_size\x18\x05 \x01(\rR\bpageSize\x12\x14\n" +
	"\x05slots\x18\x06 \x01(\rR\x05slots\x12\x12\n" +
	"\x04free\x18\a \x01(\rR\x04free\x12\x1e\n" +
	"\n" +
	"registered\x18\b \x01(\rR\n" +
	"registered\x12\x16\n" +
	"\x06leased\x18\t \x01(\rR\x06leased\x12\x1a\n" +
	"\bsessions\x18\n" +
	" \x01(\rR\bsessions\x12+\n" +
	"\x12idle_since_unix_ms\x18\v \x01(\x03R\x0fidleSinceUnixMs\x12\x1a\n" +
	"\borphaned\x18\f \x01(\bR\borphaned\x12\x1c\n" +
	"\tadoptions\x18\r \x01(\rR\tadoptions*\xcf\x01\n" +
	"\aOutcome\x12\x17\n" +
	"\x13OUTCOME_UNSPECIFIED\x10\x00\x12\x16\n" +
	"\x12OUTCOME_REGISTERED\x10\x01\x12\x15\n" +
	"\x11OUTCOME_DUPLICATE\x10\x02\x12\x13\n" +
	"\x0fOUTCOME_REFUSED\x10\x03\x12\x14\n" +
	"\x10OUTCOME_ACQUIRED\x10\x04\x12\x11\n" +
	"\rOUTCOME_LOCAL\x10\x05\x12\x14\n" +
	"\x10OUTCOME_IMPORTED\x10\x06\x12\x13\n" +
	"\x0fOUTCOME_MISSING\x10\a\x12\x13\n" +
	"\x0fOUTCOME_SKIPPED\x10\b2\x98\b\n" +
	"\x06Engine\x12U\n" +
	"\bRegister\x12#.kvfabric.fabric.v1.RegisterRequest\x1a$.kvfabric.fabric.v1.RegisterResponse\x12U\n" +
	"\bAllocate\x12#.kvfabric.fabric.v1.AllocateRequest\x1a$.kvfabric.fabric.v1.AllocateResponse\x12I\n" +
	"\x04Free\x12\x1f.kvfabric.fabric.v1.FreeRequest\x1a .kvfabric.fabric.v1.FreeResponse\x12g\n" +
	"\x0eRegisterBlocks\x12).kvfabric.fabric.v1.RegisterBlocksRequest\x1a*.kvfabric.fabric.v1.RegisterBlocksResponse\x12R\n" +
	"\aAcquire\x12\".kvfabric.fabric.v1.AcquireRequest\x1a#.kvfabric.fabric.v1.AcquireResponse\x12R\n" +
	"\aRelease\x12\".kvfabric.fabric.v1.ReleaseRequest\x1a#.kvfabric.fabric.v1.ReleaseResponse\x12O\n" +
	"\x06Lookup\x12!.kvfabric.fabric.v1.LookupRequest\x1a\".kvfabric.fabric.v1.LookupResponse\x12O\n" +
	"\x06Import\x12!.kvfabric.fabric.v1.ImportRequest\x1a\".kvfabric.fabric.v1.ImportResponse\x12O\n" +
	"\x06Status\x12!.kvfabric.fabric.v1.StatusRequest\x1a\".kvfabric.fabric.v1.StatusResponse\x12W\n" +
	"\vOpenSession\x12\".kvfabric.fabric.v1.SessionRequest\x1a .kvfabric.fabric.v1.SessionEvent(\x010\x01\x12a\n" +
	"\fDropBlockSet\x12'.kvfabric.fabric.v1.DropBlockSetRequest\x1a(.kvfabric.fabric.v1.DropBlockSetResponse\x12U\n" +
	"\bPrefetch\x12#.kvfabric.fabric.v1.PrefetchRequest\x1a$.kvfabric.fabric.v1.PrefetchResponseB.Z,github.com/kvfabric/kvfabric/fabric/fabricpbb\x06proto3"

var (
	file_fabric_fabricpb_engine_proto_rawDescOnce sync.Once
	file_fabric_fabricpb_engine_proto_rawDescData []byte
)

func file_fabric_fabricpb_engine_proto_rawDescGZIP() []byte {
	file_fabric_fabricpb_engine_proto_rawDescOnce.Do(func() {
		file_fabric_fabricpb_engine_proto_rawDescData = protoimpl.X.CompressGZIP(unsafe.Slice(unsafe.StringData(file_fabric_fabricpb_engine_proto_rawDesc), len(file_fabric_fabricpb_engine_proto_rawDesc)))
	})
	return file_fabric_fabricpb_engine_proto_rawDescData
}

var file_fabric_fabricpb_engine_proto_enumTypes = make([]protoimpl.EnumInfo, 1)
var file_fabric_fabricpb_engine_proto_msgTypes = make([]protoimpl.MessageInfo, 38)
var file_fabric_fabricpb_engine_proto_goTypes = []any{
	(Outcome)(0),                   // 0: kvfabric.fabric.v1.Outcome
	(*PrefetchRequest)(nil),        // 1: kvfabric.fabric.v1.PrefetchRequest
	(*PrefetchResponse)(nil),       // 2: kvfabric.fabric.v1.PrefetchResponse
	(*RegisterRequest)(nil),        // 3: kvfabric.fabric.v1.RegisterRequest
	(*RegisterResponse)(nil),       // 4: kvfabric.fabric.v1.RegisterResponse
	(*Memory)(nil),                 // 5: kvfabric.fabric.v1.Memory
	(*RankLayout)(nil),             // 6: kvfabric.fabric.v1.RankLayout
	(*AllocateRequest)(nil),        // 7: kvfabric.fabric.v1.AllocateRequest
	(*AllocateResponse)(nil),       // 8: kvfabric.fabric.v1.AllocateResponse
	(*FreeRequest)(nil),            // 9: kvfabric.fabric.v1.FreeRequest
	(*FreeResponse)(nil),           // 10: kvfabric.fabric.v1.FreeResponse
	(*Tokens)(nil),                 // 11: kvfabric.fabric.v1.Tokens
	(*RegisterBlocksRequest)(nil),  // 12: kvfabric.fabric.v1.RegisterBlocksRequest
	(*RegisterBlocksResponse)(nil), // 13: kvfabric.fabric.v1.RegisterBlocksResponse
	(*BlockRef)(nil),               // 14: kvfabric.fabric.v1.BlockRef
	(*AcquireRequest)(nil),         // 15: kvfabric.fabric.v1.AcquireRequest
	(*AcquireResponse)(nil),        // 16: kvfabric.fabric.v1.AcquireResponse
	(*ReleaseRequest)(nil),         // 17: kvfabric.fabric.v1.ReleaseRequest
	(*ReleaseResponse)(nil),        // 18: kvfabric.fabric.v1.ReleaseResponse
	(*LookupRequest)(nil),          // 19: kvfabric.fabric.v1.LookupRequest
	(*LookupResponse)(nil),         // 20: kvfabric.fabric.v1.LookupResponse
	(*Overlap)(nil),                // 21: kvfabric.fabric.v1.Overlap
	(*ImportRequest)(nil),          // 22: kvfabric.fabric.v1.ImportRequest
	(*ImportResponse)(nil),         // 23: kvfabric.fabric.v1.ImportResponse
	(*Fetch)(nil),                  // 24: kvfabric.fabric.v1.Fetch
	(*BlockResult)(nil),            // 25: kvfabric.fabric.v1.BlockResult
	(*SessionRequest)(nil),         // 26: kvfabric.fabric.v1.SessionRequest
	(*SessionEvent)(nil),           // 27: kvfabric.fabric.v1.SessionEvent
	(*DropBlockSetRequest)(nil),    // 28: kvfabric.fabric.v1.DropBlockSetRequest
	(*DropBlockSetResponse)(nil),   // 29: kvfabric.fabric.v1.DropBlockSetResponse
	(*StatusRequest)(nil),          // 30: kvfabric.fabric.v1.StatusRequest
	(*StatusResponse)(nil),         // 31: kvfabric.fabric.v1.StatusResponse
	(*OwnedIndex)(nil),             // 32: kvfabric.fabric.v1.OwnedIndex
	(*Tier)(nil),                   // 33: kvfabric.fabric.v1.Tier
	(*Session)(nil),                // 34: kvfabric.fabric.v1.Session
	(*Member)(nil),                 // 35: kvfabric.fabric.v1.Member
	(*Pool)(nil),                   // 36: kvfabric.fabric.v1.Pool
	(*BlockSet)(nil),               // 37: kvfabric.fabric.v1.BlockSet
	nil,                            // 38: kvfabric.fabric.v1.StatusResponse.LaneFallbacksEntry
	(*layoutpb.ModelConfig)(nil),   // 39: kvfabric.layout.v1.ModelConfig
	(layoutpb.KVOrder)(0),          // 40: kvfabric.layout.v1.KVOrder
	(layoutpb.Arrangement)(0),      // 41: kvfabric.layout.v1.Arrangement
	(*layoutpb.Layout)(nil),        // 42: kvfabric.layout.v1.Layout
}
var file_fabric_fabricpb_engine_proto_depIdxs = []int32{
	11, // 0: kvfabric.fabric.v1.PrefetchRequest.tokens:type_name -> kvfabric.fabric.v1.Tokens
	39, // 1: kvfabric.fabric.v1.RegisterRequest.model:type_name -> kvfabric.layout.v1.ModelConfig
	40, // 2: kvfabric.fabric.v1.RegisterRequest.kv_order:type_name -> kvfabric.layout.v1.KVOrder
	41, // 3: kvfabric.fabric.v1.RegisterRequest.arrangement:type_name -> kvfabric.layout.v1.Arrangement
	42, // 4: kvfabric.fabric.v1.RegisterResponse.layout:type_name -> kvfabric.layout.v1.Layout
	5,  // 5: kvfabric.fabric.v1.RegisterResponse.memory:type_name -> kvfabric.fabric.v1.Memory
	6,  // 6: kvfabric.fabric.v1.RegisterResponse.ranks:type_name -> kvfabric.fabric.v1.RankLayout
	11, // 7: kvfabric.fabric.v1.RegisterBlocksRequest.tokens:type_name -> kvfabric.fabric.v1.Tokens
	14, // 8: kvfabric.fabric.v1.RegisterBlocksResponse.blocks:type_name -> kvfabric.fabric.v1.BlockRef
	25, // 9: kvfabric.fabric.v1.RegisterBlocksResponse.results:type_name -> kvfabric.fabric.v1.BlockResult
	14, // 10: kvfabric.fabric.v1.AcquireResponse.blocks:type_name -> kvfabric.fabric.v1.BlockRef
	25, // 11: kvfabric.fabric.v1.AcquireResponse.results:type_name -> kvfabric.fabric.v1.BlockResult
	11, // 12: kvfabric.fabric.v1.LookupRequest.tokens:type_name -> kvfabric.fabric.v1.Tokens
	21, // 13: kvfabric.fabric.v1.LookupResponse.overlaps:type_name -> kvfabric.fabric.v1.Overlap
	11, // 14: kvfabric.fabric.v1.ImportRequest.tokens:type_name -> kvfabric.fabric.v1.Tokens
	14, // 15: kvfabric.fabric.v1.ImportResponse.blocks:type_name -> kvfabric.fabric.v1.BlockRef
	24, // 16: kvfabric.fabric.v1.ImportResponse.fetches:type_name -> kvfabric.fabric.v1.Fetch
	25, // 17: kvfabric.fabric.v1.ImportResponse.results:type_name -> kvfabric.fabric.v1.BlockResult
	0,  // 18: kvfabric.fabric.v1.BlockResult.outcome:type_name -> kvfabric.fabric.v1.Outcome
	35, // 19: kvfabric.fabric.v1.StatusResponse.members:type_name -> kvfabric.fabric.v1.Member
	37, // 20: kvfabric.fabric.v1.StatusResponse.block_sets:type_name -> kvfabric.fabric.v1.BlockSet
	36, // 21: kvfabric.fabric.v1.StatusResponse.pools:type_name -> kvfabric.fabric.v1.Pool
	34, // 22: kvfabric.fabric.v1.StatusResponse.sessions:type_name -> kvfabric.fabric.v1.Session
	38, // 23: kvfabric.fabric.v1.StatusResponse.lane_fallbacks:type_name -> kvfabric.fabric.v1.StatusResponse.LaneFallbacksEntry
	33, // 24: kvfabric.fabric.v1.StatusResponse.tiers:type_name -> kvfabric.fabric.v1.Tier
	32, // 25: kvfabric.fabric.v1.StatusResponse.owned_index:type_name -> kvfabric.fabric.v1.OwnedIndex
	3,  // 26: kvfabric.fabric.v1.Engine.Register:input_type -> kvfabric.fabric.v1.RegisterRequest
	7,  // 27: kvfabric.fabric.v1.Engine.Allocate:input_type -> kvfabric.fabric.v1.AllocateRequest
	9,  // 28: kvfabric.fabric.v1.Engine.Free:input_type -> kvfabric.fabric.v1.FreeRequest
	12, // 29: kvfabric.fabric.v1.Engine.RegisterBlocks:input_type -> kvfabric.fabric.v1.RegisterBlocksRequest
	15, // 30: kvfabric.fabric.v1.Engine.Acquire:input_type -> kvfabric.fabric.v1.AcquireRequest
	17, // 31: kvfabric.fabric.v1.Engine.Release:input_type -> kvfabric.fabric.v1.ReleaseRequest
	19, // 32: kvfabric.fabric.v1.Engine.Lookup:input_type -> kvfabric.fabric.v1.LookupRequest
	22, // 33: kvfabric.fabric.v1.Engine.Import:input_type -> kvfabric.fabric.v1.ImportRequest
	30, // 34: kvfabric.fabric.v1.Engine.Status:input_type -> kvfabric.fabric.v1.StatusRequest
	26, // 35: kvfabric.fabric.v1.Engine.OpenSession:input_type -> kvfabric.fabric.v1.SessionRequest
	28, // 36: kvfabric.fabric.v1.Engine.DropBlockSet:input_type -> kvfabric.fabric.v1.DropBlockSetRequest
	1,  // 37: kvfabric.fabric.v1.Engine.Prefetch:input_type -> kvfabric.fabric.v1.PrefetchRequest
	4,  // 38: kvfabric.fabric.v1.Engine.Register:output_type -> kvfabric.fabric.v1.RegisterResponse
	8,  // 39: kvfabric.fabric.v1.Engine.Allocate:output_type -> kvfabric.fabric.v1.AllocateResponse
	10, // 40: kvfabric.fabric.v1.Engine.Free:output_type -> kvfabric.fabric.v1.FreeResponse
	13, // 41: kvfabric.fabric.v1.Engine.RegisterBlocks:output_type -> kvfabric.fabric.v1.RegisterBlocksResponse
	16, // 42: kvfabric.fabric.v1.Engine.Acquire:output_type -> kvfabric.fabric.v1.AcquireResponse
	18, // 43: kvfabric.fabric.v1.Engine.Release:output_type -> kvfabric.fabric.v1.ReleaseResponse
	20, // 44: kvfabric.fabric.v1.Engine.Lookup:output_type -> kvfabric.fabric.v1.LookupResponse
	23, // 45: kvfabric.fabric.v1.Engine.Import:output_type -> kvfabric.fabric.v1.ImportResponse
	31, // 46: kvfabric.fabric.v1.Engine.Status:output_type -> kvfabric.fabric.v1.StatusResponse
	27, // 47: kvfabric.fabric.v1.Engine.OpenSession:output_type -> kvfabric.fabric.v1.SessionEvent
	29, // 48: kvfabric.fabric.v1.Engine.DropBlockSet:output_type -> kvfabric.fabric.v1.DropBlockSetResponse
	2,  // 49: kvfabric.fabric.v1.Engine.Prefetch:output_type -> kvfabric.fabric.v1.PrefetchResponse
	38, // [38:50] is the sub-list for method output_type
	26, // [26:38] is the sub-list for method input_type
	26, // [26:26] is the sub-list for extension type_name
	26, // [26:26] is the sub-list for extension extendee
	0,  // [0:26] is the sub-list for field type_name
}

func init() { file_fabric_fabricpb_engine_proto_init() }
func file_fabric_fabricpb_engine_proto_init() {
	if File_fabric_fabricpb_engine_proto != nil {
		return
	}
	type x struct{}
	out := protoimpl.TypeBuilder{
		File: protoimpl.DescBuilder{
			GoPackagePath: reflect.TypeOf(x{}).PkgPath(),
			RawDescriptor: unsafe.Slice(unsafe.StringData(file_fabric_fabricpb_engine_proto_rawDesc), len(file_fabric_fabricpb_engine_proto_rawDesc)),
			NumEnums:      1,
			NumMessages:   38,
			NumExtensions: 0,
			NumServices:   1,
		},
		GoTypes:           file_fabric_fabricpb_engine_proto_goTypes,
		DependencyIndexes: file_fabric_fabricpb_engine_proto_depIdxs,
		EnumInfos:         file_fabric_fabricpb_engine_proto_enumTypes,
		MessageInfos:      file_fabric_fabricpb_engine_proto_msgTypes,
	}.Build()
	File_fabric_fabricpb_engine_proto = out.File
	file_fabric_fabricpb_engine_proto_goTypes = nil
	file_fabric_fabricpb_engine_proto_depIdxs = nil
}
