"""The connector's two halves driven in vLLM's call order by the harness,
against two real agents; every element of every computed token checked."""

from __future__ import annotations

import random

import pytest

import kvfabric
from conftest import wait_for
from kvfabric.connector import CacheKind, ConnectorConfig, KVSpec
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
