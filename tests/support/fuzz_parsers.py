"""Fuzz targets over the gateway's parsers of untrusted input, and the oracles they check.

One module, two drivers. tests/fuzz/test_properties.py draws each target's input with
hypothesis; ``main`` lets atheris (libFuzzer, coverage guided) draw it from its byte strings::

    python -m tests.support.fuzz_parsers -atheris_runs=100000 -seed=1

A target draws its input through a ``Source`` (a few primitive draws that either driver can
answer), runs the parser and checks what came back. What must hold, for every input:

* no crash: a parser returns its documented result or raises ``ProtocolError`` (handshake, keys,
  rings, session descriptors; ``HandshakeRefused`` for a welcome that says not ok), or returns
  None (records on disk); any other exception is a bug;
* no hang: the drivers bound every call (hypothesis: SIGALRM per example, test_properties.py;
  atheris: libFuzzer's ``-timeout``); sockets are closed by the sender, so no read may block;
* no out-of-bounds access: a ring operation reads only its entries and writes only its own entry
  and counter; a record parse does not look past its 4 KiB page;
* the result is well formed and agrees with a small reference model of the parser;
* sessions: every descriptor check refuses what it must, and garbage from one session leaves
  another session's ops intact;
* recovery over a device of random bytes and forged-but-salted headers does not raise, and every
  object it returns either misses or loads bytes that the raw device confirms.

``PLANTS`` holds one planted bug per target (a monkeypatched parser) and how its property
reports it; test_properties.py shows each property fails with its bug planted, and
``ADP_FUZZ_PLANT=keys`` does the same for atheris.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import mmap
import os
import random
import socket
import struct
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgpack

from adp_gateway.card.base import Wanted
from adp_gateway.card.holdings import NO_HOLDINGS
from adp_gateway.card.software import card as software_card
from adp_gateway.card.software import format as record_format
from adp_gateway.card.software import recovery as regionscan
from adp_gateway.card.software import sealing as footer_module
from adp_gateway.card.software.card import SoftwareCard
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.format import (
    FORMAT_VERSION,
    HEADER_BYTES,
    NAME_BYTES_MAX,
    RECORD_MAGIC,
    SUPERBLOCK_MAGIC,
    Kind,
    RecordHeader,
    Superblock,
    checksum,
    key_hash,
    pack_header,
    pack_superblock,
    unpack_header,
)
from adp_gateway.card.software.index import Manifest
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.card.software.sealing import (
    ROW_FIELDS,
    TRAILER_BYTES,
    TRAILER_MAGIC,
    Trailer,
    pack_footer,
    pack_trailer,
)
from adp_gateway.errors import HandshakeRefused, ProtocolError
from adp_gateway.objects.catalog import ObjectCatalog
from adp_gateway.objects.store import ObjectStore
from adp_gateway.observe.metrics import Metrics
from adp_gateway.scheduling.scheduler import Scheduler
from adp_gateway.sessions.session import Session
from adp_wire import fragmenter, protocol
from adp_wire.protocol import (
    FRAME_BYTES_MAX,
    KEY_BYTES_MAX,
    KEYS_PER_REQUEST_MAX,
    PROTOCOL_VERSION,
    TENANT_BYTES_MAX,
    Hello,
    Op,
    Status,
    Welcome,
    encode_keys,
)
from adp_wire.ring import queue as ring_queue
from adp_wire.ring.layout import (
    COMPLETION,
    CQ_HEAD,
    CQ_TAIL,
    FLAG_L1,
    PAGE_BYTES,
    SQ_HEAD,
    SQ_TAIL,
    SUBMISSION,
    RingLayout,
    Submission,
    align_up,
    map_shared,
)

U8, U16, U32, U64 = 2**8 - 1, 2**16 - 1, 2**32 - 1, 2**64 - 1
SOCKET_TIMEOUT_S = 2.0  # the peer has closed its end: a read that waits this long is a hang
T = TypeVar("T")

# The fixed fields of the on-disk structures, as adp_gateway/card/software/format.py and
# card/software/sealing.py pack them.
HEADER_FIELDS = record_format._FIXED
SUPERBLOCK_FIELDS = record_format._SUPERBLOCK
TRAILER_FIELDS = footer_module._TRAILER
CHECKSUM_AT = record_format._CHECKSUM_OFFSET  # the same in a header, superblock and trailer


class Source(Protocol):
    """Where a target's input comes from: hypothesis draws, or atheris's bytes."""

    def integer(self, lo: int, hi: int) -> int: ...

    def boolean(self) -> bool: ...

    def binary(self, max_size: int) -> bytes: ...

    def text(self, max_size: int) -> str: ...

    def floating(self) -> float: ...


Target = Callable[[Source], None]
TARGETS: dict[str, Target] = {}  # name -> target, in the order they are defined


def target(function: Target) -> Target:
    """Register a fuzz target, by its name without the ``target_`` prefix."""
    TARGETS[function.__name__.removeprefix("target_")] = function
    return function


def pick(src: Source, options: Sequence[T]) -> T:
    return options[src.integer(0, len(options) - 1)]


def unsigned(src: Source, top: int, near: Sequence[int] = ()) -> int:
    """An integer in [0, top], often at an edge that the parsers compare against."""
    way = src.integer(0, 3)
    if way == 0:
        return src.integer(0, top)
    if way == 1:
        return src.integer(0, 64)
    edges = [0, 1, 2, top - 1, top, top // 2 + 1, *(n + d for n in near for d in (-1, 0, 1))]
    return min(max(pick(src, edges), 0), top)


def filler(src: Source, size: int) -> bytes:
    """``size`` bytes: a drawn prefix, then pseudo-random bytes from a drawn seed."""
    head = src.binary(min(size, 64))[:size]
    return head + random.Random(src.integer(0, U32)).randbytes(size - len(head))


def name_text(src: Source, byte_lengths: Sequence[int]) -> str:
    """A string of exactly one of ``byte_lengths`` UTF-8 bytes, of 1-, 2- or 3-byte chars."""
    size = pick(src, byte_lengths)
    char = pick(src, ["k", "\u00e9", "\u20ac"])
    width = len(char.encode())
    return char * (size // width) + "k" * (size % width)


def wire_value(src: Source, depth: int = 2) -> Any:
    """Any value msgpack can carry (nested up to ``depth``)."""
    kind = src.integer(0, 9 if depth > 0 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return src.boolean()
    if kind == 2:
        return src.integer(-40, 300)
    if kind == 3:
        return src.integer(-(2**63), U64)
    if kind == 4:
        return src.floating()
    if kind == 5:
        return src.text(40)
    if kind == 6:
        return src.binary(40)
    if kind == 7:
        return [wire_value(src, depth - 1) for _ in range(src.integer(0, 4))]
    if kind == 8:
        return {src.text(12): wire_value(src, depth - 1) for _ in range(src.integer(0, 4))}
    return msgpack.ExtType(src.integer(0, 127), src.binary(16))


def pack(value: Any) -> bytes:
    return bytes(msgpack.packb(value, use_bin_type=True))


def same_wire_value(a: Any, b: Any) -> bool:
    """Equality as msgpack sees it (NaN equals NaN)."""
    return pack(a) == pack(b)


def verdict(parse: Callable[[], T], valid: bool, what: str) -> T | None:
    """What ``parse()`` returned, or None when it raised ProtocolError, which it must do exactly
    when its input is not ``valid``; ``what`` names the call and its input."""
    try:
        result = parse()
    except ProtocolError as exc:
        assert not valid, f"{what}: refused valid input ({exc})"
        return None
    assert valid, f"{what}: accepted, as {result!r}"
    return result


# Handshake -------------------------------------------------------------------------------------

HANDSHAKE_FIELDS = (
    "protocol",
    "tenant",
    "token",
    "client",
    "l1_bytes",
    "remote_probe",
    "remote_token",
    "ok",
    "error",
    *Welcome.__annotations__,
)
HELLO_NUMBERS = ("l1_bytes", "remote_probe", "remote_token")  # ints in [0, 2**64) when present


def handshake_field(src: Source, name: str) -> Any:
    if src.integer(0, 3) == 0:
        return wire_value(src)
    if name == "protocol":
        return pick(src, [PROTOCOL_VERSION, PROTOCOL_VERSION, 0, 2, True, 1.0, "1", -1, U64])
    if name == "ok":
        return pick(src, [True, True, False, 1, None, "true"])
    if name in ("tenant", "token", "client", "error"):
        return name_text(src, [0, 1, 2, 63, 64, 65, 255, 256, 257, 1000])
    return pick(src, [0, 1, 4096, U32, U64, -1, "12", b"12", 1.5, math.inf, True, None, [1]])


# Valid as the current protocol has them (a test below keeps them so): the properties mutate
# one or two fields of these, so a stale one leaves the valid side all but unexplored.
VALID_HELLO: dict[str, Any] = {
    "protocol": PROTOCOL_VERSION,
    "tenant": "t",
    "token": None,
    "client": "c",
    "remote_probe": 2**40,
    "remote_token": U64 - 1,
}
VALID_WELCOME: dict[str, Any] = {
    "ok": True,
    "session_id": 1,
    "slots": 4,
    "arena_bytes": 2**16,
    "window_bytes": 2**20,
    "object_bytes_max": 2**20,
    "l1_attached": 0,
    "presence_slots": 0,
    "remote_copy": 0,
}


def handshake_body(src: Source, like: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One of the valid maps ``like`` with one or two fields changed (mostly its own: each
    check alone), or a map made of drawn fields."""
    if src.integer(0, 2) == 0:
        body = {name: handshake_field(src, name) for name in HANDSHAKE_FIELDS if src.integer(0, 3)}
    else:
        body = dict(pick(src, like))
        for _ in range(src.integer(1, 2)):
            name = pick(src, list(body) if src.integer(0, 3) else HANDSHAKE_FIELDS)
            if src.integer(0, 3) == 0:
                body.pop(name, None)
            else:
                body[name] = handshake_field(src, name)
    for _ in range(src.integer(0, 2)):
        body[src.text(12)] = wire_value(src)
    return body


@dataclass(frozen=True)
class Frame:
    stream: bytes  # everything the peer sends before it closes its end
    fds_max: int  # recv_frame's argument: 0 on the gateway, 3 on the plugin
    fds_sent: int  # fds the peer attaches to its first byte


def draw_frame(src: Source) -> Frame:
    way = src.integer(0, 5)
    if way == 0:
        stream = src.binary(300)
    else:
        if way == 5:  # a body at the frame size limit
            size = pick(src, [FRAME_BYTES_MAX - 40, FRAME_BYTES_MAX - 10, FRAME_BYTES_MAX])
            value: Any = {"protocol": 1, "tenant": "t", "client": "c" * size}
        else:
            value = (
                handshake_body(src, [VALID_HELLO, VALID_WELCOME]) if way < 3 else wire_value(src)
            )
        body = pack(value)
        declared = len(body)
        if way == 4:
            declared = pick(
                src, [0, declared - 1, declared + 1, FRAME_BYTES_MAX, FRAME_BYTES_MAX + 1, U32]
            )
        stream = struct.pack("<I", max(declared, 0)) + body
        if src.boolean():
            stream += src.binary(16)
        if src.integer(0, 4) == 0:
            stream = stream[: src.integer(0, len(stream))]
    return Frame(stream, pick(src, [0, 3]), pick(src, [0, 0, 1, 3, 4]))


def reference_frame(stream: bytes) -> dict[str, Any] | None:
    """What recv_frame must return for ``stream``: the first frame's map, or None."""
    if len(stream) < 4:
        return None
    (length,) = struct.unpack_from("<I", stream)
    if length > FRAME_BYTES_MAX or len(stream) < 4 + length:
        return None
    try:
        value = msgpack.unpackb(stream[4 : 4 + length], raw=False)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def open_fds() -> set[int]:
    """This process's open fds (Linux)."""
    listed = {int(name) for name in os.listdir("/proc/self/fd")}
    return {fd for fd in listed if _is_open(fd)}  # not the one listdir used, closed by now


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def receive(frame: Frame) -> dict[str, Any] | None:
    """Send ``frame`` from a peer that then closes its end; what recv_frame makes of it."""
    ours, theirs = socket.socketpair()
    try:
        fds = [
            os.open(os.devnull, os.O_RDONLY) for _ in range(frame.fds_sent if frame.stream else 0)
        ]
        try:
            if fds:
                socket.send_fds(theirs, [frame.stream[:1]], fds)
                theirs.sendall(frame.stream[1:])
            else:
                theirs.sendall(frame.stream)
        finally:
            for fd in fds:
                os.close(fd)
        theirs.shutdown(socket.SHUT_WR)
        ours.settimeout(SOCKET_TIMEOUT_S)
        before = open_fds()
        try:
            body, received = protocol.recv_frame(ours, frame.fds_max)
        except ProtocolError:
            leaked = open_fds() - before
            for fd in leaked:
                os.close(fd)
            assert not leaked, f"recv_frame refused {frame} and left its {len(leaked)} fds open"
            return None
        except TimeoutError as exc:
            raise AssertionError(
                f"recv_frame waits for bytes a closed peer never sends: {frame}"
            ) from exc
        for fd in received:
            os.close(fd)
        assert len(received) <= frame.fds_max, (frame, received)
        assert isinstance(body, dict), body
        return body
    finally:
        ours.close()
        theirs.close()


@target
def target_frame(src: Source) -> None:
    """Handshake frames: recv_frame returns exactly the first frame's map or raises
    ProtocolError, never blocks once the peer closed, takes at most ``fds_max`` fds and closes
    those of a frame it refuses; the map then goes through parse_hello and parse_welcome (see
    their targets)."""
    frame = draw_frame(src)
    expected = reference_frame(frame.stream)
    body = receive(frame)
    assert (body is None) == (expected is None), (frame, body, expected)
    if body is not None:
        assert same_wire_value(body, expected), (frame, body, expected)
        check_hello(body)
        check_welcome(body)


def wire_body(src: Source, like: dict[str, Any]) -> dict[str, Any]:
    """A map like ``like`` as it comes off the wire (through msgpack and back)."""
    value = msgpack.unpackb(pack(handshake_body(src, [like])), raw=False)
    assert isinstance(value, dict)
    return value


def check_hello(body: dict[str, Any]) -> None:
    version, tenant, token = body.get("protocol"), body.get("tenant"), body.get("token")
    client = body.get("client", "")
    numbers = {name: body.get(name, 0) for name in HELLO_NUMBERS}
    valid = (
        type(version) is int
        and version == PROTOCOL_VERSION
        and isinstance(tenant, str)
        and 0 < len(tenant.encode()) <= TENANT_BYTES_MAX
        and (token is None or isinstance(token, str))
        and isinstance(client, str)
        and all(type(v) is int and 0 <= v < 2**64 for v in numbers.values())
    )
    hello = verdict(lambda: protocol.parse_hello(body), valid, f"parse_hello of {body!r}")
    if hello is not None:
        assert hello == Hello(tenant, token, client[:256], **numbers), hello


@target
def target_hello(src: Source) -> None:
    """parse_hello: a Hello exactly when the map is a valid hello (protocol the current int,
    tenant of 1..64 bytes, token None or a string, client a string, l1_bytes, remote_probe and
    remote_token ints in [0, 2**64) when present), else ProtocolError; nothing else."""
    check_hello(wire_body(src, VALID_HELLO))


WELCOME_FIELDS = list(Welcome.__dataclass_fields__)


def check_welcome(body: dict[str, Any]) -> None:
    if body.get("ok") is not True:
        try:
            protocol.parse_welcome(body)
        except HandshakeRefused:
            return
        raise AssertionError(f"parse_welcome of {body!r}: accepted, though not ok")
    valid = all(type(body.get(f)) is int and body[f] >= 0 for f in WELCOME_FIELDS)
    welcome = verdict(lambda: protocol.parse_welcome(body), valid, f"parse_welcome of {body!r}")
    if welcome is not None:
        assert welcome == Welcome(**{f: body[f] for f in WELCOME_FIELDS}), welcome
        assert all(type(getattr(welcome, f)) is int for f in WELCOME_FIELDS), welcome


@target
def target_welcome(src: Source) -> None:
    """parse_welcome (the plugin's side): HandshakeRefused when the map does not say ok; else a
    Welcome exactly when every field is an int (not a bool, a float or a string) >= 0, else
    ProtocolError; nothing else."""
    check_welcome(wire_body(src, VALID_WELCOME))


# Keys ------------------------------------------------------------------------------------------


def key_like(src: Source) -> Any:
    way = src.integer(0, 4)
    if way == 0:
        return name_text(src, [1, 2, KEY_BYTES_MAX - 1, KEY_BYTES_MAX, KEY_BYTES_MAX + 1])
    if way == 1:
        return ""
    if way == 2:
        return wire_value(src)
    return src.text(20) or "k"


def draw_keys(src: Source) -> tuple[bytes, int]:
    """A request's key payload and the count_max to parse it with."""
    count_max = pick(src, [KEYS_PER_REQUEST_MAX, KEYS_PER_REQUEST_MAX, 0, 1, 2, 3, 8])
    way = src.integer(0, 4)
    if way == 0:
        return src.binary(200), count_max
    if way == 1:
        return pack([key_like(src) for _ in range(src.integer(0, 6))]), count_max
    if way == 2:
        return pack(wire_value(src)), count_max
    if way == 3:
        keys: list[Any] = ["k"] * max(0, count_max + src.integer(-1, 1))
        if keys and src.boolean():
            keys[src.integer(0, len(keys) - 1)] = key_like(src)
        return pack(keys), count_max
    payload = bytearray(pack([key_like(src) for _ in range(src.integer(1, 4))]))
    mangle = src.integer(0, 2)
    at = src.integer(0, len(payload) - 1)
    if mangle == 0:
        del payload[at:]
    elif mangle == 1:
        payload.insert(at, src.integer(0, U8))
    else:
        payload[at] = src.integer(0, U8)
    return bytes(payload), count_max


def reference_keys(payload: bytes, count_max: int) -> list[str] | None:
    """What decode_keys must return: the key list if valid, else None."""
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception:
        return None
    if not isinstance(value, list) or not 0 < len(value) <= count_max:
        return None
    if not all(type(k) is str and 0 < len(k.encode()) <= KEY_BYTES_MAX for k in value):
        return None
    return value


@target
def target_keys(src: Source) -> None:
    """decode_keys: exactly the valid key lists (1..count_max non-empty strings of at most 1 KiB)
    come back, as a list of str; anything else raises ProtocolError; nothing else."""
    payload, count_max = draw_keys(src)
    expected = reference_keys(payload, count_max)
    given: bytes | memoryview = memoryview(payload) if src.boolean() else payload
    keys = verdict(
        lambda: protocol.decode_keys(given, count_max),
        expected is not None,
        f"decode_keys of {payload!r}, at most {count_max}",
    )
    if keys is not None:
        assert type(keys) is list and keys == expected, keys
        assert all(type(k) is str for k in keys), keys


# Rings -----------------------------------------------------------------------------------------


def outside_unchanged(before: bytes, after: bytes, allowed: Sequence[tuple[int, int]]) -> bool:
    """Whether ``after`` equals ``before`` everywhere but the ``allowed`` [start, end) ranges."""
    merged = bytearray(after)
    for start, end in allowed:
        merged[start:end] = before[start:end]
    return bytes(merged) == before


@target
def target_ring(src: Source) -> None:
    """Ring queues on memory a hostile peer scribbles over (its counter, our counter, the
    entries; sometimes before the queue is made): pop_all returns exactly the entries the
    counters publish and push fills exactly one free entry, or they raise ProtocolError (a peer
    counter out of range, or a producer counter at 2**64 - 1, which cannot advance); no other
    exception, and no byte written outside the op's own entry and counter."""
    slots = pick(src, [1, 2, 3, 4, 8, 16])
    layout = RingLayout(slots, 64, PAGE_BYTES)
    memory = memoryview(bytearray(layout.total_bytes))
    words = memory.cast("Q")
    role = src.integer(0, 3)
    make_queue, entry, entries_at, own, peer, consumer = [
        (ring_queue.submission_consumer, SUBMISSION, layout.sq_offset, SQ_HEAD, SQ_TAIL, True),
        (ring_queue.completion_producer, COMPLETION, layout.cq_offset, CQ_TAIL, CQ_HEAD, False),
        (ring_queue.submission_producer, SUBMISSION, layout.sq_offset, SQ_TAIL, SQ_HEAD, False),
        (ring_queue.completion_consumer, COMPLETION, layout.cq_offset, CQ_HEAD, CQ_TAIL, True),
    ][role]
    entries_end = entries_at + slots * entry.size
    if src.integer(0, 3) == 0:  # the peer made the memory: garbage before the queue exists
        words[own // 8] = unsigned(src, U64, [slots])
        words[peer // 8] = unsigned(src, U64, [slots])
        memory[entries_at:entries_end] = filler(src, entries_end - entries_at)
    queue: Any = make_queue(memory, layout)
    index = int(words[own // 8])  # the model's copy of the queue's own counter
    for _ in range(src.integer(1, 6)):
        if src.boolean():
            relative = index + src.integer(-2, slots + 2) * (1 if consumer else -1)
            words[peer // 8] = min(max(relative, 0), U64) if src.boolean() else unsigned(src, U64)
        if src.integer(0, 3) == 0:
            words[own // 8] = unsigned(src, U64)  # the queue must not read this back
        if src.boolean():
            at = src.integer(entries_at, entries_end - 1)
            memory[at:entries_end] = filler(src, entries_end - at)
        if consumer:
            tail = int(words[peer // 8])
            before = bytes(memory)
            try:
                got = queue.pop_all()
            except ProtocolError:
                assert not 0 <= tail - index <= slots, f"pop_all refused a tail {tail} at {index}"
                assert bytes(memory) == before, "pop_all wrote, then refused"
                return
            assert 0 <= tail - index <= slots, f"pop_all took {tail - index} from {slots} slots"
            expected = [  # tuples, which equal the named tuples pop_all makes
                entry.unpack_from(before, entries_at + (i % slots) * entry.size)
                for i in range(index, tail)
            ]
            assert got == expected, f"pop_all returned {got}, the ring holds {expected}"
            index = tail
            assert int(words[own // 8]) == index
            assert outside_unchanged(before, bytes(memory), [(own, own + 8)])
            continue
        for _ in range(src.integer(0, slots + 1)):
            item = tuple(src.integer(0, top) for top in _field_tops(entry))
            head = int(words[peer // 8])
            before = bytes(memory)
            try:
                pushed = queue.push(item)
            except ProtocolError:
                refused = index == U64 or not 0 <= index - head <= slots
                assert refused, f"push refused a head {head} at {index}"
                assert bytes(memory) == before, "push wrote, then refused"
                return
            assert index < U64, "push advanced a counter at 2**64 - 1"
            assert 0 <= index - head <= slots, f"push accepted a head {head} at {index}"
            assert pushed == (index - head < slots), (pushed, index, head)
            if not pushed:
                assert bytes(memory) == before
                continue
            at = entries_at + (index % slots) * entry.size
            assert bytes(memory[at : at + entry.size]) == entry.pack(*item)
            index += 1
            assert int(words[own // 8]) == index
            assert outside_unchanged(before, bytes(memory), [(own, own + 8), (at, at + entry.size)])


def _field_tops(entry: struct.Struct) -> list[int]:
    """The largest value of each field of a ring entry."""
    codes = entry.format.strip("<").replace("16x", "")
    return [{"Q": U64, "I": U32, "H": U16, "B": U8}[c] for c in codes]


# Sessions --------------------------------------------------------------------------------------

SESSION_LAYOUT = RingLayout(slots=4, arena_bytes=PAGE_BYTES, window_bytes=8 * PAGE_BYTES)
STORE_REGION_BYTES = 16 * PAGE_BYTES
STORE_FRAGMENT_BYTES = 4 * PAGE_BYTES
FAR = 2**62  # a deadline that never passes
REFUSED, ANSWERED, QUEUED = "refused", "answered", "queued"


def small_store(device: MemoryDevice, fragment_bytes: int = STORE_FRAGMENT_BYTES) -> ObjectStore:
    """An object store over a software card of small regions on ``device``; not recovered."""
    holder: list[SoftwareCard] = []
    region_log = RegionLog(
        [device], STORE_REGION_BYTES, lambda *region: holder[0].on_reclaim(*region)
    )
    catalog = ObjectCatalog(NO_HOLDINGS)
    card = SoftwareCard(region_log, fragment_bytes, sync=True, holdings=catalog)
    holder.append(card)
    return ObjectStore(card, catalog)


def page_buffer(data: bytes) -> memoryview:
    """A page-aligned buffer holding ``data``, padded to 4 KiB (as the transfer window is)."""
    buf = memoryview(mmap.mmap(-1, align_up(max(len(data), 1))))
    buf[: len(data)] = data
    return buf


class Client:
    """One session of the gateway, and the plugin's view of its shared memory."""

    def __init__(
        self, session_id: int, tenant: str, store: ObjectStore, scheduler: Scheduler
    ) -> None:
        ours, self._theirs = socket.socketpair()
        self.session = Session(
            session_id,
            ours,
            tenant,
            "fuzz",
            SESSION_LAYOUT,
            store,
            scheduler,
            lambda s: None,
            Metrics(),
        )
        _, fds = self.session.welcome()
        memfd = os.dup(fds[0])
        try:
            self.memory = memoryview(map_shared(memfd, SESSION_LAYOUT))
        finally:
            os.close(memfd)  # the session's own copy of the memfd is closed with it
        self.window = SESSION_LAYOUT.window(self.memory)
        self.submissions = ring_queue.submission_producer(self.memory, SESSION_LAYOUT)
        self.completions = ring_queue.completion_consumer(self.memory, SESSION_LAYOUT)
        self.dropped = False

    def step(self) -> None:
        """What Session.run does when the doorbell rings: a protocol error drops the session."""
        if self.dropped:
            return
        try:
            for submission in self.session._submissions.pop_all():
                self.session.dispatch([submission])
        except ProtocolError:
            self.dropped = True
            self.session.close()

    def submit(self, submission: Submission, payload: bytes) -> None:
        arena = SESSION_LAYOUT.arena(self.memory, submission.slot)
        arena[: len(payload)] = payload
        assert self.submissions.push(submission)

    def close(self) -> None:
        self.session.close()
        self._theirs.close()


def drain(scheduler: Scheduler) -> None:
    """Run every queued task, as the I/O threads would (an exception here is a bug), each
    reported finished afterwards, as they do."""
    while (task := scheduler.next(timeout_s=0)) is not None:
        try:
            task.run()
        finally:
            scheduler.finished(task)


def draw_descriptor(src: Source, busy: Sequence[int] = ()) -> tuple[Submission, bytes]:
    """A submission and the key payload for its arena: each field valid unless drawn odd (1 in
    6), then near what the checks compare against; often on a ``busy`` slot (one in flight)."""
    slots, window = SESSION_LAYOUT.slots, SESSION_LAYOUT.window_bytes
    arena_bytes = SESSION_LAYOUT.arena_bytes

    def odd() -> bool:
        return src.integer(0, 5) == 0

    op = pick(src, [0, 5, U8]) if odd() else pick(src, list(Op))
    slot = pick(src, [slots, slots + 1, U32]) if odd() else src.integer(0, slots - 1)
    if busy and src.integer(0, 3) == 0:
        slot = pick(src, busy)
    if odd():
        payload = draw_keys(src)[0]
    elif src.boolean():
        payload = encode_keys([name_text(src, [1, 8, KEY_BYTES_MAX])])
    else:
        payload = encode_keys([f"k{src.integer(0, 3)}" for _ in range(src.integer(1, 3))])
    request_bytes = pick(src, [0, arena_bytes, arena_bytes + 1, U32]) if odd() else len(payload)
    if odd():
        data_offset = unsigned(src, U64, [window, PAGE_BYTES, 100])
        data_bytes = unsigned(src, U64, [window, PAGE_BYTES])
    else:
        data_offset = src.integer(0, window // PAGE_BYTES - 1) * PAGE_BYTES
        data_bytes = src.integer(0, window - data_offset)
    deadline = pick(src, [0, 1]) if odd() else pick(src, [FAR, U64])
    submission = Submission(
        src.integer(0, U64),
        op,
        pick(src, [FLAG_L1, 2, U8]) if odd() else 0,
        0,
        slot,
        request_bytes,
        0,
        deadline,
        data_offset,
        data_bytes,
    )
    return submission, payload


def expect(submission: Submission, request: bytes, in_flight: set[int], now: int) -> str:
    """What Session.dispatch must do with ``submission``: refuse it (ProtocolError), answer it
    at once (EXISTS, or EXPIRED), or queue it for an I/O thread."""
    layout = SESSION_LAYOUT
    if submission.op not in (1, 2, 3, 4) or submission.slot >= layout.slots:
        return REFUSED
    if submission.flags & ~FLAG_L1 or (submission.flags and submission.op != Op.SET):
        return REFUSED
    if submission.request_bytes > layout.arena_bytes or submission.slot in in_flight:
        return REFUSED
    keys = reference_keys(request, KEYS_PER_REQUEST_MAX)
    if keys is None:
        return REFUSED
    if now > submission.deadline_ns or submission.op == Op.EXISTS:
        return ANSWERED
    if submission.op == Op.DELETE:
        return QUEUED
    end = submission.data_offset + align_up(submission.data_bytes)
    if len(keys) != 1 or submission.flags:  # FLAG_L1: this session has no L1 segment
        return REFUSED
    if submission.data_offset % PAGE_BYTES or end > layout.window_bytes:
        return REFUSED
    return QUEUED


@target
def target_session(src: Source) -> None:
    """Session.dispatch of fuzzed descriptors, one after another: it refuses (ProtocolError)
    exactly what the checks forbid (unknown op, unknown flags or flags on an op but a store,
    slot out of range, request over its arena, slot reused while in flight, bad keys, a data op's
    window range unaligned or outside the window, a data op without exactly one key, a zero-copy
    store on a session without an L1 segment), answers EXISTS and expired ops at once, queues the
    rest; queued ops run and complete; nothing raises anything else."""
    store = small_store(MemoryDevice(PAGE_BYTES + 4 * STORE_REGION_BYTES))
    store.recover()
    scheduler = Scheduler(10**9)
    client = Client(1, "t", store, scheduler)
    queued: dict[int, tuple[Submission, list[str]]] = {}  # slot -> op queued
    try:
        for _ in range(src.integer(1, 8)):
            if queued and src.integer(0, 3) == 0:
                drain(scheduler)
                done = client.completions.pop_all()
                assert sorted((c.slot, c.op_id) for c in done) == sorted(
                    (s.slot, s.op_id) for s, _ in queued.values()
                ), (done, queued)
                for completion in done:
                    submission, op_keys = queued[completion.slot]
                    allowed = {Status.OK, Status.MISS} if submission.op == Op.GET else {Status.OK}
                    assert completion.status in allowed, (submission, completion)
                    if submission.op == Op.DELETE:
                        assert completion.result_bytes == len(op_keys), completion
                queued.clear()
                continue
            submission, payload = draw_descriptor(src, sorted(queued))
            request = b""
            if submission.slot < SESSION_LAYOUT.slots:
                arena = SESSION_LAYOUT.arena(client.memory, submission.slot)
                arena[: len(payload)] = payload[: len(arena)]
                request = bytes(arena[: submission.request_bytes])
            outcome = expect(submission, request, set(queued), time.monotonic_ns())
            try:
                client.session.dispatch([submission])
            except ProtocolError as exc:
                assert outcome == REFUSED, f"{submission} refused ({exc}), expected {outcome}"
                return
            assert outcome != REFUSED, f"{submission} with {request!r} was not refused"
            done = client.completions.pop_all()
            if outcome == QUEUED:
                assert done == [], done
                keys = reference_keys(request, KEYS_PER_REQUEST_MAX)
                assert keys is not None
                queued[submission.slot] = (submission, keys)
            else:
                assert [(c.op_id, c.slot) for c in done] == [(submission.op_id, submission.slot)]
                if done[0].status == Status.OK:
                    keys = reference_keys(request, KEYS_PER_REQUEST_MAX)
                    assert submission.op == Op.EXISTS and keys is not None
                    assert done[0].result_bytes == len(keys), done
                else:
                    assert done[0].status == Status.EXPIRED, done
    finally:
        client.close()
        store.close()


def scribble(client: Client, src: Source) -> None:
    """A hostile client writes garbage into its submission ring and arenas, rings the bell."""
    layout = SESSION_LAYOUT
    memory, words = client.memory, client.memory.cast("Q")
    head = int(words[SQ_HEAD // 8])
    way = src.integer(0, 2)
    if way == 0:
        count = layout.slots * SUBMISSION.size
        memory[layout.sq_offset : layout.sq_offset + count] = filler(src, count)
        slot = src.integer(0, layout.slots - 1)
        layout.arena(memory, slot)[:64] = filler(src, 64)
        tail = head + src.integer(0, layout.slots + 2)
    elif way == 1:
        tail = head
        for _ in range(src.integer(1, layout.slots)):
            submission, payload = draw_descriptor(src)
            if submission.slot < layout.slots:
                arena = layout.arena(memory, submission.slot)
                arena[: len(payload)] = payload[: len(arena)]
            at = layout.sq_offset + (tail % layout.slots) * SUBMISSION.size
            SUBMISSION.pack_into(memory, at, *submission)
            tail += 1
    else:
        tail = unsigned(src, U64, [head + layout.slots])
    words[SQ_TAIL // 8] = min(tail, U64)
    client.step()


@target
def target_isolation(src: Source) -> None:
    """Two sessions on one store and scheduler: whatever session A writes into its ring (and
    whether A is dropped for it), session B's stores and loads complete, in order, with B's
    bytes, and B stays connected."""
    # Room for every store the hostile session could make (48 at most, one region each), so
    # no object of B's can be evicted.
    store = small_store(MemoryDevice(PAGE_BYTES + 64 * STORE_REGION_BYTES))
    store.recover()
    scheduler = Scheduler(10**9)
    hostile, good = Client(1, "a", store, scheduler), Client(2, "b", store, scheduler)
    try:
        for n in range(src.integer(1, 3)):
            size = pick(src, [0, 1, PAGE_BYTES, 3 * PAGE_BYTES + 5, SESSION_LAYOUT.window_bytes])
            data = random.Random(n).randbytes(size)
            key = encode_keys([f"k{n}"])
            for op in (Op.SET, Op.GET):
                good.window[:] = bytes(len(good.window))
                if op == Op.SET:
                    good.window[:size] = data
                submission = Submission(10 * n + op, op, 0, 0, op % 2, len(key), 0, FAR, 0, size)
                good.submit(submission, key)
                good.step()
                for _ in range(src.integer(1, 2)):
                    scribble(hostile, src)
                drain(scheduler)
                done = good.completions.pop_all()
                assert [(c.op_id, c.status) for c in done] == [(submission.op_id, Status.OK)], (
                    f"session B's {op.name} of {size} bytes: {done}"
                )
                if op == Op.GET:
                    assert bytes(good.window[:size]) == data, "session B loaded other bytes"
        assert not good.dropped and not good.session._closed
        assert store.statistics().reclaims == 0  # so no object of B's could be evicted
    finally:
        hostile.close()
        good.close()
        store.close()


# Records on disk -------------------------------------------------------------------------------


def raw_header(src: Source, seed: int, epoch: int | None = None, top: int = U64) -> bytearray:
    """A record header page with every field drawn, not only values pack_header writes: each
    field is valid unless drawn odd (1 in 8), and the salted checksum mostly holds, so each check
    behind the checksum is reached, alone or with others."""

    def odd() -> bool:
        return src.integer(0, 7) == 0

    tenant = pick(src, ["t", "u", ""]) if src.boolean() else src.text(8)
    key = pick(src, ["a", "b", "c"]) if src.boolean() else name_text(src, [0, 1, 1024, 4000])
    names = src.binary(40) if odd() else tenant.encode() + key.encode()
    tenant_bytes = unsigned(src, U16) if odd() else len(tenant.encode())
    key_bytes = unsigned(src, U16, [NAME_BYTES_MAX]) if odd() else len(key.encode())
    object_bytes = unsigned(src, top, [PAGE_BYTES])
    if odd():
        fragment_offset = unsigned(src, top, [object_bytes])
        fragment_bytes = unsigned(src, U32, [object_bytes, PAGE_BYTES])
    else:
        fragment_bytes = src.integer(0, min(object_bytes, U32))
        fragment_offset = src.integer(0, object_bytes - fragment_bytes)
    if odd():
        fragment_index, fragment_count = unsigned(src, U16, [1]), unsigned(src, U16, [1])
    else:
        fragment_count = src.integer(1, 4)
        fragment_index = src.integer(0, fragment_count - 1)
    page = bytearray(HEADER_BYTES)
    HEADER_FIELDS.pack_into(
        page,
        0,
        src.binary(8).ljust(8, b"\0") if odd() else RECORD_MAGIC,
        pick(src, [0, 2, U16]) if odd() else 1,
        pick(src, [0, 4, U8]) if odd() else pick(src, list(Kind)),
        src.integer(0, U8),
        src.integer(0, U32) if odd() else 0,
        epoch if epoch is not None and not odd() else unsigned(src, top),
        unsigned(src, top),
        src.integer(0, U64) if odd() else key_hash(tenant, key),
        object_bytes,
        fragment_offset,
        fragment_bytes,
        fragment_index,
        fragment_count,
        src.integer(0, U64),
        tenant_bytes,
        key_bytes,
    )
    names = names[: CHECKSUM_AT - HEADER_FIELDS.size]
    page[HEADER_FIELDS.size : HEADER_FIELDS.size + len(names)] = names
    salted = src.integer(0, U64) if odd() else checksum(bytes(page[:CHECKSUM_AT]), seed)
    struct.pack_into("<Q", page, CHECKSUM_AT, salted)
    return page


def draw_header(src: Source) -> tuple[bytes, int]:
    seed = pick(src, [0, 0x5EED]) if src.boolean() else src.integer(0, U64)
    way = src.integer(0, 3)
    if way == 0:
        return filler(src, pick(src, [HEADER_BYTES, HEADER_BYTES - 1, 0, 8, 5000])), seed
    if way == 3:  # a header pack_header made, then damaged (and maybe checksummed again)
        page = bytearray(HEADER_BYTES)
        header = RecordHeader(
            pick(src, list(Kind)),
            src.integer(0, U64),
            name_text(src, [0, 1, 64]),
            name_text(src, [0, 1, 1024]),
            src.integer(0, 2**40),
            fragment_index=src.integer(0, 3),
            fragment_count=src.integer(4, 8),
        )
        pack_header(header, memoryview(page), seed)
        page[src.integer(0, CHECKSUM_AT - 1)] ^= 1 << src.integer(0, 7)
        if src.boolean():
            struct.pack_into("<Q", page, CHECKSUM_AT, checksum(bytes(page[:CHECKSUM_AT]), seed))
    else:
        page = raw_header(src, seed)
    if src.boolean():
        page += filler(src, src.integer(1, 100))  # bytes past the header: never looked at
    return bytes(page), seed


@target
def target_header(src: Source) -> None:
    """unpack_header: None, or a RecordHeader that is internally consistent (known kind, names
    fit, fragment index below count, a data fragment inside its object, key hash matches), whose
    checksum held, that round-trips through pack_header, and that ignores bytes past 4 KiB."""
    buf, seed = draw_header(src)
    view = memoryview(buf)
    header = record_format.unpack_header(view if src.boolean() else buf, seed)
    if len(buf) >= HEADER_BYTES:
        assert header == record_format.unpack_header(buf[:HEADER_BYTES], seed), "read past 4 KiB"
    if header is None:
        return
    assert isinstance(header, RecordHeader) and isinstance(header.kind, Kind)
    (stored,) = struct.unpack_from("<Q", buf, CHECKSUM_AT)
    assert stored == checksum(buf[:CHECKSUM_AT], seed), "accepted a header whose checksum fails"
    names = len(header.tenant.encode()) + len(header.key.encode())
    assert names <= NAME_BYTES_MAX, f"names of {names} bytes: {header}"
    assert header.fragment_index < max(header.fragment_count, 1), f"fragment index: {header}"
    if header.kind == Kind.DATA:
        end = header.fragment_offset + header.fragment_bytes
        assert end <= header.object_bytes, f"fragment outside its object: {header}"
    assert key_hash(header.tenant, header.key) == HEADER_FIELDS.unpack_from(buf)[7], header
    page = memoryview(bytearray(HEADER_BYTES))
    pack_header(header, page, seed)
    assert unpack_header(page, seed) == header


def draw_superblock(src: Source) -> bytes:
    way = src.integer(0, 2)
    if way == 0:
        return filler(src, pick(src, [HEADER_BYTES, HEADER_BYTES + 10, HEADER_BYTES - 1, 0, 100]))
    page = bytearray(HEADER_BYTES)
    if way == 1:
        pack_superblock(
            Superblock(src.integer(0, U16), unsigned(src, U64), src.integer(0, U64)),
            memoryview(page),
        )
        page[src.integer(0, HEADER_BYTES - 1)] ^= 1 << src.integer(0, 7)
    else:
        SUPERBLOCK_FIELDS.pack_into(
            page,
            0,
            SUPERBLOCK_MAGIC if src.integer(0, 9) else src.binary(8).ljust(8, b"\0"),
            pick(
                src,
                [FORMAT_VERSION, FORMAT_VERSION, 0, FORMAT_VERSION - 1, FORMAT_VERSION + 1, U16],
            ),
            src.integer(0, U16),
            src.integer(0, U32),
            unsigned(src, U64),
            src.integer(0, U64),
        )
        page[SUPERBLOCK_FIELDS.size : CHECKSUM_AT] = filler(src, 40).ljust(
            CHECKSUM_AT - SUPERBLOCK_FIELDS.size, b"\0"
        )
    if src.integer(0, 4):
        struct.pack_into("<Q", page, CHECKSUM_AT, checksum(bytes(page[:CHECKSUM_AT])))
    return bytes(page)


@target
def target_superblock(src: Source) -> None:
    """unpack_superblock: None (for a buffer shorter than its 4 KiB page too), or the Superblock
    of a page with the magic, FORMAT_VERSION and a checksum that holds; it round-trips and ignores
    bytes past its page."""
    buf = draw_superblock(src)
    found = record_format.unpack_superblock(memoryview(buf))
    assert found == record_format.unpack_superblock(buf[:HEADER_BYTES]), "read past 4 KiB"
    if found is None:
        return
    magic, version, *_ = SUPERBLOCK_FIELDS.unpack_from(buf)
    (stored,) = struct.unpack_from("<Q", buf, CHECKSUM_AT)
    assert magic == SUPERBLOCK_MAGIC and version == FORMAT_VERSION, (
        f"accepted {magic!r} version {version}"
    )
    assert stored == checksum(buf[:CHECKSUM_AT]), "accepted a superblock whose checksum fails"
    page = memoryview(bytearray(HEADER_BYTES))
    pack_superblock(found, page)
    assert record_format.unpack_superblock(page) == found


def draw_trailer(src: Source) -> tuple[bytes, int]:
    seed = src.integer(0, U64)
    way = src.integer(0, 1)
    if way == 0:
        return filler(
            src, pick(src, [TRAILER_BYTES, TRAILER_BYTES - 1, 0, TRAILER_BYTES + 9])
        ), seed
    page = bytearray(TRAILER_BYTES)
    TRAILER_FIELDS.pack_into(
        page,
        0,
        TRAILER_MAGIC if src.integer(0, 9) else src.binary(8).ljust(8, b"\0"),
        pick(src, [1, 1, 0, 2, U16]),
        src.integer(0, U16),
        unsigned(src, U32),
        unsigned(src, U64),
        unsigned(src, U64, [PAGE_BYTES]),
        unsigned(src, U64),
        src.integer(0, U64),
    )
    if src.integer(0, 7):
        struct.pack_into("<Q", page, CHECKSUM_AT, checksum(bytes(page[:CHECKSUM_AT]), seed))
    return bytes(page), seed


@target
def target_trailer(src: Source) -> None:
    """unpack_trailer: None, or the Trailer of a page with the magic, version 1 and a salted
    checksum that holds; it round-trips and ignores bytes past its page."""
    buf, seed = draw_trailer(src)
    found = footer_module.unpack_trailer(memoryview(buf), seed)
    if len(buf) >= TRAILER_BYTES:
        assert found == footer_module.unpack_trailer(memoryview(buf[:TRAILER_BYTES]), seed)
    if found is None:
        return
    magic, version, *_ = TRAILER_FIELDS.unpack_from(buf)
    (stored,) = struct.unpack_from("<Q", buf, CHECKSUM_AT)
    assert magic == TRAILER_MAGIC and version == 1, f"accepted {magic!r} version {version}"
    assert stored == checksum(buf[:CHECKSUM_AT], seed), "accepted a trailer whose checksum fails"
    page = memoryview(bytearray(TRAILER_BYTES))
    pack_trailer(found, page, seed)
    assert footer_module.unpack_trailer(page, seed) == found


def footer_row(src: Source) -> Any:
    way = src.integer(0, 6)
    if way == 0:  # a row as pack_footer writes it
        return [src.integer(0, 2**20), 1, src.integer(0, U64), "t", "k", 10, 0, 10, 0, 1, 7]
    if way == 1:
        return [wire_value(src, 0) for _ in range(ROW_FIELDS)]
    if way == 2:
        return [wire_value(src, 0) for _ in range(src.integer(0, ROW_FIELDS + 1))]
    if way == 3:  # sized like a row but not a row
        return pick(src, ["k" * ROW_FIELDS, b"k" * ROW_FIELDS, {str(i): i for i in range(11)}])
    return wire_value(src)


def draw_footer(src: Source) -> tuple[bytes, int, bool]:
    """A footer blob, the trailer's entry count, and whether its salted checksum holds."""
    way = src.integer(0, 3)
    rows: list[Any] = []
    if way == 0:
        blob = src.binary(300)
    elif way == 1:
        rows = [footer_row(src) for _ in range(src.integer(0, 5))]
        blob = pack(rows)
    elif way == 2:
        blob = pack(wire_value(src))
    else:
        header = RecordHeader(Kind.DATA, src.integer(0, U64), "t", "k", 10, 0, 10)
        damaged = bytearray(pack_footer([(PAGE_BYTES * i, header) for i in range(3)]))
        damaged[src.integer(0, len(damaged) - 1)] = src.integer(0, U8)
        blob = bytes(damaged)
        rows = [None] * 3
    entries = len(rows) if src.integer(0, 3) else unsigned(src, U32)
    return blob, entries, src.integer(0, 7) != 0


@target
def target_footer(src: Source) -> None:
    """unpack_footer of a blob whose salted checksum holds (it is then trusted, so only its
    shape is checked): None, or a list of ``entries`` tuples of 11 fields (not strings, bytes
    or maps of 11); it never raises. With a checksum that fails: None."""
    blob, entries, intact = draw_footer(src)
    seed = src.integer(0, U64)
    held = checksum(blob, seed)
    trailer = Trailer(entries, 1, 0, len(blob), held if intact else held ^ 1)
    rows = footer_module.unpack_footer(memoryview(blob), trailer, seed)
    if rows is None:
        return
    assert intact, "accepted a footer whose checksum fails"
    assert isinstance(rows, list), rows
    assert len(rows) == entries, f"{len(rows)} footer rows, the trailer says {entries}"
    for row in rows:
        assert type(row) is tuple and len(row) == ROW_FIELDS, f"footer row {row!r}"


# Regions and recovery --------------------------------------------------------------------------

DISK_REGION_BYTES = STORE_REGION_BYTES
DISK_REGIONS = 3
DISK_FRAGMENT_BYTES = 2 * PAGE_BYTES
COUNTER_TOP = 2**48  # epochs and seqs of forged headers: the gateway's own never get near 2**64


@dataclass
class Disk:
    image: bytearray
    salt: int
    epochs: list[int]  # each region's intended epoch (its first page may say otherwise)

    def device(self) -> MemoryDevice:
        device = MemoryDevice(len(self.image))
        device.write([memoryview(self.image)], 0)
        return device


def contents(device: MemoryDevice) -> bytes:
    """Every byte on ``device``, as it is now."""
    data = memoryview(bytearray(device.size_bytes))
    device.read([data], 0)
    return bytes(data)


def region_start(region: int) -> int:
    return PAGE_BYTES + region * DISK_REGION_BYTES


def genuine_records(src: Source) -> list[tuple[RecordHeader, bytes]]:
    """Records as the gateway writes them: fragments of small objects with their payloads,
    and tombstones, in a drawn order."""
    records: list[tuple[RecordHeader, bytes]] = []
    for _ in range(src.integer(1, 4)):
        tenant, key = pick(src, ["t", "u"]), pick(src, ["a", "b", "c"])
        size = pick(src, [0, 1, PAGE_BYTES - 1, PAGE_BYTES, 2 * PAGE_BYTES + 1, 5 * PAGE_BYTES + 3])
        seq = src.integer(1, 40)
        data = random.Random(src.integer(0, U32)).randbytes(size)
        plan = fragmenter.plan(size, DISK_FRAGMENT_BYTES, 1, key_hash(tenant, key))
        for f in plan:
            payload = data[f.offset : f.offset + f.length]
            fragment = (f.offset, f.length, f.number, len(plan), checksum(payload))
            records.append((RecordHeader(Kind.DATA, seq, tenant, key, size, *fragment), payload))
    for _ in range(src.integer(0, 2)):
        tombstone = RecordHeader(
            Kind.TOMBSTONE, src.integer(1, 40), pick(src, ["t", "u"]), pick(src, ["a", "b"]), 0
        )
        records.append((tombstone, b""))
    for i in range(len(records) - 1):
        j = src.integer(i, len(records) - 1)
        records[i], records[j] = records[j], records[i]
    return records


def header_page(header: RecordHeader, salt: int) -> bytes:
    page = memoryview(bytearray(HEADER_BYTES))
    pack_header(header, page, salt)
    return bytes(page)


def fill_region(
    src: Source, region: memoryview, salt: int, epoch: int, pool: list[tuple[RecordHeader, bytes]]
) -> None:
    """Lay pages into one region as the region log does: a first record giving the epoch, then
    records one after another (here mixed with garbage), a footer and trailer at the end."""
    limit = DISK_REGION_BYTES - TRAILER_BYTES
    placed: list[tuple[int, RecordHeader]] = []  # records of this epoch, for the footer
    first = src.integer(0, 7)
    if first == 0:
        return  # a free region: its first page is zeros
    if first == 1:
        region[:PAGE_BYTES] = filler(src, PAGE_BYTES)
    elif first == 2:
        region[:PAGE_BYTES] = raw_header(src, salt, epoch, COUNTER_TOP)
    else:
        region[:PAGE_BYTES] = header_page(
            RecordHeader(Kind.REGION, 0, "", "", 0, epoch=epoch), salt
        )
    offset = PAGE_BYTES
    while offset + PAGE_BYTES <= limit:
        way = src.integer(0, 9)
        if way == 0:
            break
        if way == 1 or (way > 3 and not pool):
            region[offset : offset + PAGE_BYTES] = filler(src, PAGE_BYTES)
        elif way == 2:
            page = RECORD_MAGIC + filler(src, PAGE_BYTES - len(RECORD_MAGIC))
            region[offset : offset + PAGE_BYTES] = page
        elif way == 3:
            region[offset : offset + PAGE_BYTES] = raw_header(src, salt, epoch, COUNTER_TOP)
            offset += PAGE_BYTES * src.integer(0, 2)  # and payload pages left as they were
        else:
            header, payload = pool.pop()
            header_epoch = epoch if src.integer(0, 4) else src.integer(1, COUNTER_TOP)
            header = dataclasses.replace(header, epoch=header_epoch)
            if offset + header.record_bytes > limit:
                if src.integer(0, 1):  # its header anyway: a record running into the trailer
                    region[offset : offset + HEADER_BYTES] = header_page(header, salt)
                break
            region[offset : offset + HEADER_BYTES] = header_page(header, salt)
            region[offset + HEADER_BYTES : offset + HEADER_BYTES + len(payload)] = payload
            if src.integer(0, 3) == 0:  # a bit flipped in its header or payload
                region[src.integer(offset, offset + HEADER_BYTES + len(payload) - 1)] ^= 1 << (
                    src.integer(0, 7)
                )
            if header_epoch == epoch:
                placed.append((offset, header))
            offset += header.record_bytes - PAGE_BYTES
        offset += PAGE_BYTES
    trailer_way = src.integer(0, 4)
    trailer = memoryview(bytearray(TRAILER_BYTES))
    if trailer_way == 1:
        region[limit:] = filler(src, TRAILER_BYTES)
    elif trailer_way == 2 and placed:  # the footer the gateway writes when it seals
        blob = pack_footer(placed)
        if offset + align_up(len(blob)) <= limit:
            region[offset : offset + len(blob)] = blob
            found = Trailer(len(placed), epoch, offset, len(blob), checksum(blob, salt))
            pack_trailer(found, trailer, salt)
            region[limit:] = trailer
    elif trailer_way in (3, 4):  # stale (another epoch), or torn (its footer's checksum fails)
        footer_at = src.integer(0, limit // PAGE_BYTES - 1) * PAGE_BYTES
        stale = Trailer(
            unsigned(src, U32),
            epoch if trailer_way == 4 else src.integer(0, COUNTER_TOP),
            footer_at,
            src.integer(0, limit - footer_at),
            src.integer(0, U64),
        )
        pack_trailer(stale, trailer, salt)
        region[limit:] = trailer


def draw_disk(src: Source) -> Disk:
    """A database whose regions hold random pages, damaged pages, forged-but-salted headers
    with random fields, genuine records (whole, or with a flipped bit), footers and trailers
    (genuine, stale, torn or random), laid out as the region log lays out records."""
    salt = src.integer(0, U64)
    image = bytearray(PAGE_BYTES + DISK_REGIONS * DISK_REGION_BYTES)
    pack_superblock(Superblock(0, DISK_REGION_BYTES, salt), memoryview(image)[:PAGE_BYTES])
    pool = genuine_records(src)
    epochs = []
    for region in range(DISK_REGIONS):
        epoch = region + 1 if src.boolean() else src.integer(1, COUNTER_TOP)
        epochs.append(epoch)
        start = region_start(region)
        fill_region(src, memoryview(image)[start : start + DISK_REGION_BYTES], salt, epoch, pool)
    for _ in range(src.integer(0, 3)):  # bit rot anywhere past the superblock
        image[src.integer(PAGE_BYTES, len(image) - 1)] ^= 1 << src.integer(0, 7)
    return Disk(image, salt, epochs)


def walk_region(
    reader: regionscan.RegionReader, salt: int, epoch: int
) -> tuple[list[tuple[int, RecordHeader]], list[tuple[int, int]]]:
    """The records a walk finds, and its holes: (where each began, where the walk resumed)."""
    holes: list[tuple[int, int]] = []
    records = list(regionscan.walk(reader, salt, epoch, lambda a, b: holes.append((a, b))))
    return records, holes


@target
def target_walk(src: Source) -> None:
    """regionscan.walk over each region, with the region's epoch (as its first header gives
    it, and as intended): only valid headers of that epoch come back, in order, page aligned,
    not overlapping, each record inside the region's record space; a hole is reported as a
    forward jump to a valid header of that epoch."""
    disk = draw_disk(src)
    device = disk.device()
    limit = DISK_REGION_BYTES - TRAILER_BYTES
    for region in range(DISK_REGIONS):
        start = region_start(region)
        reader = regionscan.RegionReader(device, start, DISK_REGION_BYTES)
        first = regionscan.first_header(reader, disk.salt)
        epochs = {disk.epochs[region]} | ({first.epoch} if first is not None else set())
        for epoch in sorted(epochs):
            records, holes = walk_region(reader, disk.salt, epoch)
            end = 0
            for offset, header in records:
                assert offset % PAGE_BYTES == 0 and offset >= end, (offset, end)
                assert header.epoch == epoch, f"a record of epoch {header.epoch}, not {epoch}"
                assert offset + header.record_bytes <= limit, f"past the region: {header}"
                page = bytes(disk.image[start + offset : start + offset + HEADER_BYTES])
                assert header == unpack_header(page, disk.salt)
                end = offset + header.record_bytes
            for at, resumed in holes:
                assert at < resumed <= limit - HEADER_BYTES and resumed % PAGE_BYTES == 0
                page = bytes(disk.image[start + resumed : start + resumed + HEADER_BYTES])
                found = unpack_header(page, disk.salt)
                assert found is not None and found.epoch == epoch, (at, resumed, found)


def verify_hit(
    data: bytes, salt: int, object_id: tuple[str, str], manifest: Manifest, buf: memoryview
) -> None:
    """A load reported as verified: check it against the raw device, fragment by fragment. Every
    failure says "a bad hit" (what the recovery plant must lead to, whichever check sees it)."""
    covered = 0
    for index, location in enumerate(manifest.locations):
        header = unpack_header(data[location.offset : location.offset + HEADER_BYTES], salt)
        offset = index * manifest.fragment_bytes
        length = min(manifest.fragment_bytes, manifest.object_bytes - offset)
        why = f"a bad hit: {object_id} fragment {index} at {location}, header {header}"
        assert header is not None and header.kind == Kind.DATA, why
        assert (header.tenant, header.key, header.seq) == (*object_id, manifest.seq), why
        assert header.epoch == location.epoch, why
        assert (header.fragment_index, header.fragment_offset, header.fragment_bytes) == (
            index,
            offset,
            length,
        ), f"{why}, manifest {manifest}"
        at = location.offset + HEADER_BYTES
        payload = data[at : at + length]
        assert checksum(payload) == header.payload_checksum, f"{why}: a bad payload loaded"
        assert bytes(buf[offset : offset + length]) == payload, f"{why}: other bytes loaded"
        covered = offset + length
    assert covered == manifest.object_bytes, f"a bad hit: {object_id}: {manifest} unread bytes"


@target
def target_recovery(src: Source) -> None:
    """The recovery of a store over a software card on such a device does not raise; every value
    the card finds exists, and a get of it either misses or returns bytes the raw device confirms
    (headers naming it, payloads matching their checksums, covering the whole value; records of
    the older layout, one object's fragments, included); the store then stores and loads a new
    object."""
    disk = draw_disk(src)
    device = disk.device()
    store = small_store(device, DISK_FRAGMENT_BYTES)
    card = store.card
    assert isinstance(card, SoftwareCard)
    try:
        store.recover()
        recovered = list(card.index._objects.items())
        for (namespace, name), _ in recovered:
            assert card.exists(namespace, [name]) == [True], (namespace, name)
        for value_id, manifest in recovered:
            if card.index.get(value_id) is not manifest or manifest.object_bytes > 2**20:
                continue  # evicted meanwhile (a miss appends a tombstone, which may reclaim)
            buf = page_buffer(bytes(manifest.object_bytes))
            wanted = Wanted(value_id[1], buf, manifest.object_bytes)
            if card.get(value_id[0], [wanted]) == [True]:
                verify_hit(contents(device), disk.salt, value_id, manifest, buf)
        size = pick(src, [0, 1, PAGE_BYTES, 3 * PAGE_BYTES + 1])
        data = random.Random(size).randbytes(size)
        store.put("fresh", "k", page_buffer(data), size)
        out = page_buffer(bytes(size))
        assert store.get("fresh", "k", out, size), "a store after the recovery did not load"
        assert bytes(out[:size]) == data
    finally:
        store.close()


TARGET_NAMES = list(TARGETS)


# Planted bugs: each property must fail with its bug planted ------------------------------------

Patch = Callable[[object, str, object], None]  # setattr, or pytest's monkeypatch.setattr


@dataclass(frozen=True)
class Plant:
    """A bug to plant in one target's parser, and what its property then raises (under
    test_properties.py's driver, which reports a hang as an AssertionError)."""

    apply: Callable[[Patch], None]
    caught_as: type[BaseException]
    match: str  # a regular expression searched in the exception's message


PLANTS: dict[str, Plant] = {}  # target name -> its planted bug


def plants(name: str, caught_as: type[BaseException], match: str) -> Callable[[Any], Any]:
    """Register the decorated function as the bug planted in target ``name``."""

    def register(apply: Callable[[Patch], None]) -> Callable[[Patch], None]:
        PLANTS[name] = Plant(apply, caught_as, match)
        return apply

    return register


@plants("frame", AssertionError, "a hang")
def plant_frame(patch: Patch) -> None:
    """recv_frame's reader forgets that an empty read means EOF: it spins forever."""

    def recv_exact(
        sock: socket.socket, size: int, fds_max: int, fds: list[int], deadline: float | None
    ) -> bytes:
        chunks: list[bytes] = []
        while sum(map(len, chunks)) < size:
            chunks.append(sock.recv(size - sum(map(len, chunks))))
        return b"".join(chunks)

    patch(protocol, "_recv_exact", recv_exact)


@plants("hello", AssertionError, "parse_hello of .* accepted")
def plant_hello(patch: Patch) -> None:
    """parse_hello forgets to check that the token is a string."""
    real = protocol.parse_hello

    def parse_hello(body: dict[str, Any]) -> Hello:
        hello = real({**body, "token": None})
        return dataclasses.replace(hello, token=body.get("token"))

    patch(protocol, "parse_hello", parse_hello)


@plants("welcome", AssertionError, "parse_welcome of .* accepted")
def plant_welcome(patch: Patch) -> None:
    """parse_welcome converts its fields with int(): a float, a bool, a negative number or a
    string of digits passes."""

    def parse_welcome(body: dict[str, Any]) -> Welcome:
        if body.get("ok") is not True:
            raise HandshakeRefused("refused")
        try:
            values = {k: int(body[k]) for k in WELCOME_FIELDS}
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise ProtocolError(f"malformed welcome: {exc}") from exc
        return Welcome(**values)

    patch(protocol, "parse_welcome", parse_welcome)


@plants("keys", ValueError, "Unpack failed")
def plant_keys(patch: Patch) -> None:
    """decode_keys lets msgpack's own exceptions escape instead of raising ProtocolError."""

    def decode_keys(payload: bytes | memoryview, count_max: int) -> list[str]:
        keys = msgpack.unpackb(
            payload, raw=False, max_str_len=KEY_BYTES_MAX, max_array_len=count_max
        )
        if not isinstance(keys, list) or not keys or set(map(type, keys)) != {str} or "" in keys:
            raise ProtocolError("bad keys")
        return keys

    patch(protocol, "decode_keys", decode_keys)


@plants("ring", AssertionError, "pop_all returned")
def plant_ring(patch: Patch) -> None:
    """The queues forget to wrap their index around the ring: reads and writes run past it."""
    patch(
        ring_queue._Queue,
        "_slot_offset",
        lambda self, index: self._entries_offset + index * self._entry.size,
    )


@plants("session", AssertionError, "was not refused")
def plant_session(patch: Patch) -> None:
    """Session._check forgets that a slot may be in flight already."""

    def check(self: Session, submission: Submission) -> Op:
        if submission.op not in Op.__members__.values():
            raise ProtocolError("unknown op")
        if submission.slot >= self._layout.slots:
            raise ProtocolError("slot out of range")
        if submission.request_bytes > self._layout.arena_bytes:
            raise ProtocolError("request overflows its arena")
        self._inflight[submission.slot] = 0.0, 1
        return Op(submission.op)

    patch(Session, "_check", check)


@plants("isolation", AssertionError, "session B's")
def plant_isolation(patch: Patch) -> None:
    """The scheduler drops every session's tasks when one session goes away."""

    def drop_session(self: Scheduler, session_id: int) -> list[Any]:
        with self._ready:
            dropped = [task for queues in self._queues for q in queues.values() for task in q]
            for queues in self._queues:
                queues.clear()
            self._release(dropped)
            return dropped

    patch(Scheduler, "drop_session", drop_session)


@plants("header", AssertionError, "fragment index")
def plant_header(patch: Patch) -> None:
    """unpack_header forgets to check the fragment index against the fragment count."""
    real = record_format.unpack_header

    def unpack(buf: bytes | memoryview, seed: int) -> RecordHeader | None:
        if len(buf) < HEADER_BYTES:
            return real(buf, seed)
        page = bytearray(buf[:HEADER_BYTES])
        fields = list(HEADER_FIELDS.unpack_from(page))
        index, count = fields[11], fields[12]
        if count <= index < U16:
            fields[12] = index + 1
        HEADER_FIELDS.pack_into(page, 0, *fields)
        stored_ok = struct.unpack_from("<Q", buf, CHECKSUM_AT)[0] == checksum(
            buf[:CHECKSUM_AT], seed
        )
        struct.pack_into("<Q", page, CHECKSUM_AT, checksum(bytes(page[:CHECKSUM_AT]), seed))
        found = real(bytes(page), seed) if stored_ok else None
        return dataclasses.replace(found, fragment_count=count) if found else None

    patch(record_format, "unpack_header", unpack)


@plants("superblock", AssertionError, "accepted b'ADPDBSB1' version")
def plant_superblock(patch: Patch) -> None:
    """unpack_superblock forgets the version check."""
    real = record_format.unpack_superblock

    def unpack(buf: bytes | memoryview) -> Superblock | None:
        if len(buf) < HEADER_BYTES:
            return real(buf)
        page = bytearray(buf[:HEADER_BYTES])
        struct.pack_into("<H", page, 8, FORMAT_VERSION)
        if struct.unpack_from("<Q", buf, CHECKSUM_AT)[0] == checksum(buf[:CHECKSUM_AT]):
            struct.pack_into("<Q", page, CHECKSUM_AT, checksum(bytes(page[:CHECKSUM_AT])))
        return real(bytes(page))

    patch(record_format, "unpack_superblock", unpack)


@plants("trailer", AssertionError, "accepted b'ADPFOOT1' version 0")
def plant_trailer(patch: Patch) -> None:
    """unpack_trailer skips its checksum when the version field is 0."""
    real = footer_module.unpack_trailer

    def unpack(buf: memoryview, seed: int) -> Trailer | None:
        if len(buf) >= TRAILER_BYTES and bytes(buf[8:10]) == b"\0\0":
            page = bytearray(buf[:TRAILER_BYTES])
            struct.pack_into("<H", page, 8, 1)
            struct.pack_into("<Q", page, CHECKSUM_AT, checksum(bytes(page[:CHECKSUM_AT]), seed))
            return real(memoryview(page), seed)
        return real(buf, seed)

    patch(footer_module, "unpack_trailer", unpack)


@plants("footer", AssertionError, "footer rows, the trailer says")
def plant_footer(patch: Patch) -> None:
    """unpack_footer forgets to compare the row count with the trailer's entries."""
    real = footer_module.unpack_footer

    def unpack(blob: memoryview, trailer: Trailer, seed: int) -> Any:
        try:
            rows = msgpack.unpackb(blob, use_list=False)
        except Exception:
            return None
        if isinstance(rows, tuple):
            trailer = dataclasses.replace(trailer, entries=len(rows))
        return real(blob, trailer, seed)

    patch(footer_module, "unpack_footer", unpack)


@plants("walk", AssertionError, "past the region")
def plant_walk(patch: Patch) -> None:
    """walk forgets the trailer page at the region's end: it believes a header whose record
    runs into it."""
    patch(regionscan, "TRAILER_BYTES", 0)


@plants("recovery", AssertionError, "a bad hit")
def plant_recovery(patch: Patch) -> None:
    """The store skips verifying what it loads."""
    patch(software_card, "intact", lambda *args: True)


# The atheris driver ----------------------------------------------------------------------------


class FuzzedSource:
    """Draws from atheris's FuzzedDataProvider (zeros once its bytes run out)."""

    def __init__(self, provider: Any) -> None:
        self._provider = provider

    def integer(self, lo: int, hi: int) -> int:
        return int(self._provider.ConsumeIntInRange(lo, hi))

    def boolean(self) -> bool:
        return bool(self._provider.ConsumeBool())

    def binary(self, max_size: int) -> bytes:
        return bytes(self._provider.ConsumeBytes(self.integer(0, max_size)))

    def text(self, max_size: int) -> str:
        return str(self._provider.ConsumeUnicodeNoSurrogates(self.integer(0, max_size)))

    def floating(self) -> float:
        return float(self._provider.ConsumeFloat())


def fuzz_one_input(data: bytes) -> None:
    provider = _atheris.FuzzedDataProvider(data)
    name = TARGET_NAMES[provider.ConsumeIntInRange(0, len(TARGET_NAMES) - 1)]
    TARGETS[name](FuzzedSource(provider))


@contextmanager
def _quiet() -> Iterator[None]:
    logging.disable(logging.CRITICAL)  # the gateway logs every dropped session and hole
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


_atheris: Any = None  # the atheris module, imported by main (it only runs under the fuzzer)


# libFuzzer flags the command line may override: inputs up to 4 KiB from the first run (the
# targets draw structure from them, so tiny inputs reach little), and any one input running for
# 30 s is a hang.
DEFAULT_FLAGS = {"-max_len": "4096", "-len_control": "0", "-timeout": "30"}


def instrument(atheris: Any) -> None:
    """Coverage feedback from the gateway and these targets only: ``instrument_all`` would take
    half a minute over the whole interpreter."""
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType):
            module = obj.__module__ or ""
            if module.split(".")[0] in ("adp_gateway", "__main__") or module == __name__:
                atheris.instrument_func(obj)


def main() -> None:
    global _atheris
    import atheris  # type: ignore[import-untyped]  # it ships no type hints

    _atheris = atheris
    os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    planted = os.environ.get("ADP_FUZZ_PLANT")
    if planted:  # show the fuzzer fails: plant one target's bug (test_atheris.py)
        PLANTS[planted].apply(setattr)
    given = {arg.split("=")[0] for arg in sys.argv[1:]}
    flags = [f"{flag}={value}" for flag, value in DEFAULT_FLAGS.items() if flag not in given]
    instrument(atheris)
    atheris.Setup([*sys.argv, *flags], fuzz_one_input)
    with _quiet():
        atheris.Fuzz()


if __name__ == "__main__":
    main()
