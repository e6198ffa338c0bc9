"""The connector's two halves driven in vLLM's call order by the harness,
against two real agents; every element of every computed token checked."""

from __future__ import annotations

import dataclasses
import os
import random
import threading
import time

import numpy as np
import pytest

import kvfabric
from conftest import wait_for
from kvfabric.connector import CacheKind, ConnectorConfig, KVSpec, StepPlan, incarnation
from kvfabric.harness import SimEngine

SPEC = KVSpec(layers=2, kv_heads=4, head_dim=16, dtype="f32", tp_size=1, block_size=16)


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(32000) for _ in range(n)]


def wait_indexed(engine: SimEngine, tokens: list[int], blocks: int, salt=None) -> None:
    """Until the engine's agent sees some node holding blocks of tokens."""
    c = engine.scheduler.client
    hashes = kvfabric.block_hashes(tokens, engine.spec.block_size, salt=salt)[:blocks]
    wait_for("blocks indexed", lambda: any(o.blocks >= blocks for o in c.lookup(hashes).overlaps))


@pytest.mark.parametrize("kind", [CacheKind.FLASH, CacheKind.FLASHINFER])
def test_second_engine_loads_first_engines_prefix(node1, node2, kind):
    spec = KVSpec(**{**SPEC.__dict__, "kind": kind, "kv_order": "hnd" if kind is CacheKind.FLASHINFER else "nhd"})
    tokens = prompt(5 * 16 + 7, seed=kind.value.__hash__() & 0xFFFF)
    a = SimEngine(node1.socket, spec, name="engine-a")
    b = SimEngine(node2.socket, spec, name="engine-b")
    try:
        ra = a.add("a1", tokens)
        a.run()
        assert ra.loaded == 0 and a.check(ra) == len(ra.tokens)
        a.scheduler.wait_idle()
        assert a.scheduler.stats()["saved_blocks"] == 5
        wait_indexed(b, tokens, 5)

        rb = b.add("b1", tokens[:-3] + [1, 2, 3])  # the same 5 full blocks, another tail
        b.run()
        # 5 full blocks are held; the prompt's last block is never loaded whole.
        assert rb.loaded == 5 * 16, b.scheduler.stats()
        assert b.check(rb) == len(rb.tokens)
        s = b.scheduler.stats()
        assert s["hit_tokens"] == 80 and s["loaded_tokens"] == 80 and s["loaded_blocks"] == 5
        assert s["loaded_bytes"] == 5 * 2 * 2 * 16 * 4 * 16 * 4 and s["load_errors"] == 0
    finally:
        a.close()
        b.close()


# -- failures: the engine is told, and nothing wrong lands in its cache -----


@pytest.fixture
def pair(kvfabric_bin, tmp_path):
    """Two fresh agents of their own, for tests that kill or restart them."""
    from conftest import Agent

    net = f"127.{random.randint(10, 209)}.{random.randint(1, 250)}."
    a = Agent("holder", net + "1", tmp_path, kvfabric_bin)
    b = Agent("reader", net + "2", tmp_path, kvfabric_bin)
    try:
        a.start()
        b.start(join=a.gossip)
        with b.client() as c:
            wait_for("both alive", lambda: sum(m.state == "alive" for m in c.status().members) == 2)
        yield a, b
    finally:
        b.stop()
        a.stop()


def stored(agent, tokens: list[int], spec: KVSpec = SPEC) -> None:
    """An engine on agent computes tokens and saves their full blocks."""
    e = SimEngine(agent.socket, spec, name="writer")
    try:
        r = e.add("w", tokens)
        e.run()
        e.check(r)
        e.scheduler.wait_idle()
        assert e.scheduler.stats()["saved_blocks"] == len(tokens) // spec.block_size
    finally:
        e.close()


def session_refs(engine: SimEngine) -> int:
    c = engine.scheduler.client
    return next(s.refs for s in c.status().sessions if s.id == c.session)


def test_holder_killed_between_lookup_and_import(pair):
    holder, reader = pair
    tokens = prompt(6 * 16 + 1, seed=11)
    stored(holder, tokens)
    e = SimEngine(reader.socket, SPEC, name="reader")
    try:
        wait_indexed(e, tokens, 6)
        killed = []

        def kill(found):
            if not killed:
                assert found.best().blocks == 6
                holder.proc.kill()
                holder.proc.wait(10)
                killed.append(True)

        e.scheduler.before_import = kill
        r = e.add("r", tokens)
        e.run(timeout=60)
        assert killed and r.loaded == 0
        assert e.check(r) == len(r.tokens)  # all computed, every element right
        s = e.scheduler.stats()
        assert s["loaded_blocks"] == 0 and s["import_errors"] + s["lookup_errors"] >= 1, s
        e.scheduler.wait_idle()  # registration runs in the background
        assert session_refs(e) == 0  # what it saved is released to the cache
    finally:
        e.close()


def test_own_agent_restarted_before_the_workers_copy(pair):
    holder, reader = pair
    tokens = prompt(4 * 16 + 3, seed=12)
    stored(holder, tokens)
    e = SimEngine(reader.socket, SPEC, name="reader")
    try:
        wait_indexed(e, tokens, 4)
        restarted = []

        def restart(plan):
            if plan.loads and not restarted:
                reader.stop()
                reader.start(join=holder.gossip)
                restarted.append(plan.loads[0].block_ids)

        e.before_workers = restart
        r = e.add("r", tokens)
        e.run(timeout=60)
        # The scheduler had imported 4 blocks; the workers could not take
        # them from the restarted agent: vLLM is told all 4 failed, and
        # recomputes them.
        assert restarted and r.loaded == 4 * 16
        assert e.load_errors_seen == set(restarted[0])
        assert r.recomputed_blocks == 4
        assert e.check(r) == len(r.tokens)
    finally:
        e.close()


def test_pool_full_loads_and_saves_nothing(pair):
    holder, reader = pair
    tokens = prompt(3 * 16 + 2, seed=13)
    stored(holder, tokens)
    e = SimEngine(reader.socket, SPEC, name="reader")

    bs = e.scheduler.block_set
    held = []
    try:
        wait_indexed(e, tokens, 3)
        # Another engine of the same layout holds every slot.
        with reader.client() as other:
            obs = SPEC.register(other)
            assert obs.id == bs.id
            held = other.allocate(obs, obs.slots)
            r = e.add("r", tokens)
            e.run(timeout=60)
            assert r.loaded == 0 and e.check(r) == len(r.tokens)
            s = e.scheduler.stats()
            assert s["loaded_blocks"] == 0 and s["saved_blocks"] == 0
            assert s["saves_skipped"] == 3 and s["lookup_errors"] == 1, s
            other.free(obs, held)
        assert session_refs(e) == 0

    finally:
        e.close()


def test_block_size_not_a_multiple_of_the_holders_page(pair):
    holder, reader = pair
    tokens = prompt(96 + 5, seed=14)
    stored(holder, tokens)  # pages of 16
    spec24 = KVSpec(**{**SPEC.__dict__, "block_size": 24})
    e = SimEngine(reader.socket, spec24, name="reader24")
    try:
        # The page-16 blocks are indexed, but no page-24 block is.
        ref = SimEngine(reader.socket, SPEC, name="reader16")
        wait_indexed(ref, tokens, 6)
        ref.close()
        r = e.add("r", tokens)
        e.run()
        assert r.loaded == 0 and e.check(r) == len(r.tokens)
        s = e.scheduler.stats()
        assert s["lookups"] == 1 and s["hit_tokens"] == 0 and s["imports"] == 0, s
    finally:
        e.close()


def test_request_preempted_while_its_import_runs(pair):
    import threading

    holder, reader = pair
    tokens = prompt(5 * 16 + 1, seed=15)
    stored(holder, tokens)
    e = SimEngine(reader.socket, SPEC, name="reader")
    try:
        wait_indexed(e, tokens, 5)
        looked, go = threading.Event(), threading.Event()

        def hold(found):
            looked.set()
            assert go.wait(20)

        e.scheduler.before_import = hold
        e.add("r", tokens)
        assert e.scheduler.matched("r", tokens, 0) is None
        assert looked.wait(20)
        # While the agent's answer is held, the scheduler is never held:
        # each question is answered None at once (0.5 s: a wide margin for
        # a loaded machine; it takes microseconds).
        for _ in range(20):
            t0 = time.monotonic()
            assert e.scheduler.matched("r", tokens, 0) is None
            assert time.monotonic() - t0 < 0.5
        e.preempt("r")
        e.abort("r")  # finished while its import runs
        go.set()
        e.scheduler.wait_idle()
        # The import's references were given back as it ended.
        wait_for("refs released", lambda: session_refs(e) == 0)
        e.scheduler.before_import = None
        # The same prompt again loads it all, every element right.
        r2 = e.add("r2", tokens)
        e.run()
        assert r2.loaded == 5 * 16 and e.check(r2) == len(r2.tokens)
        assert e.load_errors_seen == set()
    finally:
        e.close()


def test_example_two_engines(kvfabric_bin):
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "examples" / "connector.py"
    out = subprocess.run([sys.executable, str(example), "--bin", kvfabric_bin, "--blocks", "4"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "engine A (TP 2): computed 71 tokens, saved 4 blocks" in out.stdout
    assert "engine B (TP 1): loaded 64 of 67 prompt tokens (131072 bytes, 0 load errors)" in out.stdout
    assert "engine B: all 69 tokens' KV equal the model's, element by element" in out.stdout


def test_config_from_dict_names_what_is_wrong():
    c = ConnectorConfig.from_dict({"socket": "/s", "recompute_tokens_per_s": 5000, "save": False, "slots": 8})
    assert (c.socket, c.recompute_tokens_per_s, c.save, c.slots) == ("/s", 5000.0, False, 8)
    for bad, match in (
        ({"sokcet": "/s"}, "unknown setting.*sokcet"),
        ({"save": 1}, "save=1 is not true or false"),
        ({"slots": 2.5}, "slots=2.5 is not a whole number"),
        ({"min_load_tokens": -1}, "min_load_tokens=-1 is not a number >= 0"),
        ({"import_timeout": 0}, "import_timeout must be > 0"),
        ({"recompute_tokens_per_s": float("nan")}, "recompute_tokens_per_s=nan"),
        ({"socket": 3}, "socket=3 is not a string"),
    ):
        with pytest.raises(kvfabric.InvalidArgument, match=match):
            ConnectorConfig.from_dict(bad)


def test_caches_that_do_not_match_the_spec_are_refused(node1):
    import numpy as np

    from kvfabric.connector import WorkerSide

    cfg = ConnectorConfig(socket=node1.socket)
    good = {f"model.layers.{i}.attn": np.zeros((2, 8, 16, 4, 16), np.float32) for i in range(2)}
    for caches, match in (
        ({**good, "model.layers.2.attn": good["model.layers.0.attn"]}, "3 layers, spec has 2"),
        ({k: np.zeros((2, 8, 32, 4, 16), np.float32) for k in good}, "block size 32, spec has 16"),
        ({k: np.zeros((2, 8, 16, 2, 16), np.float32) for k in good}, "2 heads per rank"),
        ({k: np.zeros((2, 8, 16, 4, 16), np.float16) for k in good}, "dtype float16, spec has f32"),
        ({k: np.zeros((8, 16, 4, 16), np.float32) for k in good}, "is not FlashAttention's"),
        ({"attn": good["model.layers.0.attn"]}, "no layer number"),
    ):
        w = WorkerSide(cfg, SPEC, 0, engine="bad-caches")
        try:
            with pytest.raises(kvfabric.InvalidArgument, match=match):
                w.register_kv_caches(caches)
        finally:
            w.close()
            w.close()
    with pytest.raises(kvfabric.InvalidArgument, match="rank 1 is not in 0..0"):
        WorkerSide(cfg, SPEC, 1)


@pytest.mark.parametrize(
    "spec_a, spec_b",
    [
        # TP 2 saves, TP 1 loads (the agent re-shards): FlashAttention, then FlashInfer over HND.
        (KVSpec(2, 4, 16, "f32", 2, 16, CacheKind.FLASH), KVSpec(2, 4, 16, "f32", 1, 16, CacheKind.FLASHINFER, "hnd")),
        # TP 1 saves, TP 4 loads, f16.
        (KVSpec(2, 4, 16, "f16", 1, 16), KVSpec(2, 4, 16, "f16", 4, 16)),
        # MLA: one latent plane, every rank holds it.
        (KVSpec(3, 1, 32, "f32", 1, 16, CacheKind.MLA), KVSpec(3, 1, 32, "f32", 2, 16, CacheKind.MLA)),
    ],
    ids=["tp2-flash-to-tp1-flashinfer-hnd", "tp1-to-tp4-f16", "mla-tp1-to-tp2"],
)
def test_layouts_across_engines(node1, node2, spec_a, spec_b):
    tokens = prompt(3 * 16 + 9, seed=100 * spec_b.tp_size + spec_a.layers)
    a = SimEngine(node1.socket, spec_a, name="layouts-a")
    b = SimEngine(node2.socket, spec_b, name="layouts-b")
    try:
        ra = a.add("a", tokens)
        a.run()
        a.check(ra)
        a.scheduler.wait_idle()
        wait_indexed(b, tokens, 3)
        rb = b.add("b", tokens)
        b.run()
        assert rb.loaded == 3 * 16 and b.check(rb) == len(rb.tokens)
        assert b.scheduler.stats()["load_errors"] == 0
    finally:
        a.close()
        b.close()


def test_failed_load_drops_the_steps_saves_of_that_request(node1, node2):
    """A block gone from the pool between the import and the workers' copy:
    vLLM is told, the step's saves of that request (computed over the
    missing KV) are not registered, the blocks are recomputed and saved,
    and a third engine loading them from this node gets the model's KV."""
    tokens = prompt(5 * 16 + 5, seed=21)
    a = SimEngine(node1.socket, SPEC, name="drop-a")
    b = SimEngine(node2.socket, SPEC, name="drop-b")
    try:
        a.add("a", tokens[: 3 * 16 + 1])  # the holder has the first 3 blocks
        a.run()
        a.scheduler.wait_idle()
        wait_indexed(b, tokens, 3)
        bogus = []

        def lose_block(plan):
            for lp in plan.loads:
                if not bogus:
                    bogus.append(lp.block_ids[2])
                    lp.hashes[2] ^= 1  # the pool holds no such block

        b.before_workers = lose_block
        rb = b.add("b", tokens)
        b.run()
        assert b.load_errors_seen == set(bogus) and rb.recomputed_blocks == 1
        assert b.check(rb) == len(rb.tokens)
        b.scheduler.wait_idle()
        s = b.scheduler.stats()
        # Step 1 planned blocks 3 and 4 (computed over the lost block 2):
        # dropped. Blocks 2, 3 and 4 were saved once recomputed.
        assert s["save_errors"] == 2 and s["saved_blocks"] == 3, s
    finally:
        a.close()
    # node1 now loads all 5 blocks, the last 2 only node2 holds.
    c = SimEngine(node1.socket, SPEC, name="drop-c")
    try:
        wait_for("node1 sees node2's blocks", lambda: any(
            o.node == "node2" and o.blocks == 5
            for o in c.scheduler.client.lookup(kvfabric.block_hashes(tokens, 16)).overlaps))
        rc = c.add("c", tokens)
        c.run()
        assert rc.loaded == 5 * 16 and c.check(rc) == len(rc.tokens)
    finally:
        c.close()
        b.close()


def test_both_halves_reconnect_after_the_agent_restarts(pair):
    """After its agent restarted, the engine works again: the next request
    loads from the holder and its blocks are saved, every element right."""
    holder, reader = pair
    first, second = prompt(3 * 16 + 2, seed=31), prompt(4 * 16 + 2, seed=32)
    stored(holder, first)
    stored(holder, second)
    e = SimEngine(reader.socket, SPEC, name="reader")
    try:
        wait_indexed(e, first, 3)
        r1 = e.add("r1", first)
        e.run()
        assert r1.loaded == 3 * 16 and e.check(r1) == len(r1.tokens)
        reader.stop()
        reader.start(join=holder.gossip)
        wait_for("the old session seen ended", lambda: not e.scheduler.client.session_alive)
        with reader.client() as c:
            wait_for("the restarted reader sees the holder's blocks", lambda: any(
                o.blocks >= 4 for o in c.lookup(kvfabric.block_hashes(second, 16)).overlaps))
        # The first question after the restart may fail while the session
        # is renewed; the request is then computed, and the next one loads.
        r2 = e.add("r2", second)
        e.run()
        assert e.check(r2) == len(r2.tokens)
        r3 = e.add("r3", second[:-1] + [7])
        e.run()
        assert r3.loaded == 4 * 16 and e.check(r3) == len(r3.tokens)
        assert e.load_errors_seen == set()
    finally:
        e.close()


def test_bad_token_ids_are_computed_not_loaded(node1):
    e = SimEngine(node1.socket, SPEC, name="bad-tokens")
    try:
        toks = [1] * 40 + [1 << 33] + [2] * 10
        assert e.scheduler.matched("x", toks, 0) is None
        assert wait_for("answered", lambda: e.scheduler.matched("x", toks, 0) == 0 or None) is True
        assert e.scheduler.stats()["lookup_errors"] == 1
    finally:
        e.close()


def test_engine_independent_modules_import_no_engine():
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, kvfabric, kvfabric.connector, kvfabric.harness, kvfabric.pagestore; "
            "print(sorted(m for m in ('vllm', 'sglang', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_worker_tells_the_cache_shape_from_the_tensors(node1, node2):
    """vLLM's configuration does not name the attention backend: a spec
    saying FlashAttention with FlashInfer-shaped caches still loads right."""
    tokens = prompt(3 * 16 + 4, seed=41)
    a = SimEngine(node1.socket, SPEC, name="shape-a")
    b = SimEngine(node2.socket, SPEC, kind=CacheKind.FLASHINFER, name="shape-b")
    try:
        assert b.caches[0]["model.layers.0.self_attn.attn"].shape[1] == 2
        a.add("a", tokens)
        a.run()
        a.scheduler.wait_idle()
        wait_indexed(b, tokens, 3)
        rb = b.add("b", tokens)
        b.run()
        assert rb.loaded == 3 * 16 and b.check(rb) == len(rb.tokens)
    finally:
        a.close()
        b.close()


def test_events_name_blocks_saved_imported_and_found_gone(node1, node2):
    """vLLM's KV cache events: the blocks an engine saved, the blocks a load
    imported from another node (each with its parent and tokens), and a
    block a worker found gone from the pool; each reported once."""
    tokens = prompt(5 * 16 + 7, seed=31)
    hashes = kvfabric.block_hashes(tokens, 16, lora="ad1")
    a = SimEngine(node1.socket, SPEC, name="events-a")
    b = SimEngine(node2.socket, SPEC, name="events-b")
    try:
        a.add("a", tokens, lora="ad1")
        a.run()
        a.scheduler.wait_idle()
        ev = a.scheduler.take_events()
        assert [(e.stored, e.origin, e.hash) for e in ev] == [(True, "saved", h) for h in hashes[:5]]
        assert [e.parent for e in ev] == [None] + hashes[:4]
        assert [list(e.tokens) for e in ev] == [tokens[i * 16 : (i + 1) * 16] for i in range(5)]
        assert {e.lora for e in ev} == {"ad1"}
        assert a.scheduler.take_events() == []
        wait_for("blocks indexed", lambda: any(o.blocks >= 5 for o in b.scheduler.client.lookup(hashes[:5]).overlaps))

        # b imports the first 3 blocks (its request is 3 blocks and 1 token).
        rb = b.add("b", tokens[: 3 * 16 + 1], lora="ad1")
        b.run()
        assert rb.loaded == 3 * 16
        b.scheduler.wait_idle()
        ev = b.scheduler.take_events()
        assert [(e.stored, e.origin, e.hash, e.parent) for e in ev] == [
            (True, "imported", hashes[i], hashes[i - 1] if i else None) for i in range(3)
        ]
        assert [list(e.tokens) for e in ev] == [tokens[i * 16 : (i + 1) * 16] for i in range(3)]

        # Loading all 5 again: 3 are in node2's pool already (no event), 2
        # are imported; a worker finds block 4's hash (made one the pool
        # never held) gone, and b computes and saves block 4 itself.
        lost = []

        def lose_block(plan):
            for lp in plan.loads:
                if not lost:
                    lost.append(lp.hashes[4] ^ 1)
                    lp.hashes[4] ^= 1

        b.before_workers = lose_block
        rc = b.add("c", tokens, lora="ad1")
        b.run()
        assert rc.loaded == 5 * 16 and b.check(rc) == len(rc.tokens)
        b.scheduler.wait_idle()
        ev = b.scheduler.take_events()
        got = [(e.stored, e.origin, e.hash) for e in ev]
        assert got[:2] == [(True, "imported", hashes[3]), (True, "imported", hashes[4])], got
        assert (False, "gone", lost[0]) in got
        # Block 4 was imported, so b's own save of it is a duplicate: no second event.
        assert [g for g in got if g[1] == "saved"] == [], got
    finally:
        a.close()
        b.close()


def test_layerwise_loads_copy_layer_after_layer(node1, node2):
    """With layerwise loads the forward of layer 0 may start while layer 1
    is still being copied: waiting for layer 0 returns with its blocks in
    the cache and layer 1's not yet there; at the end every element of
    every token is the model's."""
    tokens = prompt(5 * 16 + 3, seed=41)
    a = SimEngine(node1.socket, SPEC, name="lw-a")
    b = SimEngine(node2.socket, SPEC, name="lw-b", config=ConnectorConfig(socket=node2.socket, stats_interval=0, layerwise=True))
    try:
        a.add("a", tokens)
        a.run()
        a.scheduler.wait_idle()
        wait_indexed(b, tokens, 5)
        w = b.workers[0]
        gate, seen = threading.Event(), []
        w.before_layer = lambda li: gate.wait(20) if li == 1 else None
        names = sorted(b.caches[0], key=lambda s: int(s.split(".")[2]))

        def between_layers(plan):
            if not plan.loads:
                return
            ids = plan.loads[0].block_ids
            w.wait_layer(names[0])
            seen.append((not np.isnan(b.caches[0][names[0]][:, ids]).any(), np.isnan(b.caches[0][names[1]][:, ids]).all()))
            gate.set()

        b.before_load = between_layers
        rb = b.add("b", tokens)
        b.run()
        assert seen == [(True, True)]
        assert rb.loaded == 5 * 16 and b.check(rb) == len(rb.tokens)
        s = b.scheduler.stats()
        assert s["loaded_blocks"] == 5 and s["load_errors"] == 0, s
    finally:
        a.close()
        b.close()


def test_layerwise_load_failing_in_a_layer_is_recomputed(node1, node2):
    """A copy that fails at layer 1 names the request's blocks, vLLM
    recomputes them (layer 0's copy is overwritten), and the blocks'
    references are given back."""
    tokens = prompt(4 * 16 + 3, seed=43)
    a = SimEngine(node1.socket, SPEC, name="lwf-a")
    b = SimEngine(node2.socket, SPEC, name="lwf-b", config=ConnectorConfig(socket=node2.socket, stats_interval=0, layerwise=True))
    try:
        a.add("a", tokens)
        a.run()
        a.scheduler.wait_idle()
        wait_indexed(b, tokens, 4)
        w = b.workers[0]
        failed = []

        def fail(li):
            if li == 1 and not failed:
                failed.append(li)
                raise OSError("copy failed")

        w.before_layer = fail
        rb = b.add("b", tokens)
        b.run()
        assert failed and rb.recomputed_blocks == 4 and len(b.load_errors_seen) == 4
        assert b.check(rb) == len(rb.tokens)
        s = b.scheduler.stats()
        assert s["load_errors"] == 4 and s["loaded_blocks"] == 0, s
        c = w.client
        assert next(x.refs for x in c.status().sessions if x.id == c.session) == 0
    finally:
        a.close()
        b.close()


def test_a_plans_repr_leaves_its_join_token_out():
    plan = StepPlan(3, 7, incarnation="inc", join_token="join-secret")
    assert "join-secret" not in repr(plan) and "inc" in repr(plan), repr(plan)


def test_a_sets_incarnation_names_its_memory_token_only_by_a_digest(node1):
    """Plans and log lines carry the incarnation; the memory token maps the
    set's memory: it is not in it, and two sets' incarnations differ."""
    with node1.client() as c:
        a = SPEC.register(c, 0, engine="inc-a")
        b = dataclasses.replace(SPEC, layers=SPEC.layers + 1).register(c, 0, engine="inc-b")
        for bs in (a, b):
            tok = bs.memory[0].token
            assert tok and tok not in incarnation(bs) and tok[4:12] not in incarnation(bs), incarnation(bs)
        assert incarnation(a) != incarnation(b) and incarnation(a) == incarnation(a)


def test_a_join_refused_its_token_is_tried_with_a_new_one(node1):
    """A worker refused the scheduler's set with one token (stale: the set's
    token was renewed, its incarnation the same) does not try that token
    again, but joins with a plan that carries the set's token."""
    e = SimEngine(node1.socket, SPEC, name="stale-token")
    try:
        w, bs = e.workers[0], e.scheduler.block_set
        assert w.block_set is None  # joined with the first plan: none yet
        inc = incarnation(bs)
        w._follow(StepPlan(1, bs.id, incarnation=inc, join_token="join-stale"))
        assert w.block_set is None
        w._follow(StepPlan(2, bs.id, incarnation=inc, join_token=bs.join_token))
        assert w.block_set is not None and incarnation(w.block_set) == inc
    finally:
        e.close()


def test_a_join_done_past_its_deadline_is_dropped_when_the_worker_follows_another_set(node1):
    """A join the agent did but whose answer came too late for the worker
    (DEADLINE_EXCEEDED on its side) leaves the set attached to the worker's
    session; when the worker follows a plan naming another set, it drops
    that one too, and its session uses only the set it follows."""
    from kvfabric.connector import WorkerSide
    from kvfabric.errors import DeadlineExceeded

    with node1.client(engine="late-join-scheduler") as c:
        first = SPEC.register(c, slots=16)
        second = SPEC.register(c, slots=24)
        assert first.id != second.id
        w = WorkerSide(ConnectorConfig(socket=node1.socket, stats_interval=0), SPEC, 0, engine="late-join")
        try:
            shape = (2, 8, SPEC.block_size, SPEC.heads_per_rank(), SPEC.head_dim)
            w.register_kv_caches({f"model.layers.{i}.self_attn.attn": np.zeros(shape, np.float32) for i in range(SPEC.layers)})
            register = w.client.register

            def answered_late(*args, **kwargs):
                register(*args, **kwargs)  # done by the agent
                raise DeadlineExceeded("Register answered past its deadline", method="Register")

            w.client.register = answered_late  # type: ignore[method-assign]
            w._follow(StepPlan(1, first.id, incarnation=incarnation(first), join_token=first.join_token))
            assert w.block_set is None

            def session_sets() -> list[int]:
                return sorted(next(s for s in c.status().sessions if s.id == w.client.session).block_sets)

            assert session_sets() == [first.id]
            w.client.register = register  # type: ignore[method-assign]
            w.join_retry_interval, w._join_retry_at = 0.0, 0.0
            w._follow(StepPlan(2, second.id, incarnation=incarnation(second), join_token=second.join_token))
            assert w.block_set is not None and w.block_set.id == second.id
            assert session_sets() == [second.id], f"the worker's session still uses block set {first.id}"
        finally:
            w.close()


def _worker(node, engine: str):
    """A worker of SPEC on node, its caches registered, no set joined yet."""
    from kvfabric.connector import WorkerSide

    w = WorkerSide(ConnectorConfig(socket=node.socket, stats_interval=0), SPEC, 0, engine=engine)
    shape = (2, 8, SPEC.block_size, SPEC.heads_per_rank(), SPEC.head_dim)
    w.register_kv_caches({f"model.layers.{i}.self_attn.attn": np.zeros(shape, np.float32) for i in range(SPEC.layers)})
    return w


def _session_sets(c, session: int) -> list[int]:
    return sorted(next(s for s in c.status().sessions if s.id == session).block_sets)


@pytest.mark.parametrize("give_back_fails", [False, True], ids=["given_back", "left_on_the_session"])
def test_a_join_whose_memory_cannot_be_mapped_is_dropped_when_the_worker_follows_another_set(node1, caplog, give_back_fails):
    """A join the agent did, after which the worker's client could not map
    the set's memory (PermissionDenied): the worker does not use it, says
    the mapping may be what failed, and follows a plan naming another set.
    The client gives the set back, leaving nothing on the worker's session;
    where that fails too (its DropBlockSet unreachable), the set stays on
    the session and the worker drops it when it follows the next set, so
    the session keeps neither its memory nor its slots."""
    with node1.client(engine=f"unmappable-scheduler-{give_back_fails}") as c:
        first = SPEC.register(c, slots=16)
        second = SPEC.register(c, slots=24)
        w = _worker(node1, "unmappable")
        try:
            def refused(*args, **kwargs):
                raise kvfabric.PermissionDenied("pool memory: permission denied")

            def unreachable(*args, **kwargs):
                raise kvfabric.Unavailable("agent unreachable")

            w.client._map = refused  # type: ignore[method-assign]
            if give_back_fails:
                w.client.drop_block_set = unreachable  # type: ignore[method-assign]
            with caplog.at_level("ERROR", logger=w.log.name):
                w._follow(StepPlan(1, first.id, incarnation=incarnation(first), join_token=first.join_token))
            assert w.block_set is None
            left = [first.id] if give_back_fails else []
            assert _session_sets(c, w.client.session) == left, "the set's give-back did not do as the client said"
            assert "memory mapped" in caplog.text, caplog.text
            del w.client._map
            if give_back_fails:
                del w.client.drop_block_set
            w._follow(StepPlan(2, second.id, incarnation=incarnation(second), join_token=second.join_token))
            assert w.block_set is not None and w.block_set.id == second.id
            assert _session_sets(c, w.client.session) == [second.id], f"the worker's session still uses block set {first.id}"
        finally:
            w.close()


def _reconnect(e: SimEngine, agent, join: str | None = None) -> None:
    """Restarts agent and waits until e's scheduler half has a new session
    (another request's lookup makes it reconnect)."""
    s = e.scheduler
    agent.stop()
    agent.start(join=join)
    wait_for("the old session seen ended", lambda: not s.client.session_alive)
    s.matched("another", prompt(3 * 16 + 1, seed=99), 0)
    wait_for("reconnected", lambda: s.client.session_alive)
    s.wait_idle()


def answered(agent, tokens: list[int]) -> SimEngine:
    """An engine on agent, which holds tokens' 4 full blocks, whose
    scheduler half has answered request "r" with all of them (its load not
    yet planned)."""
    stored(agent, tokens)
    e = SimEngine(agent.socket, SPEC, name="reader")
    s = e.scheduler
    assert s.matched("r", tokens, 0) is None
    s.wait_idle()
    assert s.matched("r", tokens, 0) == 4 * 16
    return e


def test_a_promise_made_before_the_agent_restarts_is_loaded_or_recomputed(pair):
    """A request answered (its blocks promised to the engine) before the
    agent restarted, then scheduled: the engine counts the promised tokens
    as computed, so the load is planned for all of them by hash; the
    restarted agent holds none, every block is a load error, recomputed,
    and every element is right."""
    holder, reader = pair
    tokens = prompt(4 * 16 + 3, seed=41)
    e = answered(reader, tokens)
    try:
        _reconnect(e, reader, join=holder.gossip)
        r = e.add("r", tokens)
        e.run()
        assert r.loaded == 4 * 16, "the promise the engine got before the restart"
        assert len(e.load_errors_seen) == 4 and r.recomputed_blocks >= 4
        assert e.check(r) == len(r.tokens)
    finally:
        e.close()


def test_a_request_asked_again_while_its_load_is_under_way_waits(pair):
    """Preempted and admitted again before the step that loads it reported
    (asynchronous scheduling), a request gets no answer until that step
    has reported, then is looked up again and loads: never a promise whose
    load is not planned."""
    holder, _ = pair
    tokens = prompt(4 * 16 + 3, seed=42)
    e = answered(holder, tokens)
    try:
        s = e.scheduler
        blocks = list(range(10))
        s.allocated("r", blocks, 4 * 16)
        first = s.build({"r": (blocks, 4 * 16 + 3)})
        assert len(first.loads) == 1 and len(first.loads[0].hashes) == 4
        assert s.matched("r", tokens, 16) is None, "asked again while its load is under way"
        s.report(None, step=first.step)  # that step given up: its load ended
        assert s.matched("r", tokens, 16) is None  # looked up again
        s.wait_idle()
        assert s.matched("r", tokens, 16) == 3 * 16
        again = list(range(20, 30))
        s.allocated("r", again, 3 * 16)
        second = s.build({"r": (again, 4 * 16 + 3)})
        assert len(second.loads) == 1 and second.loads[0].hashes == kvfabric.block_hashes(tokens, 16)[1:4]
    finally:
        e.close()


def test_a_load_under_way_as_the_agent_restarts_is_looked_up_again(pair):
    """A request whose load was planned when the agent restarted is not
    left loading: admitted again, it is looked up anew (the restarted agent
    holds nothing, so nothing is promised)."""
    holder, reader = pair
    tokens = prompt(4 * 16 + 3, seed=43)
    e = answered(reader, tokens)
    try:
        s = e.scheduler
        s.allocated("r", list(range(10)), 4 * 16)
        assert len(s.build({"r": (list(range(10)), 4 * 16 + 3)}).loads) == 1
        _reconnect(e, reader, join=holder.gossip)
        assert s.matched("r", tokens, 0) is None
        s.wait_idle()
        assert s.matched("r", tokens, 0) == 0
    finally:
        e.close()


def test_namespaces_keep_same_shape_models_apart(node1):
    """Blocks saved under one namespace (a model) are not loaded by an
    engine of another namespace with the same KV shape, nor by one with
    none; an engine of the same namespace loads them."""
    import dataclasses

    tokens = prompt(4 * 16 + 3, seed=44)
    base = dataclasses.replace(SPEC, namespace="vllm;model=base")
    stored(node1, tokens, base)
    for spec, want in ((dataclasses.replace(SPEC, namespace="vllm;model=instruct"), 0), (SPEC, 0), (base, 4 * 16)):
        e = SimEngine(node1.socket, spec, name="reader")
        try:
            r = e.add("r", tokens)
            e.run()
            assert r.loaded == want, spec.namespace
            assert e.check(r) == len(r.tokens)
        finally:
            e.close()


def test_saves_over_a_failed_load_are_dropped_in_every_step_planned_before_its_report(node1):
    """vLLM plans step k+1 before step k's report, and lets another request
    use a block whose load failed: every save of such a request, in step k
    and in the steps planned before the report, is freed rather than
    registered, and that request saves nothing more; the request whose load
    failed saves again once recomputed."""
    from kvfabric.connector import SchedulerSide, WorkerReport

    page = SPEC.block_size
    s = SchedulerSide(ConnectorConfig(socket=node1.socket), SPEC, engine="poison")
    try:
        ta, tb, tc = prompt(4 * page + 1, seed=51), prompt(4 * page + 1, seed=52), prompt(4 * page + 1, seed=53)
        for rid, t in (("a", ta), ("b", tb), ("c", tc)):
            s.track(rid, t, 0)
        # Engine block 7 failed to load for a in step 1; b's table holds it
        # too (a shared prefix); c's does not.
        tables = {"a": [7, 10, 11, 12], "b": [7, 20, 21, 22], "c": [30, 31, 32, 33]}
        one = s.build({rid: (tbl, 2 * page) for rid, tbl in tables.items()})
        two = s.build({rid: (tbl, 4 * page) for rid, tbl in tables.items()})
        assert {p.req_id for p in one.saves} == {p.req_id for p in two.saves} == {"a", "b", "c"}

        def written(plan):
            return {slot: 1 for p in plan.saves for slot in p.slots}

        s.report(WorkerReport(one.step, load_errors={7}, failed_requests={"a"}, saved=written(one)))
        s.report(WorkerReport(two.step, saved=written(two)))
        s.wait_idle()

        def held(tokens):
            return max((o.blocks for o in s.client.lookup(kvfabric.block_hashes(tokens, page)).overlaps), default=0)

        assert held(tc) == 4, "c used no failed block: saved"
        assert held(tb) == 0, "b's blocks computed over a failed load were registered"
        assert held(ta) == 0, "a's blocks of the step whose load failed were registered"
        st = s.stats()
        assert st["saves_over_failed_loads"] == 1 and "b" not in s._saving and "a" in s._saving, st
        # a is recomputed from block 0 and saves again.
        again = s.build({"a": (tables["a"], 4 * page)})
        assert [p.req_id for p in again.saves] == ["a"] and len(again.saves[0].hashes) == 4
    finally:
        s.close()


def test_an_agent_that_does_not_answer_costs_a_step_the_call_timeout(pair):
    """An agent that hangs (stopped here) holds the scheduler's step for
    call_timeout, not the client's 30 s: the step's saves are skipped, and
    the steps after it do not ask again for save_pause seconds."""
    import signal

    from kvfabric.connector import SchedulerSide

    holder, _ = pair
    page = SPEC.block_size
    s = SchedulerSide(ConnectorConfig(socket=holder.socket, call_timeout=0.5, save_pause=600), SPEC, engine="hang")
    asked: list = []
    real = s.client.allocate

    def allocate(*a, **k):
        asked.append(k.get("timeout"))
        return real(*a, **k)

    s.client.allocate = allocate  # type: ignore[method-assign]
    try:
        s.track("r", prompt(4 * page + 1, seed=61), 0)
        table = [1, 2, 3, 4]
        os.kill(holder.proc.pid, signal.SIGSTOP)
        try:
            start = time.monotonic()
            one = s.build({"r": (table, 2 * page)})
            took = time.monotonic() - start
            two = s.build({"r": (table, 4 * page)})
        finally:
            os.kill(holder.proc.pid, signal.SIGCONT)
        assert one.saves == [] and two.saves == [] and asked == [0.5], asked
        assert took < 15, f"a step waited {took:.1f} s on an agent that does not answer"
        assert s.stats()["saves_skipped"] == 4
    finally:
        s.close()


def test_a_load_promised_and_not_yet_planned_as_the_agent_restarts_is_planned(pair):
    """Allocated (the engine counts the tokens as loaded) but not yet in a
    step's plan when the agent restarts: the next plan still loads it, by
    hash, against the new session's set, so its blocks are loaded or
    reported failed, never left unwritten."""
    holder, reader = pair
    tokens = prompt(4 * 16 + 3, seed=45)
    e = answered(reader, tokens)
    try:
        s = e.scheduler
        s.allocated("r", list(range(10)), 4 * 16)
        _reconnect(e, reader, join=holder.gossip)
        plan = s.build({"r": (list(range(10)), 4 * 16 + 3)})
        assert len(plan.loads) == 1 and plan.loads[0].hashes == kvfabric.block_hashes(tokens, 16)[:4]
        assert plan.block_set == s.block_set.id, "planned against the new session's set"
    finally:
        e.close()


def test_a_workers_release_after_a_load_waits_the_call_timeout(pair):
    """The release that ends a worker's load is on the step's path: it
    waits call_timeout, not the client's 30 s. An agent stopped as the
    worker releases costs the step call_timeout; the load itself stands
    (its bytes were copied and checked before the release)."""
    import signal

    holder, reader = pair
    tokens = prompt(4 * 16 + 3, seed=71)
    stored(holder, tokens)
    e = SimEngine(reader.socket, SPEC, name="release",
                  config=ConnectorConfig(socket=reader.socket, stats_interval=0, call_timeout=0.5))
    w = e.workers[0]
    asked: list = []
    took: list[float] = []
    real = w.client.release

    def release(*a, **k):
        asked.append(k.get("timeout"))
        os.kill(reader.proc.pid, signal.SIGSTOP)
        start = time.monotonic()
        try:
            return real(*a, **k)
        finally:
            took.append(time.monotonic() - start)
            os.kill(reader.proc.pid, signal.SIGCONT)

    w.client.release = release  # type: ignore[method-assign]
    try:
        wait_indexed(e, tokens, 4)
        r = e.add("r", tokens)
        e.run()
        assert r.loaded == 4 * 16 and e.check(r) == len(r.tokens), e.scheduler.stats()
        assert asked == [0.5], asked
        assert took[0] < 15, f"the worker's release waited {took[0]:.1f} s on an agent that does not answer"
    finally:
        e.close()


def test_an_engine_started_while_its_agent_is_away_runs_and_connects_later(pair, caplog):
    """The agent is not there as the engine starts: the engine starts all
    the same (require_agent false, the default), warned, and computes
    everything, loading and saving nothing; once the agent answers, both
    halves connect and the engine loads what the cluster holds and saves
    what it computes. With require_agent, the start fails."""
    from kvfabric.errors import Unavailable

    holder, reader = pair
    tokens = prompt(4 * 16 + 3, seed=81)
    stored(holder, tokens)
    reader.stop()
    with pytest.raises(Unavailable):
        SimEngine(reader.socket, SPEC, name="strict",
                  config=ConnectorConfig(socket=reader.socket, stats_interval=0, require_agent=True))
    e = SimEngine(reader.socket, SPEC, name="early")
    s = e.scheduler
    try:
        assert s.block_set is None and "not there" in caplog.text
        own = prompt(3 * 16 + 1, seed=82)
        r = e.add("r", tokens)
        o = e.add("o", own)
        e.run()
        assert r.loaded == 0 and e.check(r) == len(r.tokens) and e.check(o) == len(o.tokens)
        st = s.stats()
        assert st["saved_blocks"] == 0 and st["saves_skipped"] == 4 + 3 and st["lookups"] == 0, st
        reader.start(join=holder.gossip)

        def connected() -> bool:
            s.matched("probe", prompt(2 * 16 + 1, seed=83), 0)
            s.finished("probe")
            return s.block_set is not None and all(w.client.session_alive for w in e.workers)

        def step() -> bool:
            e.add(f"x{time.monotonic()}", prompt(16 + 1, seed=84))
            e.run()
            return connected()

        wait_for("the engine connected once the agent answered", step)
        wait_indexed(e, tokens, 4)
        r2 = e.add("r2", tokens)
        e.run()
        assert r2.loaded == 4 * 16 and e.check(r2) == len(r2.tokens), s.stats()
        fresh = prompt(2 * 16 + 5, seed=85)
        f = e.add("f", fresh)
        e.run()
        s.wait_idle()
        assert e.check(f) == len(f.tokens)
        held = s.client.lookup(kvfabric.block_hashes(fresh, 16)).overlaps
        assert max((x.blocks for x in held), default=0) == 2, "what the engine computed once connected was not saved"
    finally:
        e.close()


def test_a_half_without_its_agent_warns_of_each_new_failure_and_the_same_once_a_minute():
    from kvfabric.connector import _ABSENT_WARN_INTERVAL, _warn_again
    from kvfabric.errors import PermissionDenied, Unavailable

    class Half:
        _warned_at, _warned_why = 0.0, ""

    h = Half()
    assert _warn_again(h, Unavailable("no socket"), 0.5)
    assert not _warn_again(h, Unavailable("no socket"), 1.0)
    assert _warn_again(h, PermissionDenied("refused"), 2.0), "a new failure is warned of at once"
    assert not _warn_again(h, PermissionDenied("refused"), 2.0 + _ABSENT_WARN_INTERVAL - 0.1)
    assert _warn_again(h, PermissionDenied("refused"), 2.0 + _ABSENT_WARN_INTERVAL)


def test_a_save_only_engine_started_without_its_agent_connects_once_it_answers(pair):
    """load false: the scheduler is never asked for matches, so its steps
    are what reach the agent once it answers; then what it computes is
    saved."""
    holder, reader = pair
    reader.stop()
    e = SimEngine(reader.socket, SPEC, name="saver", config=ConnectorConfig(socket=reader.socket, stats_interval=0, load=False))
    s = e.scheduler
    try:
        assert s.block_set is None
        reader.start(join=holder.gossip)
        n = 0

        def step() -> bool:
            nonlocal n
            n += 1
            e.add(f"x{n}", prompt(16 + 1, seed=90 + n))
            e.run()
            return s.block_set is not None and all(w.client.session_alive for w in e.workers)

        wait_for("the save-only engine connected once the agent answered", step)
        fresh = prompt(2 * 16 + 5, seed=89)
        e.add("f", fresh)
        e.run()
        s.wait_idle()
        held = s.client.lookup(kvfabric.block_hashes(fresh, 16)).overlaps
        assert max((x.blocks for x in held), default=0) == 2, s.stats()
    finally:
        e.close()


def test_an_agent_that_never_answers_holds_no_step_while_the_connector_connects(tmp_path):
    """The agent's socket is there but nothing answers on it (the agent
    hangs as it starts): the connector's halves try to connect in the
    background, and the engine's steps go on meanwhile, computing
    everything, none of them waiting the client's 30 s."""
    import socket as so

    path = str(tmp_path / "hung.sock")
    e = SimEngine(path, SPEC, name="hung")  # no socket yet: starts without the agent
    ln = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    try:
        ln.bind(path)
        ln.listen(64)  # connections queue; none is ever answered
        for i in range(3):
            start = time.monotonic()
            r = e.add(f"r{i}", prompt(2 * 16 + 1, seed=70 + i))
            e.run()
            took = time.monotonic() - start
            assert e.check(r) == len(r.tokens)
            assert took < 10, f"step {i} waited {took:.1f} s on an agent that does not answer"
            time.sleep(1.1)  # a reconnection may be tried again
        assert e.scheduler.block_set is None and not e.workers[0].client.session_alive
    finally:
        ln.close()  # what waits on it ends
        e.close()
