"""The plugin <-> gateway wire protocol: handshake frames, op codes, statuses and request payloads.

The handshake runs over the gateway's Unix socket as length-prefixed msgpack maps. The gateway
answers a ``Hello`` with a ``Welcome`` and three or four fds by SCM_RIGHTS: the memfd holding the
rings, arenas and transfer window (adp_wire/ring/layout.py), the client's submit doorbell and its
completion doorbell (eventfds), and, when ``Welcome.presence_slots`` is not 0, a read-only fd of
the tenant's presence table (adp_wire/presence.py), from which the client answers EXISTS itself.
A client whose L1 lies in a shared-memory segment sends that segment's fd with its hello
(``l1_bytes`` says its size); ``Welcome.l1_attached`` says whether the gateway took it for
zero-copy ops. A client whose L1 is private memory may instead let the gateway copy its stores
out of it (``remote_probe``: where the gateway reads ``remote_token`` to check that the kernel
lets it; ``Welcome.remote_copy`` says whether it does). After that the socket carries nothing;
it stays open so each side sees the other die (EOF).

Everything here parses untrusted bytes: any malformed input raises ``ProtocolError``.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import struct
import time
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import msgpack

from adp_wire.errors import HandshakeRefused, ProtocolError
from adp_wire.ring.layout import align_up

# 5: the gateway takes a zero-copy store's checksums; 6: no fragment_bytes; 7: remote copy
PROTOCOL_VERSION = 8
FRAME_BYTES_MAX = 64 * 1024
KEY_BYTES_MAX = 1024
TENANT_BYTES_MAX = 64
KEYS_PER_REQUEST_MAX = 4096
# Every slot's arena holds at least this: the client sends runs of keys that fit it
# (lmcache_adp/lanes.py), and a welcome that promises less is refused.
ARENA_BYTES_MIN = 64 * 1024
_FRAME_HEADER = struct.Struct("<I")
GIVEN_UP_BYTES = 8  # a store read from L1: its given-up word, in its arena after its keys
SOURCE_BYTES = 8  # a remote-copy store: its buffer's address in the client, after that word


def default_socket_path() -> str:
    """Where the gateway listens, and the plugin looks, unless told otherwise: in a directory
    only the gateway's user can write, so no other local user can stand in for it.

    ``/run/lmcache-adp/gateway.sock`` for root; for another user
    ``$XDG_RUNTIME_DIR/lmcache-adp/gateway.sock``, or ``/tmp/lmcache-adp-UID/gateway.sock`` where
    the session has no runtime directory. The gateway creates the directory (mode 0750) and
    refuses one that another user owns or can write.
    """
    uid = os.geteuid()
    if uid == 0:
        return "/run/lmcache-adp/gateway.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return os.path.join(runtime, "lmcache-adp", "gateway.sock")
    return f"/tmp/lmcache-adp-{uid}/gateway.sock"


class Op(IntEnum):
    GET = 1
    SET = 2
    EXISTS = 3
    DELETE = 4


class Status(IntEnum):
    OK = 0  # done; for EXISTS/DELETE the per-key result bytes are in the slot's arena
    MISS = 1  # GET: not stored (or failed verification, which is logged)
    FAILED = 2  # an I/O or internal error; logged by the gateway
    EXPIRED = 3  # the op's deadline passed before it could start
    REJECTED = 4  # shed by admission control (store backlog over its bound)


@dataclass(frozen=True)
class Hello:
    tenant: str
    token: str | None = None
    client: str = ""
    protocol: int = PROTOCOL_VERSION
    l1_bytes: int = 0  # the size of the L1 segment whose fd comes with the hello; 0: none
    remote_probe: int = 0  # an address in the client holding remote_token; 0: no remote copy
    remote_token: int = 0


@dataclass(frozen=True)
class Welcome:
    session_id: int
    slots: int
    arena_bytes: int
    window_bytes: int
    object_bytes_max: int
    l1_attached: int = 0  # 1 when the gateway mapped the client's L1 segment
    presence_slots: int = 0  # the cells of the tenant's presence table, whose fd comes 4th; 0: none
    remote_copy: int = 0  # 1 when the gateway copies stores out of the client's memory itself


def connect_within(sock: socket.socket, path: str, deadline: float) -> None:
    """Connect ``sock`` (which has a timeout) to ``path`` by ``deadline`` (monotonic). While
    the listener's accept queue is full (a burst of connections, or a busy gateway), a Unix
    socket with a timeout fails a connect at once (EAGAIN) where a blocking one would wait:
    try again, briefly, until the deadline."""
    pause_s = 0.005
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + pause_s > deadline:
                raise
            time.sleep(pause_s)
            pause_s = min(2 * pause_s, 0.1)


def send_frame(
    sock: socket.socket,
    body: dict[str, Any],
    fds: list[int] | None = None,
    deadline: float | None = None,
) -> None:
    """Send one frame (with ``fds``). With ``deadline`` (``time.monotonic()``), a peer that
    does not take it by then raises TimeoutError, however it paces its reads."""
    data = msgpack.packb(body, use_bin_type=True)
    frame = _FRAME_HEADER.pack(len(data)) + data
    if fds:
        _until(sock, deadline)
        sent = socket.send_fds(sock, [frame], fds)
        frame = frame[sent:]
    while frame:
        _until(sock, deadline)
        frame = frame[sock.send(frame) :]


def recv_frame(
    sock: socket.socket, fds_max: int = 0, deadline: float | None = None
) -> tuple[dict[str, Any], list[int]]:
    """Read one frame (and up to ``fds_max`` fds sent with its first bytes). A frame that is
    refused raises ``ProtocolError`` with the fds that came with it closed. With ``deadline``
    (``time.monotonic()``), a frame not whole by then raises TimeoutError: the socket's own
    timeout bounds each read, so a peer dripping a byte at a time would otherwise never end."""
    fds: list[int] = []
    try:
        header = _recv_exact(sock, _FRAME_HEADER.size, fds_max, fds, deadline)
        (length,) = _FRAME_HEADER.unpack(header)
        if length > FRAME_BYTES_MAX:
            raise ProtocolError(f"handshake frame of {length} bytes exceeds {FRAME_BYTES_MAX}")
        body = _recv_exact(sock, length, 0, fds, deadline)
        try:
            value = msgpack.unpackb(body, raw=False, max_str_len=FRAME_BYTES_MAX)
        except Exception as exc:
            raise ProtocolError(f"handshake frame is not valid msgpack: {exc}") from exc
        if not isinstance(value, dict):
            raise ProtocolError("handshake frame is not a map")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return value, fds


def _recv_exact(
    sock: socket.socket, size: int, fds_max: int, fds: list[int], deadline: float | None
) -> bytes:
    """``size`` bytes; fds sent with them (up to ``fds_max``) are appended to ``fds``."""
    chunks: list[bytes] = []
    received = 0
    while received < size:
        _until(sock, deadline)
        if fds_max and not fds:
            data, new_fds, _, _ = socket.recv_fds(sock, size - received, fds_max)
            fds.extend(new_fds)
        else:
            data = sock.recv(size - received)
        if not data:
            raise ProtocolError("peer closed the socket during the handshake")
        chunks.append(data)
        received += len(data)
    return b"".join(chunks)


def _until(sock: socket.socket, deadline: float | None) -> None:
    """Bound the next socket call by what is left until ``deadline``; TimeoutError once none
    is."""
    if deadline is None:
        return
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    sock.settimeout(left)


def status_request() -> dict[str, Any]:
    """The frame ``adp-gateway status`` sends instead of a hello; the gateway answers with
    ``{"ok": true, "status": {...}}`` (or a refusal) and closes."""
    return {"protocol": PROTOCOL_VERSION, "request": "status"}


def is_status_request(body: dict[str, Any]) -> bool:
    return body.get("request") == "status" and body.get("protocol") == PROTOCOL_VERSION


def parse_hello(body: dict[str, Any]) -> Hello:
    protocol = body.get("protocol")
    if type(protocol) is not int or protocol != PROTOCOL_VERSION:  # not True, not 1.0
        raise ProtocolError(
            f"client speaks protocol {protocol!r}, this gateway speaks {PROTOCOL_VERSION}: "
            "install matching lmcache-adp versions on both sides"
        )
    tenant = body.get("tenant")
    token = body.get("token")
    client = body.get("client", "")
    if not isinstance(tenant, str) or not 0 < len(tenant.encode()) <= TENANT_BYTES_MAX:
        raise ProtocolError(f"tenant must be a string of 1..{TENANT_BYTES_MAX} bytes")
    if token is not None and not isinstance(token, str):
        raise ProtocolError("token must be a string")
    if not isinstance(client, str):
        raise ProtocolError("client must be a string")
    numbers = {name: body.get(name, 0) for name in ("l1_bytes", "remote_probe", "remote_token")}
    for name, value in numbers.items():
        if type(value) is not int or not 0 <= value < 2**64:
            raise ProtocolError(f"{name} must be an integer from 0 to 2**64 - 1")
    return Hello(tenant=tenant, token=token, client=client[:256], **numbers)


def hello_body(hello: Hello) -> dict[str, Any]:
    return {
        "protocol": hello.protocol,
        "tenant": hello.tenant,
        "token": hello.token,
        "client": hello.client,
        "l1_bytes": hello.l1_bytes,
        "remote_probe": hello.remote_probe,
        "remote_token": hello.remote_token,
    }


def welcome_body(welcome: Welcome) -> dict[str, Any]:
    return {"ok": True, **dataclasses.asdict(welcome)}


def parse_welcome(body: dict[str, Any]) -> Welcome:
    if body.get("ok") is not True:
        raise HandshakeRefused(str(body.get("error", "the gateway refused the handshake")))
    values: dict[str, int] = {}
    for name in Welcome.__dataclass_fields__:
        value = body.get(name)
        if type(value) is not int or value < 0:  # not a bool, a float or a string of digits
            raise ProtocolError(
                f"malformed welcome from the gateway: {name} is {value!r}, not an integer >= 0: "
                "install matching lmcache-adp versions on both sides"
            )
        values[name] = value
    return Welcome(**values)


def given_up_span(keys_bytes: int) -> slice:
    """Where the given-up word of a store the gateway reads from L1 (zero-copy or remote copy)
    lies in its slot's arena: after its keys, on an 8-byte boundary. The client posts it as
    zero and sets it before it reports the store failed (past its deadline, or its link gone),
    after which LMCache may rewrite the buffer. The gateway reads L1 first (a zero-copy store's
    checksums, a remote copy's bytes) and the word next: set, it gives the store up; clear, it
    read the bytes LMCache stored (docs/design.md, "Zero-copy stores", "Remote copy")."""
    at = align_up(keys_bytes, GIVEN_UP_BYTES)
    return slice(at, at + GIVEN_UP_BYTES)


def source_span(keys_bytes: int) -> slice:
    """Where a remote-copy store's buffer address (u64, little-endian) lies in its arena: after
    its given-up word."""
    at = given_up_span(keys_bytes).stop
    return slice(at, at + SOURCE_BYTES)


def encode_keys(keys: list[str]) -> bytes:
    return bytes(msgpack.packb(keys, use_bin_type=True))


def decode_keys(payload: bytes | memoryview, count_max: int) -> list[str]:
    """Parse a request's key list; every key is a non-empty string of at most KEY_BYTES_MAX."""
    try:
        keys = msgpack.unpackb(
            payload,
            raw=False,
            max_str_len=KEY_BYTES_MAX,
            max_array_len=count_max,
            max_bin_len=0,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:
        raise ProtocolError(f"request keys are not valid msgpack: {exc}") from exc
    if not isinstance(keys, list) or not keys:
        raise ProtocolError("request keys must be a non-empty list")
    if set(map(type, keys)) != {str} or "" in keys:  # no per-key Python loop: 1,000-key EXISTS
        raise ProtocolError("every request key must be a non-empty string")
    return keys
