"""Stage stamps along an op's path, plugin and gateway alike, for profiling where its time goes.

Off unless the environment names a path prefix (``ADP_TRACE=/tmp/trace``) or a process calls
``enable``; an off stamp costs one test. When on, each process keeps its stamps in memory (the
first ``STAMPS_MAX``) and writes them to ``<prefix>.<pid>`` as it exits, one line each:
``<CLOCK_MONOTONIC ns> <stage> <id> <native thread id>``. CLOCK_MONOTONIC is one clock for every
process of a host, so the plugin's stamps and the gateway's line up; ``bench/op_path.py`` reads
them.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from enum import StrEnum
from pathlib import Path

ENV = "ADP_TRACE"
STAMPS_MAX = 2_000_000  # ~200 MB at most; a long run keeps its start


class Stage(StrEnum):
    # the plugin (id: LMCache's future id)
    SUBMIT = "submit"  # LMCache called submit_batch_*
    SEND = "send"  # a request of the batch is on the ring
    COPIED = "copied"  # a store's buffer is in the window, or a load's in L1
    COMPLETION = "completion"  # the plugin took the gateway's completion of a request
    REPORT = "report"  # the batch is reported to LMCache
    # the gateway (id: the op id, or the number of requests behind a doorbell)
    DISPATCH = "dispatch"  # a doorbell's requests are taken off the ring
    TASK = "task"  # an I/O thread starts a task (a store, a delete, a group of loads)
    DEVICE_START = "device-start"  # one read or write system call on a database
    DEVICE_END = "device-end"
    COMPLETE = "complete"  # the op's completion is on the ring


Stamp = tuple[int, str, int, int]  # CLOCK_MONOTONIC ns, stage, id, native thread id

_prefix: str | None = None
_stamps: list[Stamp] = []


def enable(prefix: str) -> None:
    """Stamp from now on, written to ``<prefix>.<pid>`` at exit."""
    global _prefix
    if _prefix is None:
        atexit.register(_write)
    _prefix = prefix


def mark(stage: Stage, ident: int = 0) -> None:
    if _prefix is not None and len(_stamps) < STAMPS_MAX:
        _stamps.append((time.monotonic_ns(), stage, ident, threading.get_native_id()))


def taken() -> list[Stamp]:
    """This process's stamps so far, which it then forgets."""
    stamps = _stamps[:]
    del _stamps[: len(stamps)]
    return stamps


def read(path: Path) -> list[Stamp]:
    """The stamps another process wrote."""
    stamps: list[Stamp] = []
    for line in path.read_text().splitlines():
        ns, stage, ident, thread = line.split()
        stamps.append((int(ns), stage, int(ident), int(thread)))
    return stamps


def _write() -> None:
    if _prefix is None:
        return
    lines = "".join(f"{ns} {stage} {ident} {thread}\n" for ns, stage, ident, thread in taken())
    Path(f"{_prefix}.{os.getpid()}").write_text(lines)


if os.environ.get(ENV):
    enable(os.environ[ENV])
