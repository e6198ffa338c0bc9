"""kvfabric.vllm against vLLM 0.33.0 itself (CPU only): the class is a real
KVConnectorBase_V1, vLLM's factory builds it from a kv_transfer_config, and
vLLM's own Scheduler drives the scheduler side, step by step, with a worker
side whose KV caches are torch CPU tensors in FlashAttention's shape."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from kvfabric_test_agents import wait_for

import kvfabric
from kvfabric.connector import KVSpec
from kvfabric.harness import expected_kv

import vllm  # noqa: E402  (make engines-venv installs it; missing is a failure)

from vllm import SamplingParams  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from kvfabric.vllm import VLLM_VERSION, KVFabricConnector, KVFabricMetadata, model_namespace  # noqa: E402

BLOCK, LAYERS, HEADS, HEAD_DIM, NUM_BLOCKS = 16, 2, 2, 16, 64
LAYER_NAMES = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
SPEC = KVSpec(layers=LAYERS, kv_heads=HEADS, head_dim=HEAD_DIM, dtype="f32", tp_size=1, block_size=BLOCK)


def test_version_is_the_one_targeted():
    assert vllm.__version__ == VLLM_VERSION


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A model configuration vLLM reads from disk (no weights are loaded)."""
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": HEADS, "num_hidden_layers": LAYERS, "vocab_size": 32000,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float32", "head_dim": HEAD_DIM,
    }))
    return d


def model_hashes(model_dir: Path, tokens: list[int]) -> list[int]:
    """The block hashes the connector names tokens by: in the namespace of
    the model (ConnectorConfig.namespace "auto")."""
    ns = model_namespace(vllm_config(model_dir, "/unused"))
    return kvfabric.block_hashes(tokens, BLOCK, salt=ns)


def vllm_config(model_dir: Path, socket: str, policy: str = "recompute", **extra) -> VllmConfig:
    os.environ["HF_HUB_OFFLINE"] = "1"
    mc = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float32", seed=0, max_model_len=1024)
    return VllmConfig(
        model_config=mc,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=1024, is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=BLOCK, cache_dtype="auto", enable_prefix_caching=True),
        kv_transfer_config=KVTransferConfig(
            kv_connector="KVFabricConnector",
            kv_connector_module_path="kvfabric.vllm",
            kv_role="kv_both",
            kv_connector_extra_config={"socket": socket, "stats_interval": 0, **extra},
            kv_load_failure_policy=policy,
        ),
        device_config=DeviceConfig("cpu"),
    )


def kv_cache_config() -> KVCacheConfig:
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(LAYER_NAMES, FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=torch.float32))],
    )


class Engine:
    """vLLM's Scheduler with our connector inside (built by vLLM), and a
    worker-role connector over torch CPU caches [2, blocks, block, heads, dim]."""

    def __init__(self, cfg: VllmConfig) -> None:
        cfg.cache_config.num_gpu_blocks = NUM_BLOCKS
        init_none_hash(sha256)
        self.sched = Scheduler(
            vllm_config=cfg, kv_cache_config=kv_cache_config(),
            structured_output_manager=StructuredOutputManager(cfg), block_size=BLOCK, log_stats=True,
        )
        assert isinstance(self.sched.connector, KVFabricConnector)
        self.worker = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, kv_cache_config())
        assert isinstance(self.worker, KVFabricConnector)
        self.caches = {n: torch.full((2, NUM_BLOCKS, BLOCK, HEADS, HEAD_DIM), float("nan")) for n in LAYER_NAMES}
        self.worker.register_kv_caches(self.caches)
        self.hasher = get_request_block_hasher(BLOCK, sha256)
        self.requests: dict[str, Request] = {}
        self.invalid: set[int] = set()
        self.before_workers = None  # called with the step's plan

    def add(self, rid: str, tokens: list[int], salt: str | None = None, max_tokens: int = 1) -> Request:
        r = Request(rid, tokens, SamplingParams(max_tokens=max_tokens), None, cache_salt=salt, block_hasher=self.hasher)
        self.requests[rid] = r
        self.sched.add_request(r)
        return r

    def step(self) -> tuple:
        out = self.sched.schedule()
        meta = out.kv_connector_metadata
        assert isinstance(meta, KVFabricMetadata)
        w = self.worker
        if self.before_workers is not None:
            self.before_workers(meta.plan)
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        # The forward: every scheduled request's new tokens' KV.
        for rid, n in out.num_scheduled_tokens.items():
            r = self.requests[rid]
            # schedule() already counted the step's tokens as computed.
            start = r.num_computed_tokens - n
            kv = expected_kv(r.all_token_ids[: start + n], SPEC)[start:]
            blocks = self.sched.kv_cache_manager.get_block_ids(rid)[0]
            for li, name in enumerate(LAYER_NAMES):
                for j in range(n):
                    p = start + j
                    self.caches[name][:, blocks[p // BLOCK], p % BLOCK] = torch.from_numpy(kv[j, li])
            for li, name in enumerate(LAYER_NAMES):
                w.wait_for_layer_load(name)
                w.save_kv_layer(name, self.caches[name], None)
        w.wait_for_save()
        invalid = w.get_block_ids_with_load_errors()
        self.invalid |= invalid
        wmeta = w.build_connector_worker_meta()
        w.clear_connector_metadata()
        rids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(
            req_ids=rids, req_id_to_index={r: i for i, r in enumerate(rids)},
            sampled_token_ids=[[7] for _ in rids],
            kv_connector_output=KVConnectorOutput(invalid_block_ids=invalid, kv_connector_worker_meta=wmeta),
        )
        self.sched.update_from_output(out, mro)
        return out, meta.plan

    def run(self, rid: str, timeout: float = 30.0) -> dict:
        """Steps until rid is done; returns what each step loaded, saved
        and computed for it, and checks its KV at every step."""
        seen = {"loaded": 0, "saved": 0, "steps": 0, "first_computed": None, "checked": 0}
        r = self.requests[rid]

        def done() -> bool:
            out, plan = self.step()
            seen["steps"] += 1
            for lp in plan.loads:
                seen["loaded"] += len(lp.block_ids) * BLOCK
            for sp in plan.saves:
                seen["saved"] += len(sp.block_ids)
            if rid in out.num_scheduled_tokens and seen["first_computed"] is None:
                seen["first_computed"] = out.scheduled_new_reqs[0].num_computed_tokens if out.scheduled_new_reqs else 0
            if r.num_computed_tokens and not r.is_finished():
                self.check(r)  # vLLM cut a failed load's request back: what it counts is right
                seen["checked"] = max(seen["checked"], min(r.num_computed_tokens, r.num_prompt_tokens))
            return r.is_finished()

        wait_for(f"request {rid} finished", done, timeout=timeout, pause=0.001)
        return seen

    def check(self, r: Request) -> None:
        upto = min(r.num_computed_tokens, r.num_prompt_tokens)
        want = expected_kv(r.all_token_ids[:upto], SPEC)
        blocks = self.sched.kv_cache_manager.get_block_ids(r.request_id)[0]
        for li, name in enumerate(LAYER_NAMES):
            got = np.stack([self.caches[name][:, blocks[p // BLOCK], p % BLOCK].numpy() for p in range(upto)])
            np.testing.assert_array_equal(got, want[:, li], err_msg=f"{r.request_id} layer {li}")

    def close(self) -> None:
        self.worker.shutdown()
        self.sched.connector.shutdown()


def test_subclasses_the_real_base():
    assert issubclass(KVFabricConnector, KVConnectorBase_V1)
    # Every abstract method of vLLM's base is implemented.
    assert not getattr(KVFabricConnector, "__abstractmethods__", set())


def test_factory_builds_it_from_kv_transfer_config(node1, model_dir):
    cfg = vllm_config(model_dir, node1.socket)
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        c = KVConnectorFactory.create_connector(cfg, role, kv_cache_config())
        try:
            assert type(c) is KVFabricConnector and c.role == role
            assert c.spec == dataclasses.replace(SPEC, namespace=model_namespace(cfg))
        finally:
            c.shutdown()


def test_bad_extra_config_is_refused_with_its_name(node1, model_dir):
    cfg = vllm_config(model_dir, node1.socket, recompute_tokens_per_s="fast")
    with pytest.raises(kvfabric.InvalidArgument, match="recompute_tokens_per_s"):
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config())
    cfg = vllm_config(model_dir, node1.socket, sockets="/x")
    with pytest.raises(kvfabric.InvalidArgument, match="sockets"):
        KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config())


def test_real_scheduler_saves_then_another_engine_loads(node1, node2, model_dir):
    rng = random.Random(33)
    tokens = [rng.randrange(32000) for _ in range(4 * BLOCK + 5)]
    a = Engine(vllm_config(model_dir, node1.socket))
    b = None
    try:
        a.add("a", tokens)
        seen = a.run("a")
        assert seen["loaded"] == 0 and seen["saved"] == 4
        a.sched.connector.scheduler.wait_idle()
        assert a.sched.connector.stats()["saved_blocks"] == 4

        b = Engine(vllm_config(model_dir, node2.socket))
        c = b.sched.connector.scheduler.client
        hashes = model_hashes(model_dir, tokens)
        wait_for("node2 sees node1's blocks", lambda: any(o.blocks == 4 for o in c.lookup(hashes).overlaps))
        b.add("b", tokens)
        seen = b.run("b")
        # vLLM's scheduler took 4 blocks from the connector: the request's
        # first scheduled step started at token 64, and every element of
        # those tokens in the worker's torch cache is the model's.
        assert seen["loaded"] == 4 * BLOCK and seen["first_computed"] == 4 * BLOCK, seen
        assert b.invalid == set()
        s = b.sched.connector.stats()
        assert s["hit_tokens"] == 64 and s["loaded_blocks"] == 4 and s["load_errors"] == 0
        assert s["loaded_bytes"] == 4 * LAYERS * 2 * BLOCK * HEADS * HEAD_DIM * 4
        # The worker's counters reach vLLM's stats logging: the class vLLM
        # resolves from the kv_transfer_config rebuilds and reduces them.
        stats = b.worker.get_kv_connector_stats()
        assert stats is not None and stats.data["loaded_blocks"] == 4
        assert b.worker.get_kv_connector_stats() is None  # since the last call: nothing
        log = KVConnectorLogging(b.sched.vllm_config.kv_transfer_config)
        log.observe(stats.data)
        lines: list[str] = []
        log.log(lambda fmt, *a: lines.append(fmt % a))
        assert len(lines) == 1 and f"kvfabric_loaded_bytes={s['loaded_bytes']}" in lines[0], lines

        # Another salt is another namespace: nothing to load.
        b.add("salted", tokens, salt="tenant-2")
        assert b.run("salted")["loaded"] == 0
    finally:
        a.close()
        if b is not None:
            b.close()


def test_real_scheduler_recomputes_a_block_that_failed_to_load(node1, node2, model_dir):
    """A block the pool lost between the scheduler's import and the worker's
    copy: the worker names it, vLLM's scheduler (kv_load_failure_policy
    "recompute") cuts the request back and recomputes, and the request ends
    with the model's KV in every position."""
    rng = random.Random(34)
    tokens = [rng.randrange(32000) for _ in range(4 * BLOCK + 5)]
    a = Engine(vllm_config(model_dir, node1.socket))
    b = None
    try:
        a.add("a", tokens)
        a.run("a")
        a.sched.connector.scheduler.wait_idle()
        b = Engine(vllm_config(model_dir, node2.socket))
        c = b.sched.connector.scheduler.client
        hashes = model_hashes(model_dir, tokens)
        wait_for("node2 sees node1's blocks", lambda: any(o.blocks == 4 for o in c.lookup(hashes).overlaps))
        lost = []

        def lose(plan):
            for lp in plan.loads:
                if not lost:
                    # Block 1 lost; the worker copies nothing from it on.
                    lost.extend(lp.block_ids[1:])
                    lp.hashes[1] ^= 1

        b.before_workers = lose
        b.add("b", tokens, max_tokens=3)  # decode steps after the prompt: checked with it whole
        seen = b.run("b")
        assert lost and b.invalid == set(lost)
        assert seen["checked"] == len(tokens), seen
        s = b.sched.connector.stats()
        assert s["load_errors"] == 3 and s["loaded_blocks"] == 1, s
    finally:
        a.close()
        if b is not None:
            b.close()


def test_real_scheduler_publishes_the_connectors_kv_events(node1, node2, model_dir):
    """vLLM's scheduler publishes our events with its own: BlockStored for
    the blocks engine a saved (once registered, so the last arrive at the
    step after), and for the blocks engine b imported from node1."""
    from vllm.distributed.kv_events import BlockStored

    rng = random.Random(35)
    tokens = [rng.randrange(32000) for _ in range(3 * BLOCK + 5)]
    hashes = model_hashes(model_dir, tokens)[:3]

    def ours(engine: Engine) -> list:
        got: list = []
        engine.sched.kv_event_publisher.publish = lambda batch: got.extend(
            e for e in batch.events if getattr(e, "ownership", None) == "kvfabric")
        return got

    a = Engine(vllm_config(model_dir, node1.socket))
    b = None
    try:
        published = ours(a)
        a.add("a", tokens)
        a.run("a")
        a.sched.connector.scheduler.wait_idle()
        published.extend(a.sched.connector.take_events())  # registered after the last step
        assert all(isinstance(e, BlockStored) for e in published), published
        assert [e.block_hashes for e in published] == [[h] for h in hashes]
        assert [e.parent_block_hash for e in published] == [None] + hashes[:2]
        assert [e.token_ids for e in published] == [tokens[i * BLOCK : (i + 1) * BLOCK] for i in range(3)]
        assert {(e.block_size, e.medium, e.locality) for e in published} == {(BLOCK, "CPU", "LOCAL")}

        b = Engine(vllm_config(model_dir, node2.socket))
        published = ours(b)
        c = b.sched.connector.scheduler.client
        wait_for("node2 sees node1's blocks", lambda: any(o.blocks == 3 for o in c.lookup(hashes).overlaps))
        b.add("b", tokens)
        assert b.run("b")["loaded"] == 3 * BLOCK
        assert [e.block_hashes for e in published] == [[h] for h in hashes], published
        assert b.sched.connector.take_events() == ()
    finally:
        a.close()
        if b is not None:
            b.close()


def test_real_scheduler_layerwise_loads(node1, node2, model_dir):
    """"layerwise": true: vLLM's worker calls load layer by layer, and the
    loaded tokens in the torch cache are the model's."""
    rng = random.Random(37)
    tokens = [rng.randrange(32000) for _ in range(4 * BLOCK + 3)]
    a = Engine(vllm_config(model_dir, node1.socket))
    b = None
    try:
        a.add("a", tokens)
        a.run("a")
        a.sched.connector.scheduler.wait_idle()
        b = Engine(vllm_config(model_dir, node2.socket, layerwise=True))
        assert b.worker.config.layerwise
        c = b.sched.connector.scheduler.client
        hashes = model_hashes(model_dir, tokens)[:4]
        wait_for("node2 sees node1's blocks", lambda: any(o.blocks == 4 for o in c.lookup(hashes).overlaps))
        b.add("b", tokens, max_tokens=3)  # running after its first step: the cache is checked then
        seen = b.run("b")
        assert seen["loaded"] == 4 * BLOCK and seen["first_computed"] == 4 * BLOCK, seen
        assert b.invalid == set() and seen["checked"] == len(tokens), seen
        assert b.sched.connector.stats()["loaded_blocks"] == 4
    finally:
        a.close()
        if b is not None:
            b.close()


def test_the_namespace_names_the_model_its_quantization_and_kv_dtype(model_dir):
    """Engines share blocks only under the same model, revision,
    quantization and KV cache dtype (fp8 formats alike in memory too)."""
    base = vllm_config(model_dir, "/unused")
    ns = model_namespace(base)
    assert str(model_dir) in ns
    other = vllm_config(model_dir, "/unused")
    other.cache_config.cache_dtype = "fp8_e5m2"
    assert model_namespace(other) != ns
    other = vllm_config(model_dir, "/unused")
    other.model_config.revision = "v2"
    assert model_namespace(other) != ns
    assert model_namespace(vllm_config(model_dir, "/unused")) == ns


def test_pipeline_and_context_parallelism_are_refused(node1, model_dir):
    for what in ("pipeline_parallel_size", "decode_context_parallel_size"):
        cfg = vllm_config(model_dir, node1.socket)
        setattr(cfg.parallel_config, what, 2)
        with pytest.raises(kvfabric.InvalidArgument, match=what):
            KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, kv_cache_config())


def test_multimodal_and_embedding_requests_are_neither_loaded_nor_saved(node1, model_dir):
    """Their KV depends on more than the token ids that name blocks: the
    connector answers 0 and tracks nothing of theirs to save, where a plain
    request of the same tokens is tracked."""
    from types import SimpleNamespace

    c = KVConnectorFactory.create_connector(vllm_config(model_dir, node1.socket), KVConnectorRole.SCHEDULER, kv_cache_config())
    try:
        tokens = list(range(4 * BLOCK + 1))
        kinds = {"mm": {"mm_features": [object()]}, "emb": {"prompt_embeds": torch.zeros(1)}, "plain": {}}
        new = []
        for rid, extra in kinds.items():
            req = SimpleNamespace(request_id=rid, prompt_token_ids=tokens, lora_request=None, cache_salt=None, **extra)
            if rid != "plain":
                assert c.get_num_new_matched_tokens(req, 0) == (0, False)
            new.append(SimpleNamespace(req_id=rid, block_ids=(list(range(5)),), prompt_token_ids=tokens, num_computed_tokens=0, **extra))
        out = SimpleNamespace(
            scheduled_new_reqs=new, num_scheduled_tokens={r.req_id: len(tokens) for r in new}, finished_req_ids=set(),
            scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[]),
        )
        c.build_connector_meta(out)
        assert set(c.scheduler._saving) == {"plain"}
    finally:
        c.shutdown()


def test_real_engine_starts_without_its_agent_and_connects_later(node1, model_dir, tmp_path):
    """vLLM starts while its agent's socket is not there yet (require_agent
    false, the default): it serves, saving nothing; once the socket is
    there, the connector connects and the engine's next prompt is saved."""
    sock = str(tmp_path / "later.sock")
    a = Engine(vllm_config(model_dir, sock))
    try:
        conn = a.sched.connector
        assert conn.scheduler.block_set is None
        rng = random.Random(41)
        a.add("early", [rng.randrange(32000) for _ in range(3 * BLOCK + 2)])
        seen = a.run("early")
        assert seen["loaded"] == 0 and seen["saved"] == 0
        os.symlink(node1.socket + ".fd", sock + ".fd")  # the memory's descriptor socket beside it
        os.symlink(node1.socket, sock)
        n = 0

        def connected() -> bool:
            nonlocal n
            n += 1
            a.add(f"probe{n}", [rng.randrange(32000) for _ in range(BLOCK + 1)])
            a.run(f"probe{n}")
            return conn.scheduler.block_set is not None

        wait_for("the connector connected once the agent's socket was there", connected)
        a.add("later", [rng.randrange(32000) for _ in range(3 * BLOCK + 2)])
        seen = a.run("later")
        assert seen["saved"] == 3, seen
        conn.scheduler.wait_idle()
        assert conn.stats()["save_errors"] == 0
    finally:
        a.close()
