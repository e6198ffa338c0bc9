"""Block hashes against the known values of docs/architecture.md and the kvfabric binary."""

from __future__ import annotations

import random
import subprocess

import numpy as np
import pytest

import kvfabric
from kvfabric.hashing import MAX_BLOCK_SIZE


def test_known_values():
    # docs/architecture.md, Block identity: block size 4, no salt, no LoRA.
    blocks = kvfabric.BlockHasher(4).append([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    assert [b.local for b in blocks] == [14643705804678351452, 16777012769546811212, 483935686894639516]
    assert [b.sequence for b in blocks] == [14643705804678351452, 4945711292740353085, 12583592247330656132]


def binary_hashes(bin: str, tokens: list[int], block_size: int, salt: str = "", lora: str = "") -> list[tuple[int, int]]:
    out = subprocess.run(
        [bin, "hash", "--block-size", str(block_size), "--salt", salt, "--lora", lora],
        input=" ".join(map(str, tokens)),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines()]
    assert all(int(r[0]) == i for i, r in enumerate(rows))
    return [(int(r[1]), int(r[2])) for r in rows]


@pytest.mark.parametrize(
    "block_size,salt,lora",
    [(1, "", ""), (4, "", ""), (16, "", ""), (7, "", ""), (16, "model-fp", ""), (16, "", "adapter-a"), (32, "s", "l")],
)
def test_matches_binary(kvfabric_bin, block_size, salt, lora):
    rng = random.Random(block_size * 1000 + len(salt) + len(lora))
    # Include the extremes of u32 and a trailing partial block.
    tokens = [0, 2**32 - 1] + [rng.randrange(2**32) for _ in range(block_size * 9 + block_size // 2)]
    want = binary_hashes(kvfabric_bin, tokens, block_size, salt, lora)
    assert len(want) == len(tokens) // block_size
    got = kvfabric.BlockHasher(block_size, salt=salt or None, lora=lora or None).append(tokens)
    assert [(b.local, b.sequence) for b in got] == want
    assert kvfabric.block_hashes(tokens, block_size, salt=salt, lora=lora) == [s for _, s in want]
    # numpy input hashes the same.
    assert kvfabric.block_hashes(np.array(tokens, dtype=np.uint32), block_size, salt, lora) == [s for _, s in want]


def test_incremental_equals_batch():
    rng = random.Random(7)
    tokens = [rng.randrange(50_000) for _ in range(16 * 20 + 5)]
    whole = kvfabric.block_hashes(tokens, 16, salt="x")
    h = kvfabric.BlockHasher(16, salt="x")
    got, i = [], 0
    while i < len(tokens):
        n = rng.randrange(0, 40)  # empty appends and ones that complete several blocks
        got += [b.sequence for b in h.append(tokens[i : i + n])]
        i += n
    assert got == whole == h.hashes
    assert h.parent == whole[-1]
    assert h.pending == 5


def test_parent_and_empty():
    h = kvfabric.BlockHasher(4)
    assert h.parent is None and h.append([1, 2, 3]) == [] and h.hashes == []
    assert kvfabric.block_hashes([], 16) == []


@pytest.mark.parametrize("page", [1, MAX_BLOCK_SIZE])
def test_page_size_at_limits(page):
    assert len(kvfabric.block_hashes(range(page), page)) == 1


@pytest.mark.parametrize(
    "tokens,page,match",
    [
        ([1, -1], 4, r"tokens\[1\]: -1 is not a u32"),
        ([2**32], 4, r"tokens\[0\]: 4294967296 is not a u32"),
        ([1, 2.5], 4, r"tokens\[1\]: 2.5 is not an integer"),
        (np.zeros((2, 2), dtype=np.uint32), 4, "1-dimensional"),
        (np.zeros(4, dtype=np.float32), 4, "dtype float32"),
        ([1, 2, 3, 4], 0, r"page_size: 0 is not in 1\.\.65536"),
        ([1, 2, 3, 4], MAX_BLOCK_SIZE + 1, r"page_size: 65537 is not in 1\.\.65536"),
    ],
)
def test_bad_input(tokens, page, match):
    with pytest.raises(kvfabric.InvalidArgument, match=match):
        kvfabric.block_hashes(tokens, page)
