"""The asyncio client (kvfabric.aio) against real agents: a session per
``async with``, the engine calls (register, allocate, register blocks,
lookup, import, release) with every element checked, imports running
concurrently on one loop, and errors as the sync client raises them."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

import kvfabric
import kvfabric.aio
from conftest import wait_for
from test_import import encoded_block

MODEL = kvfabric.ModelConfig(layers=2, kv_heads=4, head_dim=8, dtype="f32")


def session_of(c: kvfabric.Client, sid: int):
    return next((s for s in c.status().sessions if s.id == sid), None)


async def store(c: kvfabric.aio.Client, bs: kvfabric.BlockSet, tokens: list[int]) -> list[int]:
    slots = await c.allocate(bs, len(tokens) // bs.page_size)
    for i, s in enumerate(slots):
        bs.write_block(s, encoded_block(bs.block_shape, i))
    refs = await c.register_blocks(bs, slots, tokens=tokens)
    assert [r.outcome for r in refs.results] == [kvfabric.Outcome.REGISTERED] * len(slots)
    await c.release(bs, refs)
    return [r.hash for r in refs]


def test_aio_session_store_lookup_import(node1, node2):
    tokens = list(range(31000, 31000 + 4 * 16))

    async def run() -> tuple[int, int]:
        async with kvfabric.aio.Client(node1.socket, engine="aio-src") as src, kvfabric.aio.Client(
            node2.socket, engine="aio-dst"
        ) as dst:
            assert src.session > 0 and dst.session > 0 and src.session_alive
            with node1.client() as sync:
                s = session_of(sync, src.session)
                assert s is not None and s.engine == "aio-src" and s.pid == os.getpid()
            a = await src.register(MODEL, 2, 16, "hnd", slots=16)
            hashes = await store(src, a, tokens)
            assert hashes == kvfabric.block_hashes(tokens, 16)
            found = await src.lookup(hashes)
            assert [(o.node, o.blocks) for o in found.overlaps if o.node == "node1"] == [("node1", 4)]

            b = await dst.register(MODEL, 1, 16, "nhd", "separate", slots=16)
            got = await dst.import_blocks(b, tokens=tokens, wait=15)
            assert got.complete and not got.error, got
            assert [r.hash for r in got.blocks] == hashes
            assert [r.outcome for r in got.results] == [kvfabric.Outcome.IMPORTED] * 4
            [f] = got.fetches
            assert (f.node, f.blocks) == ("node1", 4)
            for i, ref in enumerate(got.blocks):
                np.testing.assert_array_equal(b.read_block(ref.slot), encoded_block(b.block_shape, i), err_msg=f"block {i}")
            held = await dst.acquire(b, hashes)
            assert [r.slot for r in held] == got.slots
            await dst.release(b, held)
            await dst.release(b, got.blocks)
            return src.session, dst.session

    sessions = asyncio.run(run())
    # Leaving the block ended both sessions on their agents.
    for agent, sid in zip((node1, node2), sessions):
        with agent.client() as c:
            wait_for(f"session {sid} gone from {agent.name}", lambda: session_of(c, sid) is None)


def test_aio_concurrent_imports(node1, node2):
    # Three sequences stored on node1, imported on node2 by three tasks of
    # one loop at once, while the loop keeps running other work.
    seqs = [list(range(41000 + 1000 * k, 41000 + 1000 * k + 2 * 16)) for k in range(3)]

    async def run() -> None:
        async with kvfabric.aio.Client(node1.socket, engine="aio-src3") as src, kvfabric.aio.Client(node2.socket, engine="aio-dst3") as dst:
            a = await src.register(MODEL, 1, 16, slots=16)
            for t in seqs:
                await store(src, a, t)
            b = await dst.register(MODEL, 1, 16, slots=16)
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.001)
                    ticks += 1

            tick = asyncio.create_task(ticker())
            results = await asyncio.gather(*(dst.import_blocks(b, tokens=t, wait=15) for t in seqs))
            tick.cancel()
            assert ticks > 0, "the loop ran nothing else while the imports waited"
            for t, got in zip(seqs, results):
                assert got.complete, got
                assert [r.hash for r in got.blocks] == kvfabric.block_hashes(t, 16)
                for i, ref in enumerate(got.blocks):
                    np.testing.assert_array_equal(b.read_block(ref.slot), encoded_block(b.block_shape, i))
                await dst.release(b, got.blocks)

    asyncio.run(run())


def test_aio_errors(node1, tmp_path):
    async def run() -> None:
        with pytest.raises(kvfabric.Unavailable, match="no such file"):
            await kvfabric.aio.Client(tmp_path / "none.sock").open()
        with pytest.raises(kvfabric.InvalidArgument, match="timeout"):
            kvfabric.aio.Client(node1.socket, timeout=0)
        c = kvfabric.aio.Client(node1.socket)
        with pytest.raises(kvfabric.Unavailable, match="not open"):
            await c.status()
        async with c:
            bs = await c.register(MODEL, 1, 16, slots=8)
            # Refused before sending, as by the sync client.
            with pytest.raises(kvfabric.InvalidArgument, match="count"):
                await c.allocate(bs, 0)
            with pytest.raises(kvfabric.InvalidArgument, match="hashes and tokens"):
                await c.import_blocks(bs)
            # Refused by the agent, with the sync client's classes.
            with pytest.raises(kvfabric.NotFound) as e:
                await c.allocate(bs.id + 1000, 1)
            assert e.value.method == "Allocate"
            with pytest.raises((kvfabric.NotFound, kvfabric.Unavailable)) as e2:
                await c.import_blocks(bs, [11, 22, 33], wait=0.2, timeout=5)
            assert e2.value.method == "Import"
            slots = await c.allocate(bs, 2)
            await c.free(bs, slots)
            mem = bs.buffers[0]
            dropped = await c.drop_block_set(bs)
            assert dropped.freed == 0 and dropped.still_mapped == 0
            assert mem.closed and bs.dropped, "the dropped set's memory is still mapped"

            # A set handed over whose memory the client cannot map is given
            # back, not left on the session.
            async def refused(*args, **kwargs):
                raise kvfabric.PermissionDenied("pool memory: permission denied")

            c._map = refused  # type: ignore[method-assign]
            with pytest.raises(kvfabric.PermissionDenied):
                await c.register(MODEL, 1, 16, slots=8)
            del c._map
            mine = next(s for s in (await c.status()).sessions if s.id == c.session)
            assert list(mine.block_sets) == [], "the set the client could not map stayed on its session"
        assert not c.session_alive
        await c.close()  # twice is fine
        with pytest.raises(kvfabric.Unavailable, match="closed"):
            await c.status()

    asyncio.run(run())


def test_aio_keepalive(node2):
    # node2 ends sessions silent for KEEPALIVE_MS: the keepalive task holds
    # an idle one for five bounds; once it stops, the agent ends the session
    # and the client sees it.
    from conftest import KEEPALIVE_MS

    bound = KEEPALIVE_MS / 1000

    async def run() -> None:
        async with kvfabric.aio.Client(node2.socket, engine="aio-idle") as c:
            assert c._session is not None and c._session.keepalive == pytest.approx(bound)
            bs = await c.register(MODEL, 1, 17, slots=4)
            [slot] = await c.allocate(bs, 1)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5 * bound
            while loop.time() < deadline:
                await asyncio.sleep(bound / 2)
                assert c.session_alive
                assert any(s.id == c.session for s in (await c.status()).sessions)
            await c.free(bs, [slot])

            c._session._period = 3600
            deadline = loop.time() + 10 + 20 * bound
            while c.session_alive and loop.time() < deadline:
                await asyncio.sleep(0.05)
            assert not c.session_alive and c._session.ended, "the agent did not end a silent session"
            with pytest.raises(kvfabric.FailedPrecondition):
                await c.allocate(bs, 1)

    asyncio.run(run())
