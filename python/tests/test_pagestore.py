"""PageStore (what the SGLang backend keeps pages with) between two real
agents: a page stored on one node is seen and read on the other, byte for
byte; missing pages and a full pool are told, never filled with garbage."""

from __future__ import annotations

import numpy as np
import pytest

import kvfabric
from conftest import wait_for
from kvfabric.pagestore import PageStore, page_hash

PAGE = 3 * 4096 + 100  # not a multiple of anything in particular


def pages(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, PAGE, dtype=np.uint8) for _ in range(n)]


def test_namespaces_separate_keys():
    assert page_hash("k", "m_0_2") != page_hash("k", "m_1_2") != page_hash("k")


def test_store_on_one_node_read_on_the_other(node1, node2):
    keys = [f"page-{i}" for i in range(4)]
    data = pages(4, 1)
    with node1.client() as c1, node2.client() as c2:
        a = PageStore(c1, namespace="pagestore-1")
        b = PageStore(c2, namespace="pagestore-1", page_bytes=PAGE)
        assert a.set_many(keys[:3], data[:3]) == [True] * 3
        assert a.set_many(keys[:1], data[:1]) == [True]  # already here: not written again
        assert a.stats["stored"] == 3
        wait_for("node2 sees 3 pages", lambda: b.exists_prefix(keys) == 3)
        outs = [np.zeros(PAGE, np.uint8) for _ in keys]
        assert b.get_many(keys, outs) == [True, True, True, False]
        for i in range(3):
            np.testing.assert_array_equal(outs[i], data[i])
        assert not outs[3].any()  # the missing page: nothing written
        assert b.stats["imported"] == 3
        # Another namespace (another TP rank) holds nothing of these.
        other = PageStore(c2, namespace="pagestore-2", page_bytes=PAGE)
        assert other.exists_prefix(keys) == 0
        assert other.get_many(keys[:1], outs[:1]) == [False]


def test_wrong_sizes_are_refused(node1):
    with node1.client() as c:
        s = PageStore(c, namespace="sizes", page_bytes=PAGE)
        with pytest.raises(kvfabric.InvalidArgument, match="bytes"):
            s.set_many(["x"], [np.zeros(PAGE - 1, np.uint8)])
        with pytest.raises(kvfabric.InvalidArgument, match="2 keys and 1"):
            s.get_many(["x", "y"], [np.zeros(PAGE, np.uint8)])


def test_full_pool_stores_nothing(node1):
    with node1.client() as c:
        s = PageStore(c, namespace="full", page_bytes=PAGE, slots=4)
        # Hold every slot so that allocating fails.
        bs = s._set(PAGE)
        held = c.allocate(bs, bs.slots)
        try:
            assert s.set_many(["a", "b"], pages(2, 2)) == [False, False]
            assert s.stats["errors"] == 1
        finally:
            c.free(bs, held)
        assert s.set_many(["a"], pages(1, 2)) == [True]
