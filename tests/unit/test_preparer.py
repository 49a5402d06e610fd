"""Goal: a new database's never-written blocks are found (FIEMAP), written once in the background
while the disk is idle, never under a record or a region the log holds, never through a fault a
test set for a store; the log takes written-once regions first and gets a region back from the
preparer when it may need it."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from adp_gateway.card.software.devices.faulty import FaultyDevice
from adp_gateway.card.software.devices.filedevice import FileDevice
from adp_gateway.card.software.devices.memory import MemoryDevice
from adp_gateway.card.software.format import Kind, RecordHeader
from adp_gateway.card.software.regionlog import RegionLog
from adp_gateway.errors import StorageError
from tests.support import wait_until
from tests.support.storage import REGION, extent, payload

SIZE = 4096 + 8 * REGION


def header(seq: int, size: int) -> RecordHeader:
    return RecordHeader(Kind.DATA, seq, "t", f"k{seq}", size, 0, size)


def file_device(tmp_path: Path) -> FileDevice:
    device = FileDevice(str(tmp_path / "db0.adp"), SIZE)
    if not device.unwritten_ranges():
        device.close()
        pytest.skip("this filesystem reports no extent map")
    return device


def test_a_new_file_reports_what_was_never_written(tmp_path: Path) -> None:
    device = file_device(tmp_path)
    assert device.unwritten_ranges() == [(0, SIZE)]
    device.write([extent(payload(1, 8192))], 3 * 4096)
    assert device.unwritten_ranges() == [(0, 3 * 4096), (5 * 4096, SIZE - 5 * 4096)]
    device.close()


def test_free_regions_are_written_once_in_the_background_around_a_live_record(
    tmp_path: Path,
) -> None:
    device = file_device(tmp_path)
    log = RegionLog([device], REGION, lambda *r: [])
    data = payload(2, 50_000)
    location = log.append(0, header(1, 50_000), extent(data))
    # The formatting wrote only each region's first page.
    assert log.preparation.unprepared_regions() == 7
    log.prepare_in_background(idle_s=0.0)
    wait_until(lambda: log.preparation.unprepared_regions() == 0, 30, "the preparer to finish")
    unwritten = device.unwritten_ranges()
    region_zero_end = 4096 + REGION
    assert all(start < region_zero_end for start, _ in unwritten)  # only the open region's tail
    out = extent(bytes(50_000))
    assert log.read(location, out) is not None and bytes(out[:50_000]) == data
    log.close()


def test_the_log_takes_written_once_regions_first(tmp_path: Path) -> None:
    device = file_device(tmp_path)
    FileDevice.write(device, [extent(bytes(REGION * 2))], 4096 + 2 * REGION)  # regions 2 and 3
    log = RegionLog([device], REGION, lambda *r: [])
    first = log.append(0, header(1, 100_000), extent(payload(3, 100_000)))
    assert first.region == 2
    log.close()


def test_the_preparer_writes_past_a_fault_wrapper(tmp_path: Path) -> None:
    """A fault a test armed for the next store is not spent on the preparer's zeros."""
    device = FaultyDevice(file_device(tmp_path))
    log = RegionLog([device], REGION, lambda *r: [])
    device.fail("write", errno.EIO)
    log.prepare_in_background(idle_s=0.0)
    wait_until(lambda: log.preparation.unprepared_regions() == 0, 30, "the preparer to finish")
    with pytest.raises(StorageError):
        log.append(0, header(1, 8192), extent(bytes(8192)))
    log.close()


def test_a_region_being_prepared_is_given_back_when_the_log_may_need_it(tmp_path: Path) -> None:
    """The preparer holds a region only while the log keeps two others free; past that, its
    next progress report hands the region back, and the log may take it."""
    device = file_device(tmp_path)
    log = RegionLog([device], REGION, lambda *r: [])
    claimed = log.preparation.claim_unprepared(idle_s=0.0)
    assert claimed is not None
    database, region, at, _ = claimed
    record = extent(payload(4, 200_000))
    taken = set()
    for seq in range(6):  # each record fills most of a region: five regions taken
        taken.add(log.append(0, header(seq, 200_000), record).region)
    assert region not in taken
    # One other free region left: the region goes back to the log.
    assert not log.preparation.prepared(database, region, at, idle_s=0.0)
    assert log.append(0, header(9, 200_000), record).region in (region, 7)
    log.close()


def test_a_memory_device_has_nothing_to_prepare() -> None:
    log = RegionLog([MemoryDevice(SIZE)], REGION, lambda *r: [])
    assert log.preparation.unprepared_regions() == 0
