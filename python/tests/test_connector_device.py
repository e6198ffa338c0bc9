"""The connector over agents whose pools are in GPU memory (softcuda, the
project's software GPU): the workers move blocks between the pool's device
block set and the engine's caches through the CUDA driver, device to device
when the caches are in GPU memory (:class:`DeviceCaches`), host to device
when they are host arrays; every element of every computed token checked."""

from __future__ import annotations

import numpy as np
import pytest

import kvfabric
from conftest import wait_for
from kvfabric import cuda
from kvfabric.connector import CacheKind, ConnectorConfig, KVSpec, LoadPlan, StepPlan, incarnation
from kvfabric.harness import DeviceCaches, SimEngine
from test_connector import prompt, wait_indexed
from test_device import gpus, softcuda  # noqa: F401 (fixtures)


@pytest.fixture
def driver(softcuda, monkeypatch):  # noqa: F811
    """This process's softcuda, which the connector's clients load too."""
    monkeypatch.setenv(cuda.ENV_LIBRARY, softcuda)
    return cuda.load(softcuda)


@pytest.mark.parametrize(
    "spec_a, spec_b, on_device, layerwise",
    [
        # Host caches, the pool's chunk in the engine's order: one copy per block and layer.
        (KVSpec(2, 4, 16, "f32", 1, 16, CacheKind.FLASH), KVSpec(2, 4, 16, "f32", 1, 16, CacheKind.FLASH), False, False),
        # Device caches over an HND pool: per head, device to device; TP 2 saves, TP 1 loads.
        (KVSpec(2, 4, 16, "f32", 2, 16, CacheKind.FLASH, "hnd"), KVSpec(2, 4, 16, "f32", 1, 16, CacheKind.FLASH, "hnd"), True, False),
        # FlashInfer's [blocks, 2, ...] in GPU memory, f16, TP 1 saves, TP 2 loads.
        (KVSpec(2, 4, 16, "f16", 1, 16, CacheKind.FLASHINFER), KVSpec(2, 4, 16, "f16", 2, 16, CacheKind.FLASHINFER), True, False),
        # MLA's latent cache in GPU memory.
        (KVSpec(3, 1, 32, "f32", 1, 16, CacheKind.MLA), KVSpec(3, 1, 32, "f32", 2, 16, CacheKind.MLA), True, False),
        # Layer by layer into device caches, TP 2.
        (KVSpec(3, 4, 16, "f32", 1, 16, CacheKind.FLASH), KVSpec(3, 4, 16, "f32", 2, 16, CacheKind.FLASH), True, True),
    ],
    ids=["flash-host-caches", "flash-hnd-pool-device-caches-tp2-to-tp1", "flashinfer-f16-device-caches-tp1-to-tp2",
         "mla-device-caches", "layerwise-device-caches-tp2"],
)
def test_engines_share_blocks_through_device_pools(gpus, driver, spec_a, spec_b, on_device, layerwise):  # noqa: F811
    tokens = prompt(5 * 16 + 7, seed=spec_a.tp_size * 10 + spec_b.tp_size + spec_a.layers + 100 * layerwise)
    dev_a, dev_b = (DeviceCaches(driver), DeviceCaches(driver)) if on_device else (None, None)
    a = SimEngine(gpus[0].socket, spec_a, name="dev-a", device=dev_a)
    cfg = ConnectorConfig(socket=gpus[1].socket, stats_interval=0, layerwise=layerwise)
    b = SimEngine(gpus[1].socket, spec_b, name="dev-b", device=dev_b, config=cfg)
    try:
        assert a.scheduler.block_set.on_device and b.scheduler.block_set.on_device
        assert all(ly.on_device == on_device for w in a.workers + b.workers for ly in w.layers)
        ra = a.add("a", tokens)
        a.run()
        assert ra.loaded == 0 and a.check(ra) == len(ra.tokens)
        a.scheduler.wait_idle()
        s = a.scheduler.stats()
        assert s["saved_blocks"] == 5 and s["save_errors"] == 0, s
        wait_indexed(b, tokens, 5)

        rb = b.add("b", tokens[:-3] + [7, 8, 9])
        b.run()
        assert rb.loaded == 5 * 16, b.scheduler.stats()
        assert b.check(rb) == len(rb.tokens)
        s = b.scheduler.stats()
        assert s["loaded_blocks"] == 5 * spec_b.tp_size and s["load_errors"] == 0, s
        # Each worker joined its scheduler's set with the first plan.
        assert all(w.block_set is not None and w.block_set.id == b.scheduler.block_set.id and w.block_set.on_device
                   for w in b.workers)
        # The loaded blocks reached the engine only through its caches'
        # memory: with device caches, the host copies the engine computes
        # on hold them because the device does.
    finally:
        a.close()
        b.close()
        for d in (dev_a, dev_b):
            if d is not None:
                d.close()


def test_device_load_outside_the_cache_copies_nothing(gpus, driver):  # noqa: F811
    """A plan naming an engine block past the cache's end (or a slot past
    the block set's) fails as a whole: its blocks are named for recompute,
    and not one byte lands in the cache."""
    spec = KVSpec(2, 4, 16, "f32", 1, 16, CacheKind.FLASH)
    tokens = prompt(3 * 16 + 1, seed=77)
    dev = DeviceCaches(driver)
    a = SimEngine(gpus[0].socket, spec, name="dev-edge-a")
    b = SimEngine(gpus[1].socket, spec, name="dev-edge-b", num_blocks=8, device=dev)
    try:
        ra = a.add("a", tokens)
        a.run()
        a.scheduler.wait_idle()
        wait_indexed(b, tokens, 3)
        hashes = kvfabric.block_hashes(tokens, 16)[:3]
        got = b.scheduler.client.import_blocks(b.scheduler.block_set, hashes, wait=15)
        assert got.complete, got
        w = b.workers[0]
        before = [np.empty(x.shape, x.dtype) for x in b.device_caches[0].values()]
        for x, out in zip(b.device_caches[0].values(), before):
            x.read(out)
        bs = b.scheduler.block_set
        inc = incarnation(bs)
        # The last block of the cache (7) is inside; 8 is one past it.
        for step, ids, bad in ((1, [0, 1, 8], True), (2, [5, 6, 7], False)):
            w.load(StepPlan(step, bs.id, [LoadPlan("x", hashes, ids)], incarnation=inc, join_token=bs.join_token))
            rep = w.take_report(step)
            if bad:
                assert rep.load_errors == {0, 1, 8} and rep.loaded_blocks == 0
                for x, want in zip(b.device_caches[0].values(), before):
                    now = np.empty(x.shape, x.dtype)
                    x.read(now)
                    np.testing.assert_array_equal(now, want)  # NaN where it was NaN: nothing written
            else:
                assert rep.load_errors == set() and rep.loaded_blocks == 3
        b._pull()
        kv = b.caches[0]
        want = a.caches[0]
        for name in kv:
            # Blocks 5..7 now hold what engine a computed in its blocks of ra.
            np.testing.assert_array_equal(kv[name][:, 5:8], want[name][:, ra.blocks[:3]])
        b.scheduler.client.release(b.scheduler.block_set, got.blocks)
    finally:
        a.close()
        b.close()
        dev.close()


def test_device_caches_need_a_device_pool(node1, driver):
    """Caches in GPU memory that are not torch tensors, on an agent whose
    pool is host memory: nothing is saved (the slots are freed) and the
    engine still computes every token right."""
    spec = KVSpec(2, 4, 16, "f32", 1, 16, CacheKind.FLASH)
    dev = DeviceCaches(driver)
    e = SimEngine(node1.socket, spec, name="dev-on-host", device=dev)
    try:
        r = e.add("r", prompt(2 * 16 + 3, seed=5))
        e.run()
        assert e.check(r) == len(r.tokens)
        e.scheduler.wait_idle()
        wait_for("the unwritten slots counted", lambda: e.scheduler.stats()["save_errors"] == 2)
        assert e.scheduler.stats()["saved_blocks"] == 0
    finally:
        e.close()
        dev.close()
