"""An engine stand-in that drives :mod:`kvfabric.connector` in vLLM's call
order, with its KV cache as numpy arrays in vLLM's shapes, and checks every
element of every computed token after every step.

The order is vLLM 0.33.0's (v1 engine, sync loads; see kvfabric.vllm for
where each call is made):

    schedule():
        for each waiting request (nothing computed yet):
            n = get_num_new_matched_tokens(request, local_hit)   # None: skip it this step
            allocate blocks for the hit and the new tokens
            update_state_after_alloc(request, blocks, n)
        for each running request: allocate blocks for its new tokens
        meta = build_connector_meta(scheduler_output)
    execute_model(), on every TP rank:
        bind_connector_metadata(meta)
        start_load_kv()                 # sync loads: before the forward;
                                        # layerwise: a thread copies layer after layer
        forward: per layer wait_for_layer_load(layer); attention writes
                 the new tokens' KV; save_kv_layer(layer, ...)
        wait_for_save()
        get_finished(); get_block_ids_with_load_errors(); build_connector_worker_meta()
        clear_connector_metadata()
    update_from_output():
        blocks that failed to load: their requests' computed tokens are cut
        back to the first failed block (recomputed next step)
        update_connector_output(output)  # worker metadata merged over the ranks
        finished requests: request_finished(request, block_ids), blocks freed

The "model" is a function of the tokens: the KV of position p is drawn from
a generator seeded by a running hash of tokens[:p+1], so it depends on the
whole prefix, as real KV does. A block loaded from the cluster must equal
what this engine would have computed, element for element.

With :class:`DeviceCaches`, the workers are given caches in GPU memory
(allocated through the CUDA driver, softcuda in the tests): the engine reads
them into its host arrays after the workers' loads and writes them back
before their saves.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import xxhash

from . import cuda
from .connector import CacheKind, ConnectorConfig, KVSpec, SchedulerSide, StepPlan, WorkerReport, WorkerSide

__all__ = ["DeviceArray", "DeviceCaches", "SimEngine", "SimRequest", "expected_kv"]

_pack = struct.Struct("<QI")


def _position_seeds(tokens: Sequence[int]) -> list[int]:
    seeds, h = [], 0
    for t in tokens:
        h = xxhash.xxh3_64_intdigest(_pack.pack(h, int(t)), 7)
        seeds.append(h)
    return seeds


def expected_kv(tokens: Sequence[int], spec: KVSpec) -> np.ndarray:
    """The KV this model computes for every position of tokens:
    [positions, layers, planes, kv_heads, head_dim] (MLA: one plane, one head)."""
    planes = 1 if spec.mla else 2
    heads = 1 if spec.mla else spec.kv_heads
    out = np.empty((len(tokens), spec.layers, planes, heads, spec.head_dim), dtype=np.float32)
    for p, s in enumerate(_position_seeds(tokens)):
        out[p] = np.random.default_rng(s).standard_normal(out.shape[1:], dtype=np.float32)
    return out.astype(_NP[spec.dtype])


_NP = {"f16": np.float16, "f32": np.float32}


class DeviceArray:
    """An array in GPU memory, allocated through the CUDA driver, that
    engines' caches stand in for: ``__cuda_array_interface__`` describes it
    (C-contiguous), ``read`` and ``write`` move all of it to and from a
    host array of its shape and dtype."""

    def __init__(self, driver: cuda.Driver, device: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.memory = driver.alloc(device, self.nbytes)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.memory.ptr, False), "strides": None, "version": 3}

    def write(self, src: np.ndarray) -> None:
        self.memory.write(0, np.ascontiguousarray(src, dtype=self.dtype))

    def read(self, out: np.ndarray) -> None:
        self.memory.read(0, out)

    def close(self) -> None:
        self.memory.close()


class DeviceCaches:
    """Engine caches in GPU memory: the workers are given
    :class:`DeviceArray` s, and the engine computes on host copies that it
    reads from the device after the workers' loads and writes back before
    their saves (so what a load put in the cache reaches the engine only
    through device memory, and a save reads only device memory)."""

    def __init__(self, driver: cuda.Driver, device: int = 0) -> None:
        self.driver, self.device = driver, device
        self.arrays: list[DeviceArray] = []

    def alloc(self, host: np.ndarray) -> DeviceArray:
        a = DeviceArray(self.driver, self.device, host.shape, host.dtype)
        self.arrays.append(a)
        a.write(host)
        return a

    def close(self) -> None:
        for a in self.arrays:
            a.close()
        self.arrays.clear()


@dataclass
class SimRequest:
    req_id: str
    tokens: list[int]
    max_new: int = 0
    salt: str | None = None
    lora: str | None = None
    computed: int = 0
    blocks: list[int] = field(default_factory=list)
    running: bool = False
    finished: bool = False
    #: Tokens the connector loaded (the last answer of the scheduler side).
    loaded: int = 0
    recomputed_blocks: int = 0
    preemptions: int = 0


class SimEngine:
    """One engine: a scheduler half, tp_size worker halves, and per rank a
    KV cache per layer in the shape of kind (numpy, the engine's own
    layout). socket: the agent's engine socket."""

    def __init__(
        self,
        socket: str,
        spec: KVSpec,
        *,
        num_blocks: int = 64,
        budget: int = 256,
        config: ConnectorConfig | None = None,
        kind: CacheKind | None = None,
        name: str = "sim",
        keep_finished: bool = True,
        device: DeviceCaches | None = None,
    ) -> None:
        self.spec = spec
        self.kind = kind or spec.kind
        self.config = config or ConnectorConfig(socket=socket, stats_interval=0)
        if not self.config.socket:
            self.config = dataclasses.replace(self.config, socket=socket)
        self.num_blocks = num_blocks
        self.budget = budget
        self.free = list(range(num_blocks))
        self.requests: dict[str, SimRequest] = {}
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.steps = 0
        self.steps_scheduled = 0
        self._cut: set[str] = set()
        #: Finished requests keep their blocks (so tests can check them)
        #: until release_finished.
        self.keep_finished = keep_finished
        self._kept: list[SimRequest] = []
        self.load_errors_seen: set[int] = set()
        self.caches: list[dict[str, np.ndarray]] = []
        #: With device caches: what the workers were given, per rank and layer.
        self.device = device
        self.device_caches: list[dict[str, DeviceArray]] = []
        self.scheduler = SchedulerSide(self.config, spec, engine=name)
        self.workers: list[WorkerSide] = []
        try:
            for r in range(spec.tp_size):
                caches = {f"model.layers.{i}.self_attn.attn": self._alloc_layer() for i in range(spec.layers)}
                w = WorkerSide(self.config, spec, r, engine=name)
                given: dict[str, Any] = caches
                if device is not None:
                    given = {k: device.alloc(v) for k, v in caches.items()}
                    self.device_caches.append(given)
                w.register_kv_caches(given)
                self.workers.append(w)
                self.caches.append(caches)
        except BaseException:
            self.close()
            raise
        #: Called with each step's plan before the workers run it, and
        #: after their loads, before the forward (failure tests kill or
        #: restart agents there).
        self.before_workers: Callable[[StepPlan], None] | None = None
        self.before_load: Callable[[StepPlan], None] | None = None

    def _alloc_layer(self) -> np.ndarray:
        s = self.spec
        h, b, d, n = s.heads_per_rank(), s.block_size, s.head_dim, self.num_blocks
        dt = _NP[s.dtype]
        shape: tuple[int, ...]
        # Garbage to start with: a load that copies nothing shows.
        if self.kind is CacheKind.FLASH:
            shape = (2, n, b, h, d)
        elif self.kind is CacheKind.FLASHINFER:
            shape = (n, 2, b, h, d)
        else:
            shape = (n, b, d)
        return np.full(shape, np.nan, dtype=dt)

    def _block_view(self, r: int, layer: str) -> np.ndarray:
        """[blocks, planes, block_size, heads, dim] of rank r's layer."""
        t = self.caches[r][layer]
        if self.kind is CacheKind.FLASH:
            return t.transpose(1, 0, 2, 3, 4)
        if self.kind is CacheKind.FLASHINFER:
            return t
        return t[:, None, :, None, :]

    def _heads(self, r: int) -> slice:
        if self.spec.mla:
            return slice(0, 1)
        h = self.spec.heads_per_rank()
        first = (r * h) % self.spec.kv_heads if self.spec.tp_size <= self.spec.kv_heads else r // (self.spec.tp_size // self.spec.kv_heads)
        return slice(first, first + h)

    # -- requests -------------------------------------------------------

    def add(self, req_id: str, tokens: Sequence[int], max_new: int = 2, salt: str | None = None, lora: str | None = None) -> SimRequest:
        r = SimRequest(req_id, list(tokens), max_new, salt, lora)
        self.requests[req_id] = r
        self.waiting.append(r)
        return r

    def preempt(self, req_id: str) -> None:
        """vLLM's preemption: the request's blocks are freed and it waits
        again with nothing computed (its connector state is asked anew)."""
        r = self.requests[req_id]
        if r.running:
            self.running.remove(r)
        elif r in self.waiting:
            self.waiting.remove(r)
        self.free.extend(r.blocks)
        r.blocks, r.computed, r.running, r.loaded = [], 0, False, 0
        r.preemptions += 1
        self.waiting.insert(0, r)

    def abort(self, req_id: str) -> None:
        r = self.requests[req_id]
        if r in self.waiting:
            self.waiting.remove(r)
        if r.running:
            self.running.remove(r)
        self._finish(r)

    def _finish(self, r: SimRequest) -> None:
        self.scheduler.finished(r.req_id)
        r.running, r.finished = False, True
        if self.keep_finished:
            self._kept.append(r)
        else:
            self.free.extend(r.blocks)
            r.blocks = []

    def release_finished(self) -> None:
        for r in self._kept:
            self.free.extend(r.blocks)
            r.blocks = []
        self._kept.clear()

    def _grow(self, r: SimRequest, tokens: int) -> bool:
        need = -(-tokens // self.spec.block_size) - len(r.blocks)
        if need > len(self.free):
            return False
        for _ in range(max(0, need)):
            r.blocks.append(self.free.pop(0))
        return True

    # -- one step -------------------------------------------------------

    def step(self) -> bool:
        """One engine step; False when nothing is left to do."""
        self.steps += 1
        budget = self.budget
        scheduled: dict[str, int] = {}
        for r in list(self.running):
            n = min(budget, len(r.tokens) - r.computed)
            if n <= 0 or not self._grow(r, r.computed + n):
                continue
            scheduled[r.req_id] = n
            budget -= n
        for r in list(self.waiting):
            if budget <= 0:
                break
            ext = self.scheduler.matched(r.req_id, r.tokens, 0, salt=r.salt, lora=r.lora)
            if ext is None:
                continue  # vLLM's skip_request: asked again next step
            n = min(budget, len(r.tokens) - ext)
            if not self._grow(r, ext + n):
                break  # vLLM stops admitting when blocks run out
            self.scheduler.allocated(r.req_id, r.blocks, ext)
            self.scheduler.track(r.req_id, r.tokens, ext, salt=r.salt, lora=r.lora)
            r.loaded = ext
            r.computed = ext
            self.waiting.remove(r)
            self.running.append(r)
            r.running = True
            scheduled[r.req_id] = n
            budget -= n
        if not scheduled and not self.waiting and not self.running:
            return False
        if scheduled:
            self.steps_scheduled += 1
        plan = self.scheduler.build(
            {rid: (self.requests[rid].blocks, self.requests[rid].computed + n) for rid, n in scheduled.items()}
        )
        # The workers.
        if self.before_workers is not None:
            self.before_workers(plan)
        for w in self.workers:
            if self.config.layerwise:
                w.start_load(plan)
            else:
                w.load(plan)
        if self.before_load is not None:
            self.before_load(plan)
        if self.config.layerwise:
            # vLLM's forward: each attention layer waits for its own loads.
            for li, name in enumerate(self._layer_names()):
                for w in self.workers:
                    w.wait_layer(name)
                self._pull(name)
                for rid, n in scheduled.items():
                    self._forward(self.requests[rid], n, layer=li)
        else:
            self._pull()
            for rid, n in scheduled.items():
                self._forward(self.requests[rid], n)
        self._push()
        reports = []
        for w in self.workers:
            w.save(plan)
            reports.append(w.take_report(plan.step))
        merged = reports[0]
        for rep in reports[1:]:
            merged = merged.merge(rep)
        # update_from_output.
        self._invalid(merged)
        for rid, n in scheduled.items():
            r = self.requests[rid]
            if rid in self._cut:
                continue
            r.computed += n
        self._cut = set()
        self.scheduler.report(merged)
        for r in list(self.running):
            if r.computed >= len(r.tokens):
                if r.max_new > 0:
                    r.tokens.append(int(_position_seeds(r.tokens)[-1] % 32000))
                    r.max_new -= 1
                else:
                    self.running.remove(r)
                    self._finish(r)
        return True

    def _layer_names(self) -> list[str]:
        return sorted(self.caches[0], key=lambda s: int(s.split(".")[2]))

    def _pull(self, layer: str | None = None) -> None:
        """Device caches: the host copies take what the device holds (of
        one layer, or all)."""
        for r, d in enumerate(self.device_caches):
            for k, a in d.items():
                if layer is None or k == layer:
                    a.read(self.caches[r][k])

    def _push(self) -> None:
        for r, d in enumerate(self.device_caches):
            for k, a in d.items():
                a.write(self.caches[r][k])

    def _invalid(self, rep: WorkerReport) -> None:
        """vLLM's _update_requests_with_invalid_blocks: a request holding a
        block that failed to load is cut back to before it."""
        bad = rep.load_errors
        if not bad:
            return
        self.load_errors_seen |= bad
        bs = self.spec.block_size
        for r in self.running:
            for i, b in enumerate(r.blocks):
                if b in bad and i * bs < r.computed + 0:
                    cut = i * bs
                    r.recomputed_blocks += -(-r.computed // bs) - i
                    r.computed = cut
                    self._cut.add(r.req_id)
                    break

    def _forward(self, r: SimRequest, n: int, layer: int | None = None) -> None:
        """Attention writes the KV of tokens [computed, computed+n), of one
        layer or all."""
        start = r.computed
        kv = expected_kv(r.tokens[: start + n], self.spec)[start:]
        bs = self.spec.block_size
        for rank in range(self.spec.tp_size):
            hs = self._heads(rank)
            for li, name in enumerate(sorted(self.caches[rank], key=lambda s: int(s.split(".")[2]))):
                if layer is not None and li != layer:
                    continue
                v = self._block_view(rank, name)
                for j in range(n):
                    p = start + j
                    v[r.blocks[p // bs], :, p % bs] = kv[j, li, :, hs]

    def run(self, timeout: float = 30.0) -> None:
        """Step until every request finished. A step that scheduled nothing
        (every waiting request's answer pending) idles a millisecond, as an
        engine's loop polls."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            before = self.steps_scheduled
            if not self.step():
                return
            if not self.waiting and not self.running:
                return
            if self.steps_scheduled == before:
                time.sleep(0.001)
        raise AssertionError(f"engine not done within {timeout} s: waiting {[r.req_id for r in self.waiting]}")

    # -- checks ---------------------------------------------------------

    def check(self, r: SimRequest, upto: int | None = None) -> int:
        """Every element of r's computed tokens, on every rank, equals what
        the model computes; returns the positions checked."""
        upto = r.computed if upto is None else upto
        if upto == 0:
            return 0
        self._pull()
        want = expected_kv(r.tokens[:upto], self.spec)
        bs = self.spec.block_size
        for rank in range(self.spec.tp_size):
            hs = self._heads(rank)
            for li, name in enumerate(sorted(self.caches[rank], key=lambda s: int(s.split(".")[2]))):
                v = self._block_view(rank, name)
                got = np.stack([v[r.blocks[p // bs], :, p % bs] for p in range(upto)])
                np.testing.assert_array_equal(got, want[:, li, :, hs], err_msg=f"{r.req_id} rank {rank} layer {li}")
        return upto

    def close(self) -> None:
        for w in self.workers:
            w.close()
        self.scheduler.close()
