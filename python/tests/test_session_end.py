"""A call that hands slots, answered after its session ended, is refused by
the client: against a fake agent that ends the session while an Allocate
runs, after the Allocate took its slots (the window the agent's own
FAILED_PRECONDITION cannot close)."""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

import kvfabric
import kvfabric.aio
from kvfabric._pb.fabric.fabricpb import engine_pb2, engine_pb2_grpc


class EndingEngine(engine_pb2_grpc.EngineServicer):
    """Ends session 7 as an Allocate comes, and answers the Allocate once
    told that the client saw the end."""

    def __init__(self) -> None:
        self.end = threading.Event()  # set to end the session
        self.answer = threading.Event()  # set once the client saw the end

    def OpenSession(self, request_iterator, context):
        next(request_iterator)
        yield engine_pb2.SessionEvent(session=7, keepalive_ms=60_000)
        self.end.wait(60)
        context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "session 7: no keepalive")

    def Allocate(self, request, context):
        self.end.set()
        self.answer.wait(60)  # never set: the test fails on the answer
        return engine_pb2.AllocateResponse(slots=[0, 1])

    def Release(self, request, context):
        return engine_pb2.ReleaseResponse()


@pytest.fixture
def engine() -> Iterator[tuple[EndingEngine, str]]:
    e = EndingEngine()
    with tempfile.TemporaryDirectory(prefix="kvf") as d:  # short: a socket path
        sock = os.path.join(d, "engine.sock")
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        engine_pb2_grpc.add_EngineServicer_to_server(e, server)
        server.add_insecure_port("unix:" + sock)
        server.start()
        try:
            yield e, sock
        finally:
            e.end.set()
            e.answer.set()
            server.stop(0)


def test_slots_answered_after_the_session_ended_are_refused(engine):
    e, sock = engine
    with kvfabric.Client(sock, timeout=30) as c:
        session = c._session
        assert session is not None

        def seen() -> None:
            session._reader.join(60)  # the session's stream ended
            e.answer.set()

        threading.Thread(target=seen, daemon=True).start()
        with pytest.raises(kvfabric.FailedPrecondition, match="session 7 ended"):
            slots = c.allocate(1, 2)
            pytest.fail(f"slots {slots} handed after the session ended")
        c.release(1, [0])  # a release that succeeded says so


def test_aio_slots_answered_after_the_session_ended_are_refused(engine):
    e, sock = engine

    async def run() -> None:
        async with kvfabric.aio.Client(sock, timeout=30) as c:
            session = c._session
            assert session is not None and session._reader is not None
            alloc = asyncio.create_task(c.allocate(1, 2))
            await session._reader  # the session's stream ended
            e.answer.set()
            with pytest.raises(kvfabric.FailedPrecondition, match="session 7 ended"):
                slots = await alloc
                pytest.fail(f"slots {slots} handed after the session ended")
            await c.release(1, [0])

    asyncio.run(run())
