"""The connector as vLLM's multiprocess executor runs it (TP > 1): the
scheduler side in one process, each worker side in a process of its own
(started before the scheduler side exists, as vLLM's workers register their
caches first), the step plans pickled between them. The agent hands a block
set to one process only, so the workers must join the scheduler's set by
the token its plans carry: a save by both workers is registered, a later
load by both reads back every byte, and when the scheduler's set changes the
workers follow it."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

import numpy as np

from conftest import wait_for
from kvfabric.connector import CacheKind, ConnectorConfig, KVSpec, SchedulerSide, WorkerSide
from kvfabric.errors import DeadlineExceeded

SPEC = KVSpec(layers=2, kv_heads=4, head_dim=16, dtype="f32", tp_size=2, block_size=16,
              kind=CacheKind.FLASHINFER, kv_order="nhd")
BLOCKS = 16
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(SPEC.layers)]


def _worker(socket: str, rank: int, conn: Any, late_join: bool = False) -> None:
    """One TP rank in a process of its own: caches filled with bytes of
    its own, then the plans conn sends, answering each with the step's
    report and the caches as they are after it. With late_join its first
    join of a block set fails with DEADLINE_EXCEEDED (as a Register queued
    behind others does), and a failed join is tried again with the next
    plan."""
    rng = np.random.default_rng(100 + rank)
    shape = (BLOCKS, 2, SPEC.block_size, SPEC.heads_per_rank(), SPEC.head_dim)
    caches = {name: rng.standard_normal(shape, dtype=np.float32) for name in LAYERS}
    w = WorkerSide(ConnectorConfig(socket=socket, stats_interval=0), SPEC, rank, engine="mp")
    if late_join:
        register, failed = w.client.register, []

        def first_join_fails(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("join") and not failed:
                failed.append(True)
                raise DeadlineExceeded("Register queued past its deadline", method="Register")
            return register(*args, **kwargs)

        w.client.register = first_join_fails  # type: ignore[method-assign]
        w.join_retry_interval = 0.0
    try:
        w.register_kv_caches(caches)
        conn.send("ready")
        while True:
            plan = conn.recv()
            if plan is None:
                return
            w.load(plan)
            w.save(plan)
            conn.send((w.take_report(plan.step), {k: v.copy() for k, v in caches.items()}))
    finally:
        w.close()


def _step(workers: list, plan) -> tuple[Any, list[dict[str, np.ndarray]]]:
    for conn, _ in workers:
        conn.send(plan)
    got = []
    for conn, _ in workers:
        assert conn.poll(60), "a worker did not answer within 60s"
        got.append(conn.recv())
    merged = got[0][0]
    for rep, _ in got[1:]:
        merged = merged.merge(rep)
    return merged, [caches for _, caches in got]


def _start(socket: str, workers: list, late_join: int = -1) -> None:
    """Start a worker process per rank into workers, rank late_join's with
    a first join that fails, and wait until each has its caches."""
    ctx = mp.get_context("spawn")
    for rank in range(SPEC.tp_size):
        parent, child = ctx.Pipe()
        p = ctx.Process(target=_worker, args=(socket, rank, child, rank == late_join), daemon=True)
        p.start()
        child.close()
        workers.append((parent, p))
    for conn, _ in workers:
        assert conn.poll(60) and conn.recv() == "ready"


def _stop(workers: list, sched: SchedulerSide | None) -> None:
    for conn, p in workers:
        try:
            conn.send(None)
        except OSError:
            pass
    for conn, p in workers:
        p.join(30)
        if p.is_alive():
            p.kill()
            p.join()
        conn.close()
    if sched is not None:
        sched.close()


def test_workers_in_processes_of_their_own_save_and_load(node1):
    workers: list = []
    sched = None
    try:
        _start(node1.socket, workers)
        sched = SchedulerSide(ConnectorConfig(socket=node1.socket, stats_interval=0), SPEC, engine="mp")

        # A request computed in engine blocks 0..3: its 3 full blocks saved.
        tokens = list(range(1000, 1000 + 3 * 16 + 5))
        sched.track("r1", tokens, 0)
        plan = sched.build({"r1": ([0, 1, 2, 3], len(tokens))})
        assert [len(s.slots) for s in plan.saves] == [3]
        rep, before = _step(workers, plan)
        assert rep.workers == 2 and all(n == 2 for n in rep.saved.values()) and len(rep.saved) == 3, rep
        sched.report(rep)
        sched.wait_idle()
        assert sched.stats()["saved_blocks"] == 3, sched.stats()
        # No worker made a set of its own: the scheduler's is the engine's one.
        sets = sched.client.status().block_sets
        digest = next(s.layout_digest for s in sets if s.id == sched.block_set.id)
        assert {s.id for s in sets if s.layout_digest == digest} == {sched.block_set.id}

        # The same prefix again, into engine blocks 8..11: loaded by both.
        wait_for("the prefix matched", lambda: sched.matched("r2", tokens, 0) is not None)
        assert sched.matched("r2", tokens, 0) == 3 * 16
        sched.allocated("r2", [8, 9, 10, 11], 3 * 16)
        plan = sched.build({"r2": ([8, 9, 10, 11], 3 * 16)})
        assert [lp.block_ids for lp in plan.loads] == [[8, 9, 10]]
        rep, after = _step(workers, plan)
        sched.report(rep)
        assert rep.workers == 2 and not rep.load_errors and rep.loaded_blocks == 2 * 3, rep
        for rank in range(SPEC.tp_size):
            for name in LAYERS:
                want, got = before[rank][name][0:3], after[rank][name][8:11]
                assert want.tobytes() == got.tobytes(), f"rank {rank} {name}: loaded blocks differ from the saved ones"

        # The scheduler's session ends (a stall past its keepalive): it
        # registers again, and its process gets a new set, the old one being
        # the workers' too. The workers follow its plans there and give the
        # old set up.
        first = sched.block_set.id
        sched.client.close()
        other = list(range(5000, 5000 + 2 * 16 + 1))
        wait_for("the scheduler registered again",
                 lambda: sched.matched("r3", other, 0) is not None and sched.block_set.id != first)
        sched.track("r3", other, 0)
        plan = sched.build({"r3": ([12, 13, 14], len(other))})
        assert plan.block_set != first and [len(s.slots) for s in plan.saves] == [2]
        rep, _ = _step(workers, plan)
        assert rep.workers == 2 and len(rep.saved) == 2 and all(n == 2 for n in rep.saved.values()), rep
        sched.report(rep)
        sched.wait_idle()
        assert sched.stats()["saved_blocks"] == 3 + 2, sched.stats()
        old = next(s for s in sched.client.status().block_sets if s.id == first)
        assert old.sessions == 0, f"block set {first} still used by {old.sessions} sessions after the workers left it"
    finally:
        _stop(workers, sched)


def test_a_join_that_timed_out_is_tried_again(node1):
    """A worker whose first join of the scheduler's set (in the plan's
    load) fails with DEADLINE_EXCEEDED joins with its next call (the plan's
    save), and saves and loads through the set from then on."""
    workers: list = []
    sched = None
    try:
        _start(node1.socket, workers, late_join=0)
        sched = SchedulerSide(ConnectorConfig(socket=node1.socket, stats_interval=0), SPEC, engine="mp")

        tokens = list(range(3000, 3000 + 3 * 16 + 5))
        sched.track("r1", tokens, 0)
        plan = sched.build({"r1": ([4, 5, 6, 7], len(tokens))})
        assert [len(s.slots) for s in plan.saves] == [3]
        rep, before = _step(workers, plan)
        assert rep.workers == 2 and len(rep.saved) == 3 and all(n == 2 for n in rep.saved.values()), rep
        sched.report(rep)
        sched.wait_idle()
        assert sched.stats()["saved_blocks"] == 3, sched.stats()

        wait_for("the prefix matched", lambda: sched.matched("r2", tokens, 0) is not None)
        assert sched.matched("r2", tokens, 0) == 3 * 16
        sched.allocated("r2", [8, 9, 10, 11], 3 * 16)
        plan = sched.build({"r2": ([8, 9, 10, 11], 3 * 16)})
        assert [lp.block_ids for lp in plan.loads] == [[8, 9, 10]]
        rep, after = _step(workers, plan)
        assert rep.workers == 2 and not rep.load_errors and rep.loaded_blocks == 2 * 3, rep
        for rank in range(SPEC.tp_size):
            for name in LAYERS:
                want, got = before[rank][name][4:7], after[rank][name][8:11]
                assert want.tobytes() == got.tobytes(), f"rank {rank} {name}: loaded blocks differ from the saved ones"
    finally:
        _stop(workers, sched)
