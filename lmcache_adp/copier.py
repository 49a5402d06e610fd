"""Work on LMCache's L1 buffers, off the thread that drives the link: copies between L1 and the
session's transfer window.

Each job runs on a small pool of threads (lmcache_adp/workers.py: loads' copies first) and ends by
calling ``done`` (on a pool thread); a copy of at most 512 KiB runs on the caller's thread instead.
A large copy is split into slices that run on several threads at once: numpy releases the GIL
while it copies, so a 32 MiB copy keeps neither the link's thread nor LMCache's own threads
waiting. A slice never waits for another, so the pool cannot deadlock.
"""

from __future__ import annotations

import functools
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
            done(_attempt(wanted, destination, source))
            return
        parts = max(1, min(self._threads, source.nbytes // COPY_SLICE_BYTES_MIN))
        step = align_up(-(-source.nbytes // parts), PAGE_BYTES) if parts > 1 else source.nbytes
        starts = range(0, max(source.nbytes, 1), max(step, 1))
        latch = _Latch(len(starts), done)
        for at in starts:
            part = (wanted, destination[at : at + step], source[at : at + step])
            self._pool.submit(functools.partial(latch.run, *part), urgent)

    def close(self) -> None:
        """Wait for every job, queued or running (their ``done`` calls included)."""
        self._pool.close()


def _attempt(wanted: Callable[[], bool], destination: memoryview, source: memoryview) -> bool:
    """Copy, if still ``wanted()``; False if not, or if the copy raised."""
    try:
        if wanted():
            _copy(destination, source)
            return True
    except Exception:  # reported as a failed copy, never lost
        log.exception("a copy in the plugin failed")
    return False


class _Latch:
    """Runs the ``count`` parts of one copy, and calls ``done(ok)`` once, on the thread of the
    last part to finish: ok when every part copied."""

    def __init__(self, count: int, done: Callable[[bool], None]) -> None:
        self._left = count
        self._ok = True
        self._lock = threading.Lock()
        self._done = done

    def run(self, wanted: Callable[[], bool], destination: memoryview, source: memoryview) -> None:
        ok = _attempt(wanted, destination, source)
        with self._lock:
            self._ok = self._ok and ok
            self._left -= 1
            last = self._left == 0
        if last:
            self._done(self._ok)


def _copy(destination: memoryview, source: memoryview) -> None:
    """One memcpy with the GIL released (numpy does so for large copies)."""
    np.copyto(np.frombuffer(destination, np.uint8), np.frombuffer(source, np.uint8))
