"""Block sets registered on a real agent: the numpy views and the block
helpers put every element where engine.proto's RankLayout formula says."""

from __future__ import annotations

import numpy as np
import pytest

import kvfabric

# (description, model, tp, page, order, arrangement)
LAYOUTS = [
    ("f16 nhd contiguous tp2", kvfabric.ModelConfig(2, 4, 8, "f16"), 2, 16, "nhd", "contiguous"),
    ("f32 hnd layer-separate tp4", kvfabric.ModelConfig(3, 4, 8, "f32"), 4, 8, "hnd", "separate"),
    ("bf16 replicated heads tp4 > 2 heads", kvfabric.ModelConfig(2, 2, 16, "bf16"), 4, 16, "hnd", "contiguous"),
    ("mla one plane, every rank all of it", kvfabric.ModelConfig(2, 1, 64, "bf16", mla=True), 2, 16, "nhd", "separate"),
    ("fp8 nhd tp1", kvfabric.ModelConfig(2, 8, 16, "fp8_e4m3"), 1, 4, "nhd", "contiguous"),
]


def random_block(bs: kvfabric.BlockSet, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if bs.model.dtype.raw:
        return rng.integers(0, np.iinfo(bs.dtype).max, size=bs.block_shape, dtype=bs.dtype)
    return rng.standard_normal(bs.block_shape).astype(bs.dtype)


def formula_offsets(bs: kvfabric.BlockSet, r: int, slot: int) -> tuple[np.ndarray, tuple[slice, ...]]:
    """Byte offsets, by engine.proto's formula, of every element rank r holds
    of slot, indexed [layer, plane, token, local head, dim]; and the slice of
    the full block they hold."""
    rl = bs.ranks[r]
    m = bs.model
    heads = len(rl.head_ids)
    L, P, T, H, D = np.ix_(range(m.layers), range(bs.planes), range(bs.page_size), range(heads), range(m.head_dim))
    if bs.kv_order == kvfabric.KVOrder.NHD:
        index = (T * heads + H) * m.head_dim + D
    else:
        index = (H * bs.page_size + T) * m.head_dim + D
    off = rl.offset + slot * rl.block_stride + L * rl.layer_stride + P * rl.kv_stride + index * rl.element_bytes
    return off, (slice(None), slice(None), slice(None), slice(rl.head_ids[0], rl.head_ids[-1] + 1), slice(None))


@pytest.mark.parametrize("desc,model,tp,page,order,arr", LAYOUTS, ids=[x[0] for x in LAYOUTS])
def test_views_follow_the_formula(node1, desc, model, tp, page, order, arr):
    with node1.client() as c:
        bs = c.register(model, tp, page, order, arr, slots=8)
        assert (bs.tp_size, bs.page_size, bs.slots) == (tp, page, 8)
        assert bs.kv_order == kvfabric.KVOrder.parse(order, "") and bs.arrangement == kvfabric.Arrangement.parse(arr, "")
        for r in range(tp):
            assert bs.rank(r).shape == (8, model.layers, bs.planes, *bs.ranks[r].chunk_shape)
        if model.mla:
            assert all(list(rl.head_ids) == [0] and rl.replicas == tp for rl in bs.ranks)
        if tp > model.kv_heads and not model.mla:
            # TP/H ranks hold each head: rank r holds head r/(TP/H).
            assert [list(rl.head_ids) for rl in bs.ranks] == [[r // (tp // model.kv_heads)] for r in range(tp)]

        slots = c.allocate(bs, 2)
        # Every slot there is: the first and the last.
        for slot, seed in ((slots[0], 1), (slots[1], 2)):
            kv = random_block(bs, seed)
            bs.write_block(slot, kv)
            for r in range(tp):
                raw = np.frombuffer(bs.buffers[r], dtype=np.uint8)
                off, held = formula_offsets(bs, r, slot)
                want = kv[held].view(np.uint8).reshape(*kv[held].shape, bs.dtype.itemsize)
                got = np.stack([raw[off + i] for i in range(bs.dtype.itemsize)], axis=-1)
                np.testing.assert_array_equal(got, want, err_msg=f"rank {r} slot {slot}")
                # One rank's read fills exactly its heads.
                part = bs.read_block(slot, rank=r)
                np.testing.assert_array_equal(part[held], kv[held])
                outside = np.ones(part.shape[3], dtype=bool)
                outside[held[3]] = False
                assert not part[:, :, :, outside, :].any()
            np.testing.assert_array_equal(bs.read_block(slot), kv)
        c.free(bs, slots)


def test_block_helpers_refuse_bad_input(node1):
    with node1.client() as c:
        bs = c.register(kvfabric.ModelConfig(2, 4, 8, "f16"), 2, 16, "hnd", slots=8)
        kv = np.zeros(bs.block_shape, dtype=np.float16)
        bs.write_block(7, kv)  # the last slot
        with pytest.raises(kvfabric.InvalidArgument, match=r"slot: 8 is not in 0\.\.7"):
            bs.write_block(8, kv)
        with pytest.raises(kvfabric.InvalidArgument, match=r"slot: -1 is not in 0\.\.7"):
            bs.read_block(-1)
        with pytest.raises(kvfabric.InvalidArgument, match=r"rank: 2 is not in 0\.\.1"):
            bs.read_block(0, rank=2)
        with pytest.raises(kvfabric.InvalidArgument, match=r"kv: shape \(2, 2, 16, 2, 8\), want \(2, 2, 16, 4, 8\)"):
            bs.write_block(0, np.zeros((2, 2, 16, 2, 8), dtype=np.float16))
        with pytest.raises(kvfabric.InvalidArgument, match=r"kv: dtype float32, want float16 for F16"):
            bs.write_block(0, kv.astype(np.float32))
        with pytest.raises(kvfabric.InvalidArgument, match="kv: want a numpy array, got list"):
            bs.write_block(0, kv.tolist())
        with pytest.raises(kvfabric.InvalidArgument, match=r"out: shape"):
            bs.read_block(0, out=np.zeros((1, 2, 3), dtype=np.float16))

        mla = c.register(kvfabric.ModelConfig(2, 1, 32, "bf16", mla=True), 2, 16, slots=4)
        with pytest.raises(kvfabric.InvalidArgument, match=r"want \(2, 1, 16, 1, 32\).*MLA has one plane"):
            mla.write_block(0, np.zeros((2, 2, 16, 1, 32), dtype=np.uint16))
        # bf16 has no numpy dtype: any 2-byte dtype is taken as raw bits.
        mla.write_block(0, np.full((2, 1, 16, 1, 32), 1.5, dtype=np.float16))
        assert (mla.read_block(0).view(np.float16) == 1.5).all()
