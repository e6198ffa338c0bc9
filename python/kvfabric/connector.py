"""What an inference engine's KV connector does, without the engine.

:mod:`kvfabric.vllm` and :mod:`kvfabric.sglang` are thin layers over this
module, which knows nothing of either engine: it takes token ids, block ids
and KV cache arrays (numpy arrays or torch tensors, CPU or GPU) in the
engines' own shapes, and talks to the kvfabric agent on the node. Tests
drive it without the engines, replaying the calls they make.

Two halves, as in vLLM:

- :class:`SchedulerSide` (one per engine, in the scheduler's process) does
  all the control calls. ``matched`` looks a request's blocks up and imports
  them into the agent's pool in the background, answering None while that
  runs (it never waits for the agent); ``allocated`` learns the engine blocks
  the loaded tokens go to; ``build`` makes one step's :class:`StepPlan`
  (which pool slots to copy into which engine blocks, which engine blocks to
  save into which freshly allocated slots); ``report`` takes the workers'
  :class:`WorkerReport` for that step, registers the saved blocks every
  worker wrote (so the cluster sees them) and releases the loaded ones.
- :class:`WorkerSide` (one per TP rank) holds the engine's KV cache tensors
  and this rank's view of the pool, the scheduler's block set, which it
  joins with the first plan that names it (by the set's join token, which
  the plan carries: a worker may be a process of its own, as with vLLM's
  multiprocess executor, and the agent hands a set to another process only
  by that token): ``load`` copies a plan's blocks from the
  pool into the engine (after taking its own references on them, so that a
  block the pool lost is reported as failed, never copied), ``save`` copies
  the engine's full blocks into the slots the plan names. A pool in host
  memory is copied through its numpy views; a block set in an agent's GPU
  pool through the CUDA driver (pitched copies between the pool's device
  memory and the caches' memory, device or host, waited for before the
  blocks are released or reported).

Blocks are hashed with kvfabric's recipe at the engine's block size, in the
namespace of the request's cache salt and LoRA. Nothing reaches the engine's
cache that is not a block the agent holds under exactly that hash: a load
that cannot be done names its engine blocks (``WorkerReport.load_errors``)
and the engine recomputes them.
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import hashlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from . import cuda
from .blockset import BlockSet, DType, KVOrder, ModelConfig
from .client import Client, Outcome
from .errors import DeadlineExceeded, InvalidArgument, KvfabricError, NotFound, PermissionDenied, ResourceExhausted, Unavailable
from .hashing import block_hashes

__all__ = [
    "BlockEvent",
    "CacheKind",
    "ConnectorConfig",
    "KVSpec",
    "LoadPlan",
    "SavePlan",
    "SchedulerSide",
    "StepPlan",
    "WorkerReport",
    "WorkerSide",
    "layer_index",
]

log = logging.getLogger("kvfabric.connector")


@dataclass(frozen=True)
class ConnectorConfig:
    """The connector's settings (vLLM: ``kv_connector_extra_config``).

    socket: the agent's engine socket; "" takes ``$KVFABRIC_SOCKET``, else
    the default. recompute_tokens_per_s: how fast the engine prefills; a
    load is done only when the agent's fetch estimate for the matched blocks
    beats recomputing their tokens at this rate (0: always load).
    min_load_tokens: smaller hits are not loaded. lookup_timeout,
    import_timeout: seconds. load, save: whether to load from and save to
    the cluster. slots: the block set's slots (0: the agent's default).
    stats_interval: seconds between the counters' log lines (0: never).
    layerwise: loads copy layer by layer in the background (vLLM's
    wait_for_layer_load waits for its layer only) instead of whole before
    the forward. namespace: the hash namespace blocks are shared in, so
    that engines of models with the same KV shape (a base model and its
    fine-tune, two quantizations) never load each other's blocks: "auto"
    (the engine's model, revision, quantization and KV cache dtype), ""
    (none: bare token hashes, as Dynamo's router computes them; only for a
    cluster that serves one model) or any other string (the engines that
    share blocks name the same). call_timeout: seconds the calls on an
    engine step's path wait for the agent (the scheduler's allocation of
    slots to save into, a worker's acquire of the blocks it loads); one that
    runs out skips the step's saves (and, on the scheduler, saves for
    save_pause seconds) or loads (recomputed), and the worker's release
    after a load, one that runs out perhaps leaving the blocks referenced
    until the session ends, so that an agent that hangs holds the scheduler's step
    this much, and a worker twice this much for each request it loads, not
    the client's 30 s. require_agent: whether the engine's start fails when
    the agent is not there (its socket missing, or no answer); by default
    the engine starts without it, loading and saving nothing, with a
    warning, and the connector connects (registers the block set) once the
    agent answers, tried at most once a second. An agent that answers and
    refuses (a spec it does not take, the socket's permissions) fails the
    start either way.
    """

    socket: str = ""
    recompute_tokens_per_s: float = 0.0
    min_load_tokens: int = 1
    lookup_timeout: float = 2.0
    import_timeout: float = 10.0
    load: bool = True
    save: bool = True
    slots: int = 0
    stats_interval: float = 60.0
    layerwise: bool = False
    namespace: str = "auto"
    call_timeout: float = 2.0
    save_pause: float = 10.0
    require_agent: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "ConnectorConfig":
        """The settings in d, each checked; an unknown key is an error
        naming it (with the known ones), not ignored."""
        d = dict(d or {})
        known = {f: getattr(cls, f) for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - set(known))
        if unknown:
            raise InvalidArgument(f"kvfabric connector: unknown setting(s) {unknown}; known: {sorted(known)}")
        out: dict[str, Any] = {}
        for k, v in d.items():
            want = type(known[k])
            if want is bool:
                if not isinstance(v, bool):
                    raise InvalidArgument(f"kvfabric connector: {k}={v!r} is not true or false")
            elif want is str:
                if not isinstance(v, str):
                    raise InvalidArgument(f"kvfabric connector: {k}={v!r} is not a string")
            else:
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or v != v:
                    raise InvalidArgument(f"kvfabric connector: {k}={v!r} is not a number >= 0")
                if want is int:
                    if v != int(v):
                        raise InvalidArgument(f"kvfabric connector: {k}={v!r} is not a whole number")
                    v = int(v)
                else:
                    v = float(v)
            out[k] = v
        cfg = cls(**out)
        for k in ("lookup_timeout", "import_timeout", "call_timeout"):
            if getattr(cfg, k) <= 0:
                raise InvalidArgument(f"kvfabric connector: {k} must be > 0 seconds")
        return cfg

    @property
    def socket_path(self) -> str:
        return self.socket or os.environ.get("KVFABRIC_SOCKET", "/var/lib/kvfabric/engine.sock")


class _NoAgent:
    """The client of a connector half that has not reached the agent yet
    (ConnectorConfig.require_agent false): no session, and every call
    refused as Unavailable, so that the half's reconnection (the path an
    agent's restart takes) opens the real one once the agent answers."""

    session_alive = False

    def __init__(self, engine: str, why: Exception) -> None:
        self.engine = engine
        self.why = why

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        def refuse(*_a: Any, **_k: Any) -> Any:
            raise Unavailable(f"no session with the agent yet: {self.why}")

        return refuse


#: How often a connector half warns that the agent is still not there.
_ABSENT_WARN_INTERVAL = 60.0


def _warn_again(half: Any, e: Exception, now: float) -> bool:
    """Whether a half that never reached the agent warns of this failure to
    connect: one unlike the last warned of (a socket there now, say, that
    refuses), or the same once _ABSENT_WARN_INTERVAL has passed."""
    why = f"{type(e).__name__}: {e}"
    if why == half._warned_why and now - half._warned_at < _ABSENT_WARN_INTERVAL:
        return False
    half._warned_at, half._warned_why = now, why
    return True


def _absent(config: ConnectorConfig, engine: str, e: KvfabricError, log: logging.Logger) -> Client:
    """The stand-in client of a half that starts without the agent, or e
    raised again where it must not (require_agent, or a refusal)."""
    if config.require_agent or not isinstance(e, (Unavailable, DeadlineExceeded)):
        raise e
    log.warning("kvfabric: the agent on %s is not there (%s): the engine starts without the cache, "
                "and connects once the agent answers (require_agent: true makes this an error)", config.socket_path, e)
    return cast(Client, _NoAgent(engine, e))


class CacheKind(enum.Enum):
    """The shape of one layer's KV cache in the engine.

    FLASH: ``[2, blocks, block_size, heads, head_dim]`` (vLLM's
    FlashAttention; K then V). FLASHINFER: ``[blocks, 2, block_size, heads,
    head_dim]`` (vLLM's FlashInfer and Triton; its HND variant is the same
    logical shape over a permuted memory order, which indexing absorbs).
    MLA: ``[blocks, block_size, latent]`` (one latent plane, no heads).
    """

    FLASH = "flash"
    FLASHINFER = "flashinfer"
    MLA = "mla"


@dataclass(frozen=True)
class KVSpec:
    """The engine's KV cache as kvfabric registers it: the model's totals,
    TP size, block size (kvfabric's page) and the order inside a chunk.
    Both halves derive it from the engine's configuration, so they register
    the same block set."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tp_size: int
    block_size: int
    kind: CacheKind = CacheKind.FLASH
    kv_order: str = "nhd"
    #: The hash namespace (ConnectorConfig.namespace, resolved): blocks
    #: are named by their tokens' hashes under it.
    namespace: str = ""

    def salt(self, salt: str | None) -> str | None:
        """A request's salt within the namespace."""
        if not self.namespace:
            return salt
        return self.namespace if not salt else f"{self.namespace}\x1f{salt}"

    @property
    def mla(self) -> bool:
        return self.kind is CacheKind.MLA

    @property
    def model(self) -> ModelConfig:
        return ModelConfig(self.layers, 1 if self.mla else self.kv_heads, self.head_dim, self.dtype, self.mla)

    def heads_per_rank(self) -> int:
        """KV heads one rank's cache holds (replicated when TP exceeds them)."""
        if self.mla:
            return 1
        return max(1, self.kv_heads // self.tp_size)

    def register(
        self, client: Client, slots: int = 0, engine: str | None = None, join: tuple[int, str] | None = None
    ) -> BlockSet:
        return client.register(
            self.model, self.tp_size, self.block_size, self.kv_order, slots=slots, engine=engine, join=join
        )


_TORCH_DTYPES = {
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "uint8": "u8",
}


def dtype_name(t: Any) -> str:
    """kvfabric's name for the element type of a numpy array or torch tensor."""
    s = str(t.dtype).removeprefix("torch.")
    if s in _TORCH_DTYPES:
        return _TORCH_DTYPES[s]
    if isinstance(t, np.ndarray) and t.dtype in (np.float16, np.float32, np.uint8):
        return {np.dtype(np.float16): "f16", np.dtype(np.float32): "f32", np.dtype(np.uint8): "u8"}[t.dtype]
    raise InvalidArgument(f"KV cache dtype {t.dtype} has no kvfabric type (f16, bf16, f32, fp8, u8)")


_LAYER = re.compile(r"\d+")


def layer_index(name: str) -> int:
    """The layer number in a layer's name ("model.layers.12.self_attn.attn"
    is 12): the first run of digits, as vLLM's extract_layer_index reads it."""
    m = _LAYER.search(name)
    if m is None:
        raise InvalidArgument(f"KV cache layer {name!r}: no layer number in its name")
    return int(m.group())


# -- plans and reports ------------------------------------------------------


@dataclass
class LoadPlan:
    """Copy the pool's blocks hashes[i] into engine block block_ids[i]."""

    req_id: str
    hashes: list[int]
    block_ids: list[int]


@dataclass
class SavePlan:
    """Copy engine block block_ids[i] into pool slot slots[i]; registered
    under hashes[i] once every worker wrote it."""

    req_id: str
    hashes: list[int]
    block_ids: list[int]
    slots: list[int]


@dataclass
class StepPlan:
    """What the workers do in one engine step (vLLM's connector metadata)."""

    step: int
    block_set: int
    loads: list[LoadPlan] = field(default_factory=list)
    saves: list[SavePlan] = field(default_factory=list)
    #: The block set and the agent run it lives in (see incarnation): a
    #: worker whose own block set is not this one joins it first (with
    #: join_token); one that cannot loads nothing and writes no slot of the
    #: plan.
    incarnation: str = ""
    #: The block set's join token (BlockSet.join_token): what lets a worker
    #: in another process than the scheduler's join the set. The plan goes
    #: only to the engine's own processes, and its repr (a log line) leaves
    #: the token out.
    join_token: str = field(default="", repr=False)


def incarnation(bs: BlockSet) -> str:
    """A block set's id with its agent's run: a digest of the pool memory's
    token (or IPC handle), which no other run of the agent shares. Slot
    numbers mean something only within one. A digest, not the token: plans
    and log lines carry it, and the token maps the memory."""
    m = bs.memory[0]
    secret = m.token.encode() if m.token else bytes(m.cuda_ipc_handle)
    return f"{bs.id}:{hashlib.sha256(secret).hexdigest()[:32]}"


@dataclass
class WorkerReport:
    """What the workers did in one step (vLLM's worker metadata), merged
    over the TP ranks: how many ranks reported, the engine blocks whose load
    failed on any rank (vLLM recomputes them), and per pool slot how many
    ranks wrote it (the scheduler registers a slot only when every rank
    did: a report made before a rank's save, or a rank that failed, leaves
    it unregistered and freed)."""

    step: int
    workers: int = 1
    load_errors: set[int] = field(default_factory=set)
    saved: dict[int, int] = field(default_factory=dict)
    #: Requests with a failed load in the step: the step computed their
    #: new tokens over KV that is not theirs, so none of their blocks of
    #: the step is saved.
    failed_requests: set[str] = field(default_factory=set)
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    saved_bytes: int = 0
    #: Hashes the pool no longer held when a rank took its references.
    gone: set[int] = field(default_factory=set)

    def merge(self, other: "WorkerReport") -> "WorkerReport":
        if other.step != self.step:
            raise InvalidArgument(f"worker reports of steps {self.step} and {other.step} do not merge")
        saved = dict(self.saved)
        for slot, n in other.saved.items():
            saved[slot] = saved.get(slot, 0) + n
        return WorkerReport(
            self.step,
            self.workers + other.workers,
            self.load_errors | other.load_errors,
            saved,
            self.failed_requests | other.failed_requests,
            self.loaded_blocks + other.loaded_blocks,
            self.loaded_bytes + other.loaded_bytes,
            self.saved_bytes + other.saved_bytes,
            self.gone | other.gone,
        )


@dataclass(frozen=True)
class BlockEvent:
    """A block of the node's pool that the connector stored or found gone
    (vLLM's KV cache events: BlockStored, BlockRemoved).

    stored: True when the block is now in the pool: the engine computed and
    saved it ("saved"), or a load imported it from another node
    ("imported"); False when a worker found it gone from the pool ("gone").
    hash: kvfabric's hash of the block; parent: its predecessor's (None for
    a prompt's first block, and for gone blocks); tokens: the block's token
    ids (empty for gone blocks); lora: the LoRA name its hash is salted with.
    """

    stored: bool
    origin: str
    hash: int
    parent: int | None = None
    tokens: tuple[int, ...] = ()
    lora: str | None = None


class Counters:
    """Monotonic counters of one connector half, thread-safe."""

    NAMES = (
        "lookups",
        "lookup_errors",
        "hit_tokens",
        "loads_skipped",
        "imports",
        "import_errors",
        "loaded_tokens",
        "loaded_blocks",
        "loaded_bytes",
        "load_errors",
        "saved_blocks",
        "saved_bytes",
        "save_errors",
        "saves_skipped",
        "saves_over_failed_loads",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._v = dict.fromkeys(self.NAMES, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._v[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._v)


# -- the scheduler's half ---------------------------------------------------


class _State(enum.Enum):
    LOOKING = 1  # lookup, then import, in the background
    READY = 2  # imported; refs held, matched known
    LOADING = 3  # planned into a step; refs held until its report
    DONE = 4


@dataclass
class _Request:
    req_id: str
    hashes: list[int]
    start: int  # first block the load covers (the engine's computed blocks)
    tokens: int
    state: _State = _State.LOOKING
    future: cf.Future | None = None
    refs: list = field(default_factory=list)  # BlockRefs held for the load
    matched: int = 0  # tokens
    block_ids: list[int] = field(default_factory=list)
    step: int = -1
    cancelled: bool = False
    lora: str | None = None


@dataclass
class _Saving:
    """An engine request whose full blocks are saved as they are computed."""

    hashes: list[int]  # of the prompt's full blocks
    next_block: int  # the first block not yet saved (or skipped)
    tokens: list[int] = field(default_factory=list)
    lora: str | None = None


class SchedulerSide:
    """The scheduler's half of a connector (see the module doc).

    spec: the engine's KV cache. client: a client of the agent (one is
    opened on config.socket_path when None); the block set is registered at
    once. Every method returns without waiting on the agent except
    ``build`` (one Allocate per step that saves) and ``report`` (whose
    registration runs in the background).
    """

    def __init__(
        self,
        config: ConnectorConfig,
        spec: KVSpec,
        client: Client | None = None,
        *,
        engine: str = "engine",
        logger: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self.spec = spec
        self.log = logger or log
        self._own_client = client is None
        self._engine = engine
        self._retry_at = 0.0
        self._warned_at, self._warned_why = time.monotonic(), ""
        #: The block set and the agent's node: None and "" until the agent
        #: is first reached (require_agent false and the agent not there).
        self.block_set: BlockSet | None = None
        self.node = ""
        if client is not None:
            self.client = client
            self.block_set = spec.register(self.client, config.slots, engine=engine)
            self.node = self.client.status().node
        else:
            try:
                self.client, self.block_set, self.node = self._connect()
            except KvfabricError as e:
                self.client = _absent(config, engine, e, self.log)
                self._warned_why = f"{type(e).__name__}: {e}"
        self.counters = Counters()
        self._lock = threading.Lock()
        self._reqs: dict[str, _Request] = {}
        self._saving: dict[str, _Saving] = {}
        self._to_load: list[_Request] = []
        #: Per step: the client and block set its slots were allocated in,
        #: the saves, and per saved hash its BlockEvent.
        self._pending_saves: dict[int, tuple[Client, BlockSet, list[SavePlan], dict[int, BlockEvent]]] = {}
        #: Per step with saves, each saving request's engine block table as
        #: the step saw it, and the requests whose saves of the step are
        #: dropped (computed over a block whose load failed).
        self._save_tables: dict[int, dict[str, frozenset[int]]] = {}
        self._poisoned: dict[int, set[str]] = {}
        self._events: list[BlockEvent] = []
        self._loading: dict[int, list[_Request]] = {}
        self._step = 0
        self._saves_paused_until = 0.0
        self._pool = cf.ThreadPoolExecutor(2, thread_name_prefix="kvfabric-lookup")
        self._registrar = cf.ThreadPoolExecutor(1, thread_name_prefix="kvfabric-register")
        self._last_stats = time.monotonic()
        self._closed = False
        #: Called in the background with each lookup's answer, before the
        #: import it may lead to (failure tests stop agents here).
        self.before_import: Callable[[Any], None] | None = None
        #: Whether a reconnection is queued in the background (matched
        #: queues one while the agent was never reached).
        self._reconnecting = False
        if self.block_set is not None:
            self.log.info(
                "kvfabric: block set %d on node %s (%s, TP %d, block %d tokens, %s)",
                self.block_set.id, self.node, spec.model, spec.tp_size, spec.block_size, spec.kv_order,
            )

    def _connect(self) -> tuple[Client, BlockSet, str]:
        """A new client of the agent, the block set registered on it and
        the agent's node."""
        c = Client(self.config.socket_path, engine=self._engine, import_timeout=self.config.import_timeout)
        try:
            bs = self.spec.register(c, self.config.slots, engine=self._engine)
            return c, bs, c.status().node
        except BaseException:
            c.close()
            raise

    # -- loads ----------------------------------------------------------

    def matched(
        self,
        req_id: str,
        tokens: Sequence[int],
        num_computed: int,
        *,
        salt: str | None = None,
        lora: str | None = None,
    ) -> int | None:
        """Tokens beyond num_computed the connector will load for the
        request (vLLM's get_num_new_matched_tokens), or None while the
        answer is pending. Side-effect free once answered: called again with
        the same num_computed it answers the same."""
        if not self.config.load:
            return 0
        if self.block_set is None:
            # The agent was never reached: nothing to load; reached in the
            # background, for the requests after.
            self._reconnect_later()
            return 0
        page = self.spec.block_size
        start = num_computed // page
        with self._lock:
            r = self._reqs.get(req_id)
            if r is not None and r.state in (_State.LOOKING, _State.READY) and r.start != start:
                self._drop(r)  # the engine's own hit changed: ask again
                r = None
            if r is None or r.state is _State.DONE:
                # The last block is never loaded whole: the engine computes
                # at least one token.
                usable = max(0, (len(tokens) - 1) // page)
                if usable <= start:
                    return 0
                # Hashed in the background too: a long prompt takes ms.
                r = _Request(req_id, [], start, len(tokens), lora=lora)
                self._reqs[req_id] = r
                r.future = self._pool.submit(self._lookup_and_import, r, list(tokens[: usable * page]), salt, lora)
                return None
            if r.state in (_State.LOOKING, _State.LOADING):
                # LOADING: asked again before the step that loads it
                # reported (preempted and re-admitted under asynchronous
                # scheduling): that load's blocks are not the new one's,
                # and a promise made now would plan none. It is looked up
                # again once that step has reported.
                return None
            return r.matched

    def _reconnect_later(self) -> None:
        """Queue a reconnection in the background, unless one is."""
        with self._lock:
            if self._reconnecting or self._closed:
                return
            self._reconnecting = True
        try:
            self._pool.submit(self._reconnect_queued)
        except RuntimeError:
            pass  # shut down meanwhile

    def _reconnect_queued(self) -> None:
        try:
            self._reconnect()
        finally:
            with self._lock:
                self._reconnecting = False

    def _reconnect(self) -> bool:
        """In the background: when the agent ended this client's session
        (it restarted), or was never reached, open a new client and register
        again, at most once a second; what the old session held is gone with
        it. Returns whether the client's session is alive."""
        if self.client.session_alive or not self._own_client:
            return True
        now = time.monotonic()
        if now < self._retry_at:
            return False
        self._retry_at = now + 1.0
        try:
            c, bs, node = self._connect()
        except KvfabricError as e:
            if self.block_set is not None or _warn_again(self, e, now):
                self.log.warning("kvfabric: the agent's session ended, or was never opened, and connecting failed: %s", e)
            return False
        with self._lock:
            old, self.client, self.block_set, self.node = self.client, c, bs, node
            for r in self._reqs.values():
                r.refs = []  # released with the old session
                if r.state is _State.LOADING and r.step >= 0:
                    # Its step's plan names the old session's block set:
                    # the workers report its blocks as load errors, and
                    # the report no longer finds it here. Re-admitted, it
                    # is looked up again. One not yet in a plan stays to
                    # be planned, by hash, against the new set: what the
                    # engine was promised is loaded or reported failed.
                    r.state = _State.DONE
            self._pending_saves.clear()
            self._save_tables.clear()
            self._poisoned.clear()
            self._loading.clear()
        old.close()
        self.log.info("kvfabric: reconnected to the agent on %s: block set %d", node, bs.id)
        return True

    def _lookup_and_import(self, r: _Request, tokens: list[int], salt: str | None, lora: str | None) -> None:
        refs: list = []
        matched = 0
        try:
            r.hashes = block_hashes(tokens, self.spec.block_size, salt=self.spec.salt(salt), lora=lora)
            if not self._reconnect():
                raise KvfabricError("no session with the agent")
            refs, matched, imported = self._fetch(r.hashes[r.start :])
            page = self.spec.block_size
            idx = {h: r.start + i for i, h in enumerate(r.hashes[r.start :])}
            events = []
            for h in imported:
                i = idx[h]
                events.append(BlockEvent(True, "imported", h, r.hashes[i - 1] if i else None,
                                         tuple(tokens[i * page : (i + 1) * page]), lora))
            with self._lock:
                self._events.extend(events)
        except Exception as e:  # the agent is away, or refused: nothing loads
            self.counters.add("lookup_errors")
            self.log.warning("kvfabric: request %s: lookup or import failed, recomputing: %s", r.req_id, e)
        with self._lock:
            if r.cancelled or self._closed:
                self._release(refs)
                return
            r.refs = refs
            r.matched = matched
            r.state = _State.READY
        if matched:
            self.counters.add("hit_tokens", matched)

    def _fetch(self, want: list[int]) -> tuple[list, int, list[int]]:
        """Looks want up and, when loading beats recomputing, imports the
        longest prefix; returns the references, the tokens they cover and
        the hashes the import brought from other nodes."""
        page = self.spec.block_size
        self.counters.add("lookups")
        found = self.client.lookup(want, block_set=self.block_set, timeout=self.config.lookup_timeout)
        if self.before_import is not None:
            self.before_import(found)
        best = found.best()
        if best is None or best.blocks == 0 or best.blocks * page < self.config.min_load_tokens:
            return [], 0, []
        if best.node != self.node and self.config.recompute_tokens_per_s > 0 and best.estimate in ("measured", "cluster"):
            recompute_us = best.blocks * page / self.config.recompute_tokens_per_s * 1e6
            if best.fetch_estimate_us > recompute_us:
                self.counters.add("loads_skipped")
                self.log.debug(
                    "kvfabric: %d blocks on %s: fetch estimate %d us > recompute %d us, not loading",
                    best.blocks, best.node, best.fetch_estimate_us, recompute_us,
                )
                return [], 0, []
        self.counters.add("imports")
        assert self.block_set is not None  # looked up on its session
        got = self.client.import_blocks(self.block_set, want[: best.blocks], timeout=self.config.import_timeout)
        if got.error:
            self.counters.add("import_errors")
            self.log.info("kvfabric: imported %d of %d blocks: %s", len(got.blocks), best.blocks, got.error)
        imported = [x.hash for x in got.results if x.outcome is Outcome.IMPORTED]
        return list(got.blocks), len(got.blocks) * page, imported

    def allocated(self, req_id: str, block_ids: Sequence[int], num_external_tokens: int) -> None:
        """The engine gave the request its blocks (vLLM's
        update_state_after_alloc): block_ids are all of its blocks, the
        loaded ones following its computed ones. num_external_tokens 0: the
        engine loads nothing (the references are given back). The engine
        counts num_external_tokens as computed once the step runs, so the
        load is planned for all of them, by hash, whatever references this
        side still holds (none, once a restarted agent ended the session):
        a block the worker cannot acquire is a load error, which the engine
        recomputes, never a block it runs over unloaded."""
        with self._lock:
            r = self._reqs.get(req_id)
            if r is None or r.state is not _State.READY:
                return
            page = self.spec.block_size
            n = min(num_external_tokens // page, max(0, len(block_ids) - r.start), max(0, len(r.hashes) - r.start))
            if n <= 0:
                self._drop(r)
                return
            self._release(r.refs[n:])
            r.refs = r.refs[:n]
            r.matched = n * page
            r.block_ids = list(block_ids[r.start : r.start + n])
            r.state = _State.LOADING
            self._to_load.append(r)
        self.counters.add("loaded_tokens", n * page)

    # -- saves ----------------------------------------------------------

    def track(
        self, req_id: str, tokens: Sequence[int], num_computed: int, *, salt: str | None = None, lora: str | None = None
    ) -> None:
        """Start saving a request's prompt blocks computed from now on
        (blocks the engine already had, or loaded, are not saved again)."""
        if not self.config.save:
            return
        page = self.spec.block_size
        hashes = block_hashes(list(tokens), page, salt=self.spec.salt(salt), lora=lora)
        with self._lock:
            self._saving[req_id] = _Saving(hashes, -(-num_computed // page), list(tokens[: len(hashes) * page]), lora)

    def build(self, scheduled: Mapping[str, tuple[Sequence[int], int]]) -> StepPlan:
        """This step's plan (vLLM's build_connector_meta). scheduled: per
        request of the step, its engine block ids and how many of its tokens
        are computed once the step is done."""
        with self._lock:
            self._step += 1
            step = self._step
            client, bs = self.client, self.block_set  # the session this plan belongs to
            if bs is None:  # the agent never reached: nothing loads or saves
                plan = StepPlan(step, 0)
            else:
                plan = StepPlan(step, bs.id, incarnation=incarnation(bs), join_token=bs.join_token)
            for r in self._to_load:
                if r.state is _State.LOADING and not r.cancelled:
                    n = r.matched // self.spec.block_size
                    plan.loads.append(LoadPlan(r.req_id, r.hashes[r.start : r.start + n], r.block_ids))
                    r.step = step
                    self._loading.setdefault(step, []).append(r)
            self._to_load.clear()
            page = self.spec.block_size
            wanted: list[tuple[str, list[int], list[int], _Saving, int]] = []
            for req_id, (block_ids, computed) in scheduled.items():
                s = self._saving.get(req_id)
                if s is None:
                    continue
                full = min(computed // page, len(s.hashes), len(block_ids))
                if full > s.next_block:
                    wanted.append((req_id, s.hashes[s.next_block : full], list(block_ids[s.next_block : full]), s, full))
        if bs is None:
            self._reconnect_later()  # an engine that saves but never loads asks nothing else
        if wanted:
            need = sum(len(w[1]) for w in wanted)
            slots: list[int] = []
            if bs is None or time.monotonic() < self._saves_paused_until:
                self.counters.add("saves_skipped", need)
            else:
                try:
                    slots = client.allocate(bs, need, timeout=self.config.call_timeout)
                except ResourceExhausted as e:
                    self.counters.add("saves_skipped", need)
                    self.log.info("kvfabric: pool full, not saving %d blocks this step: %s", need, e)
                except DeadlineExceeded as e:
                    # The agent does not answer: the next steps do not wait
                    # on it for their saves either, for a while.
                    self._saves_paused_until = time.monotonic() + self.config.save_pause
                    self.counters.add("saves_skipped", need)
                    self.log.warning("kvfabric: the agent did not answer an allocation within %.1f s: not saving for %.0f s: %s",
                                     self.config.call_timeout, self.config.save_pause, e)
                except KvfabricError as e:
                    self.counters.add("saves_skipped", need)
                    self.log.warning("kvfabric: allocating %d slots failed, not saving them: %s", need, e)
            with self._lock:
                if client is not self.client:
                    slots = []  # the session ended meanwhile: its slots went with it
                i = 0
                events: dict[int, BlockEvent] = {}
                for req_id, hashes, bids, s, full in wanted:
                    first = s.next_block
                    s.next_block = full  # saved now, or skipped for good
                    if slots:
                        plan.saves.append(SavePlan(req_id, hashes, bids, slots[i : i + len(hashes)]))
                        i += len(hashes)
                        for j in range(first, full):
                            events[s.hashes[j]] = BlockEvent(
                                True, "saved", s.hashes[j], s.hashes[j - 1] if j else None,
                                tuple(s.tokens[j * page : (j + 1) * page]), s.lora,
                            )
                if plan.saves and bs is not None:
                    self._pending_saves[step] = (client, bs, plan.saves, events)
                    self._save_tables[step] = {
                        p.req_id: frozenset(scheduled[p.req_id][0]) for p in plan.saves if p.req_id in scheduled
                    }
        self._maybe_log_stats()
        return plan

    def report(self, rep: WorkerReport | None, step: int | None = None) -> None:
        """The workers' merged report of a step (vLLM's
        update_connector_output). A step whose report is missing, or came
        from fewer workers than the TP size, registers nothing it saved."""
        step = rep.step if rep is not None else step
        if step is None:
            return
        failed_reqs = rep.failed_requests if rep is not None else set()
        with self._lock:
            if rep is not None and rep.load_errors:
                self._poison(step, rep.load_errors, failed_reqs)
            # Steps before this one that never reported are given up.
            done = [s for s in set(self._pending_saves) | set(self._loading) if s <= step]
            pending = [(s, *self._pending_saves.pop(s), self._poisoned.pop(s, set())) for s in done if s in self._pending_saves]
            for s in done:
                self._save_tables.pop(s, None)
            loads = [r for s in done for r in self._loading.pop(s, [])]
            for r in loads:
                if r.state is _State.LOADING:
                    self._release(r.refs)
                    r.refs = []
                    r.state = _State.DONE
                sv = self._saving.get(r.req_id)
                if r.req_id in failed_reqs and sv is not None and rep is not None:
                    # The engine recomputes from the first failed block on:
                    # save what it computes again.
                    bad = [i for i, b in enumerate(r.block_ids) if b in rep.load_errors]
                    sv.next_block = min(sv.next_block, r.start + (bad[0] if bad else 0))
        if rep is not None:
            self.counters.add("loaded_blocks", rep.loaded_blocks)
            self.counters.add("loaded_bytes", rep.loaded_bytes)
            if rep.load_errors:
                self.counters.add("load_errors", len(rep.load_errors))
                self.log.warning("kvfabric: step %d: %d blocks failed to load; the engine recomputes them", step, len(rep.load_errors))
        tp = self.spec.tp_size
        written = rep.saved if rep is not None else {}
        if rep is not None and rep.gone:
            with self._lock:
                self._events.extend(BlockEvent(False, "gone", h) for h in sorted(rep.gone))
        for s, client, bs, saves, events, poisoned in pending:
            # A step given up (no report of its own) registers nothing, nor
            # does a request's save computed over a block whose load failed.
            ours = rep is not None and s == rep.step
            unwritten = {
                slot for p in saves for slot in p.slots if not ours or written.get(slot, 0) < tp or p.req_id in poisoned
            }
            self._registrar.submit(self._register, client, bs, saves, unwritten, rep.saved_bytes if ours and rep else 0, events)

    def _poison(self, step: int, load_errors: set[int], failed_reqs: set[str]) -> None:
        """A load of step failed for the engine blocks load_errors: every
        save of that step or a later one already planned (the engine plans
        the next step before this report, and lets another request use a
        block whose load failed) by a request whose block table holds one
        of them was computed over KV that is not its own, and is dropped;
        such a request other than the one whose load failed (which the
        engine recomputes, and saves again) saves nothing more. Called
        with the lock held."""
        for s, tables in self._save_tables.items():
            if s < step:
                continue
            for req_id, table in tables.items():
                if table.isdisjoint(load_errors):
                    continue
                self._poisoned.setdefault(s, set()).add(req_id)
                if req_id not in failed_reqs:
                    if self._saving.pop(req_id, None) is not None:
                        self.counters.add("saves_over_failed_loads")
                        self.log.warning("kvfabric: request %s used a block whose load failed: not saved from here on", req_id)
                    continue
                # The engine recomputes it: the blocks whose saves are
                # dropped are saved again as they are computed.
                sv = self._saving.get(req_id)
                pending = self._pending_saves.get(s)
                for p in pending[2] if pending is not None else []:
                    if sv is not None and p.req_id == req_id and p.hashes and p.hashes[0] in sv.hashes:
                        sv.next_block = min(sv.next_block, sv.hashes.index(p.hashes[0]))

    def _register(
        self, client: Client, bs: BlockSet, saves: list[SavePlan], failed: set[int], saved_bytes: int,
        events: Mapping[int, BlockEvent] | None = None,
    ) -> None:
        if client is not self.client:
            return  # the session that allocated the slots ended; they went with it
        ok_slots, ok_hashes, bad = [], [], []
        for p in saves:
            for h, s in zip(p.hashes, p.slots):
                if s in failed:
                    bad.append(s)
                else:
                    ok_slots.append(s)
                    ok_hashes.append(h)
        try:
            if bad:
                self.counters.add("save_errors", len(bad))
                client.free(bs, bad)
            if ok_slots:
                refs = client.register_blocks(bs, ok_slots, ok_hashes)
                if events:
                    # A duplicate was in the pool already (stored before, by this engine or an import).
                    new = [events[r.hash] for r in refs.results if r.outcome is Outcome.REGISTERED and r.hash in events]
                    with self._lock:
                        self._events.extend(new)
                refused = [r for r in refs.results if not r.referenced]
                if refused:
                    self.counters.add("save_errors", len(refused))
                    client.free(bs, [r.request_slot for r in refused])
                client.release(bs, refs)  # cached for the cluster
                self.counters.add("saved_blocks", len(refs))
                self.counters.add("saved_bytes", saved_bytes)
        except KvfabricError as e:
            self.counters.add("save_errors", len(ok_slots))
            self.log.warning("kvfabric: registering %d saved blocks failed: %s", len(ok_slots), e)

    def finished(self, req_id: str) -> None:
        """The request is done (vLLM's request_finished) or preempted: its
        references are given back and a pending lookup is dropped."""
        with self._lock:
            self._saving.pop(req_id, None)
            r = self._reqs.pop(req_id, None)
            if r is not None and r.state is not _State.LOADING:
                self._drop(r)
            # A request in a step's loads keeps its references until the
            # step's report: its worker copies may be running.

    def _drop(self, r: _Request) -> None:
        """Under the lock: stop r and give back what it holds."""
        r.cancelled = True
        self._release(r.refs)
        r.refs = []
        r.state = _State.DONE
        if self._reqs.get(r.req_id) is r:
            del self._reqs[r.req_id]

    def _release(self, refs: list) -> None:
        """Give refs back, in the background (the scheduler does not wait
        on the agent for it); after close, at once."""
        client, bs = self.client, self.block_set
        if not refs or bs is None:
            return
        if not self._closed:
            try:
                self._registrar.submit(self._release_now, client, bs, refs)
                return
            except RuntimeError:
                pass  # shut down meanwhile
        self._release_now(client, bs, refs)

    def _release_now(self, client: Client, bs: BlockSet, refs: list) -> None:
        if client is not self.client:
            return  # a session since ended: the agent released them with it
        try:
            client.release(bs, refs)
        except KvfabricError as e:  # the session ended: the agent released them
            self.log.info("kvfabric: releasing %d blocks: %s", len(refs), e)

    def take_events(self) -> list[BlockEvent]:
        """The block events since the last call, in the order they happened
        (vLLM's take_events)."""
        with self._lock:
            out, self._events = self._events, []
        return out

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Wait until background lookups and registrations are done (tests,
        shutdown)."""
        deadline = time.monotonic() + timeout
        for ex in (self._pool, self._registrar):
            f = ex.submit(lambda: None)
            f.result(max(0.0, deadline - time.monotonic()))
        with self._lock:
            futs = [r.future for r in self._reqs.values() if r.future is not None]
        cf.wait(futs, max(0.0, deadline - time.monotonic()))

    def stats(self) -> dict[str, int]:
        return self.counters.snapshot()

    def _maybe_log_stats(self) -> None:
        iv = self.config.stats_interval
        if iv <= 0 or time.monotonic() - self._last_stats < iv:
            return
        self._last_stats = time.monotonic()
        s = self.stats()
        self.log.info(
            "kvfabric: hit %d tokens, loaded %d tokens (%d bytes), %d load errors, saved %d blocks, %d lookups",
            s["hit_tokens"], s["loaded_tokens"], s["loaded_bytes"], s["load_errors"], s["saved_blocks"], s["lookups"],
        )

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._registrar.shutdown(wait=True)
        with self._lock:
            for r in list(self._reqs.values()):
                self._drop(r)
        if self._own_client:
            self.client.close()


# -- the worker's half ------------------------------------------------------


def _is_torch(t: Any) -> bool:
    return type(t).__module__.split(".")[0] == "torch"


def _geometry(name: str, t: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], bool]:
    """A layer cache's first byte's address, shape, strides in bytes and
    whether it is in GPU memory: a numpy array, a torch tensor (CPU or
    CUDA), or an object with ``__cuda_array_interface__`` (GPU memory)."""
    if isinstance(t, np.ndarray):
        return t.ctypes.data, tuple(t.shape), tuple(t.strides), False
    if _is_torch(t):
        es = t.element_size()
        return t.data_ptr(), tuple(t.shape), tuple(x * es for x in t.stride()), bool(t.is_cuda)
    cai = getattr(t, "__cuda_array_interface__", None)
    if isinstance(cai, dict) and "shape" in cai and "data" in cai and "typestr" in cai:
        shape = tuple(int(x) for x in cai["shape"])
        strides = cai.get("strides")
        if strides is None:  # C-contiguous
            acc, out = np.dtype(cai["typestr"]).itemsize, []
            for n in reversed(shape):
                out.append(acc)
                acc *= n
            strides = tuple(reversed(out))
        return int(cai["data"][0]), shape, tuple(int(x) for x in strides), True
    raise InvalidArgument(f"layer {name}: a {type(t).__name__} is not a numpy array, a torch tensor or a CUDA array")


class _Layer:
    """One layer's cache seen as [blocks, planes, block_size, heads, dim].
    A 5-dimensional cache is FlashAttention's or FlashInfer's by where its
    K/V axis of 2 is; the kind given decides only when both axes are 2.
    ``addr`` and ``strides`` (bytes) locate that 5-dimensional view in
    memory, for copies through the CUDA driver; ``blocks`` is the view
    itself, for numpy arrays and torch tensors."""

    def __init__(self, name: str, t: Any, kind: CacheKind) -> None:
        self.name = name
        self.tensor = t
        self.torch = _is_torch(t)
        addr, shape, st, self.on_device = _geometry(name, t)
        ndim = len(shape)
        if kind is not CacheKind.MLA and ndim == 5:
            # Which of the two 5-dimensional shapes, from the K/V axis (the
            # engine's configuration names the backend only indirectly).
            if shape[0] == 2 and shape[1] != 2:
                kind = CacheKind.FLASH
            elif shape[1] == 2 and shape[0] != 2:
                kind = CacheKind.FLASHINFER
        self.kind = kind
        view = self.torch or isinstance(t, np.ndarray)
        self.blocks: Any = None
        if kind is CacheKind.FLASH:
            if ndim != 5 or shape[0] != 2:
                raise InvalidArgument(f"layer {name}: shape {shape} is not FlashAttention's [2, blocks, block_size, heads, head_dim]")
            if view:
                self.blocks = t.transpose(0, 1) if self.torch else t.transpose(1, 0, 2, 3, 4)
            self.shape = (shape[1], 2) + shape[2:]
            self.strides = (st[1], st[0]) + st[2:]
        elif kind is CacheKind.FLASHINFER:
            if ndim != 5 or shape[1] != 2:
                raise InvalidArgument(f"layer {name}: shape {shape} is not FlashInfer's [blocks, 2, block_size, heads, head_dim]")
            self.blocks = t if view else None
            self.shape, self.strides = shape, st
        else:
            if ndim != 3:
                raise InvalidArgument(f"layer {name}: shape {shape} is not MLA's [blocks, block_size, latent]")
            if view:
                self.blocks = t[:, None, :, None, :]
            self.shape = (shape[0], 1, shape[1], 1, shape[2])
            self.strides = (st[0], 0, st[1], 0, st[2])
        self.addr = addr


class WorkerSide:
    """One TP rank's half of a connector (see the module doc).

    kv_caches: layer name -> that layer's cache (numpy array or torch
    tensor, all of one shape and dtype), in spec.kind's shape; layers are
    ordered by the number in their names.
    """

    #: Seconds before a join that failed other than for good (_follow) is
    #: tried again.
    join_retry_interval = 1.0

    def __init__(
        self,
        config: ConnectorConfig,
        spec: KVSpec,
        rank: int,
        client: Client | None = None,
        *,
        engine: str = "engine",
        logger: logging.Logger | None = None,
    ) -> None:
        if not 0 <= rank < spec.tp_size:
            raise InvalidArgument(f"rank {rank} is not in 0..{spec.tp_size - 1}")
        self.config = config
        self.spec = spec
        self.rank = rank
        self.log = logger or log
        if client is None:
            name = f"{engine}-rank{rank}"
            try:
                client = Client(config.socket_path, engine=name, import_timeout=config.import_timeout)
            except KvfabricError as e:
                client = _absent(config, name, e, self.log)
            self._own_client = True
        else:
            self._own_client = False
        self.client = client
        self._retry_at = 0.0
        #: A client _reconnect opened in the background, taken up at the
        #: next step; whether one is being opened; whether the worker
        #: closed (one opened after is closed again). Under _connect_lock.
        self._connect_lock = threading.Lock()
        self._connected: Client | None = None
        self._connecting = False
        self._closed = False
        self._warned_at, self._warned_why = time.monotonic(), ""
        if isinstance(client, _NoAgent):
            self._warned_why = f"{type(client.why).__name__}: {client.why}"
        #: The scheduler's block set, joined with the first plan (_follow).
        self.block_set: BlockSet | None = None
        self.layers: list[_Layer] = []
        self._heads = 0
        #: The incarnation and join token a join failed with for good, not
        #: tried again: a plan with the set's renewed token is.
        self._join_failed: tuple[str, str] | None = None
        #: When a join that failed otherwise may be tried again.
        self._join_retry_at = 0.0
        #: Block sets whose join failed otherwise: the agent may have done
        #: it all the same (a deadline passed on the way back, or the
        #: memory could not be mapped), so each may be this session's;
        #: dropped when the worker follows another set.
        self._joined_maybe: set[int] = set()
        self._report: WorkerReport | None = None
        self._reported = 0  # the last step whose report was taken
        #: This rank's counters: loaded_blocks, loaded_bytes, load_errors,
        #: saved_blocks, saved_bytes (the slots it wrote).
        self.counters = Counters()
        self._loads: _LayerLoads | None = None
        #: Called in the loading thread before each layer's copies, with the
        #: layer's index (tests pause or fail loads there).
        self.before_layer: Callable[[int], None] | None = None

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        """Check the engine's caches against the spec; a mismatch is an error
        naming the layer and what differs. The block set is the scheduler's,
        joined with the first plan: a worker registers none of its own (with
        TP 8, eight sets of every rank's region before the scheduler's
        exists)."""
        if not kv_caches:
            raise InvalidArgument("no KV cache layers to register")
        names = sorted(kv_caches, key=layer_index)
        spec = self.spec
        layers = [_Layer(n, kv_caches[n], spec.kind) for n in names]
        first = layers[0]
        want_heads = self.spec.heads_per_rank()
        _, planes, bsz, heads, dim = first.shape
        problems = []
        if len(layers) != spec.layers:
            problems.append(f"{len(layers)} layers, spec has {spec.layers}")
        if bsz != spec.block_size:
            problems.append(f"block size {bsz}, spec has {spec.block_size}")
        if heads != want_heads:
            problems.append(f"{heads} heads per rank, spec gives {want_heads} ({spec.kv_heads} over TP {spec.tp_size})")
        if dim != spec.head_dim:
            problems.append(f"head dim {dim}, spec has {spec.head_dim}")
        if dtype_name(first.tensor) != DType.parse(spec.dtype, "dtype").name.lower():
            problems.append(f"dtype {first.tensor.dtype}, spec has {spec.dtype}")
        for ly in layers[1:]:
            if ly.shape != first.shape or ly.tensor.dtype != first.tensor.dtype or ly.kind is not first.kind:
                problems.append(f"layer {ly.name} is {ly.shape} {ly.tensor.dtype}, layer {first.name} {first.shape} {first.tensor.dtype}")
        if problems:
            raise InvalidArgument("kvfabric: the engine's KV caches do not match the connector's spec: " + "; ".join(problems))
        self.layers = layers
        self._heads = heads
        self.log.info("kvfabric: rank %d: %d layers %s checked; the scheduler's block set is joined with its first plan",
                      self.rank, len(layers), first.shape[1:])

    def _follow(self, plan: StepPlan) -> None:
        """Make the plan's block set this worker's: join it by the plan's
        join token where its own is another (or none: the first plan, or the
        agent restarted), then drop the one it had (after the join: the sets
        of a pool share its memory, which the join finds mapped, or opened,
        still). A set that cannot be joined for good (gone, its token
        refused, or its heads not this rank's) is not tried again for its
        incarnation and token (a plan with the set's renewed token is); one
        whose join failed otherwise (a deadline, say) is tried again at most
        once a second. Meanwhile the plan's loads fail, its saves are not
        written, and the set the worker had, no longer the scheduler's, is
        dropped all the same, with any other set a join that failed may have
        attached to its session."""
        bs = self.block_set
        want = plan.incarnation
        if not want or not plan.join_token or not self.layers or (bs is not None and incarnation(bs) == want):
            return
        if (want, plan.join_token) == self._join_failed:
            return
        now = time.monotonic()
        if now < self._join_retry_at:
            return
        # No longer the scheduler's: nothing of a plan goes to it (the
        # layer-by-layer loads into bs were waited for by _begin).
        self.block_set = None
        if bs is not None and bs.id == plan.block_set:
            # The same id in another run of the agent: dropped after the
            # join, it would take the joined set's memory along.
            self._drop(bs)
            bs = None
        try:
            self._join(plan, now)
        finally:
            if bs is not None:
                self._drop(bs)
            for other in sorted(self._joined_maybe - {plan.block_set}):
                self._drop(other)
            self._joined_maybe &= {plan.block_set}

    def _join(self, plan: StepPlan, now: float) -> None:
        """Join the plan's block set and make it this worker's (_follow)."""
        try:
            got = self.spec.register(self.client, self.config.slots, engine=self.client.engine,
                                     join=(plan.block_set, plan.join_token))
        except (PermissionDenied, InvalidArgument, NotFound) as e:
            # The agent's refusal, or the client's own after the agent
            # joined the set (its memory could not be mapped): dropped with
            # the next set followed, where the join was done.
            self._joined_maybe.add(plan.block_set)
            if e.method == "Register":
                self._give_up(plan, f"joining it failed: {e}")
            else:
                self._give_up(plan, f"it could not be joined, or its memory mapped: {e}")
            return
        except KvfabricError as e:
            self._join_retry_at = now + self.join_retry_interval
            self._joined_maybe.add(plan.block_set)
            self.log.warning("kvfabric: rank %d: joining the scheduler's block set %d failed, tried again with a later plan: %s",
                             self.rank, plan.block_set, e)
            return
        if incarnation(got) != plan.incarnation:
            self._give_up(plan, f"joining it got {incarnation(got)}, not the plan's {plan.incarnation}", got)
            return
        given = len(got.ranks[self.rank].head_ids)
        if given != self._heads:
            self._give_up(plan, f"it gives this rank {given} heads, its cache holds {self._heads}", got)
            return
        self.block_set = got
        self._joined_maybe.discard(got.id)
        self.log.info("kvfabric: rank %d: joined the scheduler's block set %d", self.rank, got.id)

    def _give_up(self, plan: StepPlan, why: str, joined: BlockSet | None = None) -> None:
        """The plan's block set cannot be this worker's, for why: it is not
        tried again for the plan's incarnation and token, and dropped where
        the join was done (joined)."""
        self._join_failed = (plan.incarnation, plan.join_token)
        self.log.error("kvfabric: rank %d: the scheduler's block set %d is not used, nor joined again with this token: %s",
                       self.rank, plan.block_set, why)
        if joined is not None:
            self._drop(joined)

    def _drop(self, bs: BlockSet | int) -> None:
        """Stop using bs (or the set of that id) under this worker's session
        (its memory goes back once no session uses it)."""
        try:
            self.client.drop_block_set(bs)
        except KvfabricError:
            pass  # the session, or the set, is gone already

    def _reconnect(self) -> None:
        """When the agent ended this worker's session (it restarted), or it
        was never opened, open a new client in the background, at most once
        a second (an agent that takes its time to answer holds no step), and
        take it up at the step after it is open; the next plan's block set
        (the scheduler's, registered again) is joined then (_follow). Until
        then loads fail (recomputed) and saves are dropped."""
        if self.client.session_alive or not self._own_client or not self.layers:
            return
        self.block_set = None
        with self._connect_lock:
            c, self._connected = self._connected, None
        if c is not None:
            old, self.client, self._join_failed, self._join_retry_at = self.client, c, None, 0.0
            self._joined_maybe.clear()  # the old session's, ended
            old.close()
            self.log.info("kvfabric: rank %d: reconnected to the agent; the next plan's block set is joined", self.rank)
            return
        now = time.monotonic()
        with self._connect_lock:
            if now < self._retry_at or self._connecting or self._closed:
                return
            self._retry_at, self._connecting = now + 1.0, True
        threading.Thread(target=self._connect_in_background, args=(self.client.engine, isinstance(self.client, _NoAgent)),
                         name=f"kvfabric-rank{self.rank}-connect", daemon=True).start()

    def _connect_in_background(self, engine: str, absent: bool) -> None:
        """_reconnect's new client, opened off the step's path."""
        c: Client | None = None
        try:
            c = Client(self.config.socket_path, engine=engine, import_timeout=self.config.import_timeout)
        except KvfabricError as e:
            if not absent or _warn_again(self, e, time.monotonic()):
                self.log.warning("kvfabric: rank %d: reconnecting to the agent failed: %s", self.rank, e)
        with self._connect_lock:
            self._connecting = False
            if c is not None and not self._closed:
                self._connected, c = c, None
            self._retry_at = time.monotonic() + 1.0  # a second from this try's end
        if c is not None:
            c.close()  # the worker closed meanwhile

    # Pool views of this rank, as [slots, layers, planes, block_size, heads, dim].
    def _pool(self) -> np.ndarray:
        assert self.block_set is not None
        v = self.block_set.rank(self.rank)
        return v.transpose(0, 1, 2, 4, 3, 5) if self.block_set.kv_order == KVOrder.HND else v

    def _begin(self, plan: StepPlan) -> WorkerReport:
        """What load, start_load and save do first with a plan of a step not
        reported yet: wait for the running layer-by-layer loads, open a new
        client where the agent ended the session (_reconnect), make the
        plan's block set the worker's (_follow). Returns the step's report."""
        self._finish_loads()
        self._reconnect()
        self._follow(plan)
        return self._report_for(plan)

    def _report_for(self, plan: StepPlan) -> WorkerReport:
        if self._report is None or self._report.step != plan.step:
            self._report = WorkerReport(plan.step)
        return self._report

    def load(self, plan: StepPlan) -> None:
        """Copy the plan's loads from the pool into the engine's blocks
        (vLLM's start_load_kv). Every block is first referenced under this
        worker's own session, by hash: a block the pool no longer holds, or
        a block set that is not the scheduler's, fails (named in the
        report), and nothing is copied for it or after it in its request."""
        if plan.step <= self._reported:
            return
        rep = self._begin(plan)
        for lp in plan.loads:
            self._load_one(lp, plan.incarnation, rep)

    def _load_one(self, lp: LoadPlan, plan_incarnation: str, rep: WorkerReport) -> None:
        got = self._acquire(lp, plan_incarnation, rep)
        if got is None:
            return
        bs, refs = got
        n = len(refs)
        try:
            self._copy_in([r.slot for r in refs], lp.block_ids[:n])
            rep.loaded_blocks += n
            rep.loaded_bytes += n * self._block_bytes()
        except Exception as e:
            rep.failed_requests.add(lp.req_id)
            rep.load_errors.update(lp.block_ids[:n])
            self.log.warning("kvfabric: rank %d: copying %d blocks failed, recomputed: %s", self.rank, n, e)
        finally:
            self._release(bs, refs)

    def _release(self, bs: BlockSet, refs: Any) -> None:
        """Gives a load's references back, waiting call_timeout: on the
        step's path. One not answered in time may leave the blocks referenced
        (cached, not recycled) until the session ends."""
        try:
            self.client.release(bs, refs, timeout=self.config.call_timeout)
        except KvfabricError as e:
            # The session is gone, and its references with it; or the
            # agent did not answer in time.
            self.log.info("kvfabric: rank %d: releasing %d loaded blocks: %s", self.rank, len(refs), e)

    def _acquire(self, lp: LoadPlan, plan_incarnation: str, rep: WorkerReport) -> tuple[BlockSet, Any] | None:
        """References on lp's blocks under this worker's session: the
        longest prefix the pool holds (the rest is named in rep), or None
        when there is nothing to copy."""
        bs = self.block_set
        if bs is None or incarnation(bs) != plan_incarnation or not self.layers:
            rep.failed_requests.add(lp.req_id)
            rep.load_errors.update(lp.block_ids)
            self.log.warning("kvfabric: rank %d: block set %s is not the scheduler's %s; %d blocks recomputed",
                             self.rank, incarnation(bs) if bs else None, plan_incarnation, len(lp.block_ids))
            return None
        try:
            refs = self.client.acquire(bs, lp.hashes, timeout=self.config.call_timeout)
        except KvfabricError as e:
            rep.failed_requests.add(lp.req_id)
            rep.load_errors.update(lp.block_ids)
            self.log.warning("kvfabric: rank %d: request %s: taking its %d blocks failed, recomputed: %s",
                             self.rank, lp.req_id, len(lp.hashes), e)
            return None
        n = len(refs)
        if n < len(lp.hashes):
            rep.failed_requests.add(lp.req_id)
            rep.load_errors.update(lp.block_ids[n:])
            why = next((r.reason for r in refs.results if not r.referenced), "")
            rep.gone.update(r.hash for r in refs.results if r.outcome is Outcome.MISSING)
            self.log.warning("kvfabric: rank %d: request %s: %d of %d blocks gone from the pool (%s), recomputed",
                             self.rank, lp.req_id, len(lp.hashes) - n, len(lp.hashes), why)
        return (bs, refs) if n else None

    def start_load(self, plan: StepPlan) -> None:
        """Layer-by-layer loads (vLLM's start_load_kv with ``layerwise``):
        takes the references on the plan's blocks here, then copies them in
        a thread, layer after layer; :meth:`wait_layer` waits for one layer.
        The references are released, and the step's report completed, once
        every layer is copied (save, take_report and load_errors wait)."""
        if plan.step <= self._reported:
            return
        rep = self._begin(plan)
        jobs = []
        for lp in plan.loads:
            got = self._acquire(lp, plan.incarnation, rep)
            if got is not None:
                bs, refs = got
                jobs.append(_LoadJob(lp, bs, refs))
        if jobs:
            self._loads = _LayerLoads(self, jobs, rep)

    def wait_layer(self, name: str) -> None:
        """Returns once the layer's copies of the running loads are done
        (vLLM's wait_for_layer_load); at once when none run."""
        loads = self._loads
        if loads is not None:
            loads.wait(name)

    def _finish_loads(self) -> None:
        loads, self._loads = self._loads, None
        if loads is not None:
            loads.finish()

    def _block_bytes(self) -> int:
        """Bytes of one block of this rank, all layers."""
        _, p, b, h, d = self.layers[0].shape
        assert self.block_set is not None
        return len(self.layers) * p * b * h * d * self.block_set.dtype.itemsize

    def _copy_in(self, slots: list[int], block_ids: list[int], layers: Sequence[int] | None = None) -> None:
        """Copies pool slots into engine blocks: every layer, or those named."""
        if self.block_set is not None and self.block_set.on_device:
            self._device_copy(slots, block_ids, into_engine=True, layers=layers)
            return
        self._host_only()
        pool = self._pool()
        for li in layers if layers is not None else range(len(self.layers)):
            ly = self.layers[li]
            if ly.torch:
                import torch

                src = pool[np.asarray(slots), li]  # [n, planes, block_size, heads, dim], gathered
                idx = torch.as_tensor(block_ids, dtype=torch.long, device=ly.blocks.device)
                raw = src.view(_RAW[src.itemsize])  # torch takes signed raw bits of any width
                t = torch.from_numpy(raw).view(ly.blocks.dtype).to(ly.blocks.device)
                ly.blocks.index_copy_(0, idx, t)
            else:
                # Block by block: one copy each, no gathered temporary.
                layer = pool[:, li]
                dst = ly.blocks
                for s, b in zip(slots, block_ids):
                    np.copyto(dst[b], layer[s].view(dst.dtype))

    def save(self, plan: StepPlan) -> None:
        """Copy the plan's saves from the engine's blocks into the pool slots
        it names (vLLM's wait_for_save, after the step's forward wrote them).
        A slot this rank could not write is named in the report, and the
        scheduler frees it instead of registering it."""
        if plan.step <= self._reported:
            # Reported already: the scheduler frees these slots, which this
            # rank must no longer write.
            return
        rep = self._begin(plan)
        bs = self.block_set
        same = bs is not None and incarnation(bs) == plan.incarnation
        for sp in plan.saves:
            if not same or not self.layers or sp.req_id in rep.failed_requests:
                continue
            try:
                self._copy_out(sp.block_ids, sp.slots)
                rep.saved_bytes += len(sp.slots) * self._block_bytes()
                for slot in sp.slots:
                    rep.saved[slot] = rep.saved.get(slot, 0) + 1
            except Exception as e:
                self.log.warning("kvfabric: rank %d: saving %d blocks failed: %s", self.rank, len(sp.slots), e)

    def _host_only(self) -> None:
        for ly in self.layers:
            if ly.blocks is None:
                raise InvalidArgument(f"layer {ly.name}: a CUDA array that is not a torch tensor moves only to and from a pool in GPU memory")

    def _device_copy(
        self, slots: list[int], block_ids: list[int], into_engine: bool, layers: Sequence[int] | None = None
    ) -> None:
        """Moves blocks between this rank's region of a block set in GPU
        memory and the engine's caches (in GPU memory: device to device; in
        host memory: through the driver too), with pitched copies in the
        pool GPU's context: per block and layer one copy of its planes where
        a plane's chunk is laid out in the engine as in the pool, else one
        per head (or per token, whichever is fewer) and plane. Returns once
        every byte moved."""
        bs = self.block_set
        assert bs is not None
        # A dropped set's device raises FailedPrecondition, naming the drop.
        rl, mem = bs.ranks[self.rank], bs.device[self.rank]
        if mem.closed:
            raise KvfabricError(f"block set {bs.id}: the pool's device memory is closed (the worker's client was closed)")
        n = self.layers[0].shape[0]
        for s in slots:
            if not 0 <= s < bs.slots:
                raise InvalidArgument(f"slot {s} is not in 0..{bs.slots - 1}")
        for b in block_ids:
            if not 0 <= b < n:
                raise InvalidArgument(f"engine block {b} is not in 0..{n - 1}")
        _, planes, page, heads, dim = self.layers[0].shape
        eb = bs.dtype.itemsize
        row = dim * eb
        pool_t, pool_h = (row, page * row) if bs.kv_order == KVOrder.HND else (heads * row, row)
        ops: list[cuda.Copy] = []

        def add(engine: int, engine_pitch: int, pool: int, pool_pitch: int, width: int, height: int) -> None:
            if height == 1:
                engine_pitch = pool_pitch = width
            if into_engine:
                ops.append(cuda.Copy(etype, engine, engine_pitch, cuda.DEVICE, pool, pool_pitch, width, height))
            else:
                ops.append(cuda.Copy(cuda.DEVICE, pool, pool_pitch, etype, engine, engine_pitch, width, height))

        for li in layers if layers is not None else range(len(self.layers)):
            ly = self.layers[li]
            e0, e1, e2, e3, e4 = ly.strides
            if e4 != eb or min(ly.strides) < 0:
                raise InvalidArgument(f"layer {ly.name}: strides {ly.strides} bytes: head_dim must be contiguous")
            etype = cuda.DEVICE if ly.on_device else cuda.HOST
            same = e2 == pool_t and (heads == 1 or e3 == pool_h)  # a chunk's bytes in the same order
            whole = same and planes > 1 and max(e1, rl.kv_stride) <= _MAX_PITCH and e1 >= rl.chunk_bytes
            for s, b in zip(slots, block_ids):
                pbase = mem.ptr + rl.offset + s * rl.block_stride + li * rl.layer_stride
                ebase = ly.addr + b * e0
                if whole:
                    add(ebase, e1, pbase, rl.kv_stride, rl.chunk_bytes, planes)
                    continue
                for p in range(planes):
                    pp, ep = pbase + p * rl.kv_stride, ebase + p * e1
                    if same:
                        add(ep, 0, pp, 0, rl.chunk_bytes, 1)
                    elif heads <= page:
                        for h in range(heads):
                            add(ep + h * e3, e2, pp + h * pool_h, pool_t, row, page)
                    else:
                        for t in range(page):
                            add(ep + t * e2, e3, pp + t * pool_t, pool_h, row, heads)
        mem.driver.copy_batch(mem.device, ops)

    def _copy_out(self, block_ids: list[int], slots: list[int]) -> None:
        if self.block_set is not None and self.block_set.on_device:
            self._device_copy(slots, block_ids, into_engine=False)
            return
        self._host_only()
        pool = self._pool()
        n = pool.shape[0]
        for s in slots:
            if not 0 <= s < n:
                raise InvalidArgument(f"slot {s} is not in 0..{n - 1}")
        for li, ly in enumerate(self.layers):
            if ly.torch:
                import torch

                idx = torch.as_tensor(block_ids, dtype=torch.long, device=ly.blocks.device)
                src = ly.blocks.index_select(0, idx).cpu()
                raw = src.view(_raw_torch(src.element_size())).numpy()
            else:
                raw = ly.blocks[np.asarray(block_ids)]
            pool[np.asarray(slots), li] = raw.view(pool.dtype)

    def take_report(self, step: int) -> WorkerReport:
        """This rank's report of the step (an empty one when it did nothing)."""
        self._finish_loads()
        rep = self._report if self._report is not None and self._report.step == step else WorkerReport(step)
        self._report = None
        self._reported = max(self._reported, step)
        for name, v in (("loaded_blocks", rep.loaded_blocks), ("loaded_bytes", rep.loaded_bytes),
                        ("load_errors", len(rep.load_errors)), ("saved_blocks", len(rep.saved)),
                        ("saved_bytes", rep.saved_bytes)):
            if v:
                self.counters.add(name, v)
        return rep

    def load_errors(self, step: int) -> set[int]:
        """The engine blocks whose load failed in the step (running
        layer-by-layer loads are waited for)."""
        self._finish_loads()
        return set(self._report.load_errors) if self._report is not None and self._report.step == step else set()

    def close(self) -> None:
        """Close the worker's client (when it opened it); twice is harmless."""
        self._finish_loads()
        self.block_set = None
        self.layers = []
        with self._connect_lock:
            self._closed = True
            pending, self._connected = self._connected, None
        if pending is not None:
            pending.close()
        if self._own_client:
            self.client.close()


@dataclass
class _LoadJob:
    lp: LoadPlan
    bs: BlockSet
    refs: Any
    failed: bool = False


class _LayerLoads:
    """One step's layer-by-layer loads of a worker: a thread copies every
    job's blocks of layer 0, then of layer 1, ...; a job whose copy fails
    copies no further layer, and its blocks are named for recompute."""

    def __init__(self, worker: WorkerSide, jobs: list[_LoadJob], rep: WorkerReport) -> None:
        self.worker, self.jobs, self.rep = worker, jobs, rep
        self.index = {ly.name: i for i, ly in enumerate(worker.layers)}
        self.done = [threading.Event() for _ in worker.layers]
        self.thread = threading.Thread(target=self._run, name=f"kvfabric-load-rank{worker.rank}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        w = self.worker
        try:
            for li in range(len(self.done)):
                for job in self.jobs:
                    if job.failed:
                        continue
                    n = len(job.refs)
                    try:
                        if w.before_layer is not None:
                            w.before_layer(li)
                        w._copy_in([r.slot for r in job.refs], job.lp.block_ids[:n], [li])
                    except Exception as e:
                        job.failed = True
                        w.log.warning("kvfabric: rank %d: copying layer %d of %d blocks failed, recomputed: %s",
                                      w.rank, li, n, e)
                self.done[li].set()
        finally:
            for ev in self.done:
                ev.set()

    def wait(self, name: str) -> None:
        i = self.index.get(name)
        if i is None:
            self.thread.join()  # a layer not registered: wait for all
        else:
            self.done[i].wait()

    def finish(self) -> None:
        """Waits for the thread, reports the jobs and releases their blocks."""
        self.thread.join()
        w, rep = self.worker, self.rep
        for job in self.jobs:
            n = len(job.refs)
            if job.failed:
                rep.failed_requests.add(job.lp.req_id)
                rep.load_errors.update(job.lp.block_ids[:n])
            else:
                rep.loaded_blocks += n
                rep.loaded_bytes += n * w._block_bytes()
            w._release(job.bs, job.refs)


_RAW = {1: np.int8, 2: np.int16, 4: np.int32}
#: The driver's largest pitch of a 2-D copy (CU_DEVICE_ATTRIBUTE_MAX_PITCH).
_MAX_PITCH = (1 << 31) - 1


def _raw_torch(element_size: int) -> Any:
    import torch

    return {1: torch.int8, 2: torch.int16, 4: torch.int32}[element_size]
