"""Engine sessions (engine.proto's OpenSession).

Everything an engine allocates, references or registers a block set for
belongs to the session it was done under; when the session ends (the
client closes it, the process exits or dies, or its keepalives stop) the
agent releases its references and frees its unregistered slots. Registered
blocks stay cached for others.

A session is one long-lived OpenSession stream: the client sends the first
SessionRequest (with the engine's name), the agent's first SessionEvent
carries the session id and the keepalive bound, and the client then sends a
SessionRequest every third of that bound from a background thread until it
closes the stream. Every other call carries the id as the
``kvfabric-session`` metadata.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import grpc

from ._pb.fabric.fabricpb import engine_pb2, engine_pb2_grpc
from .errors import DeadlineExceeded, ProtocolError, Unavailable, from_rpc_error

__all__ = ["SESSION_METADATA", "Session"]

#: The gRPC metadata key that names the session of a call.
SESSION_METADATA = "kvfabric-session"


class Session:
    """One open session on the agent. Use through :class:`kvfabric.Client`."""

    def __init__(self, api: engine_pb2_grpc.EngineStub, engine: str, timeout: float) -> None:
        self._stop = threading.Event()
        self._named = threading.Event()  # the first event came (or the stream failed)
        self._period = 1.0
        self._first: queue.Queue[engine_pb2.SessionEvent | BaseException] = queue.Queue(1)
        self.id = 0
        self.keepalive = 0.0
        #: Why the stream ended, when it ended before close (e.g. the agent stopped).
        self.ended: str | None = None
        self._call = api.OpenSession(self._requests(engine))
        self._reader = threading.Thread(target=self._read, name="kvfabric-session", daemon=True)
        self._reader.start()
        try:
            first = self._first.get(timeout=timeout)
        except queue.Empty:
            self._cancel()
            raise DeadlineExceeded(f"no answer to OpenSession within {timeout:g} s", method="OpenSession") from None
        if isinstance(first, BaseException):
            self._cancel()
            if isinstance(first, grpc.RpcError):
                raise from_rpc_error(first, "OpenSession") from None
            raise Unavailable(f"session stream: {first}", method="OpenSession") from None
        if first.session == 0:
            self._cancel()
            raise ProtocolError("first SessionEvent names no session", method="OpenSession")
        self.id = first.session
        self.metadata: tuple[tuple[str, str], ...] = ((SESSION_METADATA, str(self.id)),)

    def _requests(self, engine: str) -> Iterator[engine_pb2.SessionRequest]:
        yield engine_pb2.SessionRequest(engine=engine)
        # The period comes with the first event; the bound may be as short
        # as 100 ms, so nothing is sent on a guess before it.
        self._named.wait()
        while not self._stop.wait(self._period):
            yield engine_pb2.SessionRequest()

    def _read(self) -> None:
        first = True
        try:
            for ev in self._call:
                if first:
                    # 0 (an agent that sets no bound): the Go client's 1 s.
                    self.keepalive = ev.keepalive_ms / 1000 or 1.0
                    self._period = self.keepalive / 3
                    self._named.set()
                    self._first.put(ev)
                    first = False
            if first:
                self._first.put(EOFError("the agent closed the stream before naming the session"))
            elif not self._stop.is_set():
                self.ended = "the agent closed the session stream"
        except grpc.RpcError as e:
            if first:
                self._first.put(e)
            elif not self._stop.is_set():
                self.ended = f"{e.code().name}: {e.details()}"
        finally:
            self._named.set()  # the request iterator must not wait forever

    @property
    def alive(self) -> bool:
        return self.ended is None and not self._stop.is_set()

    def _cancel(self) -> None:
        self._stop.set()
        self._named.set()
        self._call.cancel()
        self._reader.join(5)

    def close(self, timeout: float = 5.0) -> None:
        """End the session: half-close the stream, and wait (at most timeout)
        for the agent to end it too. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()  # the request iterator returns: the stream half-closes
        self._named.set()
        self._reader.join(timeout)
        if self._reader.is_alive():
            self._call.cancel()
            self._reader.join(timeout)
