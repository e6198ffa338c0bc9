"""SGLang's HiCache storage backend for kvfabric: ``KVFabricStorage``.

Targets SGLang 0.5.23 (``HiCacheStorage`` of
``sglang/srt/mem_cache/hicache_storage.py``). Importing this module imports
SGLang and torch; ``import kvfabric`` does not. Enable it with SGLang's
dynamic backend:

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvfabric",
            "module_path": "kvfabric.sglang", "class_name": "KVFabricStorage",
            "interface_v1": 1, "socket": "/var/lib/kvfabric/engine.sock"}'

How SGLang 0.5.23 calls it (``managers/cache_controller.py``): the factory
builds it as ``KVFabricStorage(storage_config, kwargs)`` and then calls
``register_mem_pool_host(host_pool)``. A prefetch asks
``batch_exists(page_hashes)`` (the leading pages held), then reads them with
``batch_get_v1(keys, host_indices)`` when the extra config says
``interface_v1`` (else ``batch_get(keys, dummy_pages)`` and SGLang copies);
a backup writes with ``batch_set_v1(keys, host_indices)`` (else
``batch_set(keys, pages)``). ``get``, ``set`` and ``exists`` are the
single-page forms.

Keys are SGLang's page hashes (hex strings of the chained token hashes),
suffixed as SGLang's file backend does (``page_namespace``): the model
name; unless the model is MLA (replicated across ranks), the TP rank and
size; the pipeline stage, the attention context-parallel rank and the decode
context-parallel shard, so each rank keeps its own shard. The logic is :class:`kvfabric.pagestore.PageStore`'s;
a read copies the page from the agent's pool into a page buffer that
SGLang's host pool then takes (``set_from_flat_data_page``, its own copy);
a write copies SGLang's page (``get_data_page``) into the pool. The pool is
not exposed to SGLang's host buffers directly (``get_page_buffer_meta``'s
zero-copy path is not used).
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo

from .client import Client
from .errors import InvalidArgument
from .pagestore import PageStore

__all__ = ["KVFabricStorage", "SGLANG_VERSION"]

#: SGLang's version this backend is written against.
SGLANG_VERSION = "0.5.23"

_KNOWN = {"backend_name", "module_path", "class_name", "interface_v1", "socket", "slots", "import_timeout"}


def _raw(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's bytes as a flat uint8 numpy array over its memory."""
    if t.device.type != "cpu":
        raise InvalidArgument(f"page on {t.device}: the kvfabric backend reads and writes host pages")
    return t.contiguous().view(torch.uint8).reshape(-1).numpy()


def page_namespace(c: HiCacheStorageConfig) -> str:
    """The namespace of a rank's page keys, as SGLang's file backend keys
    its files: the model; the TP rank and size unless the model is MLA
    (replicated across TP ranks); the pipeline stage; the attention
    context-parallel rank (each holds a disjoint slice of every page); and,
    under decode context parallelism, the TP size, DCP rank and size and
    logical page size. Ranks that hold different bytes for one page key
    never share a block."""
    model = "-".join((c.model_name or "").split("/"))
    shard = f"_{c.pp_size}_{c.pp_rank}" if c.pp_size > 1 else ""
    cp_size = getattr(c, "attn_cp_size", 1) or 1
    if cp_size > 1:
        shard += f"_cp{c.attn_cp_rank}_{cp_size}"
    ns = f"{model}{shard}" if c.is_mla_model else f"{model}_{c.tp_rank}_{c.tp_size}{shard}"
    if getattr(c, "dcp_size", 1) > 1:
        ns += f"_tp{c.tp_size}_dcp{c.dcp_rank}_{c.dcp_size}_page{c.logical_page_size}"
    return ns


class KVFabricStorage(HiCacheStorage):
    """kvfabric as a HiCache storage backend (see the module doc)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None) -> None:
        extra = dict(storage_config.extra_config or {})
        unknown = sorted(set(extra) - _KNOWN)
        if unknown:
            raise InvalidArgument(f"kvfabric backend: unknown setting(s) {unknown}; known: {sorted(_KNOWN)}")
        self.client = Client(extra.get("socket") or None, engine=f"sglang-{storage_config.tp_rank}")
        self.store = PageStore(self.client, namespace=page_namespace(storage_config), slots=int(extra.get("slots", 0)),
                               import_timeout=float(extra.get("import_timeout", 10.0)))
        self.mem_pool_host: Any = None

    # -- zero-copy forms (interface_v1) ----------------------------------

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        pool = self.mem_pool_host
        page = pool.page_size
        bufs = [pool.get_dummy_flat_data_page() for _ in keys]
        ok = self.store.get_many(keys, [_raw(b) for b in bufs])
        for i, good in enumerate(ok):
            if not good:
                break
            pool.set_from_flat_data_page(host_indices[i * page], bufs[i])
        return ok

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        pool = self.mem_pool_host
        page = pool.page_size
        pages = [_raw(pool.get_data_page(host_indices[i * page], flat=True)) for i in range(len(keys))]
        return self.store.set_many(keys, pages)

    # -- the generic forms -----------------------------------------------

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[torch.Tensor | None]:
        if target_locations is None or len(target_locations) != len(keys) or any(t is None for t in target_locations):
            raise InvalidArgument("kvfabric backend: get needs a target tensor per key (SGLang's dummy pages)")
        for i, t in enumerate(target_locations):
            if not t.is_contiguous():
                # Pages are written in place: a copy of a strided tensor
                # would take the bytes instead of SGLang's buffer.
                raise InvalidArgument(f"kvfabric backend: get's target {i} is not contiguous")
        ok = self.store.get_many(keys, [_raw(t) for t in target_locations])
        return [t if good else None for t, good in zip(target_locations, ok)]

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        if values is None or len(values) != len(keys):
            raise InvalidArgument("kvfabric backend: set needs a value per key")
        return all(self.store.set_many(keys, [_raw(v) for v in values]))

    def exists(self, key: str) -> bool:
        return self.store.exists_prefix([key]) == 1

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        return self.store.exists_prefix(keys)

    def get_stats(self) -> dict[str, int]:
        return dict(self.store.stats)

    def close(self) -> None:
        self.client.close()
