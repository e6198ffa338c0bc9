"""Block sets in GPU memory: agents with device pools on softcuda (the
project's software GPU, built here with gcc as the Go tests build it), the
client opening their CUDA IPC handles through the driver with ctypes, and a
TP 4 -> TP 2 import between two such agents checked element by element."""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Iterator

import numpy as np
import pytest

import kvfabric
from conftest import REPO, Agent, Cluster, wait_for
from test_import import MODEL, encoded_block


@pytest.fixture(scope="session")
def softcuda(tmp_path_factory: pytest.TempPathFactory) -> str:
    """libsoftcuda.so, compiled as pool/cuda/softcuda.Build does."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is needed to build softcuda for the device-pool tests")
    out = tmp_path_factory.mktemp("softcuda") / "libsoftcuda.so"
    src = REPO / "pool" / "cuda" / "softcuda" / "csrc" / "softcuda.c"
    subprocess.run([gcc, "-std=gnu11", "-O2", "-Wall", "-shared", "-fPIC", "-o", str(out), str(src), "-lpthread"], check=True)
    return str(out)


@pytest.fixture(scope="module")
def gpus(kvfabric_bin: str, softcuda: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two agents, each with a 32 MiB device pool on its own softcuda GPU
    (RDMA off: imports go over QUIC through pinned staging)."""
    root = tmp_path_factory.mktemp("kvfabric-gpu")
    net = f"127.{random.randint(210, 250)}.{random.randint(1, 250)}."
    extra = ["--pool", "device:0=32MiB", "--cuda-library", softcuda, "--rdma", "off"]
    env = {"SOFTCUDA_MEMORY": "64M"}
    a = Agent("gpu1", net + "1", root, kvfabric_bin, extra=extra, env=env)
    b = Agent("gpu2", net + "2", root, kvfabric_bin, extra=extra, env=env)
    c = Cluster([a, b])
    try:
        a.start()
        b.start(join=a.gossip)
        for ag in c.agents:
            with ag.client() as cl:
                wait_for(f"{ag.name} sees both members", lambda: sum(m.state == "alive" for m in cl.status().members) == 2)
        yield c
    finally:
        for ag in reversed(c.agents):
            ag.stop()


def test_device_tp4_to_tp2(gpus, softcuda):
    tokens = list(range(7000, 7000 + 6 * 16))
    src_agent, dst_agent = gpus[0], gpus[1]
    with src_agent.client(cuda=softcuda) as src, dst_agent.client(cuda=softcuda) as dst:
        [pool] = src.status().pools
        assert (pool.kind, pool.size_bytes) == ("device", 32 << 20)
        a = src.register(MODEL, 4, 16, "hnd", "contiguous", slots=16, engine="gpu-tp4")
        assert a.on_device and a.views == [] and a.buffers == []
        assert all(len(m.cuda_ipc_handle) == 64 and m.pci_bus_id for m in a.memory)
        with pytest.raises(kvfabric.FailedPrecondition, match="GPU memory: no numpy views"):
            a.rank(0)
        slots = src.allocate(a, 6)
        for i, s in enumerate(slots):
            a.write_block(s, encoded_block(a.block_shape, i))
        # Read back through the driver: the bytes are in the agent's GPU.
        np.testing.assert_array_equal(a.read_block(slots[5]), encoded_block(a.block_shape, 5))
        refs = src.register_blocks(a, slots, tokens=tokens)
        src.release(a, refs)
        hashes = [r.hash for r in refs]

        # Layer-separate on the importer: one driver copy per (layer, K/V).
        b = dst.register(MODEL, 2, 16, "nhd", "separate", slots=16, engine="gpu-tp2")
        assert b.on_device
        got = dst.import_blocks(b, hashes, wait=15)
        assert got.complete and not got.error, got
        assert [r.hash for r in got.blocks] == hashes
        [f] = got.fetches
        assert (f.node, f.blocks, f.transport) == ("gpu1", 6, "quic")
        for i, ref in enumerate(got.blocks):
            want = encoded_block(b.block_shape, i)
            for r in range(2):
                part = b.read_block(ref.slot, rank=r)
                np.testing.assert_array_equal(part[:, :, :, 4 * r : 4 * r + 4], want[:, :, :, 4 * r : 4 * r + 4])
                # Heads the rank does not hold stay as out had them (zeros).
                assert not part[:, :, :, : 4 * r].any() and not part[:, :, :, 4 * r + 4 :].any()
            np.testing.assert_array_equal(b.read_block(ref.slot), want, err_msg=f"block {i}")
        dst.release(b, got.blocks)


def test_device_bad_input(gpus, softcuda):
    c = gpus[0].client(cuda=softcuda)
    with c:
        bs = c.register(MODEL, 2, 16, "hnd", slots=8, engine="gpu-bad")
        with pytest.raises(kvfabric.InvalidArgument, match=r"kv: shape \(3, 2, 16, 8, 8\), want \(3, 2, 16, 8, 16\)"):
            bs.write_block(0, np.zeros((3, 2, 16, 8, 8), dtype=np.float32))
        with pytest.raises(kvfabric.InvalidArgument, match="slot: 8 is not in 0..7"):
            bs.read_block(8)
        with pytest.raises(kvfabric.InvalidArgument, match="kv: dtype float64"):
            bs.write_block(0, np.zeros(bs.block_shape))
        # The last slot, whole: the region's last byte is inside the allocation.
        last = encoded_block(bs.block_shape, 99)
        bs.write_block(7, last)
        np.testing.assert_array_equal(bs.read_block(7), last)
    # The client closed its IPC mappings: no copy reaches the device now.
    with pytest.raises(kvfabric.Unavailable, match="device memory: closed"):
        bs.read_block(7)


def test_device_without_driver(gpus, tmp_path):
    missing = str(tmp_path / "libcuda.so.1")
    with gpus[0].client(cuda=missing) as c:
        with pytest.raises(kvfabric.Unavailable, match=r"CUDA driver .*libcuda.so.1: cannot load it .*KVFABRIC_CUDA_LIB") as e:
            c.register(MODEL, 1, 16, "hnd", slots=4, engine="gpu-nodriver")
        assert e.value.code.name == "UNAVAILABLE"
    # A library that is not a CUDA driver is named as such.
    with gpus[0].client(cuda="libm.so.6") as c:
        with pytest.raises(kvfabric.Unavailable, match="libm.so.6: no cuInit: not a CUDA driver library"):
            c.register(MODEL, 1, 16, "hnd", slots=4, engine="gpu-notcuda")


def test_device_spans_gpus(kvfabric_bin, softcuda, tmp_path, monkeypatch):
    """An agent with a device pool on each of two GPUs: a TP 2 block set
    placed by the engine (rank 0 on GPU 1 by PCI bus id, rank 1 on GPU 0 by
    index) lands where asked, and blocks written through the driver read
    back from each rank's GPU."""
    net = f"127.{random.randint(210, 250)}.{random.randint(1, 250)}."
    # Strict: a copy on the wrong GPU's context is refused, so the bytes
    # reach each rank only through its own GPU.
    env = {"SOFTCUDA_MEMORY": "64M", "SOFTCUDA_DEVICES": "2", "SOFTCUDA_PCI_BUS_IDS": "0000:18:00.0,0000:2a:00.0",
           "SOFTCUDA_STRICT_DEVICE": "1"}
    # The client's own softcuda sees the same two GPUs: a copy of the
    # library under another path is loaded afresh and reads them at cuInit.
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    softcuda = shutil.copy(softcuda, tmp_path / "libsoftcuda2.so")
    a = Agent("gpus2", net + "1", tmp_path, kvfabric_bin, env=env,
              extra=["--pool", "device=16MiB", "--cuda-library", str(softcuda), "--rdma", "off"])
    try:
        a.start()
        with a.client(cuda=str(softcuda)) as c:
            assert [(p.kind, p.device) for p in c.status().pools] == [("device", 0), ("device", 1)]
            bs = c.register(MODEL, 2, 16, "hnd", slots=8, devices=["0000:2A:00.0", 0], engine="placed")
            assert [m.cuda_device for m in bs.memory] == [1, 0]
            pools = c.status().pools
            assert [p.block_sets for p in pools] == [1, 1]
            assert pools[0].carved_bytes == pools[1].carved_bytes == bs.memory[0].size
            assert bs.memory[0].cuda_ipc_handle != bs.memory[1].cuda_ipc_handle
            want = encoded_block(bs.block_shape, 3)
            bs.write_block(5, want)
            np.testing.assert_array_equal(bs.read_block(5), want)
            with pytest.raises(kvfabric.InvalidArgument, match=r"devices\[1\]: \"7\" names no GPU with a device pool"):
                c.register(MODEL, 2, 16, "hnd", slots=8, devices=["0", "7"], engine="bad")
            with pytest.raises(kvfabric.InvalidArgument, match="devices: 1 entries for tp_size 2"):
                c.register(MODEL, 2, 16, "hnd", slots=8, devices=["0"], engine="bad")
            with pytest.raises(kvfabric.InvalidArgument, match=r"devices\[0\]: -1 is not"):
                c.register(MODEL, 2, 16, "hnd", slots=8, devices=[-1, 0], engine="bad")
            # Empty is the default placement: rank r on GPU r.
            default = c.register(MODEL, 2, 16, "nhd", slots=8, devices=[], engine="default")
            assert [m.cuda_device for m in default.memory] == [0, 1]
    finally:
        a.stop()


def test_drop_closes_device_memory_no_other_set_uses(gpus, softcuda):
    """A device pool hands every block set the pool's one IPC handle:
    dropping one set leaves the memory open for the client's other set,
    and dropping that one too closes it."""
    with gpus[0].client(cuda=softcuda) as c:
        x = c.register(MODEL, 1, 16, slots=4, engine="gpu-drop-x")
        y = c.register(MODEL, 1, 8, slots=4, engine="gpu-drop-y")
        assert x.id != y.id and x.device[0] is y.device[0]
        mem = y.device[0]
        assert c.drop_block_set(x).still_mapped == 0
        assert x.dropped and not mem.closed
        with pytest.raises(kvfabric.FailedPrecondition, match="dropped"):
            x.read_block(0)
        with pytest.raises(kvfabric.FailedPrecondition, match=f"block set {x.id} was dropped"):
            x.device[0]
        [s] = c.allocate(y, 1)
        y.write_block(s, encoded_block(y.block_shape, 3))
        np.testing.assert_array_equal(y.read_block(s), encoded_block(y.block_shape, 3))
        c.drop_block_set(y)
        assert mem.closed, "device memory of the client's dropped sets is still open"


def test_a_worker_following_another_set_of_the_pool_keeps_its_device_memory_open(gpus, softcuda):
    """Every set of a device pool shares the pool's one IPC handle: a
    connector worker following another set joins it before it drops the one
    it had, so the device memory stays open (not closed and opened again
    with every set followed); the set it had is dropped all the same, and
    so is it where the join fails."""
    from kvfabric.connector import ConnectorConfig, StepPlan, WorkerSide, incarnation
    from test_connector import SPEC, _session_sets

    with gpus[0].client(cuda=softcuda, engine="gpu-follow-scheduler") as c, gpus[0].client(cuda=softcuda) as wc:
        first, second, third = (SPEC.register(c, slots=n) for n in (4, 6, 8))
        w = WorkerSide(ConnectorConfig(socket=gpus[0].socket, stats_interval=0), SPEC, 0, wc, engine="gpu-follow")
        shape = (2, 8, SPEC.block_size, SPEC.heads_per_rank(), SPEC.head_dim)
        w.register_kv_caches({f"model.layers.{i}.self_attn.attn": np.zeros(shape, np.float32) for i in range(SPEC.layers)})
        w._follow(StepPlan(1, first.id, incarnation=incarnation(first), join_token=first.join_token))
        had = w.block_set
        assert had is not None and had.id == first.id
        mem = had.device[0]
        w._follow(StepPlan(2, second.id, incarnation=incarnation(second), join_token=second.join_token))
        assert w.block_set is not None and w.block_set.id == second.id
        assert had.dropped and _session_sets(c, wc.session) == [second.id]
        assert w.block_set.device[0] is mem and not mem.closed, "the pool's device memory was closed and opened again"
        w._follow(StepPlan(3, third.id, incarnation=incarnation(third), join_token="join-wrong"))
        assert w.block_set is None and _session_sets(c, wc.session) == []
        assert mem.closed, "the worker's client still holds the pool's device memory"
