"""Copies between LMCache's L1 buffers and the session's transfer window (the copy path).

One memcpy, or for a large object slices on several threads at once: numpy releases the GIL
while it copies, so the slices run in parallel.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from gateway.ring.layout import PAGE_BYTES, align_up

COPY_SLICE_BYTES_MIN = 8 * 2**20  # a copy is split over threads in slices of at least this


class Copier:
    """Copies between L1 and the transfer window: one memcpy, or for a large object slices on
    several threads at once (numpy releases the GIL while it copies)."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool = ThreadPoolExecutor(threads - 1, "adp-copy") if threads > 1 else None

    def copy(self, destination: memoryview, source: memoryview) -> None:
        parts = min(self._threads, source.nbytes // COPY_SLICE_BYTES_MIN)
        if self._pool is None or parts <= 1:
            copy(destination, source)
            return
        step = align_up(-(-source.nbytes // parts), PAGE_BYTES)
        futures = [
            self._pool.submit(copy, destination[at : at + step], source[at : at + step])
            for at in range(step, source.nbytes, step)
        ]
        copy(destination[:step], source[:step])
        for future in futures:
            future.result()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()


def copy(destination: memoryview, source: memoryview) -> None:
    """One memcpy with the GIL released (numpy does so for large copies)."""
    np.copyto(np.frombuffer(destination, np.uint8), np.frombuffer(source, np.uint8))
