"""kvfabric.sglang against SGLang 0.5.23 itself: the backend is a real
HiCacheStorage, SGLang's StorageBackendFactory builds it from the dynamic
backend's extra config, and pages move between two agents through the
calls SGLang's cache controller makes (batch_exists, batch_set_v1,
batch_get_v1, and the generic get/set)."""

from __future__ import annotations

import pytest
import torch

from kvfabric_test_agents import wait_for

import kvfabric

import sglang  # noqa: E402  (make engines-venv installs it; missing is a failure)

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from kvfabric.sglang import SGLANG_VERSION, KVFabricStorage  # noqa: E402

PAGE, LAYERS, HEADS, DIM = 16, 2, 2, 8


class HostPool:
    """The three calls of SGLang's layer-first MHA host pool
    (MHATokenToKVPoolHost) the backend uses, over [layers, 2, tokens, heads,
    dim] float16: a flat page is [layers][K,V][page][heads][dim]."""

    def __init__(self, tokens: int) -> None:
        self.page_size = PAGE
        self.dtype = torch.float16
        self.buf = torch.zeros(LAYERS, 2, tokens, HEADS, DIM, dtype=self.dtype)

    def get_data_page(self, index, flat=True):
        i = int(index)
        return self.buf[:, :, i : i + PAGE].contiguous().flatten()

    def get_dummy_flat_data_page(self):
        return torch.zeros(LAYERS * 2 * PAGE * HEADS * DIM, dtype=self.dtype)

    def set_from_flat_data_page(self, index, data_page):
        i = int(index)
        self.buf[:, :, i : i + PAGE] = data_page.view(self.dtype).reshape(LAYERS, 2, PAGE, HEADS, DIM)


def storage_config(socket: str, rank: int = 0, **extra) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=rank, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=False, model_name="org/tiny",
        extra_config={"backend_name": "kvfabric", "module_path": "kvfabric.sglang", "class_name": "KVFabricStorage",
                      "interface_v1": 1, "socket": socket, **extra},
    )


def make(socket: str, pool: HostPool, rank: int = 0) -> KVFabricStorage:
    b = StorageBackendFactory.create_backend("dynamic", storage_config(socket, rank), pool)
    assert isinstance(b, KVFabricStorage)
    b.register_mem_pool_host(pool)
    return b


def test_version_and_base():
    assert sglang.__version__ == SGLANG_VERSION
    assert issubclass(KVFabricStorage, HiCacheStorage)
    assert not getattr(KVFabricStorage, "__abstractmethods__", set())


def test_unknown_setting_is_refused(node1):
    with pytest.raises(kvfabric.InvalidArgument, match="sokcet"):
        StorageBackendFactory.create_backend("dynamic", storage_config(node1.socket, sokcet="/x"), None)


def test_pages_move_between_nodes(node1, node2):
    keys = [f"{i:064x}" for i in range(1, 5)]  # SGLang's keys: sha256 hex
    src_pool, dst_pool = HostPool(8 * PAGE), HostPool(8 * PAGE)
    torch.manual_seed(5)
    src_pool.buf.copy_(torch.randn_like(src_pool.buf))
    a = make(node1.socket, src_pool)
    b = make(node2.socket, dst_pool)
    other_rank = make(node2.socket, HostPool(PAGE), rank=1)
    try:
        # Backup of pages 0..2 (host slots 0, 16, 32).
        assert a.batch_set_v1(keys[:3], torch.arange(0, 3 * PAGE)) == [True] * 3
        wait_for("node2 sees the pages", lambda: b.batch_exists(keys) == 3)
        assert other_rank.batch_exists(keys) == 0  # rank 1's shard is another key
        # Prefetch into host slots 64.. on node2.
        ok = b.batch_get_v1(keys, torch.arange(4 * PAGE, 8 * PAGE))
        assert ok == [True, True, True, False]
        torch.testing.assert_close(dst_pool.buf[:, :, 4 * PAGE : 7 * PAGE], src_pool.buf[:, :, : 3 * PAGE], rtol=0, atol=0)
        assert not dst_pool.buf[:, :, 7 * PAGE :].any()  # the missing page: untouched
        # The generic forms.
        page = src_pool.get_data_page(3 * PAGE)
        assert a.set(keys[3], page)
        assert a.exists(keys[3])
        wait_for("node2 sees page 3", lambda: b.exists(keys[3]))
        out = b.get(keys[3], dst_pool.get_dummy_flat_data_page())
        assert out is not None and torch.equal(out, page)
        assert b.get("0" * 64, dst_pool.get_dummy_flat_data_page()) is None
        assert b.get_stats()["imported"] == 4
    finally:
        for s in (a, b, other_rank):
            s.close()


def test_ranks_holding_different_bytes_of_a_page_never_share_it():
    """The namespace tells apart what SGLang's file backend tells apart:
    TP ranks (unless MLA), pipeline stages, attention context-parallel
    ranks, decode context-parallel shards."""
    from dataclasses import replace

    from kvfabric.sglang import page_namespace

    base = storage_config("/unused")
    variants = [
        replace(base, tp_rank=1),
        replace(base, pp_size=2, pp_rank=1),
        replace(base, attn_cp_size=2, attn_cp_rank=1),
        replace(base, model_name="org/other"),
    ]
    names = {page_namespace(base)} | {page_namespace(v) for v in variants}
    assert len(names) == 1 + len(variants), names
    mla = replace(base, is_mla_model=True)
    assert page_namespace(mla) == page_namespace(replace(mla, tp_rank=1)), "MLA pages are alike on every TP rank"
    assert page_namespace(replace(mla, attn_cp_size=2, attn_cp_rank=1)) != page_namespace(mla)
