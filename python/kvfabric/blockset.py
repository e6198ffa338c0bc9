"""Block sets: a layout's memory mapped, as numpy views per TP rank.

A rank's view has the shape ``[slot][layer][plane][chunk...]`` whatever the
arrangement (fully contiguous or layer-separate: only the strides differ),
with the chunk ``[tokens][heads][head_dim]`` for NHD and
``[heads][tokens][head_dim]`` for HND; plane 0 is K (or MLA's latent), 1 is
V. The strides are the agent's (RegisterResponse.ranks), never re-derived:

    offset + s*block_stride + l*layer_stride + p*kv_stride + index(t, h, d)*element_bytes

:meth:`BlockSet.write_block` and :meth:`BlockSet.read_block` move a whole
block between the pool and a full ``[layers, planes, page, kv_heads,
head_dim]`` array (planes 2, or 1 for MLA), each rank taking the heads it
holds (``head_ids``: a slice of the heads, one replicated head when TP
exceeds the KV heads, all of them for MLA).
"""

from __future__ import annotations

import enum
import mmap
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from ._pb.fabric.fabricpb import engine_pb2
from ._pb.layout.layoutpb import layout_pb2
from .errors import FailedPrecondition, InvalidArgument, ProtocolError

if TYPE_CHECKING:
    from .cuda import DeviceMemory

__all__ = ["DType", "KVOrder", "Arrangement", "ModelConfig", "BlockSet"]


_N = TypeVar("_N", bound="_Named")


class _Named(enum.IntEnum):
    @classmethod
    def parse(cls: type[_N], v: Any, what: str) -> _N:
        if isinstance(v, cls):
            return v
        if isinstance(v, str):
            key = v.strip().upper().replace("-", "_")
            key = cls._aliases().get(key, key)
            if key in cls.__members__:
                return cls[key]
        elif isinstance(v, int) and not isinstance(v, bool):
            try:
                return cls(v)
            except ValueError:
                pass
        names = ", ".join(m.name.lower() for m in cls)
        raise InvalidArgument(f"{what}: {v!r} is not one of {names}")

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        return {}


class DType(_Named):
    """Element types (layout.proto's DType)."""

    F32 = layout_pb2.DTYPE_F32
    F16 = layout_pb2.DTYPE_F16
    BF16 = layout_pb2.DTYPE_BF16
    FP8_E4M3 = layout_pb2.DTYPE_FP8_E4M3
    FP8_E5M2 = layout_pb2.DTYPE_FP8_E5M2
    U8 = layout_pb2.DTYPE_U8

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        return {"FLOAT32": "F32", "FLOAT16": "F16", "HALF": "F16", "BFLOAT16": "BF16", "UINT8": "U8"}

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype views use. numpy has no bfloat16 or fp8: their
        views hold the raw bits (uint16, uint8), to be viewed as
        ``ml_dtypes.bfloat16`` or a torch dtype by engines that have one."""
        return np.dtype(_NUMPY[self])

    @property
    def raw(self) -> bool:
        """Whether the numpy dtype holds raw bits rather than the values."""
        return self in (DType.BF16, DType.FP8_E4M3, DType.FP8_E5M2)


_NUMPY = {
    DType.F32: "<f4",
    DType.F16: "<f2",
    DType.BF16: "<u2",
    DType.FP8_E4M3: "u1",
    DType.FP8_E5M2: "u1",
    DType.U8: "u1",
}


class KVOrder(_Named):
    """Order inside one (layer, K/V) chunk."""

    NHD = layout_pb2.KV_ORDER_NHD  # [token][head][dim]
    HND = layout_pb2.KV_ORDER_HND  # [head][token][dim]


class Arrangement(_Named):
    """How a rank's region orders slots and layers."""

    FULLY_CONTIGUOUS = layout_pb2.ARRANGEMENT_FULLY_CONTIGUOUS  # [slot][layer][K/V][chunk]
    LAYER_SEPARATE = layout_pb2.ARRANGEMENT_LAYER_SEPARATE  # [layer][slot][K/V][chunk]

    @classmethod
    def _aliases(cls) -> dict[str, str]:
        return {"CONTIGUOUS": "FULLY_CONTIGUOUS", "SEPARATE": "LAYER_SEPARATE"}


@dataclass(frozen=True)
class ModelConfig:
    """What makes two blocks' bytes comparable. For MLA, kv_heads is the
    number of latent heads (usually 1) and head_dim the latent width."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: DType | str = DType.F16
    mla: bool = False

    def proto(self) -> layout_pb2.ModelConfig:
        for name in ("layers", "kv_heads", "head_dim"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 < v < 1 << 32:
                raise InvalidArgument(f"model.{name}: {v!r} is not a positive u32")
        return layout_pb2.ModelConfig(
            layers=int(self.layers),
            kv_heads=int(self.kv_heads),
            head_dim=int(self.head_dim),
            dtype=layout_pb2.DType.Name(DType.parse(self.dtype, "model.dtype")),
            mla=bool(self.mla),
        )

    @classmethod
    def from_proto(cls, m: layout_pb2.ModelConfig) -> "ModelConfig":
        return cls(m.layers, m.kv_heads, m.head_dim, DType.parse(m.dtype, "model.dtype"), m.mla)


def _index(value: Any, what: str, limit: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidArgument(f"{what}: {value!r} is not an integer")
    if not 0 <= value < limit:
        raise InvalidArgument(f"{what}: {value} is not in 0..{limit - 1}")
    return int(value)


class BlockSet:
    """An engine's block set with its memory mapped.

    ``views[r]`` (or ``rank(r)``) is rank r's region as a numpy array of
    shape ``(slots, layers, planes, *chunk_shape)`` over the shared memory:
    writing it writes the pool, nothing is copied. ``ranks[r]`` is the
    agent's RankLayout (offset, strides, chunk shape, head ids, replicas).
    Once its client drops the set (``Client.drop_block_set``) it has no
    views or memory: its calls raise FailedPrecondition.
    """

    def __init__(
        self,
        resp: engine_pb2.RegisterResponse,
        memories: list[mmap.mmap] | None = None,
        device: list[DeviceMemory] | None = None,
    ) -> None:
        lay = resp.layout
        self.id: int = resp.block_set
        self.layout: layout_pb2.Layout = lay
        self.model = ModelConfig.from_proto(lay.model)
        self.tp_size: int = lay.tp_size
        self.page_size: int = lay.page_size
        self.kv_order = KVOrder.parse(lay.kv_order, "layout.kv_order")
        self.arrangement = Arrangement.parse(lay.arrangement, "layout.arrangement")
        self.alignment: int = lay.alignment
        self.slots: int = lay.slots
        self.retains: int = resp.retains
        #: What lets another process of the engine join this set
        #: (``Client.register(join=(id, join_token))``); a secret like the
        #: memory tokens: pass it only to the engine's own processes.
        self.join_token: str = resp.join_token
        self.ranks: list[engine_pb2.RankLayout] = list(resp.ranks)
        self.memory: list[engine_pb2.Memory] = list(resp.memory)
        #: Whether the client that returned the set dropped it
        #: (``Client.drop_block_set``): its views and memory are gone.
        self.dropped = False
        self._buffers: list[mmap.mmap] = list(memories or [])
        self._device: list[DeviceMemory] = list(device or [])
        self._views: list[np.ndarray] = []
        self._on_device = bool(self._device)
        self.dtype: np.dtype = self.model.dtype.numpy  # type: ignore[union-attr]
        self.planes = 1 if self.model.mla else 2
        have = len(self._device) if self._device else len(self._buffers)
        if len(self.ranks) != self.tp_size or have != self.tp_size:
            raise ProtocolError(
                f"block set {self.id}: {len(self.ranks)} rank layouts and {have} memories for TP {self.tp_size}"
            )
        if self._device:
            for r in range(self.tp_size):
                self._check_rank(r)
                self._check_device_extent(r)
        else:
            self._views = [self._view(r, self._buffers[r]) for r in range(self.tp_size)]

    @property
    def on_device(self) -> bool:
        """Whether the block set is in GPU memory (no numpy views: blocks
        move with :meth:`write_block` and :meth:`read_block`)."""
        return self._on_device

    @property
    def views(self) -> list[np.ndarray]:
        """Each rank's numpy view (``rank``); empty for a block set in GPU
        memory. FailedPrecondition once the set is dropped."""
        views, _, _ = self._live()
        return views

    @property
    def buffers(self) -> list[mmap.mmap]:
        """Each rank's mapping of the pool memory (ranks of one pool share
        one); empty for a block set in GPU memory. FailedPrecondition once
        the set is dropped."""
        _, buffers, _ = self._live()
        return buffers

    @property
    def device(self) -> list[DeviceMemory]:
        """Each rank's opened device memory (ranks of one GPU pool share
        one); empty for host memory. FailedPrecondition once the set is
        dropped."""
        _, _, device = self._live()
        return device

    def _drop_memory(self) -> None:
        """What the client that returned the set does when it drops it:
        views, mappings and device memory are let go (the client unmaps
        them once nothing else uses them)."""
        self.dropped = True
        self._views, self._buffers, self._device = [], [], []

    def _live(self) -> tuple[list[np.ndarray], list[mmap.mmap], list[DeviceMemory]]:
        """The views, mappings and device memory; FailedPrecondition once
        dropped."""
        views, buffers, device = self._views, self._buffers, self._device
        if self.dropped:
            raise FailedPrecondition(
                f"block set {self.id} was dropped (Client.drop_block_set): its memory is no longer this client's"
            )
        return views, buffers, device

    def _check_device_extent(self, r: int) -> None:
        rl, m, mem = self.ranks[r], self.memory[r], self._device[r]
        last = (
            rl.offset
            + (self.slots - 1) * rl.block_stride
            + (self.model.layers - 1) * rl.layer_stride
            + (self.planes - 1) * rl.kv_stride
            + rl.chunk_bytes
        )
        if rl.offset < m.offset or last > m.offset + m.size or last > mem.size:
            raise ProtocolError(
                f"block set {self.id} rank {r}: its blocks reach [{rl.offset}, {last}), outside the region "
                f"[{m.offset}, {m.offset + m.size}) of a device allocation of {mem.size} bytes"
            )

    def _check_rank(self, r: int) -> tuple[int, int, int]:
        """Checks rank r's layout against the model; returns its chunk shape."""
        rl = self.ranks[r]
        m = self.model
        eb = self.dtype.itemsize
        heads = len(rl.head_ids)
        want_chunk = (
            [self.page_size, heads, m.head_dim] if self.kv_order == KVOrder.NHD else [heads, self.page_size, m.head_dim]
        )
        problems = []
        if rl.element_bytes != eb:
            problems.append(f"element_bytes {rl.element_bytes}, dtype {m.dtype.name} has {eb}")  # type: ignore[union-attr]
        if rl.planes != self.planes:
            problems.append(f"planes {rl.planes}, want {self.planes}")
        if list(rl.chunk_shape) != want_chunk:
            problems.append(f"chunk_shape {list(rl.chunk_shape)}, want {want_chunk}")
        if rl.chunk_bytes != int(np.prod(want_chunk)) * eb:
            problems.append(f"chunk_bytes {rl.chunk_bytes}")
        if any(h >= m.kv_heads for h in rl.head_ids) or not heads:
            problems.append(f"head_ids {list(rl.head_ids)} for {m.kv_heads} KV heads")
        elif list(rl.head_ids) != list(range(rl.head_ids[0], rl.head_ids[0] + heads)):
            problems.append(f"head_ids {list(rl.head_ids)} not a run of heads")
        if problems:
            raise ProtocolError(f"block set {self.id} rank {r}: the agent's layout does not add up: " + "; ".join(problems))
        return want_chunk[0], want_chunk[1], want_chunk[2]

    def _view(self, r: int, mem: mmap.mmap) -> np.ndarray:
        rl = self.ranks[r]
        m = self.model
        eb = self.dtype.itemsize
        c0, c1, c2 = self._check_rank(r)
        shape = (self.slots, m.layers, self.planes, c0, c1, c2)
        strides = (rl.block_stride, rl.layer_stride, rl.kv_stride, c1 * c2 * eb, c2 * eb, eb)
        # Through frombuffer, whose memoryview holds the mapping open: an
        # mmap closes only when no view of it is left, so a view never
        # outlives its memory (numpy given the mmap itself would not hold it).
        flat = np.frombuffer(mem, dtype=np.uint8)
        try:
            # numpy checks that every element lies inside the mapping.
            return np.ndarray(shape, dtype=self.dtype, buffer=flat, offset=rl.offset, strides=strides)
        except (ValueError, TypeError) as e:
            raise ProtocolError(f"block set {self.id} rank {r}: region outside the mapped memory ({len(mem)} bytes): {e}") from e

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """The full block array's shape: [layers, planes, page, kv_heads, head_dim]."""
        m = self.model
        return (m.layers, self.planes, self.page_size, m.kv_heads, m.head_dim)

    def rank(self, r: int) -> np.ndarray:
        """Rank r's view: (slots, layers, planes, *chunk_shape)."""
        r = _index(r, "rank", self.tp_size)
        views, _, _ = self._live()
        if self._on_device:
            raise FailedPrecondition(
                f"block set {self.id} is in GPU memory: no numpy views of it; use write_block and read_block"
            )
        return views[r]

    def block(self, r: int, slot: int) -> np.ndarray:
        """Slot's shard on rank r: (layers, planes, *chunk_shape), a view."""
        return self.rank(r)[_index(slot, "slot", self.slots)]

    def heads(self, r: int) -> slice:
        """The global KV heads rank r holds, as a slice of the heads axis."""
        ids = self.ranks[_index(r, "rank", self.tp_size)].head_ids
        return slice(ids[0], ids[-1] + 1)

    def _ranks(self, rank: int | None) -> range | list[int]:
        return range(self.tp_size) if rank is None else [_index(rank, "rank", self.tp_size)]

    def _as_shard(self, r: int, full: np.ndarray) -> np.ndarray:
        """full's heads of rank r, in the rank's chunk order."""
        part = full[:, :, :, self.heads(r), :]  # [layers, planes, tokens, heads, dim]
        return part.transpose(0, 1, 3, 2, 4) if self.kv_order == KVOrder.HND else part

    def _check_array(self, kv: Any, what: str) -> np.ndarray:
        if not isinstance(kv, np.ndarray):
            raise InvalidArgument(f"{what}: want a numpy array, got {type(kv).__name__}")
        if kv.shape != self.block_shape:
            raise InvalidArgument(
                f"{what}: shape {kv.shape}, want {self.block_shape} [layers, planes, page, kv_heads, head_dim]"
                + (" (MLA has one plane)" if self.model.mla else "")
            )
        if kv.dtype != self.dtype:
            if not (self.model.dtype.raw and kv.dtype.itemsize == self.dtype.itemsize):  # type: ignore[union-attr]
                raise InvalidArgument(
                    f"{what}: dtype {kv.dtype}, want {self.dtype} for {self.model.dtype.name}"  # type: ignore[union-attr]
                )
            kv = kv.view(self.dtype)
        return kv

    def write_block(self, slot: int, kv: np.ndarray, rank: int | None = None) -> None:
        """Write a full block array into slot: on rank, or every rank when
        rank is None; each rank takes the heads it holds."""
        slot = _index(slot, "slot", self.slots)
        kv = self._check_array(kv, "kv")
        views, _, device = self._live()
        for r in self._ranks(rank):
            if device:
                self._device_copy(device[r], r, slot, np.ascontiguousarray(self._as_shard(r, kv)), write=True)
            else:
                np.copyto(views[r][slot], self._as_shard(r, kv))

    def read_block(self, slot: int, rank: int | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """Read slot into a full block array: the heads rank holds (every
        rank's when rank is None). Heads no read rank holds are left as they
        were in out (zeros when out is None). Returns out."""
        slot = _index(slot, "slot", self.slots)
        if out is None:
            out = np.zeros(self.block_shape, dtype=self.dtype)
        else:
            out = self._check_array(out, "out")
        views, _, device = self._live()
        for r in self._ranks(rank):
            if device:
                shard = self._as_shard(r, out)
                tmp = np.empty(shard.shape, dtype=self.dtype)
                self._device_copy(device[r], r, slot, tmp, write=False)
                np.copyto(shard, tmp)
            else:
                np.copyto(self._as_shard(r, out), views[r][slot])
        return out

    def _device_copy(self, mem: DeviceMemory, r: int, slot: int, shard: np.ndarray, write: bool) -> None:
        """Moves slot's shard on rank r between the device (mem) and shard,
        a C-contiguous (layers, planes, *chunk) array: in one copy where the
        block is contiguous on the device, else one per (layer, plane)."""
        rl = self.ranks[r]
        base = rl.offset + slot * rl.block_stride
        cb = rl.chunk_bytes
        move = mem.write if write else mem.read
        if rl.kv_stride == cb and rl.layer_stride == self.planes * cb:
            move(base, shard)
            return
        for layer in range(self.model.layers):
            for p in range(self.planes):
                move(base + layer * rl.layer_stride + p * rl.kv_stride, shard[layer, p])

    def as_torch(self, r: int) -> Any:
        """Rank r's view as a torch tensor over the same memory (torch must be
        installed; bf16 and fp8 stay raw bits: ``.view(torch.bfloat16)``)."""
        try:
            import torch
        except ImportError as e:
            raise ImportError("kvfabric: BlockSet.as_torch needs torch, which is not installed") from e
        return torch.from_numpy(self.rank(r))

    def __repr__(self) -> str:
        return (
            f"BlockSet(id={self.id}, tp={self.tp_size}, page={self.page_size}, {self.kv_order.name}, "
            f"{self.arrangement.name.lower()}, slots={self.slots}, model={self.model})"
        )
