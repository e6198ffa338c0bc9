from kvfabric._pb.layout.layoutpb import layout_pb2 as _layout_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
OUTCOME_ACQUIRED: Outcome
OUTCOME_DUPLICATE: Outcome
OUTCOME_IMPORTED: Outcome
OUTCOME_LOCAL: Outcome
OUTCOME_MISSING: Outcome
OUTCOME_REFUSED: Outcome
OUTCOME_REGISTERED: Outcome
OUTCOME_SKIPPED: Outcome
OUTCOME_UNSPECIFIED: Outcome

class AcquireRequest(_message.Message):
    __slots__ = ["block_set", "hashes"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    hashes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_set: _Optional[int] = ..., hashes: _Optional[_Iterable[int]] = ...) -> None: ...

class AcquireResponse(_message.Message):
    __slots__ = ["blocks", "results"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockRef]
    results: _containers.RepeatedCompositeFieldContainer[BlockResult]
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockRef, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[BlockResult, _Mapping]]] = ...) -> None: ...

class AllocateRequest(_message.Message):
    __slots__ = ["block_set", "count"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    count: int
    def __init__(self, block_set: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class AllocateResponse(_message.Message):
    __slots__ = ["slots"]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, slots: _Optional[_Iterable[int]] = ...) -> None: ...

class BlockRef(_message.Message):
    __slots__ = ["duplicate", "hash", "slot"]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    duplicate: bool
    hash: int
    slot: int
    def __init__(self, hash: _Optional[int] = ..., slot: _Optional[int] = ..., duplicate: bool = ...) -> None: ...

class BlockResult(_message.Message):
    __slots__ = ["code", "hash", "outcome", "reason", "request_slot", "slot"]
    CODE_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    REQUEST_SLOT_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    code: int
    hash: int
    outcome: Outcome
    reason: str
    request_slot: int
    slot: int
    def __init__(self, hash: _Optional[int] = ..., slot: _Optional[int] = ..., outcome: _Optional[_Union[Outcome, str]] = ..., reason: _Optional[str] = ..., code: _Optional[int] = ..., request_slot: _Optional[int] = ...) -> None: ...

class BlockSet(_message.Message):
    __slots__ = ["adoptions", "engine", "free", "id", "idle_since_unix_ms", "layout_digest", "leased", "orphaned", "page_size", "registered", "sessions", "slots", "tp_size"]
    ADOPTIONS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    IDLE_SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_DIGEST_FIELD_NUMBER: _ClassVar[int]
    LEASED_FIELD_NUMBER: _ClassVar[int]
    ORPHANED_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    adoptions: int
    engine: str
    free: int
    id: int
    idle_since_unix_ms: int
    layout_digest: str
    leased: int
    orphaned: bool
    page_size: int
    registered: int
    sessions: int
    slots: int
    tp_size: int
    def __init__(self, id: _Optional[int] = ..., engine: _Optional[str] = ..., layout_digest: _Optional[str] = ..., tp_size: _Optional[int] = ..., page_size: _Optional[int] = ..., slots: _Optional[int] = ..., free: _Optional[int] = ..., registered: _Optional[int] = ..., leased: _Optional[int] = ..., sessions: _Optional[int] = ..., idle_since_unix_ms: _Optional[int] = ..., orphaned: bool = ..., adoptions: _Optional[int] = ...) -> None: ...

class DropBlockSetRequest(_message.Message):
    __slots__ = ["block_set"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    def __init__(self, block_set: _Optional[int] = ...) -> None: ...

class DropBlockSetResponse(_message.Message):
    __slots__ = ["freed", "released"]
    FREED_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    freed: int
    released: int
    def __init__(self, released: _Optional[int] = ..., freed: _Optional[int] = ...) -> None: ...

class Fetch(_message.Message):
    __slots__ = ["blocks", "bytes", "micros", "node", "transport"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    MICROS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    bytes: int
    micros: int
    node: str
    transport: str
    def __init__(self, node: _Optional[str] = ..., transport: _Optional[str] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ..., micros: _Optional[int] = ...) -> None: ...

class FreeRequest(_message.Message):
    __slots__ = ["block_set", "slots"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_set: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ...) -> None: ...

class FreeResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ImportRequest(_message.Message):
    __slots__ = ["block_set", "hashes", "timeout_ms", "tokens"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    hashes: _containers.RepeatedScalarFieldContainer[int]
    timeout_ms: int
    tokens: Tokens
    def __init__(self, block_set: _Optional[int] = ..., hashes: _Optional[_Iterable[int]] = ..., timeout_ms: _Optional[int] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ...) -> None: ...

class ImportResponse(_message.Message):
    __slots__ = ["blocks", "error", "fetches", "results"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    FETCHES_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockRef]
    error: str
    fetches: _containers.RepeatedCompositeFieldContainer[Fetch]
    results: _containers.RepeatedCompositeFieldContainer[BlockResult]
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockRef, _Mapping]]] = ..., error: _Optional[str] = ..., fetches: _Optional[_Iterable[_Union[Fetch, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[BlockResult, _Mapping]]] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ["block_set", "block_size", "hashes", "no_restore", "tokens"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    NO_RESTORE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    block_size: int
    hashes: _containers.RepeatedScalarFieldContainer[int]
    no_restore: bool
    tokens: Tokens
    def __init__(self, hashes: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ..., block_size: _Optional[int] = ..., block_set: _Optional[int] = ..., no_restore: bool = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ["hashes", "local_tiers", "overlaps"]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    LOCAL_TIERS_FIELD_NUMBER: _ClassVar[int]
    OVERLAPS_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedScalarFieldContainer[int]
    local_tiers: _containers.RepeatedScalarFieldContainer[str]
    overlaps: _containers.RepeatedCompositeFieldContainer[Overlap]
    def __init__(self, hashes: _Optional[_Iterable[int]] = ..., overlaps: _Optional[_Iterable[_Union[Overlap, _Mapping]]] = ..., local_tiers: _Optional[_Iterable[str]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ["blocks", "gossip_addr", "gpu_model", "gpu_nics", "gpu_pool_bytes", "gpus", "index_mismatch", "index_mode", "index_replicas", "node", "peer_addr", "peer_authenticated", "peer_error", "peer_reachable", "rdma", "since_unix_ms", "state"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_ADDR_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_NICS_FIELD_NUMBER: _ClassVar[int]
    GPU_POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEX_MISMATCH_FIELD_NUMBER: _ClassVar[int]
    INDEX_MODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    PEER_AUTHENTICATED_FIELD_NUMBER: _ClassVar[int]
    PEER_ERROR_FIELD_NUMBER: _ClassVar[int]
    PEER_REACHABLE_FIELD_NUMBER: _ClassVar[int]
    RDMA_FIELD_NUMBER: _ClassVar[int]
    SINCE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    gossip_addr: str
    gpu_model: str
    gpu_nics: int
    gpu_pool_bytes: int
    gpus: int
    index_mismatch: bool
    index_mode: str
    index_replicas: int
    node: str
    peer_addr: str
    peer_authenticated: bool
    peer_error: str
    peer_reachable: bool
    rdma: bool
    since_unix_ms: int
    state: str
    def __init__(self, node: _Optional[str] = ..., gossip_addr: _Optional[str] = ..., peer_addr: _Optional[str] = ..., state: _Optional[str] = ..., blocks: _Optional[int] = ..., since_unix_ms: _Optional[int] = ..., rdma: bool = ..., gpus: _Optional[int] = ..., gpu_pool_bytes: _Optional[int] = ..., gpu_nics: _Optional[int] = ..., gpu_model: _Optional[str] = ..., peer_reachable: bool = ..., peer_authenticated: bool = ..., peer_error: _Optional[str] = ..., index_mode: _Optional[str] = ..., index_replicas: _Optional[int] = ..., index_mismatch: bool = ...) -> None: ...

class Memory(_message.Message):
    __slots__ = ["cuda_device", "cuda_ipc_handle", "fd_socket", "file", "file_size", "offset", "path", "pci_bus_id", "size", "token"]
    CUDA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    FD_SOCKET_FIELD_NUMBER: _ClassVar[int]
    FILE_FIELD_NUMBER: _ClassVar[int]
    FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    cuda_device: int
    cuda_ipc_handle: bytes
    fd_socket: str
    file: str
    file_size: int
    offset: int
    path: str
    pci_bus_id: str
    size: int
    token: str
    def __init__(self, path: _Optional[str] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., token: _Optional[str] = ..., fd_socket: _Optional[str] = ..., file: _Optional[str] = ..., file_size: _Optional[int] = ..., cuda_ipc_handle: _Optional[bytes] = ..., cuda_device: _Optional[int] = ..., pci_bus_id: _Optional[str] = ...) -> None: ...

class Overlap(_message.Message):
    __slots__ = ["blocks", "estimate", "fetch_bytes", "fetch_estimate_us", "node", "score", "transport"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATE_FIELD_NUMBER: _ClassVar[int]
    FETCH_BYTES_FIELD_NUMBER: _ClassVar[int]
    FETCH_ESTIMATE_US_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    TRANSPORT_FIELD_NUMBER: _ClassVar[int]
    blocks: int
    estimate: str
    fetch_bytes: int
    fetch_estimate_us: int
    node: str
    score: float
    transport: str
    def __init__(self, node: _Optional[str] = ..., blocks: _Optional[int] = ..., score: _Optional[float] = ..., fetch_estimate_us: _Optional[int] = ..., estimate: _Optional[str] = ..., fetch_bytes: _Optional[int] = ..., transport: _Optional[str] = ...) -> None: ...

class OwnedIndex(_message.Message):
    __slots__ = ["cache_expiries", "cache_hits", "cache_misses", "handoff_ops", "handoffs", "lookups_answered", "lookups_asked", "op_calls_sent", "ops_received", "ops_sent", "stream_errors", "stream_replaces"]
    CACHE_EXPIRIES_FIELD_NUMBER: _ClassVar[int]
    CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    CACHE_MISSES_FIELD_NUMBER: _ClassVar[int]
    HANDOFFS_FIELD_NUMBER: _ClassVar[int]
    HANDOFF_OPS_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_ANSWERED_FIELD_NUMBER: _ClassVar[int]
    LOOKUPS_ASKED_FIELD_NUMBER: _ClassVar[int]
    OPS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    OPS_SENT_FIELD_NUMBER: _ClassVar[int]
    OP_CALLS_SENT_FIELD_NUMBER: _ClassVar[int]
    STREAM_ERRORS_FIELD_NUMBER: _ClassVar[int]
    STREAM_REPLACES_FIELD_NUMBER: _ClassVar[int]
    cache_expiries: int
    cache_hits: int
    cache_misses: int
    handoff_ops: int
    handoffs: int
    lookups_answered: int
    lookups_asked: int
    op_calls_sent: int
    ops_received: int
    ops_sent: int
    stream_errors: int
    stream_replaces: int
    def __init__(self, ops_sent: _Optional[int] = ..., op_calls_sent: _Optional[int] = ..., ops_received: _Optional[int] = ..., lookups_asked: _Optional[int] = ..., lookups_answered: _Optional[int] = ..., cache_hits: _Optional[int] = ..., cache_misses: _Optional[int] = ..., cache_expiries: _Optional[int] = ..., handoffs: _Optional[int] = ..., handoff_ops: _Optional[int] = ..., stream_errors: _Optional[int] = ..., stream_replaces: _Optional[int] = ...) -> None: ...

class Pool(_message.Message):
    __slots__ = ["block_sets", "carved_bytes", "device", "kind", "rdma_device", "rdma_registration", "size_bytes"]
    BLOCK_SETS_FIELD_NUMBER: _ClassVar[int]
    CARVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    RDMA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    RDMA_REGISTRATION_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    block_sets: int
    carved_bytes: int
    device: int
    kind: str
    rdma_device: str
    rdma_registration: str
    size_bytes: int
    def __init__(self, kind: _Optional[str] = ..., size_bytes: _Optional[int] = ..., carved_bytes: _Optional[int] = ..., block_sets: _Optional[int] = ..., device: _Optional[int] = ..., rdma_registration: _Optional[str] = ..., rdma_device: _Optional[str] = ...) -> None: ...

class PrefetchRequest(_message.Message):
    __slots__ = ["block_set", "hashes", "tokens"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    hashes: _containers.RepeatedScalarFieldContainer[int]
    tokens: Tokens
    def __init__(self, block_set: _Optional[int] = ..., hashes: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ...) -> None: ...

class PrefetchResponse(_message.Message):
    __slots__ = ["error", "imported", "in_memory", "restored"]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    IMPORTED_FIELD_NUMBER: _ClassVar[int]
    IN_MEMORY_FIELD_NUMBER: _ClassVar[int]
    RESTORED_FIELD_NUMBER: _ClassVar[int]
    error: str
    imported: int
    in_memory: int
    restored: int
    def __init__(self, in_memory: _Optional[int] = ..., restored: _Optional[int] = ..., error: _Optional[str] = ..., imported: _Optional[int] = ...) -> None: ...

class RankLayout(_message.Message):
    __slots__ = ["block_stride", "chunk_bytes", "chunk_shape", "element_bytes", "head_ids", "kv_stride", "layer_stride", "offset", "planes", "replicas"]
    BLOCK_STRIDE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_SHAPE_FIELD_NUMBER: _ClassVar[int]
    ELEMENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEAD_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_STRIDE_FIELD_NUMBER: _ClassVar[int]
    LAYER_STRIDE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    PLANES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    block_stride: int
    chunk_bytes: int
    chunk_shape: _containers.RepeatedScalarFieldContainer[int]
    element_bytes: int
    head_ids: _containers.RepeatedScalarFieldContainer[int]
    kv_stride: int
    layer_stride: int
    offset: int
    planes: int
    replicas: int
    def __init__(self, offset: _Optional[int] = ..., block_stride: _Optional[int] = ..., layer_stride: _Optional[int] = ..., kv_stride: _Optional[int] = ..., chunk_shape: _Optional[_Iterable[int]] = ..., head_ids: _Optional[_Iterable[int]] = ..., replicas: _Optional[int] = ..., planes: _Optional[int] = ..., element_bytes: _Optional[int] = ..., chunk_bytes: _Optional[int] = ...) -> None: ...

class RegisterBlocksRequest(_message.Message):
    __slots__ = ["block_set", "hashes", "parent", "parent_set", "slots", "tokens"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    PARENT_SET_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    hashes: _containers.RepeatedScalarFieldContainer[int]
    parent: int
    parent_set: bool
    slots: _containers.RepeatedScalarFieldContainer[int]
    tokens: Tokens
    def __init__(self, block_set: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ..., hashes: _Optional[_Iterable[int]] = ..., tokens: _Optional[_Union[Tokens, _Mapping]] = ..., parent: _Optional[int] = ..., parent_set: bool = ...) -> None: ...

class RegisterBlocksResponse(_message.Message):
    __slots__ = ["blocks", "results"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[BlockRef]
    results: _containers.RepeatedCompositeFieldContainer[BlockResult]
    def __init__(self, blocks: _Optional[_Iterable[_Union[BlockRef, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[BlockResult, _Mapping]]] = ...) -> None: ...

class RegisterRequest(_message.Message):
    __slots__ = ["alignment", "arrangement", "devices", "engine", "join_block_set", "join_token", "kv_order", "model", "page_size", "slots", "tp_size"]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    ARRANGEMENT_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    JOIN_BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    KV_ORDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    alignment: int
    arrangement: _layout_pb2.Arrangement
    devices: _containers.RepeatedScalarFieldContainer[str]
    engine: str
    join_block_set: int
    join_token: str
    kv_order: _layout_pb2.KVOrder
    model: _layout_pb2.ModelConfig
    page_size: int
    slots: int
    tp_size: int
    def __init__(self, engine: _Optional[str] = ..., model: _Optional[_Union[_layout_pb2.ModelConfig, _Mapping]] = ..., tp_size: _Optional[int] = ..., page_size: _Optional[int] = ..., kv_order: _Optional[_Union[_layout_pb2.KVOrder, str]] = ..., arrangement: _Optional[_Union[_layout_pb2.Arrangement, str]] = ..., slots: _Optional[int] = ..., alignment: _Optional[int] = ..., devices: _Optional[_Iterable[str]] = ..., join_block_set: _Optional[int] = ..., join_token: _Optional[str] = ...) -> None: ...

class RegisterResponse(_message.Message):
    __slots__ = ["block_set", "join_token", "layout", "memory", "ranks", "retains"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    JOIN_TOKEN_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    RETAINS_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    join_token: str
    layout: _layout_pb2.Layout
    memory: _containers.RepeatedCompositeFieldContainer[Memory]
    ranks: _containers.RepeatedCompositeFieldContainer[RankLayout]
    retains: int
    def __init__(self, block_set: _Optional[int] = ..., layout: _Optional[_Union[_layout_pb2.Layout, _Mapping]] = ..., memory: _Optional[_Iterable[_Union[Memory, _Mapping]]] = ..., retains: _Optional[int] = ..., ranks: _Optional[_Iterable[_Union[RankLayout, _Mapping]]] = ..., join_token: _Optional[str] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ["block_set", "slots"]
    BLOCK_SET_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    block_set: int
    slots: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_set: _Optional[int] = ..., slots: _Optional[_Iterable[int]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class Session(_message.Message):
    __slots__ = ["block_sets", "engine", "id", "opened_unix_ms", "pid", "refs", "slots", "uid"]
    BLOCK_SETS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    OPENED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REFS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    UID_FIELD_NUMBER: _ClassVar[int]
    block_sets: _containers.RepeatedScalarFieldContainer[int]
    engine: str
    id: int
    opened_unix_ms: int
    pid: int
    refs: int
    slots: int
    uid: int
    def __init__(self, id: _Optional[int] = ..., engine: _Optional[str] = ..., pid: _Optional[int] = ..., uid: _Optional[int] = ..., opened_unix_ms: _Optional[int] = ..., block_sets: _Optional[_Iterable[int]] = ..., refs: _Optional[int] = ..., slots: _Optional[int] = ...) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ["keepalive_ms", "session"]
    KEEPALIVE_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    keepalive_ms: int
    session: int
    def __init__(self, session: _Optional[int] = ..., keepalive_ms: _Optional[int] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ["engine"]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    engine: str
    def __init__(self, engine: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class StatusResponse(_message.Message):
    __slots__ = ["block_sets", "gossip_bytes_in", "gossip_bytes_out", "gossip_range_repairs", "gossip_snapshot_repairs", "import_bytes", "imports", "imports_in_flight", "index_entries", "index_mismatched_members", "index_mode", "index_replicas", "joined", "lane", "lane_fallbacks", "leases", "members", "node", "owned_index", "pools", "sessions", "tiers", "version"]
    class LaneFallbacksEntry(_message.Message):
        __slots__ = ["key", "value"]
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    BLOCK_SETS_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_BYTES_IN_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_BYTES_OUT_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_RANGE_REPAIRS_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_SNAPSHOT_REPAIRS_FIELD_NUMBER: _ClassVar[int]
    IMPORTS_FIELD_NUMBER: _ClassVar[int]
    IMPORTS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    IMPORT_BYTES_FIELD_NUMBER: _ClassVar[int]
    INDEX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    INDEX_MISMATCHED_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    INDEX_MODE_FIELD_NUMBER: _ClassVar[int]
    INDEX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    LANE_FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OWNED_INDEX_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    block_sets: _containers.RepeatedCompositeFieldContainer[BlockSet]
    gossip_bytes_in: int
    gossip_bytes_out: int
    gossip_range_repairs: int
    gossip_snapshot_repairs: int
    import_bytes: int
    imports: int
    imports_in_flight: int
    index_entries: int
    index_mismatched_members: int
    index_mode: str
    index_replicas: int
    joined: bool
    lane: str
    lane_fallbacks: _containers.ScalarMap[str, int]
    leases: int
    members: _containers.RepeatedCompositeFieldContainer[Member]
    node: str
    owned_index: OwnedIndex
    pools: _containers.RepeatedCompositeFieldContainer[Pool]
    sessions: _containers.RepeatedCompositeFieldContainer[Session]
    tiers: _containers.RepeatedCompositeFieldContainer[Tier]
    version: str
    def __init__(self, node: _Optional[str] = ..., version: _Optional[str] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., block_sets: _Optional[_Iterable[_Union[BlockSet, _Mapping]]] = ..., index_entries: _Optional[int] = ..., imports: _Optional[int] = ..., import_bytes: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[Pool, _Mapping]]] = ..., imports_in_flight: _Optional[int] = ..., leases: _Optional[int] = ..., joined: bool = ..., sessions: _Optional[_Iterable[_Union[Session, _Mapping]]] = ..., lane: _Optional[str] = ..., lane_fallbacks: _Optional[_Mapping[str, int]] = ..., tiers: _Optional[_Iterable[_Union[Tier, _Mapping]]] = ..., index_mode: _Optional[str] = ..., index_replicas: _Optional[int] = ..., owned_index: _Optional[_Union[OwnedIndex, _Mapping]] = ..., index_mismatched_members: _Optional[int] = ..., gossip_bytes_in: _Optional[int] = ..., gossip_bytes_out: _Optional[int] = ..., gossip_range_repairs: _Optional[int] = ..., gossip_snapshot_repairs: _Optional[int] = ...) -> None: ...

class Tier(_message.Message):
    __slots__ = ["block_bytes", "blocks", "bytes", "checksum_failures", "evictions", "kind", "offloads", "path", "read_ahead_blocks", "read_ahead_hits", "read_ahead_unused", "restores", "size_bytes"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FAILURES_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OFFLOADS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    READ_AHEAD_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    READ_AHEAD_HITS_FIELD_NUMBER: _ClassVar[int]
    READ_AHEAD_UNUSED_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    block_bytes: int
    blocks: int
    bytes: int
    checksum_failures: int
    evictions: int
    kind: str
    offloads: int
    path: str
    read_ahead_blocks: int
    read_ahead_hits: int
    read_ahead_unused: int
    restores: int
    size_bytes: int
    def __init__(self, kind: _Optional[str] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., blocks: _Optional[int] = ..., bytes: _Optional[int] = ..., block_bytes: _Optional[int] = ..., offloads: _Optional[int] = ..., restores: _Optional[int] = ..., checksum_failures: _Optional[int] = ..., evictions: _Optional[int] = ..., read_ahead_blocks: _Optional[int] = ..., read_ahead_hits: _Optional[int] = ..., read_ahead_unused: _Optional[int] = ...) -> None: ...

class Tokens(_message.Message):
    __slots__ = ["ids", "lora", "salt"]
    IDS_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    lora: str
    salt: str
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., salt: _Optional[str] = ..., lora: _Optional[str] = ...) -> None: ...

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
