#!/usr/bin/env python3
"""A small engine on two agents: store a prompt's KV on one, import it on
another that runs the model at a different TP size, and check every element.

    python3 python/examples/engine.py --store /run/a/engine.sock --load /run/b/engine.sock

With no sockets given it starts two agents of bin/kvfabric on loopback
(--bin to name another binary) and stops them at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from the source tree without installing

import kvfabric  # noqa: E402

MODEL = kvfabric.ModelConfig(layers=4, kv_heads=8, head_dim=64, dtype="f16")
PAGE = 16


def prefill(tokens: list[int], page: int) -> list[np.ndarray]:
    """Stand-in for a forward pass: each block's KV, a function of its tokens."""
    out = []
    for i in range(len(tokens) // page):
        rng = np.random.default_rng(tokens[i * page : (i + 1) * page])
        out.append(rng.standard_normal((MODEL.layers, 2, page, MODEL.kv_heads, MODEL.head_dim)).astype(np.float16))
    return out


def store(c: kvfabric.Client, tokens: list[int]) -> None:
    bs = c.register(MODEL, tp_size=4, page_size=PAGE, kv_order="hnd")
    blocks = prefill(tokens, PAGE)
    slots = c.allocate(bs, len(blocks))
    for slot, kv in zip(slots, blocks):
        bs.write_block(slot, kv)  # each of the 4 ranks takes its 2 heads
    refs = c.register_blocks(bs, slots, tokens=tokens)
    c.release(bs, refs)  # cached for the cluster while the engine runs
    print(f"stored {len(refs)} blocks at TP 4 on {c.status().node}")


def load(c: kvfabric.Client, tokens: list[int]) -> None:
    bs = c.register(MODEL, tp_size=2, page_size=PAGE, kv_order="nhd", arrangement="layer-separate")
    est = c.lookup(tokens=tokens, block_set=bs)
    for o in est.overlaps:
        print(f"  {o.node}: {o.blocks} blocks, fetch estimate {o.estimate} {o.fetch_estimate_us} us")
    got = c.import_blocks(bs, tokens=tokens, wait=10)
    for f in got.fetches:
        print(f"imported {f.blocks} blocks ({f.bytes} bytes) from {f.node} over {f.transport} in {f.micros} us")
    want = prefill(tokens, PAGE)
    if not got.complete:
        raise SystemExit(f"import brought {len(got.blocks)} of {len(want)} blocks: {got.error}")
    for ref, kv in zip(got.blocks, want):
        np.testing.assert_array_equal(bs.read_block(ref.slot), kv)
    c.release(bs, got.blocks)
    print(f"TP 2 on {c.status().node}: all {len(want)} blocks equal, element by element")


def start_agents(binary: str, stack: ExitStack) -> tuple[str, str]:
    root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="kvfabric-example-")))
    net = f"127.{random.randint(10, 209)}.{random.randint(1, 250)}."
    sockets = []
    for i in (1, 2):
        ip, name = net + str(i), f"node{i}"
        args = [binary, "agent", "--local", "--node", name, "--data-dir", str(root / name),
                "--dev-ca-dir", str(root / "ca"), "--gossip-addr", f"{ip}:7946", "--peer-addr", f"{ip}:7947",
                "--metrics-addr", f"{ip}:7948", "--pool", "host=256MiB"]
        if i == 2:
            args += ["--join", net + "1:7946"]
        log = open(root / f"{name}.log", "wb")
        # The agent refuses KVFABRIC_ variables that are not its settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVFABRIC_")}
        p = subprocess.Popen(args, stdout=log, stderr=log, start_new_session=True, env=env)
        stack.callback(lambda p=p: (p.send_signal(signal.SIGTERM), p.wait(10)))
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://{ip}:7948/healthz", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if p.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name} did not start: {(root / (name + '.log')).read_text()[-2000:]}")
            time.sleep(0.05)
        sockets.append(str(root / name / "engine.sock"))
    return sockets[0], sockets[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", help="engine socket of the agent that stores")
    ap.add_argument("--load", help="engine socket of the agent that imports")
    ap.add_argument("--bin", default=str(HERE.parent.parent / "bin" / "kvfabric"), help="kvfabric binary")
    ap.add_argument("--blocks", type=int, default=8, help="prompt length in blocks of 16 tokens")
    args = ap.parse_args()
    tokens = [random.randrange(32_000) for _ in range(args.blocks * PAGE + 5)]
    with ExitStack() as stack:
        if args.store and args.load:
            a, b = args.store, args.load
        elif args.store or args.load:
            raise SystemExit("give both --store and --load, or neither")
        else:
            if not os.access(args.bin, os.X_OK):
                raise SystemExit(f"{args.bin}: not built (make build)")
            a, b = start_agents(args.bin, stack)
        # Two engines, each in its session: what the first stores stays
        # cached while it runs, and the second imports it.
        with kvfabric.Client(a, engine="example-tp4") as ca, kvfabric.Client(b, engine="example-tp2") as cb:
            store(ca, tokens)
            load(cb, tokens)


if __name__ == "__main__":
    main()
