"""Sessions: every call carries the client's, and its end (close, interpreter
exit, a killed process, a dropped block set) gives back what it held."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import grpc
import numpy as np
import pytest

import kvfabric
from conftest import wait_for

MODEL = kvfabric.ModelConfig(layers=2, kv_heads=2, head_dim=8, dtype="f16")


def session_of(c: kvfabric.Client, sid: int):
    return next((s for s in c.status().sessions if s.id == sid), None)


def set_status(c: kvfabric.Client, set_id: int):
    return next((s for s in c.status().block_sets if s.id == set_id), None)


def test_session_opened_and_listed(node1):
    with node1.client(engine="listed") as c:
        assert c.session > 0 and c.session_alive
        bs = c.register(MODEL, 1, 12, slots=8)
        c.allocate(bs, 3)
        s = session_of(c, c.session)
        assert s is not None and s.engine == "listed" and s.pid == os.getpid()
        assert list(s.block_sets) == [bs.id] and s.slots == 3
    assert not c.session_alive
    with node1.client() as other:
        wait_for("closed session gone", lambda: session_of(other, c.session) is None)


def test_end_releases_references_and_slots(node1):
    with node1.client(engine="keeper") as keeper:
        # keeper uses the set too, so that it outlives the first engine.
        shared = keeper.register(MODEL, 1, 13, slots=8)
        a = node1.client(engine="leaver")
        bs = a.register(MODEL, 1, 13, slots=8)
        assert bs.id == shared.id
        slots = a.allocate(bs, 4)
        tokens = list(range(2 * 13))
        refs = a.register_blocks(bs, slots[:2], tokens=tokens)
        assert len(a.acquire(bs, [r.hash for r in refs])) == 2  # two references each
        # Held: 2 registered blocks referenced, 2 slots allocated.
        with pytest.raises(kvfabric.ResourceExhausted):
            keeper.allocate(shared, 8)
        held = session_of(keeper, a.session)
        assert held.refs == 4 and held.slots == 2
        a.close()
        wait_for("leaver's session gone", lambda: session_of(keeper, a.session) is None)
        # Nothing referenced: the registered blocks stay cached...
        assert [r.slot for r in keeper.acquire(shared, [r.hash for r in refs])] == [r.slot for r in refs]
        keeper.release(shared, [r.slot for r in refs])
        # ...and the whole set can be allocated (recycling them).
        assert len(keeper.allocate(shared, 8)) == 8


ENGINE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {pkg!r})
    import kvfabric
    c = kvfabric.Client({socket!r}, engine="child")
    bs = c.register(kvfabric.ModelConfig(2, 2, 8, "f16"), 1, 14, slots=8)
    c.allocate(bs, 8)
    print(c.session, bs.id, flush=True)
    sys.stdin.readline()  # the test has looked; SIGKILL may come instead
    # exits without close: the interpreter's exit ends the session
    """
)


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_process_end_releases(node1, how):
    pkg = os.path.dirname(os.path.dirname(kvfabric.__file__))
    with node1.client(engine="after") as c:
        bs = c.register(MODEL, 1, 14, slots=8)
        code = ENGINE.format(pkg=pkg, socket=node1.socket)
        with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
            try:
                sid, child_set = map(int, p.stdout.readline().split())
                assert session_of(c, sid).slots == 8
                # Another process: a set of its own, never this one's memory.
                assert child_set != bs.id
                assert set_status(c, child_set).free == 0
                if how == "sigkill":
                    p.send_signal(signal.SIGKILL)
                else:
                    p.stdin.write("exit\n")
                    p.stdin.flush()
                assert p.wait(20) == (0 if how == "exit" else -signal.SIGKILL)
            finally:
                if p.poll() is None:
                    p.kill()
        wait_for(f"child's session gone after {how}", lambda: session_of(c, sid) is None)
        assert set_status(c, child_set).free == 8
        assert len(c.allocate(bs, 8)) == 8


def test_drop_block_set(node1):
    with node1.client() as c:
        bs = c.register(MODEL, 1, 15, slots=8)
        slots = c.allocate(bs, 3)
        c.register_blocks(bs, slots[:1], tokens=range(15))
        assert c.drop_block_set(bs) == kvfabric.DropResult(released=1, freed=2)
        with pytest.raises(kvfabric.FailedPrecondition, match="does not use it"):
            c.drop_block_set(bs)  # dropped already
        s = session_of(c, c.session)
        assert s is None or bs.id not in s.block_sets
        with pytest.raises(kvfabric.NotFound):
            c.drop_block_set(999_999)


def _mapped(path: str) -> bool:
    """Whether this process maps the file at path (/proc/self/maps)."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return any(real in line for line in f)


def test_drop_block_set_unmaps_its_memory(node2):
    """Dropping a block set unmaps its memory, where no view of it is in
    use, at once; a view taken before keeps its mapping, still readable,
    until it goes, and the set's BlockSet refuses to be used."""
    with node2.client(memory="file") as c:
        bs = c.register(MODEL, 1, 13, slots=8)
        path = bs.memory[0].file
        assert path and _mapped(path), path
        mem = bs.buffers[0]
        assert c.drop_block_set(bs).still_mapped == 0
        assert mem.closed and not _mapped(path), "the dropped set's memory is still mapped"
        with pytest.raises(kvfabric.FailedPrecondition, match="dropped"):
            bs.rank(0)
        with pytest.raises(kvfabric.FailedPrecondition, match="dropped"):
            bs.write_block(0, np.zeros(bs.block_shape, bs.dtype))
        with pytest.raises(kvfabric.FailedPrecondition, match="dropped"):
            bs.read_block(0)
        for accessor in ("views", "buffers", "device"):
            with pytest.raises(kvfabric.FailedPrecondition, match=f"block set {bs.id} was dropped"):
                getattr(bs, accessor)[0]

        bs = c.register(MODEL, 1, 14, slots=8)
        path = bs.memory[0].file
        view = bs.block(0, 3)
        view[...] = 7
        mem = bs.buffers[0]
        assert c.drop_block_set(bs).still_mapped == 1
        assert not mem.closed and _mapped(path) and (view == 7).all()
        del view, mem
        assert not _mapped(path), "the dropped set's memory is still mapped after its last view went"


def test_every_call_carries_the_session(node1):
    c = node1.client()
    bs = c.register(MODEL, 1, 12, slots=8)
    c._session.close()  # the session ends; the connection stays
    wait_for("session gone", lambda: session_of(kvfabric.Client(node1.socket, session=False), c.session) is None)
    calls = {
        "Register": lambda: c.register(MODEL, 1, 12, slots=8),
        "Allocate": lambda: c.allocate(bs, 1),
        "Free": lambda: c.free(bs, [0]),
        "RegisterBlocks": lambda: c.register_blocks(bs, [0], [1]),
        "Acquire": lambda: c.acquire(bs, [1]),
        "Release": lambda: c.release(bs, [0]),
        "Import": lambda: c.import_blocks(bs, [1]),
        "DropBlockSet": lambda: c.drop_block_set(bs),
    }
    for name, call in calls.items():
        with pytest.raises(kvfabric.FailedPrecondition) as e:
            call()
        assert e.value.method == name
    c.close()


def test_bad_session_header(node1):
    with node1.client(session=False) as c:
        assert c.session == 0
        for value, cls in (("abc", kvfabric.InvalidArgument), ("123456789", kvfabric.FailedPrecondition)):
            c._metadata = (("kvfabric-session", value),)
            with pytest.raises(cls):
                c.allocate(1, 1)


def test_per_block_outcomes(node1):
    with node1.client() as c:
        bs = c.register(MODEL, 1, 16, slots=8)
        tokens = list(range(300, 300 + 2 * 16))
        hashes = kvfabric.block_hashes(tokens, 16)
        [s0] = c.allocate(bs, 1)
        bs.write_block(s0, np.ones(bs.block_shape, dtype=np.float16))
        # A slot this engine never allocated beside a good one.
        stranger = next(i for i in range(bs.slots) if i != s0)
        refs = c.register_blocks(bs, [s0, stranger], hashes)
        assert [r.outcome for r in refs.results] == [kvfabric.Outcome.REGISTERED, kvfabric.Outcome.REFUSED]
        bad = refs.results[1]
        assert bad.request_slot == stranger and bad.reason and bad.code == grpc.StatusCode.FAILED_PRECONDITION
        assert not bad.referenced and refs.results[0].referenced
        assert [r.slot for r in refs] == [s0]

        got = c.acquire(bs, [hashes[0], hashes[1], hashes[0]])
        assert [r.outcome for r in got.results] == [kvfabric.Outcome.ACQUIRED, kvfabric.Outcome.MISSING, kvfabric.Outcome.SKIPPED]
        assert len(got) == 1

        imp = c.import_blocks(bs, [hashes[0], 777], timeout=5)
        assert [r.outcome for r in imp.results][:1] == [kvfabric.Outcome.LOCAL]
        assert imp.results[1].outcome == kvfabric.Outcome.MISSING and imp.results[1].reason
        assert not imp.complete and imp.error


def test_keepalive(node2):
    from conftest import KEEPALIVE_MS

    bound = KEEPALIVE_MS / 1000
    with node2.client() as c:
        assert c._session.keepalive == pytest.approx(bound)
        bs = c.register(MODEL, 1, 17, slots=4)
        [slot] = c.allocate(bs, 1)
        # Idle for five bounds: the keepalives hold the session.
        deadline = time.monotonic() + 5 * bound
        while time.monotonic() < deadline:
            time.sleep(bound / 2)
            assert c.session_alive and session_of(c, c.session) is not None
        c.free(bs, [slot])

        # Keepalives stop: the agent ends the session, and the client sees it.
        c._session._period = 3600
        wait_for("session ended by the agent", lambda: not c.session_alive, timeout=10 + 20 * bound)
        assert c._session.ended
        with pytest.raises(kvfabric.FailedPrecondition):
            c.allocate(bs, 1)


def test_collected_client_ends_its_session(node1):
    import gc

    c = node1.client(engine="forgotten")
    sid = c.session
    del c  # never closed
    gc.collect()
    with node1.client() as other:
        wait_for("forgotten session gone", lambda: session_of(other, sid) is None)
