"""The client's ctypes declarations agree with the driver header the Go
binding and softcuda share (pool/cuda/softcuda/csrc/kvf_cuda.h), itself
checked against a real cuda.h."""
from __future__ import annotations

import ctypes
import pathlib
import re

from kvfabric import cuda

HEADER = pathlib.Path(__file__).resolve().parents[2] / "pool/cuda/softcuda/csrc/kvf_cuda.h"


def _value(name: str) -> int:
    text = HEADER.read_text()
    m = re.search(rf"\b{name}\s*(?:=\s*)?(\d+)\b", text)
    assert m, f"{name} not in {HEADER}"
    return int(m.group(1))


def test_ipc_handle_matches_header() -> None:
    assert cuda.IPC_HANDLE_BYTES == _value("CU_IPC_HANDLE_SIZE")
    assert ctypes.sizeof(cuda._IpcHandle) == _value("CU_IPC_HANDLE_SIZE")


def test_lazy_peer_access_matches_header() -> None:
    assert cuda._LAZY_PEER_ACCESS == _value("CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS")
