"""What the agent sends is checked before use: a layout that does not add
up or does not fit the memory, and malformed descriptor answers, are
ProtocolErrors, never a crash or a fault on first touch."""

from __future__ import annotations

import mmap
import os
import socket
import threading

import pytest

import kvfabric
import kvfabric.memory
from kvfabric._pb.fabric.fabricpb import engine_pb2
from kvfabric._pb.layout.layoutpb import layout_pb2
from kvfabric.memory import map_descriptor, receive_descriptor


def response(slots: int = 4, align: int = 512) -> tuple[engine_pb2.RegisterResponse, int]:
    """A consistent answer for 2 layers, 4 heads of 8 f16, page 4, TP 2,
    HND, fully contiguous; and the bytes its memory needs."""
    chunk = 4 * 2 * 8 * 2
    block = -(-2 * 2 * chunk // align) * align
    region = slots * block
    lay = layout_pb2.Layout(
        version=1,
        model=layout_pb2.ModelConfig(layers=2, kv_heads=4, head_dim=8, dtype=layout_pb2.DTYPE_F16),
        page_size=4, tp_size=2, kv_order=layout_pb2.KV_ORDER_HND,
        arrangement=layout_pb2.ARRANGEMENT_FULLY_CONTIGUOUS, alignment=align, slots=slots,
    )
    resp = engine_pb2.RegisterResponse(block_set=9, layout=lay)
    for r in range(2):
        resp.memory.add(offset=r * region, size=region)
        resp.ranks.add(
            offset=r * region, block_stride=block, layer_stride=2 * chunk, kv_stride=chunk,
            chunk_shape=[2, 4, 8], head_ids=[2 * r, 2 * r + 1], replicas=1, planes=2,
            element_bytes=2, chunk_bytes=chunk,
        )
    return resp, 2 * region


def test_consistent_answer_maps():
    resp, size = response()
    mem = mmap.mmap(-1, size)
    bs = kvfabric.BlockSet(resp, [mem, mem])
    assert bs.rank(1).shape == (4, 2, 2, 2, 4, 8)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda r: setattr(r.ranks[1], "offset", 10**9), "region outside the mapped memory"),
        (lambda r: setattr(r.ranks[0], "block_stride", 1 << 40), "region outside the mapped memory"),
        (lambda r: r.ranks[0].chunk_shape.__setitem__(0, 3), r"chunk_shape \[3, 4, 8\], want \[2, 4, 8\]"),
        (lambda r: setattr(r.ranks[0], "element_bytes", 4), "element_bytes 4"),
        (lambda r: setattr(r.ranks[0], "planes", 1), "planes 1, want 2"),
        (lambda r: r.ranks[1].head_ids.__setitem__(1, 9), r"head_ids \[2, 9\] for 4 KV heads"),
        (lambda r: r.ranks[1].head_ids.__setitem__(1, 0), "not a run of heads"),
        (lambda r: r.ranks.pop(), "1 rank layouts and 2 memories for TP 2"),
    ],
)
def test_bad_answers(mutate, match):
    resp, size = response()
    mutate(resp)
    mem = mmap.mmap(-1, size)
    with pytest.raises(kvfabric.ProtocolError, match=match):
        kvfabric.BlockSet(resp, [mem, mem])


def fake_fd_socket(path: str, answer: bytes, fds: list[int]) -> threading.Thread:
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        with conn, srv:
            conn.recv(256)
            socket.send_fds(conn, [answer], fds)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize(
    "answer,nfds,match",
    [
        (b"ok 0 abc\n", 1, "unexpected answer 'ok 0 abc'"),
        (b"ok 0 4096\n", 0, "with 0 descriptors"),
        (b"ok 0 0\n", 1, "unexpected answer"),
        (b"ok 0 " + str(kvfabric.memory.MAX_MEMORY + 1).encode() + b"\n", 1, "unexpected answer"),
        (b"hello\n", 1, "unexpected answer 'hello'"),
    ],
)
def test_bad_descriptor_answers(tmp_path, answer, nfds, match):
    path = str(tmp_path / "fd.sock")
    fd = os.memfd_create("t")
    os.ftruncate(fd, 4096)
    try:
        t = fake_fd_socket(path, answer, [fd] * nfds)
        with pytest.raises(kvfabric.ProtocolError, match=match):
            receive_descriptor(path, "tok", timeout=5)
        t.join(5)
    finally:
        os.close(fd)


def test_descriptor_larger_than_its_file(tmp_path):
    # Mapping past a file's end faults on first touch; the client refuses.
    path = str(tmp_path / "fd.sock")
    fd = os.memfd_create("t")
    os.ftruncate(fd, 4096)
    try:
        t = fake_fd_socket(path, b"ok 0 8192\n", [fd])
        with pytest.raises(kvfabric.ProtocolError, match="offers 8192 bytes of a file of 4096"):
            map_descriptor(path, "tok", timeout=5)
        t.join(5)
    finally:
        os.close(fd)


def test_descriptor_at_its_file_size(tmp_path):
    path = str(tmp_path / "fd.sock")
    fd = os.memfd_create("t")
    os.ftruncate(fd, 4096)
    try:
        t = fake_fd_socket(path, b"ok 0 4096\n", [fd])
        mem = map_descriptor(path, "tok", timeout=5)
        mem[4095] = 7
        assert len(mem) == 4096 and os.pread(fd, 1, 4095) == b"\x07"
        mem.close()
        t.join(5)
    finally:
        os.close(fd)
