"""Block hashing: the recipe of docs/architecture.md ("Block identity"), bit for bit Dynamo's KV router (v1).

1. seed = 1337; a LoRA name adds xxh3_64(lora, seed 0), a salt adds
   xxh3_64(salt, seed 1) (wrapping; empty strings count as absent).
2. local[i] = xxh3_64(tokens[i*B:(i+1)*B] as u32 little-endian, seed); only
   full blocks are hashed.
3. seq[0] = local[0]; seq[i] = xxh3_64(le64(seq[i-1]) || le64(local[i]), 1337).

:func:`block_hashes` returns the sequence hashes (the third column of
``kvfabric hash``); :class:`BlockHasher` computes them as an engine appends
tokens.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np
import xxhash

from .errors import InvalidArgument

if not hasattr(xxhash, "xxh3_64_intdigest"):  # pragma: no cover
    raise ImportError(f"kvfabric: xxhash {getattr(xxhash, 'VERSION', '?')} has no xxh3; install xxhash 2.0 or later")

__all__ = ["BASE_SEED", "MAX_BLOCK_SIZE", "BlockHash", "BlockHasher", "block_hashes", "hash_seed"]

#: The seed of the recipe, and of the chaining step.
BASE_SEED = 1337
#: The largest block (page) size the agent accepts (layout.MaxBlockSize).
MAX_BLOCK_SIZE = 1 << 16

_MASK = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1
_pair = struct.Struct("<QQ")


class BlockHash(NamedTuple):
    """The hashes of one full block: its own tokens' and the chained one."""

    local: int
    sequence: int


def hash_seed(salt: str | None = None, lora: str | None = None) -> int:
    """The seed of local hashes in the namespace of salt and lora."""
    seed = BASE_SEED
    if lora:
        seed = (seed + xxhash.xxh3_64_intdigest(lora.encode(), 0)) & _MASK
    if salt:
        seed = (seed + xxhash.xxh3_64_intdigest(salt.encode(), 1)) & _MASK
    return seed


def _check_block_size(page_size: int) -> int:
    if isinstance(page_size, bool) or not isinstance(page_size, (int, np.integer)):
        raise InvalidArgument(f"page_size: {page_size!r} is not an integer")
    if not 1 <= page_size <= MAX_BLOCK_SIZE:
        raise InvalidArgument(f"page_size: {page_size} is not in 1..{MAX_BLOCK_SIZE}")
    return int(page_size)


def token_array(tokens: Sequence[int] | np.ndarray | Iterable[int], what: str = "tokens") -> np.ndarray:
    """tokens as a little-endian u32 array, refusing ids that are not u32."""
    if isinstance(tokens, np.ndarray):
        arr = tokens
        if arr.ndim != 1:
            raise InvalidArgument(f"{what}: want a 1-dimensional sequence of token ids, got shape {arr.shape}")
        if arr.size and arr.dtype.kind not in "ui":
            raise InvalidArgument(f"{what}: dtype {arr.dtype} is not an integer type")
    else:
        seq = tokens if isinstance(tokens, (list, tuple)) else list(tokens)
        for i, t in enumerate(seq):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise InvalidArgument(f"{what}[{i}]: {t!r} is not an integer token id")
        try:
            arr = np.asarray(seq, dtype=np.int64) if seq else np.zeros(0, dtype=np.int64)
        except OverflowError:
            arr = np.asarray([int(t) for t in seq], dtype=object)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 0 or hi > _U32_MAX:
            bad = lo if lo < 0 else hi
            i = int(np.flatnonzero(arr == bad)[0])
            raise InvalidArgument(f"{what}[{i}]: {bad} is not a u32 token id (0..{_U32_MAX})")
    return np.ascontiguousarray(arr, dtype="<u4")


class BlockHasher:
    """Sequence hashes of a token stream, block by block, as tokens arrive.

    ``append`` takes any number of tokens and returns the hashes of the
    blocks they completed; a partial block waits for the rest. ``hashes``
    is every sequence hash so far, ``parent`` the last one (None before the
    first full block): what RegisterBlocks wants as ``parent`` when an
    engine registers the new blocks alone.
    """

    def __init__(self, page_size: int, *, salt: str | None = None, lora: str | None = None) -> None:
        self.page_size = _check_block_size(page_size)
        self.seed = hash_seed(salt, lora)
        self._pending = np.zeros(0, dtype="<u4")
        self._blocks: list[BlockHash] = []

    @property
    def blocks(self) -> list[BlockHash]:
        return list(self._blocks)

    @property
    def hashes(self) -> list[int]:
        return [b.sequence for b in self._blocks]

    @property
    def parent(self) -> int | None:
        return self._blocks[-1].sequence if self._blocks else None

    @property
    def pending(self) -> int:
        """Tokens of the partial block not hashed yet."""
        return int(self._pending.size)

    def append(self, tokens: Sequence[int] | np.ndarray | Iterable[int]) -> list[BlockHash]:
        arr = token_array(tokens)
        if self._pending.size:
            arr = np.concatenate([self._pending, arr])
        b = self.page_size
        full = arr.size // b
        data = arr[: full * b].tobytes()
        self._pending = arr[full * b :].copy()
        out: list[BlockHash] = []
        prev = self._blocks[-1].sequence if self._blocks else None
        step = 4 * b
        for i in range(full):
            local = xxhash.xxh3_64_intdigest(data[i * step : (i + 1) * step], self.seed)
            seq = local if prev is None else xxhash.xxh3_64_intdigest(_pair.pack(prev, local), BASE_SEED)
            out.append(BlockHash(local, seq))
            prev = seq
        self._blocks.extend(out)
        return out


def block_hashes(
    tokens: Sequence[int] | np.ndarray | Iterable[int],
    page_size: int,
    salt: str | None = None,
    lora: str | None = None,
) -> list[int]:
    """The sequence hashes of the full blocks of tokens (``kvfabric hash``'s
    third column); a trailing partial block is ignored."""
    h = BlockHasher(page_size, salt=salt, lora=lora)
    return [b.sequence for b in h.append(tokens)]
