"""NIXL and Mooncake's transfer engine moving bytes between two processes.

The reference points that testbed/peers-bench.sh sets beside kvfabric's
TCP lane: a target process registers SIZE bytes of host memory filled
with a known pattern; an initiator process registers as much, connects to
the target over loopback and reads the whole of it in blocks of BLOCK
bytes, ITERS times. Only the reads are timed; before each one the
initiator's buffer is zeroed and after it every byte is checked against
the pattern (both untimed).

- nixl: NIXL's Python agent with the UCX backend, UCX limited to its TCP
  transport on lo (UCX_TLS=tcp, UCX_NET_DEVICES=lo). One transfer request
  of SIZE/BLOCK descriptors, prepared once and posted once per iteration
  (NIXL's reuse of a prepared request), polled until done.
- mooncake: Mooncake's TransferEngine, protocol "tcp", metadata by its
  peer-to-peer handshake (no metadata server), one batch_transfer_sync_read
  of SIZE/BLOCK blocks per iteration.

Each result is one JSON line on stdout:
  {"peer": "nixl", "gbps": [..per iteration..], "bytes": SIZE}
or, where the peer cannot run here,
  {"peer": "nixl", "error": "what failed, as the library said it"}

Usage: python peers_bench.py --peer nixl|mooncake --size BYTES --block BYTES --iters N
The target role (--role target) is this script started by itself.
"""

import argparse
import base64
import json
import os
import subprocess
import sys
import time
import traceback

import numpy as np

# An odd 64-bit multiplier: word i of the pattern is i * MULT mod 2^64, so
# that every 8 bytes differ and a block read from the wrong place shows.
MULT = np.uint64(0x9E3779B97F4A7C15)
CHECK_WORDS = 8 << 20  # words per step of the check (64 MiB)


def fill(buf: np.ndarray) -> None:
    words = buf.view(np.uint64)
    for lo in range(0, len(words), CHECK_WORDS):
        hi = min(len(words), lo + CHECK_WORDS)
        words[lo:hi] = np.arange(lo, hi, dtype=np.uint64) * MULT


def check(buf: np.ndarray) -> None:
    words = buf.view(np.uint64)
    for lo in range(0, len(words), CHECK_WORDS):
        hi = min(len(words), lo + CHECK_WORDS)
        want = np.arange(lo, hi, dtype=np.uint64) * MULT
        bad = np.nonzero(words[lo:hi] != want)[0]
        if len(bad):
            raise AssertionError(f"byte {8 * (lo + int(bad[0]))}: read differs from the target's")


# Lines of the protocol between the two roles, and the results, start
# with MARK: the libraries print to stdout too.
MARK = "@peers "


def send(obj) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def recv(f) -> dict:
    """The next protocol line from f, skipping the libraries' output."""
    for line in f:
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise EOFError("the target process ended before it answered")


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


# --- NIXL ----------------------------------------------------------------

def nixl_target(size: int, block: int) -> None:
    from nixl._api import nixl_agent, nixl_agent_config

    agent = nixl_agent("target", nixl_agent_config(backends=["UCX"]))
    buf = np.empty(size, dtype=np.uint8)
    fill(buf)
    reg = agent.get_reg_descs([(buf.ctypes.data, size, 0, "")], "DRAM")
    agent.register_memory(reg)
    base = buf.ctypes.data
    xfer = agent.get_xfer_descs([(base + off, block, 0) for off in range(0, size, block)], "DRAM")
    send({"meta": b64(agent.get_agent_metadata()), "descs": b64(agent.get_serialized_descs(xfer))})
    # The initiator's metadata, so that the target can answer it; then
    # wait for the initiator to say it is done.
    agent.add_remote_agent(base64.b64decode(recv(sys.stdin)["meta"]))
    sys.stdin.readline()
    agent.deregister_memory(reg)


def nixl_initiator(target: subprocess.Popen, size: int, block: int, iters: int) -> list[float]:
    from nixl._api import nixl_agent, nixl_agent_config

    hello = recv(target.stdout)
    agent = nixl_agent("initiator", nixl_agent_config(backends=["UCX"]))
    buf = np.zeros(size, dtype=np.uint8)
    reg = agent.get_reg_descs([(buf.ctypes.data, size, 0, "")], "DRAM")
    agent.register_memory(reg)
    remote = agent.add_remote_agent(base64.b64decode(hello["meta"]))
    target.stdin.write(MARK + json.dumps({"meta": b64(agent.get_agent_metadata())}) + "\n")
    target.stdin.flush()
    base = buf.ctypes.data
    local = agent.get_xfer_descs([(base + off, block, 0) for off in range(0, size, block)], "DRAM")
    remote_descs = agent.deserialize_descs(base64.b64decode(hello["descs"]))
    handle = agent.initialize_xfer("READ", local, remote_descs, remote)
    out = []
    for it in range(iters + 1):  # the first is a warm-up (connection setup)
        buf[:] = 0
        t0 = time.perf_counter()
        state = agent.transfer(handle)
        while state == "PROC":
            state = agent.check_xfer_state(handle)
        dt = time.perf_counter() - t0
        if state != "DONE":
            raise RuntimeError(f"NIXL transfer ended in state {state}")
        check(buf)
        if it > 0:
            out.append(size / dt / 1e9)
    agent.release_xfer_handle(handle)
    agent.deregister_memory(reg)
    agent.remove_remote_agent(remote)
    target.stdin.write("done\n")
    target.stdin.flush()
    return out


# --- Mooncake ------------------------------------------------------------

def mooncake_engine():
    from mooncake.engine import TransferEngine

    te = TransferEngine()
    rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise RuntimeError(f"TransferEngine.initialize(127.0.0.1, P2PHANDSHAKE, tcp) returned {rc}")
    return te


def mooncake_target(size: int, block: int) -> None:
    te = mooncake_engine()
    buf = np.empty(size, dtype=np.uint8)
    fill(buf)
    rc = te.register_memory(buf.ctypes.data, size)
    if rc != 0:
        raise RuntimeError(f"TransferEngine.register_memory returned {rc}")
    send({"addr": buf.ctypes.data, "port": te.get_rpc_port()})
    sys.stdin.readline()
    te.unregister_memory(buf.ctypes.data)


def mooncake_initiator(target: subprocess.Popen, size: int, block: int, iters: int) -> list[float]:
    hello = recv(target.stdout)
    te = mooncake_engine()
    buf = np.zeros(size, dtype=np.uint8)
    rc = te.register_memory(buf.ctypes.data, size)
    if rc != 0:
        raise RuntimeError(f"TransferEngine.register_memory returned {rc}")
    peer = f"127.0.0.1:{hello['port']}"
    offs = list(range(0, size, block))
    local = [buf.ctypes.data + o for o in offs]
    remote = [hello["addr"] + o for o in offs]
    lens = [min(block, size - o) for o in offs]
    out = []
    for it in range(iters + 1):  # the first is a warm-up (handshake)
        buf[:] = 0
        t0 = time.perf_counter()
        rc = te.batch_transfer_sync_read(peer, local, remote, lens)
        dt = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"TransferEngine.batch_transfer_sync_read returned {rc}")
        check(buf)
        if it > 0:
            out.append(size / dt / 1e9)
    te.unregister_memory(buf.ctypes.data)
    target.stdin.write("done\n")
    target.stdin.flush()
    return out


ROLES = {"nixl": (nixl_target, nixl_initiator), "mooncake": (mooncake_target, mooncake_initiator)}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--peer", choices=sorted(ROLES), required=True)
    p.add_argument("--size", type=int, default=1 << 30)
    p.add_argument("--block", type=int, default=2 << 20)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--role", choices=["initiator", "target"], default="initiator")
    a = p.parse_args()
    if a.size % a.block or a.block % 8:
        p.error("--size must be a multiple of --block, and --block of 8")
    target_fn, initiator_fn = ROLES[a.peer]
    if a.role == "target":
        target_fn(a.size, a.block)
        return 0
    cmd = [sys.executable, os.path.abspath(__file__), "--role", "target", "--peer", a.peer,
           "--size", str(a.size), "--block", str(a.block)]
    target = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = initiator_fn(target, a.size, a.block, a.iters)
        target.wait(timeout=30)
        send({"peer": a.peer, "bytes": a.size, "block": a.block, "gbps": [round(x, 3) for x in out]})
        return 0
    except Exception as e:  # what the library said, for the report
        target.kill()
        _, err = target.communicate()
        detail = "".join(traceback.format_exception_only(e)).strip()
        tail = " | ".join(line for line in err.strip().splitlines()[-5:])
        send({"peer": a.peer, "error": detail + (f" (target: {tail})" if tail else "")})
        return 1


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: NIXL 1.5.1's agent faults (SIGSEGV) in the
    # interpreter's teardown, after every transfer has completed and been
    # checked.
    os._exit(rc)
