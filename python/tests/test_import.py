"""Imports between two agents: TP 4 -> TP 2 across orders and arrangements,
by hashes and by tokens, across page sizes, with fetch reports and
estimates; every element checked."""

from __future__ import annotations

import numpy as np
import pytest

import kvfabric

MODEL = kvfabric.ModelConfig(layers=3, kv_heads=8, head_dim=16, dtype="f32")


def encoded_block(shape: tuple[int, ...], block: int) -> np.ndarray:
    """Every element names itself: (block, layer, plane, token, head, dim)."""
    L, P, T, H, D = np.indices(shape)
    return (((((block * 8 + L) * 2 + P) * 64 + T) * 16 + H) * 32 + D).astype(np.float32)


def store(c: kvfabric.Client, bs: kvfabric.BlockSet, tokens: list[int], first: int = 0) -> list[int]:
    n = len(tokens) // bs.page_size
    slots = c.allocate(bs, n)
    for i, s in enumerate(slots):
        bs.write_block(s, encoded_block(bs.block_shape, first + i))
    refs = c.register_blocks(bs, slots, tokens=tokens)
    c.release(bs, refs)  # cached; others may import them
    return [r.hash for r in refs]


def test_tp4_to_tp2(node1, node2):
    tokens = list(range(5000, 5000 + 6 * 16))
    with node1.client() as src, node2.client() as dst:
        a = src.register(MODEL, 4, 16, "hnd", "contiguous", slots=16, engine="tp4")
        hashes = store(src, a, tokens)
        b = dst.register(MODEL, 2, 16, "nhd", "separate", slots=16, engine="tp2")
        got = dst.import_blocks(b, hashes, wait=15)
        assert got.complete and not got.error, got
        assert [r.hash for r in got.blocks] == hashes
        assert [r.outcome for r in got.results] == [kvfabric.Outcome.IMPORTED] * 6
        assert [r.slot for r in got.results] == got.slots
        [f] = got.fetches
        assert (f.node, f.blocks) == ("node1", 6) and f.transport in ("quic", "rdma")
        # Each block's full shard on both ranks: 6 blocks x 3 layers x K,V x 16 tokens x 8 heads x 16 dims x 4 bytes.
        assert f.bytes == 6 * 3 * 2 * 16 * 8 * 16 * 4
        for i, ref in enumerate(got.blocks):
            # Each rank separately: rank r must hold heads [4r, 4r+4) and nothing else.
            want = encoded_block(b.block_shape, i)
            for r in range(2):
                part = b.read_block(ref.slot, rank=r)
                np.testing.assert_array_equal(part[:, :, :, 4 * r : 4 * r + 4], want[:, :, :, 4 * r : 4 * r + 4])
            np.testing.assert_array_equal(b.read_block(ref.slot), want, err_msg=f"block {i}")

        # Already here: no fetch, the same slots, referenced again.
        again = dst.import_blocks(b, tokens=tokens)
        assert again.complete and again.fetches == [] and again.slots == got.slots
        assert [r.outcome for r in again.results] == [kvfabric.Outcome.LOCAL] * 6
        dst.release(b, again.blocks)
        dst.release(b, got.blocks)

        # The fetch estimate, now measured from node2's import.
        est = dst.lookup(hashes, block_set=b)
        [o] = [o for o in est.overlaps if o.node == "node1"]
        assert o.blocks == 6 and o.fetch_bytes == f.bytes and o.estimate == "measured" and o.fetch_estimate_us > 0


def test_tokens_across_page_sizes(node1, node2):
    # node1 stores pages of 8; node2's page-16 engine imports by tokens.
    tokens = list(range(9000, 9000 + 4 * 16 + 3))
    with node1.client() as src, node2.client() as dst:
        a = src.register(MODEL, 1, 8, "hnd", slots=16, engine="page8")
        store(src, a, tokens[: 8 * 8])
        b = dst.register(MODEL, 2, 16, "hnd", slots=16, engine="page16")
        # The wait looks for page-8 holders too (a divisor of 16).
        got = dst.import_blocks(b, tokens=tokens, wait=15)
        assert got.complete and len(got.blocks) == 4, got
        assert [r.hash for r in got.blocks] == kvfabric.block_hashes(tokens, 16)
        for i, ref in enumerate(got.blocks):
            kv = b.read_block(ref.slot)
            # Page i of 16 is node1's pages 2i and 2i+1 of 8.
            for half in range(2):
                want = encoded_block(a.block_shape, 2 * i + half)
                np.testing.assert_array_equal(kv[:, :, 8 * half : 8 * half + 8], want, err_msg=f"page {i} half {half}")
        dst.release(b, got.blocks)


def test_import_missing(node2):
    with node2.client() as c:
        b = c.register(MODEL, 2, 16, "hnd", slots=16, engine="tp2")
        with pytest.raises((kvfabric.NotFound, kvfabric.Unavailable)) as e:
            c.import_blocks(b, [11, 22, 33], wait=0.2, timeout=5)
        assert e.value.method == "Import"
        with pytest.raises(kvfabric.InvalidArgument, match="tokens: 15 ids make 0 full blocks of 16"):
            c.import_blocks(b, tokens=range(15))
