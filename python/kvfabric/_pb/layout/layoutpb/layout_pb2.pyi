from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

ARRANGEMENT_FULLY_CONTIGUOUS: Arrangement
ARRANGEMENT_LAYER_SEPARATE: Arrangement
ARRANGEMENT_UNSPECIFIED: Arrangement
DESCRIPTOR: _descriptor.FileDescriptor
DTYPE_BF16: DType
DTYPE_F16: DType
DTYPE_F32: DType
DTYPE_FP8_E4M3: DType
DTYPE_FP8_E5M2: DType
DTYPE_U8: DType
DTYPE_UNSPECIFIED: DType
KV_ORDER_HND: KVOrder
KV_ORDER_NHD: KVOrder
KV_ORDER_UNSPECIFIED: KVOrder
MEMORY_KIND_DEVICE: MemoryKind
MEMORY_KIND_HOST: MemoryKind
MEMORY_KIND_PINNED: MemoryKind
MEMORY_KIND_UNSPECIFIED: MemoryKind

class Layout(_message.Message):
    __slots__ = ["alignment", "arrangement", "kv_order", "model", "page_size", "regions", "slots", "strides", "tp_size", "version"]
    ALIGNMENT_FIELD_NUMBER: _ClassVar[int]
    ARRANGEMENT_FIELD_NUMBER: _ClassVar[int]
    KV_ORDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    STRIDES_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    alignment: int
    arrangement: Arrangement
    kv_order: KVOrder
    model: ModelConfig
    page_size: int
    regions: _containers.RepeatedCompositeFieldContainer[Region]
    slots: int
    strides: Strides
    tp_size: int
    version: int
    def __init__(self, version: _Optional[int] = ..., model: _Optional[_Union[ModelConfig, _Mapping]] = ..., page_size: _Optional[int] = ..., tp_size: _Optional[int] = ..., kv_order: _Optional[_Union[KVOrder, str]] = ..., arrangement: _Optional[_Union[Arrangement, str]] = ..., alignment: _Optional[int] = ..., slots: _Optional[int] = ..., regions: _Optional[_Iterable[_Union[Region, _Mapping]]] = ..., strides: _Optional[_Union[Strides, _Mapping]] = ...) -> None: ...

class ModelConfig(_message.Message):
    __slots__ = ["dtype", "head_dim", "kv_heads", "layers", "mla"]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    MLA_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    head_dim: int
    kv_heads: int
    layers: int
    mla: bool
    def __init__(self, layers: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., mla: bool = ...) -> None: ...

class Region(_message.Message):
    __slots__ = ["base", "device", "kind", "size"]
    BASE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    base: int
    device: int
    kind: MemoryKind
    size: int
    def __init__(self, base: _Optional[int] = ..., size: _Optional[int] = ..., device: _Optional[int] = ..., kind: _Optional[_Union[MemoryKind, str]] = ...) -> None: ...

class Strides(_message.Message):
    __slots__ = ["block", "kv", "layer"]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    LAYER_FIELD_NUMBER: _ClassVar[int]
    block: int
    kv: int
    layer: int
    def __init__(self, block: _Optional[int] = ..., layer: _Optional[int] = ..., kv: _Optional[int] = ...) -> None: ...

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class KVOrder(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Arrangement(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class MemoryKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
