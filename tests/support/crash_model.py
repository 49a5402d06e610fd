"""What the crash test's driver and controller share: object content, the model of what each
key may hold, and the event log that both replay into it (tests/support/crash_driver.py writes it,
tests/crash/test_crash.py reads it)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from adp_wire.ring.layout import PAGE_BYTES as PAGE

EXIT_VIOLATION = 3
ABSENT = 0  # the state of a key with no object (never stored, deleted); lengths are > 0
FRAGMENT_BYTES = 256 * 2**10  # the crash configs' fragment_size (test_crash.py writes it)
# (length, weight): a few KiB to a few MiB; unaligned lengths, a fragment exactly, one byte
# more (two fragments), and objects of 3 and 11 fragments striped over both databases. With L1
# in shared memory, the lengths of whole pages go zero-copy, the others through the window.
SIZES: tuple[tuple[int, int], ...] = (
    (4096, 20),
    (16_484, 20),
    (100_003, 20),
    (FRAGMENT_BYTES, 12),
    (FRAGMENT_BYTES + 1, 10),
    (700_001, 12),
    (3 * FRAGMENT_BYTES, 8),
    (2_621_447, 6),
)
SIZE_MAX = max(length for length, _ in SIZES)
INFLIGHT_MAX = 8
BATCH_KEYS_MAX = 3  # keys in one store or load batch
HOT_KEYS = 24  # half of the picks go to these, so keys see overwrites and deletes often
OP_TIMEOUT_S = 5.0
_STAMP = struct.Struct("<4sIII")  # at the start of every page: magic, key, length, page number
_STAMP_MAGIC = b"ADPc"
_PATTERN_BYTES = 4 * 2**20


def key_name(key: int) -> str:
    return f"crash@00000000@0@{key:064x}"


# Content -------------------------------------------------------------------------------------


@functools.cache
def _pattern() -> npt.NDArray[np.uint8]:
    block = np.random.default_rng(0xAD9C).integers(0, 256, _PATTERN_BYTES, dtype=np.uint8)
    return np.concatenate([block, block])


def content(key: int, length: int) -> bytearray:
    """The bytes of ``key`` stored with ``length``: a pure function, different for every pair.

    A slice of a fixed random block at an offset hashed from (key, length), with every page
    stamped with (key, length, page) so that bytes from elsewhere can be named.
    """
    digest = hashlib.blake2b(f"{key}/{length}".encode(), digest_size=8).digest()
    offset = int.from_bytes(digest, "little") % _PATTERN_BYTES
    out = bytearray(length)
    memoryview(out)[:] = _pattern()[offset : offset + length].data
    for page, at in enumerate(range(0, length - _STAMP.size + 1, PAGE)):
        _STAMP.pack_into(out, at, _STAMP_MAGIC, key, length, page)
    return out


def describe_mismatch(key: int, length: int, seen: bytes | bytearray) -> str:
    """Where ``seen`` first differs from ``content(key, length)`` and what it holds there."""
    expected = content(key, length)
    if len(seen) != length:
        return f"{len(seen)} bytes instead of {length}"
    differing = np.flatnonzero(
        np.frombuffer(seen, np.uint8) != np.frombuffer(bytes(expected), np.uint8)
    )
    if not len(differing):
        return "no difference"
    first = int(differing[0])
    page_at = first - first % PAGE
    stamp = bytes(seen[page_at : page_at + _STAMP.size])
    if len(stamp) == _STAMP.size and stamp[:4] == _STAMP_MAGIC:
        _, other_key, other_length, page = _STAMP.unpack(stamp)
        origin = f"page stamped key {other_key} length {other_length} page {page}"
    elif stamp.strip(b"\0") == b"":
        origin = "a page starting with zeros"
    else:
        origin = f"a page starting {stamp.hex()}"
    return (
        f"{len(differing)} of {length} bytes differ, the first at offset {first} "
        f"(expected {bytes(expected[first : first + 8]).hex()}, "
        f"seen {bytes(seen[first : first + 8]).hex()}); that page is {origin}"
    )


def record_bytes(length: int, fragment_bytes: int = FRAGMENT_BYTES) -> int:
    """Bytes a store of ``length`` appends at most, over all databases: a 4 KiB header per
    fragment, payloads padded to 4 KiB, and a tombstone page (an overwrite buries the old
    version). Region overhead (footers, trailers, room left at sealing) is not counted."""
    full, rest = divmod(length, fragment_bytes)
    padded_rest = -(-rest // PAGE) * PAGE
    return full * (PAGE + fragment_bytes) + (PAGE + padded_rest if rest else 0) + PAGE


# The model -----------------------------------------------------------------------------------


@dataclass
class KeyState:
    """What one key may hold.

    ``possible``: the states (ABSENT or a length) it may be in, were nothing evicted.
    ``legit``: every length stored since its last acknowledged delete; with eviction an older
    version may come back, but never one from before an acknowledged delete.
    ``floating``: outcomes of ops of this gateway lifetime that failed without a verdict: they
    may still take effect, even after a later acknowledged op, until the gateway dies.
    """

    possible: set[int] = field(default_factory=lambda: {ABSENT})
    legit: set[int] = field(default_factory=set)
    floating: set[int] = field(default_factory=set)


class Model:
    def __init__(self, keys: int) -> None:
        self.states = [KeyState() for _ in range(keys)]

    @property
    def keys(self) -> int:
        return len(self.states)

    def submit_store(self, key: int, length: int) -> None:
        # A store that does not finish may leave the key absent: an overwrite with another
        # length buries the old version (a tombstone) before it writes the new one.
        state = self.states[key]
        state.possible |= {length, ABSENT}
        state.legit.add(length)

    def ack_store(self, key: int, length: int, ok: bool) -> None:
        state = self.states[key]
        if ok:
            state.possible = {length} | state.floating
        else:
            state.floating |= {length, ABSENT}

    def submit_delete(self, key: int) -> None:
        self.states[key].possible.add(ABSENT)

    def ack_delete(self, key: int, done: bool) -> None:
        state = self.states[key]
        if done:
            state.possible = {ABSENT} | state.floating
            state.legit = state.floating - {ABSENT}
        else:
            state.floating.add(ABSENT)

    def end_lifetime(self) -> None:
        """The gateway died: nothing submitted to it can take effect any more."""
        for state in self.states:
            state.floating.clear()

    def observe(self, key: int, observed: int) -> None:
        """The key was seen in this state by a check with no op in flight: it is a fact now."""
        self.states[key].possible = {observed}

    def to_json(self) -> list[dict[str, list[int]]]:
        return [{"possible": sorted(s.possible), "legit": sorted(s.legit)} for s in self.states]

    @classmethod
    def from_json(cls, data: list[dict[str, list[int]]]) -> Model:
        model = cls(len(data))
        for state, item in zip(model.states, data, strict=True):
            state.possible = set(item["possible"])
            state.legit = set(item["legit"])
        return model


def apply(model: Model, event: dict[str, Any]) -> None:
    """Apply one logged event to ``model`` (only mutations change it)."""
    kind, op = event["ev"], event.get("op")
    if kind == "submit" and op == "store":
        model.submit_store(event["key"], event["len"])
    elif kind == "submit" and op == "delete":
        model.submit_delete(event["key"])
    elif kind == "ack" and op == "store":
        model.ack_store(event["key"], event["len"], event["ok"])
    elif kind == "ack" and op == "delete":
        model.ack_delete(event["key"], event["ok"])


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of one driver run; a torn last line (the driver died mid-write) is dropped."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            events.append(json.loads(line))
    return events


def replay(model: Model, events: Iterable[dict[str, Any]]) -> None:
    """Apply a driver run's events; a mutation submitted but never acknowledged is uncertain."""
    open_ops: dict[int, dict[str, Any]] = {}
    for event in events:
        apply(model, event)
        if event["ev"] == "submit" and event["op"] in ("store", "delete"):
            open_ops[event["n"]] = event
        elif event["ev"] == "ack":
            open_ops.pop(event["n"], None)
    for event in open_ops.values():
        apply(model, {**event, "ev": "ack", "ok": False})


# The driver ----------------------------------------------------------------------------------


def states_text(states: Iterable[int]) -> str:
    """A set of states for messages: ``{ABSENT, 4096}``."""
    return "{" + ", ".join("ABSENT" if s == ABSENT else str(s) for s in sorted(states)) + "}"
