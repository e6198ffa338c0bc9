"""Device pools through the CUDA driver API, loaded with ctypes.

An agent whose block sets live in GPU memory answers Register with a CUDA
IPC handle per rank (engine.proto's ``Memory.cuda_ipc_handle``, with the
GPU's ``cuda_device`` index and ``pci_bus_id``). The client opens the handle
in this process with the driver (``cuIpcOpenMemHandle_v2``) and moves blocks
with synchronous copies (``cuMemcpyHtoD_v2``, ``cuMemcpyDtoH_v2``), or with
batches of pitched copies (:meth:`Driver.copy_batch`: ``cuMemcpy2DAsync_v2``
on the NULL stream, then ``cuStreamSynchronize``) between the pool and an
engine's cache in device or host memory. Device memory is never a numpy
view: a host dereference of a device pointer faults.

The driver is ``$KVFABRIC_CUDA_LIB`` else ``libcuda.so.1`` (the NVIDIA
driver's), or the path given to :class:`Driver`. No CUDA toolkit, headers
or Python CUDA package is needed: the few calls used are declared here.
"""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from .errors import InvalidArgument, ProtocolError, Unavailable

__all__ = ["ENV_LIBRARY", "DEFAULT_LIBRARY", "Driver", "DeviceMemory", "CudaError", "Copy", "HOST", "DEVICE", "load"]

#: The environment variable naming the driver library.
ENV_LIBRARY = "KVFABRIC_CUDA_LIB"
#: The NVIDIA driver's library, found by the dynamic loader.
DEFAULT_LIBRARY = "libcuda.so.1"
#: Bytes of a CUipcMemHandle.
IPC_HANDLE_BYTES = 64
#: cuIpcOpenMemHandle's CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.
_LAZY_PEER_ACCESS = 1


class CudaError(Unavailable):
    """A driver call failed; ``result`` is its CUresult, ``name`` its name."""

    def __init__(self, call: str, result: int, name: str) -> None:
        self.call, self.result, self.name = call, result, name
        super().__init__(f"CUDA driver: {call}: {name} ({result})")


#: CUmemorytype of a copy's side: host memory (a pointer of this process)
#: or device memory (a CUdeviceptr).
HOST, DEVICE = 1, 2


class _Memcpy2D(ctypes.Structure):
    """CUDA_MEMCPY2D, field for field (128 bytes)."""

    _fields_ = [
        ("srcXInBytes", ctypes.c_size_t), ("srcY", ctypes.c_size_t), ("srcMemoryType", ctypes.c_int),
        ("srcHost", ctypes.c_void_p), ("srcDevice", ctypes.c_uint64), ("srcArray", ctypes.c_void_p),
        ("srcPitch", ctypes.c_size_t),
        ("dstXInBytes", ctypes.c_size_t), ("dstY", ctypes.c_size_t), ("dstMemoryType", ctypes.c_int),
        ("dstHost", ctypes.c_void_p), ("dstDevice", ctypes.c_uint64), ("dstArray", ctypes.c_void_p),
        ("dstPitch", ctypes.c_size_t),
        ("WidthInBytes", ctypes.c_size_t), ("Height", ctypes.c_size_t),
    ]


assert ctypes.sizeof(_Memcpy2D) == 128


class Copy(tuple):
    """One pitched copy: ``height`` rows of ``width`` bytes, from src (of
    memory type src_type, rows ``src_pitch`` apart) to dst."""

    __slots__ = ()

    def __new__(
        cls, dst_type: int, dst: int, dst_pitch: int, src_type: int, src: int, src_pitch: int, width: int, height: int
    ) -> "Copy":
        return tuple.__new__(cls, (dst_type, dst, dst_pitch, src_type, src, src_pitch, width, height))


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


_CUdeviceptr = ctypes.c_uint64
_CUdevice = ctypes.c_int
_CUcontext = ctypes.c_void_p
_SIGNATURES: dict[str, list] = {
    "cuInit": [ctypes.c_uint],
    "cuDeviceGetCount": [ctypes.POINTER(ctypes.c_int)],
    "cuDeviceGet": [ctypes.POINTER(_CUdevice), ctypes.c_int],
    "cuDeviceGetPCIBusId": [ctypes.c_char_p, ctypes.c_int, _CUdevice],
    "cuDevicePrimaryCtxRetain": [ctypes.POINTER(_CUcontext), _CUdevice],
    "cuCtxSetCurrent": [_CUcontext],
    "cuIpcOpenMemHandle_v2": [ctypes.POINTER(_CUdeviceptr), _IpcHandle, ctypes.c_uint],
    "cuIpcCloseMemHandle": [_CUdeviceptr],
    "cuMemcpyHtoD_v2": [_CUdeviceptr, ctypes.c_void_p, ctypes.c_size_t],
    "cuMemcpyDtoH_v2": [ctypes.c_void_p, _CUdeviceptr, ctypes.c_size_t],
    "cuMemcpy2DAsync_v2": [ctypes.POINTER(_Memcpy2D), ctypes.c_void_p],
    "cuStreamSynchronize": [ctypes.c_void_p],
    "cuCtxSynchronize": [],
    "cuMemAlloc_v2": [ctypes.POINTER(_CUdeviceptr), ctypes.c_size_t],
    "cuMemFree_v2": [_CUdeviceptr],
}


class Driver:
    """The CUDA driver of this process: loaded, initialised, with each
    GPU's primary context retained on first use. Safe to share between
    threads (the current context is set before every call)."""

    def __init__(self, path: str | None = None) -> None:
        path = path or os.environ.get(ENV_LIBRARY) or DEFAULT_LIBRARY
        self.path = path
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as e:
            raise Unavailable(
                f"CUDA driver {path}: cannot load it ({e}); the agent's block sets are in GPU memory, "
                f"which needs the NVIDIA driver's {DEFAULT_LIBRARY} (or ${ENV_LIBRARY} naming a driver library)"
            ) from None
        self._fns = {}
        for name, args in _SIGNATURES.items():
            try:
                fn = getattr(self._lib, name)
            except AttributeError:
                raise Unavailable(f"CUDA driver {path}: no {name}: not a CUDA driver library, or too old") from None
            fn.argtypes, fn.restype = args, ctypes.c_int
            self._fns[name] = fn
        self._error_name = getattr(self._lib, "cuGetErrorName", None)
        if self._error_name is not None:
            self._error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            self._error_name.restype = ctypes.c_int
        self._lock = threading.Lock()
        self._contexts: dict[int, _CUcontext] = {}
        self._call("cuInit", 0)
        n = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(n))
        self.device_count = n.value

    def _call(self, name: str, *args) -> None:
        r = self._fns[name](*args)
        if r != 0:
            label = ctypes.c_char_p()
            text = f"CUDA_ERROR {r}"
            if self._error_name is not None and self._error_name(r, ctypes.byref(label)) == 0 and label.value:
                text = label.value.decode(errors="replace")
            raise CudaError(name, r, text)

    def pci_bus_id(self, device: int) -> str:
        """The PCI bus id of CUDA device ``device`` (0000:BB:DD.F)."""
        dev = self._device(device)
        buf = ctypes.create_string_buffer(32)
        self._call("cuDeviceGetPCIBusId", buf, len(buf), dev)
        return buf.value.decode()

    def find(self, cuda_device: int, pci_bus_id: str) -> int:
        """The index in this process of the agent's GPU: by PCI bus id when
        the agent gives one (CUDA_VISIBLE_DEVICES may renumber), else the
        agent's index."""
        if pci_bus_id:
            for i in range(self.device_count):
                if self.pci_bus_id(i).lower() == pci_bus_id.lower():
                    return i
            raise Unavailable(f"the agent's GPU {cuda_device} (PCI bus id {pci_bus_id}) is not visible to this process's CUDA driver ({self.path})")
        if not 0 <= cuda_device < self.device_count:
            raise Unavailable(f"the agent's GPU {cuda_device}: this process's CUDA driver ({self.path}) sees {self.device_count} GPUs")
        return cuda_device

    def _device(self, index: int) -> _CUdevice:
        dev = _CUdevice()
        self._call("cuDeviceGet", ctypes.byref(dev), index)
        return dev

    def _use(self, device: int) -> None:
        with self._lock:
            ctx = self._contexts.get(device)
            if ctx is None:
                ctx = _CUcontext()
                self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), self._device(device))
                self._contexts[device] = ctx
        self._call("cuCtxSetCurrent", ctx)

    def copy_batch(self, device: int, copies: list[Copy]) -> None:
        """Runs copies in GPU ``device``'s context and returns once every
        byte moved: first the work already queued in the context (an
        engine's kernels that write what is copied) is waited for, then the
        copies go on the NULL stream in order, then that stream is waited
        for. A failed copy raises after the ones before it finished, so
        nothing is still in flight when the caller gives memory back."""
        self._use(device)
        self._call("cuCtxSynchronize")
        c = _Memcpy2D()
        err: CudaError | None = None
        for dt, dst, dp, st, src, sp, w, h in copies:
            c.dstMemoryType, c.dstPitch, c.srcMemoryType, c.srcPitch = dt, dp, st, sp
            c.dstHost, c.dstDevice = (dst, 0) if dt == HOST else (None, dst)
            c.srcHost, c.srcDevice = (src, 0) if st == HOST else (None, src)
            c.WidthInBytes, c.Height = w, h
            try:
                self._call("cuMemcpy2DAsync_v2", ctypes.byref(c), None)
            except CudaError as e:
                err = e
                break
        self._call("cuStreamSynchronize", None)
        if err is not None:
            raise err

    def alloc(self, device: int, size: int) -> "DeviceMemory":
        """A fresh allocation of size bytes on GPU ``device`` (freed by its
        close), for engine-side buffers."""
        self._use(device)
        ptr = _CUdeviceptr()
        self._call("cuMemAlloc_v2", ctypes.byref(ptr), size)
        return DeviceMemory(self, device, ptr.value, size, owned=True)

    def open_ipc(self, device: int, handle: bytes, size: int) -> "DeviceMemory":
        """Open an IPC handle of ``size`` bytes (as the agent says) on GPU
        ``device`` of this process."""
        if len(handle) != IPC_HANDLE_BYTES:
            raise ProtocolError(f"agent sent an IPC handle of {len(handle)} bytes, want {IPC_HANDLE_BYTES}")
        self._use(device)
        h = _IpcHandle()
        ctypes.memmove(ctypes.byref(h), bytes(handle), IPC_HANDLE_BYTES)  # every byte, NULs too
        ptr = _CUdeviceptr()
        self._call("cuIpcOpenMemHandle_v2", ctypes.byref(ptr), h, _LAZY_PEER_ACCESS)
        return DeviceMemory(self, device, ptr.value, size)


class DeviceMemory:
    """An opened IPC allocation (or, owned, one of this process's):
    ``size`` bytes at device address ``ptr``. Copies check their range
    against it; after :meth:`close` they raise."""

    def __init__(self, driver: Driver, device: int, ptr: int, size: int, owned: bool = False) -> None:
        self.driver, self.device, self.ptr, self.size = driver, device, ptr, size
        self.owned = owned
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def _range(self, offset: int, n: int) -> int:
        if self._closed:
            raise Unavailable("device memory: closed (its client was closed, or its block set dropped)")
        if offset < 0 or n < 0 or offset + n > self.size:
            raise InvalidArgument(f"device memory: [{offset}, {offset + n}) outside the allocation of {self.size} bytes")
        return self.ptr + offset

    def write(self, offset: int, src: np.ndarray) -> None:
        """Copy src's bytes (a C-contiguous array) to offset, synchronously."""
        if not src.flags.c_contiguous:
            raise InvalidArgument("device memory: write from an array that is not C-contiguous")
        dst = self._range(offset, src.nbytes)
        self.driver._use(self.device)
        self.driver._call("cuMemcpyHtoD_v2", dst, src.ctypes.data, src.nbytes)

    def read(self, offset: int, dst: np.ndarray) -> None:
        """Fill dst (a writable, C-contiguous array) with its size of bytes
        from offset, synchronously."""
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise InvalidArgument("device memory: read into an array that is not writable and C-contiguous")
        src = self._range(offset, dst.nbytes)
        self.driver._use(self.device)
        self.driver._call("cuMemcpyDtoH_v2", dst.ctypes.data, src, dst.nbytes)

    def close(self) -> None:
        """Close the IPC mapping (free an owned allocation). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.driver._use(self.device)
        self.driver._call("cuMemFree_v2" if self.owned else "cuIpcCloseMemHandle", self.ptr)


_drivers: dict[str, Driver] = {}
_drivers_lock = threading.Lock()


def load(path: str | None = None) -> Driver:
    """The process's driver for path (default ``$KVFABRIC_CUDA_LIB``, else
    ``libcuda.so.1``), loaded once."""
    key = path or os.environ.get(ENV_LIBRARY) or DEFAULT_LIBRARY
    with _drivers_lock:
        d = _drivers.get(key)
        if d is None:
            d = Driver(key)
            _drivers[key] = d
        return d
