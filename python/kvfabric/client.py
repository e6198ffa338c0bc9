"""The engine client: a gRPC connection to the local agent's unix socket.

    with kvfabric.Client("/var/lib/kvfabric/engine.sock") as c:
        bs = c.register(kvfabric.ModelConfig(32, 8, 128, "bf16"), tp_size=2, page_size=16)
        slots = c.allocate(bs, 4)
        bs.write_block(slots[0], kv)            # every rank's heads of one block
        c.register_blocks(bs, slots, tokens=prompt)

Every call takes ``timeout`` (seconds; the client's default when None) and
raises a :class:`~kvfabric.errors.KvfabricError` subclass per gRPC code.
"""

from __future__ import annotations

import enum
import mmap
import os
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np

from ._pb.fabric.fabricpb import engine_pb2, engine_pb2_grpc
from ._pb.layout.layoutpb import layout_pb2
from .blockset import Arrangement, BlockSet, KVOrder, ModelConfig
from . import cuda as cuda_driver
from .cuda import DeviceMemory
from .errors import FailedPrecondition, InvalidArgument, KvfabricError, NotFound, ProtocolError, Unavailable, from_rpc_error
from .hashing import MAX_BLOCK_SIZE, token_array
from .memory import FD_SOCKET_SUFFIX, map_descriptor, map_file
from .session import Session

__all__ = ["Client", "BlockRef", "BlockResult", "Blocks", "DropResult", "Outcome", "Overlap", "LookupResult", "Fetch", "ImportResult", "DEFAULT_SOCKET"]

#: Where the agent serves engines unless configured otherwise.
DEFAULT_SOCKET = "/var/lib/kvfabric/engine.sock"
#: The most blocks (hashes, slots) one request may name: the agent's limit.
MAX_REQUEST_BLOCKS = 1 << 16
#: Options of every channel to the agent. Each channel keeps its own
#: subchannels: gRPC shares them process-wide by target otherwise, so a
#: client opened just after the agent restarted could be handed a
#: connection to the old agent that is not yet seen closed, and its first
#: call would fail with "Broken pipe".
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20), ("grpc.use_local_subchannel_pool", 1)]
_U32 = 1 << 32
_U64 = 1 << 64


@dataclass(frozen=True)
class BlockRef:
    """A registered block in a local slot, referenced for the engine.
    duplicate: another slot already held the hash; the engine's slot was
    freed and this one holds the block."""

    hash: int
    slot: int
    duplicate: bool = False


class Outcome(enum.IntEnum):
    """What happened to one block of a request (engine.proto's Outcome)."""

    UNSPECIFIED = engine_pb2.OUTCOME_UNSPECIFIED
    REGISTERED = engine_pb2.OUTCOME_REGISTERED  # RegisterBlocks: the slot holds it, referenced
    DUPLICATE = engine_pb2.OUTCOME_DUPLICATE  # RegisterBlocks: another slot held it; that one is referenced
    REFUSED = engine_pb2.OUTCOME_REFUSED  # RegisterBlocks: nothing done (reason); the slot stays the engine's
    ACQUIRED = engine_pb2.OUTCOME_ACQUIRED  # Acquire: referenced
    LOCAL = engine_pb2.OUTCOME_LOCAL  # Import: already here, referenced
    IMPORTED = engine_pb2.OUTCOME_IMPORTED  # Import: brought from a holder, referenced
    MISSING = engine_pb2.OUTCOME_MISSING  # Acquire, Import: not here (reason)
    SKIPPED = engine_pb2.OUTCOME_SKIPPED  # Acquire: not tried after a missing one


_REFERENCED = frozenset({Outcome.REGISTERED, Outcome.DUPLICATE, Outcome.ACQUIRED, Outcome.LOCAL, Outcome.IMPORTED})
_CODES = {c.value[0]: c for c in grpc.StatusCode}


@dataclass(frozen=True)
class BlockResult:
    """One block of a RegisterBlocks, Acquire or Import request: its
    outcome, the slot holding it (for outcomes that reference one), and for
    REFUSED and MISSING why, with the gRPC code the block alone would have
    failed with. request_slot: RegisterBlocks' slot the block was written in."""

    hash: int
    slot: int
    outcome: Outcome
    reason: str = ""
    code: grpc.StatusCode = grpc.StatusCode.OK
    request_slot: int = 0

    @property
    def referenced(self) -> bool:
        """Whether the engine now holds a reference on slot (release it)."""
        return self.outcome in _REFERENCED


def _results(results: Iterable[engine_pb2.BlockResult]) -> list[BlockResult]:
    out = []
    for r in results:
        try:
            outcome = Outcome(r.outcome)
        except ValueError:
            outcome = Outcome.UNSPECIFIED  # from a newer agent
        out.append(BlockResult(r.hash, r.slot, outcome, r.reason, _CODES.get(r.code, grpc.StatusCode.UNKNOWN), r.request_slot))
    return out


class Blocks(list[BlockRef]):
    """The blocks a call referenced for the engine, in order; ``results``
    has one BlockResult per block the request named, in request order."""

    def __init__(self, refs: Iterable[BlockRef] = (), results: list[BlockResult] | None = None) -> None:
        super().__init__(refs)
        self.results: list[BlockResult] = results or []


@dataclass(frozen=True)
class DropResult:
    """What dropping a block set gave back: references released, and
    unregistered slots freed; still_mapped: the set's mappings the client
    could not unmap yet, views of them being in use (each is unmapped when
    its last view goes)."""

    released: int
    freed: int
    still_mapped: int = 0


@dataclass(frozen=True)
class Overlap:
    """How many leading blocks of a lookup a node holds, and (with a block
    set) what importing them would cost."""

    node: str
    blocks: int
    score: float
    fetch_estimate_us: int = 0
    estimate: str = ""
    fetch_bytes: int = 0
    transport: str = ""


@dataclass(frozen=True)
class LookupResult:
    hashes: list[int]
    overlaps: list[Overlap]
    #: With a block set: per hash, the tier this node holds it in for the
    #: set's layout ("host", "pinned", "device", "disk", or "" for none;
    #: "host" also for the agent's host tier); the first run of blocks in a
    #: tier was restored into the set by the lookup, unless no_restore (then
    #: a block whose copy down to a tier was under way is where that copy
    #: put it: the lookup waited for it).
    local_tiers: list[str] = field(default_factory=list)

    def best(self, exclude: str | None = None) -> Overlap | None:
        """The node holding the most leading blocks (ties: the better score)."""
        cands = [o for o in self.overlaps if o.node != exclude]
        return max(cands, key=lambda o: (o.blocks, o.score)) if cands else None


@dataclass(frozen=True)
class Fetch:
    """What one holder contributed to an import."""

    node: str
    transport: str
    blocks: int
    bytes: int
    micros: int


@dataclass(frozen=True)
class ImportResult:
    """The longest prefix brought (or already here), referenced for the
    engine; error says why the rest is missing, when it is."""

    requested: int
    blocks: list[BlockRef]
    error: str
    fetches: list[Fetch] = field(default_factory=list)
    #: One per block asked for: LOCAL, IMPORTED, or MISSING with why.
    results: list[BlockResult] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.blocks) == self.requested

    @property
    def slots(self) -> list[int]:
        return [b.slot for b in self.blocks]


def _ints(values: Any, what: str, limit: int, bound: int = MAX_REQUEST_BLOCKS, refs: bool = False) -> list[int]:
    """values as a list of ints in [0, limit), naming the first bad one;
    with refs, BlockRefs stand for their slots."""
    if not isinstance(values, Iterable) or isinstance(values, (str, bytes)):
        raise InvalidArgument(f"{what}: want a sequence, got {type(values).__name__}")
    out = []
    for i, v in enumerate(values):
        if refs and isinstance(v, BlockRef):
            v = v.slot
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise InvalidArgument(f"{what}[{i}]: {v!r} is not an integer")
        if not 0 <= v < limit:
            raise InvalidArgument(f"{what}[{i}]: {v} is out of range 0..{limit - 1}")
        out.append(int(v))
    if len(out) > bound:
        raise InvalidArgument(f"{what}: {len(out)} (at most {bound})")
    return out


def _socket_path(socket: str | os.PathLike[str] | None, memory: str, timeout: float, import_timeout: float) -> str:
    """The engine socket's path, after checking the options both clients
    take (the sync and the asyncio one)."""
    if memory not in ("auto", "descriptor", "file"):
        raise InvalidArgument(f"memory: {memory!r} is not auto, descriptor or file")
    for name, v in (("timeout", timeout), ("import_timeout", import_timeout)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise InvalidArgument(f"{name}: {v!r} is not a positive number of seconds")
    return os.fspath(socket) if socket is not None else os.environ.get("KVFABRIC_SOCKET", DEFAULT_SOCKET)


def _set_id(block_set: BlockSet | int) -> int:
    if isinstance(block_set, BlockSet):
        return block_set.id
    if isinstance(block_set, bool) or not isinstance(block_set, (int, np.integer)) or not 0 < block_set < _U64:
        raise InvalidArgument(f"block_set: {block_set!r} is not a block set (a BlockSet or its id)")
    return int(block_set)


def _tokens(tokens: Any, salt: str | None, lora: str | None) -> engine_pb2.Tokens:
    return engine_pb2.Tokens(ids=token_array(tokens).tolist(), salt=salt or "", lora=lora or "")


def _refs(blocks: Iterable[engine_pb2.BlockRef], results: Iterable[engine_pb2.BlockResult] = ()) -> Blocks:
    return Blocks((BlockRef(b.hash, b.slot, b.duplicate) for b in blocks), _results(results))


def _register_request(
    engine: str,
    model: ModelConfig,
    tp_size: int,
    page_size: int,
    kv_order: KVOrder | str,
    arrangement: Arrangement | str,
    slots: int,
    alignment: int,
    devices: Sequence[str | int] | None,
    join: tuple[int, str] | None = None,
) -> engine_pb2.RegisterRequest:
    """A Register request, its arguments checked as Client.register says."""
    if not isinstance(model, ModelConfig):
        raise InvalidArgument(f"model: want a kvfabric.ModelConfig, got {type(model).__name__}")
    for name, v, lo, hi in (
        ("tp_size", tp_size, 1, _U32 - 1),
        ("page_size", page_size, 1, MAX_BLOCK_SIZE),
        ("slots", slots, 0, _U32 - 1),
        ("alignment", alignment, 0, _U64 - 1),
    ):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
            raise InvalidArgument(f"{name}: {v!r} is not an integer in {lo}..{hi}")
    if devices is None:
        devices = ()
    elif isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
        raise InvalidArgument(f"devices: want a sequence of PCI bus ids or CUDA indices, got {devices!r}")
    elif devices and len(devices) != tp_size:
        raise InvalidArgument(f"devices: {len(devices)} entries for tp_size {tp_size}: give one per rank")
    placed = []
    for r, d in enumerate(devices):
        if isinstance(d, bool) or not isinstance(d, (str, int, np.integer)) or (not isinstance(d, str) and d < 0):
            raise InvalidArgument(f"devices[{r}]: {d!r} is not a PCI bus id or a CUDA index")
        placed.append(str(d))
    req = engine_pb2.RegisterRequest(
        engine=engine,
        model=model.proto(),
        tp_size=int(tp_size),
        page_size=int(page_size),
        kv_order=layout_pb2.KVOrder.Name(KVOrder.parse(kv_order, "kv_order")),
        arrangement=layout_pb2.Arrangement.Name(Arrangement.parse(arrangement, "arrangement")),
        slots=int(slots),
        alignment=int(alignment),
        devices=placed,
    )
    if join is not None:
        set_id, token = join
        if not isinstance(token, str) or not token:
            raise InvalidArgument("join: the block set's join token (BlockSet.join_token) is missing")
        req.join_block_set, req.join_token = _set_id(set_id), token
    return req


def _on_device(resp: engine_pb2.RegisterResponse) -> bool:
    """Whether a Register answer's block set is in GPU memory (IPC handles),
    after checking that it describes every rank once."""
    if len(resp.memory) != resp.layout.tp_size or len(resp.ranks) != resp.layout.tp_size:
        raise ProtocolError(
            f"agent sent {len(resp.memory)} memories and {len(resp.ranks)} rank layouts for TP {resp.layout.tp_size}",
            method="Register",
        )
    if any(m.cuda_ipc_handle for m in resp.memory):
        if not all(m.cuda_ipc_handle for m in resp.memory):
            raise ProtocolError("agent sent IPC handles for some ranks only", method="Register")
        return True
    return False


def _check_region(r: int, m: engine_pb2.Memory, mem: mmap.mmap) -> mmap.mmap:
    """mem, once rank r's region of it (m) is checked to lie inside it."""
    if m.offset + m.size > len(mem):
        raise ProtocolError(
            f"rank {r} region [{m.offset}, {m.offset + m.size}) outside the pool memory ({len(mem)} bytes)",
            method="Register",
        )
    return mem


def _allocate_request(block_set: BlockSet | int, count: int) -> engine_pb2.AllocateRequest:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 1 <= count <= MAX_REQUEST_BLOCKS:
        raise InvalidArgument(f"count: {count!r} is not in 1..{MAX_REQUEST_BLOCKS}")
    return engine_pb2.AllocateRequest(block_set=_set_id(block_set), count=int(count))


def _register_blocks_request(
    block_set: BlockSet | int,
    slots: Sequence[int],
    hashes: Sequence[int] | None,
    tokens: Sequence[int] | np.ndarray | None,
    salt: str | None,
    lora: str | None,
    parent: int | None,
) -> engine_pb2.RegisterBlocksRequest:
    s = _ints(slots, "slots", _U32)
    if not s:
        raise InvalidArgument("slots: none given")
    if (hashes is None) == (tokens is None):
        raise InvalidArgument("hashes and tokens: give one, not both")
    req = engine_pb2.RegisterBlocksRequest(block_set=_set_id(block_set), slots=s)
    if hashes is not None:
        h = _ints(hashes, "hashes", _U64)
        if len(h) != len(s):
            raise InvalidArgument(f"hashes: {len(h)} hashes for {len(s)} slots")
        req.hashes.extend(h)
    else:
        req.tokens.CopyFrom(_tokens(tokens, salt, lora))
    if parent is not None:
        req.parent = _ints([parent], "parent", _U64)[0]
        req.parent_set = True
    return req


def _lookup_request(
    hashes: Sequence[int] | None,
    tokens: Sequence[int] | np.ndarray | None,
    salt: str | None,
    lora: str | None,
    block_size: int,
    block_set: BlockSet | int | None,
    no_restore: bool = False,
) -> engine_pb2.LookupRequest:
    if (hashes is None) == (tokens is None):
        raise InvalidArgument("hashes and tokens: give one, not both")
    if not isinstance(no_restore, bool):
        raise InvalidArgument(f"no_restore: {no_restore!r} is not a bool")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or not 0 <= block_size <= MAX_BLOCK_SIZE:
        raise InvalidArgument(f"block_size: {block_size!r} is not in 0..{MAX_BLOCK_SIZE}")
    req = engine_pb2.LookupRequest(block_size=block_size)
    if hashes is not None:
        req.hashes.extend(_ints(hashes, "hashes", _U64))
    else:
        req.tokens.CopyFrom(_tokens(tokens, salt, lora))
    if block_set is not None:
        req.block_set = _set_id(block_set)
    req.no_restore = no_restore
    return req


def _lookup_result(resp: engine_pb2.LookupResponse) -> LookupResult:
    return LookupResult(
        list(resp.hashes),
        [Overlap(o.node, o.blocks, o.score, o.fetch_estimate_us, o.estimate, o.fetch_bytes, o.transport) for o in resp.overlaps],
        list(resp.local_tiers),
    )


@dataclass(frozen=True)
class PrefetchResult:
    """What a prefetch left in the block set's memory: the leading blocks
    there now, those of them it restored from the agent's disk tiers,
    those it imported from other nodes after them, and why it stopped
    short where a restore or an import failed."""

    in_memory: int
    restored: int
    error: str = ""
    imported: int = 0


def _prefetch_request(
    block_set: BlockSet | int,
    hashes: Sequence[int] | None,
    tokens: Sequence[int] | np.ndarray | None,
    salt: str | None,
    lora: str | None,
) -> engine_pb2.PrefetchRequest:
    if (hashes is None) == (tokens is None):
        raise InvalidArgument("hashes and tokens: give one, not both")
    req = engine_pb2.PrefetchRequest(block_set=_set_id(block_set))
    if hashes is not None:
        req.hashes.extend(_ints(hashes, "hashes", _U64))
    else:
        req.tokens.CopyFrom(_tokens(tokens, salt, lora))
    return req


def _prefetch_result(resp: engine_pb2.PrefetchResponse) -> PrefetchResult:
    return PrefetchResult(resp.in_memory, resp.restored, resp.error, resp.imported)


def _import_request(
    block_set: BlockSet | int,
    hashes: Sequence[int] | None,
    tokens: Sequence[int] | np.ndarray | None,
    salt: str | None,
    lora: str | None,
    wait: float,
    timeout: float,
) -> engine_pb2.ImportRequest:
    sid = _set_id(block_set)
    if (hashes is None) == (tokens is None):
        raise InvalidArgument("hashes and tokens: give one, not both")
    if not isinstance(wait, (int, float)) or wait < 0:
        raise InvalidArgument(f"wait: {wait!r} is not a number of seconds >= 0")
    if not isinstance(timeout, (int, float)) or not 0 < timeout * 1000 < _U32:
        raise InvalidArgument(f"timeout: {timeout!r} is not a positive number of seconds")
    req = engine_pb2.ImportRequest(block_set=sid, timeout_ms=max(1, int(timeout * 1000)))
    if hashes is not None:
        req.hashes.extend(_ints(hashes, "hashes", _U64))
        if not req.hashes:
            raise InvalidArgument("hashes: none given")
    else:
        req.tokens.CopyFrom(_tokens(tokens, salt, lora))
    return req


def _import_result(n: int, resp: engine_pb2.ImportResponse) -> ImportResult:
    return ImportResult(
        n,
        _refs(resp.blocks),
        resp.error,
        [Fetch(f.node, f.transport, f.blocks, f.bytes, f.micros) for f in resp.fetches],
        _results(resp.results),
    )


def _index_asks(page: int, req: engine_pb2.ImportRequest) -> list[tuple[engine_pb2.LookupRequest, int]]:
    """The lookups that show the cluster's index holding every block req
    asks for, each with the blocks it must find on one node. By tokens
    (page, the set's page size), a holder may hold them at any page size
    that divides the set's, so each divisor is asked."""
    if req.hashes:
        return [(engine_pb2.LookupRequest(hashes=req.hashes), len(req.hashes))]
    tokens = (len(req.tokens.ids) // page) * page
    if tokens == 0:
        return []
    sizes = [d for d in range(page, 0, -1) if page % d == 0]
    return [(engine_pb2.LookupRequest(tokens=req.tokens, block_size=d), tokens // d) for d in sizes]


# How long a Register waits to give back a set it was handed and cannot
# use (its memory not mapped), whatever the call's own timeout.
_GIVE_BACK_TIMEOUT = 10.0


class _Memory:
    """The pool memory a client mapped (host) or opened (device), one of
    each per key (a memory token, file or path; an IPC handle), with the
    block sets of the client that use each key and the BlockSets it handed
    out, so that dropping a set gives up what no other of its sets uses.
    Shared by the sync and the asyncio client; the lock is held only over
    the tables, never over a mapping, an unmapping or a call."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.closed = False
        # A token's (or file's) mapping under a str, an IPC handle's
        # device memory under bytes.
        self.mems: dict[str | bytes, mmap.mmap | DeviceMemory] = {}
        self.users: dict[str | bytes, set[int]] = {}
        self.sets: dict[int, weakref.WeakSet[BlockSet]] = {}

    def get(self, key: Any, set_id: int) -> Any:
        """The memory mapped (or opened) for key, now used by set_id too;
        None when there is none yet."""
        with self.lock:
            if self.closed:
                raise Unavailable("client is closed")
            mem = self.mems.get(key)
            if mem is not None:
                self.users.setdefault(key, set()).add(set_id)
            return mem

    def put(self, key: Any, set_id: int, mem: Any) -> Any:
        """Keeps mem, just mapped (or opened) for key and set_id, and
        returns it; where another thread did so meanwhile, mem is closed and
        that one returned."""
        with self.lock:
            closed = self.closed
            if not closed:
                have = self.mems.setdefault(key, mem)
                self.users.setdefault(key, set()).add(set_id)
        if closed:
            mem.close()
            raise Unavailable("client is closed")
        if have is not mem:
            mem.close()
        return have

    def bind(self, bs: BlockSet) -> BlockSet:
        """bs, its memory given up when its set is dropped."""
        with self.lock:
            self.sets.setdefault(bs.id, weakref.WeakSet()).add(bs)
        return bs

    def drop(self, set_id: int) -> int:
        """Gives up set_id's memory: the BlockSets of it handed out lose
        their views, and each mapping (or device memory) no other set of the
        client uses is unmapped (closed). A mapping that views of it still
        in use export (numpy arrays taken from the set, memoryviews, torch
        tensors over them) cannot be unmapped under them: it is forgotten,
        and unmapped when the last of them goes. Returns how many were left
        so."""
        gone: list[Any] = []
        with self.lock:
            sets = list(self.sets.pop(set_id, ()))
            for key, users in list(self.users.items()):
                if set_id in users:
                    users.discard(set_id)
                    if not users:
                        del self.users[key]
                        gone.append(self.mems.pop(key))
        for bs in sets:
            bs._drop_memory()
        return _close_all(gone)

    def shut(self) -> None:
        """Closes every mapping and device memory: a mapping that views
        still use is unmapped when the last goes."""
        with self.lock:
            self.closed = True
            mems = list(self.mems.values())
            self.mems.clear()
            self.users.clear()
            self.sets.clear()
        _close_all(mems)


def _close_all(mems: list[Any]) -> int:
    """Closes each mapping (unmapped) or device memory, and returns how
    many mappings views still use: each is unmapped when its last view
    goes."""
    left = 0
    for mem in mems:
        try:
            mem.close()
        except BufferError:
            left += 1  # exported: unmapped with its last view
        except KvfabricError:
            pass  # the driver refused; the mapping goes with the process
    return left


def _shut(session: Session | None, channel: grpc.Channel, memory: _Memory) -> None:
    """What closing a client does; it holds no reference to the client, so
    that a client collected unclosed is shut too."""
    if session is not None:
        session.close()
    memory.shut()
    channel.close()


#: The calls whose answer hands the engine slots or blocks to use under its
#: session.
_HANDS_SLOTS = frozenset({"Allocate", "RegisterBlocks", "Acquire", "Import"})


def _check_answered(method: str, session: int, ended: str | None) -> None:
    """Raises FailedPrecondition for a call that hands slots or blocks and
    succeeded, where its session (session: its id; ended: why it ended,
    None while open or closed by the client) is known to have ended by the
    time the answer came: the agent gave back what the session held, the
    answer's included, so none of it is the engine's. The agent answers so
    itself where the session ended before the call recorded what it took;
    this narrows what is left, an end just after. Other calls' answers stay
    true (a release that succeeded did release)."""
    if method in _HANDS_SLOTS and ended is not None:
        raise FailedPrecondition(
            f"session {session} ended ({ended}), as the call answered: its slots and blocks were given back"
            " (open a new client)",
            method=method,
        )


class Client:
    """A connection to the agent on this node. Safe to share between threads.

    socket: the engine socket (default ``$KVFABRIC_SOCKET``, else
    /var/lib/kvfabric/engine.sock). timeout: seconds every call waits for
    its answer unless told otherwise. import_timeout: the bound on an import
    (sent to the agent, which cuts it to its own --import-timeout; the call
    waits 5 s more for its answer). memory:
    how to map pool memory: "auto" (the descriptor when offered, else the
    named file), "descriptor" or "file". session: open a session (see
    :mod:`kvfabric.session`); without one, calls run under the agent's
    implicit session and what they hold is held until released.
    cuda: the CUDA driver library that opens block sets in GPU memory (an
    agent with a device pool hands out CUDA IPC handles); None:
    ``$KVFABRIC_CUDA_LIB``, else ``libcuda.so.1``, loaded when first needed.
    """

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        engine: str = "python",
        timeout: float = 30.0,
        import_timeout: float = 30.0,
        memory: str = "auto",
        session: bool = True,
        cuda: str | None = None,
    ) -> None:
        path = _socket_path(socket, memory, timeout, import_timeout)
        if not os.path.exists(path):
            raise Unavailable(f"engine socket {path}: no such file (is the agent running?)")
        self.socket = os.path.abspath(path)
        self.engine = engine
        self.timeout = float(timeout)
        self.import_timeout = float(import_timeout)
        self._memory = memory
        self._lock = threading.Lock()
        self._mem = _Memory()
        self._cuda_path = cuda
        self._closed = False
        # unix:PATH with an absolute path (unix://PATH reads a relative
        # path's first element as an authority).
        self._channel = grpc.insecure_channel(
            "unix:" + self.socket, options=_CHANNEL_OPTIONS
        )
        self.api = engine_pb2_grpc.EngineStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._session: Session | None = None
        if session:
            try:
                self._session = Session(self.api, engine, self.timeout)
            except BaseException:
                self._channel.close()
                raise
            self._metadata = self._session.metadata
        # Ends the session and unmaps: on close(), when the client is
        # collected unclosed, or at interpreter exit, whichever comes first.
        self._finalizer = weakref.finalize(self, _shut, self._session, self._channel, self._mem)

    # -- lifetime -------------------------------------------------------

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def session(self) -> int:
        """The session's id (0: none, the agent's implicit session)."""
        return self._session.id if self._session else 0

    @property
    def session_alive(self) -> bool:
        """False once the session ended: closed, or ended by the agent (then
        the slots it held may be another's; open a new client)."""
        return self._session is not None and self._session.alive

    def close(self) -> None:
        """End the session (the agent releases its references and frees its
        unregistered slots; registered blocks stay cached) and close the
        connection. Mapped memory stays valid while numpy views of it exist,
        and is unmapped when the last one goes; device memory is closed.
        Idempotent."""
        with self._lock:
            self._closed = True
        self._finalizer()

    # -- plumbing -------------------------------------------------------

    def _call(self, method: str, req: Any, timeout: float | None) -> Any:
        if self._closed:
            raise Unavailable("client is closed", method=method)
        t = self.timeout if timeout is None else timeout
        if not isinstance(t, (int, float)) or not t > 0:
            raise InvalidArgument(f"timeout: {t!r} is not a positive number of seconds", method=method)
        try:
            resp = getattr(self.api, method)(req, timeout=t, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e, method) from None
        _check_answered(method, self.session, self._session.ended if self._session else None)
        return resp

    def _map(self, m: engine_pb2.Memory, set_id: int) -> mmap.mmap:
        """Maps the memory m names, once per token (or file), for block set
        set_id."""
        key = m.token or m.file or m.path
        mem = self._mem.get(key, set_id)
        if mem is not None:
            return mem
        if self._memory == "file" or (self._memory == "auto" and not m.token):
            if not m.file:
                if self._memory == "file":
                    raise Unavailable("pool memory: the agent offers no named file (it runs without memory_dir)")
                mem = map_file(m.path)  # the older /proc/<pid>/fd form
            else:
                mem = map_file(m.file)
        else:
            if not m.token:
                raise Unavailable("pool memory: the agent offers no descriptor")
            # The companion of the socket as this process reaches it: the
            # agent's fd_socket names it in the agent's mount namespace.
            mem = map_descriptor(self.socket + FD_SOCKET_SUFFIX, m.token, self.timeout)
        return self._mem.put(key, set_id, mem)

    def _open_device(self, m: engine_pb2.Memory, set_id: int) -> DeviceMemory:
        """Opens the device memory m names, once per IPC handle, on the GPU
        of this process with m's PCI bus id, for block set set_id."""
        key = bytes(m.cuda_ipc_handle)
        have = self._mem.get(key, set_id)
        if have is not None:
            return have
        drv = cuda_driver.load(self._cuda_path)
        gpu = drv.find(m.cuda_device, m.pci_bus_id)
        size = m.file_size or m.offset + m.size
        return self._mem.put(key, set_id, drv.open_ipc(gpu, key, size))

    # -- the engine API -------------------------------------------------

    def register(
        self,
        model: ModelConfig,
        tp_size: int,
        page_size: int,
        kv_order: KVOrder | str = KVOrder.HND,
        arrangement: Arrangement | str = Arrangement.FULLY_CONTIGUOUS,
        *,
        slots: int = 0,
        alignment: int = 0,
        devices: Sequence[str | int] | None = None,
        engine: str | None = None,
        join: tuple[int, str] | None = None,
        timeout: float | None = None,
    ) -> BlockSet:
        """Register the engine's layout and map its block set's memory; a
        block set in an agent's GPU pool is opened through the CUDA driver
        instead (``on_device``: no numpy views, blocks move with
        ``write_block`` and ``read_block``).

        slots: 0 takes the agent's default. alignment: the power of two
        strides round up to; 0 takes the agent's (4096). devices: one per
        TP rank, the GPU of the agent's device pools that holds the rank's
        region, as a PCI bus id ("0000:18:00.0") or the agent's CUDA index;
        "" lets the agent choose; None or empty puts rank r on its r-th device
        pool.
        An agent whose pool is host memory ignores it.
        join: (block set id, join token): join that set, which another
        process of the engine registered and whose ``join_token`` it passed
        on, instead of choosing one (the layout must be the set's); a wrong
        token is PermissionDenied, a freed set NotFound.
        """
        req = _register_request(
            engine or self.engine, model, tp_size, page_size, kv_order, arrangement, slots, alignment, devices, join
        )
        resp = self._call("Register", req, timeout)
        try:
            if _on_device(resp):
                return self._mem.bind(BlockSet(resp, device=[self._open_device(m, resp.block_set) for m in resp.memory]))
            memories = []
            for r, m in enumerate(resp.memory):
                memories.append(_check_region(r, m, self._map(m, resp.block_set)))
            return self._mem.bind(BlockSet(resp, memories=memories))
        except Exception as e:
            # The agent handed the set over and this client cannot use it:
            # given back, not left on the session until it ends.
            try:
                self.drop_block_set(resp.block_set, timeout=_GIVE_BACK_TIMEOUT)
            except KvfabricError as d:
                e.add_note(f"block set {resp.block_set} not given back: {d}")
            raise

    def allocate(self, block_set: BlockSet | int, count: int, *, timeout: float | None = None) -> list[int]:
        """Take count free slots for the engine to write."""
        return list(self._call("Allocate", _allocate_request(block_set, count), timeout).slots)

    def free(self, block_set: BlockSet | int, slots: Sequence[int], *, timeout: float | None = None) -> None:
        """Give back allocated slots that were never registered."""
        req = engine_pb2.FreeRequest(block_set=_set_id(block_set), slots=_ints(slots, "slots", _U32))
        self._call("Free", req, timeout)

    def register_blocks(
        self,
        block_set: BlockSet | int,
        slots: Sequence[int],
        hashes: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | np.ndarray | None = None,
        salt: str | None = None,
        lora: str | None = None,
        parent: int | None = None,
        timeout: float | None = None,
    ) -> Blocks:
        """Register written slots, in sequence order, as blocks: by their
        sequence hashes, or by the token ids of the whole sequence (the agent
        hashes each full page). parent: the hash of the block before the
        first one, when that is not the sequence's first. The engine keeps a
        reference on every returned block until release; ``.results`` says
        per slot REGISTERED, DUPLICATE or REFUSED (a refused slot stays the
        engine's, to write again or free)."""
        req = _register_blocks_request(block_set, slots, hashes, tokens, salt, lora, parent)
        resp = self._call("RegisterBlocks", req, timeout)
        return _refs(resp.blocks, resp.results)

    def acquire(self, block_set: BlockSet | int, hashes: Sequence[int], *, timeout: float | None = None) -> Blocks:
        """Reference the leading blocks of hashes held in the block set; stops
        at the first one missing (``.results``: ACQUIRED, then MISSING, then
        SKIPPED)."""
        req = engine_pb2.AcquireRequest(block_set=_set_id(block_set), hashes=_ints(hashes, "hashes", _U64))
        resp = self._call("Acquire", req, timeout)
        return _refs(resp.blocks, resp.results)

    def release(
        self, block_set: BlockSet | int, slots: Sequence[int] | Sequence[BlockRef], *, timeout: float | None = None
    ) -> None:
        """Drop references taken by acquire, import_blocks or register_blocks."""
        ids = _ints(slots, "slots", _U32, refs=True)
        req = engine_pb2.ReleaseRequest(block_set=_set_id(block_set), slots=ids)
        self._call("Release", req, timeout)

    def lookup(
        self,
        hashes: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | np.ndarray | None = None,
        salt: str | None = None,
        lora: str | None = None,
        block_size: int = 0,
        block_set: BlockSet | int | None = None,
        no_restore: bool = False,
        timeout: float | None = None,
    ) -> LookupResult:
        """Per node, how many leading blocks of the sequence it holds. With a
        block set, each overlap also says what importing the matched blocks
        would cost (fetch_estimate_us, fetch_bytes), local_tiers says where
        this node holds each block (the first run held in a tier is brought
        up into the set, unless no_restore: then nothing is restored or read
        ahead, and a block whose copy down to a tier is under way is waited
        for and answered where that copy puts it, within timeout: the agent
        ends its wait a tenth of the time left before the deadline, and a
        block still in flight then is ""; without no_restore it is "" at
        once), and, for tokens, block_size 0 means the set's page size
        (else 16)."""
        req = _lookup_request(hashes, tokens, salt, lora, block_size, block_set, no_restore)
        return _lookup_result(self._call("Lookup", req, timeout))

    def prefetch(
        self,
        block_set: BlockSet | int,
        hashes: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | np.ndarray | None = None,
        salt: str | None = None,
        lora: str | None = None,
        timeout: float | None = None,
    ) -> PrefetchResult:
        """Bring the leading blocks of a sequence up into the block set
        ahead of use: those the agent's disk tiers hold, then those that
        follow from other nodes (at most half the slots the set keeps per
        call, together), cached there unreferenced, so that the acquire or
        import_blocks that follows finds them in memory."""
        req = _prefetch_request(block_set, hashes, tokens, salt, lora)
        return _prefetch_result(self._call("Prefetch", req, timeout))

    def import_blocks(
        self,
        block_set: BlockSet | int,
        hashes: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | np.ndarray | None = None,
        salt: str | None = None,
        lora: str | None = None,
        wait: float = 0,
        timeout: float | None = None,
    ) -> ImportResult:
        """Bring blocks from the cluster into local slots, referenced for the
        engine: by sequence hashes at the set's page size, or by token ids
        (then holders whose page divides the set's serve too).

        wait: seconds to wait first for the cluster's index to show a node
        holding every block asked for (gossip takes a moment to spread a
        fresh store); the import then runs whatever the index shows.
        timeout: the bound on the import itself (default import_timeout; the
        agent cuts it to its own --import-timeout).

        Returns the longest prefix brought, with per-holder fetch reports;
        raises NotFound or Unavailable when nothing could be brought.
        """
        t = self.import_timeout if timeout is None else timeout
        req = _import_request(block_set, hashes, tokens, salt, lora, wait, t)
        page = 0  # by tokens: the set's page size, asked of the agent once
        n = len(req.hashes)
        if not req.hashes:
            page = self._page_size(block_set)
            n = len(req.tokens.ids) // page
        if wait > 0:
            self._wait_indexed(page, req, wait)
        return _import_result(n, self._call("Import", req, t + 5))

    def _wait_indexed(self, page: int, req: engine_pb2.ImportRequest, wait: float) -> None:
        """Poll Lookup until some node holds every block req asks for, or
        wait seconds pass. By tokens (page, the set's page size, given), a
        holder may hold them at any page size that divides the set's, so
        each divisor is asked."""
        deadline = time.monotonic() + wait
        asks = _index_asks(page, req)
        if not asks:
            return
        pause = 0.02
        while True:
            for ask, n in asks:
                resp = self._call("Lookup", ask, max(0.1, min(self.timeout, deadline - time.monotonic())))
                if any(o.blocks >= n for o in resp.overlaps):
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.2)

    def _page_size(self, block_set: BlockSet | int) -> int:
        """The page size of a block set given as itself or by id."""
        if isinstance(block_set, BlockSet):
            return block_set.page_size
        sid = _set_id(block_set)
        for s in self.status().block_sets:
            if s.id == sid:
                return s.page_size
        raise NotFound(f"block set {sid}: unknown to the agent", method="Import")

    def drop_block_set(self, block_set: BlockSet | int, *, timeout: float | None = None) -> DropResult:
        """Stop using a block set under this session: the references and
        unregistered slots the session holds there are given back, as when
        the session ends, and the client gives up the set's memory, whether
        or not the agent answered: every BlockSet of it this client returned
        loses its views (``rank``, ``write_block`` and the rest raise
        FailedPrecondition), and each mapping that no other set of this
        client uses is unmapped (device memory closed). A mapping cannot be
        unmapped under a view of it still in use (an array taken from
        ``rank`` or ``block``, a tensor of ``as_torch``): it stays mapped,
        readable and writable but no longer the engine's to use, until the
        last such view goes (``DropResult.still_mapped`` counts them).

        A drop racing a ``register`` of the same layout from another thread
        of this client is not supported: the agent may hand that register
        the very set being dropped, whose memory the drop then gives up
        under it."""
        sid = _set_id(block_set)
        try:
            resp = self._call("DropBlockSet", engine_pb2.DropBlockSetRequest(block_set=sid), timeout)
        finally:
            left = self._mem.drop(sid)
        return DropResult(resp.released, resp.freed, left)

    def status(self, *, timeout: float | None = None) -> engine_pb2.StatusResponse:
        """The agent's view: node, members, pools, block sets, transfers."""
        return self._call("Status", engine_pb2.StatusRequest(), timeout)
