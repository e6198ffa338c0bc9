"""Mapping the agent's pool memory (engine.proto's ``Memory``).

Two ways, as the agent offers them:

1. The descriptor: connect to the companion socket (the engine socket's path
   + ``.fd``), write ``<token>\\n``, and receive ``ok <offset> <size>\\n``
   with the memory file's descriptor as SCM_RIGHTS ancillary data (or
   ``error <reason>\\n``). Works from any PID or mount namespace that can
   reach the socket file.
2. The named file under the agent's ``memory_dir``: open it read-write and
   map it.

Mappings are ``mmap.mmap`` objects (MAP_SHARED, read-write). numpy views
keep their mapping alive: memory stays mapped while any view of it exists.
"""

from __future__ import annotations

import mmap
import os
import socket

from .errors import InvalidArgument, ProtocolError, Unavailable

__all__ = ["FD_SOCKET_SUFFIX", "MAX_MEMORY", "receive_descriptor", "map_descriptor", "map_file"]

#: The descriptor socket's name beside the engine socket.
FD_SOCKET_SUFFIX = ".fd"
#: The largest mapping the client accepts from an agent: what a 64-bit
#: address space holds with room to spare (the Go client's bound).
MAX_MEMORY = 1 << 48
#: One answer line is at most this many bytes.
_MAX_LINE = 256
_MAX_TOKEN = 250


def receive_descriptor(fd_socket: str, token: str | bytes, timeout: float = 10.0) -> tuple[int, int, int]:
    """Ask the descriptor socket for the memory named by token.

    Returns (fd, offset, size): the descriptor, owned by the caller, and the
    range of its file that may be mapped.
    """
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if not 1 <= len(raw) <= _MAX_TOKEN or b"\n" in raw or b"\r" in raw:
        raise InvalidArgument(f"memory token {token!r}: want 1..{_MAX_TOKEN} bytes without newlines")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        s.settimeout(timeout)
        try:
            s.connect(fd_socket)
            s.sendall(raw + b"\n")
            msg, fds, _, _ = socket.recv_fds(s, _MAX_LINE, 1)
        except socket.timeout as e:
            raise Unavailable(f"descriptor socket {fd_socket}: no answer within {timeout:g} s") from e
        except OSError as e:
            raise Unavailable(f"descriptor socket {fd_socket}: {e.strerror or e}") from e
    finally:
        s.close()
    line = msg.decode(errors="replace").rstrip("\n")
    try:
        if line.startswith("error "):
            raise Unavailable(f"descriptor socket {fd_socket}: agent says: {line[len('error '):]}")
        fields = line.split()
        ok = len(fields) == 3 and fields[0] == "ok" and fields[1].isdigit() and fields[2].isdigit()
        offset, size = (int(fields[1]), int(fields[2])) if ok else (0, 0)
        if not ok or len(fds) != 1 or size == 0 or size > MAX_MEMORY or offset > MAX_MEMORY:
            raise ProtocolError(f"descriptor socket {fd_socket}: unexpected answer {line!r} with {len(fds)} descriptors")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds[0], offset, size


def _map_fd(fd: int, size: int, what: str) -> mmap.mmap:
    # A mapping past the file's end faults on first touch (SIGBUS), so the
    # file must hold every byte the agent promises.
    have = os.fstat(fd).st_size
    if have < size:
        raise ProtocolError(f"{what}: the agent offers {size} bytes of a file of {have}")
    try:
        return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    except OSError as e:
        raise Unavailable(f"{what}: map {size} bytes: {e.strerror or e}") from e


def map_descriptor(fd_socket: str, token: str, timeout: float = 10.0) -> mmap.mmap:
    """Receive the memory named by token and map all of it shared, read-write."""
    fd, offset, size = receive_descriptor(fd_socket, token, timeout)
    try:
        if offset != 0:
            raise ProtocolError(f"descriptor socket {fd_socket}: offset {offset}: this client maps whole files only")
        return _map_fd(fd, size, f"pool memory from {fd_socket}")
    finally:
        os.close(fd)


def map_file(path: str) -> mmap.mmap:
    """Map the named memory file at path (under the agent's memory_dir)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except PermissionError as e:
        from .errors import PermissionDenied

        raise PermissionDenied(f"pool memory {path}: {e.strerror}") from e
    except OSError as e:
        raise Unavailable(f"pool memory {path}: {e.strerror or e}") from e
    try:
        size = os.fstat(fd).st_size
        if size <= 0 or size > MAX_MEMORY:
            raise ProtocolError(f"pool memory {path}: size {size}")
        return _map_fd(fd, size, f"pool memory {path}")
    finally:
        os.close(fd)
