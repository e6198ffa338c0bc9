"""Prefetch and the look-up's tiers against an agent with a disk tier."""

from __future__ import annotations

import random
from collections.abc import Iterator

import numpy as np
import pytest

import kvfabric
from conftest import Agent, wait_for

MODEL = kvfabric.ModelConfig(layers=2, kv_heads=4, head_dim=8, dtype="f32")


@pytest.fixture
def tiered(kvfabric_bin: str, tmp_path) -> Iterator[Agent]:
    net = f"127.{random.randint(10, 209)}.{random.randint(1, 250)}."
    extra = ["--tier", f"disk={tmp_path / 'tier'}:16MiB", "--tier-in-flight", "1"]
    a = Agent("tier1", net + "1", tmp_path, kvfabric_bin, extra=extra)
    try:
        a.start()
        yield a
    finally:
        a.stop()


def test_prefetch_and_lookup_tiers(tiered):
    with tiered.client() as c:
        bs = c.register(MODEL, 1, 4, "hnd", slots=16, engine="tiered")
        hashes = list(range(101, 149))  # 48 blocks through 16 slots: most go to disk
        for i in range(0, len(hashes), 4):
            slots = c.allocate(bs, 4)
            for j, s in enumerate(slots):
                bs.write_block(s, np.full(bs.block_shape, i + j + 1, dtype=bs.dtype))
            refs = c.register_blocks(bs, slots, hashes[i:i + 4], parent=hashes[i - 1] if i else None)
            c.release(bs, refs)
        # Copies down run behind the engine's calls (a batch starts a
        # moment after the block that woke it): wait for the last ones.
        # With --tier-in-flight 1 none is dropped for running ahead of the
        # disk (by default an engine that writes faster than the disk
        # loses blocks rather than wait), so all 32 get there.
        st = wait_for("32 blocks on disk", lambda: (s := c.status()).tiers and s.tiers[0].blocks >= 48 - 16 and s)
        assert len(st.tiers) == 1, st.tiers

        with pytest.raises(kvfabric.InvalidArgument, match="give one, not both"):
            c.prefetch(bs)
        res = c.prefetch(bs, hashes)
        assert 0 < res.restored <= res.in_memory and res.error == "", res
        assert res.imported == 0, res  # one agent: nothing held elsewhere
        got = c.acquire(bs, hashes[:res.in_memory])
        assert len(got) == res.in_memory
        assert [int(bs.read_block(r.slot).flat[0]) for r in got] == list(range(1, res.in_memory + 1))
        c.release(bs, got)
        assert c.status().tiers[0].restores == res.restored  # the acquire restored nothing more

        # The look-up says where each block is: the rest is on disk.
        rest = hashes[res.in_memory:res.in_memory + 2]
        # With no_restore it only says so: nothing comes up, twice over.
        restores = c.status().tiers[0].restores
        for _ in range(2):
            assert c.lookup(rest, block_set=bs, no_restore=True).local_tiers == ["disk", "disk"]
        assert c.status().tiers[0].restores == restores
        with pytest.raises(kvfabric.InvalidArgument, match="no_restore"):
            c.lookup(rest, block_set=bs, no_restore=1)  # type: ignore[arg-type]
        look = c.lookup(rest, block_set=bs)
        assert look.local_tiers == ["disk", "disk"], look.local_tiers
        assert c.lookup(rest, block_set=bs).local_tiers == ["host", "host"]  # restored by the first
