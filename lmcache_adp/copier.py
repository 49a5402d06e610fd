"""Work on LMCache's L1 buffers, off the thread that drives the link: copies between L1 and the
session's transfer window.

Each job runs on a small pool of threads (lmcache_adp/workers.py: loads' copies first) and ends by
calling ``done`` (on a pool thread); a copy of at most 512 KiB runs on the caller's thread instead.
A large copy is split into slices that run on several threads at once: numpy releases the GIL
while it copies, so a 32 MiB copy keeps neither the link's thread nor LMCache's own threads
waiting. A slice never waits for another, so the pool cannot deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from adp_wire.ring.layout import PAGE_BYTES, align_up
from lmcache_adp.logs import log
from lmcache_adp.workers import Workers

COPY_SLICE_BYTES_MIN = 4 * 2**20  # a copy is split over threads in slices of at least this
# A copy this small runs on the caller's thread: it takes less time (about 80 us) than handing it
# to a pool thread and its result back (at 256 KiB objects, the pool cost more CPU than the copy).
COPY_INLINE_BYTES_MAX = 512 * 2**10
FAILED = object()  # what a part that raised leaves in its latch


def _always() -> bool:
    return True


class Copier:
    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool = Workers(threads, "adp-copy")

    def copy(
        self,
        destination: memoryview,
        source: memoryview,
        done: Callable[[bool], None],
        wanted: Callable[[], bool] = _always,
        urgent: bool = False,
    ) -> None:
        """Copy ``source`` into ``destination`` (same length), then ``done(ok)``. A slice
        starts only while ``wanted()``; one that does not start fails the copy. A small copy
        runs (and calls ``done``) on the caller's thread, before this returns. An ``urgent``
        copy (a load's) goes ahead of every queued copy that is not."""
        if source.nbytes <= COPY_INLINE_BYTES_MAX:
            done(_attempt(wanted, _copy, destination, source) is not FAILED)
            return
        parts = max(1, min(self._threads, source.nbytes // COPY_SLICE_BYTES_MIN))
        step = align_up(-(-source.nbytes // parts), PAGE_BYTES) if parts > 1 else source.nbytes
        starts = range(0, max(source.nbytes, 1), max(step, 1))
        latch = _Latch(len(starts), lambda values: done(FAILED not in values))
        for at in starts:
            part = (destination[at : at + step], source[at : at + step])
            self._submit(latch, wanted, _copy, *part, urgent=urgent)

    def close(self) -> None:
        """Wait for every job, queued or running (their ``done`` calls included)."""
        self._pool.close()

    def _submit(
        self,
        latch: _Latch,
        wanted: Callable[[], bool],
        work: Callable[..., object],
        *args: memoryview,
        urgent: bool = False,
    ) -> None:
        index = latch.take()
        self._pool.submit(lambda: latch.arrive(index, _attempt(wanted, work, *args)), urgent)


def _attempt(wanted: Callable[[], bool], work: Callable[..., object], *args: memoryview) -> object:
    """``work(*args)`` if still ``wanted()``; FAILED if not, or if it raised."""
    try:
        if wanted():
            return work(*args)
    except Exception:  # reported as a failed job, never lost
        log.exception("a copy in the plugin failed")
    return FAILED


class _Latch:
    """Collects the results of ``count`` parts and calls ``done`` with them once, from the
    thread of the last part to finish."""

    def __init__(self, count: int, done: Callable[[list[object]], None]) -> None:
        self._values: list[object] = [None] * count
        self._left = count
        self._taken = 0
        self._lock = threading.Lock()
        self._done = done

    def take(self) -> int:
        self._taken += 1
        return self._taken - 1

    def arrive(self, index: int, value: object) -> None:
        with self._lock:
            self._values[index] = value
            self._left -= 1
            last = self._left == 0
        if last:
            self._done(self._values)


def _copy(destination: memoryview, source: memoryview) -> None:
    """One memcpy with the GIL released (numpy does so for large copies)."""
    np.copyto(np.frombuffer(destination, np.uint8), np.frombuffer(source, np.uint8))
