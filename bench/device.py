"""The disk's own limit: sequential O_DIRECT writes then reads, as deep as the gateway's I/O.

fio is not installed on the project's machines, so this is a Python probe: ``threads`` threads
(the gateway's ``io_threads``) each issue ``io_bytes`` pwritev/preadv calls (the gateway's I/O
size for the object: the object itself, or ``fragment_size`` for larger ones) over one
preallocated file in the directory under test, then fdatasync.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gateway.config import GatewayConfig
from gateway.ring.layout import align_up

WriteOrRead = Callable[[int, list[memoryview], int], int]


def gateway_io_shape(object_bytes: int) -> tuple[int, int]:
    """(I/O size, threads) of the gateway's default config for objects of ``object_bytes``."""
    defaults = GatewayConfig()
    return align_up(min(object_bytes, defaults.fragment_size)), defaults.io_threads


def device_limit(
    directory: Path, total_bytes: int, io_bytes: int, threads: int
) -> dict[str, float]:
    """GB/s (10^9 bytes/s) of writing then reading ``total_bytes`` in ``io_bytes`` I/Os."""
    path = directory / "probe.bin"
    total_bytes = max(io_bytes, total_bytes // io_bytes * io_bytes)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        os.posix_fallocate(fd, 0, total_bytes)
        result: dict[str, float] = {
            "total_bytes": total_bytes,
            "io_bytes": io_bytes,
            "threads": threads,
        }
        calls: tuple[tuple[str, WriteOrRead], ...] = (
            ("write_GBps", os.pwritev),
            ("read_GBps", os.preadv),
        )
        for name, call in calls:
            offsets = list(range(0, total_bytes, io_bytes))
            started = time.perf_counter()
            workers = [
                threading.Thread(target=_io_worker, args=(fd, call, io_bytes, offsets[i::threads]))
                for i in range(threads)
            ]
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            if call is os.pwritev:
                os.fdatasync(fd)
            result[name] = total_bytes / (time.perf_counter() - started) / 1e9
        return result
    finally:
        os.close(fd)
        path.unlink()


def _io_worker(fd: int, call: WriteOrRead, io_bytes: int, offsets: list[int]) -> None:
    buf = memoryview(mmap.mmap(-1, io_bytes))  # page aligned, as O_DIRECT requires
    pattern = os.urandom(4096)
    buf[:] = pattern * (io_bytes // 4096) + pattern[: io_bytes % 4096]
    for offset in offsets:
        call(fd, [buf], offset)
