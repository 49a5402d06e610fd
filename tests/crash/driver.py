"""The crash test's driver process: random ops through the real plugin, every event logged.

    python -m tests.crash.driver --socket PATH --state STATE.json --events EVENTS.jsonl --seed N

It runs for one gateway lifetime: the controller (tests/crash/test_crash.py) starts it once the
gateway is up and checked, SIGKILLs the gateway at a random moment, then stops this process
with SIGTERM. Until then it keeps up to ``INFLIGHT_MAX`` batches in flight on a small key space:
stores (content is ``content(key, length)``, lengths drawn from ``SIZES``), deletes, loads and
EXISTS. At most one op per key is in flight at a time, so per key the gateway sees the ops in
the order they were submitted.

Every event is appended to the events file as one JSON line with one ``write`` (no user-space
buffer: a line written is in the file even if this process dies): a mutation's ``submit`` line
is written before the plugin is called, its ``ack`` when its completion is drained. The model
below (shared with the controller, which replays the same lines) says which states each key may
be in. A load hit must hold ``content(key, length)`` for the length it was issued with, and that
length must be one the key may hold; anything else is a ``violation`` line, and the driver stops
and exits with ``EXIT_VIOLATION``.

This module also holds what driver and controller share: ``content``, ``Model`` and ``replay``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import random
import select
import signal
import struct
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import numpy.typing as npt

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from lmcache_adp import ADPConnector

EXIT_VIOLATION = 3
ABSENT = 0  # the state of a key with no object (never stored, deleted); lengths are > 0
PAGE = 4096
FRAGMENT_BYTES = 256 * 2**10  # the crash configs' fragment_size (test_crash.py writes it)
# (length, weight): a few KiB to a few MiB; unaligned lengths, a fragment exactly, one byte
# more (two fragments), and objects of 3 and 11 fragments striped over both databases.
SIZES: tuple[tuple[int, int], ...] = (
    (4096, 20),
    (16_484, 20),
    (100_003, 20),
    (FRAGMENT_BYTES, 12),
    (FRAGMENT_BYTES + 1, 10),
    (700_001, 12),
    (2_621_447, 6),
)
SIZE_MAX = max(length for length, _ in SIZES)
INFLIGHT_MAX = 8
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


@dataclass
class _Batch:
    op: str
    keys: list[int]
    lengths: list[int]
    numbers: list[int]
    buffers: list[bytearray] = field(default_factory=list)


class EventLog:
    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def write(self, **event: Any) -> None:
        event["t"] = round(time.time(), 6)
        os.write(self._fd, (json.dumps(event, separators=(",", ":")) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        state = json.loads(Path(args.state).read_text())
        self.model = Model.from_json(state["model"])
        self.strict: bool = state["strict"]  # no eviction: acknowledged objects must stay
        self.budget: int = state["budget"]  # bytes of records it may append; -1: unbounded
        self.spent = 0
        self.rng = random.Random(args.seed)
        self.log = EventLog(Path(args.events))
        self.plant_wrong_bytes: bool = args.plant_wrong_bytes
        self.connector = ADPConnector(
            socket_path=args.socket, op_timeout_s=OP_TIMEOUT_S, reconnect_interval_s=0.05
        )
        self.inflight: dict[int, _Batch] = {}
        self.busy: set[int] = set()
        self.numbers = iter(range(1, 2**62))
        self.stopping = False
        self.violations = 0
        self.failures_in_a_row = 0
        self.counts: dict[str, int] = {}

    # Running ----------------------------------------------------------------------------------

    def run(self) -> int:
        self.log.write(ev="start", pid=os.getpid(), strict=self.strict, budget=self.budget)
        if not self._wait_connected(30.0):
            self.log.write(ev="end", why="never reached the gateway", counts=self.counts)
            return 2
        self.log.write(ev="ready")
        while True:
            if not self.stopping:
                self._fill()
            if not self.inflight:
                if self.stopping:
                    break
                time.sleep(0.01)
                continue
            ready, _, _ = select.select([self.connector.event_fd()], [], [], 0.1)
            if ready:
                for future_id, ok, _error, results in self.connector.drain_completions():
                    self._complete(self.inflight.pop(future_id), ok, results or [])
            if self.failures_in_a_row:  # the gateway is down: fail fast, but do not spin
                time.sleep(min(0.05, 0.005 * self.failures_in_a_row))
        self.log.write(ev="end", why="stopped", counts=self.counts)
        return EXIT_VIOLATION if self.violations else 0

    def close(self) -> None:
        self.connector.close()
        self.log.close()

    def _wait_connected(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stopping:
            future_id = self.connector.submit_batch_exists([key_name(0)])
            if self._wait_for(future_id)[1]:
                return True
            time.sleep(0.05)
        return False

    def _wait_for(self, future_id: int) -> tuple[Any, ...]:
        while True:
            select.select([self.connector.event_fd()], [], [], 0.5)
            for item in self.connector.drain_completions():
                if item[0] == future_id:
                    return tuple(item)

    # Submitting -------------------------------------------------------------------------------

    def _fill(self) -> None:
        while len(self.inflight) < INFLIGHT_MAX:
            batch = self._plan()
            if batch is None:
                return
            self._submit(batch)

    def _pick_keys(self, count: int) -> list[int]:
        keys: list[int] = []
        for _ in range(count * 4):
            if len(keys) == count:
                break
            hot = self.rng.random() < 0.5
            key = self.rng.randrange(min(HOT_KEYS, self.model.keys) if hot else self.model.keys)
            if key not in self.busy and key not in keys:
                keys.append(key)
        return keys

    def _plan(self) -> _Batch | None:
        roll = self.rng.random()
        op = (
            "store"
            if roll < 0.42
            else "load"
            if roll < 0.72
            else "exists"
            if roll < 0.86
            else "delete"
        )
        keys = self._pick_keys(self.rng.randint(1, {"exists": 8, "delete": 2}.get(op, 3)))
        if not keys:
            return None
        lengths = [self._length_for(op, key) for key in keys]
        if op in ("store", "delete") and self.budget >= 0:
            cost = sum(record_bytes(n) if op == "store" else PAGE for n in lengths) or PAGE
            if self.spent + cost > self.budget:
                op, lengths = "load", [self._length_for("load", key) for key in keys]
            else:
                self.spent += cost
        return _Batch(op, keys, lengths, [next(self.numbers) for _ in keys])

    def _length_for(self, op: str, key: int) -> int:
        if op == "store":
            return self.rng.choices([n for n, _ in SIZES], [w for _, w in SIZES])[0]
        if op != "load":
            return 0
        state = self.model.states[key]
        believed = sorted(state.possible - {ABSENT})
        others = sorted(state.legit - state.possible)
        roll = self.rng.random()
        if believed and roll < 0.85:
            return self.rng.choice(believed)
        if others and roll < 0.93:
            return self.rng.choice(others)  # an older version: a miss unless it came back
        return self.rng.choice([n for n, _ in SIZES])

    def _submit(self, batch: _Batch) -> None:
        names = [key_name(k) for k in batch.keys]
        for n, key, length in zip(batch.numbers, batch.keys, batch.lengths, strict=True):
            if batch.op == "store":
                self.model.submit_store(key, length)
                self.log.write(ev="submit", op="store", n=n, key=key, len=length)
            elif batch.op == "delete":
                self.model.submit_delete(key)
                self.log.write(ev="submit", op="delete", n=n, key=key)
        self.busy.update(batch.keys)
        if batch.op == "store":
            batch.buffers = [content(k, n) for k, n in zip(batch.keys, batch.lengths, strict=True)]
            future_id = self.connector.submit_batch_set(names, _views(batch.buffers))
        elif batch.op == "load":
            batch.buffers = [bytearray(b"\xa5" * n) for n in batch.lengths]
            future_id = self.connector.submit_batch_get(names, _views(batch.buffers))
        elif batch.op == "exists":
            future_id = self.connector.submit_batch_exists(names)
        else:
            future_id = self.connector.submit_batch_delete(names)
        self.inflight[future_id] = batch

    # Completing -------------------------------------------------------------------------------

    def _count(self, name: str, by: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + by

    def _complete(self, batch: _Batch, ok: bool, results: list[bool]) -> None:
        self.busy.difference_update(batch.keys)
        self.failures_in_a_row = 0 if ok else self.failures_in_a_row + 1
        self._count(f"{batch.op}_{'ok' if ok else 'failed'}")
        results = list(results) + [False] * (len(batch.keys) - len(results))
        for i, (n, key, length) in enumerate(
            zip(batch.numbers, batch.keys, batch.lengths, strict=True)
        ):
            if batch.op == "store":
                self.model.ack_store(key, length, results[i])
                self.log.write(ev="ack", op="store", n=n, key=key, len=length, ok=results[i])
            elif batch.op == "delete":
                done = ok or results[i]  # True: it was there and is gone; False after ok: absent
                self.model.ack_delete(key, done)
                self.log.write(ev="ack", op="delete", n=n, key=key, ok=done, found=results[i])
            elif batch.op == "load":
                self._check_load(n, key, length, ok, results[i], batch.buffers[i])
            else:
                self._check_exists(n, key, ok, results[i])

    def _check_load(
        self, n: int, key: int, length: int, ok: bool, hit: bool, buffer: bytearray
    ) -> None:
        state = self.model.states[key]
        if hit:
            self._count("load_hits")
            if self.plant_wrong_bytes and not self.violations:
                buffer[length // 2] ^= 0xFF  # a planted gateway bug: the controller must fail
            match = buffer == content(key, length)
            self.log.write(ev="ack", op="load", n=n, key=key, len=length, hit=True, match=match)
            if not match:
                self._violation(
                    "wrong_bytes",
                    key,
                    f"a load of length {length} hit with wrong bytes: "
                    f"{describe_mismatch(key, length, buffer)}",
                )
            elif length not in state.possible:
                self._violation(
                    "unexpected_hit",
                    key,
                    f"a load of length {length} hit, but the key may only be in "
                    f"{states_text(state.possible)}",
                )
        else:
            self.log.write(ev="ack", op="load", n=n, key=key, len=length, hit=False, ok=ok)
            if ok and self.strict and state.possible == {length}:
                self._violation(
                    "lost",
                    key,
                    f"a load of the acknowledged length {length} missed (no eviction config)",
                )

    def _check_exists(self, n: int, key: int, ok: bool, found: bool) -> None:
        self.log.write(ev="ack", op="exists", n=n, key=key, ok=ok, found=found)
        if not ok:
            return
        state = self.model.states[key]
        if found and state.possible == {ABSENT}:
            self._violation("resurrected", key, "EXISTS found a key that may only be absent")
        elif not found and self.strict and ABSENT not in state.possible:
            self._violation(
                "lost",
                key,
                f"EXISTS missed a key that must hold {states_text(state.possible)} (no eviction)",
            )

    def _violation(self, kind: str, key: int, text: str) -> None:
        self.violations += 1
        self.stopping = True
        self.log.write(ev="violation", kind=kind, key=key, text=text)
        print(f"VIOLATION {kind} key {key}: {text}", file=sys.stderr, flush=True)


def states_text(states: Iterable[int]) -> str:
    """A set of states for messages: ``{ABSENT, 4096}``."""
    return "{" + ", ".join("ABSENT" if s == ABSENT else str(s) for s in sorted(states)) + "}"


def _views(buffers: list[bytearray]) -> list[memoryview]:
    return [memoryview(b) for b in buffers]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.crash.driver")
    parser.add_argument("--socket", required=True, help="the gateway's Unix socket")
    parser.add_argument("--state", required=True, help="JSON: the model, strict and budget")
    parser.add_argument("--events", required=True, help="JSON-lines file the events go to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--plant-wrong-bytes",
        action="store_true",
        help="self-test of the oracle: corrupt the first load hit as a gateway bug would",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    driver = Driver(_parser().parse_args(argv))

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        driver.stopping = True

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        return driver.run()
    finally:
        driver.close()


if __name__ == "__main__":
    sys.exit(main())
