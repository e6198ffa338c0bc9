"""kvfabric: the Python client for engines of a kvfabric cluster.

An engine talks to the kvfabric agent on its node: it registers its KV
layout and maps the pool memory the agent hands it (numpy views per TP
rank), writes blocks and registers them under their sequence hashes, looks
up which nodes hold a prefix, and imports blocks from them.

    import kvfabric
    with kvfabric.Client("/var/lib/kvfabric/engine.sock") as c:
        bs = c.register(kvfabric.ModelConfig(layers=32, kv_heads=8, head_dim=128, dtype="bf16"),
                        tp_size=2, page_size=16, kv_order="hnd")
        got = c.import_blocks(bs, tokens=prompt, wait=1.0)
        kv = bs.read_block(got.slots[0])      # [layers, 2, page, kv_heads, head_dim]

Hashes are those of ``kvfabric hash`` (and of Dynamo's KV router):
:func:`block_hashes` and :class:`BlockHasher`. Engines on an asyncio loop
use :mod:`kvfabric.aio`, the same calls as coroutines.
"""

from .blockset import Arrangement, BlockSet, DType, KVOrder, ModelConfig
from .client import (
    DEFAULT_SOCKET,
    BlockRef,
    BlockResult,
    Blocks,
    Client,
    DropResult,
    Fetch,
    ImportResult,
    LookupResult,
    Outcome,
    Overlap,
    PrefetchResult,
)
from .cuda import CudaError
from .errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    KvfabricError,
    NotFound,
    PermissionDenied,
    ProtocolError,
    ResourceExhausted,
    Unavailable,
)
from .hashing import BlockHash, BlockHasher, block_hashes, hash_seed

#: The package's version, its one source: pyproject.toml reads it from here.
__version__ = "0.1.0"

__all__ = [
    "Arrangement",
    "BlockHash",
    "BlockHasher",
    "BlockRef",
    "BlockResult",
    "Blocks",
    "BlockSet",
    "Cancelled",
    "Client",
    "CudaError",
    "DEFAULT_SOCKET",
    "DType",
    "DeadlineExceeded",
    "DropResult",
    "FailedPrecondition",
    "Fetch",
    "ImportResult",
    "InvalidArgument",
    "KVOrder",
    "KvfabricError",
    "LookupResult",
    "ModelConfig",
    "NotFound",
    "Outcome",
    "Overlap",
    "PrefetchResult",
    "PermissionDenied",
    "ProtocolError",
    "ResourceExhausted",
    "Unavailable",
    "block_hashes",
    "hash_seed",
]
