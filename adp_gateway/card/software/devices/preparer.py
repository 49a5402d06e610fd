"""Preparing a new database: every block of a free region written once, while the disk is idle.

A database file is preallocated with posix_fallocate, which leaves its blocks unwritten (and a
thin-provisioned virtual disk has not even allocated them): the first write to each block
pays for the allocation or the extent conversion, which on the project's VM made a first lap
over a new file ~20 % slower than every lap after it (the fio floor's "first lap" line in
bench/results/matrix-hugepages-vm.md). LMCache's fs_native pays that on every store, as it
writes each object to a new file; a log that is written once in advance pays it never again,
as it only ever overwrites.

So the preparer writes zeros over free regions that still hold unwritten blocks (the file
device reports them, filedevice.py), one chunk at a time, only while the
database has had no other I/O for ``idle_s``, and gives a region back at once (progress kept)
when the log may need it. A region it holds is not free: nothing else writes it meanwhile.
"""

from __future__ import annotations

import logging
import mmap
import threading
from typing import Protocol

from adp_gateway.card.software.devices.base import Device
from adp_wire.threads import NamedThread

log = logging.getLogger(__name__)
CHUNK_BYTES = 8 * 2**20
POLL_S = 0.05


def base_device(device: Device) -> Device:
    """The device under any wrappers (a fault-injecting one keeps its own in ``inner``): the
    preparer's zeros go to it directly, so they never take a fault a test meant for a store."""
    while (inner := getattr(device, "inner", None)) is not None:
        device = inner
    return device


def unwritten_ranges(device: Device) -> list[tuple[int, int]]:
    """(offset, length) of the device's never-written blocks, where it can tell (a file)."""
    ranges = getattr(base_device(device), "unwritten_ranges", None)
    return list(ranges()) if ranges is not None else []


class Work(Protocol):
    """What the region log offers the preparer (RegionLog implements it)."""

    def claim_unprepared(self, idle_s: float) -> tuple[int, int, int, int] | None:
        """A free region to prepare on an idle database, now held by the preparer: (database,
        region, next offset to write, end offset), device offsets; None when there is none."""

    def write_zeros(self, database: int, zeros: memoryview, offset: int) -> None: ...

    def prepared(self, database: int, region: int, upto: int, idle_s: float) -> bool:
        """Record progress; True to go on with the region, False when it was given back (done,
        the database is busy, or the log may need the region)."""

    def give_back(self, database: int, region: int, upto: int) -> None: ...

    def unprepared_regions(self) -> int: ...


class Preparer:
    def __init__(self, work: Work, idle_s: float = 0.2) -> None:
        self._work = work
        self._idle_s = idle_s
        self._stop = threading.Event()
        self._thread = NamedThread(target=self._run, name="prepare", daemon=True)

    def start(self) -> None:
        if self._work.unprepared_regions():
            self._thread.start()

    def stop(self, timeout_s: float | None = None) -> bool:
        """Stop preparing; False when its thread is still inside a write after ``timeout_s``
        (the caller must then not close the device under it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        zeros = memoryview(mmap.mmap(-1, CHUNK_BYTES))  # page aligned and zeroed, for O_DIRECT
        left = self._work.unprepared_regions()
        log.info("preparing %d regions of the new database(s) while the disk is idle", left)
        while not self._stop.wait(POLL_S):
            if not self._work.unprepared_regions():
                log.info("the database(s) are prepared: every block written once")
                return
            claimed = self._work.claim_unprepared(self._idle_s)
            if claimed is not None:
                try:
                    self._prepare(*claimed, zeros)
                except OSError as exc:  # not fatal: the region is simply written the first time
                    log.warning("preparing database %d failed: %s; stopping", claimed[0], exc)
                    return

    def _prepare(self, database: int, region: int, at: int, end: int, zeros: memoryview) -> None:
        while not self._stop.is_set():
            length = min(CHUNK_BYTES, end - at)
            try:
                self._work.write_zeros(database, zeros[:length], at)
            except OSError:
                self._work.give_back(database, region, at)
                raise
            at += length
            if not self._work.prepared(database, region, at, self._idle_s):
                return
        self._work.give_back(database, region, at)
