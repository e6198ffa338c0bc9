#!/usr/bin/env python3
"""Tokens per second the connector makes available to an engine by loads,
against the plain client importing the same bytes, in the same run.

Two agents of bin/kvfabric on loopback. The holder stores 2*rounds distinct
prompts of --blocks blocks. Each round, on the reader's agent:

- connector: kvfabric.connector's scheduler half answers
  get_num_new_matched_tokens (lookup, then import, in the background; the
  engine polls), the engine allocates, the plan is built and the worker half
  copies every block into the engine's numpy KV cache ([2, blocks, 16,
  heads, dim], FlashAttention's shape), then the step's report releases the
  references: the time from the first question to the last byte in the
  engine's cache.
- baseline: Client.import_blocks of another prompt of the same size (its
  blocks in the agent's pool, nowhere else).

Prints per round both rates and their ratio, then the median ratio.

    python3 python/bench/connector_bench.py --blocks 32 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "examples"))

import kvfabric  # noqa: E402
from engine import start_agents  # noqa: E402
from kvfabric.connector import ConnectorConfig, KVSpec, SchedulerSide, WorkerSide  # noqa: E402

BLOCK = 16


def main() -> None:
    if os.environ.get("KVFABRIC_BENCH_LOG"):
        import logging

        logging.basicConfig(level=logging.INFO)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(HERE.parent.parent / "bin" / "kvfabric"))
    ap.add_argument("--blocks", type=int, default=32, help="blocks per prompt")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    if not os.access(args.bin, os.X_OK):
        raise SystemExit(f"{args.bin}: not built (make build)")
    spec = KVSpec(layers=args.layers, kv_heads=8, head_dim=128, dtype="f16", tp_size=1, block_size=BLOCK)
    rng = random.Random(1)
    # One round more than asked: the first warms both paths up (connections,
    # first measurements) and is not counted.
    args.rounds += 1
    slots = 2 * args.rounds * args.blocks * 5 // 4 + 16  # above the pool's low watermark
    prompts = [[rng.randrange(32000) for _ in range(args.blocks * BLOCK + 1)] for _ in range(2 * args.rounds)]
    with ExitStack() as stack:
        a_sock, b_sock = start_agents(args.bin, stack)
        holder = stack.enter_context(kvfabric.Client(a_sock, engine="bench-holder"))
        hbs = spec.register(holder, slots=slots)
        if hbs.retains < 2 * args.rounds * args.blocks:
            raise SystemExit(f"the holder keeps {hbs.retains} blocks, fewer than the {2 * args.rounds * args.blocks} stored")
        block = np.random.default_rng(2).standard_normal(hbs.block_shape).astype(np.float16)
        for p in prompts:
            s = holder.allocate(hbs, args.blocks)
            for slot in s:
                hbs.write_block(slot, block)
            holder.release(hbs, holder.register_blocks(hbs, s, tokens=p))
        cfg = ConnectorConfig(socket=b_sock, slots=slots, stats_interval=0, save=False)
        sched = SchedulerSide(cfg, spec, engine="bench-engine")
        stack.callback(sched.close)
        worker = WorkerSide(cfg, spec, 0, engine="bench-engine")
        stack.callback(worker.close)
        caches = {f"layers.{i}.attn": np.zeros((2, args.blocks + 1, BLOCK, 8, 128), np.float16) for i in range(args.layers)}
        worker.register_kv_caches(caches)
        plain = stack.enter_context(kvfabric.Client(b_sock, engine="bench-plain"))
        pbs = spec.register(plain, slots=slots)
        assert pbs.id == sched.block_set.id
        deadline = time.monotonic() + 30
        for p in prompts:
            hs = kvfabric.block_hashes(p, BLOCK)
            while not any(o.blocks == args.blocks for o in plain.lookup(hs).overlaps):
                if time.monotonic() > deadline:
                    raise SystemExit("the reader's agent never saw the holder's blocks")
                time.sleep(0.05)
        tokens = args.blocks * BLOCK
        nbytes = args.blocks * hbs.ranks[0].chunk_bytes * 2 * args.layers
        ratios = []
        print(f"{args.blocks} blocks of {nbytes // args.blocks} bytes ({tokens} tokens, {nbytes / 2**20:.1f} MiB) per round")
        for i in range(args.rounds):
            p_conn, p_base = prompts[2 * i], prompts[2 * i + 1]
            if i % 2:  # alternate which goes first
                p_conn, p_base = p_base, p_conn
            t0 = time.perf_counter()
            while (n := sched.matched(f"r{i}", p_conn, 0)) is None:
                time.sleep(0.001)  # an engine step
            if n != tokens:
                raise SystemExit(f"round {i}: the connector matched {n} tokens, want {tokens}: {sched.stats()}")
            t_matched = time.perf_counter() - t0
            sched.allocated(f"r{i}", list(range(args.blocks + 1)), n)
            plan = sched.build({})
            t1 = time.perf_counter()
            worker.load(plan)
            t_copy = time.perf_counter() - t1
            rep = worker.take_report(plan.step)
            sched.report(rep)
            t_conn = time.perf_counter() - t0
            if rep.load_errors or rep.loaded_blocks != args.blocks:
                raise SystemExit(f"round {i}: load errors {sorted(rep.load_errors)}")
            sched.finished(f"r{i}")

            t0 = time.perf_counter()
            got = plain.import_blocks(pbs, kvfabric.block_hashes(p_base, BLOCK))
            t_base = time.perf_counter() - t0
            if not got.complete or not all(r.outcome == kvfabric.Outcome.IMPORTED for r in got.results):
                raise SystemExit(f"round {i}: baseline import incomplete: {got.error}")
            plain.release(pbs, got.blocks)
            conn_tps, base_tps = tokens / t_conn, tokens / t_base
            if i == 0:
                continue
            ratios.append(conn_tps / base_tps)
            print(f"round {i}: connector {conn_tps:,.0f} tokens/s ({nbytes / t_conn / 1e9:.2f} GB/s), "
                  f"plain import {base_tps:,.0f} tokens/s ({nbytes / t_base / 1e9:.2f} GB/s), ratio {ratios[-1]:.2f} "
                  f"(connector: {t_matched * 1e3:.1f} ms to the answer, {t_copy * 1e3:.1f} ms taking and copying)")
        print(f"median ratio {statistics.median(ratios):.2f} (goal: at least 0.8), range {min(ratios):.2f}-{max(ratios):.2f}")


if __name__ == "__main__":
    main()
