"""Every engine call against a real agent, and bad input refused clearly."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import numpy as np
import pytest

import kvfabric
import kvfabric.aio
import kvfabric.client
from kvfabric.memory import receive_descriptor
from conftest import wait_for

MODEL = kvfabric.ModelConfig(layers=2, kv_heads=4, head_dim=8, dtype="f32")


def filled(bs: kvfabric.BlockSet, value: float) -> np.ndarray:
    return np.full(bs.block_shape, value, dtype=bs.dtype)


def block_set(c: kvfabric.Client, name: str, slots: int = 16) -> kvfabric.BlockSet:
    # A page size of its own per test, so that each test's set is its own.
    pages = {"flow": 4, "dup": 5, "free": 6, "errors": 7, "exhaust": 9, "shared": 10, "close": 11, "join": 12}
    return c.register(MODEL, 2, pages[name], "hnd", slots=slots, engine=name)


def test_store_acquire_release_lookup(node1):
    with node1.client() as c:
        bs = block_set(c, "flow")
        tokens = list(range(1000, 1000 + 3 * bs.page_size + 2))  # 3 full pages and a partial one
        hashes = kvfabric.block_hashes(tokens, bs.page_size)
        slots = c.allocate(bs, 3)
        assert len(set(slots)) == 3 and all(0 <= s < bs.slots for s in slots)
        for i, s in enumerate(slots):
            bs.write_block(s, filled(bs, i + 1))
        refs = c.register_blocks(bs, slots, tokens=tokens)
        # The agent's hashes of the tokens are ours.
        assert [r.hash for r in refs] == hashes and [r.slot for r in refs] == slots
        assert not any(r.duplicate for r in refs)

        got = c.acquire(bs, hashes + [12345])  # stops at the first missing
        assert [(r.hash, r.slot) for r in got] == list(zip(hashes, slots))
        assert [bs.read_block(r.slot)[0, 0, 0, 0, 0] for r in got] == [1, 2, 3]
        c.release(bs, got)  # BlockRefs or slots
        c.release(bs, slots)
        with pytest.raises(kvfabric.FailedPrecondition, match=f"slot {slots[0]}: the session holds no reference"):
            c.release(bs, slots[:1])

        st = c.status()
        mine = [s for s in st.block_sets if s.id == bs.id]
        assert len(mine) == 1 and mine[0].registered == 3 and mine[0].engine == "flow"
        assert st.node == "node1" and {m.node for m in st.members} >= {"node1", "node2"}

        res = wait_for("lookup sees node1's blocks", lambda: (r := c.lookup(hashes)) and r.best() and r.best().blocks == 3 and r)
        assert res.hashes == hashes and res.best().node == "node1"
        by_tokens = c.lookup(tokens=tokens, block_set=bs)  # block size from the set
        assert by_tokens.hashes == hashes
        assert c.lookup(tokens=tokens, block_size=bs.page_size).hashes == hashes
        # Another page size names other blocks.
        assert c.lookup(tokens=tokens, block_size=2).hashes == kvfabric.block_hashes(tokens, 2)


def test_duplicate_and_parent(node1):
    with node1.client() as c:
        bs = block_set(c, "dup")
        h = kvfabric.BlockHasher(bs.page_size)
        first = h.append(range(bs.page_size))[0].sequence
        [s0] = c.allocate(bs, 1)
        [ref] = c.register_blocks(bs, [s0], [first])
        [s1] = c.allocate(bs, 1)
        [dup] = c.register_blocks(bs, [s1], [first])
        assert dup.duplicate and dup.slot == ref.slot == s0
        # The second block alone, under its parent.
        parent = h.parent
        second = h.append(range(100, 100 + bs.page_size))[0].sequence
        [s2] = c.allocate(bs, 1)
        [ref2] = c.register_blocks(bs, [s2], [second], parent=parent)
        assert ref2.hash == second
        assert [r.slot for r in c.acquire(bs, h.hashes)] == [s0, s2]


def test_free(node1):
    with node1.client() as c:
        bs = block_set(c, "free", slots=8)
        slots = c.allocate(bs, 8)  # every slot: the limit
        c.free(bs, slots)
        with pytest.raises(kvfabric.FailedPrecondition):
            c.free(bs, slots[:1])
        assert sorted(c.allocate(bs, 8)) == sorted(slots)


def test_register_joins_a_set_by_its_token(node1):
    """Another client (session) joins a set by its id and join token, and
    maps the same memory; a wrong token, an unknown set or a layout not the
    set's is refused, naming what is wrong."""
    with node1.client() as a, node1.client() as b:
        bs = block_set(a, "join", slots=8)
        assert bs.join_token
        joined = b.register(MODEL, 2, 12, "hnd", slots=8, engine="join", join=(bs.id, bs.join_token))
        assert joined.id == bs.id and joined.join_token == bs.join_token
        slot = a.allocate(bs, 1)[0]
        bs.rank(1)[slot] = 3.5
        assert (joined.rank(1)[slot] == 3.5).all()  # the same memory
        with pytest.raises(kvfabric.PermissionDenied, match="join_token"):
            b.register(MODEL, 2, 12, "hnd", slots=8, join=(bs.id, bs.join_token + "x"))
        with pytest.raises(kvfabric.InvalidArgument, match="page_size"):
            b.register(MODEL, 2, 13, "hnd", slots=8, join=(bs.id, bs.join_token))
        with pytest.raises(kvfabric.NotFound, match=f"block set {bs.id + 1000}"):
            b.register(MODEL, 2, 12, "hnd", slots=8, join=(bs.id + 1000, bs.join_token))
        with pytest.raises(kvfabric.InvalidArgument, match="join token"):
            b.register(MODEL, 2, 12, "hnd", slots=8, join=(bs.id, ""))


def test_resource_exhausted(node1):
    with node1.client() as c:
        bs = block_set(c, "exhaust", slots=8)
        with pytest.raises(kvfabric.ResourceExhausted):
            c.allocate(bs, 9)  # past the set's slots


def test_bad_input(node1):
    with node1.client() as c:
        bs = block_set(c, "errors")
        # Unknown block set: the agent's NOT_FOUND.
        with pytest.raises(kvfabric.NotFound) as e:
            c.allocate(987654, 1)
        assert e.value.method == "Allocate" and "987654" in str(e.value)
        with pytest.raises(kvfabric.NotFound):
            c.import_blocks(987654, [1, 2])
        # Refused by the agent, the field named.
        with pytest.raises(kvfabric.InvalidArgument, match="tokens: .* for 2 slots"):
            c.register_blocks(bs, c.allocate(bs, 2), tokens=range(bs.page_size))
        with pytest.raises(kvfabric.InvalidArgument, match="tp_size"):
            c.register(MODEL, 3, 16)  # 4 heads do not split over 3 ranks
        # Refused before sending.
        cases = [
            (lambda: c.allocate(bs, 0), r"count: 0 is not in 1\.\.65536"),
            (lambda: c.allocate(bs, 1 << 16 | 1), r"count: 65537"),
            (lambda: c.allocate("x", 1), "block_set: 'x' is not a block set"),
            (lambda: c.release(bs, [-1]), r"slots\[0\]: -1 is out of range"),
            (lambda: c.release(bs, 3), "slots: want a sequence"),
            (lambda: c.acquire(bs, [2**64]), r"hashes\[0\]: 18446744073709551616 is out of range"),
            (lambda: c.register_blocks(bs, [0], [1, 2]), "hashes: 2 hashes for 1 slots"),
            (lambda: c.register_blocks(bs, [0]), "hashes and tokens: give one"),
            (lambda: c.register_blocks(bs, [0], tokens=[-5] * 7), r"tokens\[0\]: -5 is not a u32"),
            (lambda: c.lookup([1], tokens=[1]), "hashes and tokens: give one"),
            (lambda: c.import_blocks(bs, [1], wait=-1), "wait: -1"),
            (lambda: c.register(MODEL, 0, 16), r"tp_size: 0 is not an integer in 1\.\."),
            (lambda: c.register(MODEL, 2, 1 << 16 | 1), "page_size: 65537"),
            (lambda: c.register(MODEL, 2, 16, "xyz"), "kv_order: 'xyz' is not one of nhd, hnd"),
            (lambda: c.register(kvfabric.ModelConfig(0, 4, 8), 2, 16), "model.layers: 0 is not a positive u32"),
            (lambda: c.register(kvfabric.ModelConfig(2, 4, 8, "f64"), 2, 16), "model.dtype: 'f64' is not one of"),
            (lambda: c.register({"layers": 2}, 2, 16), "model: want a kvfabric.ModelConfig"),
            (lambda: c.status(timeout=0), "timeout: 0 is not a positive"),
            # The constructors of both clients check their options alike.
            (lambda: kvfabric.Client(node1.socket, timeout=True), "timeout: True is not a positive"),
            (lambda: kvfabric.aio.Client(node1.socket, import_timeout=True), "import_timeout: True is not a positive"),
            (lambda: kvfabric.Client(node1.socket, memory="shm"), "memory: 'shm' is not auto"),
        ]
        for call, match in cases:
            with pytest.raises(kvfabric.InvalidArgument, match=match):
                call()
        # The same base class for everything.
        assert issubclass(kvfabric.InvalidArgument, kvfabric.KvfabricError)


def test_no_agent(tmp_path):
    with pytest.raises(kvfabric.Unavailable, match=r"engine socket .*/none\.sock: no such file \(is the agent running\?\)"):
        kvfabric.Client(tmp_path / "none.sock")
    # A socket file with nobody behind it.
    path = str(tmp_path / "dead.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()
    with pytest.raises(kvfabric.Unavailable) as e:
        kvfabric.Client(path, timeout=5)  # opening the session fails
    assert e.value.method == "OpenSession"
    with kvfabric.Client(path, timeout=5, session=False) as c:
        with pytest.raises(kvfabric.Unavailable):
            c.status()


def test_timeout(tmp_path):
    # A listener that never answers: the call ends at its timeout.
    path = str(tmp_path / "silent.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(8)
    try:
        t0 = time.monotonic()
        with pytest.raises(kvfabric.DeadlineExceeded) as e:
            kvfabric.Client(path, timeout=0.3)  # no session opens
        took = time.monotonic() - t0
        assert 0.25 <= took < 10, took
        assert isinstance(e.value, TimeoutError) and e.value.method == "OpenSession"
        with kvfabric.Client(path, timeout=0.3, session=False) as c:
            t0 = time.monotonic()
            with pytest.raises(kvfabric.DeadlineExceeded) as e:
                c.status()
            took = time.monotonic() - t0
            assert 0.25 <= took < 10, took
            assert e.value.method == "Status"
    finally:
        s.close()


def test_a_client_opened_just_after_the_agent_restarted(kvfabric_bin, tmp_path):
    """A client opened while a client of the agent's previous run is still
    open gets a connection of its own: without one, gRPC could hand it the
    old agent's connection, not yet seen closed, and its session would fail
    with "Broken pipe" (about one time in ten here)."""
    import random

    from conftest import Agent

    a = Agent("restarts", f"127.{random.randint(10, 209)}.{random.randint(1, 250)}.1", tmp_path, kvfabric_bin)
    a.start()
    try:
        for i in range(12):
            old = a.client()
            try:
                a.stop()
                a.start()
                with a.client() as c:
                    assert c.session_alive, f"restart {i}"
                    c.status()
            finally:
                old.close()

        async def aio_after_restart() -> None:
            old = await kvfabric.aio.Client(a.socket).open()
            try:
                a.stop()
                a.start()
                async with kvfabric.aio.Client(a.socket) as c:
                    await c.status()
            finally:
                await old.close()

        for _ in range(4):
            asyncio.run(aio_after_restart())
    finally:
        a.stop()


def test_descriptor_socket(node1):
    fd, off, size = receive_descriptor(node1.socket + ".fd", _token(node1))
    try:
        assert off == 0 and size == os.fstat(fd).st_size > 0
    finally:
        os.close(fd)
    with pytest.raises(kvfabric.Unavailable, match="agent says"):
        receive_descriptor(node1.socket + ".fd", "no-such-token")
    for bad in ("", "a\nb", "x" * 251):
        with pytest.raises(kvfabric.InvalidArgument, match="memory token"):
            receive_descriptor(node1.socket + ".fd", bad)


def _token(agent) -> str:
    with agent.client() as c:
        return block_set(c, "shared").memory[0].token


def test_named_file_and_descriptor_share_memory(node1, node2):
    # node1 offers no named file.
    with node1.client(memory="file") as c:
        with pytest.raises(kvfabric.Unavailable, match="no named file"):
            block_set(c, "shared")
    with node2.client(memory="file") as cf, node2.client(memory="descriptor") as cd:
        a, b = block_set(cf, "shared"), block_set(cd, "shared")
        assert a.id == b.id and a.memory[0].file and a.memory[0].token
        [slot] = cf.allocate(a, 1)
        kv = np.random.default_rng(3).standard_normal(a.block_shape).astype(np.float32)
        a.write_block(slot, kv)
        np.testing.assert_array_equal(b.read_block(slot), kv)
        cf.free(a, [slot])


def test_views_outlive_close(node1):
    c = node1.client()
    bs = block_set(c, "close")
    view = bs.rank(1)
    c.close()
    c.close()  # twice is fine
    view[0, 0, 0] = 7.0  # still mapped: the view holds the memory
    assert bs.read_block(0, rank=1)[0, 0, 0, bs.heads(1), 0].tolist() == [7.0] * 2
    with pytest.raises(kvfabric.Unavailable, match="client is closed"):
        c.status()


def test_request_block_limit(node1):
    with node1.client() as c:
        bs = block_set(c, "flow")
        limit = kvfabric.client.MAX_REQUEST_BLOCKS
        assert limit == 1 << 16
        # At the limit the agent answers (none of these is held)...
        assert c.acquire(bs, list(range(1, limit + 1))) == []
        # ...past it the client refuses before sending.
        with pytest.raises(kvfabric.InvalidArgument, match=r"hashes: 65537 \(at most 65536\)"):
            c.acquire(bs, list(range(1, limit + 2)))


def test_memory_token_limit(node1):
    # 250 bytes is a token the socket reads (and does not know); 251 is refused unsent.
    with pytest.raises(kvfabric.Unavailable, match="agent says"):
        receive_descriptor(node1.socket + ".fd", "t" * 250)
    with pytest.raises(kvfabric.InvalidArgument, match="memory token"):
        receive_descriptor(node1.socket + ".fd", "t" * 251)


def test_as_torch(node1):
    with node1.client() as c:
        bs = block_set(c, "close")
        try:
            import torch  # noqa: F401
        except ImportError:
            with pytest.raises(ImportError, match="BlockSet.as_torch needs torch"):
                bs.as_torch(0)
            return
        t = bs.as_torch(1)
        assert tuple(t.shape) == bs.rank(1).shape
        t[2, 1, 0] = 5.0  # the same memory
        assert (bs.rank(1)[2, 1, 0] == 5.0).all()


def test_import_by_set_id(node1):
    with node1.client() as c:
        bs = block_set(c, "dup")
        tokens = list(range(7000, 7000 + 2 * bs.page_size + 1))
        slots = c.allocate(bs, 2)
        c.release(bs, c.register_blocks(bs, slots, tokens=tokens))
        # By id, the client learns the set's page size from the agent.
        got = c.import_blocks(bs.id, tokens=tokens, wait=5)
        assert got.requested == 2 and got.complete and got.slots == slots and got.fetches == []
        c.release(bs.id, got.blocks)
        with pytest.raises(kvfabric.NotFound, match="block set 424242: unknown"):
            c.import_blocks(424242, tokens=tokens)
