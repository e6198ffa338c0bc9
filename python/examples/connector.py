#!/usr/bin/env python3
"""Two engines sharing a prefix through kvfabric's KV connector.

Engine A (TP 2, FlashAttention's cache shape) serves a prompt on one agent
and saves its full blocks into the cluster; engine B (TP 1, FlashInfer's
shape over an HND pool) serves a prompt with the same prefix on another
agent, loads the prefix from A's node instead of computing it, and computes
only the rest. Both engines are kvfabric.harness stand-ins that call the
connector as vLLM 0.33 does; every element B's cache holds is checked.

    python3 python/examples/connector.py                # starts two agents of bin/kvfabric
    python3 python/examples/connector.py --a /run/a/engine.sock --b /run/b/engine.sock
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from contextlib import ExitStack
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from the source tree without installing
sys.path.insert(0, str(HERE))

import kvfabric  # noqa: E402
from engine import start_agents  # noqa: E402
from kvfabric.connector import CacheKind, KVSpec  # noqa: E402
from kvfabric.harness import SimEngine  # noqa: E402

BLOCK = 16


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", help="engine socket of engine A's agent")
    ap.add_argument("--b", help="engine socket of engine B's agent")
    ap.add_argument("--bin", default=str(HERE.parent.parent / "bin" / "kvfabric"), help="kvfabric binary")
    ap.add_argument("--blocks", type=int, default=8, help="shared prefix, in blocks of 16 tokens")
    args = ap.parse_args()
    rng = random.Random(7)
    prefix = [rng.randrange(32000) for _ in range(args.blocks * BLOCK)]
    spec_a = KVSpec(layers=4, kv_heads=4, head_dim=32, dtype="f16", tp_size=2, block_size=BLOCK, kind=CacheKind.FLASH)
    spec_b = KVSpec(layers=4, kv_heads=4, head_dim=32, dtype="f16", tp_size=1, block_size=BLOCK,
                    kind=CacheKind.FLASHINFER, kv_order="hnd")
    with ExitStack() as stack:
        if args.a and args.b:
            a_sock, b_sock = args.a, args.b
        elif args.a or args.b:
            raise SystemExit("give both --a and --b, or neither")
        else:
            if not os.access(args.bin, os.X_OK):
                raise SystemExit(f"{args.bin}: not built (make build)")
            a_sock, b_sock = start_agents(args.bin, stack)
        a = SimEngine(a_sock, spec_a, name="engine-a")
        stack.callback(a.close)
        b = SimEngine(b_sock, spec_b, name="engine-b")
        stack.callback(b.close)

        ra = a.add("a-1", prefix + [1, 2, 3, 4, 5])
        a.run()
        a.check(ra)
        a.scheduler.wait_idle()
        print(f"engine A (TP 2): computed {ra.computed} tokens, saved {a.scheduler.stats()['saved_blocks']} blocks")

        # Gossip spreads A's blocks to B's agent.
        hashes = kvfabric.block_hashes(prefix, BLOCK)
        deadline = time.monotonic() + 20
        c = b.scheduler.client
        while not any(o.blocks == len(hashes) for o in c.lookup(hashes).overlaps):
            if time.monotonic() > deadline:
                raise SystemExit("engine B's agent never saw A's blocks")
            time.sleep(0.05)

        prompt_b = prefix + [9, 8, 7]
        rb = b.add("b-1", prompt_b)
        b.run()
        checked = b.check(rb)
        s = b.scheduler.stats()
        print(f"engine B (TP 1): loaded {rb.loaded} of {len(prompt_b)} prompt tokens "
              f"({s['loaded_bytes']} bytes, {s['load_errors']} load errors), computed the rest")
        print(f"engine B: all {checked} tokens' KV equal the model's, element by element")
        if rb.loaded != len(prefix):
            raise SystemExit(f"engine B loaded {rb.loaded} tokens, want {len(prefix)}")


if __name__ == "__main__":
    main()
