"""Goal: handshake frames and key lists from a client are parsed defensively, and a refused
handshake leaves no fd open on either side."""

from __future__ import annotations

import os
import socket
import struct
import threading
from pathlib import Path

import msgpack
import pytest

from adp_gateway.errors import GatewayError, ProtocolError
from adp_wire.protocol import (
    FRAME_BYTES_MAX,
    KEY_BYTES_MAX,
    PROTOCOL_VERSION,
    Hello,
    Welcome,
    decode_keys,
    encode_keys,
    parse_hello,
    parse_welcome,
    recv_frame,
    send_frame,
    welcome_body,
)
from lmcache_adp.link import GatewayLink


def test_hello_and_welcome_round_trip_with_fds() -> None:
    a, b = socket.socketpair()
    with a, b:
        read_fd, write_fd = os.pipe()
        send_frame(
            a, {"protocol": PROTOCOL_VERSION, "tenant": "t", "client": "x"}, [read_fd, write_fd]
        )
        body, fds = recv_frame(b, fds_max=3)
        assert parse_hello(body).tenant == "t" and len(fds) == 2
        welcome = Welcome(1, 2, 3, 4, 5)
        assert parse_welcome(welcome_body(welcome)) == welcome


@pytest.mark.parametrize(
    "body",
    [
        {"protocol": 99, "tenant": "t"},
        {"protocol": PROTOCOL_VERSION},
        {"protocol": PROTOCOL_VERSION, "tenant": ""},
        {"protocol": PROTOCOL_VERSION, "tenant": "x" * 65},
        {"protocol": PROTOCOL_VERSION, "tenant": "t", "token": 5},
        {"protocol": True, "tenant": "t"},  # True == 1 in Python
        {"protocol": 1.0, "tenant": "t"},
    ],
)
def test_bad_hellos_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        parse_hello(body)


WELCOME = welcome_body(Welcome(1, 4, 4096, 4096, 4096))


@pytest.mark.parametrize(
    "slots", [float("inf"), float("nan"), 4.0, True, -1, "4", b"4", None, [4]], ids=repr
)
def test_bad_welcomes_are_refused(slots: object) -> None:
    with pytest.raises(ProtocolError, match="malformed welcome"):
        parse_welcome({**WELCOME, "slots": slots})


def test_oversized_or_garbage_frames_are_refused() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack("<I", FRAME_BYTES_MAX + 1))
        with pytest.raises(ProtocolError, match="exceeds"):
            recv_frame(b)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack("<I", 3) + b"\xc1\xc1\xc1")
        with pytest.raises(ProtocolError):
            recv_frame(b)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack("<I", 10) + b"abc")
        a.close()
        with pytest.raises(ProtocolError, match="closed"):
            recv_frame(b)


def test_keys_round_trip() -> None:
    keys = ["model@00000000@0@" + "ab" * 32, "k/with/slash"]
    assert decode_keys(encode_keys(keys), 10) == keys


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xff\xff",
        msgpack.packb([]),
        msgpack.packb("one"),
        msgpack.packb([1, 2]),
        msgpack.packb([""]),
        msgpack.packb(["x" * (KEY_BYTES_MAX + 1)]),
        msgpack.packb(["a"] * 11),
        msgpack.packb([b"bytes"]),
        msgpack.packb({"a": 1}),
    ],
)
def test_bad_key_lists_are_protocol_errors(payload: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_keys(payload, 10)


def closed_everywhere(read_end: int) -> bool:
    """Whether every copy of the pipe's write end is closed (its read end sees EOF)."""
    os.set_blocking(read_end, False)
    try:
        return os.read(read_end, 1) == b""
    except BlockingIOError:
        return False
    finally:
        os.close(read_end)


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack("<I", FRAME_BYTES_MAX + 1),
        struct.pack("<I", 2) + b"\xc1\xc1",
        struct.pack("<I", 1) + b"\x01",
        struct.pack("<I", 10) + b"abc",
    ],
    ids=["too-long", "not-msgpack", "not-a-map", "cut-short"],
)
def test_a_refused_frame_closes_the_fds_it_brought(frame: bytes) -> None:
    a, b = socket.socketpair()
    read_end, write_end = os.pipe()
    with a, b:
        socket.send_fds(a, [frame], [write_end, write_end, write_end])
        os.close(write_end)
        a.shutdown(socket.SHUT_WR)
        with pytest.raises(ProtocolError):
            recv_frame(b, fds_max=3)
    assert closed_everywhere(read_end), "recv_frame leaked the fds of the frame it refused"


@pytest.mark.parametrize(
    ("body", "fds_sent"),
    [
        ({"ok": False, "error": "tenant unknown"}, 3),
        ({"ok": True, "slots": 4}, 3),
        (WELCOME, 2),
        (WELCOME, 3),  # its memfd is a pipe: not mapped
    ],
    ids=["refused", "malformed", "two-fds", "memory-mismatch"],
)
def test_the_plugin_closes_the_fds_of_a_welcome_it_refuses(
    workdir: Path, body: dict[str, object], fds_sent: int
) -> None:
    path = str(workdir / "gateway.sock")
    read_end, write_end = os.pipe()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def gateway() -> None:
        conn, _ = server.accept()
        with conn:
            recv_frame(conn)
            send_frame(conn, body, [write_end] * fds_sent)
            conn.recv(1)  # until the plugin hangs up

    thread = threading.Thread(target=gateway)
    thread.start()
    with server, pytest.raises(GatewayError):  # HandshakeRefused, or ProtocolError
        GatewayLink.connect(path, Hello("t"), 10, frozenset({os.geteuid()}))
    thread.join()
    os.close(write_end)
    assert closed_everywhere(read_end), "GatewayLink.connect leaked the fds of its welcome"


def test_a_welcome_whose_memory_cannot_be_used_is_a_protocol_error_without_leaks() -> None:
    """A window of 4,097 bytes maps, but its queues cannot be laid over it."""
    from adp_wire.ring.layout import RingLayout, create_shared

    memfd, _ = create_shared(RingLayout(1, 65536, 4097))
    doorbells = [os.eventfd(0), os.eventfd(0)]
    a, b = socket.socketpair()
    with a, b, pytest.raises(ProtocolError, match="shared memory does not map"):
        GatewayLink(a, Welcome(1, 1, 65536, 4097, 4096), [memfd, *doorbells])
    for fd in [memfd, *doorbells]:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_a_welcome_whose_arenas_cannot_hold_a_run_of_keys_is_refused_without_leaks() -> None:
    """The plugin sends runs of keys up to ARENA_BYTES_MIN; into a smaller arena its I/O thread
    would fail at the first lookup."""
    from adp_wire.ring.layout import RingLayout, create_shared

    memfd, _ = create_shared(RingLayout(4, 4096, 1 << 20))
    doorbells = [os.eventfd(0), os.eventfd(0)]
    a, b = socket.socketpair()
    with a, b, pytest.raises(ProtocolError, match="arenas of 4096 bytes are smaller"):
        GatewayLink(a, Welcome(1, 4, 4096, 1 << 20, 1 << 20), [memfd, *doorbells])
    for fd in [memfd, *doorbells]:
        with pytest.raises(OSError):
            os.fstat(fd)


@pytest.mark.parametrize("broken", ["unsealed-memory", "pipe-doorbell"])
def test_memory_the_gateway_could_shrink_or_a_doorbell_that_could_block_is_refused(
    broken: str,
) -> None:
    """Either would stop LMCache's process: a SIGBUS at the next touch of memory shrunk under
    the mapping, or an I/O thread hung answering a doorbell that blocks. Refused, nothing
    leaked."""
    from adp_wire.ring.layout import RingLayout, create_shared

    layout = RingLayout(4, 65536, 1 << 20)
    if broken == "unsealed-memory":
        memfd = os.memfd_create("adp-session")
        os.ftruncate(memfd, layout.total_bytes)
        doorbells = [os.eventfd(0), os.eventfd(0)]
        match = "not sealed at its size"
    else:
        memfd, _ = create_shared(layout)
        read_end, write_end = os.pipe()
        doorbells = [os.eventfd(0), read_end]
        os.close(write_end)
        match = "completion doorbell is pipe"
    a, b = socket.socketpair()
    with a, b, pytest.raises(ProtocolError, match=match):
        GatewayLink(a, Welcome(1, 4, 65536, 1 << 20, 1 << 20), [memfd, *doorbells])
    for fd in [memfd, *doorbells]:
        with pytest.raises(OSError):
            os.fstat(fd)
