"""vLLM's KV connector for kvfabric: ``KVFabricConnector``.

Targets vLLM 0.33.0 (``KVConnectorBase_V1`` of
``vllm/distributed/kv_transfer/kv_connector/v1/base.py``). Importing this
module imports vLLM; ``import kvfabric`` does not. Enable it with

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "KVFabricConnector",
        "kv_connector_module_path": "kvfabric.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/var/lib/kvfabric/engine.sock",
                                      "recompute_tokens_per_s": 20000}}'

With ``kv_load_failure_policy`` "recompute" vLLM recomputes the blocks a load
could not bring (its default, "fail", ends the request).
``kv_connector_extra_config`` takes :class:`kvfabric.connector.ConnectorConfig`'s
settings, plus ``kv_order`` ("nhd" or "hnd": how the agent's pool orders a
block, not the engine's cache; every engine of a cluster that should share
blocks without re-sharding picks the same).

The logic is :mod:`kvfabric.connector`'s; this class translates vLLM's calls.
vLLM 0.33.0 calls it in this order (scheduler: ``v1/core/sched/scheduler.py``;
worker: ``v1/worker/kv_connector_model_runner_mixin.py``):

    Scheduler.schedule()
      waiting request with nothing computed:
        get_num_new_matched_tokens(request, block-aligned local hit)
            -> (tokens, False) | (None, False): None skips the request this step
        update_state_after_alloc(request, blocks, num_external_tokens)
      build_connector_meta(scheduler_output)            -> StepPlan
    Worker.execute_model(), every TP rank:
      bind_connector_metadata(meta)
      start_load_kv(forward_context)                    sync loads: before the forward
      per attention layer: wait_for_layer_load(name), save_kv_layer(name, kv, attn_metadata)
      wait_for_save()                                   the step's saves are copied here
      get_finished(finished_req_ids), get_block_ids_with_load_errors(),
      build_connector_worker_meta()                     -> this rank's WorkerReport
      clear_connector_metadata()
    Scheduler.update_from_output()
      invalid_block_ids -> the requests are cut back and recomputed
      update_connector_output(output)                   the ranks' reports, aggregated
      request_finished(request, block_ids)              -> (False, None)
      take_events()                                     BlockStored / BlockRemoved

Loads are synchronous (the agent imports while get_num_new_matched_tokens
answers None; the worker's copy from the pool precedes the forward), or with
``"layerwise": true`` layer by layer: start_load_kv takes the blocks'
references and a thread copies layer after layer, wait_for_layer_load waits
for its layer, and get_block_ids_with_load_errors (after the forward) waits
for all. Saves
are copied in wait_for_save, within the step, so request_finished never
needs to delay freeing. Counters (hit tokens, loaded bytes, load errors...)
are logged through vLLM's logger every ``stats_interval`` seconds and
returned by :meth:`KVFabricConnector.stats`.

Only models with one KV cache group of full attention (or MLA), under
tensor parallelism alone, are supported; others (and pipeline or context
parallelism) are refused at start with the reason. Blocks are named by
their tokens' hashes in the model's namespace (``namespace``: "auto" is
the model, revision, quantization and KV cache dtype); requests with
multimodal inputs or prompt embeddings are neither loaded nor saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_events import MEDIUM_CPU, MEDIUM_GPU, BlockRemoved, BlockStored
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.logger import init_logger

from .connector import CacheKind, ConnectorConfig, KVSpec, SchedulerSide, StepPlan, WorkerReport, WorkerSide, dtype_name
from .errors import InvalidArgument

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

__all__ = ["KVFabricConnector", "KVFabricMetadata", "KVFabricStats", "KVFabricWorkerMetadata", "spec_from_vllm"]

logger = init_logger(__name__)

#: vLLM's version this connector is written against.
VLLM_VERSION = "0.33.0"
#: The ownership of the KV cache events the connector reports.
EVENT_OWNERSHIP = "kvfabric"


class KVFabricMetadata(KVConnectorMetadata):
    """One step's plan, scheduler to workers."""

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan


class KVFabricWorkerMetadata(KVConnectorWorkerMetadata):
    """One rank's report of a step, workers to scheduler (aggregated)."""

    def __init__(self, report: WorkerReport) -> None:
        self.report = report

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, KVFabricWorkerMetadata)
        return KVFabricWorkerMetadata(self.report.merge(other.report))


def spec_from_vllm(
    vllm_config: "VllmConfig", kv_cache_config: "KVCacheConfig", kv_order: str = "nhd", namespace: str = "auto"
) -> KVSpec:
    """The KV cache kvfabric registers, from vLLM's configuration: the layers
    of the (single) KV cache group, the model's total KV heads, the TP size
    and vLLM's block size, and the hash namespace ("auto": the model's,
    model_namespace). Pipeline and context parallelism are refused."""
    groups = kv_cache_config.kv_cache_groups
    if len(groups) != 1:
        raise InvalidArgument(
            f"kvfabric connector: {len(groups)} KV cache groups (a hybrid model); only one group of full attention is supported"
        )
    g = groups[0]
    s = g.kv_cache_spec
    if not hasattr(s, "num_kv_heads"):
        raise InvalidArgument(f"kvfabric connector: KV cache spec {type(s).__name__} is not attention")
    mla = type(s).__name__.startswith("MLA")
    par = vllm_config.parallel_config
    for what in ("pipeline_parallel_size", "decode_context_parallel_size", "prefill_context_parallel_size"):
        if getattr(par, what, 1) > 1:
            # Each stage or shard holds a part of a block that the pool's
            # layout (layers and heads over TP ranks) cannot tell apart.
            raise InvalidArgument(f"kvfabric connector: {what}={getattr(par, what)}; only tensor parallelism is supported")
    tp = par.tensor_parallel_size
    heads = 1 if mla else vllm_config.model_config.get_total_num_kv_heads()
    import torch

    return KVSpec(
        layers=len(g.layer_names),
        kv_heads=heads,
        head_dim=s.head_size,
        dtype=dtype_name(torch.empty(0, dtype=s.dtype)),
        tp_size=tp,
        block_size=s.block_size,
        kind=CacheKind.MLA if mla else CacheKind.FLASH,
        kv_order=kv_order,
        namespace=model_namespace(vllm_config) if namespace == "auto" else namespace,
    )


def model_namespace(vllm_config: "VllmConfig") -> str:
    """The hash namespace of an engine's blocks (ConnectorConfig.namespace
    "auto"): its model and revision, quantization and KV cache dtype. Two
    engines share blocks only where all four are the same: models of one
    KV shape (a base model and its fine-tune) never load each other's, nor
    do fp8 caches of different formats (vLLM keeps each as bytes)."""
    m = vllm_config.model_config
    parts = (
        f"model={m.model}",
        f"revision={getattr(m, 'revision', None) or ''}",
        f"quantization={getattr(m, 'quantization', None) or ''}",
        f"kv_cache_dtype={getattr(vllm_config.cache_config, 'cache_dtype', None) or 'auto'}",
    )
    return "vllm;" + ";".join(parts)


def _config(vllm_config: "VllmConfig") -> tuple[ConnectorConfig, str]:
    extra = dict(vllm_config.kv_transfer_config.kv_connector_extra_config or {})
    kv_order = extra.pop("kv_order", "nhd")
    if kv_order not in ("nhd", "hnd"):
        raise InvalidArgument(f"kvfabric connector: kv_order={kv_order!r} is not nhd or hnd")
    return ConnectorConfig.from_dict(extra), kv_order


@dataclass
class KVFabricStats(KVConnectorStats):
    """The workers' counters since the last report, summed over the ranks
    (vLLM logs them with its periodic stats): loaded_blocks, loaded_bytes,
    load_errors, saved_blocks, saved_bytes."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        out = dict(self.data)
        for k, v in other.data.items():
            out[k] = out.get(k, 0) + v
        return KVFabricStats(data=out)

    def reduce(self) -> dict[str, int | float]:
        return {f"kvfabric_{k}": v for k, v in sorted(self.data.items())}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class KVFabricConnector(KVConnectorBase_V1):
    """kvfabric as a vLLM KV connector (see the module doc)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig") -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.config, kv_order = _config(vllm_config)
        self.spec = spec_from_vllm(vllm_config, kv_cache_config, kv_order, self.config.namespace)
        name = f"vllm-{vllm_config.kv_transfer_config.engine_id or 'engine'}"
        self.scheduler: SchedulerSide | None = None
        self.worker: WorkerSide | None = None
        # Scheduler side: per request, its engine block ids as the scheduler
        # outputs say them, and its salt and LoRA.
        self._blocks: dict[str, list[int]] = {}
        self._ns: dict[str, tuple[str | None, str | None]] = {}
        self._stats_sent: dict[str, int] = {}
        #: Requests neither loaded nor saved: their KV depends on more than
        #: their token ids (multimodal inputs, prompt embeddings).
        self._skip: set[str] = set()
        if role == KVConnectorRole.SCHEDULER:
            self.scheduler = SchedulerSide(self.config, self.spec, engine=name, logger=logger)
        else:
            self.worker = WorkerSide(self.config, self.spec, _tp_rank(), engine=name, logger=logger)

    # -- scheduler side -------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self.scheduler is not None
        if _unhashable(request):
            self._skip.add(request.request_id)
            return 0, False
        salt = getattr(request, "cache_salt", None)
        lora = request.lora_request.lora_name if getattr(request, "lora_request", None) else None
        self._ns[request.request_id] = (salt, lora)
        n = self.scheduler.matched(request.request_id, request.prompt_token_ids or [], num_computed_tokens, salt=salt, lora=lora)
        return n, False

    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int) -> None:
        assert self.scheduler is not None
        ids = blocks.get_block_ids()
        self.scheduler.allocated(request.request_id, list(ids[0]) if ids else [], num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        assert self.scheduler is not None
        n_sched = scheduler_output.num_scheduled_tokens
        scheduled: dict[str, tuple[list[int], int]] = {}
        for r in scheduler_output.scheduled_new_reqs:
            self._blocks[r.req_id] = list(r.block_ids[0]) if r.block_ids else []
            salt, lora = self._ns.get(r.req_id, (None, None))
            if r.prompt_token_ids and r.req_id not in self._skip and not _unhashable(r):
                self.scheduler.track(r.req_id, r.prompt_token_ids, r.num_computed_tokens, salt=salt, lora=lora)
            scheduled[r.req_id] = (self._blocks[r.req_id], r.num_computed_tokens + n_sched.get(r.req_id, 0))
        c = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(c.req_ids):
            new = c.new_block_ids[i]
            if rid in c.resumed_req_ids or rid not in self._blocks:
                self._blocks[rid] = list(new[0]) if new else []
            elif new:
                self._blocks[rid].extend(new[0])
            scheduled[rid] = (self._blocks[rid], c.num_computed_tokens[i] + n_sched.get(rid, 0))
        for rid in scheduler_output.finished_req_ids:
            self._blocks.pop(rid, None)
            self._skip.discard(rid)
        return KVFabricMetadata(self.scheduler.build(scheduled))

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        assert self.scheduler is not None
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, KVFabricWorkerMetadata):
            self.scheduler.report(meta.report)

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self.scheduler is not None
        self.scheduler.finished(request.request_id)
        self._ns.pop(request.request_id, None)
        self._skip.discard(request.request_id)
        return False, None  # saves were copied within their step

    def take_events(self):  # noqa: ANN201 - vLLM's Iterable[KVCacheEvent]
        """The node's pool's changes the connector made or saw since the
        last call, as vLLM's KV cache events (published with the
        scheduler's own): BlockStored for each block saved, or imported
        from another node by a load, once registered; BlockRemoved for a
        block a worker found gone. One block per event, hashed with
        kvfabric's recipe (parent: the previous block's hash), medium CPU
        (GPU for a pool in GPU memory), locality LOCAL, ownership
        "kvfabric"."""
        if self.scheduler is None:
            return ()
        events = self.scheduler.take_events()
        if not events:
            return ()
        bs = self.scheduler.block_set
        medium = MEDIUM_GPU if bs is not None and bs.on_device else MEDIUM_CPU
        out = []
        for e in events:
            if e.stored:
                out.append(BlockStored(
                    block_hashes=[e.hash], parent_block_hash=e.parent, token_ids=list(e.tokens),
                    block_size=self.spec.block_size, lora_id=None, medium=medium, lora_name=e.lora,
                    locality="LOCAL", ownership=EVENT_OWNERSHIP,
                ))
            else:
                out.append(BlockRemoved(block_hashes=[e.hash], medium=medium, locality="LOCAL", ownership=EVENT_OWNERSHIP))
        return out

    # -- worker side ----------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        assert self.worker is not None
        self.worker.register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        assert self.worker is not None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVFabricMetadata)
        if self.config.layerwise:
            self.worker.start_load(meta.plan)
        else:
            self.worker.load(meta.plan)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """With ``layerwise``, waits for this layer's copies; else start_load_kv copied every layer."""
        if self.worker is not None:
            self.worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: Any, **kwargs: Any) -> None:
        return  # the step's blocks are copied in wait_for_save

    def wait_for_save(self) -> None:
        assert self.worker is not None
        if not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVFabricMetadata)
        self.worker.save(meta.plan)

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self.worker is None or not self.has_connector_metadata():
            return set()
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVFabricMetadata)
        return self.worker.load_errors(meta.plan.step)

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self.worker is None or not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVFabricMetadata)
        # After this, the step's saves are no longer written: a save vLLM
        # defers past the report is dropped, and the scheduler frees its slots.
        return KVFabricWorkerMetadata(self.worker.take_report(meta.plan.step))

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        """This rank's counters since the last call (vLLM aggregates the
        ranks and logs them)."""
        if self.worker is None:
            return None
        now = self.worker.counters.snapshot()
        delta = {k: v - self._stats_sent.get(k, 0) for k, v in now.items() if v - self._stats_sent.get(k, 0)}
        self._stats_sent = now
        return KVFabricStats(data=delta) if delta else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return KVFabricStats(data=dict(data or {}))

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.close()
        if self.scheduler is not None:
            self.scheduler.close()

    def stats(self) -> dict[str, int]:
        """The scheduler side's counters (hit_tokens, loaded_bytes, load_errors...)."""
        return self.scheduler.stats() if self.scheduler is not None else {}


def _unhashable(request: Any) -> bool:
    """Whether a request's KV depends on more than its token ids, which
    are all that name a block: multimodal inputs (their placeholder tokens
    are alike for every image) or prompt embeddings."""
    return bool(getattr(request, "mm_features", None)) or getattr(request, "prompt_embeds", None) is not None


def _tp_rank() -> int:
    """This worker's TP rank (0 when vLLM's groups are not set up)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank()
    except (AssertionError, AttributeError, ImportError):
        return 0
