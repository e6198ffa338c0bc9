"""Pages of bytes under string keys, kept in a kvfabric cluster.

What :mod:`kvfabric.sglang` stores SGLang's HiCache pages with, without
SGLang: a page is a fixed number of bytes (every page of one store has the
same size), its key any string (SGLang's page hashes). A key is kept as the
kvfabric block whose hash is xxh3-64 of the key and the store's namespace
(model and TP shard), in a block set whose blocks are single pages of bytes.
A page another node holds is imported on ``get``; ``exists`` sees the whole
cluster through the agent's index.

    store = PageStore(client, namespace="llama-8b_0_2")
    store.set_many(["k1", "k2"], [page1, page2])       # numpy uint8 arrays
    n = store.exists_prefix(["k1", "k2", "k3"])        # 2: leading keys held
    store.get_many(["k1", "k2"], [out1, out2])         # [True, True]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from .blockset import BlockSet, ModelConfig
from .client import Client
from .errors import InvalidArgument, KvfabricError, ResourceExhausted

__all__ = ["PageStore", "page_hash"]

_SEED = 0x6B7666  # "kvf"


def page_hash(key: str, namespace: str = "") -> int:
    """The kvfabric block hash of a page key in a namespace."""
    return xxhash.xxh3_64_intdigest((namespace + "\x00" + key).encode(), _SEED)


class PageStore:
    """Fixed-size pages in the cluster (see the module doc). page_bytes: the
    size of every page, or 0 to take it from the first page stored or read.
    slots: the block set's slots (0: the agent's default)."""

    def __init__(self, client: Client, *, namespace: str = "", page_bytes: int = 0, slots: int = 0,
                 import_timeout: float = 10.0) -> None:
        if page_bytes < 0 or page_bytes >= 1 << 32:
            raise InvalidArgument(f"page_bytes: {page_bytes} is not in 0..2^32-1")
        self.client = client
        self.namespace = namespace
        self.page_bytes = page_bytes
        self.slots = slots
        self.import_timeout = import_timeout
        self._bs: BlockSet | None = None
        self._lock = threading.Lock()
        self.stats = {"gets": 0, "hits": 0, "imported": 0, "sets": 0, "stored": 0, "errors": 0}

    def _set(self, page_bytes: int) -> BlockSet:
        with self._lock:
            if self._bs is not None:
                if page_bytes != self.page_bytes:
                    raise InvalidArgument(f"page of {page_bytes} bytes; this store's pages have {self.page_bytes}")
                return self._bs
            if self.page_bytes and page_bytes != self.page_bytes:
                raise InvalidArgument(f"page of {page_bytes} bytes; this store's pages have {self.page_bytes}")
            if not 0 < page_bytes < 1 << 32:
                raise InvalidArgument(f"page of {page_bytes} bytes (1..2^32-1)")
            self.page_bytes = page_bytes
            # One "token" of page_bytes bytes: the block is the page.
            self._bs = self.client.register(ModelConfig(1, 1, page_bytes, "u8", mla=True), 1, 1, "nhd", slots=self.slots,
                                            engine=self.client.engine)
            return self._bs

    def _view(self, slot: int) -> np.ndarray:
        assert self._bs is not None
        return self._bs.rank(0)[slot].reshape(-1)

    def hashes(self, keys: Sequence[str]) -> list[int]:
        return [page_hash(k, self.namespace) for k in keys]

    def exists_prefix(self, keys: Sequence[str]) -> int:
        """How many leading keys one node of the cluster holds (this one
        included)."""
        if not keys:
            return 0
        try:
            found = self.client.lookup(self.hashes(keys))
        except KvfabricError:
            self.stats["errors"] += 1
            return 0
        return max((o.blocks for o in found.overlaps), default=0)

    def get_many(self, keys: Sequence[str], outs: Sequence[np.ndarray]) -> list[bool]:
        """Read the pages of keys into outs (uint8 arrays of page_bytes,
        written in place); True per page read. Stops at the first page the
        cluster does not have: nothing is written for it or after it."""
        if len(keys) != len(outs):
            raise InvalidArgument(f"{len(keys)} keys and {len(outs)} buffers")
        if not keys:
            return []
        for i, o in enumerate(outs):
            if o.dtype != np.uint8 or o.ndim != 1:
                raise InvalidArgument(f"outs[{i}]: want a 1-dimensional uint8 array, got {o.dtype} {o.shape}")
        bs = self._set(outs[0].size)
        self.stats["gets"] += len(keys)
        hashes = self.hashes(keys)
        refs: list = []
        try:
            refs = list(self.client.acquire(bs, hashes))
            if len(refs) < len(hashes):
                got = self.client.import_blocks(bs, hashes[len(refs):], timeout=self.import_timeout)
                self.stats["imported"] += sum(1 for r in got.results if r.outcome.name == "IMPORTED")
                refs += list(got.blocks)
        except KvfabricError:
            self.stats["errors"] += 1  # nothing held (NotFound, Unavailable): the refs taken are read
        ok = [False] * len(keys)
        try:
            for i, r in enumerate(refs):
                if r.hash != hashes[i]:
                    break
                if outs[i].size != self.page_bytes:
                    raise InvalidArgument(f"outs[{i}]: {outs[i].size} bytes, pages have {self.page_bytes}")
                np.copyto(outs[i], self._view(r.slot))
                ok[i] = True
        finally:
            if refs:
                try:
                    self.client.release(bs, refs)
                except KvfabricError:
                    pass
        self.stats["hits"] += sum(ok)
        return ok

    def set_many(self, keys: Sequence[str], pages: Sequence[Any]) -> list[bool]:
        """Store pages (uint8 arrays, or anything np.asarray makes one of)
        under keys; True per page stored or already held here. A full pool
        stores nothing (False)."""
        if len(keys) != len(pages):
            raise InvalidArgument(f"{len(keys)} keys and {len(pages)} pages")
        if not keys:
            return []
        arrs = [np.asarray(p).reshape(-1).view(np.uint8) for p in pages]
        bs = self._set(arrs[0].size)
        for i, a in enumerate(arrs):
            if a.size != self.page_bytes:
                raise InvalidArgument(f"pages[{i}]: {a.size} bytes, pages have {self.page_bytes}")
        self.stats["sets"] += len(keys)
        hashes = self.hashes(keys)
        ok = [False] * len(keys)
        # Pages already here are not written again.
        have = set()
        try:
            for r in self.client.acquire(bs, hashes).results:
                if r.referenced:
                    have.add(r.hash)
                    self.client.release(bs, [r.slot])
            todo = [i for i, h in enumerate(hashes) if h not in have]
            for i, h in enumerate(hashes):
                if h in have:
                    ok[i] = True
            if not todo:
                return ok
            slots = self.client.allocate(bs, len(todo))
            for i, s in zip(todo, slots):
                np.copyto(self._view(s), arrs[i])
            refs = self.client.register_blocks(bs, slots, [hashes[i] for i in todo])
            stored = {r.request_slot for r in refs.results if r.referenced}
            refused = [r.request_slot for r in refs.results if not r.referenced]
            if refused:
                self.client.free(bs, refused)
            self.client.release(bs, refs)
            for i, s in zip(todo, slots):
                ok[i] = s in stored
            self.stats["stored"] += len(stored)
        except ResourceExhausted:
            self.stats["errors"] += 1
        except KvfabricError:
            self.stats["errors"] += 1
        return ok
