"""Exceptions: one base, :class:`KvfabricError`, and a subclass per gRPC code.

The agent answers a malformed request with INVALID_ARGUMENT (the message
names the field), an unknown block set or slot with NOT_FOUND, too few free
slots with RESOURCE_EXHAUSTED, an import no holder could serve with
UNAVAILABLE or NOT_FOUND, and a slot in the wrong state with
FAILED_PRECONDITION. The client raises the same classes for what it refuses
before sending (a wrong array shape, a token id that is not a u32), so one
``except kvfabric.InvalidArgument`` catches both.
"""

from __future__ import annotations

import grpc

__all__ = [
    "KvfabricError",
    "InvalidArgument",
    "NotFound",
    "ResourceExhausted",
    "Unavailable",
    "FailedPrecondition",
    "DeadlineExceeded",
    "Cancelled",
    "PermissionDenied",
    "ProtocolError",
    "from_rpc_error",
]


class KvfabricError(Exception):
    """Base of every error the client raises.

    ``code`` is the gRPC status code (``grpc.StatusCode``); ``details`` the
    agent's (or the client's) message; ``method`` the engine API call, when
    the error came from one.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, *, method: str | None = None, code: grpc.StatusCode | None = None) -> None:
        if code is not None:
            self.code = code
        self.details = details
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"kvfabric: {where}{self.code.name}: {details}")


class InvalidArgument(KvfabricError, ValueError):
    """A malformed request; the message names the field."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(KvfabricError, LookupError):
    """An unknown block set or slot, or an import no node could serve."""

    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(KvfabricError):
    """Too few free slots, or too many leases."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(KvfabricError, ConnectionError):
    """The agent cannot be reached, or no holder could serve an import."""

    code = grpc.StatusCode.UNAVAILABLE


class FailedPrecondition(KvfabricError):
    """A slot or session in the wrong state (e.g. releasing a slot not held)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class DeadlineExceeded(KvfabricError, TimeoutError):
    """The call's timeout passed before the agent answered."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(KvfabricError):
    """The call was cancelled."""

    code = grpc.StatusCode.CANCELLED


class PermissionDenied(KvfabricError, PermissionError):
    """The engine socket or the pool memory refused this user, or the agent
    refused a call naming a block set handed to another process that still
    runs (a process uses the block sets its own register returned), or one
    under a session another process opened."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ProtocolError(KvfabricError):
    """The agent answered something this client cannot use (a layout that
    does not fit its memory, a malformed descriptor answer)."""

    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[KvfabricError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        ResourceExhausted,
        Unavailable,
        FailedPrecondition,
        DeadlineExceeded,
        Cancelled,
        PermissionDenied,
    )
}


def from_rpc_error(err: grpc.RpcError, method: str) -> KvfabricError:
    """The typed exception for a failed gRPC call."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = (err.details() if hasattr(err, "details") else None) or str(err)
    cls = _BY_CODE.get(code, KvfabricError)
    e = cls(details, method=method, code=code)
    e.rpc_error = err  # type: ignore[attr-defined]
    return e
