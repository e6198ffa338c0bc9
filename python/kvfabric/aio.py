"""The asyncio client: :class:`kvfabric.Client`'s engine calls as coroutines,
on ``grpc.aio``, for engines that run an event loop.

    import kvfabric, kvfabric.aio
    async with kvfabric.aio.Client("/var/lib/kvfabric/engine.sock") as c:
        bs = await c.register(kvfabric.ModelConfig(layers=32, kv_heads=8, head_dim=128, dtype="bf16"),
                              tp_size=2, page_size=16)
        got = await c.import_blocks(bs, tokens=prompt, wait=1.0)
        kv = bs.read_block(got.slots[0])

Arguments, results and errors are the sync client's (the same request
checks, :class:`~kvfabric.BlockSet`, :class:`~kvfabric.ImportResult`, the
:class:`~kvfabric.KvfabricError` classes). The session is opened by
``async with`` (or :meth:`Client.open`) and kept alive by a task on the
loop; leaving the block (or :meth:`Client.close`) ends it, and the agent
releases what it held. A client belongs to the loop that opened it.

Mapping pool memory (a descriptor received over a unix socket, or a named
file) and opening GPU memory run in a worker thread, so that the loop never
waits on them.
"""

from __future__ import annotations

import asyncio
import mmap
import os
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

import grpc
import grpc.aio
import numpy as np

from . import cuda as cuda_driver
from ._pb.fabric.fabricpb import engine_pb2, engine_pb2_grpc
from .blockset import Arrangement, BlockSet, KVOrder, ModelConfig
from .client import (
    _CHANNEL_OPTIONS,
    _GIVE_BACK_TIMEOUT,
    BlockRef,
    Blocks,
    DropResult,
    ImportResult,
    LookupResult,
    PrefetchResult,
    _allocate_request,
    _check_answered,
    _check_region,
    _import_request,
    _import_result,
    _index_asks,
    _ints,
    _lookup_request,
    _lookup_result,
    _Memory,
    _prefetch_request,
    _prefetch_result,
    _on_device,
    _refs,
    _register_blocks_request,
    _register_request,
    _set_id,
    _socket_path,
    _U32,
    _U64,
)
from .cuda import DeviceMemory
from .errors import DeadlineExceeded, InvalidArgument, KvfabricError, NotFound, ProtocolError, Unavailable, from_rpc_error
from .memory import FD_SOCKET_SUFFIX, map_descriptor, map_file
from .session import SESSION_METADATA

__all__ = ["Client"]


class _Session:
    """One OpenSession stream on the loop: the first request names the
    engine, the first event the session and its keepalive bound, and a
    request every third of that bound keeps it."""

    def __init__(self, api: engine_pb2_grpc.EngineStub, engine: str) -> None:
        self._stop = asyncio.Event()
        self._named = asyncio.Event()
        self._period = 1.0
        self.id = 0
        self.keepalive = 0.0
        #: Why the stream ended, when it ended before close.
        self.ended: str | None = None
        self._call = api.OpenSession(self._requests(engine))
        self._reader: asyncio.Task[None] | None = None

    async def _requests(self, engine: str) -> AsyncIterator[engine_pb2.SessionRequest]:
        yield engine_pb2.SessionRequest(engine=engine)
        await self._named.wait()
        while not self._stop.is_set():
            try:
                await asyncio.wait_for(self._stop.wait(), self._period)
            except asyncio.TimeoutError:
                yield engine_pb2.SessionRequest()

    async def start(self, timeout: float) -> None:
        """Wait (at most timeout) for the first event, then read the rest in
        a task."""
        try:
            first = await asyncio.wait_for(self._call.read(), timeout)
        except asyncio.TimeoutError:
            self._call.cancel()
            raise DeadlineExceeded(f"no answer to OpenSession within {timeout:g} s", method="OpenSession") from None
        except grpc.RpcError as e:
            self._call.cancel()
            raise from_rpc_error(e, "OpenSession") from None
        if first is grpc.aio.EOF:
            raise Unavailable("session stream: the agent closed the stream before naming the session", method="OpenSession")
        if first.session == 0:
            self._call.cancel()
            raise ProtocolError("first SessionEvent names no session", method="OpenSession")
        self.id = first.session
        # 0 (an agent that sets no bound): the Go client's 1 s.
        self.keepalive = first.keepalive_ms / 1000 or 1.0
        self._period = self.keepalive / 3
        self._named.set()
        self.metadata: tuple[tuple[str, str], ...] = ((SESSION_METADATA, str(self.id)),)
        self._reader = asyncio.get_running_loop().create_task(self._read(), name="kvfabric-session")

    async def _read(self) -> None:
        try:
            while True:
                ev = await self._call.read()
                if ev is grpc.aio.EOF:
                    if not self._stop.is_set():
                        self.ended = "the agent closed the session stream"
                    return
        except grpc.RpcError as e:
            if not self._stop.is_set():
                self.ended = f"{e.code().name}: {e.details()}"
        except asyncio.CancelledError:
            pass

    @property
    def alive(self) -> bool:
        return self.ended is None and not self._stop.is_set()

    async def close(self, timeout: float = 5.0) -> None:
        """Half-close the stream and wait (at most timeout) for the agent to
        end it too. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._named.set()
        if self._reader is None:
            self._call.cancel()
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        except asyncio.TimeoutError:
            self._call.cancel()
            self._reader.cancel()
            try:
                await self._reader
            except asyncio.CancelledError:
                pass


class Client:
    """An asyncio connection to the agent on this node; the arguments are
    :class:`kvfabric.Client`'s: import_timeout, the bound on an import, is
    sent to the agent, which cuts it to its own --import-timeout (the call
    waits 5 s more for its answer). Use ``async with``, or ``await open()``
    and ``await close()``."""

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        engine: str = "python",
        timeout: float = 30.0,
        import_timeout: float = 30.0,
        memory: str = "auto",
        session: bool = True,
        cuda: str | None = None,
    ) -> None:
        path = _socket_path(socket, memory, timeout, import_timeout)
        self.socket = os.path.abspath(path)
        self.engine = engine
        self.timeout = float(timeout)
        self.import_timeout = float(import_timeout)
        self._memory = memory
        self._want_session = session
        self._cuda_path = cuda
        self._mem = _Memory()
        self._channel: grpc.aio.Channel | None = None
        self._session: _Session | None = None
        self._metadata: tuple[tuple[str, str], ...] = ()
        self._closed = False
        self.api: engine_pb2_grpc.EngineStub | None = None

    # -- lifetime -------------------------------------------------------

    async def open(self) -> "Client":
        """Connect and open the session. Returns the client."""
        if self._closed:
            raise Unavailable("client is closed")
        if self._channel is not None:
            return self
        if not os.path.exists(self.socket):
            raise Unavailable(f"engine socket {self.socket}: no such file (is the agent running?)")
        self._channel = grpc.aio.insecure_channel(
            "unix:" + self.socket, options=_CHANNEL_OPTIONS
        )
        self.api = engine_pb2_grpc.EngineStub(self._channel)
        if self._want_session:
            s = _Session(self.api, self.engine)
            try:
                await s.start(self.timeout)
            except BaseException:
                await self._channel.close()
                self._channel = None
                raise
            self._session, self._metadata = s, s.metadata
        return self

    async def __aenter__(self) -> "Client":
        return await self.open()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    @property
    def session(self) -> int:
        """The session's id (0: none, the agent's implicit session)."""
        return self._session.id if self._session else 0

    @property
    def session_alive(self) -> bool:
        """False once the session ended: closed, or ended by the agent."""
        return self._session is not None and self._session.alive

    async def close(self) -> None:
        """End the session (the agent releases its references and frees its
        unregistered slots; registered blocks stay cached), close the
        connection and unmap what no view uses any more. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._session is not None:
            await self._session.close()
        self._mem.shut()
        if self._channel is not None:
            await self._channel.close()

    # -- plumbing -------------------------------------------------------

    async def _call(self, method: str, req: Any, timeout: float | None) -> Any:
        if self._closed or self.api is None:
            raise Unavailable("client is closed" if self._closed else "client is not open (async with, or await open())", method=method)
        t = self.timeout if timeout is None else timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise InvalidArgument(f"timeout: {t!r} is not a positive number of seconds", method=method)
        try:
            resp = await getattr(self.api, method)(req, timeout=t, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e, method) from None
        _check_answered(method, self.session, self._session.ended if self._session else None)
        return resp

    def _map_sync(self, m: engine_pb2.Memory) -> mmap.mmap:
        if self._memory == "file" or (self._memory == "auto" and not m.token):
            if not m.file:
                if self._memory == "file":
                    raise Unavailable("pool memory: the agent offers no named file (it runs without memory_dir)")
                return map_file(m.path)
            return map_file(m.file)
        if not m.token:
            raise Unavailable("pool memory: the agent offers no descriptor")
        return map_descriptor(self.socket + FD_SOCKET_SUFFIX, m.token, self.timeout)

    async def _map(self, m: engine_pb2.Memory, set_id: int) -> mmap.mmap:
        key = m.token or m.file or m.path
        have = self._mem.get(key, set_id)
        if have is not None:
            return have
        return self._mem.put(key, set_id, await asyncio.to_thread(self._map_sync, m))

    async def _open_device(self, m: engine_pb2.Memory, set_id: int) -> DeviceMemory:
        key = bytes(m.cuda_ipc_handle)
        have = self._mem.get(key, set_id)
        if have is not None:
            return have

        def open_ipc() -> DeviceMemory:
            drv = cuda_driver.load(self._cuda_path)
            return drv.open_ipc(drv.find(m.cuda_device, m.pci_bus_id), key, m.file_size or m.offset + m.size)

        return self._mem.put(key, set_id, await asyncio.to_thread(open_ipc))

    # -- the engine API -------------------------------------------------

    async def register(
        self,
        model: ModelConfig,
        tp_size: int,
        page_size: int,
        kv_order: KVOrder | str = KVOrder.HND,
        arrangement: Arrangement | str = Arrangement.FULLY_CONTIGUOUS,
        *,
        slots: int = 0,
        alignment: int = 0,
        devices: Sequence[str | int] | None = None,
        engine: str | None = None,
        join: tuple[int, str] | None = None,
        timeout: float | None = None,
    ) -> BlockSet:
        """:meth:`kvfabric.Client.register`: the engine's layout, and its
        block set's memory mapped (or opened on the GPU)."""
        req = _register_request(
            engine or self.engine, model, tp_size, page_size, kv_order, arrangement, slots, alignment, devices, join
        )
        resp = await self._call("Register", req, timeout)
        sid = resp.block_set
        try:
            if _on_device(resp):
                return self._mem.bind(BlockSet(resp, device=[await self._open_device(m, sid) for m in resp.memory]))
            return self._mem.bind(BlockSet(resp, memories=[_check_region(r, m, await self._map(m, sid)) for r, m in enumerate(resp.memory)]))
        except Exception as e:
            # As the sync client: a set handed over and not usable here is
            # given back.
            try:
                await self.drop_block_set(sid, timeout=_GIVE_BACK_TIMEOUT)
            except KvfabricError as d:
                e.add_note(f"block set {sid} not given back: {d}")
            raise

    async def allocate(self, block_set: BlockSet | int, count: int, *, timeout: float | None = None) -> list[int]:
        """Take count free slots for the engine to write."""
        return list((await self._call("Allocate", _allocate_request(block_set, count), timeout)).slots)

    async def free(self, block_set: BlockSet | int, slots: Sequence[int], *, timeout: float | None = None) -> None:
        """Give back allocated slots that were never registered."""
        await self._call("Free", engine_pb2.FreeRequest(block_set=_set_id(block_set), slots=_ints(slots, "slots", _U32)), timeout)

    async def register_blocks(
        self,
        block_set: BlockSet | int,
        slots: Sequence[int],
        hashes: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | np.ndarray | None = None,
        salt: str | None = None,
        lora: str | None = None,
        parent: int | None = None,
        timeout: float | None = None,
    ) -> Blocks:
        """:meth:`kvfabric.Client.register_blocks`: written slots become
        blocks, by sequence hashes or by the sequence's token ids."""
        req = _register_blocks_request(block_set, slots, hashes, tokens, salt, lora, parent)
        resp = await self._call("RegisterBlocks", req, timeout)
        return _refs(resp.blocks, resp.results)

    async def acquire(self, block_set: BlockSet | int, hashes: Sequence[int], *, timeout: float | None = None) -> Blocks:
        """Reference the leading blocks of hashes held in the block set."""
        req = engine_pb2.AcquireRequest(block_set=_set_id(block_set), hashes=_ints(hashes, "hashes", _U64))
        resp = await self._call("Acquire", req, timeout)
        return _refs(resp.blocks, resp.results)

    async def release(
        self, block_set: BlockSet | int, slots: Sequence[int] | Sequence[BlockRef], *, timeout: float | None = None
    ) -> None:
        """Drop references taken by acquire, import_blocks or register_blocks."""
        req = engine_pb2.ReleaseRequest(block_set=_set_id(block_set), slots=_ints(slots, "slots", _U32, refs=True))
        await self._call("Release", req, timeout)

    async def lookup(
        self,
        hashes: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | np.ndarray | None = None,
        salt: str | None = None,
        lora: str | None = None,
        block_size: int = 0,
        block_set: BlockSet | int | None = None,
        no_restore: bool = False,
        timeout: float | None = None,
    ) -> LookupResult:
        """Per node, how many leading blocks of the sequence it holds (see
        Client.lookup; no_restore too)."""
        req = _lookup_request(hashes, tokens, salt, lora, block_size, block_set, no_restore)
        return _lookup_result(await self._call("Lookup", req, timeout))

    async def prefetch(
        self,
        block_set: BlockSet | int,
        hashes: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | np.ndarray | None = None,
        salt: str | None = None,
        lora: str | None = None,
        timeout: float | None = None,
    ) -> PrefetchResult:
        """:meth:`kvfabric.Client.prefetch`: a sequence's blocks brought up
        into the block set ahead of use, from disk, then from other nodes."""
        req = _prefetch_request(block_set, hashes, tokens, salt, lora)
        return _prefetch_result(await self._call("Prefetch", req, timeout))

    async def import_blocks(
        self,
        block_set: BlockSet | int,
        hashes: Sequence[int] | None = None,
        *,
        tokens: Sequence[int] | np.ndarray | None = None,
        salt: str | None = None,
        lora: str | None = None,
        wait: float = 0,
        timeout: float | None = None,
    ) -> ImportResult:
        """:meth:`kvfabric.Client.import_blocks`: blocks from the cluster
        into local slots, referenced for the engine; wait first (at most
        wait seconds, without blocking the loop) for the index to show a
        holder of them all. timeout: the bound on the import itself (default
        import_timeout; the agent cuts it to its own --import-timeout)."""
        t = self.import_timeout if timeout is None else timeout
        req = _import_request(block_set, hashes, tokens, salt, lora, wait, t)
        page, n = 0, len(req.hashes)
        if not req.hashes:
            page = await self._page_size(block_set)
            n = len(req.tokens.ids) // page
        if wait > 0:
            await self._wait_indexed(page, req, wait)
        return _import_result(n, await self._call("Import", req, t + 5))

    async def _wait_indexed(self, page: int, req: engine_pb2.ImportRequest, wait: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        asks = _index_asks(page, req)
        pause = 0.02
        while asks:
            for ask, n in asks:
                resp = await self._call("Lookup", ask, max(0.1, min(self.timeout, deadline - loop.time())))
                if any(o.blocks >= n for o in resp.overlaps):
                    return
            left = deadline - loop.time()
            if left <= 0:
                return
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 0.2)

    async def _page_size(self, block_set: BlockSet | int) -> int:
        if isinstance(block_set, BlockSet):
            return block_set.page_size
        sid = _set_id(block_set)
        for s in (await self.status()).block_sets:
            if s.id == sid:
                return int(s.page_size)
        raise NotFound(f"block set {sid}: unknown to the agent", method="Import")

    async def drop_block_set(self, block_set: BlockSet | int, *, timeout: float | None = None) -> DropResult:
        """:meth:`kvfabric.Client.drop_block_set` without blocking the loop
        (another task of this client stands for its other thread)."""
        sid = _set_id(block_set)
        try:
            resp = await self._call("DropBlockSet", engine_pb2.DropBlockSetRequest(block_set=sid), timeout)
        finally:
            left = self._mem.drop(sid)
        return DropResult(resp.released, resp.freed, left)

    async def status(self, *, timeout: float | None = None) -> engine_pb2.StatusResponse:
        """The agent's view: node, members, pools, block sets, transfers."""
        return await self._call("Status", engine_pb2.StatusRequest(), timeout)
