"""The crash test's driver process: random ops through the real plugin, every event logged.

    python -m tests.support.crash_driver --socket PATH --state STATE.json \\
        --events EVENTS.jsonl --seed N

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

What driver and controller share (``content``, ``Model``, ``replay``) is in
tests/support/crash_model.py.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

from lmcache_adp import ADPConnector
from tests.support.crash_model import (
    ABSENT,
    BATCH_KEYS_MAX,
    EXIT_VIOLATION,
    HOT_KEYS,
    INFLIGHT_MAX,
    OP_TIMEOUT_S,
    PAGE,
    SIZE_MAX,
    SIZES,
    Model,
    content,
    describe_mismatch,
    key_name,
    record_bytes,
    states_text,
)


@dataclass
class _Batch:
    op: str
    keys: list[int]
    lengths: list[int]
    numbers: list[int]
    buffers: list[memoryview] = field(default_factory=list)


class SharedL1:
    """Buffers in a shared-memory segment named as ``lmcache server --shm-name`` names its L1,
    so the plugin takes the zero-copy path for stores of whole pages, as it does in the server.
    Fixed slots of the largest object, page aligned; a batch's slots return when it completes
    (as LMCache's L1 gets its buffers back), so a slot may be reused while a gateway that
    missed the deadline still writes from it."""

    def __init__(self, slots: int) -> None:
        self._slot_bytes = -(-SIZE_MAX // PAGE) * PAGE
        name = f"lmcache_l1_pool_crash{os.getpid()}"
        self._segment = shared_memory.SharedMemory(name, create=True, size=slots * self._slot_bytes)
        self._free = list(range(slots))
        self._views: list[memoryview] = []

    def take(self, data: bytes | bytearray) -> memoryview:
        slot = self._free.pop()
        start = slot * self._slot_bytes
        view = self._segment.buf[start : start + len(data)]
        view[:] = data
        self._views.append(view)
        return view

    def give_back(self, views: list[memoryview]) -> None:
        base = self._address(self._segment.buf)
        for view in views:
            self._free.append((self._address(view) - base) // self._slot_bytes)

    def close(self) -> None:
        for view in self._views:
            view.release()
        self._segment.close()
        self._segment.unlink()

    @staticmethod
    def _address(view: memoryview) -> int:
        return int(np.frombuffer(view, np.uint8).ctypes.data) if len(view) else 0


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
        # Before the plugin starts: it looks for LMCache's L1 segment when it connects.
        self.l1 = SharedL1(INFLIGHT_MAX * BATCH_KEYS_MAX) if args.shared_l1 else None
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
                    batch = self.inflight.pop(future_id)
                    self._complete(batch, ok, results or [])
                    if self.l1 is not None:  # LMCache has its buffers back
                        self.l1.give_back(batch.buffers)
            if self.failures_in_a_row:  # the gateway is down: fail fast, but do not spin
                time.sleep(min(0.05, 0.005 * self.failures_in_a_row))
        self.log.write(ev="end", why="stopped", counts=self.counts)
        return EXIT_VIOLATION if self.violations else 0

    def close(self) -> None:
        self.connector.close()
        self.log.close()
        if self.l1 is not None:
            self.l1.close()

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
        count = {"exists": 8, "delete": 2}.get(op, BATCH_KEYS_MAX)
        keys = self._pick_keys(self.rng.randint(1, count))
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
            pairs = zip(batch.keys, batch.lengths, strict=True)
            batch.buffers = [self._buffer(content(k, n)) for k, n in pairs]
            future_id = self.connector.submit_batch_set(names, batch.buffers)
        elif batch.op == "load":
            batch.buffers = [self._buffer(b"\xa5" * n) for n in batch.lengths]
            future_id = self.connector.submit_batch_get(names, batch.buffers)
        elif batch.op == "exists":
            future_id = self.connector.submit_batch_exists(names)
        else:
            future_id = self.connector.submit_batch_delete(names)
        self.inflight[future_id] = batch

    # Completing -------------------------------------------------------------------------------

    def _count(self, name: str, by: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + by

    def _buffer(self, data: bytes | bytearray) -> memoryview:
        """An L1 buffer holding ``data``: in the shared segment, or private memory."""
        return memoryview(bytearray(data)) if self.l1 is None else self.l1.take(data)

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
        self, n: int, key: int, length: int, ok: bool, hit: bool, buffer: memoryview
    ) -> None:
        state = self.model.states[key]
        if hit:
            self._count("load_hits")
            if self.plant_wrong_bytes and not self.violations:
                buffer[length // 2] ^= 0xFF  # a planted gateway bug: the controller must fail
            match = buffer == content(key, length)  # type: ignore[comparison-overlap]
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.support.crash_driver")
    parser.add_argument("--socket", required=True, help="the gateway's Unix socket")
    parser.add_argument("--state", required=True, help="JSON: the model, strict and budget")
    parser.add_argument("--events", required=True, help="JSON-lines file the events go to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--shared-l1",
        action="store_true",
        help="keep every buffer in a shared-memory L1 segment (the zero-copy path)",
    )
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
