"""Goal: handshake frames and key lists from a client are parsed defensively."""

from __future__ import annotations

import socket
import struct

import msgpack
import pytest

from gateway.errors import ProtocolError
from gateway.protocol import (
    FRAME_BYTES_MAX,
    KEY_BYTES_MAX,
    PROTOCOL_VERSION,
    Welcome,
    decode_keys,
    encode_keys,
    parse_hello,
    parse_welcome,
    recv_frame,
    send_frame,
    welcome_body,
)


def test_hello_and_welcome_round_trip_with_fds() -> None:
    a, b = socket.socketpair()
    with a, b:
        read_fd, write_fd = __import__("os").pipe()
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
    ],
)
def test_bad_hellos_are_refused(body: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        parse_hello(body)


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
